/* "flash" on Hopper tensor cores (sm_90a) for f16 and bf16 at head dims 64
 * and 128: warpgroup MMA (wgmma) reading K and V straight from shared
 * memory.
 *
 * A block of two warpgroups (256 threads) owns 128 query rows of one
 * (batch, head); warpgroup w computes rows 64w..64w+63.  Q and the key and
 * value tiles of BC rows (128; 64 at D = 64 with tile {128, 64}, so that
 * two blocks share an SM and one's softmax overlaps the other's products)
 * live in shared memory in the layout wgmma reads (128-byte rows,
 * XOR-swizzled, one 64-column block after the other);
 * the next K and V tiles are copied asynchronously while one is computed.
 * S = Q·Kᵀ is one chain of D/16 wgmma over shared memory (Q from registers
 * at D = 64: wg_q_in_registers); the score rule and
 * the online softmax run on S's accumulators (the layout the mma.sync
 * kernel uses, so the code is shared: attention_frag.cuh); P is repacked in
 * registers as the A operand of O += P·V, whose B operand V is read
 * transposed from shared memory.  The product P·V of one tile runs on the
 * tensor cores while the softmax of the next is computed (FlashAttention-3's
 * intra-warpgroup overlap).  O leaves through the Q tile in shared memory,
 * a row at a time (frag_store_staged). */
#ifndef FA_KERNELS_ATTENTION_WGMMA_CUH
#define FA_KERNELS_ATTENTION_WGMMA_CUH

#include "attention_frag.cuh"
#include "wgmma_ops.cuh"

#define WG_BR 128
#define WG_THREADS 256

/* The width of the tiles in shared memory: whole 64-column (128-byte)
 * swizzle blocks; D = 96 is held as 128, its last 32 columns zero. */
#define WG_PAD(D) ((D) == 96 ? 128 : (D))

static __host__ __device__ inline size_t wgmma_smem_bytes(int D, int BC) { return (size_t)(WG_BR + 5 * BC) * WG_PAD(D) * 2 + 1024; /* + alignment */ }

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* Issues O += P·V for one key tile (committed, not waited for): the
 * accumulators of key columns 16kk..16kk+15 are P's A fragment kk; V's 16
 * rows kk·16.. are 2048 bytes on in every 64-column block (v_base: the
 * tile, read N-major). */
template <typename T, int D, int BC>
static __device__ __forceinline__ void pv_issue(float (*o)[4], uint32_t (*pa)[4], uint32_t v_base) {
  const int N = D < 128 ? D : 128; /* D = 256: two products of 128 columns (two column blocks each) */
  wgmma_hold<D / 2>(&o[0][0]);
  wgmma_fence();
  const uint64_t v = wgmma_desc(v_base, BC * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < BC / 16; kk++)
#pragma unroll
    for (int half = 0; half < D / N; half++)
      wgmma_rs_tb<T, N>(&o[half * N / 8][0], pa[kk], wgmma_desc_add(v, half * 2 * BC * 128 + kk * 2048), 1);
  wgmma_commit();
}

/* Issues S = Q·Kᵀ for one key tile (committed, not waited for): k-step ks
 * reads 32 bytes into the 128-byte rows of column block ks / 4 of the Q
 * tile (q_base: this warpgroup's 64 rows of BR) and the K tile. */
template <typename T, int D, int BR, int BC>
static __device__ __forceinline__ void qk_issue(float (*s)[4], uint32_t q_base, uint32_t k_base) {
  wgmma_fence();
  const uint64_t q = wgmma_desc(q_base, 16, 1024), k = wgmma_desc(k_base, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++) {
    const uint64_t da = wgmma_desc_add(q, (ks >> 2) * BR * 128 + (ks & 3) * 32);
    const uint64_t db = wgmma_desc_add(k, (ks >> 2) * BC * 128 + (ks & 3) * 32);
    wgmma_ss<T, BC>(&s[0][0], da, db, ks > 0);
  }
  wgmma_commit();
}

/* The same with Q in registers (qa: this warp's 16 rows as the A fragments
 * of the D / 16 k-steps), so that the tensor cores read only K from shared
 * memory: at D = 64 with key tiles of 64, A and B from shared memory (4 KB
 * a k-step in 32 cycles) took the whole of its 128 bytes a cycle. */
template <typename T, int D, int BC>
static __device__ __forceinline__ void qk_issue_rs(float (*s)[4], const uint32_t (*qa)[4], uint32_t k_base) {
  wgmma_fence();
  wgmma_rs_kmajor<T, D, BC>(&s[0][0], qa, k_base);
  wgmma_commit();
}

/* Whether S = Q·Kᵀ takes Q from registers (qk_issue_rs) in a kernel of
 * head dim D, key tiles of BC and score rule EXTRAS: where it was measured
 * faster (H200, docs/perf/2026-11-29-q-registers-h200.json): D = 64 with
 * tiles of 64, no rule or the score rules (+2-5 %; alibi and softcap +4-6 %).
 * Not with a mask tensor (its instances spilled 172 bytes where 112, 0.96 x),
 * nor at D = 128 (the persistent kernel's tiles of 128: 0.94-0.97 x at
 * L = 1024; of 176: 112-256 bytes of spills and serialised products). */
