/* The C API (include/flashattn.h, docs/c-api.md): contexts, zero-copy wrapping of
 * host buffers with release callbacks, views, every status code with its
 * "flashattn:" message, kernels on wrapped buffers against a plain C
 * reference, tensors handed to and from Lua, and reference counting (the
 * engine holds no memory at the end). */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "flashattn.h"
#include "testutil.h"

static fa_context *ctx;

static size_t mem_now(void) {
  size_t cur, peak;
  fa_memory(FA_CPU, &cur, &peak);
  return cur;
}

/* ---- a release callback that counts ------------------------------------ */
typedef struct {
  int calls;
  void *last;
} release_log;

static void on_release(void *data, void *user) {
  release_log *log = (release_log *)user;
  log->calls++;
  log->last = data;
}

/* ---- deterministic fill -------------------------------------------------- */
static uint64_t rng_state = 0x12345678abcdefULL;
static double urand(void) {
  rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
  return (double)(rng_state >> 11) / 9007199254740992.0;
}
static void fill(float *p, size_t n) {
  for (size_t i = 0; i < n; i++) p[i] = (float)(2.0 * urand() - 1.0);
}

/* ---- plain C reference attention (double), (B,H,L,D) contiguous ------------ */
static void ref_attention(const float *q, const float *k, const float *v, double *o, int B, int Hq, int Hkv, int Lq,
                          int Lk, int D, int Dv, double scale, int causal_br) {
  double *s = malloc(sizeof(double) * (size_t)Lk);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < Hq; h++) {
      int hk = h / (Hq / Hkv);
      for (int i = 0; i < Lq; i++) {
        const float *qi = q + (((size_t)b * Hq + h) * Lq + i) * D;
        double m = -INFINITY;
        for (int j = 0; j < Lk; j++) {
          const float *kj = k + (((size_t)b * Hkv + hk) * Lk + j) * D;
          double dot = 0;
          for (int d = 0; d < D; d++) dot += (double)qi[d] * kj[d];
          s[j] = (causal_br && j > i + Lk - Lq) ? -INFINITY : scale * dot;
          if (s[j] > m) m = s[j];
        }
        double *oi = o + (((size_t)b * Hq + h) * Lq + i) * Dv;
        for (int d = 0; d < Dv; d++) oi[d] = 0;
        if (m == -INFINITY) continue;
        double den = 0;
        for (int j = 0; j < Lk; j++) {
          double p = exp(s[j] - m);
          den += p;
          const float *vj = v + (((size_t)b * Hkv + hk) * Lk + j) * Dv;
          for (int d = 0; d < Dv; d++) oi[d] += p * vj[d];
        }
        for (int d = 0; d < Dv; d++) oi[d] /= den;
      }
    }
  free(s);
}

static double max_diff_f32(const float *a, const double *b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; i++) {
    double d = fabs((double)a[i] - b[i]);
    if (d != d) return INFINITY;
    if (d > m) m = d;
  }
  return m;
}

/* ---- tests ------------------------------------------------------------------ */

static void test_names_and_parsing(void) {
  tu_test = "names";
  CHECK(strcmp(fa_status_name(FA_OK), "") != 0, "status name");
  for (int s = FA_OK; s <= FA_ERR_BACKEND; s++)
    CHECK(fa_status_name((fa_status)s) && *fa_status_name((fa_status)s), "status %d has a name", s);
  fa_dtype d;
  struct { const char *n; fa_dtype d; size_t size; } dt[] = {
      {"f32", FA_F32, 4}, {"float", FA_F32, 4}, {"f16", FA_F16, 2}, {"half", FA_F16, 2}, {"bf16", FA_BF16, 2},
      {"bfloat16", FA_BF16, 2}, {"f64", FA_F64, 8}, {"double", FA_F64, 8}, {"bool", FA_BOOL, 1}};
  for (size_t i = 0; i < sizeof dt / sizeof *dt; i++) {
    CHECK(fa_dtype_parse(dt[i].n, &d) == 0 && d == dt[i].d, "parse %s", dt[i].n);
    CHECK(fa_dtype_size(dt[i].d) == dt[i].size, "size of %s", dt[i].n);
  }
  CHECK(fa_dtype_parse("f8", &d) != 0, "f8 is not a dtype");
  CHECK(strcmp(fa_dtype_name(FA_BF16), "bf16") == 0, "bf16 name");
  CHECK(strcmp(fa_dtype_name(FA_F16), "f16") == 0, "f16 name");
  fa_device dev;
  CHECK(fa_device_parse("cpu", &dev) == 0 && dev == FA_CPU, "parse cpu");
  CHECK(fa_device_parse("cuda", &dev) == 0 && dev == FA_CUDA, "parse cuda");
  CHECK(fa_device_parse("tpu", &dev) != 0, "tpu is not a device");
  CHECK(strcmp(fa_device_name(FA_CPU), "cpu") == 0 && strcmp(fa_device_name(FA_CUDA), "cuda") == 0, "device names");
  CHECK(fa_backend_available(FA_CPU) == 1, "cpu is available");
  /* FLASHATTN_DEVICE overrides the default device */
  const char *env = getenv("FLASHATTN_DEVICE");
  char saved[32] = "";
  if (env) snprintf(saved, sizeof saved, "%s", env);
  setenv("FLASHATTN_DEVICE", "cpu", 1);
  CHECK(fa_default_device() == FA_CPU, "FLASHATTN_DEVICE=cpu");
  unsetenv("FLASHATTN_DEVICE");
  CHECK(fa_default_device() == (fa_backend_available(FA_CUDA) ? FA_CUDA : FA_CPU), "default device without the variable");
  if (env) setenv("FLASHATTN_DEVICE", saved, 1);
  CHECK(strcmp(FA_VERSION, "") != 0, "version");
}

