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
#include "attention_frag.cuh"
#include "mma_sync.cuh"

#include <cstdio>

#define MMA_BC 64
/* warps per block: 8 (128 query rows) for D = 128, where sharing each key
 * and value tile among more rows pays; 4 (64 rows) for D = 64, where more,
 * smaller blocks fill the GPU better (measured on an H200) */
#define MMA_WARPS(D) ((D) == 128 ? 8 : 4)

/* PASS (attention_common.cuh): flash, or the statistics pass of two_pass
 * (no V tiles, no P·V) or its output pass (probabilities final, no
 * rescaling). */
template <typename T, int D, int EXTRAS, int PASS, bool DENSE = true>
__global__ void __launch_bounds__(MMA_WARPS(D) * 32) attn_mma_kernel(fa_attn_problem p) {
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
  int64_t t_lo, t_hi, all_lo, all_hi;
  tile_key_range<MMA_BR>(p, b, i0, &t_lo, &t_hi, &all_lo, &all_hi);
  const bool scale_pos = p.scale > 0;
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

template <typename T, int D, int EXTRAS, int PASS> static fa_status launch(fa_context *ctx, const fa_attn_problem *p) {
  const int MMA_BR = 16 * MMA_WARPS(D);
  const size_t smem = (size_t)(MMA_BR + 4 * MMA_BC) * D * 2;
  void (*kernel)(fa_attn_problem) = attn_rows_dense(p) ? attn_mma_kernel<T, D, EXTRAS, PASS, true>
                                                        : attn_mma_kernel<T, D, EXTRAS, PASS, false>;
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int64_t blocks = p->B * p->Hq * ((p->Lq + MMA_BR - 1) / MMA_BR);
  if (fa_status st = attn_grid_fits(ctx, blocks)) return st;
  kernel<<<(unsigned)blocks, MMA_WARPS(D) * 32, smem, fa_cuda_stream(ctx)>>>(*p);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_mma_kernel");
  return FA_OK;
}

template <typename T, int D, int EXTRAS> static fa_status launch_pass(fa_context *ctx, const fa_attn_problem *p, int pass) {
  if (pass == PASS_STATS) return launch<T, D, EXTRAS, PASS_STATS>(ctx, p);
  if (pass == PASS_OUTPUT) return launch<T, D, EXTRAS, PASS_OUTPUT>(ctx, p);
  return launch<T, D, EXTRAS, PASS_FLASH>(ctx, p);
}

template <typename T> static fa_status mma_typed(fa_context *ctx, const fa_attn_problem *p, int pass) {
  /* one instance with the whole rule (the kernel for GPUs before Hopper and for explicit tiles) */
  const bool x = attn_has_extras(p);
  if (p->D == 64) return x ? launch_pass<T, 64, EXTRAS_MASK>(ctx, p, pass) : launch_pass<T, 64, EXTRAS_NONE>(ctx, p, pass);
  return x ? launch_pass<T, 128, EXTRAS_MASK>(ctx, p, pass) : launch_pass<T, 128, EXTRAS_NONE>(ctx, p, pass);
}

extern "C" int fa_cuda_wgmma_usable(void);
extern "C" fa_status fa_cuda_attention_wgmma(fa_context *ctx, const fa_attn_problem *p, int pass);

/* f16/bf16 with D = Dv = 64 or 128 (both kernels), or 96 or 256 (wgmma only). */
static int tensor_core_fit(fa_dtype dt, int64_t D, int64_t Dv) {
  return (dt == FA_F16 || dt == FA_BF16) && D == Dv &&
         (D == 64 || D == 128 || ((D == 96 || D == 256) && fa_cuda_wgmma_usable()));
}

/* The wgmma kernel's default key tile: 64 at D = 64 (two blocks an SM,
 * run 7) and at D = 256 (the shared memory of one), else 128. */
static int64_t wgmma_bc(int64_t D) { return D == 64 || D == 256 ? 64 : 128; }

extern "C" int fa_cuda_attention_kernel_tile_ok(fa_attn_kernel kernel, int64_t D, int64_t br, int64_t bc) {
  int64_t f_br = 0, f_bc = 0;
  switch (kernel) {
  case FA_KERNEL_WGMMA: return br == 128 && (bc == wgmma_bc(D) || (D == 64 && bc == 128));
  case FA_KERNEL_MMA: return (D == 64 || D == 128) && br == 16 * MMA_WARPS(D) && bc == MMA_BC;
  case FA_KERNEL_F32: return fa_cuda_attention_f32_tile(FA_F32, D, D, &f_br, &f_bc) && br == f_br && bc == f_bc;
  default: return 0;
  }
}

extern "C" int fa_cuda_attention_kernel_fit(fa_attn_kernel kernel, fa_dtype dt, int64_t D, int64_t Dv, int64_t *br,
                                            int64_t *bc, char *why, size_t n) {
  const bool wg = kernel == FA_KERNEL_WGMMA, f32 = kernel == FA_KERNEL_F32;
  const bool dims = D == Dv && (D == 64 || D == 128 || (wg && (D == 96 || D == 256)));
  if (f32 ? dt != FA_F32 : dt != FA_F16 && dt != FA_BF16)
    snprintf(why, n, "%s inputs; it takes %s", fa_dtype_name(dt), f32 ? "f32" : "f16 or bf16");
  else if (!dims)
    snprintf(why, n, "D = %lld, Dv = %lld; it takes D = Dv = %s", (long long)D, (long long)Dv,
             wg ? "64, 96, 128 or 256" : "64 or 128");
  else if ((wg || f32) && !fa_cuda_wgmma_usable())
    snprintf(why, n, "it needs a Hopper GPU (sm_90) and sm_90a code in this build");
  else if (f32)
    return fa_cuda_attention_f32_tile(dt, D, Dv, br, bc);
  else if (wg)
    return *br = 128, *bc = wgmma_bc(D), 1;
  else
    return *br = 16 * MMA_WARPS(D), *bc = MMA_BC, 1;
  return 0;
}

/* The default tile of "flash" on cuda: the wgmma kernel's {128, wgmma_bc}
 * on Hopper, the mma.sync kernel's {16·warps, 64} elsewhere, for the calls
 * that fit tensor cores; the f32 kernel's {64, 32} for f32 at D = 64/128 on
 * Hopper; {64, 64} for the SIMT kernel. */
extern "C" void fa_cuda_attention_default_tile(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc) {
  *br = 64, *bc = 64;
  if (fa_cuda_attention_f32_tile(dt, D, Dv, br, bc)) return;
  if (!tensor_core_fit(dt, D, Dv)) return;
  if (fa_cuda_wgmma_usable()) *br = 128, *bc = wgmma_bc(D);
  else *br = 16 * MMA_WARPS(D), *bc = MMA_BC;
}

/* Queues algo ("flash", or "two_pass" with p->row_stats set) on tensor
 * cores (kernel: FA_KERNEL_AUTO either kernel, WGMMA or MMA only that
 * one) when the call fits (f16/bf16, D = Dv = 64 or 128, or 96 or 256 on
 * Hopper; 16-byte aligned rows) and the tile is one of theirs: {128,
 * wgmma_bc} on Hopper (wgmma; also {128, 128} at D = 64), {16·warps, 64}
 * (mma.sync, D = 64 or 128; 64 rows at D = 64, 128 at D = 128) on any
 * GPU.  Then *v_flag is a device flag (the caller frees
 * it), set on the stream when V holds NaN or inf: the kernel reading V has
 * then done nothing (or, where it checks V itself, part of its work), and
 * the caller's fallback, which skips masked keys, rewrites every output and
 * must run guarded by it (for two_pass, its output pass on the statistics
 * written here).  *v_flag stays NULL when the call does not fit. */
extern "C" fa_status fa_cuda_attention_mma(fa_context *ctx, const fa_attn_problem *p, fa_attention_algo algo,
                                           fa_attn_kernel kernel, int **v_flag) {
  *v_flag = NULL;
  if (!tensor_core_fit(p->compute, p->D, p->Dv)) return FA_OK;
  if (!attn_rows_aligned16(p)) return FA_OK;
  const int wg = kernel != FA_KERNEL_MMA &&
                 fa_cuda_attention_kernel_tile_ok(FA_KERNEL_WGMMA, p->D, p->tile_q, p->tile_k) && fa_cuda_wgmma_usable();
  const int sync = kernel != FA_KERNEL_WGMMA &&
                   fa_cuda_attention_kernel_tile_ok(FA_KERNEL_MMA, p->D, p->tile_q, p->tile_k);
  if (!wg && !sync) return FA_OK;
  /* the Hopper kernel's instances of two blocks an SM check V themselves (v_check_share) */
  if (wg) return launch_fast_passes(ctx, p, algo, v_flag, fa_cuda_attention_wgmma, p->D == 64 && p->tile_k == 64);
  return launch_fast_passes(ctx, p, algo, v_flag, p->compute == FA_F16 ? mma_typed<__half> : mma_typed<__nv_bfloat16>);
}
