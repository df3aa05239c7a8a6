/* The kernels (API §2) and their cost models (§3): fa.softmax,
 * fa.attention, fa.attention_reference, fa.merge_states, fa.matmul,
 * fa.cost.attention, fa.cost.softmax.  Option tables become the C option
 * structs; the core checks every value. */
#include <string.h>

#include <limits.h>
#include <math.h>

#include "lbinding.h"

/* Names in the order of the C enums (index = enum value). */
static const char *const softmax_algos[] = {"auto", "naive", "safe", "online", "fused", NULL};
static const char *const attn_algos[] = {"auto", "naive", "two_pass", "flash_row", "flash", NULL};
static const char *const matmul_algos[] = {"auto", "naive", "tiled", "blas", NULL};

static const char *const softmax_keys[] = {"algo", "block", "out", NULL};
static const char *const attn_keys[] = {"algo",    "scale", "causal",     "window", "mask",    "kv_lens",
                                        "alibi",   "softcap", "tile",     "return_lse", "out", "lse_out", "splits", "kernel",
                                        "score_mod", "mask_mod", "block_mask", "deterministic", NULL};
static const char *const matmul_keys[] = {"algo", "tile", "out", NULL};

/* ---- options ------------------------------------------------------------------ */

static void read_softmax_opts(lua_State *L, int idx, const char *fname, fa_softmax_opts *o, fal_pins *pins) {
  int algo;
  fa_softmax_opts_init(o);
  if (!fal_opts(L, idx, fname, softmax_keys)) return;
  if (fal_opt_enum(L, idx, "algo", softmax_algos, &algo)) o->algo = (fa_softmax_algo)algo;
  fal_opt_int(L, idx, "block", &o->block);
  o->out = fal_opt_tensor(L, idx, "out", pins);
}

static fa_causal read_causal(lua_State *L, int idx) {
  fa_causal c = FA_CAUSAL_NONE;
  int tt = lua_getfield(L, idx, "causal");
  const char *name = fal_cstring(L, -1); /* NULL: not a string, or one with a NUL byte */
  if (tt == LUA_TBOOLEAN) c = lua_toboolean(L, -1) ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
  else if (name && strcmp(name, "bottom_right") == 0) c = FA_CAUSAL_BOTTOM_RIGHT;
  else if (name && strcmp(name, "top_left") == 0) c = FA_CAUSAL_TOP_LEFT;
  else if (tt == LUA_TSTRING)
    fal_error(L, "opts.causal: expected false, true, 'bottom_right' or 'top_left', got %s", fal_describe(L, -1));
  else if (tt != LUA_TNIL)
    fal_error(L, "opts.causal: expected false, true, 'bottom_right' or 'top_left', got %s", fal_typename(L, -1));
  lua_pop(L, 1);
  return c;
}

int fal_opt_splits(lua_State *L, int idx, int64_t *out) {
  int tt = lua_getfield(L, idx, "splits");
  if (tt == LUA_TNIL) {
    lua_pop(L, 1);
    return 0;
  }
  int isint = 0;
  lua_Integer n = tt == LUA_TNUMBER ? lua_tointegerx(L, -1, &isint) : 0;
  const char *name = fal_cstring(L, -1);
  if (name && strcmp(name, "auto") == 0) *out = 0;
  else if (isint && n >= 1) *out = (int64_t)n;
  else fal_error(L, "opts.splits: expected an integer >= 1 or 'auto', got %s", fal_describe(L, -1));
  lua_pop(L, 1);
  return 1;
}

/* Fills o from the opts table at idx.  kv_lens and alibi arrays are pushed
 * as userdata and must stay on the stack until the call is done. */