static void test_contexts(void) {
  tu_test = "contexts";
  fa_context *c = NULL;
  CHECK_OK(c, fa_context_create(FA_CPU, &c));
  CHECK(c != NULL, "context");
  if (!c) return;
  CHECK(fa_context_device(c) == FA_CPU, "device");
  CHECK_OK(c, fa_sync(c));
  CHECK(fa_context_stream(c) == NULL, "default stream");
  if (fa_backend_available(FA_CUDA)) {
    fa_context *g = NULL;
    CHECK_OK(g, fa_context_create(FA_CUDA, &g));
    if (g) fa_context_destroy(g);
    CHECK_OK(c, fa_context_set_device(c, FA_CUDA));
    CHECK_OK(c, fa_context_set_device(c, FA_CPU));
  } else {
    fa_context *g = (fa_context *)&g;
    CHECK(fa_context_create(FA_CUDA, &g) == FA_ERR_DEVICE, "cuda context without a GPU");
    CHECK(g == NULL, "*out is NULL on failure");
    CHECK_STATUS(c, FA_ERR_DEVICE, fa_context_set_device(c, FA_CUDA));
    CHECK(fa_context_device(c) == FA_CPU, "a failed set_device leaves the device");
    fa_tensor *t = NULL;
    int64_t shape[1] = {4};
    CHECK_STATUS(c, FA_ERR_DEVICE, fa_tensor_empty(c, 1, shape, FA_F32, FA_CUDA, &t));
    CHECK(t == NULL, "no tensor on failure");
  }
  fa_context_destroy(c);
}

static void test_wrap_zero_copy(void) {
  tu_test = "wrap";
  float buf[6] = {1, 2, 3, 4, 5, 6};
  release_log log = {0, NULL};
  int64_t shape[2] = {2, 3};
  fa_tensor *t = NULL;
  /* wrapping counts only the handles as engine memory, not the buffer */
  size_t before = mem_now();
  CHECK_OK(ctx, fa_tensor_wrap(ctx, buf, FA_CPU, FA_F32, 2, shape, NULL, on_release, &log, &t));
  if (!t) return;
  CHECK(fa_tensor_data(t) == buf, "zero copy: the tensor's data is the host buffer");
  CHECK(fa_tensor_ndim(t) == 2 && fa_tensor_size(t, 0) == 2 && fa_tensor_size(t, 1) == 3, "shape");
  CHECK(fa_tensor_stride(t, 0) == 3 && fa_tensor_stride(t, 1) == 1, "row-major strides");
  CHECK(fa_tensor_numel(t) == 6 && fa_tensor_dtype(t) == FA_F32 && fa_tensor_device(t) == FA_CPU, "meta");
  CHECK(fa_tensor_is_contiguous(t), "contiguous");
  CHECK(mem_now() > before && mem_now() - before < 1024, "the handles are counted, %zu bytes", mem_now() - before);
  /* writes through the tensor land in the buffer, and the other way */
  int64_t idx[2] = {1, 2};
  CHECK_OK(ctx, fa_tensor_set(ctx, t, idx, 42.0));
  CHECK(buf[5] == 42.0f, "a write through the tensor shows in the buffer (%g)", buf[5]);
  buf[0] = -7;
  double val = 0;
  idx[0] = 0;
  idx[1] = 0;
  CHECK_OK(ctx, fa_tensor_get(ctx, t, idx, &val));
  CHECK(val == -7, "a write to the buffer shows in the tensor (%g)", val);
  CHECK_OK(ctx, fa_tensor_fill(ctx, t, 0.5));
  for (int i = 0; i < 6; i++) CHECK(buf[i] == 0.5f, "fill wrote the buffer");
  /* a view keeps the storage: release comes with the last reference */
  fa_tensor *row = NULL;
  CHECK_OK(ctx, fa_tensor_select(ctx, t, 0, 1, &row));
  fa_tensor_retain(t);
  fa_tensor_release(t);
  CHECK(log.calls == 0, "release too early");
  fa_tensor_release(t);
  CHECK(log.calls == 0, "release while a view lives");
  if (row) {
    CHECK_OK(ctx, fa_tensor_fill(ctx, row, 9.0));
    CHECK(buf[3] == 9 && buf[4] == 9 && buf[5] == 9 && buf[0] == 0.5f, "view writes the buffer's row");
    fa_tensor_release(row);
  }
  CHECK(log.calls == 1, "release callback called exactly once (%d)", log.calls);
  CHECK(log.last == buf, "release gets the data pointer");
  CHECK(mem_now() == before, "the handles' memory came back");

  /* no callback: fine too */
  fa_tensor *t2 = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, buf, FA_CPU, FA_F32, 2, shape, NULL, NULL, NULL, &t2));
  if (t2) fa_tensor_release(t2);

  /* strides: a column-major buffer seen as (2,3) */
  float cm[6] = {0, 3, 1, 4, 2, 5}; /* element (i,j) at j*2 + i */
  int64_t strides[2] = {1, 2};
  release_log log2 = {0, NULL};
  fa_tensor *t3 = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, cm, FA_CPU, FA_F32, 2, shape, strides, on_release, &log2, &t3));
  if (t3) {
    CHECK(!fa_tensor_is_contiguous(t3), "strided wrap is not contiguous");
    double vals[6];
    CHECK_OK(ctx, fa_tensor_read_f64(ctx, t3, vals));
    for (int i = 0; i < 6; i++) CHECK(vals[i] == i, "strided read %d = %g", i, vals[i]);
    fa_tensor *c = NULL;
    CHECK_OK(ctx, fa_tensor_contiguous(ctx, t3, &c));
    if (c) {
      CHECK(fa_tensor_is_contiguous(c) && fa_tensor_data(c) != cm, "contiguous copy");
      fa_tensor_release(c);
    }
    fa_tensor_release(t3);
  }
  CHECK(log2.calls == 1, "strided wrap released once");

  /* failures: release is not called */
  release_log log3 = {0, NULL};
  fa_tensor *bad = NULL;
  int64_t bad5[5] = {1, 1, 1, 1, 1}, neg[2] = {2, -3};
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_wrap(ctx, NULL, FA_CPU, FA_F32, 2, shape, NULL, on_release, &log3, &bad));
  CHECK(fa_tensor_wrap(ctx, buf, FA_CPU, FA_F32, 5, bad5, NULL, on_release, &log3, &bad) != FA_OK, "5-D wrap");
  CHECK(strncmp(fa_context_error(ctx), "flashattn:", 10) == 0, "message");
  CHECK(fa_tensor_wrap(ctx, buf, FA_CPU, FA_F32, 0, shape, NULL, on_release, &log3, &bad) != FA_OK, "0-D wrap");
  CHECK(fa_tensor_wrap(ctx, buf, FA_CPU, FA_F32, 2, neg, NULL, on_release, &log3, &bad) != FA_OK, "negative size");
  CHECK(log3.calls == 0, "release called on a failed wrap");
  CHECK(bad == NULL, "no tensor from a failed wrap");
}

