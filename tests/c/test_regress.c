/* Regression tests for engine bugs found by the fuzzers (tests/fuzz/), one
 * function per bug, named after what went wrong.  Each ran out of bounds,
 * overflowed or read uninitialised memory before its fix; under ASan/UBSan
 * and valgrind they now pass clean. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "testutil.h"

static fa_context *ctx;

/* fa_tensor_view multiplied the requested sizes in int64 without a bound:
 * {2^62 + 1, 4} wrapped around to 4 elements and made a view far larger
 * than its storage (get() then read out of bounds). */
static void test_view_size_overflow(void) {
  tu_test = "view_size_overflow";
  fa_tensor *t = NULL, *v = NULL;
  int64_t four = 4;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 1, &four, FA_F32, FA_CPU, &t));
  const int64_t wraps[2] = {((int64_t)1 << 62) + 1, 4};
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_tensor_view(ctx, t, 2, wraps, &v));
  CHECK(v == NULL, "no view");
  const int64_t huge[3] = {(int64_t)1 << 40, (int64_t)1 << 40, 0};
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_tensor_view(ctx, t, 3, huge, &v));
  const int64_t ok[2] = {2, 2};
  CHECK_OK(ctx, fa_tensor_view(ctx, t, 2, ok, &v));
  fa_tensor_release(v);
  fa_tensor_release(t);

  /* an empty tensor whose other sizes multiply past int64 (strides overflowed) */
  const int64_t empty[3] = {0, (int64_t)1 << 40, (int64_t)1 << 40};
  CHECK_STATUS(ctx, FA_ERR_OUT_OF_MEMORY, fa_tensor_empty(ctx, 3, empty, FA_F32, FA_CPU, &t));
  const int64_t empty_ok[3] = {0, (int64_t)1 << 20, (int64_t)1 << 20};
  CHECK_OK(ctx, fa_tensor_empty(ctx, 3, empty_ok, FA_F32, FA_CPU, &t));
  fa_tensor_release(t);
}

/* fa_tensor_wrap summed (size - 1) * stride without a bound (signed overflow). */
static void test_wrap_stride_overflow(void) {
  tu_test = "wrap_stride_overflow";
  float buf[4] = {0};
  fa_tensor *t = NULL;
  const int64_t shape[2] = {3, 2}, strides[2] = {INT64_MAX / 2, 1};
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_wrap(ctx, buf, FA_CPU, FA_F32, 2, shape, strides, NULL, NULL, &t));
  CHECK(t == NULL, "no tensor");
  const int64_t strides_ok[2] = {1, 0}; /* broadcast rows: allowed */
  CHECK_OK(ctx, fa_tensor_wrap(ctx, buf, FA_CPU, FA_F32, 2, shape, strides_ok, NULL, NULL, &t));
  fa_tensor_release(t);
}

/* fa_merge_states counted rows as numel(o1) / Dv: with Dv = 0 no row was
 * merged and the lse came back uninitialised. */
static void test_merge_empty_value_dim(void) {
  tu_test = "merge_empty_value_dim";
  const int64_t os[2] = {3, 0}, ls[1] = {3};
  fa_tensor *o1 = NULL, *o2 = NULL, *l1 = NULL, *l2 = NULL, *o = NULL, *l = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 2, os, FA_F32, FA_CPU, &o1));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 2, os, FA_F32, FA_CPU, &o2));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 1, ls, FA_F64, FA_CPU, &l1));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 1, ls, FA_F64, FA_CPU, &l2));
  const double a[3] = {0.0, -INFINITY, 1.0}, b[3] = {0.0, -INFINITY, -INFINITY};
  CHECK_OK(ctx, fa_tensor_write_f64(ctx, l1, a));
  CHECK_OK(ctx, fa_tensor_write_f64(ctx, l2, b));
  CHECK_OK(ctx, fa_merge_states(ctx, o1, l1, o2, l2, &o, &l));
  double r[3] = {0};
  if (l) CHECK_OK(ctx, fa_tensor_read_f64(ctx, l, r));
  CHECK(fabs(r[0] - log(2.0)) < 1e-12, "lse[1] = %g, expected log 2", r[0]);
  CHECK(r[1] == -INFINITY, "lse[2] = %g, expected -inf", r[1]);
  CHECK(r[2] == 1.0, "lse[3] = %g, expected 1", r[2]);
  fa_tensor_release(o);
  fa_tensor_release(l);
  fa_tensor_release(o1);
  fa_tensor_release(o2);
  fa_tensor_release(l1);
  fa_tensor_release(l2);
}

/* fa_softmax wrote into opts.out while it overlapped x (two narrows of one
 * tensor, a row apart): rows were overwritten before they were read. */
