/* The backward pass on tensor cores for f16 and bf16 at D = Dv = 64 and
 * 128 (mma.sync.m16n8k16, f32 accumulation; ldmatrix and cp.async as the
 * forward's attention_mma.cu), in the schedule of attention_backward.cu:
 * delta first (there), then dK/dV by key tile and dQ by query tile, each
 * gradient element owned by one thread, no atomics.
 *
 * dK/dV: a block of 4 warps owns 64 keys of one (batch, KV head), a warp
 * 16 of them.  For each query tile of BR rows (every query head sharing
 * the KV head) it computes Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ with the keys as the
 * accumulators' rows, so that Pᵀ and dSᵀ repack in registers as the A
 * fragments of dV += Pᵀ·dO and dK += dSᵀ·Q (dO and Q read transposed by
 * ldmatrix.trans), FlashAttention-2's way of keeping P off shared memory.
 * dQ: a block of 4 warps owns 64 query rows, a warp 16; per key tile S =
 * Q·Kᵀ, dP = dO·Vᵀ, then dQ += dS·K.  P and dS go through bf16/f16 as
 * FlashAttention's do. */
#include "attention_backward_common.cuh"
#include "mma_sync.cuh"

#define BWM_WARPS 4
#define BWM_THREADS (BWM_WARPS * 32)
#define BWM_BC 64 /* keys a dK/dV block, and a dQ block's key tile */
#define BWM_BQ 64 /* query rows a dQ block */
/* query rows a dK/dV tile: Sᵀ and dPᵀ take BR / 2 registers each beside
 * the 2·D / 2 of dK and dV */
#define BWM_BR(D) ((D) == 128 ? 32 : 64)

/* acc[16 × 8·NC] += A·Bᵀ for the warp: A's 16 rows from row a0 of tile At,
 * B's 8·NC rows from row 0 of tile Bt (both D = 8·CH columns, the swz
 * layout), the k-steps over D. */
template <typename T, int CH, int NC>
static __device__ __forceinline__ void bwm_gemm_abt(float (*acc)[4], const char *At, int a0, const char *Bt) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < CH / 2; kk++) {
    uint32_t af[4];
    ldmatrix_x4(af, smem_addr(At + swz<CH>(a0 + (lane & 15), kk * 2 + (lane >> 4))));
#pragma unroll
    for (int n = 0; n < NC; n += 2) {
      uint32_t bf[4];
      const int row = n * 8 + (lane & 7) + ((lane >> 4) << 3);
      ldmatrix_x4(bf, smem_addr(Bt + swz<CH>(row, kk * 2 + ((lane >> 3) & 1))));
      mma16816<T>(acc[n], af, bf[0], bf[1]);
      mma16816<T>(acc[n + 1], af, bf[2], bf[3]);
    }
  }
}

/* acc[16 × D] += X·B for the warp: X the warp's 16 × 16·KS accumulators
 * (P or dS, repacked as A fragments in T), B rows 0..16·KS of tile Bt (D =
 * 8·CH columns, swz) read transposed. */
template <typename T, int CH, int KS>
static __device__ __forceinline__ void bwm_gemm_xb(float (*acc)[4], const float (*x)[4], const char *Bt) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
    const uint32_t xa[4] = {pack2<T>(x[2 * kk][0], x[2 * kk][1]), pack2<T>(x[2 * kk][2], x[2 * kk][3]),
                            pack2<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]), pack2<T>(x[2 * kk + 1][2], x[2 * kk + 1][3])};
#pragma unroll
    for (int d = 0; d < CH; d += 2) {
      uint32_t bf[4];
      ldmatrix_x4_trans(bf, smem_addr(Bt + swz<CH>(kk * 16 + (lane & 15), d + (lane >> 4))));
      mma16816<T>(acc[d], xa, bf[0], bf[1]);
      mma16816<T>(acc[d + 1], xa, bf[2], bf[3]);
    }
  }
}