static void test_views(void) {
  tu_test = "views";
  float buf[24];
  for (int i = 0; i < 24; i++) buf[i] = (float)i;
  int64_t shape[3] = {2, 3, 4};
  fa_tensor *t = NULL, *v = NULL, *n = NULL, *tr = NULL, *s = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, buf, FA_CPU, FA_F32, 3, shape, NULL, NULL, NULL, &t));
  if (!t) return;
  int64_t vshape[2] = {6, 4};
  CHECK_OK(ctx, fa_tensor_view(ctx, t, 2, vshape, &v));
  CHECK_OK(ctx, fa_tensor_narrow(ctx, t, 2, 1, 2, &n));
  CHECK_OK(ctx, fa_tensor_transpose(ctx, t, 0, 2, &tr));
  CHECK_OK(ctx, fa_tensor_select(ctx, t, 1, 2, &s));
  if (v && n && tr && s) {
    CHECK(fa_tensor_data(v) == buf, "view shares data");
    CHECK(fa_tensor_size(n, 2) == 2 && fa_tensor_data(n) == buf + 1, "narrow offset");
    CHECK(fa_tensor_size(tr, 0) == 4 && fa_tensor_size(tr, 2) == 2 && fa_tensor_stride(tr, 0) == 1, "transpose");
    CHECK(fa_tensor_ndim(s) == 2 && fa_tensor_size(s, 0) == 2 && fa_tensor_size(s, 1) == 4, "select");
    int64_t i3[3] = {3, 1, 1};
    CHECK_OK(ctx, fa_tensor_set(ctx, tr, i3, -5));
    CHECK(buf[1 * 12 + 1 * 4 + 3] == -5, "write through the transpose");
    int64_t i2[2] = {1, 0};
    CHECK_OK(ctx, fa_tensor_set(ctx, s, i2, -6));
    CHECK(buf[12 + 8] == -6, "write through the select");
    CHECK_OK(ctx, fa_tensor_fill(ctx, n, 100));
    CHECK(buf[0] == 0 && buf[1] == 100 && buf[2] == 100 && buf[3] == 3 && buf[23] == 23, "narrow fill");
    /* view of a non-contiguous tensor is refused */
    fa_tensor *bad = NULL;
    int64_t flat[1] = {24};
    CHECK(fa_tensor_view(ctx, tr, 1, flat, &bad) != FA_OK, "view of a transpose");
    CHECK(strncmp(fa_context_error(ctx), "flashattn:", 10) == 0, "message");
    CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_tensor_view(ctx, t, 1, (int64_t[]){25}, &bad));
    /* reshape: a copy there (the base untouched), a view where the strides allow it */
    fa_tensor *rc = NULL, *rv = NULL;
    CHECK_OK(ctx, fa_tensor_reshape(ctx, tr, 1, flat, &rc));
    if (rc) {
      CHECK(fa_tensor_data(rc) != (void *)buf, "reshape of a transpose copies");
      fa_tensor_release(rc);
    }
    CHECK_OK(ctx, fa_tensor_reshape(ctx, n, 2, (int64_t[]){-1, 2}, &rv)); /* the narrow's rows merged */
    if (rv) {
      CHECK(fa_tensor_data(rv) == fa_tensor_data(n) && fa_tensor_stride(rv, 0) == 4,
            "reshape of a narrow into (-1, 2) is a view");
      fa_tensor_release(rv);
    }
    CHECK(fa_tensor_select(ctx, t, 3, 0, &bad) != FA_OK, "select dim 3 of a 3-D tensor");
    CHECK(fa_tensor_select(ctx, t, 0, 2, &bad) != FA_OK, "select index past the end");
    CHECK(fa_tensor_narrow(ctx, t, 2, 3, 2, &bad) != FA_OK, "narrow past the end");
    CHECK(fa_tensor_transpose(ctx, t, 0, 3, &bad) != FA_OK, "transpose dim 3");
    CHECK(bad == NULL, "no tensor from a failed view");
  }
  if (v) fa_tensor_release(v);
  if (n) fa_tensor_release(n);
  if (tr) fa_tensor_release(tr);
  if (s) fa_tensor_release(s);
  fa_tensor_release(t);
}

