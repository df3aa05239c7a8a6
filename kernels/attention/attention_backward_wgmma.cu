/* The backward pass on Hopper tensor cores (sm_90a) for f16 and bf16 at
 * D = Dv = 64, 96 (held as 128 wide) and 128: the schedule of attention_backward_mma.cu with
 * warpgroup MMA (wgmma), whose operands come straight from shared memory
 * (the layout of the forward's attention_wgmma.cu: 128-byte rows,
 * XOR-swizzled, one 64-column block after the other), so that a tile
 * staged once serves a warpgroup's 64 rows without ldmatrix traffic.
 *
 * dK/dV: a block of one warpgroup owns 64 keys of one (batch, KV head).
 * Per query tile of 64 rows: Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ
 * (both operands in shared memory), the probabilities on the accumulators
 * (attention_backward_common.cuh), then dV += Pᵀ·dO and dK += dSᵀ·Q with
 * Pᵀ and dSᵀ repacked in registers as the A operands and dO, Q read
 * transposed from shared memory.  dQ: a block of one warpgroup owns 64
 * query rows; per key tile of 64, S = Q·Kᵀ, dP = dO·Vᵀ, dQ += dS·K.  The
 * next tile's copies fly while one is computed (two stages). */
#include "attention_backward_common.cuh"
#include "wgmma_ops.cuh"

/* One warpgroup a block, two blocks an SM, 64 keys (dK/dV) or query rows
 * (dQ) a block; tiles of 64 query rows (dK/dV) or keys (dQ).  Two
 * warpgroups a block (128 keys or rows, one block an SM) ran at 0.80-0.96x
 * (bf16 on an H200, 2026-11-27): the blocks of one warpgroup do not meet
 * at barriers, so one's softmax runs while the other's products are on the
 * tensor cores. */
#define BWG_THREADS 128 /* one warpgroup */
#define BWG_OWN 64      /* keys a dK/dV block, query rows a dQ block */
#define BWG_BR 64       /* query rows a dK/dV tile */
/* The width of the tiles in shared memory: D = 96 is held as 128 (whole
 * 64-column swizzle blocks, as the forward's attention_wgmma.cu does), its
 * last 32 columns zero, never stored. */
#define BWG_PAD(D) ((D) == 96 ? 128 : (D))
#define BWG_BC 64       /* keys a dQ tile */

/* The dynamic shared memory of each kernel (+ 1024: the swizzle wants
 * 1024-byte aligned tiles). */
static size_t bwg_smem_dkdv(int D) { return (size_t)(2 * BWG_OWN + 4 * BWG_BR) * D * 2 + 1024; }
static size_t bwg_smem_dq(int D) { return (size_t)(2 * BWG_OWN + 4 * BWG_BC) * D * 2 + 1024; }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* acc = A·Bᵀ over D (k-steps of 16): A the warpgroup's 64 rows at a_base of
 * a tile of AR rows, B the N rows of a tile at b_base; both K-major in the
 * swizzled layout (k-step ks reads 32 bytes into the 128-byte rows of
 * column block ks / 4).  Issued, not committed. */
template <typename T, int D, int N, int AR>
static __device__ __forceinline__ void bwg_abt(float *acc, uint32_t a_base, uint32_t b_base) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++)
    wgmma_ss<T, N>(acc, wgmma_desc(a_base + (ks >> 2) * AR * 128 + (ks & 3) * 32, 16, 1024),
                   wgmma_desc(b_base + (ks >> 2) * N * 128 + (ks & 3) * 32, 16, 1024), ks > 0);
}

/* X's accumulators (64 × 16·KS, P or dS) packed in T as wgmma's A
 * fragments, k-step kk in xa[kk]: done before the products are issued, so
 * that no register they read is written while they run. */
template <typename T, int KS>
static __device__ __forceinline__ void bwg_pack(uint32_t (*xa)[4], const float (*x)[4]) {
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
    xa[kk][0] = pack2<T>(x[2 * kk][0], x[2 * kk][1]), xa[kk][1] = pack2<T>(x[2 * kk][2], x[2 * kk][3]);
    xa[kk][2] = pack2<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]), xa[kk][3] = pack2<T>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
  }
}

/* acc += X·B: X packed by bwg_pack, B the 16·KS rows of a tile at b_base
 * read N-major (as the forward reads V): rows kk·16.. are 2048 bytes on,
 * column blocks 16·KS·128 bytes apart.  Issued, not committed. */
