/* fa.matmul on the GPU: the seeds' naive product (a thread per output
 * element), the tiled one (T×T tiles of A and B staged in shared memory,
 * T = opts.tile), and cuBLAS.  Row-major, accumulation in f32 (f64 for f64). */
#include "common.cuh"
#include "merge_weights.h"

#include <cublas_v2.h>

template <typename T>
__global__ void matmul_naive_kernel(const T *a, const T *b, T *c, int64_t m, int64_t k, int64_t n, int64_t lda,
                                    int64_t ldb) {
  int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, row = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
  if (row >= m || col >= n) return;
  typename Elem<T>::acc acc = 0;
  for (int64_t x = 0; x < k; x++) acc += to_float(a[row * lda + x]) * to_float(b[x * ldb + col]);
  c[row * n + col] = from_float<T>(acc);
}

/* T×T tiles of A and B in shared memory (T = opts.tile); a block of
 * bt×bt threads (bt = min(T, 32)), each thread owning an (T/bt)² block of C.
 * Bounded for 1024 threads: f64 accumulators would not fit otherwise. */
template <typename T>
__global__ void __launch_bounds__(1024) matmul_tiled_kernel(const T *a, const T *b, T *c, int64_t m, int64_t k, int64_t n,
                                                             int64_t lda, int64_t ldb, int tile) {
  typedef typename Elem<T>::acc A;
  extern __shared__ __align__(16) unsigned char tiles_raw[];
  const int bt = blockDim.x, per = tile / bt; /* per <= 4 */
  A *as = (A *)tiles_raw, *bs = as + tile * tile;
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t row0 = (int64_t)blockIdx.y * tile, col0 = (int64_t)blockIdx.x * tile;
  A acc[4][4] = {};
  for (int64_t x0 = 0; x0 < k; x0 += tile) {
    for (int r = ty; r < tile; r += bt)
      for (int q = tx; q < tile; q += bt) {
        int64_t ar = row0 + r, ak = x0 + q, bk = x0 + r, bc = col0 + q;
        as[r * tile + q] = ar < m && ak < k ? to_float(a[ar * lda + ak]) : (A)0;
        bs[r * tile + q] = bk < k && bc < n ? to_float(b[bk * ldb + bc]) : (A)0;
      }
    __syncthreads();
    for (int x = 0; x < tile; x++)
#pragma unroll
      for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
          if (i < per && j < per) acc[i][j] += as[(ty + i * bt) * tile + x] * bs[x * tile + tx + j * bt];
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) {
      int64_t row = row0 + ty + i * bt, col = col0 + tx + j * bt;
      if (i < per && j < per && row < m && col < n) {
        c[row * n + col] = from_float<T>(acc[i][j]);
      }
    }
}

extern "C" fa_status fa_cuda_cublas_handle(fa_context *ctx, void **handle); /* attention_naive.cu */

template <typename T> static cudaDataType_t dtype_of();
template <> cudaDataType_t dtype_of<float>() { return CUDA_R_32F; }
template <> cudaDataType_t dtype_of<double>() { return CUDA_R_64F; }
template <> cudaDataType_t dtype_of<__half>() { return CUDA_R_16F; }
template <> cudaDataType_t dtype_of<__nv_bfloat16>() { return CUDA_R_16BF; }

template <typename T>
static fa_status matmul_typed(fa_context *ctx, fa_matmul_algo algo, int64_t tile, const fa_mm_operands *g) {
  const T *a = (const T *)g->a, *b = (const T *)g->b;
  T *c = (T *)g->c;
  const int64_t m = g->m, k = g->k, n = g->n, lda = g->lda, ldb = g->ldb;
  cudaStream_t s = fa_cuda_stream(ctx);
  if (algo == FA_MATMUL_NAIVE) {
    dim3 block(16, 16), grid((unsigned)((n + 15) / 16), (unsigned)((m + 15) / 16));
    matmul_naive_kernel<T><<<grid, block, 0, s>>>(a, b, c, m, k, n, lda, ldb);
    FA_CUDA_CHECK_LAUNCH(ctx, "matmul_naive_kernel");
    return FA_OK;
  }
  if (algo == FA_MATMUL_TILED) {
    int t = (int)(tile ? tile : 16), bt = t < 32 ? t : 32;
    size_t smem = 2 * (size_t)t * t * sizeof(typename Elem<T>::acc);
    FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(matmul_tiled_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 block(bt, bt), grid((unsigned)((n + t - 1) / t), (unsigned)((m + t - 1) / t));
    matmul_tiled_kernel<T><<<grid, block, smem, s>>>(a, b, c, m, k, n, lda, ldb, t);
    FA_CUDA_CHECK_LAUNCH(ctx, "matmul_tiled_kernel");
    return FA_OK;
  }
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) /* (lda, ldb are: fa_mm_operands) */
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: matmul on cuda: sizes above cuBLAS's int range");
  void *h = NULL;
  fa_status st = fa_cuda_cublas_handle(ctx, &h);
  if (st) return st;
  /* row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ */
  const double one_d = 1.0, zero_d = 0.0;
  const float one_f = 1.f, zero_f = 0.f;
  const bool dbl = sizeof(T) == 8;
  cublasStatus_t cs = cublasGemmEx((cublasHandle_t)h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                   dbl ? (const void *)&one_d : (const void *)&one_f, b, dtype_of<T>(), (int)ldb, a,
                                   dtype_of<T>(), (int)lda, dbl ? (const void *)&zero_d : (const void *)&zero_f, c,
                                   dtype_of<T>(), (int)n, dbl ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT);
  if (cs != CUBLAS_STATUS_SUCCESS)
    return fa_fail(ctx, FA_ERR_BACKEND, "flashattn: cuBLAS error in cublasGemmEx: %s", cublasGetStatusString(cs));
  return FA_OK;
}

