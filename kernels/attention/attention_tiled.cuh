/* The SIMT tiled kernel behind "flash" and "two_pass" on cuda
 * (attention.cu says when it runs).  A block owns BR query rows of one
 * (batch, head); key and value tiles of Bc rows are staged in shared
 * memory (as f32) and the scores, the online rescaling and the output stay
 * in registers.  Eight warps each own BR/8 rows; within a warp, lane j
 * scores key j of a 32-key slice, and each lane accumulates every 32nd
 * output column.  MODE_FLASH is the one-pass online softmax; MODE_STATS
 * and MODE_OUTPUT are the two passes of "two_pass" (running (m, l) first,
 * then the output with the final statistics; the fast kernels have the
 * same two passes).  Key tiles outside every row's causal / window /
 * kv_lens range are never loaded.  PROB: attn_params, or the run-time
 * compiled variants' problem (attention_variant.cuh), whose attn_rule
 * scores a key. */
#ifndef FA_KERNELS_ATTENTION_TILED_CUH
#define FA_KERNELS_ATTENTION_TILED_CUH

#include "attention_common.cuh"
#include "attention_dots.cuh"

#define NWARPS 8
#define MAX_DV_PER_LANE 8 /* Dv up to 256 */

enum { MODE_FLASH = 0, MODE_STATS, MODE_OUTPUT };

/* The chains of chained_dots (attention_dots.cuh) a row block of R rows
 * takes, by the registers (ptxas -v, CUDA 13.0): four chains spilled
 * 140-264 bytes at R = 16 and 20-52 at R = 2. */
template <int R> static constexpr __host__ __device__ int tiled_chains() { return R >= 16 ? 1 : R == 2 ? 2 : 4; }

template <typename T, int BR, int MODE, typename PROB>
static __device__ __forceinline__ void attn_tiled_block(const PROB &p, int br, int Bc, int64_t blk) {
  float *stats = p.row_stats; /* two_pass: (m, l) of every row */
  const int R = BR / NWARPS; /* BR >= br: the block computes br rows, the rest idle */
  extern __shared__ float smem[];
  __shared__ int64_t row_lo[BR], row_hi[BR];
  __shared__ int64_t tile_lo, tile_hi;
  const int D = (int)p.D, Dv = (int)p.Dv, DP = D + 1; /* K rows padded: lane j reads row j without conflicts */
  float *Qs = smem, *Ks = Qs + BR * D, *Vs = Ks + Bc * DP;
  const int64_t qtiles = (p.Lq + br - 1) / br;
  const int64_t bh = blk / qtiles, qt = qtiles - 1 - blk % qtiles; /* long causal tiles first */
  const int64_t b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv), i0 = qt * br;
  const int64_t lim = min(p.Lq, i0 + br); /* rows [i0, lim) are this block's */
  const T *q = (const T *)p.q + attn_at(p.q_st, b, h, 0);
  const T *k = (const T *)p.k + attn_at(p.k_st, b, hk, 0);
  const T *v = (const T *)p.v + attn_at(p.v_st, b, hk, 0);
  const int64_t qs = p.q_st.s, ks = p.k_st.s, vs = p.v_st.s; /* row strides */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  if (tid < BR) {
    int64_t lo = 0, hi = 0;
    if (i0 + tid < lim) fa_attn_range_of(&p, b, i0 + tid, &lo, &hi);
    row_lo[tid] = lo, row_hi[tid] = hi;
  }
  for (int idx = tid; idx < BR * D; idx += NWARPS * 32) {
    int64_t i = i0 + idx / D;
    Qs[idx] = i < lim ? to_float(q[i * qs + idx % D]) : 0.f;
  }
  __syncthreads();
  if (tid == 0) { /* the keys any row of the tile attends */
    int64_t lo = INT64_MAX, hi = 0;
    for (int r = 0; r < BR; r++)
      if (row_lo[r] < row_hi[r]) lo = min(lo, row_lo[r]), hi = max(hi, row_hi[r]);
    tile_lo = lo < hi ? lo : 0, tile_hi = lo < hi ? hi : 0;
  }
  __syncthreads();

  float m[R], l[R], o[R][MAX_DV_PER_LANE];