static void test_tensor_ops(void) {
  tu_test = "tensor ops";
  int64_t shape[2] = {3, 5};
  fa_tensor *a = NULL, *b = NULL, *c = NULL, *h = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 2, shape, FA_F32, FA_CPU, &a));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 2, shape, FA_F32, FA_CPU, &b));
  if (!a || !b) return;
  CHECK(mem_now() >= 2 * 15 * sizeof(float), "engine memory counts tensors");
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, a, FA_FILL_NORMAL, 7));
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, b, FA_FILL_NORMAL, 7));
  double diff = -1;
  CHECK_OK(ctx, fa_max_abs_diff(ctx, a, b, &diff));
  CHECK(diff == 0, "same seed, same values");
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, b, FA_FILL_UNIFORM, 8));
  double mn = 0, mx = 0, sum = 0;
  CHECK_OK(ctx, fa_tensor_reduce(ctx, b, FA_REDUCE_MIN, &mn));
  CHECK_OK(ctx, fa_tensor_reduce(ctx, b, FA_REDUCE_MAX, &mx));
  CHECK(mn >= 0 && mx < 1, "uniform in [0,1)");
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, b, FA_FILL_ARANGE, 0));
  CHECK_OK(ctx, fa_tensor_reduce(ctx, b, FA_REDUCE_SUM, &sum));
  CHECK(sum == 105, "arange sum %g", sum);
  CHECK_OK(ctx, fa_tensor_binary(ctx, b, FA_BIN_MUL, NULL, 2.0, &c));
  if (c) {
    CHECK_OK(ctx, fa_tensor_reduce(ctx, c, FA_REDUCE_SUM, &sum));
    CHECK(sum == 210, "b*2 sum %g", sum);
    fa_tensor_release(c);
    c = NULL;
  }
  CHECK_OK(ctx, fa_tensor_binary(ctx, b, FA_BIN_RSUB, NULL, 100.0, &c)); /* 100 - b */
  if (c) {
    CHECK_OK(ctx, fa_tensor_reduce(ctx, c, FA_REDUCE_SUM, &sum));
    CHECK(sum == 1500 - 105, "100-b sum %g", sum);
    fa_tensor_release(c);
    c = NULL;
  }
  CHECK_OK(ctx, fa_tensor_binary(ctx, b, FA_BIN_RDIV, b, 0, &c)); /* b / b */
  if (c) {
    CHECK_OK(ctx, fa_tensor_reduce(ctx, c, FA_REDUCE_MAX, &sum));
    CHECK(isnan(sum) || sum == 1, "b/b");
    fa_tensor_release(c);
    c = NULL;
  }
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_binary(ctx, b, (fa_binary_op)(FA_BIN_RDIV + 1), NULL, 0, &c));
  CHECK_OK(ctx, fa_tensor_binary(ctx, b, FA_BIN_SUB, b, 0, &c));
  if (c) {
    CHECK_OK(ctx, fa_tensor_reduce(ctx, c, FA_REDUCE_NORM, &sum));
    CHECK(sum == 0, "b-b");
    fa_tensor_release(c);
    c = NULL;
  }
  CHECK_OK(ctx, fa_tensor_to(ctx, a, FA_F16, FA_CPU, &h));
  if (h) {
    CHECK(fa_tensor_dtype(h) == FA_F16, "to f16");
    double rel = 1;
    CHECK_OK(ctx, fa_rel_error(ctx, h, a, &rel));
    CHECK(rel < 1e-3 && rel > 0, "f16 copy rel error %g", rel);
    fa_tensor *same = NULL;
    CHECK_OK(ctx, fa_tensor_to(ctx, h, FA_F16, FA_CPU, &same));
    CHECK(same == h, "to() with nothing to change returns the tensor itself");
    if (same) fa_tensor_release(same);
    CHECK_OK(ctx, fa_tensor_copy(ctx, a, h)); /* f16 -> f32 */
    fa_tensor_release(h);
  }
  int isf = 0;
  CHECK_OK(ctx, fa_tensor_isfinite(ctx, a, &isf));
  CHECK(isf == 1, "finite");
  int64_t idx[2] = {2, 4};
  CHECK_OK(ctx, fa_tensor_set(ctx, a, idx, NAN));
  CHECK_OK(ctx, fa_tensor_isfinite(ctx, a, &isf));
  CHECK(isf == 0, "NaN is not finite");
  /* status paths of tensor functions */
  int64_t other[2] = {5, 3};
  fa_tensor *d = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 2, other, FA_F32, FA_CPU, &d));
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_tensor_copy(ctx, a, d));
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_tensor_binary(ctx, a, FA_BIN_ADD, d, 0, &c));
  CHECK(c == NULL, "no result on failure");
  int64_t oob[2] = {3, 0};
  double g;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_get(ctx, a, oob, &g));
  int64_t bad_shape[2] = {2, -1};
  fa_tensor *e = NULL;
  CHECK(fa_tensor_empty(ctx, 2, bad_shape, FA_F32, FA_CPU, &e) != FA_OK, "negative size");
  CHECK(fa_tensor_empty(ctx, 5, (int64_t[]){1, 1, 1, 1, 1}, FA_F32, FA_CPU, &e) != FA_OK, "5-D");
  CHECK(e == NULL, "no tensor");
  fa_tensor_release(d);
  fa_tensor_release(a);
  fa_tensor_release(b);
}

