#include "attention_backward_wgmma.cuh"
#include "attention_wgmma_tma.cuh" /* wt_encode_operand */

#include <algorithm>

/* The deterministic walk's blocks a (batch, KV head), C: the fewest turns
 * of the GPU (waves of `slots` blocks times key tiles a block), ties to
 * the smaller C (fewer copies to zero and sum), the copies held to
 * BWG_COPY_BYTES in all.  0 where that leaves most of the GPU idle (few
 * heads, long keys): the two kernels then. */
#define BWG_COPY_BYTES ((int64_t)2 << 30)
static int64_t bwg_copies(int64_t heads, int64_t ktiles, int64_t slots, int64_t copy_bytes) {
  int64_t best = 0, best_cost = INT64_MAX;
  const int64_t most = std::min(ktiles, std::max<int64_t>(1, BWG_COPY_BYTES / copy_bytes));
  for (int64_t c = 1; c <= most; c++) {
    const int64_t cost = (heads * c + slots - 1) / slots * ((ktiles + c - 1) / c);
    if (cost < best_cost) best = c, best_cost = cost;
  }
  return 2 * heads * best < slots && best < ktiles ? 0 : best;
}

/* The float4s of dq_acc (one copy): the (B·Hq) heads' query tiles of BWG_BR rows, D wide. */
static int64_t bwg_acc_n4(const fa_attn_problem *p) {
  return p->B * p->Hq * ((p->Lq + BWG_BR - 1) / BWG_BR) * BWG_BR * p->D / 4;
}

/* The copies' footprint that the deterministic walk takes, in L2s: the
 * rows that the blocks at work add into at once (a (batch, KV head)'s dq
 * each); past it the adds stream from memory.  bf16, D = 128, H200
 * (docs/perf/2026-11-29-backward-deterministic-h200.json): the
 * deterministic call against the default at L = 1k-4k (a footprint up to
 * 5 L2s) 0.88-0.95x with the copies, 0.84-0.94x with the two kernels (a
 * run of 2026-11-27); at 8k-16k (10-20 L2s) 0.77-0.87x against 0.83-0.87x.
 * D = 64 takes the two kernels: the copies measured 0.89-0.99x, the two
 * kernels 0.95-0.98x (the adds save little there). */
#define BWG_COPIES_L2 6

/* The blocks a (batch, KV head) of the schedule whose two-warpgroup dK/dV
 * blocks of 128 keys add dQ into a zeroed f32 dq_acc (then converted into
 * g->dq) instead of a dQ kernel: one a key tile, adding by atomics in any
 * order, or with determinism bwg_copies' C, each into a copy of its own,
 * where their footprint allows (BWG_COPIES_L2).  0: the two kernels.  (The
 * deterministic answer serves the Lua variants alone: the built-in rules'
 * deterministic calls add in fixed point, bw_fixed_dq, and ask nothing.)  At
 * D = 64 the fused schedule (K and V in registers) took 1.05-1.27x the two
 * kernels' time side by side (bw_launch_beside) on 2026-11-29 below 2k keys
 * not causal and 8k causal; since Q and dO came by TMA and the causal
 * diagonal's one compare a score (sessions 45-46) it runs at 1.08x their
 * speed at 1k not causal, 1.03-1.05x causal at 1k-4k, even elsewhere (H200,
 * bf16, B·L = 16k, two rounds in turns), so it takes every length; with
 * tiles of 128 query rows (bwg_rows_tile) 1.11-1.19x faster again
 * (docs/perf/2026-12-01-backward-d64-rows128-h200.json).  With no query row
 * at all (B, Hq or Lq 0) the two kernels, which still write dk and dv
 * (zeros): dq_acc would be empty, and its conversion a launch of no
 * blocks, which CUDA refuses. */
