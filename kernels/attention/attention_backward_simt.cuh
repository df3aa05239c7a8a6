/* The backward's SIMT kernels (attention_backward.cu says how the backward
 * runs): dK and dV by key tile, dQ by query tile, a score at a time with
 * the rule of problem type PROB (attn_rule<PROB>::score_chain: the score
 * and its derivative by the dot product): the built-in rules'
 * fa_attn_problem there, fa_variant_problem in the attention variants'
 * run-time compiled units (API §9 and §10: score_mod's derivative,
 * attention_variant.cu).  bw_simt_plan: their launch's sizes. */
#ifndef FA_KERNELS_ATTENTION_BACKWARD_SIMT_CUH
#define FA_KERNELS_ATTENTION_BACKWARD_SIMT_CUH

#include "attention_backward_common.cuh"
#include "attention_dots.cuh"

#define BW_THREADS 256
#define BW_WARPS (BW_THREADS / 32)
#define BW_BR 32 /* query rows a tile */
#define BW_BC 32 /* keys a tile: a warp's lanes */

/* Rows [r0, r0 + ROWS) of one head's operand (rows ld elements apart, X
 * columns) as f32 into tile (rows pitch apart); rows at or past limit are
 * zeros. */
template <typename T, int ROWS>
static __device__ __forceinline__ void bw_stage(float *tile, int pitch, const T *src, int64_t ld, int64_t r0,
                                                int64_t limit, int X) {
  for (int idx = threadIdx.x; idx < ROWS * X; idx += BW_THREADS) {
    const int r = idx / X, c = idx - r * X;
    tile[r * pitch + c] = r0 + r < limit ? to_float(src[(r0 + r) * ld + c]) : 0.f;
  }
}

/* P and dS of the staged query tile (rows i0.., Qs rows D apart, dOs Dv)
 * against the staged key tile (keys j0.., Ks rows D + 1 apart, Vs Dv + 1:
 * lane c reads key c without bank conflicts): lane c takes key c, the
 * warps the rows.  Zeros where a row takes nothing from a key (outside its
 * range or the tensors, masked, or an empty row).  Ps (may be NULL) rows
 * ps apart, dSs rows dss apart. */
template <typename PROB>
static __device__ __forceinline__ void bw_probs(const PROB &p, int64_t b, int64_t h, int64_t i0, int64_t j0,
                                                const float *Qs, const float *dOs, const float *Ks, const float *Vs,
                                                const bwm_rows<BW_BR> &rows, float *Ps, int ps, float *dSs, int dss) {
  const int c = threadIdx.x & 31, D = (int)p.D, Dv = (int)p.Dv;
  const int64_t j = j0 + c;
  for (int r = threadIdx.x >> 5; r < BW_BR; r += BW_WARPS) {
    const int64_t i = i0 + r;
    float pr = 0.f, ds = 0.f;
    if (i < p.Lq && j < p.Lk && j >= rows.lo[r] && j < rows.hi[r] && rows.lse[r] != -INFINITY) {
      float dot, dp, chain = 1.f;
      chained_dots<1, 4>(&dot, Qs + r * D, D, Ks + c * (D + 1), true);
      chained_dots<1, 4>(&dp, dOs + r * Dv, Dv, Vs + c * (Dv + 1), true);
      const float s = attn_rule<PROB>::score_chain(p, b, h, i, j, dot, rows.lo[r], rows.hi[r], &chain);
      if (s != -INFINITY) { /* masked keys pass nothing back, whatever their values */
        pr = expf(s - rows.lse[r]);
        ds = pr * (dp - rows.delta[r]) * chain;
      }
    }
    if (Ps) Ps[r * ps + c] = pr;
    dSs[r * dss + c] = ds;
  }
}

/* dK, dV of keys [j0, j0 + BW_BC) of one (batch, KV head): lane c owns key
 * c, warp w the columns w, w + 8, ... (DMAX / 8 of each).  A weight of 0
 * (a masked pair) is skipped, so NaN or inf in q or dout reaches only the
 * keys its row attends.  only_if: NULL, or a flag (bw_guarded) without
 * which the kernel does nothing. */
