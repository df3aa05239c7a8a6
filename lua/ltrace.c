/* Attention variants written in Lua (API §9; docs/variants.md): opts.score_mod
 * and opts.mask_mod are traced.  The function is called once with symbolic
 * arguments, userdata of metatable flashattn.Expr whose metamethods and
 * methods record the operations as nodes (src/expr.h) instead of computing;
 * what it returns is the expression, handed to the core as an fa_expr.
 *
 * Safety: a trace keeps no Lua value past the call but the tensors it
 * captured (retained by the fa_expr, which a userdata "holder" left on the
 * stack owns and frees at its __gc); it is bounded (FA_EXPR_MAX_NODES
 * nodes, FA_EXPR_MAX_TENSORS tensors); every error inside the function,
 * ours or the script's, comes back as a "flashattn: opts.score_mod: ..."
 * error.  An expression kept by the script past its trace is an error to
 * use. */
#include <stdarg.h>
#include <string.h>

#include "lbinding.h"

#include "../src/expr.h"

#define TRACE_MT "flashattn.Trace"
#define EXPR_MT "flashattn.Expr"
#define HOLDER_MT "flashattn.ExprHolder"

/* registry: the module's tables, weak keys (a trace may capture one, for fa.where; a script may hold a copy
 * loaded before `package.loaded.flashattn = nil; require "flashattn"` loaded another) */
static const char module_key = 0;

enum { K_NUM, K_BOOL, K_PARTIAL };

typedef struct {
  const char *what; /* "opts.score_mod" */
  int n, done;
  fa_expr_node nodes[FA_EXPR_MAX_NODES];
} trace;

/* An expression value: a node, or (K_PARTIAL) a captured tensor indexed
 * with `have` of its `ndim` indices so far (bias[h] of a 2-D bias). */
typedef struct {
  int32_t node;
  uint8_t kind, tensor, ndim, have;
  int32_t idx[4];
} expr;

/* A userdata owning one engine object (an fa_expr: the "holder"; an
 * fa_block_mask), released at its __gc or when the state closes. */
typedef struct {
  uint64_t magic; /* fal_magic(h, FAL_MAGIC_HOLDER or FAL_MAGIC_BLOCK) */
  void *p;
  void (*release)(void *);
  fal_link link; /* fal_link_box's */
} handle;

#define BLOCK_MT "flashattn.BlockMask"

static int handle_kind(const char *mt) { return strcmp(mt, BLOCK_MT) == 0 ? FAL_MAGIC_BLOCK : FAL_MAGIC_HOLDER; }

/* The handle of metatable mt at idx (mt NULL: either kind, for __gc, which
 * the handle metatables share), or NULL: its size and magic too, as the
 * debug library can give the metatable to any userdata (or a holder's to a
 * block mask). */
static handle *tohandle(lua_State *L, int idx, const char *mt) {
  handle *h = (handle *)(mt ? luaL_testudata(L, idx, mt) : lua_touserdata(L, idx));
  if (!h || lua_type(L, idx) != LUA_TUSERDATA || lua_rawlen(L, idx) != sizeof *h) return NULL;
  if (mt) return h->magic == fal_magic(h, handle_kind(mt)) ? h : NULL;
  return h->magic == fal_magic(h, FAL_MAGIC_BLOCK) || h->magic == fal_magic(h, FAL_MAGIC_HOLDER) ? h : NULL;
}

/* ---- errors ------------------------------------------------------------------------- */

static int terr(lua_State *L, const trace *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  const char *msg = lua_pushvfstring(L, fmt, ap);
  va_end(ap);
  return fal_error(L, "%s: %s", t->what, msg);
}

/* ---- expressions ------------------------------------------------------------------ */

static void expr_metatable(lua_State *L);

static expr *toexpr(lua_State *L, int idx) { return (expr *)fal_testudata(L, idx, EXPR_MT, sizeof(expr)); }

/* The trace of the expression at idx, pushed (its slot returned in *ti);
 * an error when the trace is over. */
static trace *trace_of(lua_State *L, int idx, int *ti) {
  lua_getiuservalue(L, idx, 1);
  trace *t = (trace *)fal_testudata(L, -1, TRACE_MT, sizeof(trace));
  if (!t) fal_error(L, "internal error: an expression without its trace");
  if (t->done)
    fal_error(L, "%s: an expression was used after the call that traced it (keep no expression past the "
                 "function's return)", t->what);
  *ti = lua_gettop(L);
  return t;
}

