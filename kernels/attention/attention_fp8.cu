/* The launchers of the FP8 "flash" kernel (attention_fp8.cuh) and its
 * registry entry, wgmma_fp8: taken only when named (its results are those
 * of e4m3 operands, not of the call's dtype). */
#include "attention_fp8.cuh"
#include "attention_nonfinite.cuh"
#include "attention_registry.h"

#include <cstdio>

static int64_t fp8_pad(int64_t L) { return (L + FP8_TILE - 1) / FP8_TILE * FP8_TILE; }
static size_t fp8_round256(size_t n) { return (n + 255) & ~(size_t)255; }

/* The quantized operands' bytes for p, and their places in one allocation at base. */
static size_t fp8_layout(const attn_params *p, char *base, fp8_operands *f) {
  const int64_t lq = fp8_pad(p->Lq), lk = fp8_pad(p->Lk), nq = lq / FP8_TILE, nk = lk / FP8_TILE;
  const size_t q8 = fp8_round256((size_t)(p->B * p->Hq * lq) * FP8_TILE);
  const size_t kv8 = fp8_round256((size_t)(p->B * p->Hkv * lk) * FP8_TILE);
  const size_t sq = fp8_round256(sizeof(float) * (size_t)(p->B * p->Hq * nq));
  const size_t sk = fp8_round256(sizeof(float) * (size_t)(p->B * p->Hkv * nk));
  const size_t sv = fp8_round256(sizeof(float2) * (size_t)(p->B * p->Hkv * nk));
  if (f) {
    f->q8 = (uint8_t *)base, f->k8 = (uint8_t *)base + q8, f->v8t = f->k8 + kv8;
    f->sq = (float *)(f->v8t + kv8), f->sk = (float *)((char *)f->sq + sq), f->sv = (float2 *)((char *)f->sk + sk);
    f->lq_pad = lq, f->lk_pad = lk;
  }
  return q8 + 2 * kv8 + sq + sk + sv;
}

/* The maps of f's q8, k8 and Vᵀ for p (fp8_maps); 0 when the driver refuses one. */
static int fp8_encode(const attn_params *p, const fp8_operands &f, fp8_maps *m) {
  const int64_t row = FP8_TILE / 2; /* a row of 128 e4m3 as 16-bit elements */
  const fa_attn_strides sq = {p->Hq * f.lq_pad * row, f.lq_pad * row, row};
  const fa_attn_strides sk = {p->Hkv * f.lk_pad * row, f.lk_pad * row, row};
  const fa_attn_strides sv = {p->Hkv * FP8_TILE * (f.lk_pad / 2), FP8_TILE * (f.lk_pad / 2), f.lk_pad / 2};
  return wt_encode_operand(&m->q, FA_BF16, f.q8, sq, f.lq_pad, p->Hq, p->B, (int)row, FP8_TILE) &&
         wt_encode_operand(&m->k, FA_BF16, f.k8, sk, f.lk_pad, p->Hkv, p->B, (int)row, FP8_TILE) &&
         wt_encode_operand(&m->vt, FA_BF16, f.v8t, sv, FP8_TILE, p->Hkv, p->B, (int)(f.lk_pad / 2), FP8_TILE);
}

template <typename T> static fa_status fp8_typed(fa_context *ctx, const attn_params *p) {
  const int64_t qblocks = p->B * p->Hq * (fp8_pad(p->Lq) / FP8_TILE);
  const int64_t kblocks = p->B * p->Hkv * (fp8_pad(p->Lk) / FP8_TILE);
  fa_status st = attn_grid_fits(ctx, qblocks + kblocks);
  if (st) return st;
  const size_t bytes = fp8_layout(p, NULL, NULL);
  void *ws = NULL;
  if ((st = fa_cuda_malloc(ctx, &ws, bytes))) return st;
  fp8_operands f;
  fp8_layout(p, (char *)ws, &f);
  cudaStream_t s = fa_cuda_stream(ctx);
  attn_fp8_quantize_kernel<T><<<(unsigned)(qblocks + kblocks), FP8_THREADS, 0, s>>>(*p, f, p->v_nonfinite);
  cudaError_t err = cudaGetLastError();
  const size_t smem = wt_smem_bytes(64, FP8_TILE); /* wt_layout<64, 128>: an e4m3 tile as a 16-bit one */
  fp8_maps maps;
  if (err == cudaSuccess && !fp8_encode(p, f, &maps)) {
    fa_cuda_free_on(ctx, ws, bytes);
    return fa_fail(ctx, FA_ERR_BACKEND, "flashattn: attention on cuda: the driver refused the e4m3 operands' tensor maps");
  }
  if (err == cudaSuccess)
    err = cudaFuncSetAttribute(attn_fp8_ws_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err == cudaSuccess) {
    attn_fp8_ws_kernel<T><<<(unsigned)qblocks, 3 * 128, smem, s>>>(*p, f, maps);
    err = cudaGetLastError();
  }
  fa_cuda_free_on(ctx, ws, bytes); /* stream-ordered: after the kernels */
  return fa_cuda_error(ctx, err, "attn_fp8_ws_kernel");
}

static fa_status fp8_run(fa_context *ctx, const attn_params *p, int) {
  if (p->compute == FA_F16) return fp8_typed<__half>(ctx, p);
  return fp8_typed<__nv_bfloat16>(ctx, p);
}

/* ---- its registry entry ---- */

static int fp8_fit(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc, char *why, size_t n) {
  if (!attn_fit_16bit(dt, D, Dv, D == 128, "128", why, n)) return 0;
  if (!fa_cuda_wgmma_usable()) {
    snprintf(why, n, "it needs a Hopper GPU (sm_90) and sm_90a code in this build");
    return 0;
  }
  *br = FP8_TILE, *bc = FP8_TILE;
  return 1;
}

static bool fp8_tile_ok(int64_t, int64_t br, int64_t bc) { return br == FP8_TILE && bc == FP8_TILE; }

/* rows on 16 bytes (its 16-byte reads); the rest is queue's to refuse, with the reason */
static bool fp8_takes(const fa_attn_problem *p, fa_attention_algo, bool) { return attn_rows_aligned16(p); }

/* The score rules beyond the key range (masks, alibi, softcap) and a
 * paged cache are not in this kernel; a scale <= 0 would turn its maxima
 * (taken on the raw products) into minima. */
static fa_status fp8_queue(fa_context *ctx, const attn_params *p, fa_attention_algo algo, bool, int **v_flag) {
  const char *no = p->mask_b || p->mask_f ? "a mask tensor" : p->alibi ? "opts.alibi" : p->softcap > 0 ? "opts.softcap"
                   : p->paging                                                    ? "a paged cache"
                   : !(p->scale_f > 0.f)                                          ? "a scale that is not positive"
                                                                                  : NULL;
  if (no)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: opts.kernel: \"wgmma_fp8\" does not take %s (it computes "
                   "causal, windowed and kv_lens calls without other rules)", no);
  /* the NaN/inf flag is set by the rounding pass, which reads all of q, k and v: no scan of V is queued */
  return launch_fast_passes(ctx, p, algo, v_flag, fp8_run, V_CHECK_OUTPUT);
}

const attn_entry attn_entry_wgmma_fp8 = {FA_KERNEL_WGMMA_FP8, ATTN_ALGO(FA_ATTN_FLASH), true, fp8_fit, fp8_tile_ok,
                                         fp8_takes,           fp8_queue,                false};