template <typename T, int DMAX, typename PROB = fa_attn_problem>
__global__ void __launch_bounds__(BW_THREADS)
    bw_dkdv_kernel(PROB p, fa_attn_grads g, const float *delta, const int *only_if) {
  if (only_if && !*only_if) return;
  extern __shared__ float bw_smem[];
  __shared__ bwm_rows<BW_BR> rows;
  const int D = (int)p.D, Dv = (int)p.Dv;
  float *Ks = bw_smem, *Vs = Ks + BW_BC * (D + 1), *Qs = Vs + BW_BC * (Dv + 1), *dOs = Qs + BW_BR * D;
  float *Ps = dOs + BW_BR * Dv, *dSs = Ps + BW_BR * BW_BC;
  const int64_t ktiles = (p.Lk + BW_BC - 1) / BW_BC;
  for (int64_t blk = blockIdx.x; blk < p.B * p.Hkv * ktiles; blk += gridDim.x) {
    __syncthreads(); /* the last block's readers are done */
    const int64_t bhk = blk / ktiles, j0 = blk % ktiles * BW_BC, b = bhk / p.Hkv, hk = bhk % p.Hkv;
    const int64_t j1 = min(j0 + BW_BC, p.Lk);
    bw_stage<T, BW_BC>(Ks, D + 1, (const T *)p.k + attn_at(p.k_st, b, hk, 0), p.k_st.s, j0, p.Lk, D);
    bw_stage<T, BW_BC>(Vs, Dv + 1, (const T *)p.v + attn_at(p.v_st, b, hk, 0), p.v_st.s, j0, p.Lk, Dv);
    const bwm_qtiles qt = bwm_qtiles_meeting(p, b, hk, j0, j1, BW_BR); /* the query rows that meet these keys */
    const int c = threadIdx.x & 31, w = threadIdx.x >> 5;
    float dk[DMAX / 8], dv[DMAX / 8];
#pragma unroll
    for (int m = 0; m < DMAX / 8; m++) dk[m] = dv[m] = 0.f;
    for (int64_t t = 0; t < qt.count; t++) {
      const int64_t h = qt.head(t), i0 = qt.row(t, BW_BR);
      if (attn_rule<PROB>::tile_empty(p, b, h, i0, min(i0 + BW_BR, p.Lq) - 1, j0, j1 - 1)) continue; /* the block's */
      __syncthreads(); /* the last tile's readers are done */
      bool all;
      if (threadIdx.x < BW_BR) bwm_row_load(p, delta, rows, b, h, i0, threadIdx.x, j0, j1, &all);
      bw_stage<T, BW_BR>(Qs, D, (const T *)p.q + attn_at(p.q_st, b, h, 0), p.q_st.s, i0, p.Lq, D);
      bw_stage<T, BW_BR>(dOs, Dv, (const T *)g.dout + attn_at(g.dout_st, b, h, 0), g.dout_st.s, i0, p.Lq, Dv);
      __syncthreads();
      bw_probs(p, b, h, i0, j0, Qs, dOs, Ks, Vs, rows, Ps, BW_BC, dSs, BW_BC);
      __syncthreads();
      for (int r = 0; r < BW_BR; r++) {
        const float pr = Ps[r * BW_BC + c], ds = dSs[r * BW_BC + c];
        if (pr == 0.f && ds == 0.f) continue;
#pragma unroll
        for (int m = 0; m < DMAX / 8; m++) {
          const int d = w + 8 * m;
          if (d < Dv && pr != 0.f) dv[m] = fmaf(pr, dOs[r * Dv + d], dv[m]);
          if (d < D && ds != 0.f) dk[m] = fmaf(ds, Qs[r * D + d], dk[m]);
        }
      }
    }
    if (j0 + c < p.Lk) {
      const int64_t row = (b * p.Hkv + hk) * p.Lk + j0 + c;
      T *dkr = (T *)g.dk + row * D, *dvr = (T *)g.dv + row * Dv;
#pragma unroll
      for (int m = 0; m < DMAX / 8; m++) {
        const int d = w + 8 * m;
        if (d < D) dkr[d] = from_float<T>(dk[m]);
        if (d < Dv) dvr[d] = from_float<T>(dv[m]);
      }
    }
  }
}