void read_attn_opts(lua_State *L, int idx, const char *fname, fa_attention_opts *o, fal_pins *pins) {
  int algo;
  fa_attention_opts_init(o);
  if (!fal_opts(L, idx, fname, attn_keys)) return;
  if (fal_opt_enum(L, idx, "algo", attn_algos, &algo)) o->algo = (fa_attention_algo)algo;
  o->has_scale = fal_opt_num(L, idx, "scale", &o->scale);
  /* the backward's (API §10); fa.attention takes it too, so that one opts table serves both passes
   * (the forward is deterministic whatever it says) */
  fal_opt_bool(L, idx, "deterministic", &o->deterministic);
  o->causal = read_causal(L, idx);
  o->has_window = fal_opt_pair(L, idx, "window", &o->window_left, &o->window_right);
  o->mask = fal_opt_tensor(L, idx, "mask", pins);
  int64_t n;
  const double *lens = fal_opt_numbers(L, idx, "kv_lens", &n);
  if (lens) {
    int64_t *ilens = (int64_t *)fal_newbuffer(L, n, sizeof *ilens, "kv_lens");
    for (int64_t i = 0; i < n; i++) {
      if (lens[i] != floor(lens[i])) /* NaN too; an integer past int64 (math.maxinteger as a double) is out of range */
        fal_error(L, "opts.kv_lens[%I]: expected an integer, got %f", (lua_Integer)i + 1, (lua_Number)lens[i]);
      if (!(lens[i] >= -9.2e18 && lens[i] <= 9.2e18))
        fal_error(L, "opts.kv_lens[%I]: expected 0 to Lk (the number of keys), got %f", (lua_Integer)i + 1,
                  (lua_Number)lens[i]);
      ilens[i] = (int64_t)lens[i];
    }
    o->kv_lens = ilens;
    o->n_kv_lens = n;
  }
  o->alibi = fal_opt_numbers(L, idx, "alibi", &o->n_alibi);
  fal_opt_num(L, idx, "softcap", &o->softcap);
  fal_opt_size_pair(L, idx, "tile", &o->tile_q, &o->tile_k);
  fal_opt_bool(L, idx, "return_lse", &o->return_lse);
  o->out = fal_opt_tensor(L, idx, "out", pins);
  o->lse_out = fal_opt_tensor(L, idx, "lse_out", pins);
  fal_opt_splits(L, idx, &o->splits);
  o->kernel = fal_opt_string(L, idx, "kernel"); /* pushed: alive until the caller's settop */
  /* last: tracing runs the script's functions (API §9); their holders stay pushed */
  o->score_mod = fal_trace_opt(L, idx, "score_mod");
  o->mask_mod = fal_trace_opt(L, idx, "mask_mod");
  o->block_mask = fal_trace_block_mask(L, idx, &o->mask_mod);
}

static void read_matmul_opts(lua_State *L, int idx, fa_matmul_opts *o, fal_pins *pins) {
  int algo;
  fa_matmul_opts_init(o);
  if (!fal_opts(L, idx, "fa.matmul", matmul_keys)) return;
  if (fal_opt_enum(L, idx, "algo", matmul_algos, &algo)) o->algo = (fa_matmul_algo)algo;
  fal_opt_square(L, idx, "tile", &o->tile); /* n, {n} or {n, n}, as attention's tile is written */
  o->out = fal_opt_tensor(L, idx, "out", pins);
}

/* When the result in the box at slot is opts[key] itself, return that Lua
 * value (fa.softmax(x, {out = y}) == y). */
static void prefer_opt(lua_State *L, int slot, int opts_idx, const char *key) {
  if (!lua_istable(L, opts_idx)) return;
  lua_getfield(L, opts_idx, key);
  fal_prefer_same(L, slot, lua_gettop(L));
  lua_pop(L, 1);
}

/* ---- kernels --------------------------------------------------------------------- */

static int l_softmax(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_softmax_opts o;
  lua_settop(L, 2);
  fa_tensor **y = fal_newbox(L);     /* 3 */
  fal_pins *pins = fal_pins_open(L); /* 4: x and opts.out stay alive whatever the opts run */
  fa_tensor *x = fal_pin(L, pins, 1, "x");
  read_softmax_opts(L, 2, "fa.softmax", &o, pins);
  FAL_CALL(L, ctx, fa_softmax(ctx, x, &o, y));
  fal_pins_close(L, 4);
  lua_settop(L, 3);
  prefer_opt(L, 3, 2, "out");
  return 1;
}