static void test_status_codes(void) {
  tu_test = "status codes";
  int64_t s4[4] = {1, 2, 8, 16}, s4k[4] = {1, 2, 10, 16}, s4bad[4] = {1, 3, 8, 16}, s4d[4] = {1, 2, 10, 8};
  fa_tensor *q = NULL, *k = NULL, *v = NULL, *qb = NULL, *q3 = NULL, *kd = NULL, *kh = NULL, *o = NULL, *lse = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, s4, FA_F32, FA_CPU, &q));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, s4k, FA_F32, FA_CPU, &k));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, s4k, FA_F32, FA_CPU, &v));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, s4, FA_BOOL, FA_CPU, &qb));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, s4bad, FA_F32, FA_CPU, &q3));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, s4d, FA_F32, FA_CPU, &kd));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, s4k, FA_F16, FA_CPU, &kh));
  if (!q || !k || !v || !qb || !q3 || !kd || !kh) return;
  fa_tensor_fill_random(ctx, q, FA_FILL_NORMAL, 1);
  fa_tensor_fill_random(ctx, k, FA_FILL_NORMAL, 2);
  fa_tensor_fill_random(ctx, v, FA_FILL_NORMAL, 3);
  fa_attention_opts op;
  fa_attention_opts_init(&op);
  size_t m0 = mem_now();

  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_attention(ctx, q, kd, v, &op, &o, &lse));
  CHECK(o == NULL && lse == NULL, "no outputs on failure");
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_attention(ctx, q3, k, v, &op, &o, &lse)); /* Hq % Hkv */
  CHECK_STATUS(ctx, FA_ERR_DTYPE, fa_attention(ctx, qb, k, v, &op, &o, &lse));
  CHECK_STATUS(ctx, FA_ERR_DTYPE, fa_attention(ctx, q, kh, v, &op, &o, &lse));
  CHECK(strstr(fa_context_error(ctx), "f16") != NULL, "names the dtype: %s", fa_context_error(ctx));

  fa_attention_opts bad = op;
  bad.scale = NAN;
  bad.has_scale = 1;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &bad, &o, &lse));
  CHECK(strstr(fa_context_error(ctx), "scale") != NULL, "names scale: %s", fa_context_error(ctx));
  bad = op;
  bad.softcap = -1;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &bad, &o, &lse));
  CHECK(strstr(fa_context_error(ctx), "softcap") != NULL, "names softcap: %s", fa_context_error(ctx));
  bad = op;
  bad.algo = FA_ATTN_FLASH;
  bad.tile_q = -1;
  bad.tile_k = 16;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &bad, &o, &lse));
  CHECK(strstr(fa_context_error(ctx), "tile") != NULL, "names tile: %s", fa_context_error(ctx));
  bad = op;
  bad.algo = (fa_attention_algo)99;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &bad, &o, &lse));
  bad = op;
  bad.has_window = 1;
  bad.window_left = -3;
  bad.window_right = 0;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &bad, &o, &lse));
  bad = op;
  int64_t lens[2] = {1, 2};
  bad.kv_lens = lens;
  bad.n_kv_lens = 2; /* B = 1 */
  CHECK(fa_attention(ctx, q, k, v, &bad, &o, &lse) != FA_OK, "kv_lens of the wrong length");
  CHECK(strstr(fa_context_error(ctx), "kv_lens") != NULL, "names kv_lens: %s", fa_context_error(ctx));
  bad = op;
  double slopes[1] = {0.5};
  bad.alibi = slopes;
  bad.n_alibi = 1; /* Hq = 2 */
  CHECK(fa_attention(ctx, q, k, v, &bad, &o, &lse) != FA_OK, "alibi of the wrong length");
  CHECK(strstr(fa_context_error(ctx), "alibi") != NULL, "names alibi: %s", fa_context_error(ctx));
  bad = op;
  bad.n_kv_lens = 1; /* a count without its array */
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &bad, &o, &lse));
  CHECK(strstr(fa_context_error(ctx), "kv_lens") != NULL, "names kv_lens: %s", fa_context_error(ctx));
  bad = op;
  bad.n_alibi = 2;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &bad, &o, &lse));
  bad = op;
  bad.out = k; /* wrong shape */
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_attention(ctx, q, k, v, &bad, &o, &lse));
  CHECK(strstr(fa_context_error(ctx), "out") != NULL, "names out: %s", fa_context_error(ctx));
  bad = op;
  bad.mask = k; /* (1,2,10,16) does not broadcast to (1,2,8,10) */
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_attention(ctx, q, k, v, &bad, &o, &lse));
  CHECK(strstr(fa_context_error(ctx), "mask") != NULL, "names mask: %s", fa_context_error(ctx));

  /* softmax */
  fa_softmax_opts so;
  fa_softmax_opts_init(&so);
  fa_tensor *y = NULL;
  CHECK_STATUS(ctx, FA_ERR_DTYPE, fa_softmax(ctx, qb, &so, &y));
  so.algo = FA_SOFTMAX_FUSED;
  int64_t maxn = fa_softmax_fused_max_n(ctx, FA_F32, FA_CPU);
  CHECK(maxn > 0, "fused max n %lld", (long long)maxn);
  if (maxn > 0 && maxn < (1 << 24)) {
    fa_tensor *row = NULL;
    int64_t rs[2] = {1, maxn + 1};
    CHECK_OK(ctx, fa_tensor_empty(ctx, 2, rs, FA_F32, FA_CPU, &row));
    if (row) {
      fa_tensor_fill(ctx, row, 0);
      fa_status st = fa_softmax(ctx, row, &so, &y);
      CHECK(st != FA_OK, "fused softmax past its limit");
      char num[32];
      snprintf(num, sizeof num, "%lld", (long long)maxn);
      CHECK(strstr(fa_context_error(ctx), num) != NULL, "the message names the limit %s: %s", num,
            fa_context_error(ctx));
      fa_tensor_release(row);
    }
  }

  /* matmul */
  fa_matmul_opts mo;
  fa_matmul_opts_init(&mo);
  fa_tensor *mm = NULL;
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_matmul(ctx, q, k, &mo, &mm));

  /* out of memory: the engine's limit */
  fa_set_memory_limit(FA_CPU, mem_now() + 1024);
  fa_tensor *big = NULL;
  int64_t bs[2] = {1024, 1024};
  CHECK_STATUS(ctx, FA_ERR_OUT_OF_MEMORY, fa_tensor_empty(ctx, 2, bs, FA_F32, FA_CPU, &big));
  fa_attention_opts naive = op;
  naive.algo = FA_ATTN_NAIVE;
  fa_status st = fa_attention(ctx, q, k, v, &naive, &o, &lse);
  CHECK(st == FA_ERR_OUT_OF_MEMORY || st == FA_OK, "attention under a tight limit: %s", fa_status_name(st));
  if (o) fa_tensor_release(o);
  if (lse) fa_tensor_release(lse);
  o = lse = NULL;
  fa_set_memory_limit(FA_CPU, 0);
  CHECK(fa_memory_limit(FA_CPU) == 0, "limit reset");
  CHECK(mem_now() == m0, "failed calls leaked %zu bytes", mem_now() - m0);

  /* and everything still works (an lse may come back when asked for by
   * pointer even without return_lse: released either way) */
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &op, &o, &lse));
  if (o) fa_tensor_release(o);
  if (lse) fa_tensor_release(lse);
  lse = NULL;
  CHECK(mem_now() == m0, "memory back after a good call");

  fa_tensor_release(q);
  fa_tensor_release(k);
  fa_tensor_release(v);
  fa_tensor_release(qb);
  fa_tensor_release(q3);
  fa_tensor_release(kd);
  fa_tensor_release(kh);
}

/* Attention on buffers the host owns, the output written into the host's O
 * buffer through opts.out, against the plain C reference. */