/* bw_dq_kernel's blocks an SM: f32 at DMAX = 128, three (80 registers; left to itself, ptxas gives its four
 * chains of dot products 127 and two blocks: the f32 backward at D = 128 took 1.05x the time of one chain at
 * three blocks, now 1.02x; H100, docs/perf/2026-12-06-backward-pdl-h100.json); else 0, no bound (a bound of 1
 * let ptxas take 166 registers at DMAX = 64: 1.36x the time) */
#define BW_DQ_BLOCKS(T, DMAX) ((DMAX) == 128 && sizeof(T) == 4 ? 3 : 0)

/* dQ of rows [i0, i0 + BW_BR) of one (batch, head): lane r owns row r,
 * warp w the columns w, w + 8, ...; zero weights skipped (NaN or inf in k
 * reaches only the rows that attend its key), only_if as bw_dkdv_kernel's. */
template <typename T, int DMAX, typename PROB = fa_attn_problem>
__global__ void __launch_bounds__(BW_THREADS, BW_DQ_BLOCKS(T, DMAX))
    bw_dq_kernel(PROB p, fa_attn_grads g, const float *delta, const int *only_if) {
  if (only_if && !*only_if) return;
  extern __shared__ float bw_smem[];
  __shared__ bwm_rows<BW_BR> rows;
  const int D = (int)p.D, Dv = (int)p.Dv;
  float *Ks = bw_smem, *Vs = Ks + BW_BC * (D + 1), *Qs = Vs + BW_BC * (Dv + 1), *dOs = Qs + BW_BR * D;
  float *dSs = dOs + BW_BR * Dv; /* rows BW_BC + 1 apart: lane r reads row r without bank conflicts */
  const int64_t qtiles = (p.Lq + BW_BR - 1) / BW_BR;
  for (int64_t blk = blockIdx.x; blk < p.B * p.Hq * qtiles; blk += gridDim.x) {
    __syncthreads(); /* the last block's readers are done */
    const int64_t bh = blk / qtiles, i0 = blk % qtiles * BW_BR, b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
    bw_stage<T, BW_BR>(Qs, D, (const T *)p.q + attn_at(p.q_st, b, h, 0), p.q_st.s, i0, p.Lq, D);
    bw_stage<T, BW_BR>(dOs, Dv, (const T *)g.dout + attn_at(g.dout_st, b, h, 0), g.dout_st.s, i0, p.Lq, Dv);
    int64_t t_lo, t_hi;
    bwm_tile_keys(p, delta, rows, b, h, i0, &t_lo, &t_hi); /* a barrier: the tiles are in too */
    const T *k = (const T *)p.k + attn_at(p.k_st, b, hk, 0), *v = (const T *)p.v + attn_at(p.v_st, b, hk, 0);
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    float dq[DMAX / 8];
#pragma unroll
    for (int m = 0; m < DMAX / 8; m++) dq[m] = 0.f;
    for (int64_t j0 = t_lo; j0 < t_hi; j0 += BW_BC) {
      if (attn_rule<PROB>::tile_empty(p, b, h, i0, min(i0 + BW_BR, p.Lq) - 1, j0, min(j0 + BW_BC, p.Lk) - 1))
        continue; /* the block's */
      __syncthreads(); /* the last tile's readers are done */
      bw_stage<T, BW_BC>(Ks, D + 1, k, p.k_st.s, j0, p.Lk, D);
      bw_stage<T, BW_BC>(Vs, Dv + 1, v, p.v_st.s, j0, p.Lk, Dv);
      __syncthreads();
      bw_probs(p, b, h, i0, j0, Qs, dOs, Ks, Vs, rows, NULL, 0, dSs, BW_BC + 1);
      __syncthreads();
      for (int c = 0; c < BW_BC; c++) {
        const float ds = dSs[lane * (BW_BC + 1) + c];
        if (ds == 0.f) continue;
#pragma unroll
        for (int m = 0; m < DMAX / 8; m++) {
          const int d = w + 8 * m;
          if (d < D) dq[m] = fmaf(ds, Ks[c * (D + 1) + d], dq[m]);
        }
      }
    }
    if (i0 + lane < p.Lq) {
      T *dqr = (T *)g.dq + (bh * p.Lq + i0 + lane) * D;
#pragma unroll
      for (int m = 0; m < DMAX / 8; m++) {
        const int d = w + 8 * m;
        if (d < D) dqr[d] = from_float<T>(dq[m]);
      }
    }
  }
}

