/* "flash" on Hopper in FP8 (e4m3) with per-block scales: the wgmma_fp8
 * kernel (issue 25), taken only when named (opts.kernel = "wgmma_fp8").
 *
 * Two kernels a call (attention_fp8.cu queues them):
 *  1. attn_fp8_quantize_kernel: every tile of 128 rows of Q (a query head)
 *     and of 128 keys of K and of V (a key head) into e4m3 with a scale of
 *     its own, amax / 448 (1 for a tile of zeros), so that the tile's
 *     largest magnitude lands on e4m3's largest finite value; a NaN or inf
 *     anywhere in q, k or v sets the call's flag instead, and the SIMT
 *     kernel behind computes the call exactly (attention_nonfinite.cuh).  V
 *     is written transposed (Vᵀ, rows of head dim, keys along a row),
 *     because wgmma reads 8-bit B operands K-major only, with the keys of
 *     every 16 in the order P's registers hold them (fp8_v_tile).
 *  2. attn_fp8_ws_kernel: the warp-specialised kernel's schedule
 *     (attention_wgmma_tma.cuh: a producer warpgroup brings Q, K and Vᵀ in
 *     by TMA, two consumer warpgroups own 64 query rows each; S(t) issued
 *     with P(t-1)·V(t-1) behind it) on e4m3 operands: S = Q·Kᵀ in four k-steps of 32, P·V
 *     in four; P rounded to e4m3 in registers.
 *
 * The scales: a key tile's S comes out in units of sQ·sK(t), which joins
 * the softmax scale in the exponent's multiplier (no pass over S).  V's
 * per-tile scale sV(t) goes into P: P'(j) = exp(s(j) + ln sV(t) - m'), with
 * m' the running maximum of s + ln sV over the tiles seen, so P' <= 1 (e4m3's
 * good range) and O' = Σ P'·V8 =
 * Σ exp(s - m')·V; the row's sum l' = Σ P'(j) / sV(t) = Σ exp(s - m') and
 * lse = m' + ln l', as for the other kernels.  Every step is the online
 * softmax of the other kernels; only the rounding of Q, K, V and P to e4m3
 * (3 mantissa bits) differs. */
#ifndef FA_KERNELS_ATTENTION_FP8_CUH
#define FA_KERNELS_ATTENTION_FP8_CUH

#include "attention_frag.cuh"
#include "attention_wgmma_tma.cuh"
#include "wgmma_fp8.cuh"
#include "wgmma_ops.cuh"

#define FP8_TILE 128 /* query rows, keys, and head dim (D = 128) of a tile */
#define FP8_THREADS 256
#define FP8_MAX 448.f /* e4m3's largest finite value */

/* The quantized operands of a call (attention_fp8.cu allocates them):
 * q8 (B·Hq heads of lq_pad rows of 128 bytes), k8 (B·Hkv heads of lk_pad
 * rows), v8t (B·Hkv heads of 128 rows of lk_pad bytes: Vᵀ), and the tiles'
 * scales sq (B·Hq × lq_pad / 128) and sk (B·Hkv × lk_pad / 128), and V's
 * as the key loop takes them, {ln sV, 1 / sV} (sv, B·Hkv × lk_pad / 128).
 * Rows past L are zeros. */
struct fp8_operands {
  uint8_t *q8, *k8, *v8t;
  float *sq, *sk;
  float2 *sv;
  int64_t lq_pad, lk_pad;
};

/* Their tensor maps (attention_fp8.cu): a row of 128 e4m3 is read as 64
 * 16-bit elements, so that the 128-byte swizzled boxes of the 16-bit
 * kernels (wt_encode_operand, tma_load_tile<64, 128>) carry them; Vᵀ's box
 * is 128 keys (64 such elements) of its 128 rows. */
struct fp8_maps {
  CUtensorMap q, k, vt;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The block's largest magnitude of amax (every thread's own), every thread
 * getting it; ws: 8 floats of shared memory. */
static __device__ __forceinline__ float fp8_block_max(float amax, float *ws) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  __syncthreads(); /* ws free from the last use */
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = amax;
  __syncthreads();
  float m = ws[0];
#pragma unroll
  for (int w = 1; w < FP8_THREADS / 32; w++) m = fmaxf(m, ws[w]);
  return m;
}