static void test_attention_on_wrapped(void) {
  tu_test = "attention on wrapped buffers";
  const int B = 2, Hq = 4, Hkv = 2, Lq = 37, Lk = 53, D = 32, Dv = 24;
  size_t nq = (size_t)B * Hq * Lq * D, nk = (size_t)B * Hkv * Lk * D, nv = (size_t)B * Hkv * Lk * Dv;
  size_t no = (size_t)B * Hq * Lq * Dv;
  float *Q = malloc(nq * 4), *K = malloc(nk * 4), *V = malloc(nv * 4), *O = malloc(no * 4);
  double *R = malloc(no * 8);
  fill(Q, nq);
  fill(K, nk);
  fill(V, nv);
  int64_t sq[4] = {B, Hq, Lq, D}, sk[4] = {B, Hkv, Lk, D}, sv[4] = {B, Hkv, Lk, Dv}, so[4] = {B, Hq, Lq, Dv};
  release_log lq = {0, NULL}, lk = {0, NULL}, lv = {0, NULL}, lo = {0, NULL};
  fa_tensor *q = NULL, *k = NULL, *v = NULL, *o = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, Q, FA_CPU, FA_F32, 4, sq, NULL, on_release, &lq, &q));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, K, FA_CPU, FA_F32, 4, sk, NULL, on_release, &lk, &k));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, V, FA_CPU, FA_F32, 4, sv, NULL, on_release, &lv, &v));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, O, FA_CPU, FA_F32, 4, so, NULL, on_release, &lo, &o));
  if (q && k && v && o) {
    for (int causal = 0; causal <= 1; causal++) {
      ref_attention(Q, K, V, R, B, Hq, Hkv, Lq, Lk, D, Dv, 1.0 / sqrt((double)D), causal);
      for (int algo = FA_ATTN_AUTO; algo <= FA_ATTN_FLASH; algo++) {
        for (size_t i = 0; i < no; i++) O[i] = NAN;
        fa_attention_opts op;
        fa_attention_opts_init(&op);
        op.algo = (fa_attention_algo)algo;
        op.causal = causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
        op.out = o;
        op.return_lse = 1;
        fa_tensor *res = NULL, *lse = NULL;
        CHECK_OK(ctx, fa_attention(ctx, q, k, v, &op, &res, &lse));
        CHECK(res == o, "with opts.out the result is opts.out (retained)");
        double md = max_diff_f32(O, R, no);
        CHECK(md < 2e-5, "algo %d causal %d: max |O - ref| = %g", algo, causal, md);
        if (lse) {
          CHECK(fa_tensor_ndim(lse) == 3 && fa_tensor_size(lse, 2) == Lq && fa_tensor_dtype(lse) == FA_F32, "lse");
          fa_tensor_release(lse);
        }
        if (res) fa_tensor_release(res);
      }
      /* the reference function agrees with the C reference */
      fa_attention_opts op;
      fa_attention_opts_init(&op);
      op.causal = causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
      fa_tensor *ro = NULL, *rl = NULL;
      CHECK_OK(ctx, fa_attention_reference(ctx, q, k, v, &op, &ro, &rl));
      if (ro) {
        CHECK(fa_tensor_dtype(ro) == FA_F64 && fa_tensor_device(ro) == FA_CPU, "reference is f64 on the cpu");
        double *rv = malloc(no * 8);
        CHECK_OK(ctx, fa_tensor_read_f64(ctx, ro, rv));
        double md = 0;
        for (size_t i = 0; i < no; i++) md = fmax(md, fabs(rv[i] - R[i]));
        CHECK(md < 1e-12, "fa_attention_reference vs the C reference: %g", md);
        free(rv);
        fa_tensor_release(ro);
      }
      if (rl) fa_tensor_release(rl);
    }
    /* a new output when no opts.out: independent of the host's O */
    fa_tensor *res = NULL;
    for (size_t i = 0; i < no; i++) O[i] = 0;
    fa_attention_opts plain;
    fa_attention_opts_init(&plain);
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &plain, &res, NULL));
    if (res) {
      CHECK(fa_tensor_data(res) != O, "a fresh output");
      CHECK(O[0] == 0, "O untouched without opts.out");
      fa_tensor_release(res);
    }
    /* softmax and matmul on the wrapped buffers too */
    fa_softmax_opts sopt;
    fa_softmax_opts_init(&sopt);
    sopt.out = q; /* in place */
    fa_tensor *y = NULL;
    float row0[32];
    memcpy(row0, Q, sizeof row0);
    CHECK_OK(ctx, fa_softmax(ctx, q, &sopt, &y));
    if (y) {
      double m = -INFINITY, den = 0, md = 0;
      for (int j = 0; j < D; j++) m = fmax(m, row0[j]);
      for (int j = 0; j < D; j++) den += exp(row0[j] - m);
      for (int j = 0; j < D; j++) md = fmax(md, fabs(Q[j] - exp(row0[j] - m) / den));
      CHECK(md < 1e-6, "in-place softmax of the host's buffer: %g", md);
      fa_tensor_release(y);
    }
  }
  if (q) fa_tensor_release(q);
  if (k) fa_tensor_release(k);
  if (v) fa_tensor_release(v);
  if (o) fa_tensor_release(o);
  CHECK(lq.calls == 1 && lk.calls == 1 && lv.calls == 1 && lo.calls == 1, "each buffer released once (%d %d %d %d)",
        lq.calls, lk.calls, lv.calls, lo.calls);
  free(Q);
  free(K);
  free(V);
  free(O);
  free(R);
}

/* An output whose elements share memory (stride 0 over a dimension of more
 * than one) is refused, writing nothing; stride 0 where the size is one is
 * no sharing. */
