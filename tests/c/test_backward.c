/* fa_attention_backward through the C API (include/flashattn.h, API §10):
 * the gradients against fa_attention_backward_reference, opts.deterministic
 * giving the same bits twice, NaN in the k and v of keys past kv_lens
 * reaching no gradient, and a host's misuses (NULL result pointers, a
 * dout of the wrong shape) as "flashattn:" errors that leave the results
 * NULL and the engine's memory as it was.  FLASHATTN_DEVICE picks the
 * device (f32: the SIMT kernels on cuda). */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

static fa_device dev = FA_CPU;

enum { B = 2, HQ = 4, HKV = 2, LQ = 33, LK = 47, D = 16 };

static fa_tensor *randn(fa_context *ctx, int64_t h, int64_t l, uint64_t seed) {
  const int64_t shape[4] = {B, h, l, D};
  return tu_randn(ctx, 4, shape, FA_F32, dev, seed);
}

/* The values of t (any device) as doubles, malloc'd; NULL on failure. */
static double *values(fa_context *ctx, fa_tensor *t) {
  const int64_t n = fa_tensor_numel(t);
  double *x = malloc(sizeof(double) * (size_t)(n ? n : 1));
  if (x && fa_tensor_read_f64(ctx, t, x)) {
    free(x);
    return NULL;
  }
  return x;
}

/* max |a - ref| / max(max |ref|, 1); INFINITY when a is not finite where
 * ref is, or the sizes differ. */
static double rel_err(fa_context *ctx, fa_tensor *a, fa_tensor *ref) {
  const int64_t n = fa_tensor_numel(ref);
  if (!a || fa_tensor_numel(a) != n) return INFINITY;
  double *x = values(ctx, a), *y = values(ctx, ref), worst = x && y ? 0 : INFINITY, scale = 1;
  for (int64_t i = 0; i < n && worst < INFINITY; i++) {
    if (!isfinite(y[i])) continue;
    if (!isfinite(x[i])) worst = INFINITY;
    else if (fabs(x[i] - y[i]) > worst) worst = fabs(x[i] - y[i]);
    if (fabs(y[i]) > scale) scale = fabs(y[i]);
  }
  free(x);
  free(y);
  return worst / scale;
}

static int same_bits(fa_context *ctx, fa_tensor *a, fa_tensor *b) {
  const int64_t n = fa_tensor_numel(a);
  if (!a || !b || fa_tensor_numel(b) != n) return 0;
  double *x = values(ctx, a), *y = values(ctx, b);
  int same = x && y && memcmp(x, y, sizeof(double) * (size_t)n) == 0;
  free(x);
  free(y);
  return same;
}

static void release3(fa_tensor **g) {
  for (int i = 0; i < 3; i++) fa_tensor_release(g[i]), g[i] = NULL;
}

/* The gradients of one call against the reference's, and twice the same
 * bits with deterministic. */
static void test_against_reference(fa_context *ctx, const fa_attention_opts *base, const char *what) {
  tu_test = what;
  fa_tensor *q = randn(ctx, HQ, LQ, 1), *k = randn(ctx, HKV, LK, 2), *v = randn(ctx, HKV, LK, 3);
  fa_tensor *dout = randn(ctx, HQ, LQ, 4), *o = NULL, *lse = NULL, *g[3] = {0}, *g2[3] = {0}, *r[3] = {0};
  fa_attention_opts opts = *base;
  opts.return_lse = 1;
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &opts, &o, &lse));
  opts.return_lse = 0;
  opts.deterministic = 1;
  CHECK_OK(ctx, fa_attention_backward(ctx, q, k, v, o, lse, dout, &opts, &g[0], &g[1], &g[2]));
  CHECK_OK(ctx, fa_attention_backward(ctx, q, k, v, o, lse, dout, &opts, &g2[0], &g2[1], &g2[2]));
  CHECK_OK(ctx, fa_attention_backward_reference(ctx, q, k, v, o, lse, dout, &opts, &r[0], &r[1], &r[2]));
  for (int i = 0; i < 3; i++) {
    const double e = rel_err(ctx, g[i], r[i]);
    CHECK(e < 1e-4, "gradient %d off the reference by %g", i, e);
    CHECK(same_bits(ctx, g[i], g2[i]), "gradient %d differs between two deterministic runs", i);
  }
  release3(g), release3(g2), release3(r);
  fa_tensor_release(o), fa_tensor_release(lse);
  fa_tensor_release(q), fa_tensor_release(k), fa_tensor_release(v), fa_tensor_release(dout);
}

/* NaN in k and v at keys past kv_lens: no row attends them, so every
 * gradient the reference gives finite is finite and right. */