/* The tile's scale (amax / 448, 1 for zeros) and the factor its values are
 * multiplied by before rounding. */
static __device__ __forceinline__ float fp8_scale(float amax, float *inv) {
  *inv = amax > 0.f ? FP8_MAX / amax : 1.f;
  return amax > 0.f ? amax / FP8_MAX : 1.f;
}

/* The thread's largest magnitude of x[0..n), *bad set for a NaN or inf. */
template <int N> static __device__ __forceinline__ float fp8_amax(const float *x, bool *bad) {
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < N; i++) *bad |= !(fabsf(x[i]) <= 3.4028235e38f), amax = fmaxf(amax, fabsf(x[i]));
  return amax;
}

/* Tile t of 128 rows (L of the head's rows exist, each D = 128 elements
 * from src, rows ld apart; past L zeros) rounded into out's rows of 128
 * bytes, its scale into *scale: a thread takes rows (tid / 16) + 16·it,
 * columns 8·(tid % 16) to 8·(tid % 16) + 7. */
template <typename T>
static __device__ __forceinline__ void fp8_rows(const T *src, int64_t ld, int64_t t, int64_t L, uint8_t *out,
                                                float *scale, float *ws, bool *bad) {
  const int c = threadIdx.x & 15, r0 = threadIdx.x >> 4;
  float x[FP8_TILE / 16][8];
#pragma unroll
  for (int it = 0; it < FP8_TILE / 16; it++) {
    const int64_t row = t * FP8_TILE + r0 + 16 * it;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (row < L) raw = *(const uint4 *)(src + row * ld + 8 * c);
    const T *v = (const T *)&raw;
#pragma unroll
    for (int e = 0; e < 8; e++) x[it][e] = to_float(v[e]);
  }
  float inv;
  const float s = fp8_scale(fp8_block_max(fp8_amax<FP8_TILE / 16 * 8>(&x[0][0], bad), ws), &inv);
#pragma unroll
  for (int it = 0; it < FP8_TILE / 16; it++)
    *(uint2 *)(out + (r0 + 16 * it) * FP8_TILE + 8 * c) =
        make_uint2(e4m3x4(x[it][0] * inv, x[it][1] * inv, x[it][2] * inv, x[it][3] * inv),
                   e4m3x4(x[it][4] * inv, x[it][5] * inv, x[it][6] * inv, x[it][7] * inv));
  if (threadIdx.x == 0) *scale = s;
}

/* Key tile t of V (the head's rows from src, ld apart, L of them) as Vᵀ
 * into out (its 128 rows of head dim, rows ldo bytes apart, this tile's
 * 128 bytes of each), and V's scale as the key loop takes it, {ln sV,
 * 1 / sV}: a thread takes 16 keys by 4 columns, so that each half-run of
 * 16 keys is one 16-byte piece of a column's row, in the order P's A
 * fragment holds them: register r of lane (g, t) holds the accumulators of
 * keys 16·(r >> 1) + {2t, 2t + 1, 8 + 2t, 9 + 2t} as k-slots 16·(r >> 1) +
 * 4t + {0, 1, 2, 3}, so bytes 4w..4w+3 of a piece hold keys 2w, 2w + 1,
 * 8 + 2w, 9 + 2w, and P·V adds the right pairs without moving P. */
template <typename T>
static __device__ __forceinline__ void fp8_v_tile(const T *src, int64_t ld, int64_t t, int64_t L, uint8_t *out,
                                                  int64_t ldo, float2 *scale, float *ws, bool *bad) {
  const int dc = 4 * (threadIdx.x & 31), k0 = 16 * (threadIdx.x >> 5);
  float y[16][4];
#pragma unroll
  for (int j = 0; j < 16; j++) {
    const int64_t row = t * FP8_TILE + k0 + j;
    uint2 raw = make_uint2(0, 0);
    if (row < L) raw = *(const uint2 *)(src + row * ld + dc);
    const T *e = (const T *)&raw;
#pragma unroll
    for (int i = 0; i < 4; i++) y[j][i] = to_float(e[i]);
  }
  float inv;
  const float s = fp8_scale(fp8_block_max(fp8_amax<64>(&y[0][0], bad), ws), &inv);
  uint8_t *vo = out + dc * ldo + k0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    uint32_t w[4];
#pragma unroll
    for (int q = 0; q < 4; q++)
      w[q] = e4m3x4(y[2 * q][i] * inv, y[2 * q + 1][i] * inv, y[8 + 2 * q][i] * inv, y[9 + 2 * q][i] * inv);
    *(uint4 *)(vo + i * ldo) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  if (threadIdx.x == 0) *scale = make_float2(__logf(s), 1.f / s);
}
#endif