/* The trace of the first expression among the arguments 1..n, pushed. */
static trace *find_trace(lua_State *L, int n, int *ti) {
  for (int i = 1; i <= n; i++)
    if (toexpr(L, i)) return trace_of(L, i, ti);
  return NULL;
}

static int add_node(lua_State *L, trace *t, int op, int is_bool, int a0, int a1, int a2, double c) {
  if (t->n >= FA_EXPR_MAX_NODES)
    terr(L, t, "the expression is too large (more than %d nodes)", FA_EXPR_MAX_NODES);
  fa_expr_node_set(&t->nodes[t->n], op, is_bool, a0, a1, a2, c);
  return t->n++;
}

/* Pushes a new expression of trace (at ti) for node. */
static expr *push_expr(lua_State *L, int ti, int node, int kind) {
  expr *e = (expr *)lua_newuserdatauv(L, sizeof(expr), 1);
  memset(e, 0, sizeof *e);
  e->node = node, e->kind = (uint8_t)kind;
  lua_pushvalue(L, ti);
  lua_setiuservalue(L, -2, 1);
  expr_metatable(L);
  lua_setmetatable(L, -2);
  return e;
}

static const char *kind_name(int is_bool) { return is_bool ? "a boolean" : "a number"; }

/* The node of the operand at idx of operation `op` (numbers and booleans
 * become constants); *is_bool its kind. */
static int operand(lua_State *L, int idx, trace *t, const char *op, int *is_bool) {
  switch (lua_type(L, idx)) {
  case LUA_TNUMBER:
    *is_bool = 0;
    return add_node(L, t, FA_X_CONST, 0, 0, 0, 0, (double)lua_tonumber(L, idx));
  case LUA_TBOOLEAN:
    *is_bool = 1;
    return add_node(L, t, FA_X_CONST, 1, 0, 0, 0, lua_toboolean(L, idx));
  case LUA_TNIL:
    terr(L, t, "%s got nil (a Lua table indexed by an expression, a missing field or global, or a 1-D tensor "
               "read at a number past its end gives nil; capture a tensor and index it in range)", op);
    break;
  default:
    break;
  }
  expr *e = toexpr(L, idx);
  if (!e) terr(L, t, "%s got %s (expected a number, a boolean or an expression)", op, fal_typename(L, idx));
  int ti;
  if (trace_of(L, idx, &ti) != t) terr(L, t, "%s mixes expressions of two different traces", op);
  lua_pop(L, 1);
  if (e->kind == K_PARTIAL)
    terr(L, t, "%s got a tensor indexed with %d of its %d dimensions (index every dimension: bias[h][q])", op,
         (int)e->have, (int)e->ndim);
  *is_bool = e->kind == K_BOOL;
  return e->node;
}

/* A binary operation (upvalues: op, its name, the operands' kind: 0
 * numbers, 1 booleans, 2 either (alike); the result's: 0 or 1; see
 * fa_expr_rule). */
static int binary(lua_State *L) {
  const int op = (int)lua_tointeger(L, lua_upvalueindex(1));
  const char *name = lua_tostring(L, lua_upvalueindex(2));
  const int want = (int)lua_tointeger(L, lua_upvalueindex(3)), result = (int)lua_tointeger(L, lua_upvalueindex(4));
  lua_settop(L, 2);
  int ti, ba, bb;
  trace *t = find_trace(L, 2, &ti);
  if (!t) return fal_error(L, "%s: expected an expression", name);
  const int a = operand(L, 1, t, name, &ba), b = operand(L, 2, t, name, &bb);
  if (want == 2 && ba != bb) terr(L, t, "%s compares %s with %s", name, kind_name(ba), kind_name(bb));
  if (want != 2 && (ba != want || bb != want))
    terr(L, t, "%s needs %s operands, got %s", name, want ? "boolean" : "number", kind_name(ba != want ? ba : bb));
  push_expr(L, ti, add_node(L, t, op, result, a, b, 0, 0), result ? K_BOOL : K_NUM);
  return 1;
}

/* A unary operation (upvalues: op, name, operand kind 0/1). */
static int unary(lua_State *L) {
  const int op = (int)lua_tointeger(L, lua_upvalueindex(1));
  const char *name = lua_tostring(L, lua_upvalueindex(2));
  const int want = (int)lua_tointeger(L, lua_upvalueindex(3));
  int ti, ba;
  if (!toexpr(L, 1)) return fal_error(L, "%s: expected an expression", name);
  trace *t = trace_of(L, 1, &ti);
  const int a = operand(L, 1, t, name, &ba);
  if (ba != want) terr(L, t, "%s needs %s, got %s", name, want ? "a boolean" : "a number", kind_name(ba));
  push_expr(L, ti, add_node(L, t, op, want, a, 0, 0, 0), want ? K_BOOL : K_NUM);
  return 1;
}