extern "C" int64_t fa_cuda_backward_wgmma_walk(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g) {
  if (p->B * p->Hq * p->Lq <= 0) return 0;
  const int64_t ktiles = (p->Lk + 2 * BWG_OWN - 1) / (2 * BWG_OWN);
  if (!g->deterministic) return ktiles;
  fa_cuda_props dp;
  if (p->D == 64 || fa_cuda_device_props(ctx, &dp)) return 0; /* (the two kernels' launches report an error) */
  const int64_t heads = p->B * p->Hkv, copy_bytes = bwg_acc_n4(p) * 16;
  const int64_t c = bwg_copies(heads, ktiles, dp.sms, copy_bytes); /* one block an SM */
  return std::min(heads * c, (int64_t)dp.sms) * (copy_bytes / heads) <= BWG_COPIES_L2 * (int64_t)dp.l2_bytes ? c : 0;
}

/* The bytes of the fused instances' dQ sums (one copy of dq_acc: the
 * default's, or FIXED's), which fa_cuda_backward_run has the delta kernel
 * zero (g->dq_acc). */
extern "C" size_t fa_cuda_backward_wgmma_acc_bytes(const fa_attn_problem *p) { return (size_t)bwg_acc_n4(p) * 16; }

/* Whether the call on the built-in instances checks the gradients it
 * writes for NaN and inf (g->nonfinite; bw_guarded then scans neither q nor
 * k): the fused instances', whose dK/dV blocks (CHECK) and, but in fixed
 * point (FIXED, where NaN and inf leave no trace: bw_guarded), dQ's
 * conversion fold every word they store.  Not a call that reads no key
 * and is not deterministic (the two kernels then). */
extern "C" bool fa_cuda_backward_wgmma_checks_outputs(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g) {
  return bw_fixed_dq(p, g) || fa_cuda_backward_wgmma_walk(ctx, p, g) > 0;
}

/* The (batch, KV head)s that the fused kernel's grid takes key tile by key
 * tile at its end (bwg_walk.tail; per: blocks a head), the others head by
 * head, a head's key tiles in a row (its blocks share Q and dO in L2).  In
 * a causal call key tile kt meets the query tiles from the diagonal on, so
 * head by head to the end leaves the last heads' long first tiles running
 * after the rest: greedy placement of the blocks, a simulation with one
 * block an SM, lost 3-19 % against an even finish at 1k-8k keys (B·L = 16k),
 * about 1-3 % with the last 2·SMs blocks' heads taken tile by tile.  0 (none)
 * where the blocks are alike: not causal. */
static int64_t bwg_tail(fa_context *ctx, const fa_attn_problem *p, int64_t per) {
  fa_cuda_props dp;
  if (p->causal == FA_CAUSAL_NONE || per <= 1 || fa_cuda_device_props(ctx, &dp)) return 0;
  return std::min(p->B * p->Hkv, (2 * (int64_t)dp.sms + per - 1) / per);
}

#define BWG_FIXED ((int64_t)-2) /* fa_cuda_backward_wgmma_run's ctas for the FIXED instance (bw_fixed_dq) */

/* The conversion of dq_acc into g->dq (bwg_dq_convert_kernel; mult: FIXED's multipliers, else NULL). */
template <typename T, int D>
static cudaError_t bwg_convert(const float *acc, const float *mult, void *dq, int64_t Lq, int64_t n4, int64_t copies,
                               int *nonfinite, cudaStream_t s) {
  const int64_t cblocks = std::min<int64_t>(n4 / (BWG_BR * D / 4), 65536); /* a tile of BWG_BR rows a block at a time */
  if (mult) bwg_dq_convert_kernel<T, D, true><<<(unsigned)cblocks, 256, 0, s>>>(acc, mult, (T *)dq, Lq, n4, copies, NULL);
  else bwg_dq_convert_kernel<T, D, false><<<(unsigned)cblocks, 256, 0, s>>>(acc, mult, (T *)dq, Lq, n4, copies, nonfinite);
  return cudaGetLastError();
}
static cudaError_t bwg_convert_of(const fa_attn_problem *p, const float *acc, const float *mult, void *dq, int64_t n4,
                                  int64_t copies, int *nonfinite, cudaStream_t s) {
  if (p->compute == FA_F16)
    return p->D == 64   ? bwg_convert<__half, 64>(acc, mult, dq, p->Lq, n4, copies, nonfinite, s)
           : p->D == 96 ? bwg_convert<__half, 96>(acc, mult, dq, p->Lq, n4, copies, nonfinite, s)
                        : bwg_convert<__half, 128>(acc, mult, dq, p->Lq, n4, copies, nonfinite, s);
  return p->D == 64   ? bwg_convert<__nv_bfloat16, 64>(acc, mult, dq, p->Lq, n4, copies, nonfinite, s)
         : p->D == 96 ? bwg_convert<__nv_bfloat16, 96>(acc, mult, dq, p->Lq, n4, copies, nonfinite, s)
                      : bwg_convert<__nv_bfloat16, 128>(acc, mult, dq, p->Lq, n4, copies, nonfinite, s);
}

