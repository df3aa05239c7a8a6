/* Attention on the GPU: the tiled kernel behind "flash" and "two_pass",
 * and the seeds' one-row recurrence behind "flash_row".
 *
 * Tiled kernel: a block owns BR query rows of one (batch, head); key and
 * value tiles of Bc rows are staged in shared memory (as f32) and the
 * scores, the online rescaling and the output stay in registers.  Eight
 * warps each own BR/8 rows; within a warp, lane j scores key j of a 32-key
 * slice, and each lane accumulates every 32nd output column.  MODE_FLASH
 * is the one-pass online softmax; MODE_STATS and MODE_OUTPUT are the two
 * passes of "two_pass" (running (m, l) first, then the output with the
 * final statistics; the fast kernels have the same two passes).  Key
 * tiles outside every row's causal / window / kv_lens range are never
 * loaded.  "flash" runs here for the calls that
 * the faster kernels (attention_wgmma.cu, attention_mma.cu,
 * attention_f32.cu) do not take, and behind them when V holds NaN or inf. */
#include "attention_common.cuh"

extern "C" fa_status fa_cuda_attention_mma(fa_context *ctx, const fa_attn_problem *p, fa_attention_algo algo,
                                           fa_attn_kernel kernel, int **v_flag);
extern "C" fa_status fa_cuda_attention_f32(fa_context *ctx, const fa_attn_problem *p, fa_attention_algo algo,
                                           int **v_flag);

#define NWARPS 8
#define MAX_DV_PER_LANE 8 /* Dv up to 256 */

enum { MODE_FLASH = 0, MODE_STATS, MODE_OUTPUT };

template <typename T, int BR, int MODE>
static __device__ __forceinline__ void attn_tiled_block(const fa_attn_problem &p, int br, int Bc, int64_t blk) {
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
#pragma unroll
      for (int r = 0; r < R; r++) acc[r] = 0.f;
      if (j < n)
        for (int d = 0; d < D; d++) {
          float kv = Ks[j * DP + d];
#pragma unroll
          for (int r = 0; r < R; r++) acc[r] = fmaf(Qs[(warp * R + r) * D + d], kv, acc[r]);
        }
#pragma unroll
      for (int r = 0; r < R; r++) {
        const int rr = warp * R + r;
        const int64_t i = i0 + rr;
        float s = -INFINITY;
        if (j < n && i < lim) s = attn_score(p, b, h, i, j0 + j, acc[r], row_lo[rr], row_hi[rr]);
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
    if (p.lse && lane == 0) {
      float lr = MODE == MODE_OUTPUT ? stats[2 * row + 1] : l[r];
      attn_lse_at(p, b, h, i) = row_lse(m[r], lr);
    }
  }
}

/* "flash_row": the seeds' one-pass recurrence, one thread per query row,
 * keys and values read straight from device memory, no tiling. */
template <typename T> __global__ void attn_row_kernel(fa_attn_problem p) {
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
    float s = attn_score(p, b, h, i, j, dot, lo, hi);
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
  if (p.lse) attn_lse_at(p, b, h, i) = row_lse(m, d);
}

/* Query tile blocks blockIdx.x, blockIdx.x + gridDim.x, ... of nblk: one a
 * block, except as the fallback of the tensor-core kernels (p.v_nonfinite
 * set), launched with a grid of a few blocks per SM that returns at once
 * unless V holds NaN or inf. */
template <typename T, int BR, int MODE>
__global__ void __launch_bounds__(NWARPS * 32) attn_tiled_kernel(fa_attn_problem p, int br, int Bc, int64_t nblk) {
  if (p.v_nonfinite && !*p.v_nonfinite) return; /* not needed: the tensor cores have run */
  for (int64_t blk = blockIdx.x; blk < nblk; blk += gridDim.x) {
    attn_tiled_block<T, BR, MODE>(p, br, Bc, blk);
    __syncthreads(); /* its shared memory is the next one's */
  }
}

/* ---- launchers ---- */


/* The kernel instance for Br rows: the smallest of 8, 16, 32, 64, 128 that holds them. */
static int block_rows(int br) { return br <= 8 ? 8 : br <= 16 ? 16 : br <= 32 ? 32 : br <= 64 ? 64 : 128; }

static size_t tiled_smem(int br, int bc, int64_t D, int64_t Dv) {
  return sizeof(float) * (size_t)(br * D + bc * (D + 1) + bc * Dv);
}