#pragma unroll
  for (int r = 0; r < R; r++) {
    m[r] = -INFINITY, l[r] = 0.f;
    int64_t i = i0 + warp * R + r;
    if (MODE == MODE_OUTPUT && i < lim) { /* the final (m, 1/l) of the row */
      m[r] = stats[2 * (bh * p.Lq + i)];
      float lr = stats[2 * (bh * p.Lq + i) + 1];
      l[r] = row_inv(lr);
    }
#pragma unroll
    for (int c = 0; c < MAX_DV_PER_LANE; c++) o[r][c] = 0.f;
  }

  for (int64_t j0 = tile_lo; j0 < tile_hi; j0 += Bc) {
    const int n = (int)min((int64_t)Bc, tile_hi - j0);
    __syncthreads(); /* the previous tile is no longer read */
    for (int idx = tid; idx < n * D; idx += NWARPS * 32)
      Ks[(idx / D) * DP + idx % D] = to_float(k[(j0 + idx / D) * ks + idx % D]);
    if (MODE != MODE_STATS)
      for (int idx = tid; idx < n * Dv; idx += NWARPS * 32) Vs[idx] = to_float(v[(j0 + idx / Dv) * vs + idx % Dv]);
    __syncthreads();
    for (int c0 = 0; c0 < n; c0 += 32) {
      const int j = c0 + lane, nj = min(32, n - c0);
      float acc[R];
      chained_dots<R, tiled_chains<R>()>(acc, Qs + warp * R * D, D, Ks + j * DP, j < n);
#pragma unroll
      for (int r = 0; r < R; r++) {
        const int rr = warp * R + r;
        const int64_t i = i0 + rr;
        float s = -INFINITY;
        if (j < n && i < lim) s = attn_rule<PROB>::score(p, b, h, i, j0 + j, acc[r], row_lo[rr], row_hi[rr]);
        float pj;
        if (MODE == MODE_OUTPUT) {
          pj = s == -INFINITY ? 0.f : expf(s - m[r]) * l[r];
        } else {
          float m_new = fmaxf(m[r], warp_max(s));
          float alpha = m_new == -INFINITY ? 1.f : expf(m[r] - m_new);
          pj = s == -INFINITY ? 0.f : expf(s - m_new);
          l[r] = l[r] * alpha + warp_sum(pj);
          m[r] = m_new;
          if (MODE == MODE_FLASH)
#pragma unroll
            for (int c = 0; c < MAX_DV_PER_LANE; c++) o[r][c] *= alpha;
        }
        if (MODE != MODE_STATS) {
          for (int jj = 0; jj < nj; jj++) {
            float pb = __shfl_sync(0xffffffffu, pj, jj);
            float sb = __shfl_sync(0xffffffffu, s, jj);
            if (sb == -INFINITY) continue; /* a masked key never touches the output (NaN in v stays out) */
            const float *vrow = Vs + (c0 + jj) * Dv;
#pragma unroll
            for (int c = 0; c < MAX_DV_PER_LANE; c++) {
              int col = c * 32 + lane;
              if (col < Dv) o[r][c] = fmaf(pb, vrow[col], o[r][c]);
            }
          }
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; r++) {
    const int64_t i = i0 + warp * R + r;
    if (i >= lim) continue;
    const int64_t row = bh * p.Lq + i;
    if (MODE == MODE_STATS) {
      if (lane == 0) stats[2 * row] = m[r], stats[2 * row + 1] = l[r];
      continue;
    }
    float inv = MODE == MODE_OUTPUT ? 1.f : row_inv(l[r]);
    T *orow = (T *)p.o + attn_at(p.o_st, b, h, i);
#pragma unroll
    for (int c = 0; c < MAX_DV_PER_LANE; c++) {
      int col = c * 32 + lane;
      if (col < Dv) orow[col] = from_float<T>(o[r][c] * inv);
    }
    if (attn_wants_lse(p) && lane == 0)
      attn_lse_store(p, attn_at(p.lse_st, b, h, i), m[r], MODE == MODE_OUTPUT ? stats[2 * row + 1] : l[r]);
  }
}

/* Query tile blocks blockIdx.x, blockIdx.x + gridDim.x, ... of nblk: one a
 * block, except as the fallback of the tensor-core kernels (p.v_nonfinite
 * set), launched with a grid of a few blocks per SM that returns at once
 * unless V holds NaN or inf. */
template <typename T, int BR, int MODE, typename PROB = attn_params>
__global__ void __launch_bounds__(NWARPS * 32) attn_tiled_kernel(PROB p, int br, int Bc, int64_t nblk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* as the guard, launched as a programmatic dependent of the fast kernel
   * (launch_tiled): its memory, the flag and outputs, once it is done
   * (nothing to wait for in a plain launch) */
  if (p.v_nonfinite) asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (p.v_nonfinite && !*p.v_nonfinite) return; /* not needed: the tensor cores have run */
  for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
    attn_tiled_block<T, BR, MODE, PROB>(p, br, Bc, blk);
    __syncthreads(); /* its shared memory is the next one's */
  }
}

/* "flash_row": the seeds' one-pass recurrence, one thread per query row,
 * keys and values read straight from device memory, no tiling; the score
 * rule of PROB (attn_rule: the built-in one, or a variant's, run-time
 * compiled: attention_variant.cuh). */
template <typename T, typename PROB = fa_attn_problem> __global__ void attn_row_kernel(PROB p) {
  const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= p.B * p.Hq * p.Lq) return;
  const int64_t i = row % p.Lq, bh = row / p.Lq, b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
  const int D = (int)p.D, Dv = (int)p.Dv;
  const T *q = (const T *)p.q + attn_at(p.q_st, b, h, i);
  const T *k = (const T *)p.k + attn_at(p.k_st, b, hk, 0);
  const T *v = (const T *)p.v + attn_at(p.v_st, b, hk, 0);
  const int64_t ks = p.k_st.s, vs = p.v_st.s;
  float o[256];
  for (int c = 0; c < Dv; c++) o[c] = 0.f;
  float m = -INFINITY, d = 0.f;
  int64_t lo, hi;
  fa_attn_range_of(&p, b, i, &lo, &hi);
  for (int64_t j = lo; j < hi; j++) {
    float dot = 0.f;
    for (int c = 0; c < D; c++) dot = fmaf(to_float(q[c]), to_float(k[j * ks + c]), dot);
    float s = attn_rule<PROB>::score(p, b, h, i, j, dot, lo, hi);
    if (s == -INFINITY) continue;
    /* a NaN score is dropped by fmaxf but reaches d and o through e */
    float m_new = fmaxf(m, s), alpha = m == -INFINITY ? 0.f : expf(m - m_new), e = expf(s - m_new);
    d = d * alpha + e;
    for (int c = 0; c < Dv; c++) o[c] = o[c] * alpha + e * to_float(v[j * vs + c]);
    m = m_new;
  }
  float inv = row_inv(d);
  T *orow = (T *)p.o + attn_at(p.o_st, b, h, i);
  for (int c = 0; c < Dv; c++) orow[c] = from_float<T>(o[c] * inv);
  if (attn_wants_lse(p)) attn_lse_store(p, attn_at(p.lse_st, b, h, i), m, d);
}