template <typename T, int D, bool EXTRAS>
__global__ void __launch_bounds__(BWM_THREADS) bwm_dkdv_kernel(fa_attn_problem p, fa_attn_grads g, const float *delta) {
  constexpr int CH = D / 8, BR = BWM_BR(D), NC = BR / 8, QT = BR * D * 2; /* bytes of a Q or dO tile */
  extern __shared__ __align__(128) char bwm_smem[];
  __shared__ bwm_rows<BR> rows[2];
  char *Ks = bwm_smem, *Vs = Ks + BWM_BC * D * 2, *Qs = Vs + BWM_BC * D * 2; /* Q, dO, Q, dO: two stages */
  const int warp = threadIdx.x >> 5;
  const int64_t ktiles = (p.Lk + BWM_BC - 1) / BWM_BC, blk = blockIdx.x;
  const int64_t bhk = blk / ktiles, j0 = blk % ktiles * BWM_BC, b = bhk / p.Hkv, hk = bhk % p.Hkv;
  const int64_t j1 = min(j0 + BWM_BC, p.Lk);
  load_tile<T, D, BWM_BC, BWM_THREADS, false, false>(Ks, (const T *)p.k + attn_at(p.k_st, b, hk, 0), p.k_st.s, j0, p.Lk);
  load_tile<T, D, BWM_BC, BWM_THREADS, false, false>(Vs, (const T *)p.v + attn_at(p.v_st, b, hk, 0), p.v_st.s, j0, p.Lk);
  const bwm_qtiles qt = bwm_qtiles_meeting(p, b, hk, j0, j1, BR);
  /* stage s of tile t: its Q and dO tiles (cp.async, one commit group with
   * K and V for t = 0) and its rows (this thread's row r = tid < BR: *all
   * whether it takes every key of the block) */
  auto stage = [&](int64_t t, int s, bool *all) {
    bwm_stage_rows<T, D, BR, BWM_THREADS, false, D, !EXTRAS>(Qs + s * 2 * QT, QT, p, g, delta, rows[s], b,
                                                             qt.head(t), qt.row(t, BR), j0, j1, all);
  };
  bool all_next = true;
  if (qt.count > 0) stage(0, 0, &all_next);
  cp_async_commit();
  float dk[CH][4], dv[CH][4];
  bwm_zero<CH>(dk), bwm_zero<CH>(dv);
  for (int64_t t = 0; t < qt.count; t++) {
    const int s = (int)(t & 1);
    const bool all = all_next;
    if (t + 1 < qt.count) stage(t + 1, s ^ 1, &all_next); /* the next tile's copies fly while this one computes */
    cp_async_commit();
    cp_async_wait<1>();
    const bool full = __syncthreads_and(all) && !EXTRAS && j1 - j0 == BWM_BC; /* this tile's copies and rows are in */
    const char *Qt = Qs + s * 2 * QT, *dOt = Qt + QT;
    float sc[NC][4], dp[NC][4];
    bwm_zero<NC>(sc), bwm_zero<NC>(dp);
    bwm_gemm_abt<T, CH, NC>(sc, Ks, warp * 16, Qt);  /* Sᵀ = K·Qᵀ */
    bwm_gemm_abt<T, CH, NC>(dp, Vs, warp * 16, dOt); /* dPᵀ = V·dOᵀ */
    bwm_probs<true, NC, BR, EXTRAS, !EXTRAS>(p, b, qt.head(t), qt.row(t, BR), j0, 0, warp * 16, rows[s], full, sc, dp);
    bwm_gemm_xb<T, CH, BR / 16>(dv, sc, dOt); /* dV += Pᵀ·dO */
    bwm_gemm_xb<T, CH, BR / 16>(dk, dp, Qt);  /* dK += dSᵀ·Q */
    __syncthreads(); /* stage s is refilled by the next iteration */
  }
  cp_async_wait<0>(); /* no copy in flight at the exit (a block whose keys no row takes) */
  const int64_t r0 = (b * p.Hkv + hk) * p.Lk, j = j0 + warp * 16;
  bwm_store<T, CH>((T *)g.dk + r0 * D, j, p.Lk, dk);
  bwm_store<T, CH>((T *)g.dv + r0 * D, j, p.Lk, dv);
}