static void test_outputs_sharing_memory(void) {
  tu_test = "outputs whose elements share memory";
  const int B = 1, H = 2, L = 5, D = 8;
  float Q[2 * 5 * 8], O[2 * 5 * 8];
  fill(Q, sizeof Q / sizeof *Q);
  int64_t sq[4] = {B, H, L, D}, shared[4] = {0, L * D, 0, 1}, unit[4] = {0, L * D, D, 1};
  fa_tensor *q = NULL, *o_shared = NULL, *o_unit = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, Q, FA_CPU, FA_F32, 4, sq, NULL, NULL, NULL, &q));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, O, FA_CPU, FA_F32, 4, sq, shared, NULL, NULL, &o_shared));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, O, FA_CPU, FA_F32, 4, sq, unit, NULL, NULL, &o_unit));
  if (q && o_shared && o_unit) {
    for (size_t i = 0; i < sizeof O / sizeof *O; i++) O[i] = 7;
    fa_attention_opts op;
    fa_attention_opts_init(&op);
    op.out = o_shared;
    fa_tensor *res = NULL;
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, q, q, &op, &res, NULL));
    CHECK(strstr(fa_context_error(ctx), "opts.out") && strstr(fa_context_error(ctx), "stride 0"), "message: %s",
          fa_context_error(ctx));
    CHECK(res == NULL, "no result");
    fa_softmax_opts so;
    fa_softmax_opts_init(&so);
    so.out = o_shared;
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_softmax(ctx, q, &so, &res));
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_copy(ctx, o_shared, q));
    CHECK(strstr(fa_context_error(ctx), "copy_"), "message: %s", fa_context_error(ctx));
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_fill_random(ctx, o_shared, FA_FILL_NORMAL, 1));
    double vals[2 * 5 * 8] = {0};
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_write_f64(ctx, o_shared, vals));
    int untouched = 1;
    for (size_t i = 0; i < sizeof O / sizeof *O; i++) untouched &= O[i] == 7;
    CHECK(untouched, "nothing written");
    /* non-zero strides that still give two elements one address ({1, 1} over 5 x 8), and ones that
     * interleave without sharing (rows 3 apart, columns 2 apart, over 2 x 3: 0 2 4 3 5 7) */
    int64_t s_over[4] = {80, 40, 1, 1}, sh_il[4] = {1, 1, 2, 3}, s_il[4] = {40, 40, 3, 2};
    fa_tensor *o_over = NULL, *o_il = NULL;
    CHECK_OK(ctx, fa_tensor_wrap(ctx, O, FA_CPU, FA_F32, 4, sq, s_over, NULL, NULL, &o_over));
    CHECK_OK(ctx, fa_tensor_wrap(ctx, O, FA_CPU, FA_F32, 4, sh_il, s_il, NULL, NULL, &o_il));
    if (o_over) {
      op.out = o_over;
      CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, q, q, &op, &res, NULL));
      CHECK(strstr(fa_context_error(ctx), "one address"), "message: %s", fa_context_error(ctx));
      fa_tensor_release(o_over);
    }
    if (o_il) {
      fa_tensor *src = NULL;
      CHECK_OK(ctx, fa_tensor_empty(ctx, 4, sh_il, FA_F32, FA_CPU, &src));
      if (src) CHECK_OK(ctx, fa_tensor_fill(ctx, src, 0));
      if (src) CHECK_OK(ctx, fa_tensor_copy(ctx, o_il, src));
      CHECK(O[0] == 0 && O[2] == 0 && O[7] == 0 && O[1] == 7, "interleaved destination written where it lies");
      if (src) fa_tensor_release(src);
      fa_tensor_release(o_il);
    }
    int still = 1;
    for (size_t i = 0; i < sizeof O / sizeof *O; i++) still &= i == 0 || i == 2 || i == 3 || i == 4 || i == 5 || i == 7 || O[i] == 7;
    CHECK(still, "nothing else written");
    /* batch of one with stride 0: fine */
    op.out = o_unit;
    CHECK_OK(ctx, fa_attention(ctx, q, q, q, &op, &res, NULL));
    CHECK(res == o_unit && O[0] != 7, "written through the unit stride");
    if (res) fa_tensor_release(res);
  }
  if (q) fa_tensor_release(q);
  if (o_shared) fa_tensor_release(o_shared);
  if (o_unit) fa_tensor_release(o_unit);
}

static void test_matmul_merge_cost_info(void) {
  tu_test = "matmul, merge, cost, info";
  float A[6] = {1, 2, 3, 4, 5, 6}, Bm[6] = {1, 0, 0, 1, 1, 1}, C[4];
  int64_t sa[2] = {2, 3}, sb[2] = {3, 2}, sc[2] = {2, 2};
  fa_tensor *a = NULL, *b = NULL, *c = NULL, *res = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, A, FA_CPU, FA_F32, 2, sa, NULL, NULL, NULL, &a));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, Bm, FA_CPU, FA_F32, 2, sb, NULL, NULL, NULL, &b));
  CHECK_OK(ctx, fa_tensor_wrap(ctx, C, FA_CPU, FA_F32, 2, sc, NULL, NULL, NULL, &c));
  for (int algo = FA_MATMUL_AUTO; algo <= FA_MATMUL_BLAS && a && b && c; algo++) {
    fa_matmul_opts mo;
    fa_matmul_opts_init(&mo);
    mo.algo = (fa_matmul_algo)algo;
    mo.out = c;
    C[0] = C[1] = C[2] = C[3] = NAN;
    CHECK_OK(ctx, fa_matmul(ctx, a, b, &mo, &res));
    CHECK(C[0] == 4 && C[1] == 5 && C[2] == 10 && C[3] == 11, "matmul algo %d: %g %g %g %g", algo, C[0], C[1], C[2],
          C[3]);
    if (res) fa_tensor_release(res);
    res = NULL;
  }
  if (a) fa_tensor_release(a);
  if (b) fa_tensor_release(b);
  if (c) fa_tensor_release(c);

  /* merge: two halves of the keys */
  int64_t sq[3] = {2, 5, 8}, sk[3] = {2, 12, 8}, sk1[3] = {2, 6, 8};
  fa_tensor *q = NULL, *k = NULL, *v = NULL, *k1 = NULL, *k2 = NULL, *v1 = NULL, *v2 = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 3, sq, FA_F32, FA_CPU, &q));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 3, sk, FA_F32, FA_CPU, &k));
  CHECK_OK(ctx, fa_tensor_empty(ctx, 3, sk, FA_F32, FA_CPU, &v));
  if (q && k && v) {
    fa_tensor_fill_random(ctx, q, FA_FILL_NORMAL, 11);
    fa_tensor_fill_random(ctx, k, FA_FILL_NORMAL, 12);
    fa_tensor_fill_random(ctx, v, FA_FILL_NORMAL, 13);
    CHECK_OK(ctx, fa_tensor_narrow(ctx, k, 1, 0, 6, &k1));
    CHECK_OK(ctx, fa_tensor_narrow(ctx, k, 1, 6, 6, &k2));
    CHECK_OK(ctx, fa_tensor_narrow(ctx, v, 1, 0, 6, &v1));
    CHECK_OK(ctx, fa_tensor_narrow(ctx, v, 1, 6, 6, &v2));
    CHECK(k1 && fa_tensor_size(k1, 1) == sk1[1], "narrow");
    fa_attention_opts op;
    fa_attention_opts_init(&op);
    op.return_lse = 1;
    fa_tensor *o1 = NULL, *l1 = NULL, *o2 = NULL, *l2 = NULL, *o = NULL, *l = NULL, *m = NULL, *ml = NULL;
    CHECK_OK(ctx, fa_attention(ctx, q, k1, v1, &op, &o1, &l1));
    CHECK_OK(ctx, fa_attention(ctx, q, k2, v2, &op, &o2, &l2));
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &op, &o, &l));
    CHECK_OK(ctx, fa_merge_states(ctx, o1, l1, o2, l2, &m, &ml));
    if (m && o) {
      double rel = 1;
      CHECK_OK(ctx, fa_rel_error(ctx, m, o, &rel));
      CHECK(rel < 1e-5, "merge of the halves vs the whole: %g", rel);
    }
    fa_tensor *bm = NULL, *bl = NULL;
    CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_merge_states(ctx, o1, l1, k, l2, &bm, &bl)); /* k: (2,12,8) vs (2,5,8) */
    CHECK(bm == NULL && bl == NULL, "no outputs from a failed merge");

    fa_cost cost;
    fa_attention_opts cop;
    fa_attention_opts_init(&cop);
    CHECK_OK(ctx, fa_cost_attention(ctx, q, k, v, &cop, &cost));
    CHECK(cost.flops == 4.0 * 2 * 5 * 12 * 8, "flops %g", cost.flops);
    CHECK(cost.bytes > 0, "bytes");
    fa_softmax_opts sop;
    fa_softmax_opts_init(&sop);
    CHECK_OK(ctx, fa_cost_softmax(ctx, q, &sop, &cost));
    CHECK(cost.bytes >= 2.0 * 2 * 5 * 8 * 4, "softmax bytes %g", cost.bytes);

    fa_tensor *all[] = {o1, l1, o2, l2, o, l, m, ml, k1, k2, v1, v2};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
      if (all[i]) fa_tensor_release(all[i]);
  }
  if (q) fa_tensor_release(q);
  if (k) fa_tensor_release(k);
  if (v) fa_tensor_release(v);

  fa_device_info_t info;
  memset(&info, 0, sizeof info);
  CHECK_OK(ctx, fa_device_info(ctx, FA_CPU, &info));
  CHECK(strcmp(info.backend, "cpu") == 0, "backend %s", info.backend);
  CHECK(info.name[0] != 0 && info.threads >= 1 && info.simd[0] != 0, "cpu info: %s, %d threads, %s", info.name,
        info.threads, info.simd);
  if (!fa_backend_available(FA_CUDA)) CHECK_STATUS(ctx, FA_ERR_DEVICE, fa_device_info(ctx, FA_CUDA, &info));
}