/* A launch of the two kernels: dynamic shared memory and blocks (a block a
 * tile; the caller may cap the grid, the kernels walk the rest), and DMAX,
 * the instance for the wider of D and Dv. */
struct bw_simt_plan {
  size_t smem_kv, smem_q;
  int64_t kblocks, qblocks;
  int dmax;
};
static inline bw_simt_plan bw_simt_plan_of(const fa_attn_problem *p) {
  const int64_t D = p->D, Dv = p->Dv, X = D > Dv ? D : Dv;
  const size_t kv = (size_t)(BW_BC * (D + 1) + BW_BC * (Dv + 1)) * 4, qo = (size_t)(BW_BR * D + BW_BR * Dv) * 4;
  bw_simt_plan pl;
  pl.smem_kv = kv + qo + 2 * BW_BR * BW_BC * 4, pl.smem_q = kv + qo + BW_BR * (BW_BC + 1) * 4;
  pl.kblocks = p->B * p->Hkv * ((p->Lk + BW_BC - 1) / BW_BC);
  pl.qblocks = p->B * p->Hq * ((p->Lq + BW_BR - 1) / BW_BR);
  pl.dmax = X <= 64 ? 64 : X <= 128 ? 128 : 256;
  return pl;
}

#ifndef __CUDACC_RTC__
/* The SIMT kernels' grids for plan pl's dK/dV and dQ tiles (checked to
 * fit a launch): all of them, or behind the guard's flag (only_if) four
 * blocks an SM that walk the tiles: with a block a tile, the launch and
 * exit of thousands of blocks cost about 1 % of a call at L = 1k when the
 * flag is clear. */
static inline fa_status bw_simt_grids(fa_context *ctx, const int *only_if, const bw_simt_plan &pl, unsigned *kgrid,
                                      unsigned *qgrid) {
  fa_status st = attn_grid_fits(ctx, pl.kblocks);
  if (st || (st = attn_grid_fits(ctx, pl.qblocks))) return st;
  int64_t cap = INT64_MAX;
  if (only_if) {
    fa_cuda_props dp;
    if ((st = fa_cuda_device_props(ctx, &dp))) return st;
    cap = 4 * (int64_t)dp.sms;
  }
  *kgrid = (unsigned)(pl.kblocks < cap ? pl.kblocks : cap), *qgrid = (unsigned)(pl.qblocks < cap ? pl.qblocks : cap);
  return FA_OK;
}

/* The launches of a backward call (attention_backward.cu's
 * fa_cuda_backward_run, which queues delta before them and the NaN/inf
 * guard around them): fast, the tensor-core kernel k on delta; simt, the
 * SIMT kernels (only_if: as bw_dkdv_kernel's).  The built-in instances, or
 * a variant's compiled ones (attention_variant.cu), user theirs. */
struct fa_bw_kernels {
  fa_status (*fast)(fa_context *ctx, fa_attn_kernel k, const fa_attn_problem *p, const fa_attn_grads *g,
                    const float *delta, void *user);
  fa_status (*simt)(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta,
                    const int *only_if, void *user);
  void *user;
};
extern "C" fa_status fa_cuda_backward_choose(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g,
                                             fa_attn_kernel last, fa_attn_kernel *k);
extern "C" fa_status fa_cuda_backward_run(fa_context *ctx, fa_attn_kernel k, const fa_attn_problem *p,
                                          const fa_attn_grads *g, const fa_bw_kernels *ks);
#endif

#endif