/* Metamethods and methods that have no meaning in an expression. */
static int refuse(lua_State *L) {
  const char *why = lua_tostring(L, lua_upvalueindex(1));
  trace *t = NULL;
  for (int i = 1; i <= lua_gettop(L) && !t; i++)
    if (toexpr(L, i)) {
      lua_getiuservalue(L, i, 1);
      t = (trace *)fal_testudata(L, -1, TRACE_MT, sizeof(trace));
    }
  if (t) return terr(L, t, "%s", why);
  return fal_error(L, "expression: %s", why);
}

/* Completes a tensor read once every dimension has its index. */
static void push_index(lua_State *L, trace *t, int ti, int tensor, int ndim, int is_bool, const int32_t *idx,
                       int have) {
  if (have < ndim) {
    expr *e = push_expr(L, ti, -1, K_PARTIAL);
    e->tensor = (uint8_t)tensor, e->ndim = (uint8_t)ndim, e->have = (uint8_t)have;
    memcpy(e->idx, idx, sizeof e->idx);
    return;
  }
  const int node = add_node(L, t, FA_X_LOAD, is_bool, idx[0], idx[1], idx[2], 0);
  t->nodes[node].a[3] = idx[3];
  t->nodes[node].tensor = (uint8_t)tensor, t->nodes[node].ndim = (uint8_t)ndim;
  push_expr(L, ti, node, is_bool ? K_BOOL : K_NUM);
}

/* The node of an index (a number or a number expression) at idx. */
static int index_node(lua_State *L, int idx, trace *t) {
  int b;
  const int n = operand(L, idx, t, "a tensor index", &b);
  if (b) terr(L, t, "a tensor index is a boolean, expected a number");
  return n;
}

static const char *const method_list = "abs, exp, log, tanh, sqrt, floor, min, max, lt, le, gt, ge, eq, ne";

/* __index: methods by name (upvalue 1: the methods table); a partial
 * tensor read takes its next index. */
static int expr_index(lua_State *L) {
  expr *e = toexpr(L, 1);
  if (!e) return fal_error(L, "expression __index: expected an expression, got %s", fal_typename(L, 1));
  int ti;
  trace *t = trace_of(L, 1, &ti);
  if (e->kind == K_PARTIAL && (lua_type(L, 2) == LUA_TNUMBER || toexpr(L, 2))) {
    int32_t idx[4];
    memcpy(idx, e->idx, sizeof idx);
    idx[e->have] = index_node(L, 2, t);
    /* the dtype: the tensor's, looked up again */
    lua_getiuservalue(L, ti, 1);
    lua_rawgeti(L, -1, e->tensor + 1);
    fal_box *b = fal_tobox(L, -1);
    const int is_bool = b && b->t && fa_tensor_dtype(b->t) == FA_BOOL;
    lua_pop(L, 2);
    push_index(L, t, ti, e->tensor, e->ndim, is_bool, idx, e->have + 1);
    return 1;
  }
  if (lua_type(L, 2) == LUA_TSTRING && e->kind != K_PARTIAL) {
    lua_pushvalue(L, 2);
    if (lua_rawget(L, lua_upvalueindex(1)) != LUA_TNIL) return 1;
    return terr(L, t, "unknown method or field '%s' of an expression (the methods: %s; fa.where(c, a, b))",
                lua_tostring(L, 2), method_list);
  }
  if (e->kind == K_PARTIAL)
    return terr(L, t, "a tensor read indexed with %s (expected a number or a number expression)",
                fal_describe(L, 2));
  return terr(L, t, "indexing an expression with %s (only captured tensors can be indexed)", fal_describe(L, 2));
}

/* ---- metatables ------------------------------------------------------------------ */

/* A metamethod or method and the operation it records (its operands' and
 * result's kinds: fa_expr_rule_of, shared with the C builder). */
typedef struct {
  const char *name, *text;
  int op;
} opdef;