/* Whether the call runs a Lua variant's instances (a problem with score_mod or mask_mod). */
static bool bwg_variant(const fa_attn_problem *p) { return p->score_mod || p->mask_mod; }

/* bwg_rows_tile of the call's fused instance (walks: the WALK one). */
static int bwg_rows_of(const fa_attn_problem *p, bool walks) {
  return bwg_rows_tile((int)p->D, bwg_variant(p) ? EXTRAS_VARIANT : attn_extras_kind(p), true, walks);
}

/* Whether the call's fused instance waits at griddepcontrol.wait for the kernel before it (CHECK in
 * bwg_dkdv_kernel: a built-in rule's, not the WALK one), so that it may be launched as its programmatic
 * dependent. */
static bool bwg_waits(const fa_attn_problem *p, bool walks) { return !walks && !bwg_variant(p); }

/* The call on the kernels given: the built-in instances, or a variant's
 * run-time compiled ones (attention_variant.cu), whose problem argument
 * prob (a fa_attn_problem or what derives from it) goes to the kernels as
 * it is.  ctas: fa_cuda_backward_wgmma_walk's answer, taken once by the
 * caller (which picks the instances by it); above 0, dkdv is the instance
 * with DQ (with determinism, its WALK instance) and dq is not used;
 * BWG_FIXED, its FIXED instance, a key tile a block.  maps: the
 * bwg_maps of a TMA instance of dkdv, else NULL. */
extern "C" fa_status fa_cuda_backward_wgmma_run(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g,
                                                const float *delta, void *prob, int64_t ctas, const void *dkdv,
                                                const void *dq, const void *maps) {
  static const bwg_maps no_maps = {}; /* the instances without TMA */
  cudaStream_t s = fa_cuda_stream(ctx);
  fa_attn_grads ga = *g;
  float *acc = NULL;
  bwg_walk walk = {(p->Lk + BWG_OWN - 1) / BWG_OWN, 0, NULL, 0}; /* the two kernels': a key tile a block */
  void *args[] = {prob, &ga, &delta, &acc, &walk, (void *)(maps ? maps : &no_maps)};
  if (ctas > 0 || ctas == BWG_FIXED) { /* the instance with DQ */
    const bool walks = ctas > 0 && g->deterministic;
    walk.ctas = ctas > 0 ? ctas : (p->Lk + 2 * BWG_OWN - 1) / (2 * BWG_OWN);
    if (ctas == BWG_FIXED) walk.fixed = bw_fixed_mults(delta, p);
    const int64_t n4 = bwg_acc_n4(p), copies = walks ? walk.ctas : 1;
    walk.copy = walks ? n4 * 4 : 0;
    walk.tail = walks ? 0 : bwg_tail(ctx, p, walk.ctas);
    const int64_t blocks = p->B * p->Hkv * walk.ctas;
    const size_t bytes = (size_t)(n4 * copies) * 16;
    const bool zeroed = g->dq_acc && copies == 1; /* by the delta kernel (fa_cuda_backward_run) */
    fa_status st = attn_grid_fits(ctx, blocks);
    if (!st && zeroed) acc = g->dq_acc;
    else if (!st) st = fa_cuda_malloc(ctx, (void **)&acc, bytes); /* rows > 0: n4 > 0 */
    if (st) return st;
    cudaError_t err = zeroed ? cudaSuccess : cudaMemsetAsync(acc, 0, bytes, s); /* the sums */
    /* zeroed: queued right behind the delta kernel, so an instance that waits (bwg_waits) is launched as its
     * programmatic dependent: the launch and K and V's loads overlap delta's last wave */
    if (err == cudaSuccess && blocks > 0)
      err = bw_launch_on({dkdv, blocks, 2 * BWG_THREADS, bwg_smem_dkdv(BWG_PAD(p->D), true, bwg_rows_of(p, walks)),
                          "bwg_dkdv_kernel"},
                         args, s, zeroed && bwg_waits(p, walks));
    if (err == cudaSuccess) FA_TIMELINE_REPORT(s, "bwg_dkdv_kernel", blocks);
    if (err == cudaSuccess) err = bwg_convert_of(p, acc, walk.fixed, g->dq, n4, copies, g->nonfinite, s);
    if (!zeroed) fa_cuda_free_on(ctx, acc, bytes); /* stream-ordered: after the kernels */
    return fa_cuda_error(ctx, err, "the backward's dK/dV/dQ launches");
  }
  const bw_launch_spec kv = {dkdv, p->B * p->Hkv * walk.ctas, BWG_THREADS, bwg_smem_dkdv(BWG_PAD(p->D), false, BWG_BR),
                             "bwg_dkdv_kernel"};
  const bw_launch_spec q = {dq, p->B * p->Hq * ((p->Lq + BWG_OWN - 1) / BWG_OWN), BWG_THREADS,
                            bwg_smem_dq(BWG_PAD(p->D)), "bwg_dq_kernel"};
  return bw_launch_beside(ctx, kv, q, args);
}

