/* Attention on the GPU: the SIMT tiled kernel's launchers
 * (attention_tiled.cuh) and registry entry, behind "flash" and "two_pass",
 * and the seeds' one-row recurrence behind "flash_row" (attn_row_kernel,
 * in attention_tiled.cuh too).  The SIMT kernel
 * takes every call: the ones the faster kernels of the registry
 * (attention_registry.cu) do not, and theirs when V holds NaN or inf. */
#include "attention_registry.h"
#include "attention_tiled.cuh"

#include <cstdio>

/* ---- launchers ---- */


/* A user's tile: any the SIMT kernel holds in shared memory, and the
 * default tile of the call (a tensor-core tile, which may be larger). */
extern "C" fa_status fa_cuda_attention_check_tile(fa_context *ctx, fa_dtype dt, int64_t D, int64_t Dv, int64_t br,
                                                  int64_t bc) {
  int smem_max = 0;
  int64_t def_br = 0, def_bc = 0;
  fa_cuda_attention_default_tile(dt, D, Dv, &def_br, &def_bc);
  if (br == def_br && bc == def_bc) return FA_OK;
  /* a tile of a fast kernel that takes the call (the SIMT fallback fits it to itself),
   * e.g. wgmma_tma's {128, 176} */
  if (attn_fast_tile(dt, D, Dv, br, bc)) return FA_OK;
  fa_status st = tiled_smem_max(ctx, &smem_max);
  if (st) return st;
  int ok_br = br >= 1 && br <= 128;
  if (Dv > 32 * MAX_DV_PER_LANE)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: attention on cuda: value head dimension Dv = %lld is above %d",
                   (long long)Dv, 32 * MAX_DV_PER_LANE);
  if (!ok_br || bc < 1 || bc > 256 || tiled_smem(block_rows((int)br), (int)bc, D, Dv) > (size_t)smem_max) {
    int64_t bc_max = 0;
    while (bc_max < 256 && tiled_smem(block_rows(ok_br ? (int)br : 1), (int)bc_max + 1, D, Dv) <= (size_t)smem_max)
      bc_max++;
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.tile: on cuda with D = %lld, Dv = %lld the valid tiles are 1 <= Br <= 128 and "
                   "1 <= Bc <= %lld (shared memory: %d bytes), and the default {%lld, %lld}; got {%lld, %lld}",
                   (long long)D, (long long)Dv, (long long)bc_max, smem_max, (long long)def_br, (long long)def_bc,
                   (long long)br, (long long)bc);
  }
  return FA_OK;
}

template <typename T, int BR, int MODE>
static fa_status launch_tiled(fa_context *ctx, const attn_params *p) {
  int bc = (int)p->tile_k;
  size_t smem = tiled_smem(BR, bc, p->D, p->Dv);
  int br = (int)p->tile_q;
  int64_t blocks = p->B * p->Hq * ((p->Lq + br - 1) / br), grid = 0;
  if (fa_status st = tiled_grid(ctx, blocks, p->v_nonfinite != NULL, &grid)) return st;
  if (fa_status st = attn_grid_fits(ctx, grid)) return st;
  if (grid == 0) return FA_OK;
  attn_params g = *p;
  void *args[] = {&g, &br, &bc, &blocks};
  return tiled_launch(ctx, (const void *)attn_tiled_kernel<T, BR, MODE>, grid, smem, args, p->v_nonfinite != NULL,
                      "launch of attn_tiled_kernel");
}

template <typename T, int MODE> static fa_status tiled_by_br(fa_context *ctx, const attn_params *p) {
  switch (block_rows((int)p->tile_q)) {
  case 8: return launch_tiled<T, 8, MODE>(ctx, p);
  case 16: return launch_tiled<T, 16, MODE>(ctx, p);
  case 32: return launch_tiled<T, 32, MODE>(ctx, p);
  case 64: return launch_tiled<T, 64, MODE>(ctx, p);
  default: return launch_tiled<T, 128, MODE>(ctx, p);
  }
}

