/* A score_mod that is the built-in ALiBi rule (src/expr_alibi.c): which
 * expressions become opts.alibi, with which slopes, and which stay
 * expressions; then fa_attention on them equals the built-in option
 * exactly and the reference (which evaluates score_mod literally) within
 * rounding. */
#include "testutil.h"

#include "../../src/expr.h"

#include <math.h>

static fa_expr_node node(int op, int is_bool, int a0, int a1, double c) {
  fa_expr_node x;
  fa_expr_node_set(&x, op, is_bool, a0, a1, 0, c);
  return x;
}

enum { H = 4 };
static double slopes_h[H + 2] = {0.5, 0.25, 0.125, 0.0625, 7, 9};

/* s - c * slopes[IDX] * |q - k| (+ extra, when extra_node) */
static fa_expr *alibi_expr(fa_context *ctx, fa_tensor *slopes, int idx_op, double c, int s_scale, int extra_node) {
  fa_expr_node n[12];
  int m = 0;
  n[m++] = node(FA_X_S, 0, 0, 0, 0);                     /* 0 */
  n[m++] = node(idx_op, 0, 0, 0, 0);                     /* 1 */
  n[m] = node(FA_X_LOAD, 0, 1, 0, 0), n[m++].ndim = 1;   /* 2: slopes[idx] */
  n[m++] = node(FA_X_Q, 0, 0, 0, 0);                     /* 3 */
  n[m++] = node(FA_X_K, 0, 0, 0, 0);                     /* 4 */
  n[m++] = node(FA_X_SUB, 0, 3, 4, 0);                   /* 5 */
  n[m++] = node(FA_X_ABS, 0, 5, 0, 0);                   /* 6 */
  n[m++] = node(FA_X_MUL, 0, 2, 6, 0);                   /* 7 */
  n[m++] = node(FA_X_CONST, 0, 0, 0, c);                 /* 8 */
  n[m++] = node(FA_X_MUL, 0, 8, 7, 0);                   /* 9 */
  if (s_scale == 1) {
    n[m++] = node(FA_X_SUB, 0, 0, 9, 0); /* 10: s - ... */
  } else {
    n[m++] = node(FA_X_ADD, 0, 0, 0, 0); /* 10: s + s */
    n[m++] = node(FA_X_SUB, 0, 10, 9, 0);
  }
  if (extra_node) n[m] = node(FA_X_ADD, 0, m - 1, 8, 0), m++;
  fa_expr *e = NULL;
  CHECK_OK(ctx, fa_expr_new(ctx, n, m, &slopes, NULL, 1, &e));
  return e;
}

static void expect(fa_context *ctx, const char *name, fa_expr *e, int64_t Lq, int64_t Lk, const fa_attention_opts *in,
                   int converts, double c) {
  tu_test = name;
  fa_attention_opts out;
  fa_tensor *s = NULL;
  int got = -1;
  CHECK_OK(ctx, fa_expr_score_as_alibi(ctx, e, H, Lq, Lk, FA_CPU, in, &out, &s, &got));
  CHECK(got == converts, "converted %d, expected %d", got, converts);
  if (got == 1 && converts) {
    CHECK(out.score_mod == NULL && out.n_alibi == H && s != NULL, "opts.alibi of %d slopes", H);
    for (int h = 0; h < H && s; h++)
      CHECK(out.alibi[h] == c * slopes_h[h], "slope %d: %g, expected %g", h, out.alibi[h], c * slopes_h[h]);
  } else {
    CHECK(s == NULL, "no slopes made");
  }
  fa_tensor_release(s);
  fa_expr_free(e);
}