static int attention(lua_State *L, int reference, const char *fname) {
  fa_context *ctx = fal_ctx(L);
  fa_attention_opts o;
  lua_settop(L, 4);
  fa_tensor **out = fal_newbox(L); /* 5 */
  fa_tensor **lse = fal_newbox(L); /* 6 */
  fal_pins *pins = fal_pins_open(L); /* 7: q, k, v and the opts' tensors */
  fa_tensor *q = fal_pin(L, pins, 1, "q"), *k = fal_pin(L, pins, 2, "k"), *v = fal_pin(L, pins, 3, "v");
  read_attn_opts(L, 4, fname, &o, pins); /* may push the kv_lens and alibi arrays */
  if (reference) FAL_CALL(L, ctx, fa_attention_reference(ctx, q, k, v, &o, out, lse));
  else FAL_CALL(L, ctx, fa_attention(ctx, q, k, v, &o, out, lse));
  /* lse only when asked for: the core may compute it anyway */
  int want_lse = o.return_lse || o.lse_out;
  fal_pins_close(L, 7);
  lua_settop(L, 6); /* the arrays are no longer needed */
  prefer_opt(L, 5, 4, "out");
  if (!want_lse) {
    fal_box_release(L, 6);
    lua_settop(L, 5);
    return 1;
  }
  prefer_opt(L, 6, 4, "lse_out");
  return 2;
}

static int l_attention(lua_State *L) { return attention(L, 0, "fa.attention"); }

/* fa.kernels(q, k, v [, opts]): the names of the kernels that accept the
 * call, fastest first (API §6). */
static int l_kernels(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_attention_opts o;
  const char *names[32];
  int n = 0;
  lua_settop(L, 4);
  fal_pins *pins = fal_pins_open(L); /* 5: q, k, v and the opts' tensors */
  fa_tensor *q = fal_pin(L, pins, 1, "q"), *k = fal_pin(L, pins, 2, "k"), *v = fal_pin(L, pins, 3, "v");
  read_attn_opts(L, 4, "fa.kernels", &o, pins);
  FAL_CALL(L, ctx, fa_attention_kernels(ctx, q, k, v, &o, names, 32, &n));
  fal_pins_close(L, 5);
  lua_createtable(L, n, 0);
  for (int i = 0; i < n && i < 32; i++) {
    lua_pushstring(L, names[i]);
    lua_rawseti(L, -2, i + 1);
  }
  return 1;
}
static int l_attention_reference(lua_State *L) { return attention(L, 1, "fa.attention_reference"); }

/* fa.merge_states(os, lses): tables of any number of states.  Every tensor
 * is pinned as it is read (a finalizer may empty the tables meanwhile). */
static int merge_states_n(lua_State *L, fa_context *ctx) {
  lua_settop(L, 2);
  if (lua_type(L, 2) != LUA_TTABLE) fal_typeerror(L, 2, "lses", "a table of lse tensors");
  const lua_Unsigned n = lua_rawlen(L, 1), nl = lua_rawlen(L, 2);
  if (n != nl) fal_error(L, "merge_states: os holds %I states and lses %I", (lua_Integer)n, (lua_Integer)nl);
  if (n < 1) fal_argerror(L, 1, "os", "expected a table of at least one state");
  if (n > (lua_Unsigned)(INT_MAX / 2)) fal_argerror(L, 1, "os", "too many states");
  fal_pins *pins = fal_pins_open_n(L, (int)(2 * n)); /* 3 */
  fa_tensor **ts = (fa_tensor **)lua_newuserdatauv(L, 2 * (size_t)n * sizeof *ts, 0); /* 4 */
  for (lua_Unsigned i = 0; i < 2 * n; i++) {
    const int table = i < n ? 1 : 2;
    const lua_Integer at = (lua_Integer)(i < n ? i : i - n) + 1;
    const char *name = lua_pushfstring(L, "%s[%I]", table == 1 ? "os" : "lses", at); /* may collect: before the read */
    lua_rawgeti(L, table, at);
    ts[i] = fal_pin(L, pins, -1, name);
    lua_pop(L, 2);
  }
  fa_tensor **o = fal_newbox(L);
  fa_tensor **lse = fal_newbox(L);
  FAL_CALL(L, ctx, fa_merge_states_n(ctx, (int64_t)n, ts, ts + n, o, lse));
  return 2;
}

/* The two-state form takes four arguments, the tables' form two: more is refused, not dropped (a third
 * state written as two more arguments would silently not be merged). */