/* The dynamic shared memory this file's kernel may ask for. */
static fa_status tiled_smem_max(fa_context *ctx, int *smem_max) {
  int dev = 0;
  FA_CUDA_CHECK(ctx, cudaGetDevice(&dev));
  FA_CUDA_CHECK(ctx, cudaDeviceGetAttribute(smem_max, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  *smem_max -= 4096; /* the kernel's static shared memory */
  return FA_OK;
}

/* A user's tile: any the SIMT kernel holds in shared memory, and the
 * default tile of the call (a tensor-core tile, which may be larger). */
extern "C" fa_status fa_cuda_attention_check_tile(fa_context *ctx, fa_dtype dt, int64_t D, int64_t Dv, int64_t br,
                                                  int64_t bc) {
  int smem_max = 0;
  int64_t def_br = 0, def_bc = 0;
  fa_cuda_attention_default_tile(dt, D, Dv, &def_br, &def_bc);
  if (br == def_br && bc == def_bc) return FA_OK;
  fa_status st = tiled_smem_max(ctx, &smem_max);
  if (st) return st;
  int ok_br = br >= 1 && br <= 128;
  if (Dv > 32 * MAX_DV_PER_LANE)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: attention on cuda: value head dimension Dv = %lld is above %d",
                   (long long)Dv, 32 * MAX_DV_PER_LANE);
  if (!ok_br || bc < 1 || bc > 256 || tiled_smem(block_rows((int)br), (int)bc, D, Dv) > (size_t)smem_max) {
    int64_t bc_max = 0;
    while (bc_max < 256 && tiled_smem(block_rows(ok_br ? (int)br : 1), (int)bc_max + 1, D, Dv) <= (size_t)smem_max)
      bc_max++;
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.tile: on cuda with D = %lld, Dv = %lld the valid tiles are 1 <= Br <= 128 and "
                   "1 <= Bc <= %lld (shared memory: %d bytes), and the default {%lld, %lld}; got {%lld, %lld}",
                   (long long)D, (long long)Dv, (long long)bc_max, smem_max, (long long)def_br, (long long)def_bc,
                   (long long)br, (long long)bc);
  }
  return FA_OK;
}

/* The tile of this file's kernel for a call whose tile (a tensor-core
 * kernel's) it cannot hold: the key tile halved down to 8, then the query
 * tile, until it fits. */
static fa_status simt_fit_tile(fa_context *ctx, fa_attn_problem *p) {
  int smem_max = 0;
  fa_status st = tiled_smem_max(ctx, &smem_max);
  while (!st && tiled_smem(block_rows((int)p->tile_q), (int)p->tile_k, p->D, p->Dv) > (size_t)smem_max && p->tile_q > 1) {
    if (p->tile_k > 8) p->tile_k /= 2;
    else p->tile_q /= 2;
  }
  return st;
}

template <typename T, int BR, int MODE>
static fa_status launch_tiled(fa_context *ctx, const fa_attn_problem *p) {
  int bc = (int)p->tile_k;
  size_t smem = tiled_smem(BR, bc, p->D, p->Dv);
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(attn_tiled_kernel<T, BR, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)smem));
  int br = (int)p->tile_q;
  int64_t blocks = p->B * p->Hq * ((p->Lq + br - 1) / br), grid = blocks;
  if (p->v_nonfinite) { /* a fallback: mostly not needed, so a grid that is cheap to launch */
    int dev = 0, sms = 0;
    FA_CUDA_CHECK(ctx, cudaGetDevice(&dev));
    FA_CUDA_CHECK(ctx, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    grid = min(blocks, (int64_t)sms * 2);
  }
  if (fa_status st = attn_grid_fits(ctx, grid)) return st;
  if (grid == 0) return FA_OK;
  attn_tiled_kernel<T, BR, MODE><<<(unsigned)grid, NWARPS * 32, smem, fa_cuda_stream(ctx)>>>(*p, br, bc, blocks);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_tiled_kernel");
  return FA_OK;
}

template <typename T, int MODE> static fa_status tiled_by_br(fa_context *ctx, const fa_attn_problem *p) {
  switch (block_rows((int)p->tile_q)) {
  case 8: return launch_tiled<T, 8, MODE>(ctx, p);
  case 16: return launch_tiled<T, 16, MODE>(ctx, p);
  case 32: return launch_tiled<T, 32, MODE>(ctx, p);
  case 64: return launch_tiled<T, 64, MODE>(ctx, p);
  default: return launch_tiled<T, 128, MODE>(ctx, p);
  }
}

/* Heads a group of the fast kernels' block order (frag_qtile): with causal
 * masks the tiles of a head differ in length, and taking a group's
 * longest first ends the grid on short ones (the tail of long blocks cost
 * up to a tenth at L = 1024).  f16/bf16: a group's keys and values are
 * kept to about half of L2, so that they are still read once from memory,
 * and the heads split into equal groups (the smallest divisor of B·Hq from
 * that size up to twice it): a short last group started its long tiles in
 * the grid's last wave (f16/bf16 2-6 % at L = 4096 and 16384).  f32: all
 * heads in one group, the longest tiles of the whole grid first; at a
 * tenth of the f16 rate its key/value reads stay far below the memory
 * bandwidth without L2 reuse (D = 128: +4 % at L = 1024, +9 % at L = 4096;
 * docs/perf/2026-11-22-attention-h200-run23.json). */