int main(void) {
  fa_context *ctx = NULL;
  if (fa_context_create(FA_CPU, &ctx)) return 1;
  const size_t base = tu_mem_now();
  int64_t n = H, n6 = H + 2, three = 3;
  fa_tensor *slopes = NULL, *longer = NULL, *shorter = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, slopes_h, FA_CPU, FA_F64, 1, &n, NULL, NULL, NULL, &slopes));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, slopes_h, FA_CPU, FA_F64, 1, &n6, NULL, NULL, NULL, &longer));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, slopes_h, FA_CPU, FA_F64, 1, &three, NULL, NULL, NULL, &shorter));
  fa_attention_opts o;
  fa_attention_opts_init(&o);

  expect(ctx, "s - slopes[h] * |q - k|", alibi_expr(ctx, slopes, FA_X_H, 1, 1, 0), 40, 40, &o, 1, 1);
  expect(ctx, "s - 0.5 * slopes[h] * |q - k|", alibi_expr(ctx, slopes, FA_X_H, 0.5, 1, 0), 40, 40, &o, 1, 0.5);
  expect(ctx, "s + 2 * slopes[h] * |q - k|", alibi_expr(ctx, slopes, FA_X_H, -2, 1, 0), 40, 40, &o, 1, -2);
  expect(ctx, "a longer tensor", alibi_expr(ctx, longer, FA_X_H, 1, 1, 0), 40, 40, &o, 1, 1);
  {
    static float f32[H] = {0.5f, 0.25f, 0.125f, 0.0625f};
    fa_tensor *sf = NULL;
    CHECK_OK(ctx, fa_tensor_wrap(ctx, f32, FA_CPU, FA_F32, 1, &n, NULL, NULL, NULL, &sf));
    expect(ctx, "f32 slopes", alibi_expr(ctx, sf, FA_X_H, 1, 1, 0), 40, 40, &o, 1, 1);
    int64_t stride = 2, two = 2;
    fa_tensor *every_other = NULL; /* slopes_h[0], slopes_h[2]: a strided view, converted to a dense copy */
    CHECK_OK(ctx, fa_tensor_wrap(ctx, slopes_h, FA_CPU, FA_F64, 1, &two, &stride, NULL, NULL, &every_other));
    fa_expr *e = alibi_expr(ctx, every_other, FA_X_H, 1, 1, 0);
    fa_attention_opts out;
    fa_tensor *s2 = NULL;
    int got = 0;
    tu_test = "strided slopes";
    CHECK_OK(ctx, fa_expr_score_as_alibi(ctx, e, 2, 40, 40, FA_CPU, &o, &out, &s2, &got));
    CHECK(got && out.alibi[0] == 0.5 && out.alibi[1] == 0.125, "slopes %g %g", got ? out.alibi[0] : 0,
          got ? out.alibi[1] : 0);
    fa_tensor_release(s2);
    fa_expr_free(e);
    fa_tensor_release(every_other);
    fa_tensor_release(sf);
  }
  /* what stays an expression */
  expect(ctx, "Lq != Lk", alibi_expr(ctx, slopes, FA_X_H, 1, 1, 0), 30, 40, &o, 0, 0);
  expect(ctx, "a shorter tensor (its reads fault)", alibi_expr(ctx, shorter, FA_X_H, 1, 1, 0), 40, 40, &o, 0, 0);
  expect(ctx, "slopes[q]", alibi_expr(ctx, slopes, FA_X_Q, 1, 1, 0), 4, 4, &o, 0, 0);
  expect(ctx, "s + s - ...", alibi_expr(ctx, slopes, FA_X_H, 1, 2, 0), 40, 40, &o, 0, 0);
  expect(ctx, "... + c", alibi_expr(ctx, slopes, FA_X_H, 1, 1, 1), 40, 40, &o, 0, 0);
  fa_attention_opts soft = o, both = o;
  soft.softcap = 30;
  expect(ctx, "with softcap", alibi_expr(ctx, slopes, FA_X_H, 1, 1, 0), 40, 40, &soft, 0, 0);
  both.alibi = slopes_h, both.n_alibi = H;
  expect(ctx, "with opts.alibi", alibi_expr(ctx, slopes, FA_X_H, 1, 1, 0), 40, 40, &both, 0, 0);

  tu_test = "a node reused over and over";
  {
    /* s - c60 * slopes[h] * |q - k| with c(i) = c(i-1) * c(i-1): walked as a tree, 2^60 visits */
    fa_expr_node deep[72];
    int m = 0;
    deep[m++] = node(FA_X_CONST, 0, 0, 0, 1);
    for (int i = 0; i < 60; i++, m++) deep[m] = node(FA_X_MUL, 0, m - 1, m - 1, 0);
    const int c = m - 1;
    deep[m++] = node(FA_X_S, 0, 0, 0, 0);
    deep[m++] = node(FA_X_H, 0, 0, 0, 0);
    deep[m] = node(FA_X_LOAD, 0, m - 1, 0, 0), deep[m].ndim = 1, m++;
    deep[m++] = node(FA_X_Q, 0, 0, 0, 0);
    deep[m++] = node(FA_X_K, 0, 0, 0, 0);
    deep[m] = node(FA_X_SUB, 0, m - 2, m - 1, 0), m++;
    deep[m] = node(FA_X_ABS, 0, m - 1, 0, 0), m++;
    deep[m] = node(FA_X_MUL, 0, m - 4, m - 1, 0), m++;
    deep[m] = node(FA_X_MUL, 0, c, m - 1, 0), m++;
    deep[m] = node(FA_X_SUB, 0, c + 1, m - 1, 0), m++;
    fa_expr *e = NULL;
    CHECK_OK(ctx, fa_expr_new(ctx, deep, m, &slopes, NULL, 1, &e));
    fa_attention_opts out;
    fa_tensor *s = NULL;
    int got = -1;
    CHECK_OK(ctx, fa_expr_score_as_alibi(ctx, e, H, 40, 40, FA_CPU, &o, &out, &s, &got));
    CHECK(got == 0 && s == NULL, "given up, at once");
    fa_expr_free(e);
  }

  tu_test = "attention";
  {
    const int64_t shape[4] = {2, H, 40, 16};
    fa_tensor *q = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 1), *k = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 2),
              *v = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 3);
    fa_expr *e = alibi_expr(ctx, slopes, FA_X_H, 1, 1, 0);
    fa_attention_opts a = o, b = o;
    a.score_mod = e, a.return_lse = 1;
    b.alibi = slopes_h, b.n_alibi = H, b.return_lse = 1;
    fa_tensor *oa = NULL, *ob = NULL, *orf = NULL, *la = NULL, *lb = NULL, *lr = NULL;
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &a, &oa, &la));
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &b, &ob, &lb));
    CHECK_OK(ctx, fa_attention_reference(ctx, q, k, v, &a, &orf, &lr));
    double d[4] = {1, 1, 1, 1};
    CHECK_OK(ctx, fa_max_abs_diff(ctx, oa, ob, &d[0]));
    CHECK_OK(ctx, fa_max_abs_diff(ctx, la, lb, &d[1]));
    CHECK_OK(ctx, fa_max_abs_diff(ctx, oa, orf, &d[2]));
    CHECK_OK(ctx, fa_max_abs_diff(ctx, la, lr, &d[3]));
    CHECK(d[0] == 0 && d[1] == 0, "the built-in alibi's result exactly: %g, %g", d[0], d[1]);
    CHECK(d[2] < 1e-5 && d[3] < 1e-5, "the reference's: %g, %g", d[2], d[3]);
    fa_tensor_release(oa), fa_tensor_release(ob), fa_tensor_release(orf);
    fa_tensor_release(la), fa_tensor_release(lb), fa_tensor_release(lr);
    fa_tensor_release(q), fa_tensor_release(k), fa_tensor_release(v);
    fa_expr_free(e);
  }

  fa_tensor_release(slopes), fa_tensor_release(longer), fa_tensor_release(shorter);
  tu_test = "leaks";
  CHECK(tu_mem_now() == base, "host bytes %zu, were %zu", tu_mem_now(), base);
  fa_context_destroy(ctx);
  return tu_summary("test_expr_alibi");
}