#ifndef __CUDACC_RTC__ /* the launchers' sizes (attention.cu, attention_variant.cu) */
/* The kernel instance for Br rows: the smallest of 8, 16, 32, 64, 128 that holds them. */
static inline int block_rows(int br) { return br <= 8 ? 8 : br <= 16 ? 16 : br <= 32 ? 32 : br <= 64 ? 64 : 128; }

static inline size_t tiled_smem(int br, int bc, int64_t D, int64_t Dv) {
  return sizeof(float) * (size_t)(br * D + bc * (D + 1) + bc * Dv);
}

/* The dynamic shared memory the SIMT kernel may ask for. */
static inline fa_status tiled_smem_max(fa_context *ctx, int *smem_max) {
  fa_cuda_props dp;
  if (fa_status st = fa_cuda_device_props(ctx, &dp)) return st;
  *smem_max = dp.smem_optin - 4096; /* the kernel's static shared memory */
  return FA_OK;
}

/* The SIMT kernel's grid over nblk query-tile blocks: all of them, or,
 * behind a fast kernel (fallback: it runs only when V holds NaN or inf,
 * mostly not), a few blocks an SM, cheap to launch. */
static inline fa_status tiled_grid(fa_context *ctx, int64_t nblk, bool fallback, int64_t *grid) {
  *grid = nblk;
  if (!fallback) return FA_OK;
  fa_cuda_props dp;
  if (fa_status st = fa_cuda_device_props(ctx, &dp)) return st;
  *grid = min(nblk, (int64_t)dp.sms * 2);
  return FA_OK;
}

/* Queues the SIMT kernel fn (the built-in instance, or a variant's) over
 * grid blocks with args and smem bytes of dynamic shared memory (set on
 * fn here).  As the guard behind a fast kernel (guard: it
 * reads the fast kernel's flag), a programmatic dependent launch where the
 * build has code for sm_90 or later (sm_80 code has no griddepcontrol):
 * its launch overlaps the fast kernel's end, whose blocks let it be placed
 * (griddepcontrol.launch_dependents), and its blocks wait at their start
 * for that kernel's memory (attn_tiled_kernel). */
static inline fa_status tiled_launch(fa_context *ctx, const void *fn, int64_t grid, size_t smem, void **args, bool guard,
                                     const char *what) {
  cudaError_t err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err != cudaSuccess) return fa_cuda_error(ctx, err, what);
  bool dependent = false;
  if (guard) {
    fa_cuda_props dp;
    if (fa_status st = fa_cuda_device_props(ctx, &dp)) return st;
    dependent = dp.sm90_code;
  }
  return fa_cuda_error(
      ctx, attn_launch(fn, dim3((unsigned)grid), dim3(NWARPS * 32), smem, fa_cuda_stream(ctx), args, dependent), what);
}

/* The tile of the SIMT kernel for a call whose tile (a tensor-core
 * kernel's) it cannot hold: the key tile halved down to 8, then the query
 * tile, until it fits. */
static inline fa_status simt_fit_tile(fa_context *ctx, attn_params *p) {
  int smem_max = 0;
  /* a fast kernel's tile may be taller than the largest instance (block_rows): the rows past
   * it would never be computed (a {192, 128} tile left NaN rows, H200 2026-11-28) */
  if (p->tile_q > 128) p->tile_q = 128;
  fa_status st = tiled_smem_max(ctx, &smem_max);
  while (!st && tiled_smem(block_rows((int)p->tile_q), (int)p->tile_k, p->D, p->Dv) > (size_t)smem_max && p->tile_q > 1) {
    if (p->tile_k > 8) p->tile_k /= 2;
    else p->tile_q /= 2;
  }
  return st;
}
#endif

#endif