static fa_status schedule_heads(fa_context *ctx, const fa_attn_problem *p, int64_t *heads) {
  *heads = 1;
  if (p->causal == FA_CAUSAL_NONE) return FA_OK;
  const int64_t bh = p->B * p->Hq;
  if (p->compute == FA_F32) {
    *heads = bh;
    return FA_OK;
  }
  int dev = 0, l2 = 0;
  FA_CUDA_CHECK(ctx, cudaGetDevice(&dev));
  FA_CUDA_CHECK(ctx, cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
  const int64_t kv = p->Lk * (p->D + p->Dv) * 2;
  const int64_t fit = max((int64_t)1, min(bh, (int64_t)l2 / 2 / max(kv, (int64_t)1)));
  *heads = fit;
  for (int64_t g = fit; g <= min(bh, 2 * fit) && g < fit + 4096; g++) /* bounded: a host loop a call */
    if (bh % g == 0) {
      *heads = g;
      break;
    }
  return FA_OK;
}

/* "flash" or "two_pass" (p->row_stats set): the tensor-core kernels
 * (f16/bf16) or the register-tiled f32 kernel when the call fits, then this
 * file's kernel, which takes every call: alone when they did not fit, else
 * guarded by their flag (it runs only when V holds NaN or inf, for
 * two_pass only the output pass, on the statistics they wrote). */
template <typename T>
static fa_status tiled_typed(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel, const fa_attn_problem *in) {
  fa_attn_problem sched = *in;
  fa_status st = schedule_heads(ctx, in, &sched.sched_heads);
  if (st) return st;
  const fa_attn_problem *p = &sched;
  int *v_flag = NULL;
  /* the fast kernels: the one named, or (auto) the f32 kernel for f32,
   * else the tensor cores; a named "simt" runs alone */
  if (kernel == FA_KERNEL_F32 || (kernel == FA_KERNEL_AUTO && p->compute == FA_F32))
    st = fa_cuda_attention_f32(ctx, p, algo, &v_flag);
  else if (kernel != FA_KERNEL_SIMT)
    st = fa_cuda_attention_mma(ctx, p, algo, kernel, &v_flag);
  if (st) return st;
  if (!v_flag && kernel != FA_KERNEL_AUTO && kernel != FA_KERNEL_SIMT) /* checked before: operands off 16 bytes? */
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: opts.kernel: the kernel named declined the call on cuda");
  /* this file's kernel alone or behind them, with the call's tile where it
   * holds it, else a smaller one (the default tile is a tensor-core tile,
   * and a call they do not take, e.g. rows off 16 bytes, gets it too) */
  fa_attn_problem fallback = *p;
  fallback.v_nonfinite = v_flag;
  if ((st = simt_fit_tile(ctx, &fallback))) {
    fa_cuda_free(v_flag, sizeof(int));
    return st;
  }
  if (!v_flag && algo == FA_ATTN_TWO_PASS) {
    st = tiled_by_br<T, MODE_STATS>(ctx, &fallback);
    return st ? st : tiled_by_br<T, MODE_OUTPUT>(ctx, &fallback);
  }
  if (!v_flag) return tiled_by_br<T, MODE_FLASH>(ctx, &fallback);
  st = algo == FA_ATTN_TWO_PASS ? tiled_by_br<T, MODE_OUTPUT>(ctx, &fallback) : tiled_by_br<T, MODE_FLASH>(ctx, &fallback);
  fa_cuda_free(v_flag, sizeof(int)); /* stream-ordered: after the kernels */
  return st;
}

template <typename T>
static fa_status attention_typed(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel, const fa_attn_problem *p) {
  if (algo == FA_ATTN_FLASH_ROW) {
    int64_t rows = p->B * p->Hq * p->Lq, blocks = (rows + 127) / 128;
    attn_row_kernel<T><<<(unsigned)blocks, 128, 0, fa_cuda_stream(ctx)>>>(*p);
    FA_CUDA_CHECK_LAUNCH(ctx, "attn_row_kernel");
    return FA_OK;
  }
  if (algo != FA_ATTN_TWO_PASS) return tiled_typed<T>(ctx, algo, kernel, p);
  size_t bytes = sizeof(float) * 2 * (size_t)(p->B * p->Hq * p->Lq);
  void *stats = NULL;
  fa_status st = fa_cuda_malloc(ctx, &stats, bytes);
  if (st) return st;
  fa_attn_problem g = *p;
  g.row_stats = (float *)stats;
  st = tiled_typed<T>(ctx, algo, kernel, &g);
  fa_cuda_free(stats, bytes); /* stream-ordered: after both passes */
  return st;
}

extern "C" fa_status fa_cuda_attention_fused(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel,
                                             const fa_attn_problem *p) {
  switch (p->compute) {
  case FA_F32: return attention_typed<float>(ctx, algo, kernel, p);
  case FA_F16: return attention_typed<__half>(ctx, algo, kernel, p);
  case FA_BF16: return attention_typed<__nv_bfloat16>(ctx, algo, kernel, p);
  default:
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: attention on cuda takes f32, f16 or bf16, got %s",
                   fa_dtype_name(p->compute));
  }
}