static const opdef metaops[] = {
    {"__add", "'+'", FA_X_ADD},  {"__sub", "'-'", FA_X_SUB}, {"__mul", "'*'", FA_X_MUL},
    {"__div", "'/'", FA_X_DIV},  {"__mod", "'%'", FA_X_MOD}, {"__pow", "'^'", FA_X_POW},
    {"__band", "'&'", FA_X_AND}, {"__bor", "'|'", FA_X_OR},  {"__unm", "unary '-'", FA_X_NEG},
    {"__bnot", "'~'", FA_X_NOT}, {NULL, NULL, 0}};
static const opdef methods[] = {
    {"abs", ":abs()", FA_X_ABS}, {"exp", ":exp()", FA_X_EXP}, {"log", ":log()", FA_X_LOG},  {"tanh", ":tanh()", FA_X_TANH},
    {"sqrt", ":sqrt()", FA_X_SQRT}, {"floor", ":floor()", FA_X_FLOOR}, {"min", ":min()", FA_X_MIN}, {"max", ":max()", FA_X_MAX},
    {"lt", ":lt()", FA_X_LT},    {"le", ":le()", FA_X_LE},    {"gt", ":gt()", FA_X_GT},     {"ge", ":ge()", FA_X_GE},
    {"eq", ":eq()", FA_X_EQ},    {"ne", ":ne()", FA_X_NE},    {NULL, NULL, 0}};
static const char *const refused[][2] = {
    {"__eq", "'==' compares expressions as Lua objects, not their values: use a:eq(b) (and a:ne(b) for '~=')"},
    {"__lt", "'<' cannot return an expression: use a:lt(b) (a:gt(b) for '>')"},
    {"__le", "'<=' cannot return an expression: use a:le(b) (a:ge(b) for '>=')"},
    {"__idiv", "'//' is not supported: use (a / b):floor()"},
    {"__bxor", "binary '~' (xor) is not supported: use a:ne(b) on booleans"},
    {"__shl", "'<<' is not supported"},
    {"__shr", "'>>' is not supported"},
    {"__concat", "'..' of an expression is not supported"},
    {"__len", "'#' of an expression is not supported"},
    {"__call", "an expression is not a function"},
    {"__newindex", "an expression cannot be assigned to"},
    {"__tostring", "tostring or print of an expression is not supported (it has no value while traced)"},
    {"__close", "an expression is not a to-be-closed value"},
    {NULL, NULL}};

static void push_op(lua_State *L, const opdef *d) {
  const fa_expr_rule *r = fa_expr_rule_of(d->op);
  lua_pushinteger(L, d->op);
  lua_pushstring(L, d->text);
  lua_pushinteger(L, r->want);
  if (r->arity == 1) {
    lua_pushcclosure(L, unary, 3);
  } else {
    lua_pushinteger(L, r->result);
    lua_pushcclosure(L, binary, 4);
  }
}

static void expr_metatable(lua_State *L) {
  if (!luaL_newmetatable(L, EXPR_MT)) return;
  for (const opdef *d = metaops; d->name; d++) {
    push_op(L, d);
    lua_setfield(L, -2, d->name);
  }
  for (int i = 0; refused[i][0]; i++) {
    lua_pushstring(L, refused[i][1]);
    lua_pushcclosure(L, refuse, 1);
    lua_setfield(L, -2, refused[i][0]);
  }
  lua_newtable(L);
  for (const opdef *d = methods; d->name; d++) {
    push_op(L, d);
    lua_setfield(L, -2, d->name);
  }
  lua_pushcclosure(L, expr_index, 1);
  lua_setfield(L, -2, "__index");
  lua_pushliteral(L, EXPR_MT);
  lua_setfield(L, -2, "__metatable");
}

/* ---- captured tensors: t[expr] (ltensor.c's __index) ---------------------------- */

int fal_trace_index(lua_State *L) {
  if (!toexpr(L, 2)) return 0;
  int ti;
  trace *t = trace_of(L, 2, &ti);
  fal_box *b = fal_tobox(L, 1);
  if (!b || !b->t) terr(L, t, "a tensor indexed by an expression has been freed");
  lua_getiuservalue(L, ti, 1); /* tensors: [box] = slot, [slot] = box */
  const int tt = lua_gettop(L);
  lua_pushvalue(L, 1);
  int slot;
  if (lua_rawget(L, tt) == LUA_TNUMBER) {
    slot = (int)lua_tointeger(L, -1) - 1;
  } else {
    slot = (int)lua_rawlen(L, tt);
    if (slot >= FA_EXPR_MAX_TENSORS) terr(L, t, "more than %d tensors captured", FA_EXPR_MAX_TENSORS);
    lua_pushvalue(L, 1);
    lua_pushinteger(L, slot + 1);
    lua_rawset(L, tt);
    lua_pushvalue(L, 1);
    lua_rawseti(L, tt, slot + 1);
  }
  lua_settop(L, ti);
  int32_t idx[4] = {0, 0, 0, 0};
  idx[0] = index_node(L, 2, t);
  push_index(L, t, ti, slot, fa_tensor_ndim(b->t), fa_tensor_dtype(b->t) == FA_BOOL, idx, 1);
  return 1;
}

