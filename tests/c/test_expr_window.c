/* A mask_mod that is the built-in key range (src/expr_window.c): which
 * expressions become the window / causal options, with which bounds, and
 * which stay expressions; then fa_attention on them equals the reference
 * (which evaluates mask_mod literally) and the built-in option exactly. */
#include "testutil.h"

#include "../../src/expr.h"

#include <math.h>

static fa_expr_node node(int op, int is_bool, int a0, int a1, double c) {
  fa_expr_node x;
  fa_expr_node_set(&x, op, is_bool, a0, a1, 0, c);
  return x;
}
#define Q node(FA_X_Q, 0, 0, 0, 0)
#define K node(FA_X_K, 0, 0, 0, 0)
#define C(v) node(FA_X_CONST, 0, 0, 0, v)

static fa_expr *make(fa_context *ctx, const fa_expr_node *n, int count) {
  fa_expr *e = NULL;
  CHECK_OK(ctx, fa_expr_new(ctx, n, count, NULL, NULL, 0, &e));
  return e;
}

/* converts: whether it should; then the window and causal it should give */
static void expect(fa_context *ctx, const char *name, const fa_expr_node *n, int count, int64_t Lq, int64_t Lk,
                   const fa_attention_opts *in, int converts, int has_window, int64_t left, int64_t right,
                   fa_causal causal) {
  tu_test = name;
  fa_expr *e = make(ctx, n, count);
  fa_attention_opts out;
  memset(&out, 0xab, sizeof out);
  const int got = e && fa_expr_mask_as_range(e, Lq, Lk, in, &out);
  CHECK(got == converts, "converted %d, expected %d", got, converts);
  if (got && converts) {
    CHECK(out.mask_mod == NULL, "no mask_mod left");
    CHECK(out.has_window == has_window, "has_window %d", out.has_window);
    if (has_window) CHECK(out.window_left == left && out.window_right == right, "window {%lld, %lld}",
                          (long long)out.window_left, (long long)out.window_right);
    CHECK(out.causal == causal, "causal %d", (int)out.causal);
    CHECK(out.softcap == in->softcap && out.tile_q == in->tile_q, "the other options kept");
  }
  fa_expr_free(e);
}