/* Blocks [0, B·Hq·nq): a tile of Q; then a tile of K and V each of the
 * B·Hkv·nk key tiles.  flag: set to 1 when q, k or v holds NaN or inf. */
template <typename T>
__global__ void __launch_bounds__(FP8_THREADS) attn_fp8_quantize_kernel(const attn_params p, const fp8_operands f,
                                                                        int *flag) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ float ws[FP8_THREADS / 32];
  const int64_t nq = f.lq_pad / FP8_TILE, nk = f.lk_pad / FP8_TILE, qblocks = p.B * p.Hq * nq;
  bool bad = false;
  if ((int64_t)blockIdx.x < qblocks) {
    const int64_t bh = blockIdx.x / nq, t = blockIdx.x % nq, b = bh / p.Hq, h = bh % p.Hq;
    fp8_rows((const T *)p.q + attn_at(p.q_st, b, h, 0), p.q_st.s, t, p.Lq,
             f.q8 + (bh * f.lq_pad + t * FP8_TILE) * FP8_TILE, f.sq + blockIdx.x, ws, &bad);
  } else {
    const int64_t blk = blockIdx.x - qblocks, bh = blk / nk, t = blk % nk, b = bh / p.Hkv, h = bh % p.Hkv;
    fp8_rows((const T *)p.k + attn_at(p.k_st, b, h, 0), p.k_st.s, t, p.Lk,
             f.k8 + (bh * f.lk_pad + t * FP8_TILE) * FP8_TILE, f.sk + blk, ws, &bad);
    fp8_v_tile((const T *)p.v + attn_at(p.v_st, b, h, 0), p.v_st.s, t, p.Lk,
               f.v8t + bh * FP8_TILE * f.lk_pad + t * FP8_TILE, f.lk_pad, f.sv + blk, ws, &bad);
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) atomicExch(flag, 1);
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* S = Q·Kᵀ of a key tile (committed, not waited for): four k-steps of 32
 * bytes into the 128-byte rows of the warpgroup's Q rows and the K tile. */
static __device__ __forceinline__ void fp8_qk_issue(float (*s)[4], uint32_t q_base, uint32_t k_base) {
  wgmma_fence();
  const uint64_t q = wgmma_desc(q_base, 16, 1024), k = wgmma_desc(k_base, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < FP8_TILE / 32; ks++)
    wgmma_e4m3_ss(&s[0][0], wgmma_desc_add(q, ks * 32), wgmma_desc_add(k, ks * 32), ks > 0);
  wgmma_commit();
}

/* O += P·V of a key tile (committed, not waited for): P's A fragments, Vᵀ's
 * tile (rows of head dim, the keys in fp8_v_tile's order) K-major. */
static __device__ __forceinline__ void fp8_pv_issue(float (*o)[4], const uint32_t (*pa)[4], uint32_t vt_base) {
  wgmma_hold<FP8_TILE / 2>(&o[0][0]);
  wgmma_fence();
  const uint64_t v = wgmma_desc(vt_base, 16, 1024);
#pragma unroll
  for (int kk = 0; kk < FP8_TILE / 32; kk++) wgmma_e4m3_rs(&o[0][0], pa[kk], wgmma_desc_add(v, kk * 32), 1);
  wgmma_commit();
}

/* P' (in s) as P·V's A fragments: register r of k-step kk takes the
 * accumulators of column blocks 4kk + 2(r >> 1) and the one after, row A
 * (r even) or B (r odd). */
static __device__ __forceinline__ void fp8_p_pack(uint32_t (*pa)[4], const float (*s)[4]) {
#pragma unroll
  for (int kk = 0; kk < FP8_TILE / 32; kk++)
#pragma unroll
    for (int r = 0; r < 4; r++) {
      const int n = 4 * kk + 2 * (r >> 1), e = 2 * (r & 1);
      pa[kk][r] = e4m3x4(s[n][e], s[n][e + 1], s[n + 1][e], s[n + 1][e + 1]);
    }
}

