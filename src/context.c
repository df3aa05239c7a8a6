/* Contexts, error text and the names of statuses, dtypes and devices. */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

fa_status fa_fail(fa_context *ctx, fa_status status, const char *fmt, ...) {
  if (ctx) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx->error, sizeof ctx->error, fmt, ap);
    va_end(ap);
  }
  return status;
}

const char *fa_shape_str(const fa_tensor *t, char *buf, size_t n) {
  size_t used = 0;
  buf[0] = 0;
  for (int i = 0; i < t->ndim && used < n; i++)
    used += (size_t)snprintf(buf + used, n - used, i ? "x%lld" : "%lld", (long long)t->shape[i]);
  return buf;
}

fa_device fa_default_device(void) {
  fa_device d;
  const char *env = getenv("FLASHATTN_DEVICE");
  if (env && *env && fa_device_parse(env, &d) == 0) return d;
  /* a name that is no usable device (another GPU, "tpu"): no default device rather than another one, so that the
   * first call fails naming FLASHATTN_DEVICE */
  if (env && *env) return FA_DEVICE_NONE;
  return fa_cuda_available() ? FA_CUDA : FA_CPU;
}

int fa_backend_available(fa_device device) {
  if (device == FA_CPU) return 1;
  if (device == FA_CUDA) return fa_cuda_available();
  return 0;
}

static fa_status check_device_usable(fa_context *ctx, fa_device device) {
  if (device != FA_CPU && device != FA_CUDA)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: device: expected cpu or cuda, got %d", (int)device);
  if (!fa_backend_available(device))
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: device 'cuda' is not available (no usable GPU or no CUDA backend in this build)");
  return FA_OK;
}

fa_status fa_context_create(fa_device device, fa_context **out) {
  if (!out) return FA_ERR_ARGUMENT; /* no context yet to hold a message */
  *out = NULL;
  if (device != FA_CPU && !fa_backend_available(device)) return FA_ERR_DEVICE;
  fa_context *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return FA_ERR_OUT_OF_MEMORY;
  ctx->device = device;
  ctx->seed_counter = 0x5eedULL;
  fa_cpu_blas_init();
  *out = ctx;
  return FA_OK;
}

void fa_context_destroy(fa_context *ctx) {
  if (!ctx) return;
  fa_cuda_context_release(ctx);
  free(ctx);
}

const char *fa_context_error(const fa_context *ctx) { return ctx ? ctx->error : "flashattn: no context"; }

fa_device fa_context_device(const fa_context *ctx) { return ctx ? ctx->device : FA_DEVICE_NONE; }

fa_status fa_context_set_device(fa_context *ctx, fa_device device) {
  FA_NEED(ctx);
  fa_status st = check_device_usable(ctx, device);
  if (st == FA_OK) ctx->device = device;
  return st;
}

fa_status fa_context_set_stream(fa_context *ctx, void *stream) {
  FA_NEED(ctx);
  ctx->stream = stream;
  return FA_OK;
}

void *fa_context_stream(const fa_context *ctx) { return ctx ? ctx->stream : NULL; }

fa_status fa_sync(fa_context *ctx) {
  FA_NEED(ctx);
  if (ctx->device == FA_CUDA) return fa_cuda_sync(ctx);
  return FA_OK;
}

const char *fa_status_name(fa_status s) {
  static const char *names[] = {"ok", "argument", "shape", "dtype", "device", "out of memory", "unsupported", "backend"};
  return (unsigned)s < sizeof names / sizeof *names ? names[s] : "unknown";
}

static const char *const dtype_names[] = {"f32", "f16", "bf16", "f64", "bool"};
static const size_t dtype_sizes[] = {4, 2, 2, 8, 1};

const char *fa_dtype_name(fa_dtype d) { return (unsigned)d <= FA_BOOL ? dtype_names[d] : "?"; }
size_t fa_dtype_size(fa_dtype d) { return (unsigned)d <= FA_BOOL ? dtype_sizes[d] : 0; }
const char *fa_device_name(fa_device d) { return d == FA_CPU ? "cpu" : d == FA_CUDA ? "cuda" : "?"; }

int fa_dtype_parse(const char *name, fa_dtype *out) {
  if (!name || !out) return -1;
  static const struct { const char *name; fa_dtype d; } table[] = {
      {"f32", FA_F32},   {"float", FA_F32},     {"float32", FA_F32}, {"f16", FA_F16}, {"half", FA_F16},
      {"float16", FA_F16}, {"bf16", FA_BF16},  {"bfloat16", FA_BF16}, {"f64", FA_F64}, {"double", FA_F64},
      {"float64", FA_F64}, {"bool", FA_BOOL}};
  for (size_t i = 0; i < sizeof table / sizeof *table; i++)
    if (strcmp(name, table[i].name) == 0) {
      *out = table[i].d;
      return 0;
    }
  return -1;
}

#ifdef FA_HAVE_CUDA
/* The CUDA runtime (linked into the library): the engine works on the
 * current device.  Declared here rather than through cuda_runtime.h,
 * whose include directory the C sources do not get; cudaError_t is an
 * enum, returned as an int, 0 = cudaSuccess. */
extern int cudaGetDevice(int *device);
#endif

int fa_cuda_current_index(void) {
#ifdef FA_HAVE_CUDA
  int dev = -1;
  if (fa_cuda_available() && cudaGetDevice(&dev) == 0) return dev;
#endif
  return -1;
}

void fa_device_cuda_current(int *index) {
  if (index) *index = fa_cuda_current_index();
}

int fa_device_cuda_index(const char *name) {
  if (!name || strncmp(name, "cuda:", 5) != 0) return -1;
  long long n = 0;
  const char *p = name + 5;
  if (!*p) return -1;
  if (p[0] == '0' && p[1]) return -1; /* no leading zeros: cuda:0, not cuda:00 */
  for (; *p; p++) {
    if (*p < '0' || *p > '9' || n > INT32_MAX / 10) return -1;
    n = n * 10 + (*p - '0');
  }
  return n > INT32_MAX ? -1 : (int)n;
}

int fa_device_parse(const char *name, fa_device *out) {
  if (!name || !out) return -1;
  if (strcmp(name, "cpu") == 0) {
    *out = FA_CPU;
    return 0;
  }
  if (strcmp(name, "cuda") == 0 || strcmp(name, "gpu") == 0) {
    *out = FA_CUDA;
    return 0;
  }
  /* "cuda:N": the current GPU (cuda:0 where none can be told, which then
   * fails as "cuda" does); another GPU is not in this version */
  const int n = fa_device_cuda_index(name);
  if (n < 0) return -1; /* (no CUDA call for a name that is no GPU's) */
  const int cur = fa_cuda_current_index();
  if (n != (cur < 0 ? 0 : cur)) return -1;
  *out = FA_CUDA;
  return 0;
}
