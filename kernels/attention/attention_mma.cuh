/* "flash" on tensor cores for f16 and bf16 (head dims 64 and 128): the
 * FlashAttention-2 schedule written with mma.sync.m16n8k16 (f32
 * accumulation), ldmatrix and cp.async.
 *
 * A block of 4 or 8 warps owns 64 or 128 query rows of one (batch, head);
 * each warp owns 16 rows, and every key and value tile staged in shared
 * memory serves them all.  Q stays in registers as mma A fragments.  Key and value
 * tiles of 64 rows are copied into shared memory asynchronously, two
 * buffers deep, so the next tile arrives while this one is computed.
 * S = Q·Kᵀ stays in registers; the score rule, the online max and the
 * rescaling run on those registers, and the probabilities are repacked as
 * the A fragments of O += P·V, as FlashAttention-2 does.  Shared memory
 * rows are XOR-swizzled in 16-byte chunks so that ldmatrix reads hit eight
 * different bank groups.  O leaves through the warp's rows of the Q tile,
 * a row at a time (frag_store_staged). */
#ifndef FA_KERNELS_ATTENTION_MMA_CUH
#define FA_KERNELS_ATTENTION_MMA_CUH

#include "attention_frag.cuh"
#include "mma_sync.cuh"

#define MMA_BC 64
/* warps per block: 8 (128 query rows) for D = 128, where sharing each key
 * and value tile among more rows pays; 4 (64 rows) for D = 64, where more,
 * smaller blocks fill the GPU better (measured on an H200) */
#define MMA_WARPS(D) ((D) == 128 ? 8 : 4)

/* PASS (attention_common.cuh): flash, or the statistics pass of two_pass
 * (no V tiles, no P·V) or its output pass (probabilities final, no
 * rescaling). */
template <typename T, int D, int EXTRAS, int PASS, bool DENSE = true, typename PROB = attn_params>
__global__ void __launch_bounds__(MMA_WARPS(D) * 32) attn_mma_kernel(PROB p) {
  const bool WITH_V = PASS != PASS_STATS;
  const int v_bad = WITH_V ? *p.v_nonfinite : 0; /* see leave_for_fallback */
  const int CH = D / 8, MMA_BR = 16 * MMA_WARPS(D);
  extern __shared__ __align__(128) char mma_smem[];
  char *Qs = mma_smem, *Ks = Qs + MMA_BR * D * 2, *Vs = Ks + 2 * MMA_BC * D * 2; /* K, V: two buffers each */

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const frag_qtile<T, D, MMA_BR> qt(p, blockIdx.x);
  const int64_t bh = qt.bh, b = qt.b, h = qt.h, i0 = qt.i0;
  const T *q = qt.q, *k = qt.k, *v = qt.v;
  const int64_t q_ld = p.q_st.s, k_ld = p.k_st.s, v_ld = p.v_st.s; /* row strides (API §6) */

  load_tile<T, D, MMA_BR, MMA_WARPS(D) * 32, false, DENSE>(Qs, q, q_ld, i0, p.Lq);
  cp_async_commit();
  const attn_keys<PROB, MMA_BR, EXTRAS> kept(p, b, h, i0); /* loaded here, used behind tile_key_range's barrier */
  int64_t t_lo, t_hi, all_lo, all_hi;
  tile_key_range<MMA_BR>(p, b, i0, &t_lo, &t_hi, &all_lo, &all_hi);
  kept.narrow(p, &t_lo, &t_hi);
  const bool scale_pos = frag_scale_positive(p);
  const int ntiles = (int)((t_hi - t_lo + MMA_BC - 1) / MMA_BC);
  if (ntiles > 0) {
    load_tile<T, D, MMA_BC, MMA_WARPS(D) * 32, false, DENSE>(Ks, k, k_ld, t_lo, t_hi);
    if (WITH_V) load_tile<T, D, MMA_BC, MMA_WARPS(D) * 32, false, DENSE>(Vs, v, v_ld, t_lo, t_hi);
  }
  cp_async_commit();
  if (leave_for_fallback(v_bad)) return;

  /* Q fragments: this warp's 16 rows, D/16 k-steps */
  cp_async_wait<1>();
  __syncthreads();
  uint32_t qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; kk++)
    ldmatrix_x4(qf[kk], smem_addr(Qs + swz<CH>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4))));

  const int g = lane >> 2, c2 = (lane & 3) * 2; /* accumulator row (and row + 8), column pair */
  const int rA = warp * 16 + g, rB = rA + 8;
  frag_rows r = frag_rows_start(p, b, i0, rA, rB);
  /* PASS_OUTPUT: the rows' final exponent offsets */
  const float offA = PASS == PASS_OUTPUT ? frag_stats_offset(p, bh, r.iA) : 0.f;
  const float offB = PASS == PASS_OUTPUT ? frag_stats_offset(p, bh, r.iB) : 0.f;
  float o[WITH_V ? D / 8 : 1][4];