/* ---- fa.where(c, a, b) ------------------------------------------------------------ */

static int l_where(lua_State *L) {
  lua_settop(L, 3);
  int ti, bc, ba, bb;
  trace *t = find_trace(L, 3, &ti);
  if (!t) { /* plain values: c ? a : b */
    if (lua_type(L, 1) != LUA_TBOOLEAN) fal_argerror(L, 1, "c", "expected a boolean, got %s", fal_typename(L, 1));
    lua_pushvalue(L, lua_toboolean(L, 1) ? 2 : 3);
    return 1;
  }
  const int c = operand(L, 1, t, "fa.where's condition", &bc), a = operand(L, 2, t, "fa.where", &ba),
            b = operand(L, 3, t, "fa.where", &bb);
  if (!bc) terr(L, t, "fa.where's condition is a number, expected a boolean");
  if (ba != bb) terr(L, t, "fa.where chooses between %s and %s (expected two of one kind)", kind_name(ba), kind_name(bb));
  push_expr(L, ti, add_node(L, t, FA_X_WHERE, ba, c, a, b, 0), ba ? K_BOOL : K_NUM);
  return 1;
}

/* ---- tracing ------------------------------------------------------------------------- */

static void handle_drop(fal_link *l) {
  handle *h = (handle *)((char *)l - offsetof(handle, link));
  void *p = h->p;
  h->p = NULL;
  if (p) h->release(p);
}

static int handle_gc(lua_State *L) {
  handle *h = tohandle(L, 1, NULL);
  if (!h) return 0;
  fal_unlink(&h->link);
  handle_drop(&h->link);
  return 0;
}

/* Pushes the handle metatable mt (made with __gc, then extended by setup,
 * when the module opens: fal_trace_open). */
static void handle_metatable(lua_State *L, const char *mt, void (*setup)(lua_State *L)) {
  if (!luaL_newmetatable(L, mt)) return;
  fal_guard_metatable(L, mt, handle_gc, NULL);
  if (setup) setup(L);
}

/* Pushes an empty handle of metatable mt with nuv user values, linked into
 * the state as fal_link_box says. */
static handle *push_handle(lua_State *L, fal_state *s, const char *mt, void (*release)(void *), int nuv,
                           void (*setup)(lua_State *L)) {
  handle *h = (handle *)lua_newuserdatauv(L, sizeof(handle), nuv);
  h->magic = fal_magic(h, handle_kind(mt));
  h->p = NULL;
  h->release = release;
  h->link.prev = h->link.next = NULL;
  handle_metatable(L, mt, setup);
  lua_setmetatable(L, -2);
  fal_link_box(L, s, &h->link, handle_drop);
  return h;
}

static void release_expr(void *p) { fa_expr_free((fa_expr *)p); }
static void release_block(void *p) { fa_block_mask_free((fa_block_mask *)p); }

/* Keeps only the nodes the result depends on, in order. */
static void prune(trace *t) {
  int32_t map[FA_EXPR_MAX_NODES];
  const int n = t->n;
  for (int i = 0; i < n; i++) map[i] = 0;
  map[n - 1] = 1;
  for (int i = n - 1; i >= 0; i--) {
    if (!map[i]) continue;
    const fa_expr_node *x = &t->nodes[i];
    const int na = x->op == FA_X_LOAD ? x->ndim : x->op == FA_X_WHERE ? 3
                   : x->op <= FA_X_K                                  ? 0
                   : (x->op >= FA_X_NEG && x->op <= FA_X_FLOOR) || x->op == FA_X_NOT ? 1 : 2;
    for (int j = 0; j < na; j++) map[x->a[j]] = 1;
    t->nodes[i].ndim = x->op == FA_X_LOAD ? x->ndim : (uint8_t)na; /* operand count, for the remap below */
  }
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (!map[i]) continue;
    fa_expr_node x = t->nodes[i];
    for (int j = 0; j < x.ndim; j++) x.a[j] = map[x.a[j]] - 1;
    if (x.op != FA_X_LOAD) x.ndim = 0;
    t->nodes[m] = x;
    map[i] = ++m;
  }
  t->n = m;
}

