/* Tensor arithmetic (methods and the + - * / and unary - metamethods),
 * reductions, t:isfinite() and the comparison helpers fa.max_abs_diff,
 * fa.rel_error and fa.allclose. */
#include <math.h>

#include "lbinding.h"

/* ---- arithmetic ------------------------------------------------------------ */

/* Pushes a op x with a the tensor at ai and x the number or tensor at xi. */
static int tensor_op(lua_State *L, int ai, const char *aname, fa_binary_op op, int xi, const char *xname) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 2); /* operands at 1 and 2; the result box above them */
  fa_tensor **r = fal_newbox(L);
  fal_tensor(L, ai, aname);
  if (lua_type(L, xi) == LUA_TNUMBER) {
    double s = (double)lua_tonumber(L, xi);
    FAL_CALL(L, ctx, fa_tensor_binary(ctx, fal_tensor(L, ai, aname), op, NULL, s, r));
  } else {
    if (!fal_tobox(L, xi)) fal_typeerror(L, xi, xname, "number or " FAL_TENSOR_MT);
    fal_tensor(L, xi, xname);
    FAL_CALL(L, ctx, fa_tensor_binary(ctx, fal_tensor(L, ai, aname), op, fal_tensor(L, xi, xname), 0.0, r));
  }
  return 1;
}

/* t:add(x) etc. take one operand: a further one is refused, not dropped (Torch7's x:add(value, y) means
 * x + value·y, which dropping y would silently turn into x + value). */
static int method_op(lua_State *L, const char *name, fa_binary_op op) {
  const int n = fal_nargs(L);
  if (n > 2)
    fal_error(L, "t:%s: expected one operand (a number or a tensor), got %d%s", name, n - 1,
              op == FA_BIN_ADD ? " (for Torch7's t:add(value, y) write t + value * y)" : "");
  return tensor_op(L, 1, "self", op, 2, "x");
}

static int t_add(lua_State *L) { return method_op(L, "add", FA_BIN_ADD); }
static int t_sub(lua_State *L) { return method_op(L, "sub", FA_BIN_SUB); }
static int t_mul(lua_State *L) { return method_op(L, "mul", FA_BIN_MUL); }
static int t_div(lua_State *L) { return method_op(L, "div", FA_BIN_DIV); }

/* s op t for a number s on the left: the reversed ops, computed in f64
 * per element like the others (s itself is never rounded to t's dtype,
 * and a bool t gives s - t and s / t of its 0s and 1s). */
static int number_op(lua_State *L, fa_binary_op op) {
  if (op == FA_BIN_ADD || op == FA_BIN_MUL) return tensor_op(L, 2, "b", op, 1, "a"); /* commutative */
  return tensor_op(L, 2, "b", op == FA_BIN_SUB ? FA_BIN_RSUB : FA_BIN_RDIV, 1, "a");
}

/* __add etc.: tensor op tensor, tensor op number, number op tensor. */
static int arith(lua_State *L, fa_binary_op op) {
  if (fal_tobox(L, 1)) return tensor_op(L, 1, "a", op, 2, "b");
  if (lua_type(L, 1) == LUA_TNUMBER && fal_tobox(L, 2)) return number_op(L, op);
  return fal_typeerror(L, 1, "a", "number or " FAL_TENSOR_MT);
}

static int m_add(lua_State *L) { return arith(L, FA_BIN_ADD); }
static int m_sub(lua_State *L) { return arith(L, FA_BIN_SUB); }
static int m_mul(lua_State *L) { return arith(L, FA_BIN_MUL); }
static int m_div(lua_State *L) { return arith(L, FA_BIN_DIV); }

static int m_unm(lua_State *L) {
  lua_settop(L, 1); /* Lua passes the operand twice */
  lua_pushnumber(L, -1);
  return tensor_op(L, 1, "a", FA_BIN_MUL, 2, "b");
}

/* ---- reductions ------------------------------------------------------------- */

static int reduce(lua_State *L, fa_reduce_op op) {
  fa_context *ctx = fal_ctx(L);
  double v;
  FAL_CALL(L, ctx, fa_tensor_reduce(ctx, fal_tensor(L, 1, "self"), op, &v));
  lua_pushnumber(L, (lua_Number)v);
  return 1;
}

static int t_sum(lua_State *L) { return reduce(L, FA_REDUCE_SUM); }
static int t_max(lua_State *L) { return reduce(L, FA_REDUCE_MAX); }
static int t_min(lua_State *L) { return reduce(L, FA_REDUCE_MIN); }
static int t_norm(lua_State *L) { return reduce(L, FA_REDUCE_NORM); }

static int t_isfinite(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  int ok;
  FAL_CALL(L, ctx, fa_tensor_isfinite(ctx, fal_tensor(L, 1, "self"), &ok));
  lua_pushboolean(L, ok);
  return 1;
}

/* ---- comparisons -------------------------------------------------------------- */

static int l_max_abs_diff(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  double v;
  FAL_CALL(L, ctx, fa_max_abs_diff(ctx, fal_tensor(L, 1, "a"), fal_tensor(L, 2, "b"), &v));
  lua_pushnumber(L, (lua_Number)v);
  return 1;
}

static int l_rel_error(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  double v;
  FAL_CALL(L, ctx, fa_rel_error(ctx, fal_tensor(L, 1, "a"), fal_tensor(L, 2, "ref"), &v));
  lua_pushnumber(L, (lua_Number)v);
  return 1;
}

static int close_enough(double x, double y, double rtol, double atol) {
  if (x == y) return 1; /* equal infinities too */
  if (isnan(x) || isnan(y) || isinf(x) || isinf(y)) return 0;
  return fabs(x - y) <= atol + rtol * fabs(y);
}