static constexpr __host__ __device__ bool wg_q_in_registers(int D, int BC, int EXTRAS) {
  return D == 64 && BC == 64 && (EXTRAS == EXTRAS_NONE || EXTRAS == EXTRAS_SCORE);
}

/* P (the probabilities of a tile, in S's accumulators) packed as the A
 * fragments of P·V. */
template <typename T, int BC> static __device__ __forceinline__ void p_pack(uint32_t (*pa)[4], const float (*s)[4]) {
#pragma unroll
  for (int kk = 0; kk < BC / 16; kk++) {
    pa[kk][0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]), pa[kk][1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pa[kk][3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}
#endif

/* PASS (attention_common.cuh): PASS_FLASH as above; PASS_STATS loads no V and
 * issues no P·V (one block of two warpgroups in less shared memory, two an
 * SM); PASS_OUTPUT turns each tile's scores into final probabilities with
 * the rows' (m, l) and accumulates O without rescaling. */
template <typename T, int D, int BC, int EXTRAS, int PASS, bool DENSE = true, typename PROB = attn_params>
__global__ void __launch_bounds__(WG_THREADS, PASS == PASS_STATS || (D == 64 && BC == 64) ? 2 : 1)
    attn_wgmma_kernel(PROB p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const bool WITH_V = PASS != PASS_STATS;
  const int DP = WG_PAD(D); /* S = Q·Kᵀ takes D / 16 k-steps; P·V runs on DP columns, O's past D unused */
  const int v_bad = WITH_V ? *p.v_nonfinite : 0; /* see leave_for_fallback */
  extern __shared__ __align__(128) char wg_smem_raw[];
  /* the swizzle is computed on address bits: blocks must be 1024-byte aligned */
  char *Qs = wg_smem_raw + ((1024 - (smem_addr(wg_smem_raw) & 1023)) & 1023);
  char *Ks = Qs + WG_BR * DP * 2, *Vs = Ks + 2 * BC * DP * 2; /* K: two buffers, V: three */

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const frag_qtile<T, D, WG_BR> qt(p, blockIdx.x);
  const int64_t bh = qt.bh, b = qt.b, h = qt.h, i0 = qt.i0;
  const T *q = qt.q, *k = qt.k, *v = qt.v;
  const int64_t q_ld = p.q_st.s, k_ld = p.k_st.s, v_ld = p.v_st.s; /* row strides (API §6) */

  load_tile<T, DP, WG_BR, WG_THREADS, true, DENSE, D>(Qs, q, q_ld, i0, p.Lq);
  cp_async_commit();
  const attn_keys<PROB, WG_BR, EXTRAS> kept(p, b, h, i0); /* loaded here, used behind tile_key_range's barrier */
  int64_t t_lo, t_hi, all_lo, all_hi;
  tile_key_range<WG_BR>(p, b, i0, &t_lo, &t_hi, &all_lo, &all_hi);
  kept.narrow(p, &t_lo, &t_hi);
  const int ntiles = (int)((t_hi - t_lo + BC - 1) / BC);
  if (ntiles > 0) {
    load_tile<T, DP, BC, WG_THREADS, true, DENSE, D>(Ks, k, k_ld, t_lo, t_hi);
    if (WITH_V) load_tile<T, DP, BC, WG_THREADS, true, DENSE, D>(Vs, v, v_ld, t_lo, t_hi);
  }
  cp_async_commit();
  if (leave_for_fallback(v_bad)) return;
  settle_copies_without_keys(ntiles); /* the output is staged through Q's tile */
  constexpr bool Q_REGS = wg_q_in_registers(D, BC, EXTRAS);
  uint32_t qa[Q_REGS ? D / 16 : 1][4];
  if constexpr (Q_REGS) {
    if (ntiles > 0) {
      cp_async_wait<1>(); /* Q's group; the first key tile's stays in flight */
      __syncthreads();
    }
    sw128_a_frags<D, WG_BR>(qa, Qs, warp * 16, lane);
  }

  const int g = lane >> 2, c2 = (lane & 3) * 2;
  const int rA = warp * 16 + g, rB = rA + 8;
  frag_rows r = frag_rows_start(p, b, i0, rA, rB);
  /* PASS_OUTPUT: the rows' final exponent offsets */
  const float offA = PASS == PASS_OUTPUT ? frag_stats_offset(p, bh, r.iA) : 0.f;
  const float offB = PASS == PASS_OUTPUT ? frag_stats_offset(p, bh, r.iB) : 0.f;
  const bool scale_pos = frag_scale_positive(p);
  float o[WITH_V ? DP / 8 : 1][4];
#pragma unroll
  for (int d = 0; d < (WITH_V ? DP / 8 : 1); d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  /* this warpgroup's 64 rows; the two-pass instances' Q descriptors on the uniform datapath (warp_uniform of wg, the
   * code the oracle checked): 0.95-0.97 x their time at D = 128 not causal.  The one-pass instances ran 0.5-1.2 %
   * slower so at D = 128 and keep warp >> 2 (H100, 2026-12-07, docs/perf/2026-12-07-uniform-descriptors-h100.json). */
  const int q_wg = PASS == PASS_FLASH ? wg : (int)warp_uniform(wg);
  const uint32_t q_base = smem_addr(Qs) + q_wg * 64 * 128;
  float s[BC / 8][4];
  uint32_t pa[WITH_V ? BC / 16 : 1][4]; /* P of the previous tile, as A fragments */
  /* the copies of tiles 1, 2, ... (one stream for K and V when DENSE); the rows of the last tile */
  tile_stream<T, DP, BC, WG_THREADS, DENSE, D> k_next(k_ld, t_lo + BC), v_next(v_ld, t_lo + BC);
  const int last_rows = ntiles > 0 ? (int)(t_hi - t_lo - (int64_t)(ntiles - 1) * BC) : 0;

  /* Tile t: S_t = Q·K_tᵀ is issued with O += P_{t-1}·V_{t-1} behind it; the
   * softmax of S_t runs while the second product is on the tensor cores,
   * and O is rescaled once it is done.  One barrier a tile: after it, every
   * warpgroup is past tile t - 1, so K buffer (t+1)%2 and V buffer (t+1)%3
   * are free for tile t + 1, whose copy overlaps this tile's work. */
  for (int t = 0; t < ntiles; t++) {
    const int64_t j0 = t_lo + (int64_t)t * BC;
    cp_async_wait<0>();
    fence_proxy_async();
    __syncthreads();

    if constexpr (Q_REGS) qk_issue_rs<T, D, BC>(s, qa, smem_addr(Ks + (t & 1) * BC * DP * 2));
    else qk_issue<T, D, WG_BR, BC>(s, q_base, smem_addr(Ks + (t & 1) * BC * DP * 2));
    /* the next tile's copies, issued behind the products so that the tensor
     * cores start right after the barrier (other buffers: K (t+1)%2, V
     * (t+1)%3); without a branch, which would make ptxas serialise the
     * products: past the last tile the rows are all zero-filled */
    const int next_rows = t + 2 < ntiles ? BC : t + 2 == ntiles ? last_rows : 0;
    k_next.copy(Ks + ((t + 1) & 1) * BC * DP * 2, k, next_rows);
    if (WITH_V) (DENSE ? k_next : v_next).copy(Vs + ((t + 1) % 3) * BC * DP * 2, v, next_rows);
    k_next.step();
    if (!DENSE) v_next.step();
    cp_async_commit();
    if (WITH_V && t > 0) pv_issue<T, DP, BC>(o, pa, smem_addr(Vs + ((t - 1) % 3) * BC * DP * 2));
    if (WITH_V && t > 0) wgmma_wait<1>();
    else wgmma_wait<0>();
    wgmma_hold<BC / 2>(&s[0][0]);

    const bool full = scale_pos && j0 >= all_lo && j0 + BC <= all_hi;
    float alphaA = 1.f, alphaB = 1.f;
    if (PASS == PASS_OUTPUT) {
      frag_probs_tile<BC / 8, EXTRAS>(p, b, h, j0, c2, full, r, s, offA, offB);
    } else {
      frag_softmax_tile<BC / 8, EXTRAS, false, D == 128>(p, b, h, j0, c2, full, r, s, &alphaA, &alphaB);
    }
    if (!WITH_V) continue;

    wgmma_wait<0>();
    wgmma_hold<DP / 2>(&o[0][0]);
    if (PASS == PASS_FLASH) frag_rescale<DP / 8>(o, alphaA, alphaB);
    p_pack<T, BC>(pa, s);
  }
  if (PASS == PASS_STATS) {
    frag_stats_store(p, bh, lane, r);
    return;
  }
  if (ntiles > 0) { /* the last tile's P·V */
    pv_issue<T, DP, BC>(o, pa, smem_addr(Vs + ((ntiles - 1) % 3) * BC * DP * 2));
    wgmma_wait<0>();
    wgmma_hold<DP / 2>(&o[0][0]);
  }

  /* through Q's rows, but at D = 96, where that made the key loop's code 8 % slower at every L (run 28's d96_probe) */
  if constexpr (D == 96) frag_store<T, D, PASS == PASS_OUTPUT>(p, bh, qt.out(p), qt.lse(p), lane, r, o);
  else frag_store_staged<T, D, PASS == PASS_OUTPUT, true, WG_BR, 128>(p, bh, qt.out(p), qt.lse(p), i0, lane, r, o, Qs);
  v_check_share<T, D, WG_BR>(p, v, i0);
#endif
}

#endif