template <typename T, int D, bool EXTRAS>
__global__ void __launch_bounds__(BWM_THREADS) bwm_dq_kernel(fa_attn_problem p, fa_attn_grads g, const float *delta) {
  constexpr int CH = D / 8, NC = BWM_BC / 8, KT = BWM_BC * D * 2; /* bytes of a K or V tile */
  extern __shared__ __align__(128) char bwm_smem[];
  __shared__ bwm_rows<BWM_BQ> rows;
  char *Qs = bwm_smem, *dOs = Qs + BWM_BQ * D * 2, *Ks = dOs + BWM_BQ * D * 2; /* K, V, K, V: two stages */
  const int warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int64_t qtiles = (p.Lq + BWM_BQ - 1) / BWM_BQ, blk = blockIdx.x;
  const int64_t bh = blk / qtiles, i0 = (qtiles - 1 - blk % qtiles) * BWM_BQ; /* long causal tiles first */
  const int64_t b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
  load_tile<T, D, BWM_BQ, BWM_THREADS, false, false>(Qs, (const T *)p.q + attn_at(p.q_st, b, h, 0), p.q_st.s, i0, p.Lq);
  load_tile<T, D, BWM_BQ, BWM_THREADS, false, false>(dOs, (const T *)g.dout + attn_at(g.dout_st, b, h, 0), g.dout_st.s,
                                                      i0, p.Lq);
  int64_t t_lo, t_hi;
  bwm_tile_keys<BWM_BQ, !EXTRAS>(p, delta, rows, b, h, i0, &t_lo, &t_hi); /* the key ranges relative to key 0 too */
  const int64_t ntiles = (t_hi - t_lo + BWM_BC - 1) / BWM_BC;
  const T *k = (const T *)p.k + attn_at(p.k_st, b, hk, 0), *v = (const T *)p.v + attn_at(p.v_st, b, hk, 0);
  auto stage = [&](int64_t t, int s) {
    load_tile<T, D, BWM_BC, BWM_THREADS, false, false>(Ks + s * 2 * KT, k, p.k_st.s, t_lo + t * BWM_BC, p.Lk);
    load_tile<T, D, BWM_BC, BWM_THREADS, false, false>(Ks + s * 2 * KT + KT, v, p.v_st.s, t_lo + t * BWM_BC, p.Lk);
  };
  if (ntiles > 0) stage(0, 0);
  cp_async_commit(); /* with Q and dO */
  float dq[CH][4];
  bwm_zero<CH>(dq);
  for (int64_t t = 0; t < ntiles; t++) {
    const int s = (int)(t & 1);
    const int64_t j0 = t_lo + t * BWM_BC;
    if (t + 1 < ntiles) stage(t + 1, s ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    const bool all = tid >= BWM_BQ || (i0 + tid < p.Lq && rows.lse[tid] != -INFINITY && rows.lo[tid] <= j0 &&
                                       rows.hi[tid] >= j0 + BWM_BC);
    const bool full = __syncthreads_and(all) && !EXTRAS; /* this tile's copies are in */
    const char *Kt = Ks + s * 2 * KT, *Vt = Kt + KT;
    float sc[NC][4], dp[NC][4];
    bwm_zero<NC>(sc), bwm_zero<NC>(dp);
    bwm_gemm_abt<T, CH, NC>(sc, Qs, warp * 16, Kt);  /* S = Q·Kᵀ */
    bwm_gemm_abt<T, CH, NC>(dp, dOs, warp * 16, Vt); /* dP = dO·Vᵀ */
    bwm_probs<false, NC, BWM_BQ, EXTRAS, !EXTRAS>(p, b, h, i0, j0, warp * 16, 0, rows, full, sc, dp);
    bwm_gemm_xb<T, CH, BWM_BC / 16>(dq, dp, Kt); /* dQ += dS·K */
    __syncthreads(); /* stage s is refilled by the next iteration */
  }
  cp_async_wait<0>();
  bwm_store<T, CH>((T *)g.dq + bh * p.Lq * D, i0 + warp * 16, p.Lq, dq);
}

template <typename T, int D, bool EXTRAS>
static fa_status bwm_launch(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta) {
  const bw_launch_spec kv = {(const void *)bwm_dkdv_kernel<T, D, EXTRAS>,
                             p->B * p->Hkv * ((p->Lk + BWM_BC - 1) / BWM_BC), BWM_THREADS,
                             (size_t)(2 * BWM_BC + 4 * BWM_BR(D)) * D * 2, "bwm_dkdv_kernel"};
  const bw_launch_spec q = {(const void *)bwm_dq_kernel<T, D, EXTRAS>, p->B * p->Hq * ((p->Lq + BWM_BQ - 1) / BWM_BQ),
                            BWM_THREADS, (size_t)(2 * BWM_BQ + 4 * BWM_BC) * D * 2, "bwm_dq_kernel"};
  void *args[] = {(void *)p, (void *)g, (void *)&delta};
  return bw_launch_beside(ctx, kv, q, args);
}

/* The instance without the score rule's extras (masks, alibi, softcap)
 * for the calls that set none: less code in the key loop. */
template <typename T, int D>
static fa_status bwm_extras(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta) {
  if (attn_has_extras(p)) return bwm_launch<T, D, true>(ctx, p, g, delta);
  return bwm_launch<T, D, false>(ctx, p, g, delta);
}

extern "C" int fa_cuda_wgmma_usable(void);
extern "C" fa_status fa_cuda_attention_backward_wgmma(fa_context *ctx, const fa_attn_problem *p,
                                                      const fa_attn_grads *g, const float *delta);

/* Why the tensor-core kernel k (FA_KERNEL_WGMMA or FA_KERNEL_MMA) does not
 * take the call, or NULL: f16/bf16, D = Dv = 64 or 128 (and 96 for wgmma), rows of q, k, v, o
 * and dout on 16 bytes (their cp.async copies), and for wgmma a Hopper GPU
 * with sm_90a code in this build. */
extern "C" const char *fa_cuda_attention_backward_refuses(fa_attn_kernel k, const fa_attn_problem *p,
                                                           const fa_attn_grads *g) {
  if (p->compute != FA_F16 && p->compute != FA_BF16) return "it takes f16 or bf16 inputs";
  if (p->D != p->Dv || (p->D != 64 && p->D != 128 && (k != FA_KERNEL_WGMMA || p->D != 96)))
    return k == FA_KERNEL_WGMMA ? "it takes D = Dv = 64, 96 or 128" : "it takes D = Dv = 64 or 128";
  if (!attn_rows_aligned16(p) || !attn_rows_on16(g->dout, g->dout_st, 2))
    return "it needs the rows of q, k, v, o and dout on 16 bytes";
  if (k == FA_KERNEL_WGMMA && !fa_cuda_wgmma_usable()) return "it needs a Hopper GPU (sm_90) and sm_90a code in this build";
  return NULL;
}

/* Runs the call on the tensor-core kernel k: FA_KERNEL_WGMMA (Hopper's,
 * attention_backward_wgmma.cu) or FA_KERNEL_MMA (these); the caller has
 * checked that it takes the call (fa_cuda_attention_backward_refuses). */
extern "C" fa_status fa_cuda_attention_backward_mma(fa_context *ctx, fa_attn_kernel k, const fa_attn_problem *p,
                                                    const fa_attn_grads *g, const float *delta) {
  if (k == FA_KERNEL_WGMMA) return fa_cuda_attention_backward_wgmma(ctx, p, g, delta);
  if (p->compute == FA_F16)
    return p->D == 64 ? bwm_extras<__half, 64>(ctx, p, g, delta) : bwm_extras<__half, 128>(ctx, p, g, delta);
  return p->D == 64 ? bwm_extras<__nv_bfloat16, 64>(ctx, p, g, delta) : bwm_extras<__nv_bfloat16, 128>(ctx, p, g, delta);
}
