/* The launchers of the Hopper "flash" kernel (attention_wgmma.cuh). */
#include "attention_nonfinite.cuh"
#include "attention_registry.h"
#include "attention_wgmma.cuh"

#include <cstdio>

template <typename T, int D, int BC, int EXTRAS, int PASS>
static fa_status launch(fa_context *ctx, const attn_params *p) {
  /* the statistics pass holds no V tiles */
  const size_t smem = PASS == PASS_STATS ? (size_t)(WG_BR + 2 * BC) * WG_PAD(D) * 2 + 1024 : wgmma_smem_bytes(D, BC);
  void (*kernel)(attn_params) = attn_rows_dense(p) ? attn_wgmma_kernel<T, D, BC, EXTRAS, PASS, true>
                                                        : attn_wgmma_kernel<T, D, BC, EXTRAS, PASS, false>;
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int64_t blocks = p->B * p->Hq * ((p->Lq + WG_BR - 1) / WG_BR);
  if (fa_status st = attn_grid_fits(ctx, blocks)) return st;
  kernel<<<(unsigned)blocks, WG_THREADS, smem, fa_cuda_stream(ctx)>>>(*p);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_wgmma_kernel");
  return FA_OK;
}

template <typename T, int D, int BC> static fa_status launch_extras(fa_context *ctx, const attn_params *p, int pass) {
  return attn_instance_by_rule_and_pass(p, pass, [&](auto x, auto ps) {
    return launch<T, D, BC, decltype(x)::value, decltype(ps)::value>(ctx, p);
  });
}

template <typename T> static fa_status wgmma_typed(fa_context *ctx, const attn_params *p, int pass) {
  if (p->D == 64 && p->tile_k == 64) return launch_extras<T, 64, 64>(ctx, p, pass);
  if (p->D == 64) return launch_extras<T, 64, 128>(ctx, p, pass);
  if (p->D == 256) return launch_extras<T, 256, 64>(ctx, p, pass);
  if (p->D == 96) return launch_extras<T, 96, 128>(ctx, p, pass);
  return launch_extras<T, 128, 128>(ctx, p, pass);
}

/* Whether this build and device run the wgmma kernel: a Hopper GPU, sm_90a
 * code in the binary (a kernel JIT-compiled from older PTX has an empty
 * body), and the shared memory it asks for. */
static int wgmma_probe(void) {
  fa_cuda_props dp;
  cudaFuncAttributes attr;
  if (!fa_cuda_device_props_quiet(&dp)) return 0;
  if (cudaFuncGetAttributes(&attr, attn_wgmma_kernel<__half, 128, 128, EXTRAS_MASK, PASS_FLASH>) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return dp.cc_major == 9 && attr.ptxVersion >= 90 && attr.binaryVersion >= 90 &&
         wgmma_smem_bytes(128, 128) + attr.sharedSizeBytes <= (size_t)dp.smem_optin;
}

/* Asked twice a call (default tile, dispatch): probed once per device;
 * racing threads store the same answer. */
extern "C" int fa_cuda_wgmma_usable(void) {
  static volatile signed char known[64]; /* 0: not probed, 1: no, 2: yes */
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (dev < 0 || dev >= 64) return wgmma_probe();
  if (!known[dev]) known[dev] = (signed char)(wgmma_probe() ? 2 : 1);
  return known[dev] == 2;
}

/* The tiles of this kernel ({128, 128}, and {128, 64} at D = 64: half the
 * key tile, two blocks an SM; {128, 64} at D = 256, within one SM's shared
 * memory) for f16/bf16 at D = Dv = 64, 96, 128 or 256, one
 * pass (PASS_FLASH, PASS_STATS or PASS_OUTPUT); the caller has checked the
 * rest (alignment) and set p->v_nonfinite (p->row_stats for two_pass). */
extern "C" fa_status fa_cuda_attention_wgmma(fa_context *ctx, const attn_params *p, int pass) {
  if (p->compute == FA_F16) return wgmma_typed<__half>(ctx, p, pass);
  return wgmma_typed<__nv_bfloat16>(ctx, p, pass);
}

/* ---- its registry entry ---- */

static int wgmma_fit(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc, char *why, size_t n) {
  if (!attn_fit_16bit(dt, D, Dv, D == 64 || D == 96 || D == 128 || D == 256, "64, 96, 128 or 256", why, n)) return 0;
  if (!fa_cuda_wgmma_usable()) {
    snprintf(why, n, "it needs a Hopper GPU (sm_90) and sm_90a code in this build");
    return 0;
  }
  *br = WG_BR, *bc = wgmma_key_tile(D);
  return 1;
}

/* its default tile, and {128, 128} at D = 64 */
static bool wgmma_tile_ok(int64_t D, int64_t br, int64_t bc) {
  return br == WG_BR && (bc == wgmma_key_tile(D) || (D == 64 && bc == 128));
}

/* rows on 16 bytes: its cp.async copies and 16-byte stores */
static bool wgmma_takes(const fa_attn_problem *p, fa_attention_algo, bool) { return attn_rows_aligned16(p); }

/* Its instances of two blocks an SM (D = 64, key tiles of 64) check their
 * shares of V themselves (v_check_share).  Chosen (automatic) at D = 64
 * with wgmma_tma's default key tile, 128 (two_pass, or operands the copy
 * engine cannot map), it takes its own, 64: with 128 it ran at 0.85 x. */
static fa_status wgmma_queue(fa_context *ctx, const attn_params *p, fa_attention_algo algo, bool automatic,
                             int **v_flag) {
  attn_params call = *p;
  if (automatic && call.D == 64 && call.tile_k == 128) call.tile_k = wgmma_key_tile(64);
  const int check = call.D == 64 && call.tile_k == 64 ? V_CHECK_SHARE : V_CHECK_SCAN;
  return launch_fast_passes(ctx, &call, algo, v_flag, fa_cuda_attention_wgmma, check);
}

const attn_entry attn_entry_wgmma = {FA_KERNEL_WGMMA, ATTN_FLASH_OR_TWO_PASS, false, wgmma_fit, wgmma_tile_ok,
                                    wgmma_takes,     wgmma_queue,            true, NULL, ATTN_MASK_BITS_RANGES};