int main(void) {
  fa_context *ctx = NULL;
  if (fa_context_create(FA_CPU, &ctx)) return 1;
  const size_t base = tu_mem_now();
  fa_attention_opts o;
  fa_attention_opts_init(&o);

  /* q >= k & q - k <= 5 */
  const fa_expr_node sliding[7] = {Q, K, node(FA_X_GE, 1, 0, 1, 0), node(FA_X_SUB, 0, 0, 1, 0), C(5),
                                   node(FA_X_LE, 1, 3, 4, 0), node(FA_X_AND, 1, 2, 5, 0)};
  expect(ctx, "sliding, Lq = Lk", sliding, 7, 40, 40, &o, 1, 1, 5, 0, FA_CAUSAL_NONE);
  /* Lk - Lq = 20: the band is relative to q, the options' window to the bottom-right diagonal */
  expect(ctx, "sliding, Lq < Lk: top-left causal", sliding, 7, 30, 50, &o, 1, 1, 25, -1, FA_CAUSAL_TOP_LEFT);
  /* Lq - Lk = 20: keys i - 5..i lie past the bottom-right diagonal i - 20, which no window says */
  expect(ctx, "sliding, Lq > Lk", sliding, 7, 50, 30, &o, 0, 0, 0, 0, FA_CAUSAL_NONE);
  const fa_expr_node up5[5] = {Q, K, node(FA_X_SUB, 0, 0, 1, 0), C(5), node(FA_X_LE, 1, 2, 3, 0)};
  expect(ctx, "q - k <= 5 with Lq - Lk = 20", up5, 5, 50, 30, &o, 0, 0, 0, 0, FA_CAUSAL_NONE);
  expect(ctx, "q - k <= 5", up5, 5, 40, 40, &o, 1, 1, 5, -1, FA_CAUSAL_NONE);

  /* q >= k, k >= q, q == k; 2q - 2k <= 7 (scaled, a fraction: d <= 3) */
  const fa_expr_node causal[3] = {Q, K, node(FA_X_GE, 1, 0, 1, 0)};
  expect(ctx, "causal", causal, 3, 40, 40, &o, 1, 1, -1, 0, FA_CAUSAL_NONE);
  expect(ctx, "causal, Lq < Lk", causal, 3, 30, 50, &o, 1, 0, 0, 0, FA_CAUSAL_TOP_LEFT);
  const fa_expr_node anti[3] = {K, Q, node(FA_X_GE, 1, 0, 1, 0)};
  expect(ctx, "k >= q", anti, 3, 40, 40, &o, 1, 1, 0, -1, FA_CAUSAL_NONE);
  const fa_expr_node diag[3] = {Q, K, node(FA_X_EQ, 1, 0, 1, 0)};
  expect(ctx, "q == k", diag, 3, 40, 40, &o, 1, 1, 0, 0, FA_CAUSAL_NONE);
  const fa_expr_node scaled[8] = {Q, C(2), node(FA_X_MUL, 0, 0, 1, 0), K, node(FA_X_MUL, 0, 3, 1, 0),
                                  node(FA_X_SUB, 0, 2, 4, 0), C(7), node(FA_X_LE, 1, 5, 6, 0)};
  expect(ctx, "2q - 2k <= 7", scaled, 8, 40, 40, &o, 1, 1, 3, -1, FA_CAUSAL_NONE);

  /* |q - k| <= 4, and 3 > |k - q + 1| (-2 < q - k + ... : -4 < k - q < 2) */
  const fa_expr_node sym[6] = {Q, K, node(FA_X_SUB, 0, 0, 1, 0), node(FA_X_ABS, 0, 2, 0, 0), C(4),
                               node(FA_X_LE, 1, 3, 4, 0)};
  expect(ctx, "|q - k| <= 4", sym, 6, 40, 40, &o, 1, 1, 4, 4, FA_CAUSAL_NONE);
  const fa_expr_node sym2[8] = {K, Q, node(FA_X_SUB, 0, 0, 1, 0), C(1), node(FA_X_ADD, 0, 2, 3, 0),
                                node(FA_X_ABS, 0, 4, 0, 0), C(3), node(FA_X_GT, 1, 6, 5, 0)};
  /* |k - q + 1| < 3: -3 < k - q + 1 < 3, i.e. -4 < k - q < 2: keys i - 3 .. i + 1 */
  expect(ctx, "3 > |k - q + 1|", sym2, 8, 40, 40, &o, 1, 1, 3, 1, FA_CAUSAL_NONE);

  /* with the call's own window and causal: the tighter bound of each side */
  fa_attention_opts w = o;
  w.has_window = 1, w.window_left = 3, w.window_right = 2, w.softcap = 30;
  expect(ctx, "sliding and window {3, 2}", sliding, 7, 40, 40, &w, 1, 1, 3, 0, FA_CAUSAL_NONE);
  fa_attention_opts c = o;
  c.causal = FA_CAUSAL_BOTTOM_RIGHT;
  expect(ctx, "sliding and causal", sliding, 7, 40, 40, &c, 1, 1, 5, 0, FA_CAUSAL_BOTTOM_RIGHT);

  /* what stays an expression: k <= 10 (a bound on k alone), q - k >= 1 (above what the options say),
   * an OR, a NOT, a constant false, a read of a captured tensor */
  const fa_expr_node kb[3] = {K, C(10), node(FA_X_LE, 1, 0, 1, 0)};
  expect(ctx, "k <= 10", kb, 3, 40, 40, &o, 0, 0, 0, 0, FA_CAUSAL_NONE);
  const fa_expr_node strict[5] = {Q, K, node(FA_X_SUB, 0, 0, 1, 0), C(1), node(FA_X_GE, 1, 2, 3, 0)};
  expect(ctx, "q - k >= 1", strict, 5, 40, 40, &o, 0, 0, 0, 0, FA_CAUSAL_NONE);
  const fa_expr_node either[6] = {Q, K, node(FA_X_GE, 1, 0, 1, 0), C(10), node(FA_X_LE, 1, 1, 3, 0),
                                  node(FA_X_OR, 1, 2, 4, 0)};
  expect(ctx, "prefix_lm (an or)", either, 6, 40, 40, &o, 0, 0, 0, 0, FA_CAUSAL_NONE);
  const fa_expr_node neg[4] = {Q, K, node(FA_X_LT, 1, 0, 1, 0), node(FA_X_NOT, 1, 2, 0, 0)};
  expect(ctx, "not (q < k)", neg, 4, 40, 40, &o, 0, 0, 0, 0, FA_CAUSAL_NONE);
  /* fractions and huge coefficients: the f64 evaluation rounds or overflows where algebra would not */
  const fa_expr_node half[5] = {Q, K, node(FA_X_SUB, 0, 0, 1, 0), C(2.5), node(FA_X_LE, 1, 2, 3, 0)};
  expect(ctx, "q - k <= 2.5", half, 5, 40, 40, &o, 0, 0, 0, 0, FA_CAUSAL_NONE);
  const fa_expr_node huge[8] = {Q, C(1e307), node(FA_X_MUL, 0, 0, 1, 0), K, node(FA_X_MUL, 0, 3, 1, 0),
                                node(FA_X_SUB, 0, 2, 4, 0), C(0), node(FA_X_LE, 1, 5, 6, 0)};
  expect(ctx, "1e307 q - 1e307 k <= 0", huge, 8, 40, 40, &o, 0, 0, 0, 0, FA_CAUSAL_NONE);
  fa_expr_node big = huge[1];
  big.c = 1024; /* the same with a coefficient it takes */
  fa_expr_node fine[8];
  memcpy(fine, huge, sizeof fine);
  fine[1] = big;
  expect(ctx, "1024 q - 1024 k <= 0", fine, 8, 40, 40, &o, 1, 1, 0, -1, FA_CAUSAL_NONE);
  const fa_expr_node never[1] = {node(FA_X_CONST, 1, 0, 0, 0)};
  expect(ctx, "false", never, 1, 40, 40, &o, 0, 0, 0, 0, FA_CAUSAL_NONE);
  const fa_expr_node always[1] = {node(FA_X_CONST, 1, 0, 0, 1)};
  expect(ctx, "true", always, 1, 40, 40, &o, 1, 0, 0, 0, FA_CAUSAL_NONE);
  tu_test = "a node reused over and over";
  {
    /* x0 = q, x(i) = x(i-1) + x(i-1) for 60 levels: walked as a tree, 2^60 visits */
    fa_expr_node deep[66];
    int m = 0;
    deep[m++] = Q;
    for (int i = 0; i < 60; i++, m++) deep[m] = node(FA_X_ADD, 0, m - 1, m - 1, 0);
    deep[m++] = K;
    deep[m] = node(FA_X_SUB, 0, m - 2, m - 1, 0), m++;
    deep[m++] = C(0);
    deep[m] = node(FA_X_LE, 1, m - 2, m - 1, 0), m++;
    fa_expr *e = make(ctx, deep, m);
    fa_attention_opts out;
    CHECK(e && !fa_expr_mask_as_range(e, 40, 40, &o, &out), "given up, at once");
    fa_expr_free(e);
  }
  tu_test = "a block mask";
  {
    fa_expr *e = make(ctx, sliding, 7);
    fa_block_mask *bm = NULL;
    CHECK_OK(ctx, fa_block_mask_new(ctx, e, 1, 1, 40, 40, 8, 8, &bm));
    fa_attention_opts with = o, out;
    with.mask_mod = e, with.block_mask = bm;
    CHECK(!fa_expr_mask_as_range(e, 40, 40, &with, &out), "a call with a block mask believes it");
    fa_block_mask_free(bm);
    fa_expr_free(e);
  }
  tu_test = "a captured tensor";
  {
    double ids[40];
    for (int i = 0; i < 40; i++) ids[i] = i / 10;
    int64_t n40 = 40;
    fa_tensor *doc = NULL;
    CHECK_OK(ctx, fa_tensor_wrap(ctx, ids, FA_CPU, FA_F64, 1, &n40, NULL, NULL, NULL, &doc));
    fa_expr_node d[6] = {Q, K, node(FA_X_GE, 1, 0, 1, 0), node(FA_X_LOAD, 0, 0, 0, 0), node(FA_X_LOAD, 0, 1, 0, 0),
                         node(FA_X_AND, 1, 2, 2, 0)};
    d[3].ndim = d[4].ndim = 1;
    fa_expr *e = NULL;
    CHECK_OK(ctx, fa_expr_new(ctx, d, 6, &doc, NULL, 1, &e));
    fa_attention_opts out;
    CHECK(e && !fa_expr_mask_as_range(e, 40, 40, &o, &out), "an expression with a tensor stays one");
    fa_expr_free(e);
    fa_tensor_release(doc);
  }

  /* fa_attention: the reference (literal mask_mod) and the built-in window agree with the converted call */
  tu_test = "attention";
  {
    const int64_t shape[4] = {2, 3, 40, 16};
    fa_tensor *q = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 1), *k = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 2),
              *v = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 3);
    fa_expr *e = make(ctx, sliding, 7);
    fa_attention_opts a = o, b = o;
    a.mask_mod = e;
    b.has_window = 1, b.window_left = 5, b.window_right = 0;
    fa_tensor *oa = NULL, *ob = NULL, *orf = NULL;
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &a, &oa, NULL));
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &b, &ob, NULL));
    CHECK_OK(ctx, fa_attention_reference(ctx, q, k, v, &a, &orf, NULL));
    double d_built = 1, d_ref = 1;
    CHECK_OK(ctx, fa_max_abs_diff(ctx, oa, ob, &d_built));
    CHECK_OK(ctx, fa_max_abs_diff(ctx, oa, orf, &d_ref));
    CHECK(d_built == 0, "the built-in window's result exactly: %g", d_built);
    CHECK(d_ref < 1e-5, "the reference's: %g", d_ref);
    /* the backward: the same gradients as the built-in window's, exactly, and the reference's */
    fa_tensor *lse = NULL, *dout = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 4), *g[3][3] = {{NULL}};
    fa_tensor_release(oa), oa = NULL;
    a.return_lse = 1;
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &a, &oa, &lse));
    CHECK_OK(ctx, fa_attention_backward(ctx, q, k, v, oa, lse, dout, &a, &g[0][0], &g[0][1], &g[0][2]));
    CHECK_OK(ctx, fa_attention_backward(ctx, q, k, v, oa, lse, dout, &b, &g[1][0], &g[1][1], &g[1][2]));
    CHECK_OK(ctx, fa_attention_backward_reference(ctx, q, k, v, oa, lse, dout, &a, &g[2][0], &g[2][1], &g[2][2]));
    for (int i = 0; i < 3; i++) {
      double d0 = 1, d1 = 1;
      CHECK_OK(ctx, fa_max_abs_diff(ctx, g[0][i], g[1][i], &d0));
      CHECK_OK(ctx, fa_max_abs_diff(ctx, g[0][i], g[2][i], &d1));
      CHECK(d0 == 0 && d1 < 1e-4, "gradient %d: %g from the built-in window's, %g from the reference's", i, d0, d1);
    }
    for (int i = 0; i < 9; i++) fa_tensor_release(g[i / 3][i % 3]);
    fa_tensor_release(lse), fa_tensor_release(dout);
    fa_tensor_release(oa), fa_tensor_release(ob), fa_tensor_release(orf);
    fa_tensor_release(q), fa_tensor_release(k), fa_tensor_release(v);
    fa_expr_free(e);
  }

  tu_test = "leaks";
  CHECK(tu_mem_now() == base, "host bytes %zu, were %zu", tu_mem_now(), base);
  fa_context_destroy(ctx);
  return tu_summary("test_expr_window");
}
