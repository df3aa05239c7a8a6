#include "attention_backward_wgmma.cuh"

#include <algorithm>

/* Whether the call takes the schedule without determinism: dQ added up by
 * two-warpgroup dK/dV blocks of 128 keys into a zeroed f32 dq_acc, then
 * converted into g->dq.  At D = 64 the atomics' traffic is twice as large
 * against the work: that schedule ran 0.96-1.10x the two kernels' time
 * below 8k keys, 0.96-0.99x from 8k (H200, bf16).  Without query rows the
 * two kernels still write dk and dv (zeros). */
extern "C" int fa_cuda_backward_wgmma_atomic(const fa_attn_problem *p, const fa_attn_grads *g) {
  /* with no query row at all (B, Hq or Lq 0) the two kernels: dq_acc would be empty, and its
   * conversion a launch of no blocks, which CUDA refuses */
  return !g->deterministic && p->B * p->Hq * p->Lq > 0 && (p->D != 64 || p->Lk >= 8192);
}

template <typename T, int D>
static cudaError_t bwg_convert(const float *acc, void *dq, int64_t Lq, int64_t n4, cudaStream_t s) {
  const int64_t cblocks = std::min<int64_t>((n4 + 255) / 256, 65536);
  bwg_dq_convert_kernel<T, D><<<(unsigned)cblocks, 256, 0, s>>>(acc, (T *)dq, Lq, n4);
  return cudaGetLastError();
}
static cudaError_t bwg_convert_of(const fa_attn_problem *p, const float *acc, void *dq, int64_t n4, cudaStream_t s) {
  if (p->compute == FA_F16)
    return p->D == 64   ? bwg_convert<__half, 64>(acc, dq, p->Lq, n4, s)
           : p->D == 96 ? bwg_convert<__half, 96>(acc, dq, p->Lq, n4, s)
                        : bwg_convert<__half, 128>(acc, dq, p->Lq, n4, s);
  return p->D == 64   ? bwg_convert<__nv_bfloat16, 64>(acc, dq, p->Lq, n4, s)
         : p->D == 96 ? bwg_convert<__nv_bfloat16, 96>(acc, dq, p->Lq, n4, s)
                      : bwg_convert<__nv_bfloat16, 128>(acc, dq, p->Lq, n4, s);
}

static cudaError_t bwg_launch(const void *kernel, int64_t blocks, int threads, size_t smem, void **args, cudaStream_t s) {
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  return err != cudaSuccess ? err : cudaLaunchKernel(kernel, dim3((unsigned)blocks), dim3(threads), args, smem, s);
}

/* The call on the kernels given: the built-in instances, or a variant's
 * run-time compiled ones (attention_variant.cu), whose problem argument
 * prob (a fa_attn_problem or what derives from it) goes to the kernels as
 * it is.  With fa_cuda_backward_wgmma_atomic, dkdv is the instance with DQ
 * and dq is not used. */
extern "C" fa_status fa_cuda_backward_wgmma_run(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g,
                                                const float *delta, void *prob, const void *dkdv, const void *dq) {
  cudaStream_t s = fa_cuda_stream(ctx);
  fa_attn_grads ga = *g;
  float *acc = NULL;
  void *args[] = {prob, &ga, &delta, &acc};
  if (fa_cuda_backward_wgmma_atomic(p, g)) {
    const int64_t blocks = p->B * p->Hkv * ((p->Lk + 2 * BWG_OWN - 1) / (2 * BWG_OWN));
    const int64_t n4 = p->B * p->Hq * ((p->Lq + BWG_BR - 1) / BWG_BR) * BWG_BR * p->D / 4; /* float4s of dq_acc */
    const size_t bytes = (size_t)n4 * 16;
    fa_status st = attn_grid_fits(ctx, blocks);
    if (st || (st = fa_cuda_malloc(ctx, (void **)&acc, bytes))) return st; /* rows > 0: n4 > 0 */
    cudaError_t err = cudaMemsetAsync(acc, 0, bytes, s);
    if (err == cudaSuccess && blocks > 0)
      err = bwg_launch(dkdv, blocks, 2 * BWG_THREADS, bwg_smem_dkdv(BWG_PAD(p->D), true), args, s);
    if (err == cudaSuccess) err = bwg_convert_of(p, acc, g->dq, n4, s);
    fa_cuda_free_on(ctx, acc, bytes); /* stream-ordered: after the kernels */
    return fa_cuda_error(ctx, err, "the backward's dK/dV/dQ launches");
  }
  const int64_t kblocks = p->B * p->Hkv * ((p->Lk + BWG_OWN - 1) / BWG_OWN);
  const int64_t qblocks = p->B * p->Hq * ((p->Lq + BWG_OWN - 1) / BWG_OWN);
  fa_status st;
  if ((st = attn_grid_fits(ctx, kblocks)) || (st = attn_grid_fits(ctx, qblocks))) return st;
  if (kblocks > 0 &&
      (st = fa_cuda_error(ctx, bwg_launch(dkdv, kblocks, BWG_THREADS, bwg_smem_dkdv(BWG_PAD(p->D), false), args, s),
                          "bwg_dkdv_kernel")))
    return st;
  if (qblocks > 0)
    return fa_cuda_error(ctx, bwg_launch(dq, qblocks, BWG_THREADS, bwg_smem_dq(BWG_PAD(p->D)), args, s), "bwg_dq_kernel");
  return FA_OK;
}

template <typename T, int D, int EXTRAS>
static fa_status bwg_extras(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta) {
  fa_attn_problem pa = *p;
  if (fa_cuda_backward_wgmma_atomic(p, g))
    return fa_cuda_backward_wgmma_run(ctx, p, g, delta, &pa, (const void *)bwg_dkdv_kernel<T, D, EXTRAS, true>, NULL);
  return fa_cuda_backward_wgmma_run(ctx, p, g, delta, &pa, (const void *)bwg_dkdv_kernel<T, D, EXTRAS, false>,
                                    (const void *)bwg_dq_kernel<T, D, EXTRAS>);
}

template <typename T, int D>
static fa_status bwg_typed(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta) {
  /* the instance without the score rule's extras (masks, alibi, softcap) for the calls that set none:
   * 2.2-2.5x faster than one instance with attn_score's code beside the plain path (H200, 2026-11-27) */
  if (attn_has_extras(p)) return bwg_extras<T, D, EXTRAS_MASK>(ctx, p, g, delta);
  return bwg_extras<T, D, EXTRAS_NONE>(ctx, p, g, delta);
}

/* f16/bf16, D = Dv = 64, 96 or 128, rows on 16 bytes (the caller checked),
 * on a GPU where fa_cuda_wgmma_usable. */
extern "C" fa_status fa_cuda_attention_backward_wgmma(fa_context *ctx, const fa_attn_problem *p,
                                                      const fa_attn_grads *g, const float *delta) {
  if (p->compute == FA_F16)
    return p->D == 64   ? bwg_typed<__half, 64>(ctx, p, g, delta)
           : p->D == 96 ? bwg_typed<__half, 96>(ctx, p, g, delta)
                        : bwg_typed<__half, 128>(ctx, p, g, delta);
  return p->D == 64   ? bwg_typed<__nv_bfloat16, 64>(ctx, p, g, delta)
         : p->D == 96 ? bwg_typed<__nv_bfloat16, 96>(ctx, p, g, delta)
                      : bwg_typed<__nv_bfloat16, 128>(ctx, p, g, delta);
}
