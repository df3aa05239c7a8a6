/* Elementwise work on device tensors: strided copies with dtype
 * conversion, fills (constant, uniform, normal, arange: the random ones
 * with the CPU's counter-based generator, so a seed gives the same values
 * on both devices), reductions in f64 and arithmetic. */
#include "common.cuh"
#include "binary_op.h"
#include "random_counter.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

/* A tensor's layout, passed to kernels by value. */
struct Layout {
  char *data;
  int dtype, ndim;
  int64_t shape[FA_MAX_DIMS], strides[FA_MAX_DIMS];
};

static Layout layout_of(const fa_tensor *t) {
  Layout l;
  l.data = (char *)fa_tensor_ptr(t);
  l.dtype = t->dtype;
  l.ndim = t->ndim;
  for (int i = 0; i < FA_MAX_DIMS; i++) {
    l.shape[i] = i < t->ndim ? t->shape[i] : 1;
    l.strides[i] = i < t->ndim ? t->strides[i] : 0;
  }
  return l;
}

/* Element offset of row-major index k. */
static __device__ __forceinline__ int64_t offset_of(const Layout &l, int64_t k) {
  int64_t off = 0;
  for (int d = l.ndim - 1; d >= 0; d--) {
    int64_t i = k % l.shape[d];
    k /= l.shape[d];
    off += i * l.strides[d];
  }
  return off;
}

static __device__ __forceinline__ double load_elem(const Layout &l, int64_t off) {
  switch (l.dtype) {
  case FA_F32: return ((const float *)l.data)[off];
  case FA_F16: return Elem<__half>::load(((const __half *)l.data)[off]);
  case FA_BF16: return Elem<__nv_bfloat16>::load(((const __nv_bfloat16 *)l.data)[off]);
  case FA_F64: return ((const double *)l.data)[off];
  default: return ((const unsigned char *)l.data)[off] ? 1.0 : 0.0;
  }
}

/* Rounds through f32 for f16/bf16, as the CPU does (src/dtype.c). */
static __device__ __forceinline__ void store_elem(const Layout &l, int64_t off, double v) {
  switch (l.dtype) {
  case FA_F32: ((float *)l.data)[off] = (float)v; break;
  case FA_F16: ((__half *)l.data)[off] = Elem<__half>::store((float)v); break;
  case FA_BF16: ((__nv_bfloat16 *)l.data)[off] = Elem<__nv_bfloat16>::store((float)v); break;
  case FA_F64: ((double *)l.data)[off] = v; break;
  default: ((unsigned char *)l.data)[off] = v != 0; break;
  }
}

/* The generator of src/random_counter.h (the CPU's too). */
static __device__ double random_value(int kind, int dtype, uint64_t seed, uint64_t k) {
  if (kind == FA_FILL_UNIFORM) return fa_rng_uniform_for(dtype, fa_rng_uniform(seed, k));
  if (kind == FA_FILL_ARANGE) return (double)k;
  return fa_rng_normal(seed, k);
}

#define GRID_STRIDE(k, n)                                                                                    \
  for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < (n); k += (int64_t)gridDim.x * blockDim.x)

__global__ void copy_kernel(Layout dst, Layout src, int64_t n) {
  GRID_STRIDE(k, n) store_elem(dst, offset_of(dst, k), load_elem(src, offset_of(src, k)));
}

enum { FILL_CONST = -1 };
__global__ void fill_kernel(Layout t, int64_t n, int kind, uint64_t seed, double value) {
  GRID_STRIDE(k, n) store_elem(t, offset_of(t, k), kind == FILL_CONST ? value : random_value(kind, t.dtype, seed, (uint64_t)k));
}

__global__ void binary_kernel(Layout r, Layout a, Layout b, int has_b, int op, double scalar, int64_t n) {
  GRID_STRIDE(k, n) {
    double x = load_elem(a, offset_of(a, k)), y = has_b ? load_elem(b, offset_of(b, k)) : scalar;
    store_elem(r, k, fa_binary_apply(op, x, y));
  }
}

/* Per-block partials in f64: sum, sum of squares, max, min, NaN and
 * non-finite counts; the host folds the blocks' partials. */