static void merge_states_arity(lua_State *L, int most) {
  const int n = fal_nargs(L);
  if (n > most)
    fal_error(L, "fa.merge_states: expected %s, got %d arguments%s", most == 2 ? "(os, lses)" : "(o1, lse1, o2, lse2)",
              n, most == 4 ? " (more than two states: fa.merge_states({o1, o2, ...}, {lse1, lse2, ...}))" : "");
}

static int l_merge_states(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  const int tables = lua_type(L, 1) == LUA_TTABLE;
  merge_states_arity(L, tables ? 2 : 4);
  if (tables) return merge_states_n(L, ctx);
  lua_settop(L, 4);
  fa_tensor **o = fal_newbox(L);
  fa_tensor **lse = fal_newbox(L);
  fal_tensor(L, 1, "o1"), fal_tensor(L, 2, "lse1"), fal_tensor(L, 3, "o2"), fal_tensor(L, 4, "lse2");
  FAL_CALL(L, ctx, fa_merge_states(ctx, fal_tensor(L, 1, "o1"), fal_tensor(L, 2, "lse1"), fal_tensor(L, 3, "o2"),
                                   fal_tensor(L, 4, "lse2"), o, lse));
  return 2;
}

static int l_matmul(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_matmul_opts o;
  lua_settop(L, 3);
  fa_tensor **c = fal_newbox(L);     /* 4 */
  fal_pins *pins = fal_pins_open(L); /* 5 */
  fa_tensor *a = fal_pin(L, pins, 1, "a"), *b = fal_pin(L, pins, 2, "b");
  read_matmul_opts(L, 3, &o, pins);
  FAL_CALL(L, ctx, fa_matmul(ctx, a, b, &o, c));
  fal_pins_close(L, 5);
  lua_settop(L, 4);
  prefer_opt(L, 4, 3, "out");
  return 1;
}

/* fa.softmax_fused_max_n([dtype [, device]]): the longest row "fused" takes. */
static int l_softmax_fused_max_n(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_dtype dtype = FA_F32;
  fa_device device = fa_context_device(ctx);
  if (!lua_isnoneornil(L, 1)) fal_parse_dtype(L, 1, "argument #1 (dtype)", &dtype);
  if (!lua_isnoneornil(L, 2)) fal_parse_device(L, 2, "argument #2 (device)", &device);
  lua_pushinteger(L, (lua_Integer)fa_softmax_fused_max_n(ctx, dtype, device));
  return 1;
}

/* ---- costs ---------------------------------------------------------------------------- */

static int push_cost(lua_State *L, const fa_cost *c) {
  lua_createtable(L, 0, 2);
  lua_pushnumber(L, (lua_Number)c->flops);
  lua_setfield(L, -2, "flops");
  lua_pushnumber(L, (lua_Number)c->bytes);
  lua_setfield(L, -2, "bytes");
  return 1;
}

static int l_cost_attention(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_attention_opts o;
  fa_cost c;
  lua_settop(L, 4);
  fal_pins *pins = fal_pins_open(L);
  fa_tensor *q = fal_pin(L, pins, 1, "q"), *k = fal_pin(L, pins, 2, "k"), *v = fal_pin(L, pins, 3, "v");
  read_attn_opts(L, 4, "fa.cost.attention", &o, pins);
  FAL_CALL(L, ctx, fa_cost_attention(ctx, q, k, v, &o, &c));
  return push_cost(L, &c);
}

static int l_cost_softmax(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  fa_softmax_opts o;
  fa_cost c;
  lua_settop(L, 2);
  fal_pins *pins = fal_pins_open(L);
  fa_tensor *x = fal_pin(L, pins, 1, "x");
  read_softmax_opts(L, 2, "fa.cost.softmax", &o, pins);
  FAL_CALL(L, ctx, fa_cost_softmax(ctx, x, &o, &c));
  return push_cost(L, &c);
}

const luaL_Reg fal_kernel_funcs[] = {{"softmax", l_softmax},
                                     {"attention", l_attention},
                                     {"attention_reference", l_attention_reference},
                                     {"kernels", l_kernels},
                                     {"merge_states", l_merge_states},
                                     {"matmul", l_matmul},
                                     {"softmax_fused_max_n", l_softmax_fused_max_n},
                                     {NULL, NULL}};

const luaL_Reg fal_cost_funcs[] = {{"attention", l_cost_attention}, {"softmax", l_cost_softmax}, {NULL, NULL}};