/* Pushes "2x3". */
static const char *shape_str(lua_State *L, fa_tensor *t) {
  luaL_Buffer b;
  luaL_buffinit(L, &b);
  for (int i = 0; i < fa_tensor_ndim(t); i++) {
    lua_pushfstring(L, i ? "x%I" : "%I", (lua_Integer)fa_tensor_size(t, i));
    luaL_addvalue(&b);
  }
  luaL_pushresult(&b);
  return lua_tostring(L, -1);
}

#define ALLCLOSE_CHUNK ((int64_t)1 << 20) /* elements read per step: bounded host memory */

/* fa.allclose(a, b, rtol, atol): |a - b| <= atol + rtol·|b| everywhere,
 * NaN never close (PyTorch's rule with equal_nan = false). */
static int l_allclose(lua_State *L) {
  fa_context *ctx = fal_ctx(L);
  lua_settop(L, 4);
  fa_tensor **ca = fal_newbox(L); /* chunk views */
  int cai = lua_gettop(L);
  fa_tensor **cb = fal_newbox(L);
  int cbi = lua_gettop(L);
  fal_pins *pins = fal_pins_open(L); /* a and b through the allocations below */
  fa_tensor *a = fal_pin(L, pins, 1, "a"), *b = fal_pin(L, pins, 2, "b");
  double rtol = lua_isnoneornil(L, 3) ? 1e-5 : fal_checknum(L, 3, "rtol");
  double atol = lua_isnoneornil(L, 4) ? 1e-8 : fal_checknum(L, 4, "atol");
  if (!(rtol >= 0)) fal_argerror(L, 3, "rtol", "expected a number >= 0, got %f", rtol); /* NaN too */
  if (!(atol >= 0)) fal_argerror(L, 4, "atol", "expected a number >= 0, got %f", atol);
  int same = fa_tensor_ndim(a) == fa_tensor_ndim(b);
  for (int i = 0; same && i < fa_tensor_ndim(a); i++) same = fa_tensor_size(a, i) == fa_tensor_size(b, i);
  if (!same) fal_error(L, "allclose: shapes differ: %s vs %s", shape_str(L, a), shape_str(L, b));

  /* walk dimension 1 in chunks of whole rows */
  int64_t rows = fa_tensor_size(a, 0), numel = fa_tensor_numel(a);
  int64_t per_row = rows ? numel / rows : 0;
  int64_t step = per_row ? ALLCLOSE_CHUNK / per_row : rows;
  if (step < 1) step = 1;
  int64_t cap = step * per_row;
  double *va = (double *)fal_newbuffer(L, cap, sizeof *va, "allclose");
  double *vb = (double *)fal_newbuffer(L, cap, sizeof *vb, "allclose");
  int ok = 1;
  for (int64_t r0 = 0; ok && r0 < rows; r0 += step) {
    int64_t len = rows - r0 < step ? rows - r0 : step;
    fal_box_release(L, cai);
    fal_box_release(L, cbi);
    FAL_CALL(L, ctx, fa_tensor_narrow(ctx, a, 0, r0, len, ca));
    FAL_CALL(L, ctx, fa_tensor_narrow(ctx, b, 0, r0, len, cb));
    FAL_CALL(L, ctx, fa_tensor_read_f64(ctx, *ca, va));
    FAL_CALL(L, ctx, fa_tensor_read_f64(ctx, *cb, vb));
    for (int64_t i = 0; ok && i < len * per_row; i++) ok = close_enough(va[i], vb[i], rtol, atol);
  }
  fal_box_release(L, cai);
  fal_box_release(L, cbi);
  lua_pushboolean(L, ok);
  return 1;
}

const luaL_Reg fal_tensor_op_methods[] = {{"add", t_add}, {"sub", t_sub},   {"mul", t_mul},   {"div", t_div},
                                          {"sum", t_sum}, {"max", t_max},   {"min", t_min},   {"norm", t_norm},
                                          {"isfinite", t_isfinite},         {NULL, NULL}};

const luaL_Reg fal_tensor_op_meta[] = {{"__add", m_add}, {"__sub", m_sub}, {"__mul", m_mul},
                                       {"__div", m_div}, {"__unm", m_unm}, {NULL, NULL}};

/* The operators tensors do not define: a flashattn: error naming the
 * operator (Lua's own was "attempt to perform arithmetic on a userdata
 * value"), upvalue 1 its symbol. */
static int m_unsupported(lua_State *L) {
  return fal_error(L, "tensor: the operator %s is not defined on tensors (they take + - * / and unary -; compare "
                      "them with fa.allclose or fa.max_abs_diff, read elements with get or totable)",
                   lua_tostring(L, lua_upvalueindex(1)));
}

void fal_tensor_unsupported_ops(lua_State *L) {
  static const char *const ops[][2] = {{"__mod", "%"},  {"__pow", "^"},       {"__idiv", "//"}, {"__band", "&"},
                                       {"__bor", "|"},  {"__bxor", "~"},      {"__shl", "<<"},  {"__shr", ">>"},
                                       {"__bnot", "~"}, {"__concat", ".."},   {"__lt", "<"},    {"__le", "<="}};
  for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
    lua_pushstring(L, ops[i][1]);
    lua_pushcclosure(L, m_unsupported, 1);
    lua_setfield(L, -2, ops[i][0]);
  }
}

const luaL_Reg fal_compare_funcs[] = {{"max_abs_diff", l_max_abs_diff}, {"rel_error", l_rel_error},
                                      {"allclose", l_allclose},         {NULL, NULL}};