/* Tensors handed to Lua and back (fa_lua_push_tensor, fa_lua_check_tensor,
 * fa_lua_set_context). */
static void test_lua_handoff(void) {
  tu_test = "lua handoff";
  float buf[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  release_log log = {0, NULL};
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, buf, FA_CPU, FA_F32, 1, shape, NULL, on_release, &log, &t));
  if (!t) return;
  lua_State *L = luaL_newstate();
  luaL_requiref(L, "_G", luaopen_base, 1);
  luaL_requiref(L, "flashattn", luaopen_flashattn, 1);
  lua_pop(L, 2);
  fa_lua_set_context(L, ctx);
  CHECK(fa_lua_get_context(L) == ctx, "the host's context");
  fa_lua_set_context(L, NULL); /* back to the module's own ... */
  CHECK(fa_lua_get_context(L) != ctx, "NULL returns to the module's own context");
  fa_lua_set_context(L, ctx); /* ... and the host's again */
  CHECK(fa_lua_get_context(L) == ctx, "the host's context again");
  fa_lua_push_tensor(L, t);
  lua_setglobal(L, "T");
  fa_tensor_release(t); /* Lua holds its own reference */
  CHECK(log.calls == 0, "released while Lua holds it");
  const char *script =
      "T:set(2, 20)\n"
      "assert(T:sum() == 1 + 20 + 3 + 4)\n"
      "local y = flashattn.softmax(T:view(2, 2), {algo = 'safe'})\n"
      "U = y\n"
      "return T\n";
  int rc = luaL_dostring(L, script);
  CHECK(rc == LUA_OK, "script: %s", rc == LUA_OK ? "" : lua_tostring(L, -1));
  CHECK(buf[1] == 20, "the script wrote the host's buffer (%g)", buf[1]);
  if (rc == LUA_OK) {
    fa_tensor *back = fa_lua_check_tensor(L, -1);
    CHECK(back != NULL && fa_tensor_data(back) == buf, "the same tensor comes back");
    lua_pop(L, 1);
    lua_getglobal(L, "U");
    fa_tensor *u = fa_lua_check_tensor(L, -1);
    CHECK(u && fa_tensor_size(u, 0) == 2, "a tensor made in Lua");
    lua_pop(L, 1);
  }
  /* a non-tensor raises a Lua error, not a crash */
  rc = luaL_dostring(L, "return flashattn.softmax('x')");
  CHECK(rc != LUA_OK && strncmp(lua_tostring(L, -1), "flashattn:", 10) == 0, "error: %s", lua_tostring(L, -1));
  lua_pop(L, 1);
  /* a freed tensor in the host's hands is an error for Lua */
  rc = luaL_dostring(L, "T:free(); return pcall(function() return T:sum() end)");
  CHECK(rc == LUA_OK && lua_toboolean(L, -2) == 0, "use after free is an error");
  lua_settop(L, 0);
  lua_close(L);
  CHECK(log.calls == 1, "the buffer released once after lua_close (%d)", log.calls);
}

int main(void) {
  size_t start_mem = mem_now();
  test_names_and_parsing();
  test_contexts();
  CHECK_OK(ctx, fa_context_create(FA_CPU, &ctx));
  if (!ctx) {
    fprintf(stderr, "no CPU context\n");
    return 1;
  }
  test_wrap_zero_copy();
  test_views();
  test_tensor_ops();
  test_status_codes();
  test_attention_on_wrapped();
  test_outputs_sharing_memory();
  test_matmul_merge_cost_info();
  test_lua_handoff();
  fa_context_destroy(ctx);
  tu_test = "end";
  size_t cur, peak;
  fa_memory(FA_CPU, &cur, &peak);
  CHECK(cur == start_mem && cur == 0, "engine memory at the end: %zu bytes (leak)", cur);
  CHECK(peak > 0, "peak");
  printf("test_capi: %d checks, %d failures\n", tu_checks, tu_failures);
  return tu_failures ? 1 : 0;
}