template <typename T>
static fa_status simt_typed(fa_context *ctx, const attn_params *p, fa_attention_algo algo, bool guarded) {
  if (algo != FA_ATTN_TWO_PASS) return tiled_by_br<T, MODE_FLASH>(ctx, p);
  if (guarded) return tiled_by_br<T, MODE_OUTPUT>(ctx, p);
  fa_status st = tiled_by_br<T, MODE_STATS>(ctx, p);
  return st ? st : tiled_by_br<T, MODE_OUTPUT>(ctx, p);
}

/* The SIMT kernel for algo ("flash", or "two_pass" with p->row_stats
 * set) with the call's tile where it holds it, else a smaller one (the
 * default tile is a tensor-core tile, and a call the fast kernels do not
 * take, e.g. rows off 16 bytes, gets it too): alone, or behind a fast
 * kernel guarded by its flag only_if (two_pass: the output pass, on the
 * statistics the fast statistics pass wrote). */
fa_status attn_simt_queue(fa_context *ctx, const attn_params *p, fa_attention_algo algo, int *only_if) {
  attn_params g = *p;
  g.v_nonfinite = only_if;
  fa_status st = simt_fit_tile(ctx, &g);
  if (st) return st;
  if (p->compute == FA_F16) return simt_typed<__half>(ctx, &g, algo, only_if != NULL);
  if (p->compute == FA_BF16) return simt_typed<__nv_bfloat16>(ctx, &g, algo, only_if != NULL);
  return simt_typed<float>(ctx, &g, algo, only_if != NULL);
}

/* "flash_row": one thread a query row. */
template <typename T> static fa_status row_typed(fa_context *ctx, const fa_attn_problem *p) {
  int64_t rows = p->B * p->Hq * p->Lq, blocks = (rows + 127) / 128;
  attn_row_kernel<T><<<(unsigned)blocks, 128, 0, fa_cuda_stream(ctx)>>>(*p);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_row_kernel");
  return FA_OK;
}

/* ---- its registry entry: "flash_row", Dv up to 256 (src/ says so first) ---- */

static bool row_takes(const fa_attn_problem *p, fa_attention_algo, bool) { return p->Dv <= 256; }

static fa_status row_queue(fa_context *ctx, const attn_params *p, fa_attention_algo, bool, int **v_flag) {
  *v_flag = NULL;
  if (p->compute == FA_F16) return row_typed<__half>(ctx, p);
  if (p->compute == FA_BF16) return row_typed<__nv_bfloat16>(ctx, p);
  return row_typed<float>(ctx, p);
}

const attn_entry attn_entry_row = {FA_KERNEL_ROW, ATTN_ALGO(FA_ATTN_FLASH_ROW), false, NULL, NULL, row_takes, row_queue,
                                   false};

/* ---- its registry entry: every call (Dv up to 256), its tile any that
 * fa_cuda_attention_check_tile lets through, fitted to itself ---- */

static int simt_fit(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc, char *why, size_t n) {
  if (Dv > 32 * MAX_DV_PER_LANE) {
    snprintf(why, n, "Dv = %lld, above %d", (long long)Dv, 32 * MAX_DV_PER_LANE);
    return 0;
  }
  fa_cuda_attention_default_tile(dt, D, Dv, br, bc);
  return 1;
}

static bool simt_tile_ok(int64_t, int64_t, int64_t) { return true; }
static bool simt_takes(const fa_attn_problem *, fa_attention_algo, bool) { return true; }

static fa_status simt_queue(fa_context *ctx, const attn_params *p, fa_attention_algo algo, bool, int **v_flag) {
  *v_flag = NULL;
  return attn_simt_queue(ctx, p, algo, NULL);
}

const attn_entry attn_entry_simt = {FA_KERNEL_SIMT, ATTN_FLASH_OR_TWO_PASS, false, simt_fit, simt_tile_ok,
                                   simt_takes,     simt_queue,             true};