/* The fused dQ instance of the default (FIXED: its fixed-point form), with
 * Q and dO by the tensor memory accelerator where tma (the call's maps
 * were made), else by cp.async. */
template <typename T, int D, int EXTRAS, bool FIXED> static const void *bwg_fused(bool tma) {
  if (tma) return (const void *)bwg_dkdv_kernel<T, D, EXTRAS, true, fa_attn_problem, false, true, FIXED>;
  return (const void *)bwg_dkdv_kernel<T, D, EXTRAS, true, fa_attn_problem, false, false, FIXED>;
}

template <typename T, int D, int EXTRAS>
static fa_status bwg_extras(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta) {
  fa_attn_problem pa = *p;
  const bool fixed = bw_fixed_dq(p, g);
  /* else not deterministic (or no query row): the default's fused schedule, or the two kernels (ctas 0) */
  const int64_t ctas = fixed ? 0 : fa_cuda_backward_wgmma_walk(ctx, p, g);
  /* the maps of Q and dO (and of K and V where the instance takes them by TMA: bwg_kv_tma) for the fused
   * instances' TMA forms, made once: 0 where the copy engine refuses a stride */
  bwg_maps tm = {};
  const int br = bwg_rows_tile(D, EXTRAS, true, false), keys = 2 * BWG_OWN; /* (TMA: no walk; two warpgroups) */
  const bool maps = (ctas > 0 || fixed) &&
                    wt_encode_operand(&tm.q, p->compute, p->q, p->q_st, p->Lq, p->Hq, p->B, D, br) &&
                    wt_encode_operand(&tm.dout, p->compute, g->dout, g->dout_st, p->Lq, p->Hq, p->B, D, br) &&
                    (!bwg_kv_tma(D, fixed) ||
                     (wt_encode_operand(&tm.k, p->compute, p->k, p->k_st, p->Lk, p->Hkv, p->B, D, keys) &&
                      wt_encode_operand(&tm.v, p->compute, p->v, p->v_st, p->Lk, p->Hkv, p->B, D, keys)));
  if (fixed || ctas > 0) /* fixed: fa_cuda_backward_run made the rows' multipliers */
    return fa_cuda_backward_wgmma_run(ctx, p, g, delta, &pa, fixed ? BWG_FIXED : ctas,
                                      fixed ? bwg_fused<T, D, EXTRAS, true>(maps) : bwg_fused<T, D, EXTRAS, false>(maps),
                                      NULL, maps ? &tm : NULL);
  return fa_cuda_backward_wgmma_run(ctx, p, g, delta, &pa, 0, (const void *)bwg_dkdv_kernel<T, D, EXTRAS, false>,
                                    (const void *)bwg_dq_kernel<T, D, EXTRAS>, NULL);
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