/* The traced expression over the captured tensors, read from their boxes in
 * the table at tt (their names in the table at names) right before the call:
 * no Lua code runs in between, so the tensors stay alive. */
static fa_status trace_expr_new(lua_State *L, const trace *t, int tt, int names, int nt, fa_expr **e) {
  fa_tensor *tensors[FA_EXPR_MAX_TENSORS];
  const char *tnames[FA_EXPR_MAX_TENSORS];
  for (int i = 0; i < nt; i++) {
    lua_rawgeti(L, tt, i + 1);
    fal_box *b = fal_tobox(L, -1);
    lua_pushvalue(L, -1);
    lua_rawget(L, names);
    tnames[i] = lua_tostring(L, -1); /* kept alive by the names table */
    if (!b || !b->t) terr(L, t, "a tensor it captured (%s) was freed during the trace", tnames[i] ? tnames[i] : "?");
    tensors[i] = b->t;
    lua_pop(L, 2);
  }
  return fa_expr_new(fal_ctx(L), t->nodes, t->n, tensors, tnames, nt, e);
}

/* Whether the table on top of the stack is one of the module's (the set at mods, fal_trace_open's). */
static int module_table(lua_State *L, int mods) {
  lua_pushvalue(L, -1);
  const int found = lua_rawget(L, mods) != LUA_TNIL;
  lua_pop(L, 1);
  return found;
}

/* Traces the function at fidx (mask: mask_mod(b, h, q, k), else
 * score_mod(s, b, h, q, k)); pushes the holder that owns the result. */
static fa_expr *trace_fn(lua_State *L, int fidx, int mask, const char *what) {
  fal_state *s = fal_live_state(L);
  fidx = lua_absindex(L, fidx);
  handle *h = push_handle(L, s, HOLDER_MT, release_expr, 0, NULL);
  const int hi = lua_gettop(L);

  trace *t = (trace *)lua_newuserdatauv(L, sizeof(trace), 2);
  t->what = what, t->n = 0, t->done = 0;
  luaL_newmetatable(L, TRACE_MT);
  lua_setmetatable(L, -2);
  const int ti = lua_gettop(L);
  lua_newtable(L);
  lua_setiuservalue(L, ti, 1);
  lua_newtable(L); /* names: [box] = upvalue name */
  const int names = lua_gettop(L);

  /* what the function captured: tables are refused (a table indexed by an
   * expression is nil), but _ENV and the module (fa.where) */
  lua_rawgetp(L, LUA_REGISTRYINDEX, &module_key);
  const int mods = lua_gettop(L);
  for (int i = 1;; i++) {
    const char *up = lua_getupvalue(L, fidx, i);
    if (!up) break;
    if (lua_type(L, -1) == LUA_TTABLE && strcmp(up, "_ENV") != 0 && !module_table(L, mods))
      terr(L, t, "captures the Lua table '%s' (a variant may capture numbers, booleans, tensors and functions: "
                 "make it a tensor)", up[0] ? up : "?");
    if (fal_tobox(L, -1)) {
      lua_pushvalue(L, -1);
      lua_pushstring(L, up);
      lua_rawset(L, names);
    }
    lua_pop(L, 1);
  }
  lua_settop(L, names);

  lua_pushvalue(L, fidx);
  const int first = mask ? FA_X_B : FA_X_S;
  for (int op = first; op <= FA_X_K; op++) push_expr(L, ti, add_node(L, t, op, 0, 0, 0, 0, 0), K_NUM);
  const int status = lua_pcall(L, FA_X_K - first + 1, 1, 0);
  /* a failed trace is over too: the expressions a script kept from it are errors to use */
  if (status != LUA_OK) t->done = 1;
  if (status == LUA_ERRMEM) lua_error(L);
  if (status != LUA_OK) {
    const size_t wl = strlen(what);
    const char *msg = lua_tostring(L, -1);
    if (msg && strncmp(msg, "flashattn: ", 11) == 0 && strncmp(msg + 11, what, wl) == 0) lua_error(L);
    if (msg) fal_error(L, "%s: the function raised an error: %s", what, msg);
    fal_error(L, "%s: the function raised an error (a %s value)", what, fal_typename(L, -1));
  }
  /* the result */
  const int r = lua_gettop(L);
  const char *want = mask ? "a boolean or a boolean expression (true = attend)" : "a number or a number expression";
  int is_bool;
  if (lua_type(L, r) == LUA_TNIL || (lua_type(L, r) != LUA_TNUMBER && lua_type(L, r) != LUA_TBOOLEAN && !toexpr(L, r))) {
    t->done = 1;
    if (lua_type(L, r) == LUA_TNIL) terr(L, t, "returned nil, expected %s", want);
    terr(L, t, "returned %s, expected %s", fal_typename(L, r), want);
  }
  const int root = operand(L, r, t, "the result", &is_bool);
  t->done = 1; /* the function's expressions are used no more */
  if (is_bool != mask)
    terr(L, t, "returned %s%s, expected %s", kind_name(is_bool), toexpr(L, r) ? " expression" : "", want);
  if (root != t->n - 1) { /* the result must be the last node */
    fa_expr_node x = t->nodes[root];
    const int c = add_node(L, t, FA_X_CONST, is_bool, 0, 0, 0, 0);
    t->nodes[c] = x; /* a copy of the root (a leaf or an operation on earlier nodes) */
  }
  prune(t);

  lua_getiuservalue(L, ti, 1);
  const int tt = lua_gettop(L);
  const lua_Unsigned len = lua_rawlen(L, tt);
  /* the reads kept it below the bound; a script that reached the table (the debug library) did not */
  if (len > FA_EXPR_MAX_TENSORS) terr(L, t, "more than %d tensors captured", FA_EXPR_MAX_TENSORS);
  fa_context *ctx = fal_ctx(L);
  fa_expr *e = NULL;
  /* FAL_CALL's retry after a collection calls it again, so the tensors are read from their boxes again then (a
   * finalizer of the collection may have freed one) */
  FAL_CALL(L, ctx, trace_expr_new(L, t, tt, names, (int)len, &e));
  h->p = e;
  lua_settop(L, hi);
  return e;
}