extern "C" fa_status fa_cuda_matmul(fa_context *ctx, fa_matmul_algo algo, int64_t tile, fa_dtype dt,
                                    const fa_mm_operands *g) {
  const int64_t m = g->m, k = g->k, n = g->n;
  int64_t tile_max = dt == FA_F64 ? 64 : 128;
  if (algo == FA_MATMUL_TILED && tile && (tile > tile_max || (tile > 32 && tile % 32)))
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.tile: on cuda the tiled matmul takes 1 to 32, or a multiple of 32 up to %lld, "
                   "got %lld",
                   (long long)tile_max, (long long)tile);
  if (m == 0 || n == 0) return FA_OK;
  if (k == 0) { /* an empty sum: zeros (cuBLAS rejects a leading dimension of 0) */
    FA_CUDA_CHECK(ctx, cudaMemsetAsync(g->c, 0, (size_t)(m * n) * fa_dtype_size(dt), fa_cuda_stream(ctx)));
    return FA_OK;
  }
  switch (dt) {
  case FA_F32: return matmul_typed<float>(ctx, algo, tile, g);
  case FA_F64: return matmul_typed<double>(ctx, algo, tile, g);
  case FA_F16: return matmul_typed<__half>(ctx, algo, tile, g);
  case FA_BF16: return matmul_typed<__nv_bfloat16>(ctx, algo, tile, g);
  default: return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: matmul: dtype %s has no CUDA kernel", fa_dtype_name(dt));
  }
}

/* ---- merge_states: the seeds' rescale-and-add in log space ----
 * One thread per output element (and one per row when Dv = 0); the weights
 * and lse in f64, so that an f64 lse keeps its precision; f64 states too. */
template <typename T> __global__ void merge_kernel(const fa_merge_operands g) {
  const T *o1 = (const T *)g.o1, *o2 = (const T *)g.o2;
  const double *l1 = g.lse1, *l2 = g.lse2;
  const int64_t rows = g.rows, dv = g.dv, w = dv > 0 ? dv : 1;
  for (int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; x < rows * w; x += (int64_t)gridDim.x * blockDim.x) {
    const int64_t r = x / w, c = x - r * w;
    /* the empty cases by lse == -inf alone (as on the CPU): a NaN lse beside an
     * empty state is kept, not taken for empty (fmax would drop the NaN) */
    double a = l1[r], bb = l2[r], w1, w2, lse;
    if (a == -INFINITY && bb == -INFINITY) w1 = w2 = 0.0, lse = -INFINITY;
    else if (a == -INFINITY) w1 = 0.0, w2 = 1.0, lse = bb;
    else if (bb == -INFINITY) w1 = 1.0, w2 = 0.0, lse = a;
    else lse = fa_merge_weights(a, bb, &w1, &w2);
    if (dv > 0) {
      const T e1 = o1[fa_state_row(&g.rows1, r) + c], e2 = o2[fa_state_row(&g.rows2, r) + c];
      double v1 = w1 == 0.0 ? 0.0 : w1 * to_float(e1), v2 = w2 == 0.0 ? 0.0 : w2 * to_float(e2);
      ((T *)g.o)[x] = from_float<T>((typename Elem<T>::acc)(v1 + v2));
    }
    if (c == 0) g.lse[r] = lse;
  }
}

extern "C" fa_status fa_cuda_merge_states(fa_context *ctx, fa_dtype dt, const fa_merge_operands *g) {
  const int64_t n = g->rows * (g->dv > 0 ? g->dv : 1);
  if (n == 0) return FA_OK;
  unsigned blocks = (unsigned)min((n + 255) / 256, (int64_t)65535);
  cudaStream_t s = fa_cuda_stream(ctx);
  switch (dt) {
  case FA_F32: merge_kernel<float><<<blocks, 256, 0, s>>>(*g); break;
  case FA_F64: merge_kernel<double><<<blocks, 256, 0, s>>>(*g); break;
  case FA_F16: merge_kernel<__half><<<blocks, 256, 0, s>>>(*g); break;
  case FA_BF16: merge_kernel<__nv_bfloat16><<<blocks, 256, 0, s>>>(*g); break;
  default: return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: merge_states on cuda takes f32, f64, f16 or bf16, got %s", fa_dtype_name(dt));
  }
  FA_CUDA_CHECK_LAUNCH(ctx, "merge_kernel");
  return FA_OK;
}