static void test_nan_past_kv_lens(fa_context *ctx) {
  tu_test = "nan past kv_lens";
  fa_tensor *q = randn(ctx, HQ, LQ, 5), *k = randn(ctx, HKV, LK, 6), *v = randn(ctx, HKV, LK, 7);
  fa_tensor *dout = randn(ctx, HQ, LQ, 8), *o = NULL, *lse = NULL, *g[3] = {0}, *r[3] = {0};
  const int64_t at_k[4] = {1, 1, 40, 3}, at_v[4] = {0, 0, 45, 0};
  CHECK_OK(ctx, fa_tensor_set(ctx, k, at_k, NAN));
  CHECK_OK(ctx, fa_tensor_set(ctx, v, at_v, INFINITY));
  const int64_t lens[B] = {30, 30}; /* keys 40 and 45 of both batches past them */
  fa_attention_opts opts;
  fa_attention_opts_init(&opts);
  opts.kv_lens = lens, opts.n_kv_lens = B;
  opts.return_lse = 1;
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &opts, &o, &lse));
  opts.return_lse = 0;
  CHECK_OK(ctx, fa_attention_backward(ctx, q, k, v, o, lse, dout, &opts, &g[0], &g[1], &g[2]));
  CHECK_OK(ctx, fa_attention_backward_reference(ctx, q, k, v, o, lse, dout, &opts, &r[0], &r[1], &r[2]));
  for (int i = 0; i < 3; i++) {
    const double e = rel_err(ctx, g[i], r[i]);
    CHECK(e < 1e-4, "gradient %d off the reference by %g (NaN where it is finite?)", i, e);
  }
  release3(g), release3(r);
  fa_tensor_release(o), fa_tensor_release(lse);
  fa_tensor_release(q), fa_tensor_release(k), fa_tensor_release(v), fa_tensor_release(dout);
}

/* Misuse: NULL result pointers, a dout of the wrong shape. */
static void test_misuse(fa_context *ctx) {
  tu_test = "misuse";
  fa_tensor *q = randn(ctx, HQ, LQ, 9), *k = randn(ctx, HKV, LK, 10), *v = randn(ctx, HKV, LK, 11);
  fa_tensor *dout = randn(ctx, HQ, LQ, 12), *bad = randn(ctx, HQ, LQ + 1, 13), *o = NULL, *lse = NULL;
  fa_tensor *g[3] = {0};
  fa_attention_opts opts;
  fa_attention_opts_init(&opts);
  CHECK(opts.deterministic == 0, "fa_attention_opts_init leaves deterministic at %d", opts.deterministic);
  opts.return_lse = 1;
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &opts, &o, &lse));
  opts.return_lse = 0;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention_backward(ctx, q, k, v, o, lse, dout, &opts, NULL, &g[1], &g[2]));
  CHECK(!g[1] && !g[2], "a failed call left results");
  CHECK(fa_attention_backward(ctx, q, k, v, o, lse, bad, &opts, &g[0], &g[1], &g[2]) != FA_OK,
        "a dout of the wrong shape was taken");
  CHECK(!g[0] && !g[1] && !g[2], "a failed call left results");
  CHECK(strncmp(fa_context_error(ctx), "flashattn:", 10) == 0, "message %s", fa_context_error(ctx));
  fa_tensor_release(o), fa_tensor_release(lse), fa_tensor_release(bad);
  fa_tensor_release(q), fa_tensor_release(k), fa_tensor_release(v), fa_tensor_release(dout);
}

int main(void) {
  const char *d = getenv("FLASHATTN_DEVICE");
  if (d && fa_device_parse(d, &dev)) dev = FA_CPU;
  fa_context *ctx = NULL;
  if (fa_context_create(dev, &ctx) != FA_OK) {
    printf("test_backward: device %s not available, skipped\n", fa_device_name(dev));
    return 0;
  }
  const size_t before = tu_mem_now();
  fa_attention_opts opts;
  fa_attention_opts_init(&opts);
  test_against_reference(ctx, &opts, "plain");
  opts.causal = FA_CAUSAL_BOTTOM_RIGHT;
  test_against_reference(ctx, &opts, "causal");
  opts.causal = FA_CAUSAL_NONE, opts.has_window = 1, opts.window_left = 5, opts.window_right = 2, opts.softcap = 4;
  test_against_reference(ctx, &opts, "window and softcap");
  test_nan_past_kv_lens(ctx);
  test_misuse(ctx);
  CHECK(tu_mem_now() == before, "engine memory %zu, expected %zu (a leak)", tu_mem_now(), before);
  fa_context_destroy(ctx);
  return tu_summary("test_backward");
}