const fa_expr *fal_trace_opt(lua_State *L, int idx, const char *key) {
  const int mask = strcmp(key, "mask_mod") == 0;
  int tt = lua_getfield(L, idx, key);
  if (tt == LUA_TNIL) {
    lua_pop(L, 1);
    return NULL;
  }
  if (tt != LUA_TFUNCTION) fal_error(L, "opts.%s: expected a function, got %s", key, fal_typename(L, -1));
  const fa_expr *e = trace_fn(L, -1, mask, mask ? "opts.mask_mod" : "opts.score_mod");
  lua_remove(L, -2); /* the function; the holder stays */
  return e;
}

/* ---- fa.block_mask(mask_mod, B, H, Lq, Lk [, opts]) --------------------------- */


static fa_block_mask *check_block(lua_State *L) {
  handle *b = tohandle(L, 1, BLOCK_MT);
  if (!b) fal_argerror(L, 1, "self", "expected a " BLOCK_MT ", got %s", fal_typename(L, 1));
  if (!b->p) fal_error(L, "block mask: released (the state is closing)");
  return (fa_block_mask *)b->p;
}

static const char *const state_names[] = {"empty", "full", "partial"};

/* bm:counts() -> empty, full, partial */
static int bm_counts(lua_State *L) {
  int64_t c[3];
  fa_block_mask_counts(check_block(L), c);
  for (int i = 0; i < 3; i++) lua_pushinteger(L, (lua_Integer)c[i]);
  return 3;
}

/* bm:tile(b, h, qi, ki) -> "empty" | "full" | "partial" (1-based) */
static int bm_tile(lua_State *L) {
  const fa_block_mask *m = check_block(L);
  int64_t i[4];
  static const char *const names[] = {"b", "h", "qi", "ki"};
  for (int a = 0; a < 4; a++) i[a] = fal_checkindex(L, a + 2, names[a]);
  const int s = fa_block_mask_tile(m, i[0], i[1], i[2], i[3]);
  if (s < 0) {
    int64_t z[6];
    fa_block_mask_sizes(m, z);
    return fal_error(L, "block mask: tile(%I, %I, %I, %I) is out of range (1..%I, 1..%I, 1..%I, 1..%I)",
                     (lua_Integer)i[0] + 1, (lua_Integer)i[1] + 1, (lua_Integer)i[2] + 1, (lua_Integer)i[3] + 1,
                     (lua_Integer)z[0], (lua_Integer)z[1], (lua_Integer)((z[2] + z[4] - 1) / z[4]),
                     (lua_Integer)((z[3] + z[5] - 1) / z[5]));
  }
  lua_pushstring(L, state_names[s]);
  return 1;
}