/* One key tile of the online softmax (raw e4m3 products in s): the key
 * range's columns (a tile not wholly inside every row's range), the rows'
 * maxima of s·c + ln sV(t) (c: the softmax scale times sQ·sK(t), > 0;
 * v: {ln sV(t), 1 / sV(t)}), P' = exp(s·c + ln sV(t) - m') in s, l' += Σ P' /
 * sV(t); *alphaA, *alphaB rescale O. */
static __device__ __forceinline__ void fp8_softmax_tile(float (*s)[4], frag_rows &r, bool full, int64_t j0, int c2,
                                                        float c, float2 v, float *alphaA, float *alphaB) {
  const float lnv = v.x, ivv = v.y;
  constexpr int NC = FP8_TILE / 8;
  if (!full) frag_mask_cols<NC>(s, frag_cols_of<NC>(r, j0), c2);
  /* four chains a row for the maxima and sums: with one this call took 1.02-1.04 x the time (bf16, D = 128,
   * L 1k-16k, two rounds in one H200 call, docs/perf/2026-12-03-fp8-dev-h200.json) */
  float mA = -INFINITY, mB = -INFINITY;
  frag_tile_max<NC, 4>(s, &mA, &mB);
  frag_rows_max(r, mA * c + lnv, mB * c + lnv, alphaA, alphaB); /* -inf stays -inf */
  const float nmA = r.mA, nmB = r.mB;
  const float offA = nmA == -INFINITY ? 0.f : (nmA - lnv) * FA_LOG2E;
  const float offB = nmB == -INFINITY ? 0.f : (nmB - lnv) * FA_LOG2E;
  float sumA, sumB;
  frag_exp_tile<NC, false, 4>(s, c * FA_LOG2E, offA, offB, &sumA, &sumB);
  r.lA = r.lA * *alphaA + sumA * ivv;
  r.lB = r.lB * *alphaB + sumB * ivv;
}

#endif

/* The warp-specialised form (the wgmma_tma kernel's, attention_wgmma_tma.cuh):
 * a block of three warpgroups a query tile; the producer's thread brings Q,
 * K(t) and Vᵀ(t) in by TMA through rings of two (wt_layout<64, 128>: an e4m3
 * tile of 128 x 128 is a 16-bit tile of 128 x 64), and the two consumer
 * warpgroups run the key loop, never meeting at a block barrier.  Taking
 * turns at the tensor cores (wt_turn_wait / wt_turn_pass, as D = 256's
 * 16-bit instances do) ran at 0.89-0.95 x this (bf16, D = 128, L 1k-16k,
 * two rounds each in one H200 call, docs/perf/2026-12-03-fp8-h200.json). */
