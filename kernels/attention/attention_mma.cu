/* The launchers of the mma.sync "flash" kernel (attention_mma.cuh) and
 * its registry entry. */
#include "attention_mma.cuh"
#include "attention_nonfinite.cuh"
#include "attention_registry.h"

template <typename T, int D, int EXTRAS, int PASS> static fa_status launch(fa_context *ctx, const attn_params *p) {
  const int MMA_BR = 16 * MMA_WARPS(D);
  const size_t smem = (size_t)(MMA_BR + 4 * MMA_BC) * D * 2;
  void (*kernel)(attn_params) = attn_rows_dense(p) ? attn_mma_kernel<T, D, EXTRAS, PASS, true>
                                                        : attn_mma_kernel<T, D, EXTRAS, PASS, false>;
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int64_t blocks = p->B * p->Hq * ((p->Lq + MMA_BR - 1) / MMA_BR);
  if (fa_status st = attn_grid_fits(ctx, blocks)) return st;
  kernel<<<(unsigned)blocks, MMA_WARPS(D) * 32, smem, fa_cuda_stream(ctx)>>>(*p);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_mma_kernel");
  return FA_OK;
}

/* one instance with the whole rule, masks and all (the kernel for GPUs
 * before Hopper and for explicit tiles), and one without */
template <typename T> static fa_status mma_typed(fa_context *ctx, const attn_params *p, int pass) {
  return attn_instance<64, 128>((int)p->D, [&](auto d) {
    return attn_instance<EXTRAS_MASK, EXTRAS_NONE>(attn_has_extras(p) ? EXTRAS_MASK : EXTRAS_NONE, [&](auto x) {
      return attn_instance<PASS_STATS, PASS_OUTPUT, PASS_FLASH>(pass, [&](auto ps) {
        return launch<T, decltype(d)::value, decltype(x)::value, decltype(ps)::value>(ctx, p);
      });
    });
  });
}

/* ---- its registry entry ---- */

/* f16/bf16 at D = Dv = 64 or 128, on any GPU the build has code for */
static int mma_fit(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc, char *why, size_t n) {
  if (!attn_fit_16bit(dt, D, Dv, D == 64 || D == 128, "64 or 128", why, n)) return 0;
  *br = 16 * MMA_WARPS(D), *bc = MMA_BC;
  return 1;
}

/* one tile a head dim: 16 rows a warp (4 warps at D = 64, 8 at 128), 64 keys */
static bool mma_tile_ok(int64_t D, int64_t br, int64_t bc) {
  return (D == 64 || D == 128) && br == 16 * MMA_WARPS(D) && bc == MMA_BC;
}

/* rows on 16 bytes: its cp.async copies and 16-byte stores */
static bool mma_takes(const fa_attn_problem *p, fa_attention_algo, bool) { return attn_rows_aligned16(p); }

static fa_status mma_queue(fa_context *ctx, const attn_params *p, fa_attention_algo algo, bool, int **v_flag) {
  return launch_fast_passes(ctx, p, algo, v_flag, p->compute == FA_F16 ? mma_typed<__half> : mma_typed<__nv_bfloat16>);
}

const attn_entry attn_entry_mma = {FA_KERNEL_MMA, ATTN_FLASH_OR_TWO_PASS, false, mma_fit, mma_tile_ok, mma_takes, mma_queue,
                                  true,          NULL,        ATTN_MASK_BITS_RANGES};