template <typename T, int D, int KS>
static __device__ __forceinline__ void bwg_xb(float *acc, const uint32_t (*xa)[4], uint32_t b_base) {
#pragma unroll
  for (int kk = 0; kk < KS; kk++) wgmma_rs_tb<T, D>(acc, xa[kk], wgmma_desc(b_base + kk * 2048, KS * 16 * 128, 1024), 1);
}

static __device__ __forceinline__ char *bwg_aligned(char *raw) {
  return raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
}
#endif

/* three blocks an SM at D = 64 without extras (168 registers, no spill):
 * 1.11-1.14x two (H200, 2026-11-27); the extras' instance spills there */
template <typename T, int DG, bool EXTRAS>
__global__ void __launch_bounds__(BWG_THREADS, DG == 64 && !EXTRAS ? 3 : 2)
    bwg_dkdv_kernel(fa_attn_problem p, fa_attn_grads g, const float *delta) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = BWG_PAD(DG), CH = D / 8, BR = BWG_BR, NC = BR / 8, QT = BR * D * 2; /* bytes of a Q or dO tile */
  constexpr int KEYS = BWG_OWN, THREADS = BWG_THREADS;
  extern __shared__ __align__(128) char bwg_raw[];
  __shared__ bwm_rows<BR> rows[2];
  char *Ks = bwg_aligned(bwg_raw), *Vs = Ks + KEYS * D * 2, *Qs = Vs + KEYS * D * 2; /* Q, dO, Q, dO */
  const int warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int64_t ktiles = (p.Lk + KEYS - 1) / KEYS, blk = blockIdx.x;
  const int64_t bhk = blk / ktiles, j0 = blk % ktiles * KEYS, b = bhk / p.Hkv, hk = bhk % p.Hkv;
  const int64_t j1 = min(j0 + KEYS, p.Lk);
  load_tile<T, D, KEYS, THREADS, true, false, DG>(Ks, (const T *)p.k + attn_at(p.k_st, b, hk, 0), p.k_st.s, j0, p.Lk);
  load_tile<T, D, KEYS, THREADS, true, false, DG>(Vs, (const T *)p.v + attn_at(p.v_st, b, hk, 0), p.v_st.s, j0, p.Lk);
  const bwm_qtiles qt = bwm_qtiles_meeting(p, b, hk, j0, j1, BR);
  auto stage = [&](int64_t t, int s, bool *all) {
    const int64_t h = qt.head(t), i0 = qt.row(t, BR);
    load_tile<T, D, BR, THREADS, true, false, DG>(Qs + s * 2 * QT, (const T *)p.q + attn_at(p.q_st, b, h, 0), p.q_st.s,
                                                  i0, p.Lq);
    load_tile<T, D, BR, THREADS, true, false, DG>(Qs + s * 2 * QT + QT, (const T *)g.dout + attn_at(g.dout_st, b, h, 0),
                                                  g.dout_st.s, i0, p.Lq);
    *all = true;
    if (tid < BR) bwm_row_load(p, delta, rows[s], b, h, i0, tid, j0, j1, all);
  };
  bool all_next = true;
  if (qt.count > 0) stage(0, 0, &all_next);
  cp_async_commit();
  float dk[CH][4], dv[CH][4];
  bwm_zero<CH>(dk), bwm_zero<CH>(dv);
  const uint32_t k_base = smem_addr(Ks), v_base = smem_addr(Vs);
  for (int64_t t = 0; t < qt.count; t++) {
    const int s = (int)(t & 1);
    const bool all = all_next;
    if (t + 1 < qt.count) stage(t + 1, s ^ 1, &all_next); /* the next tile's copies fly while this one computes */
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();
    const bool full = __syncthreads_and(all) && !EXTRAS && j1 - j0 == KEYS; /* this tile's copies and rows are in */
    const uint32_t q_base = smem_addr(Qs + s * 2 * QT), do_base = q_base + QT;
    float sc[NC][4], dp[NC][4];
    wgmma_fence();
    bwg_abt<T, DG, BR, KEYS>(&sc[0][0], k_base, q_base);  /* Sᵀ = K·Qᵀ */
    bwg_abt<T, DG, BR, KEYS>(&dp[0][0], v_base, do_base); /* dPᵀ = V·dOᵀ */
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<BR / 2>(&sc[0][0]);
    wgmma_hold<BR / 2>(&dp[0][0]);
    bwm_probs<true, NC, BR, EXTRAS>(p, b, qt.head(t), qt.row(t, BR), j0, 0, warp * 16, rows[s], full, sc, dp);
    uint32_t pa[BR / 16][4], da[BR / 16][4];
    bwg_pack<T, BR / 16>(pa, sc);
    bwg_pack<T, BR / 16>(da, dp);
    wgmma_hold<D / 2>(&dv[0][0]);
    wgmma_hold<D / 2>(&dk[0][0]);
    wgmma_fence();
    bwg_xb<T, D, BR / 16>(&dv[0][0], pa, do_base); /* dV += Pᵀ·dO */
    bwg_xb<T, D, BR / 16>(&dk[0][0], da, q_base);  /* dK += dSᵀ·Q */
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&dv[0][0]);
    wgmma_hold<D / 2>(&dk[0][0]);
    __syncthreads(); /* stage s is refilled by the next iteration */
  }
  cp_async_wait<0>(); /* no copy in flight at the exit (a block whose keys no row takes) */
  const int64_t r0 = (b * p.Hkv + hk) * p.Lk, j = j0 + warp * 16;
  bwm_store<T, CH, DG>((T *)g.dk + r0 * DG, j, p.Lk, dk);
  bwm_store<T, CH, DG>((T *)g.dv + r0 * DG, j, p.Lk, dv);
