/* Attention variants on cuda (API §9): what the run-time compiled kernels
 * and their host side (attention_variant.cu) share.
 *
 * A variant's translation unit, compiled by NVRTC, is this header, then
 * the traced expressions' `struct fa_variant` (src/variant_codegen.c:
 * static score(args, s, b, h, q, k, fault) and mask(...) on 0-based
 * positions, has_score and has_mask), then attention_variant_rules.cuh,
 * which hooks them into the kernels' score rule.  The kernels are the
 * built-in ones (attention_wgmma.cuh, attention_mma.cuh,
 * attention_tiled.cuh, attention_naive.cuh; the backward's attention_backward_simt.cuh and
 * attention_backward_wgmma.cuh) instantiated with PROB = fa_variant_problem: the
 * problem plus the captured tensors, passed by value with each launch, so
 * that new tensors or shapes never recompile. */
#ifndef FA_KERNELS_ATTENTION_VARIANT_CUH
#define FA_KERNELS_ATTENTION_VARIANT_CUH

#include "attention_mma.cuh"
#include "attention_naive.cuh"
#include "attention_tiled.cuh"
#include "attention_wgmma.cuh"
#include "attention_wgmma_tma.cuh"
#include "attention_backward_simt.cuh"
#include "attention_backward_wgmma.cuh"

#include "attention_variant_args.cuh"

/* The threads of a block of the spans kernel (fa_variant_spans_kernel: a
 * warp a key tile; a document mask's pass 24 -> 23 us at L = 4096 and
 * 36 -> 32 us at 16384 against 512, H200). */
#define FA_SPANS_THREADS 1024

struct fa_variant_problem : attn_params {
  fa_variant_args va;
};

/* The span record of query tile qt of head h of batch b. */
static __device__ __forceinline__ const int *fa_variant_span(const fa_variant_problem &p, long long b, long long h,
                                                             long long qt) {
  return p.va.spans + 4 * ((b * p.va.spans_sb + h * p.va.spans_sh) * p.va.spans_nq + qt);
}

#endif