template <typename T>
__global__ void __launch_bounds__(3 * 128, 1)
    attn_fp8_ws_kernel(const attn_params p, const fp8_operands f, const __grid_constant__ fp8_maps tm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  typedef wt_layout<64, FP8_TILE> LAYOUT;
  constexpr int NS = LAYOUT::NS, KB = LAYOUT::KB;
  const int v_bad = *p.v_nonfinite; /* NaN or inf in q, k or v: the SIMT kernel behind computes the call */
  extern __shared__ __align__(128) char fp8_ws_smem_raw[];
  const LAYOUT L(fp8_ws_smem_raw);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const frag_qtile<T, FP8_TILE, FP8_TILE> qt(p, blockIdx.x);
  const int64_t bh = qt.bh, b = qt.b, h = qt.h, i0 = qt.i0, hk = h / (p.Hq / p.Hkv);
  if (tid == 0) wt_init_barriers(L, false);
  int64_t t_lo, t_hi, all_lo, all_hi;
  tile_key_range<FP8_TILE>(p, b, i0, &t_lo, &t_hi, &all_lo, &all_hi); /* its barrier also publishes the mbarriers */
  t_lo -= t_lo % FP8_TILE; /* key tiles on the scales' tiles */
  const int ntiles = t_hi > t_lo ? (int)((t_hi - t_lo + FP8_TILE - 1) / FP8_TILE) : 0;
  if (leave_for_fallback(v_bad)) return;
  if (wg == 2) { /* the producer */
    warpgroup_regs_dec<24>();
    if (tid == 2 * 128) {
      const int ih = (int)hk, bi = (int)b, j = (int)t_lo;
      const wt_ring<NS> kr, vr;
      wt_load_q<64>(&tm.q, L.q, L.q_full(), (int)i0, (int)h, bi);
      if (ntiles > 0) wt_load_kv<64, FP8_TILE>(&tm.k, L.ks(), L.full_k(), L.empty_k(), kr, 0, j, ih, bi);
      for (int t = 0; t < ntiles; t++) {
        if (t + 1 < ntiles)
          wt_load_kv<64, FP8_TILE>(&tm.k, L.ks(), L.full_k(), L.empty_k(), kr, t + 1, j + (t + 1) * FP8_TILE, ih, bi);
        const int sb = t % NS; /* Vᵀ(t): keys [j + 128t, +128) are its columns */
        mbar_wait(L.empty_v() + 8 * sb, vr.parity(t) ^ 1);
        mbar_expect(L.full_v() + 8 * sb, KB);
        tma_load_4d(L.vs() + sb * KB, &tm.vt, (j + t * FP8_TILE) / 2, 0, ih, bi, L.full_v() + 8 * sb);
      }
    }
    return;
  }
  warpgroup_regs_inc<240>();
  const int g = lane >> 2, c2 = (lane & 3) * 2, rA = warp * 16 + g, rB = rA + 8;
  frag_rows r = frag_rows_start(p, b, i0, rA, rB);
  float o[FP8_TILE / 8][4];
#pragma unroll
  for (int d = 0; d < FP8_TILE / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  const int64_t nq = f.lq_pad / FP8_TILE, nk = f.lk_pad / FP8_TILE, bhk = b * p.Hkv + hk;
  const float cq = p.scale_f * f.sq[bh * nq + i0 / FP8_TILE];
  const float *sk = f.sk + bhk * nk + t_lo / FP8_TILE;
  const float2 *sv = f.sv + bhk * nk + t_lo / FP8_TILE;
  const uint32_t q_base = L.q + warpgroup_uniform() * 64 * FP8_TILE; /* uniform descriptors */
  const wt_ring<NS> kr, vr;
  float s[FP8_TILE / 8][4];
  uint32_t pa[FP8_TILE / 32][4];
  mbar_wait(L.q_full(), 0);
  for (int t = 0; t < ntiles; t++) {
    const int64_t j0 = t_lo + (int64_t)t * FP8_TILE;
    const int kb = t % NS;
    const float skt = sk[t];
    const float2 svt = sv[t];
    mbar_wait(L.full_k() + 8 * kb, kr.parity(t));
    fp8_qk_issue(s, q_base, L.ks() + kb * KB);
    if (t > 0) {
      const int vb = (t - 1) % NS;
      mbar_wait(L.full_v() + 8 * vb, vr.parity(t - 1));
      fp8_pv_issue(o, pa, L.vs() + vb * KB);
      wgmma_wait<1>();
    } else {
      wgmma_wait<0>();
    }
    wgmma_hold<FP8_TILE / 2>(&s[0][0]);
    if (lane == 0) mbar_arrive(L.empty_k() + 8 * kb); /* this warp's reads of K(t) are done */
    const bool full = j0 >= all_lo && j0 + FP8_TILE <= all_hi;
    float alphaA, alphaB;
    fp8_softmax_tile(s, r, full, j0, c2, cq * skt, svt, &alphaA, &alphaB);
    wgmma_wait<0>();
    wgmma_hold<FP8_TILE / 2>(&o[0][0]);
    if (t > 0 && lane == 0) mbar_arrive(L.empty_v() + 8 * ((t - 1) % NS));
    frag_rescale<FP8_TILE / 8>(o, alphaA, alphaB);
    fp8_p_pack(pa, s);
  }
  if (ntiles > 0) { /* the last tile's P·V */
    const int vb = (ntiles - 1) % NS;
    mbar_wait(L.full_v() + 8 * vb, vr.parity(ntiles - 1));
    fp8_pv_issue(o, pa, L.vs() + vb * KB);
    wgmma_wait<0>();
    wgmma_hold<FP8_TILE / 2>(&o[0][0]);
  }
  frag_store<T, FP8_TILE, false>(p, bh, qt.out(p), qt.lse(p), lane, r, o);
#endif
}

#endif