#endif
}

template <typename T, int DG, bool EXTRAS>
__global__ void __launch_bounds__(BWG_THREADS, 2)
    bwg_dq_kernel(fa_attn_problem p, fa_attn_grads g, const float *delta) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = BWG_PAD(DG), CH = D / 8, NC = BWG_BC / 8, KT = BWG_BC * D * 2; /* bytes of a K or V tile */
  constexpr int ROWS = BWG_OWN, THREADS = BWG_THREADS;
  extern __shared__ __align__(128) char bwg_raw[];
  __shared__ bwm_rows<ROWS> rows;
  char *Qs = bwg_aligned(bwg_raw), *dOs = Qs + ROWS * D * 2, *Ks = dOs + ROWS * D * 2; /* K, V, K, V */
  const int warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int64_t qtiles = (p.Lq + ROWS - 1) / ROWS, blk = blockIdx.x;
  const int64_t bh = blk / qtiles, i0 = (qtiles - 1 - blk % qtiles) * ROWS; /* long causal tiles first */
  const int64_t b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
  load_tile<T, D, ROWS, THREADS, true, false, DG>(Qs, (const T *)p.q + attn_at(p.q_st, b, h, 0), p.q_st.s, i0, p.Lq);
  load_tile<T, D, ROWS, THREADS, true, false, DG>(dOs, (const T *)g.dout + attn_at(g.dout_st, b, h, 0),
                                                      g.dout_st.s, i0, p.Lq);
  int64_t t_lo, t_hi;
  bwm_tile_keys(p, delta, rows, b, h, i0, &t_lo, &t_hi);
  const int64_t ntiles = (t_hi - t_lo + BWG_BC - 1) / BWG_BC;
  const T *k = (const T *)p.k + attn_at(p.k_st, b, hk, 0), *v = (const T *)p.v + attn_at(p.v_st, b, hk, 0);
  auto stage = [&](int64_t t, int s) {
    load_tile<T, D, BWG_BC, THREADS, true, false, DG>(Ks + s * 2 * KT, k, p.k_st.s, t_lo + t * BWG_BC, p.Lk);
    load_tile<T, D, BWG_BC, THREADS, true, false, DG>(Ks + s * 2 * KT + KT, v, p.v_st.s, t_lo + t * BWG_BC, p.Lk);
  };
  if (ntiles > 0) stage(0, 0);
  cp_async_commit(); /* with Q and dO */
  float dq[CH][4];
  bwm_zero<CH>(dq);
  const uint32_t q_base = smem_addr(Qs), do_base = smem_addr(dOs);
  for (int64_t t = 0; t < ntiles; t++) {
    const int s = (int)(t & 1);
    const int64_t j0 = t_lo + t * BWG_BC;
    if (t + 1 < ntiles) stage(t + 1, s ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    fence_proxy_async();
    const bool all = tid >= ROWS || (i0 + tid < p.Lq && rows.lse[tid] != -INFINITY && rows.lo[tid] <= j0 &&
                                         rows.hi[tid] >= j0 + BWG_BC);
    const bool full = __syncthreads_and(all) && !EXTRAS; /* this tile's copies are in */
    const uint32_t k_base = smem_addr(Ks + s * 2 * KT), v_base = k_base + KT;
    float sc[NC][4], dp[NC][4];
    wgmma_fence();
    bwg_abt<T, DG, BWG_BC, ROWS>(&sc[0][0], q_base, k_base);  /* S = Q·Kᵀ */
    bwg_abt<T, DG, BWG_BC, ROWS>(&dp[0][0], do_base, v_base); /* dP = dO·Vᵀ */
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<BWG_BC / 2>(&sc[0][0]);
    wgmma_hold<BWG_BC / 2>(&dp[0][0]);
    bwm_probs<false, NC, ROWS, EXTRAS>(p, b, h, i0, j0, warp * 16, 0, rows, full, sc, dp);
    uint32_t da[BWG_BC / 16][4];
    bwg_pack<T, BWG_BC / 16>(da, dp);
    wgmma_hold<D / 2>(&dq[0][0]);
    wgmma_fence();
    bwg_xb<T, D, BWG_BC / 16>(&dq[0][0], da, k_base); /* dQ += dS·K */
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&dq[0][0]);
    __syncthreads(); /* stage s is refilled by the next iteration */
  }
  cp_async_wait<0>();
  bwm_store<T, CH, DG>((T *)g.dq + bh * p.Lq * DG, i0 + warp * 16, p.Lq, dq);