struct Partial {
  double sum, sq, mx, mn, nan, nonfinite;
};
__global__ void reduce_kernel(Layout t, int64_t n, Partial *out) {
  Partial p = {0, 0, -INFINITY, INFINITY, 0, 0};
  GRID_STRIDE(k, n) {
    double v = load_elem(t, offset_of(t, k));
    p.sum += v;
    p.sq += v * v;
    p.mx = v > p.mx ? v : p.mx;
    p.mn = v < p.mn ? v : p.mn;
    p.nan += isnan(v);
    p.nonfinite += !isfinite(v);
  }
  __shared__ Partial s[256];
  s[threadIdx.x] = p;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if ((int)threadIdx.x < w) {
      Partial o = s[threadIdx.x + w];
      Partial &m = s[threadIdx.x];
      m.sum += o.sum, m.sq += o.sq, m.nan += o.nan, m.nonfinite += o.nonfinite;
      m.mx = o.mx > m.mx ? o.mx : m.mx;
      m.mn = o.mn < m.mn ? o.mn : m.mn;
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

static int blocks_for(int64_t n) {
  int64_t b = (n + 255) / 256;
  return (int)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

extern "C" fa_status fa_cuda_copy(fa_context *ctx, fa_tensor *dst, const fa_tensor *src) {
  int64_t n = fa_tensor_numel(dst);
  if (!n) return FA_OK;
  copy_kernel<<<blocks_for(n), 256, 0, fa_cuda_stream(ctx)>>>(layout_of(dst), layout_of(src), n);
  FA_CUDA_CHECK_LAUNCH(ctx, "copy_kernel");
  return FA_OK;
}

/* kind < 0: the constant `value`; else an fa_fill_kind with `seed`. */
extern "C" fa_status fa_cuda_fill(fa_context *ctx, fa_tensor *t, int kind, uint64_t seed, double value) {
  int64_t n = fa_tensor_numel(t);
  if (!n) return FA_OK;
  fill_kernel<<<blocks_for(n), 256, 0, fa_cuda_stream(ctx)>>>(layout_of(t), n, kind, seed, value);
  FA_CUDA_CHECK_LAUNCH(ctx, "fill_kernel");
  return FA_OK;
}

extern "C" fa_status fa_cuda_binary(fa_context *ctx, fa_tensor *r, const fa_tensor *a, const fa_tensor *b, int op,
                                    double scalar) {
  int64_t n = fa_tensor_numel(r);
  if (!n) return FA_OK;
  Layout lb = b ? layout_of(b) : layout_of(a);
  binary_kernel<<<blocks_for(n), 256, 0, fa_cuda_stream(ctx)>>>(layout_of(r), layout_of(a), lb, b != NULL, op, scalar, n);
  FA_CUDA_CHECK_LAUNCH(ctx, "binary_kernel");
  return FA_OK;
}

/* out[0..5] = sum, sum of squares, max, min, NaN count, non-finite count. */
extern "C" fa_status fa_cuda_reduce(fa_context *ctx, const fa_tensor *t, double out[6]) {
  int64_t n = fa_tensor_numel(t);
  int blocks = blocks_for(n);
  size_t bytes = sizeof(Partial) * (size_t)blocks;
  void *dev = NULL;
  fa_status st = fa_cuda_malloc(ctx, &dev, bytes);
  if (st) return st;
  Partial *host = (Partial *)malloc(bytes);
  if (!host) {
    fa_cuda_free_on(ctx, dev, bytes);
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: out of host memory");
  }
  reduce_kernel<<<blocks, 256, 0, fa_cuda_stream(ctx)>>>(layout_of(t), n, (Partial *)dev);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) st = fa_cuda_memcpy(ctx, host, dev, bytes, FA_COPY_D2H);
  else st = fa_cuda_error(ctx, err, "launch of reduce_kernel");
  if (!st) {
    Partial p = {0, 0, -INFINITY, INFINITY, 0, 0};
    for (int i = 0; i < blocks; i++) {
      p.sum += host[i].sum, p.sq += host[i].sq, p.nan += host[i].nan, p.nonfinite += host[i].nonfinite;
      p.mx = host[i].mx > p.mx ? host[i].mx : p.mx;
      p.mn = host[i].mn < p.mn ? host[i].mn : p.mn;
    }
    out[0] = p.sum, out[1] = p.sq, out[2] = p.mx, out[3] = p.mn, out[4] = p.nan, out[5] = p.nonfinite;
  }
  free(host);
  fa_cuda_free_on(ctx, dev, bytes);
  return st;
}