/* bm:sizes() -> B, H, Lq, Lk, Br, Bc */
static int bm_sizes(lua_State *L) {
  int64_t z[6];
  fa_block_mask_sizes(check_block(L), z);
  for (int i = 0; i < 6; i++) lua_pushinteger(L, (lua_Integer)z[i]);
  return 6;
}

static int bm_tostring(lua_State *L) {
  const fa_block_mask *m = check_block(L);
  int64_t z[6], c[3];
  fa_block_mask_sizes(m, z);
  fa_block_mask_counts(m, c);
  lua_pushfstring(L, BLOCK_MT " (B, H, Lq, Lk) = (%I, %I, %I, %I), tile {%I, %I}: %I empty, %I full, %I partial",
                  (lua_Integer)z[0], (lua_Integer)z[1], (lua_Integer)z[2], (lua_Integer)z[3], (lua_Integer)z[4],
                  (lua_Integer)z[5], (lua_Integer)c[0], (lua_Integer)c[1], (lua_Integer)c[2]);
  return 1;
}

static void block_setup(lua_State *L) {
  static const luaL_Reg bm_methods[] = {{"counts", bm_counts}, {"tile", bm_tile}, {"sizes", bm_sizes}, {NULL, NULL}};
  luaL_newlib(L, bm_methods);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, bm_tostring);
  lua_setfield(L, -2, "__tostring");
}

static const char *const block_keys[] = {"tile", NULL};

static int l_block_mask(lua_State *L) {
  lua_settop(L, 6);
  int64_t sz[4];
  static const char *const names[] = {"B", "H", "Lq", "Lk"};
  for (int i = 0; i < 4; i++) sz[i] = fal_checkint(L, i + 2, names[i]);
  int64_t br = 0, bc = 0;
  if (fal_opts(L, 6, "fa.block_mask", block_keys)) fal_opt_size_pair(L, 6, "tile", &br, &bc);
  if (lua_type(L, 1) != LUA_TFUNCTION) fal_typeerror(L, 1, "mask_mod", "a function");
  fal_state *s = fal_live_state(L);
  const fa_expr *e = trace_fn(L, 1, 1, "fa.block_mask: mask_mod"); /* 7: the holder */
  handle *b = push_handle(L, s, BLOCK_MT, release_block, 1, block_setup); /* 8 */
  lua_pushvalue(L, 7);
  lua_setiuservalue(L, 8, 1); /* the mask_mod: calls without their own use it */
  fa_context *ctx = fal_ctx(L);
  fa_block_mask *m = NULL;
  FAL_CALL(L, ctx, fa_block_mask_new(ctx, e, sz[0], sz[1], sz[2], sz[3], br, bc, &m));
  b->p = m;
  return 1;
}

const fa_block_mask *fal_trace_block_mask(lua_State *L, int idx, const fa_expr **mask_mod) {
  if (lua_getfield(L, idx, "block_mask") == LUA_TNIL) {
    lua_pop(L, 1);
    return NULL;
  }
  handle *b = tohandle(L, -1, BLOCK_MT);
  if (!b) fal_error(L, "opts.block_mask: expected a " BLOCK_MT " (fa.block_mask), got %s", fal_typename(L, -1));
  if (!b->p) fal_error(L, "opts.block_mask: released (the state is closing)");
  if (!*mask_mod) { /* the block mask's own */
    lua_getiuservalue(L, -1, 1);
    handle *h = tohandle(L, -1, HOLDER_MT);
    *mask_mod = h ? (const fa_expr *)h->p : NULL;
    lua_pop(L, 1);
  }
  return (const fa_block_mask *)b->p; /* the block mask stays pushed, and with it its mask_mod */
}

static const luaL_Reg trace_funcs[] = {{"where", l_where}, {"block_mask", l_block_mask}, {NULL, NULL}};

void fal_trace_open(lua_State *L) {
  /* the metatables now (lbinding.h: fal_pins_metatable_make says why) */
  expr_metatable(L);
  handle_metatable(L, HOLDER_MT, NULL);
  handle_metatable(L, BLOCK_MT, block_setup);
  luaL_newmetatable(L, TRACE_MT);
  lua_pop(L, 4);
  luaL_setfuncs(L, trace_funcs, 0);
  fal_push_weak_keyed(L, &module_key);
  lua_pushvalue(L, -2);
  lua_pushboolean(L, 1);
  lua_rawset(L, -3);
  lua_pop(L, 1);
}