#endif
}

template <typename T, int D, bool EXTRAS>
static fa_status bwg_launch(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta) {
  const size_t smem_kv = bwg_smem_dkdv(BWG_PAD(D)), smem_q = bwg_smem_dq(BWG_PAD(D));
  const int64_t kblocks = p->B * p->Hkv * ((p->Lk + BWG_OWN - 1) / BWG_OWN);
  const int64_t qblocks = p->B * p->Hq * ((p->Lq + BWG_OWN - 1) / BWG_OWN);
  fa_status st;
  if ((st = attn_grid_fits(ctx, kblocks)) || (st = attn_grid_fits(ctx, qblocks))) return st;
  cudaStream_t s = fa_cuda_stream(ctx);
  if (kblocks > 0) {
    FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(bwg_dkdv_kernel<T, D, EXTRAS>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_kv));
    bwg_dkdv_kernel<T, D, EXTRAS><<<(unsigned)kblocks, BWG_THREADS, smem_kv, s>>>(*p, *g, delta);
    FA_CUDA_CHECK_LAUNCH(ctx, "bwg_dkdv_kernel");
  }
  if (qblocks > 0) {
    FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(bwg_dq_kernel<T, D, EXTRAS>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_q));
    bwg_dq_kernel<T, D, EXTRAS><<<(unsigned)qblocks, BWG_THREADS, smem_q, s>>>(*p, *g, delta);
    FA_CUDA_CHECK_LAUNCH(ctx, "bwg_dq_kernel");
  }
  return FA_OK;
}

template <typename T, int D>
static fa_status bwg_typed(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta) {
  /* the instance without the score rule's extras (masks, alibi, softcap) for the calls that set none:
   * 2.2-2.5x faster than one instance with attn_score's code beside the plain path (H200, 2026-11-27) */
  if (attn_has_extras(p)) return bwg_launch<T, D, true>(ctx, p, g, delta);
  return bwg_launch<T, D, false>(ctx, p, g, delta);
}

/* f16/bf16, D = Dv = 64, 96 or 128, rows on 16 bytes (the caller checked),
 * on a GPU where fa_cuda_wgmma_usable. */
extern "C" fa_status fa_cuda_attention_backward_wgmma(fa_context *ctx, const fa_attn_problem *p,
                                                      const fa_attn_grads *g, const float *delta) {
  if (p->compute == FA_F16)
    return p->D == 64   ? bwg_typed<__half, 64>(ctx, p, g, delta)
           : p->D == 96 ? bwg_typed<__half, 96>(ctx, p, g, delta)
                        : bwg_typed<__half, 128>(ctx, p, g, delta);
  return p->D == 64   ? bwg_typed<__nv_bfloat16, 64>(ctx, p, g, delta)
         : p->D == 96 ? bwg_typed<__nv_bfloat16, 96>(ctx, p, g, delta)
                      : bwg_typed<__nv_bfloat16, 128>(ctx, p, g, delta);
}
