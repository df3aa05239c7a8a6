/* The launchers of the mma.sync "flash" kernel (attention_mma.cuh), and
 * the choice between it and the Hopper kernel. */
#include "attention_mma.cuh"

#include <cstdio>

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
  case FA_KERNEL_WGMMA_TMA: return br == 128 && (D == 128 || D == 256) && (bc == wgmma_bc(D) || (D == 128 && bc == 176));
  case FA_KERNEL_MMA: return (D == 64 || D == 128) && br == 16 * MMA_WARPS(D) && bc == MMA_BC;
  case FA_KERNEL_F32: return fa_cuda_attention_f32_tile(FA_F32, D, D, &f_br, &f_bc) && br == f_br && bc == f_bc;
  default: return 0;
  }
}

extern "C" int fa_cuda_attention_kernel_fit(fa_attn_kernel kernel, fa_dtype dt, int64_t D, int64_t Dv, int64_t *br,
                                            int64_t *bc, char *why, size_t n) {
  const bool tma = kernel == FA_KERNEL_WGMMA_TMA, wg = kernel == FA_KERNEL_WGMMA || tma, f32 = kernel == FA_KERNEL_F32;
  const bool dims = D == Dv && (tma ? D == 128 || D == 256 : D == 64 || D == 128 || (wg && (D == 96 || D == 256)));
  if (f32 ? dt != FA_F32 : dt != FA_F16 && dt != FA_BF16)
    snprintf(why, n, "%s inputs; it takes %s", fa_dtype_name(dt), f32 ? "f32" : "f16 or bf16");
  else if (!dims)
    snprintf(why, n, "D = %lld, Dv = %lld; it takes D = Dv = %s", (long long)D, (long long)Dv,
             tma ? "128 or 256" : wg ? "64, 96, 128 or 256" : "64 or 128");
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

/* Which tensor-core kernel takes a call (f16/bf16, D = Dv of theirs, rows on
 * 16 bytes, one of their tiles): 2 the Hopper kernel, 1 the mma.sync
 * kernel, 0 neither; kernel: FA_KERNEL_AUTO, or WGMMA / MMA for that one
 * only.  The built-in rules and the run-time compiled variants
 * (attention_variant.cu) choose alike. */
extern "C" int fa_cuda_attention_tc_kernel(fa_attn_kernel kernel, const fa_attn_problem *p) {
  if (!tensor_core_fit(p->compute, p->D, p->Dv) || !attn_rows_aligned16(p)) return 0;
  if (kernel != FA_KERNEL_MMA && fa_cuda_attention_kernel_tile_ok(FA_KERNEL_WGMMA, p->D, p->tile_q, p->tile_k) &&
      fa_cuda_wgmma_usable())
    return 2;
  return kernel != FA_KERNEL_WGMMA && fa_cuda_attention_kernel_tile_ok(FA_KERNEL_MMA, p->D, p->tile_q, p->tile_k);
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
extern "C" int fa_cuda_attention_wgmma_tma_flash(fa_context *ctx, const fa_attn_problem *p, int automatic, int **v_flag,
                                                 fa_status *st);

extern "C" fa_status fa_cuda_attention_mma(fa_context *ctx, const fa_attn_problem *p, fa_attention_algo algo,
                                           fa_attn_kernel kernel, int **v_flag) {
  *v_flag = NULL;
  /* the warp-specialised kernel first (attention_wgmma_tma.cu: "flash" at D = 128 and 256) */
  if ((kernel == FA_KERNEL_WGMMA_TMA || kernel == FA_KERNEL_AUTO) && algo == FA_ATTN_FLASH && fa_cuda_wgmma_usable()) {
    fa_status st = FA_OK;
    if (fa_cuda_attention_wgmma_tma_flash(ctx, p, kernel == FA_KERNEL_AUTO, v_flag, &st)) return st;
  }
  if (kernel == FA_KERNEL_WGMMA_TMA) return FA_OK; /* declined: the caller says so */
  const int tc = fa_cuda_attention_tc_kernel(kernel, p);
  if (!tc) return FA_OK;
  /* the Hopper kernel's instances of two blocks an SM check V themselves (v_check_share) */
  if (tc == 2) return launch_fast_passes(ctx, p, algo, v_flag, fa_cuda_attention_wgmma, p->D == 64 && p->tile_k == 64);
  return launch_fast_passes(ctx, p, algo, v_flag, p->compute == FA_F16 ? mma_typed<__half> : mma_typed<__nv_bfloat16>);
}