static void test_softmax_out_overlaps_x(void) {
  tu_test = "softmax_out_overlaps_x";
  const int64_t shape[2] = {9, 16};
  fa_tensor *base = NULL, *x = NULL, *out = NULL, *xc = NULL, *want = NULL, *y = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 2, shape, FA_F32, FA_CPU, &base));
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, base, FA_FILL_NORMAL, 4));
  CHECK_OK(ctx, fa_tensor_narrow(ctx, base, 0, 0, 8, &x));
  CHECK_OK(ctx, fa_tensor_narrow(ctx, base, 0, 1, 8, &out));
  CHECK_OK(ctx, fa_tensor_clone(ctx, x, &xc));
  CHECK_OK(ctx, fa_softmax(ctx, xc, NULL, &want));
  fa_softmax_opts o;
  for (int algo = FA_SOFTMAX_AUTO; algo <= FA_SOFTMAX_FUSED; algo++) {
    fa_softmax_opts_init(&o);
    o.algo = (fa_softmax_algo)algo;
    o.out = out;
    CHECK_OK(ctx, fa_tensor_copy(ctx, x, xc)); /* x as it was */
    CHECK_OK(ctx, fa_softmax(ctx, x, &o, &y));
    double err = 1;
    if (y) CHECK_OK(ctx, fa_rel_error(ctx, y, want, &err));
    CHECK(y == out, "the result is opts.out");
    CHECK(err < 1e-6, "algo %d: rel error %g against softmax of a copy", algo, err);
    fa_tensor_release(y);
    y = NULL;
  }
  /* exactly in place stays allowed */
  fa_softmax_opts_init(&o);
  o.out = x;
  CHECK_OK(ctx, fa_tensor_copy(ctx, x, xc));
  CHECK_OK(ctx, fa_softmax(ctx, x, &o, &y));
  double err = 1;
  if (y) CHECK_OK(ctx, fa_rel_error(ctx, y, want, &err));
  CHECK(err < 1e-6, "in place: rel error %g", err);
  fa_tensor_release(y);
  fa_tensor_release(want);
  fa_tensor_release(xc);
  fa_tensor_release(out);
  fa_tensor_release(x);
  fa_tensor_release(base);
}

/* An empty tensor with a size 0 after a size > 1 counted as non-contiguous
 * (its strides count the 0 as 1), so view() refused it and attention with
 * Lq = 0 failed in the engine's own view of its output. */
static void test_empty_is_contiguous(void) {
  tu_test = "empty_is_contiguous";
  const int64_t qs[4] = {1, 4, 0, 4}, ks[4] = {1, 2, 3, 4}, flat1[1] = {0};
  fa_tensor *q = NULL, *k = NULL, *o = NULL, *lse = NULL, *v = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, qs, FA_F32, FA_CPU, &q));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, ks, FA_F32, FA_CPU, &k));
  CHECK_OK(ctx, fa_tensor_fill(ctx, k, 1.0));
  CHECK(fa_tensor_is_contiguous(q), "an empty tensor is contiguous");
  CHECK_OK(ctx, fa_tensor_view(ctx, q, 1, flat1, &v));
  CHECK_OK(ctx, fa_attention(ctx, q, k, k, NULL, &o, &lse));
  CHECK(o && fa_tensor_ndim(o) == 4 && fa_tensor_size(o, 2) == 0, "o is 1x4x0x4");
  CHECK(lse && fa_tensor_ndim(lse) == 3 && fa_tensor_size(lse, 2) == 0, "lse is 1x4x0");
  fa_tensor_release(o);
  fa_tensor_release(lse);
  o = lse = NULL;
  CHECK_OK(ctx, fa_attention_reference(ctx, q, k, k, NULL, &o, NULL));
  fa_tensor_release(o);
  fa_tensor_release(v);
  fa_tensor_release(k);
  fa_tensor_release(q);
}

/* NULL tensors, arrays and result pointers crashed every tensor function
 * (fuzz_capi passes them): each is an argument error now. */
static void test_null_arguments(void) {
  tu_test = "null_arguments";
  const int64_t shape[2] = {2, 3}, idx[2] = {0, 0};
  fa_tensor *t = NULL, *r = NULL;
  double v;
  int ok;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 2, shape, FA_F32, FA_CPU, &t));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_empty(ctx, 2, NULL, FA_F32, FA_CPU, &r));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_empty(ctx, 2, shape, FA_F32, FA_CPU, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_view(ctx, NULL, 2, shape, &r));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_view(ctx, t, 2, NULL, &r));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_view(ctx, t, 2, shape, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_select(ctx, NULL, 0, 0, &r));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_narrow(ctx, NULL, 0, 0, 1, &r));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_transpose(ctx, NULL, 0, 1, &r));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_contiguous(ctx, NULL, &r));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_to(ctx, NULL, FA_F64, FA_CPU, &r));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_clone(ctx, t, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_copy(ctx, t, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_fill(ctx, NULL, 1.0));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_fill_random(ctx, NULL, FA_FILL_NORMAL, 1));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_get(ctx, t, NULL, &v));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_get(ctx, t, idx, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_set(ctx, NULL, idx, 1.0));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_read_f64(ctx, t, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_write_f64(ctx, t, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_reduce(ctx, NULL, FA_REDUCE_SUM, &v));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_isfinite(ctx, t, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_isfinite(ctx, NULL, &ok));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_binary(ctx, NULL, FA_BIN_ADD, NULL, 1.0, &r));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_binary(ctx, t, FA_BIN_ADD, NULL, 1.0, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_rel_error(ctx, t, NULL, &v));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_max_abs_diff(ctx, NULL, t, &v));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_cost_softmax(ctx, t, NULL, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_cost_attention(ctx, t, t, t, NULL, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_device_info(ctx, FA_CPU, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_timer_stop(ctx, NULL));
  CHECK(r == NULL, "no result on failure");
  fa_tensor_release(t);
}

int main(void) {
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) {
    fprintf(stderr, "no CPU context\n");
    return 1;
  }
  test_view_size_overflow();
  test_wrap_stride_overflow();
  test_merge_empty_value_dim();
  test_softmax_out_overlaps_x();
  test_empty_is_contiguous();
  test_null_arguments();
  fa_context_destroy(ctx);
  tu_test = "end";
  CHECK(tu_mem_now() == 0, "engine memory at the end: %zu bytes (leak)", tu_mem_now());
  return tu_summary("test_regress");
}
