/* The kernel registry through the C API (API §6): fa_attention_kernels
 * (names fastest first, cap smaller than the count, NULL arguments, checked
 * arguments) and opts.kernel (the same output as the kernel's algo, the
 * statuses of an unknown name and of a kernel that does not accept the
 * call).  Runs on the CPU (and on CUDA when FLASHATTN_DEVICE=cuda). */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

static fa_device dev = FA_CPU;

static fa_tensor *randn(fa_context *ctx, int64_t l, int64_t d, uint64_t seed) {
  const int64_t shape[3] = {2, l, d};
  return tu_randn(ctx, 3, shape, FA_F32, dev, seed);
}

/* Whether a and b hold the same values. */
static int same(fa_context *ctx, fa_tensor *a, fa_tensor *b) {
  int64_t n = fa_tensor_numel(a);
  double *x = malloc(sizeof(double) * (size_t)n), *y = malloc(sizeof(double) * (size_t)n);
  int eq = n == fa_tensor_numel(b) && !fa_tensor_read_f64(ctx, a, x) && !fa_tensor_read_f64(ctx, b, y) &&
           memcmp(x, y, sizeof(double) * (size_t)n) == 0;
  free(x), free(y);
  return eq;
}

static void test_listing(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v) {
  tu_test = "listing";
  const char *names[16] = {0};
  int n = -1;
  CHECK_OK(ctx, fa_attention_kernels(ctx, q, k, v, NULL, names, 16, &n));
  if (dev == FA_CPU) {
    CHECK(n == 4, "n = %d", n);
    const char *want[4] = {"cpu_flash", "cpu_naive", "cpu_two_pass", "cpu_flash_row"}; /* small: naive ahead */
    for (int i = 0; i < 4 && i < n; i++) CHECK(strcmp(names[i], want[i]) == 0, "names[%d] = %s", i, names[i]);
  } else {
    CHECK(n >= 3, "n = %d", n); /* f32 D = 32: simt, naive, row */
  }
  /* cap below the count: the first names, and *n the count */
  const char *two[2] = {0};
  int m = -1;
  CHECK_OK(ctx, fa_attention_kernels(ctx, q, k, v, NULL, two, 1, &m));
  CHECK(m == n, "m = %d, n = %d", m, n);
  CHECK(two[0] && strcmp(two[0], names[0]) == 0 && two[1] == NULL, "cap 1: %s %s", two[0], two[1]);
  CHECK_OK(ctx, fa_attention_kernels(ctx, q, k, v, NULL, NULL, 0, &m));
  CHECK(m == n, "cap 0: m = %d", m);
  /* one algo */
  fa_attention_opts o;
  fa_attention_opts_init(&o);
  CHECK(o.kernel == NULL, "init leaves kernel NULL");
  o.algo = FA_ATTN_TWO_PASS;
  CHECK_OK(ctx, fa_attention_kernels(ctx, q, k, v, &o, names, 16, &m));
  CHECK(m == 1 && strcmp(names[0], dev == FA_CPU ? "cpu_two_pass" : "simt") == 0, "two_pass: %d %s", m, names[0]);
  /* a name no kernel has is an argument error here too, and lists nothing */
  o.algo = FA_ATTN_AUTO, o.kernel = "no_such_kernel";
  m = -1;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention_kernels(ctx, q, k, v, &o, names, 16, &m));
  CHECK(m == 0, "unknown kernel: m = %d", m);
  o.kernel = NULL;
  /* NULL arguments and a bad cap */
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention_kernels(ctx, q, k, v, NULL, NULL, 4, &m));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention_kernels(ctx, q, k, v, NULL, names, 16, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention_kernels(ctx, q, k, v, NULL, names, -1, &m));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention_kernels(ctx, NULL, k, v, NULL, names, 16, &m));
  CHECK(fa_attention_kernels(NULL, q, k, v, NULL, names, 16, &m) == FA_ERR_ARGUMENT, "NULL ctx");
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention_kernels(ctx, q, NULL, v, NULL, names, 16, &m));
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_attention_kernels(ctx, q, k, q, NULL, names, 16, &m)); /* v's length */
}

static void test_named(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v) {
  tu_test = "named";
  fa_attention_opts o;
  fa_tensor *a = NULL, *b = NULL;
  fa_attention_opts_init(&o);
  o.causal = FA_CAUSAL_BOTTOM_RIGHT;
  o.algo = FA_ATTN_TWO_PASS;
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &o, &a, NULL));
  o.algo = FA_ATTN_AUTO;
  o.kernel = dev == FA_CPU ? "cpu_two_pass" : "simt";
  if (dev == FA_CPU) {
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &o, &b, NULL));
    CHECK(a && b && same(ctx, a, b), "cpu_two_pass differs from algo two_pass");
    fa_tensor_release(b);
  }
  fa_tensor_release(a);
  o.kernel = "no_such_kernel";
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &o, &a, NULL));
  CHECK(strstr(fa_context_error(ctx), "\"no_such_kernel\"") != NULL, "%s", fa_context_error(ctx));
  o.kernel = "wgmma"; /* f32 inputs: never */
  CHECK_STATUS(ctx, FA_ERR_UNSUPPORTED, fa_attention(ctx, q, k, v, &o, &a, NULL));
  CHECK(strstr(fa_context_error(ctx), "the kernels that accept it") != NULL, "%s", fa_context_error(ctx));
  o.kernel = dev == FA_CPU ? "cpu_naive" : "naive";
  o.algo = FA_ATTN_FLASH;
  CHECK_STATUS(ctx, FA_ERR_UNSUPPORTED, fa_attention(ctx, q, k, v, &o, &a, NULL));
  o.kernel = "";
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &o, &a, NULL));
  fa_tensor_release(a);
}

int main(void) {
  const char *env = getenv("FLASHATTN_DEVICE");
  if (env && strcmp(env, "cuda") == 0) dev = FA_CUDA;
  fa_context *ctx = NULL;
  if (fa_context_create(dev, &ctx)) return 1;
  fa_tensor *q = randn(ctx, 20, 32, 1), *k = randn(ctx, 27, 32, 2), *v = randn(ctx, 27, 32, 3);
  CHECK(q && k && v, "inputs");
  if (q && k && v) {
    test_listing(ctx, q, k, v);
    test_named(ctx, q, k, v);
  }
  fa_tensor_release(q), fa_tensor_release(k), fa_tensor_release(v);
  fa_context_destroy(ctx);
  return tu_summary("test_kernels");
}
