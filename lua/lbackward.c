/* fa.attention_backward(q, k, v, o, lse, dout, opts) -> dq, dk, dv and
 * fa.attention_backward_reference (API §10).  The opts are fa.attention's,
 * read by the forward's own reader, `deterministic` (a boolean,
 * fa_attention_opts.deterministic) among them. */
#include "lbinding.h"

static int backward(lua_State *L, int reference, const char *fname) {
  fa_context *ctx = fal_ctx(L);
  fa_attention_opts o;
  lua_settop(L, 7);
  fa_tensor **dq = fal_newbox(L), **dk = fal_newbox(L), **dv = fal_newbox(L); /* 8, 9, 10 */
  fal_pins *pins = fal_pins_open_n(L, 12); /* 11: the six tensors and the opts' */
  fa_tensor *q = fal_pin(L, pins, 1, "q"), *k = fal_pin(L, pins, 2, "k"), *v = fal_pin(L, pins, 3, "v");
  fa_tensor *out = fal_pin(L, pins, 4, "o"), *lse = fal_pin(L, pins, 5, "lse"), *dout = fal_pin(L, pins, 6, "dout");
  read_attn_opts(L, 7, fname, &o, pins); /* may push the kv_lens and alibi arrays */
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
