/* fa.attention_backward(q, k, v, o, lse, dout, opts) -> dq, dk, dv and
 * fa.attention_backward_reference (API §10).  The opts are fa.attention's,
 * read by the forward's own reader, plus `deterministic` (a boolean,
 * fa_attention_opts.deterministic). */
#include "lbinding.h"

/* Pushes a copy of the opts table at idx without `deterministic`, for the
 * forward's reader, which rejects keys it does not know; *det gets the
 * key's value. */
static void opts_without_deterministic(lua_State *L, int idx, int *det) {
  fal_opt_bool(L, idx, "deterministic", det);
  fal_opts_without(L, idx, "deterministic");
}

static int backward(lua_State *L, int reference, const char *fname) {
  fa_context *ctx = fal_ctx(L);
  fa_attention_opts o;
  int det = 0;
  lua_settop(L, 7);
  fa_tensor **dq = fal_newbox(L), **dk = fal_newbox(L), **dv = fal_newbox(L); /* 8, 9, 10 */
  fal_pins *pins = fal_pins_open_n(L, 12); /* 11: the six tensors and the opts' */
  fa_tensor *q = fal_pin(L, pins, 1, "q"), *k = fal_pin(L, pins, 2, "k"), *v = fal_pin(L, pins, 3, "v");
  fa_tensor *out = fal_pin(L, pins, 4, "o"), *lse = fal_pin(L, pins, 5, "lse"), *dout = fal_pin(L, pins, 6, "dout");
  int opts = 7;
  if (lua_istable(L, 7)) {
    opts_without_deterministic(L, 7, &det); /* 12 */
    opts = 12;
  }
  read_attn_opts(L, opts, fname, &o, pins); /* may push the kv_lens and alibi arrays */
  o.deterministic = det;
  if (reference) FAL_CALL(L, ctx, fa_attention_backward_reference(ctx, q, k, v, out, lse, dout, &o, dq, dk, dv));
  else FAL_CALL(L, ctx, fa_attention_backward(ctx, q, k, v, out, lse, dout, &o, dq, dk, dv));
  fal_pins_close(L, 11);
  lua_settop(L, 10);
  return 3;
}

static int l_attention_backward(lua_State *L) { return backward(L, 0, "fa.attention_backward"); }
static int l_attention_backward_reference(lua_State *L) {
  return backward(L, 1, "fa.attention_backward_reference");
}

const luaL_Reg fal_backward_funcs[] = {{"attention_backward", l_attention_backward},
                                       {"attention_backward_reference", l_attention_backward_reference},
                                       {NULL, NULL}};