#pragma unroll
  for (int d = 0; d < (WITH_V ? D / 8 : 1); d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;

  for (int t = 0; t < ntiles; t++) {
    const int64_t j0 = t_lo + (int64_t)t * MMA_BC;
    char *kt = Ks + (t & 1) * MMA_BC * D * 2, *vt = Vs + (t & 1) * MMA_BC * D * 2;
    if (t + 1 < ntiles) { /* the next tile into the other buffers */
      load_tile<T, D, MMA_BC, MMA_WARPS(D) * 32, false, DENSE>(Ks + ((t + 1) & 1) * MMA_BC * D * 2, k, k_ld, j0 + MMA_BC, t_hi);
      if (WITH_V)
        load_tile<T, D, MMA_BC, MMA_WARPS(D) * 32, false, DENSE>(Vs + ((t + 1) & 1) * MMA_BC * D * 2, v, v_ld, j0 + MMA_BC, t_hi);
    }
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();

    float s[MMA_BC / 8][4];
#pragma unroll
    for (int n = 0; n < MMA_BC / 8; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
      for (int n = 0; n < MMA_BC / 8; n += 2) {
        uint32_t bf[4];
        int key = n * 8 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(bf, smem_addr(kt + swz<CH>(key, kk * 2 + ((lane >> 3) & 1))));
        mma16816<T>(s[n], qf[kk], bf[0], bf[1]);
        mma16816<T>(s[n + 1], qf[kk], bf[2], bf[3]);
      }
    }

    const bool full = scale_pos && j0 >= all_lo && j0 + MMA_BC <= all_hi;
    if (PASS == PASS_OUTPUT) {
      frag_probs_tile<MMA_BC / 8, EXTRAS>(p, b, h, j0, c2, full, r, s, offA, offB);
    } else {
      float alphaA, alphaB;
      frag_softmax_tile<MMA_BC / 8, EXTRAS>(p, b, h, j0, c2, full, r, s, &alphaA, &alphaB);
      if (PASS == PASS_FLASH) frag_rescale<D / 8>(o, alphaA, alphaB);
    }

    /* O += P·V: S's accumulators of key columns 16kk..16kk+15 are P's A fragment */
#pragma unroll
    for (int kk = 0; kk < (WITH_V ? MMA_BC / 16 : 0); kk++) {
      uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                        pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int d = 0; d < D / 8; d += 2) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, smem_addr(vt + swz<CH>(kk * 16 + (lane & 15), d + (lane >> 4))));
        mma16816<T>(o[d], pa, bf[0], bf[1]);
        mma16816<T>(o[d + 1], pa, bf[2], bf[3]);
      }
    }
    __syncthreads(); /* this buffer is refilled two tiles on */
  }

  if (PASS == PASS_STATS) frag_stats_store(p, bh, lane, r);
  else frag_store_staged<T, D, PASS == PASS_OUTPUT, false, 0, 32>(p, bh, qt.out(p), qt.lse(p), i0, lane, r, o, Qs); /* the warp's Q rows */
}

#endif
