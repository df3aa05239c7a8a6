/* Device helpers shared by the CUDA attention kernels: the
 * score rule (API §2) and warp reductions. */
#ifndef FA_KERNELS_ATTENTION_COMMON_CUH
#define FA_KERNELS_ATTENTION_COMMON_CUH

#include "common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>

#include <type_traits>

extern "C" {
#include "attn_range.h"
}

/* What the forward "flash" / "two_pass" kernels read: the call
 * (fa_attn_problem, src/internal.h: shapes, operands and their strides, the
 * score rule), and the scheduling state the dispatch and the NaN/inf guard
 * add to it (attention_registry.cu, attention_nonfinite.cuh), which the
 * CPU backend never sees. */
struct attn_params : fa_attn_problem {
  /* A device flag, set when v holds NaN or inf (NULL: not checked),
   * possibly while the fast kernels run; their blocks do nothing once it
   * is set, and the fallback launched after them runs only then, rewriting
   * every output. */
  int *v_nonfinite;
  /* Who sets that flag (attention_nonfinite.cuh's V_CHECK_*): a pass over
   * V; the kernel's blocks, each from its share of V (the Hopper kernel at
   * D = 64 with key tiles of 64, two blocks an SM); or the kernel, from its
   * outputs (the warp-specialised kernels). */
  int v_self_check;
  /* "two_pass": (m, l) of every query row, B·Hq·Lq pairs in device memory,
   * written by the statistics pass and read by the output pass. */
  float *row_stats;
  /* The fast kernels take query tiles in groups of this many heads, the
   * longest first within a group (causal: a grid's last blocks are short
   * ones); 0 or 1: head by head. */
  int64_t sched_heads;
  /* The decode kernel's: the page table of a paged cache (NULL: k and v
   * read through their strides); the chunks of keys (opts.splits; 0:
   * chosen from the shape and the GPU), also the f32 kernel's (0: its own
   * choice, 1: none; src/ makes larger counts separate pieces). */
  const fa_attn_paging *paging;
  int64_t splits;
};

/* The call p with no scheduling state yet. */
static inline attn_params attn_params_of(const fa_attn_problem &p) {
  attn_params a;
  (fa_attn_problem &)a = p;
  a.v_nonfinite = NULL, a.v_self_check = 0, a.row_stats = NULL, a.sched_heads = 0;
  a.paging = NULL, a.splits = 0;
  return a;
}

/* The score rule beyond the key range (API §2: scale, softcap, alibi, float
 * mask, and the bool mask, in the contract's order) for query row i of head
 * h of batch b, from key j0 on.  Built once a row and key tile, so that a
 * score costs what its options ask and no 64-bit index work: the mask row
 * is a pointer, the alibi distance a float subtraction (exact below 2^24
 * keys) times the slope in float (within an ulp of the bias of the
 * double product); softcap multiplies by 1/c.  Each step is a function of
 * its own, so that the tile kernels can take a step over a whole tile
 * under one branch (frag_score_tile) and the one-score kernels all steps
 * a score (attn_score).  On CUDA the float mask is f32. */
struct score_rule {
  const void *mask; /* the mask at (i, j0), or NULL: f32 when mask_float, else bool bytes */
  int64_t ms;       /* its key stride */
  bool mask_float;
  bool pairs; /* ms = 1 and the mask at (i, j0) aligned to two elements: keys k, k + 1 (k even) are one access */
  float scale, cap, inv_cap, slope, dist0; /* dist0 = i + Lk - Lq - j0 */
};
static __device__ __forceinline__ score_rule score_rule_at(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i,
                                                           int64_t j0) {
  score_rule ru;
  const int64_t mo = b * p.mask_strides[0] + h * p.mask_strides[1] + i * p.mask_strides[2] + j0 * p.mask_strides[3];
  ru.mask_float = p.mask_f != NULL;
  ru.mask = p.mask_f ? (const void *)((const float *)p.mask_f + mo) : p.mask_b ? (const void *)(p.mask_b + mo) : NULL;
  ru.ms = p.mask_strides[3];
  ru.pairs = ru.ms == 1 && ((uintptr_t)ru.mask & (ru.mask_float ? 7 : 1)) == 0;
  ru.scale = p.scale_f;
  ru.cap = p.softcap_f, ru.inv_cap = p.inv_softcap_f; /* c fitted to f32 (resolve_options) */
  ru.slope = p.alibi ? (float)p.alibi[h] : 0.f;
  ru.dist0 = (float)(i + p.Lk - p.Lq - j0);
  return ru;
}
/* Softcap and alibi on one score, written once for every kernel, forward
 * and backward: softcap c·tanh(s / c) (tanh_as<F>: the tensor-core
 * forward SFU1, the tensor-core backward SFU2 (with tanhf its softcap call
 * ran at 0.93x, docs/perf/2026-11-30-softcap-step-h200.json), the others
 * tanhf), with *dtanh (when given) its derivative by s, 1 - tanh² (the
 * backward's chain rule); alibi s - slope·|dist|. */
template <tanh_form F = TANH_LIBM>
static __device__ __forceinline__ float softcap_step(float s, float cap, float inv_cap, float *dtanh = nullptr) {
  const float t = tanh_as<F>(s * inv_cap);
  if (dtanh) *dtanh = 1.f - t * t;
  return cap * t;
}
static __device__ __forceinline__ float alibi_step(float s, float slope, float dist) {
  return fmaf(-slope, fabsf(dist), s);
}
/* The steps, on key j0 + k (kf = k as a float). */
template <tanh_form F = TANH_LIBM>
static __device__ __forceinline__ float rule_softcap(const score_rule &ru, float s, float *dtanh = nullptr) {
  return softcap_step<F>(s, ru.cap, ru.inv_cap, dtanh);
}
static __device__ __forceinline__ float rule_alibi(const score_rule &ru, float s, float kf) {
  return alibi_step(s, ru.slope, ru.dist0 - kf);
}
static __device__ __forceinline__ float rule_mask_float(const score_rule &ru, float s, int k) {
  return s + ((const float *)ru.mask)[k * ru.ms];
}
static __device__ __forceinline__ bool rule_mask_keeps(const score_rule &ru, int k) {
  return ((const uint8_t *)ru.mask)[k * ru.ms] != 0;
}
/* Keys k and k + 1 (k even) in one access, when ru.pairs. */
static __device__ __forceinline__ float2 rule_mask_float2(const score_rule &ru, int k) {
  return *(const float2 *)((const float *)ru.mask + k);
}
/* The final score of key j for query row i from the raw dot product, or
 * -inf when the key is outside [lo, hi) or the bool mask says no (the
 * kernels that take one score at a time).  chain, when given: the
 * derivative of the score by the dot product (the backward's chain rule:
 * the scale, times softcap's 1 - tanh^2; alibi and the float mask add
 * constants). */
static __device__ __forceinline__ float attn_score(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                   float dot, int64_t lo, int64_t hi, float *chain = nullptr) {
  if (j < lo || j >= hi) return -INFINITY;
  const score_rule ru = score_rule_at(p, b, h, i, j);
  if (ru.mask && !ru.mask_float && !rule_mask_keeps(ru, 0)) return -INFINITY;
  float s = dot * ru.scale;
  if (chain) *chain = ru.scale;
  if (ru.cap > 0.f) {
    float dt;
    s = rule_softcap(ru, s, &dt);
    if (chain) *chain = ru.scale * dt;
  }
  if (ru.slope != 0.f) s = rule_alibi(ru, s, 0.f);
  if (ru.mask && ru.mask_float) s = rule_mask_float(ru, s, 0);
  return s;
}

/* The words of a row of a bool mask's bits (fa_attn_problem.mask_bits,
 * attention_mask_bits.cu): ceil(Lk / 128)·4 of keys, then eight of padding
 * whose last two hold the row's first kept key and one past its last
 * (first >= end: none kept).  A tile's read (frag_mask_bits) ends at
 * least two words before them. */
static __host__ __device__ inline int64_t attn_mask_bits_row_words(int64_t Lk) { return (Lk + 127) / 128 * 4 + 8; }

/* What the rule of problem type PROB adds to the kernels: score, a key's
 * score for the kernels that take one at a time (the SIMT kernel);
 * score_chain, the same with its derivative by the dot product (the SIMT
 * backward); kept and narrow_to, the keys [*lo, *hi) a query tile from
 * row i0 on must visit (the tensor-core kernels, through attn_keys);
 * tile_empty (the SIMT backward); tiles (the tensor-core backward).  For
 * fa_attn_problem: attn_score, and the key range narrowed to the keys a
 * bool mask keeps.  The run-time compiled variants
 * (attention_variant.cuh) specialise it for their problem type: score_mod
 * (and its derivative) and mask_mod, and the key tiles that mask_mod leaves
 * empty skipped. */
template <typename PROB> struct attn_rule {
  /* whether the rule has tiles of its own to skip (the variants' mask_mod: attention_backward_wgmma.cuh) */
  static constexpr bool tiles = false;
  static __device__ __forceinline__ float score(const PROB &p, int64_t b, int64_t h, int64_t i, int64_t j, float dot,
                                                int64_t lo, int64_t hi) {
    return attn_score(p, b, h, i, j, dot, lo, hi);
  }
  static __device__ __forceinline__ float score_chain(const PROB &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                      float dot, int64_t lo, int64_t hi, float *chain) {
    return attn_score(p, b, h, i, j, dot, lo, hi, chain);
  }
  /* The tensor-core kernels' keys [*lo, *hi) for the query tile of ROWS
   * rows from i0, narrowed to those a bool mask read as bits keeps for some
   * row of it (the rows' ranges: attn_mask_bits_row_words), the start on a
   * multiple of 128; none: 0, 0 (the rows' zeros and lse = -inf).  Rows
   * past Lq have no mask row.  In two steps, so that a kernel can load at
   * its start (kept: ROWS / 32 independent 8-byte loads a lane) and narrow
   * after its first barrier (narrow_to, by whole warps), the loads' latency
   * passing under it: attn_keys does both for the instances that can hold
   * a mask. */
  template <int ROWS> struct keys_kept {
    uint2 r[ROWS / 32]; /* rows lane + 32·n: first kept key, one past the last */
  };
  template <int ROWS>
  static __device__ __forceinline__ keys_kept<ROWS> kept(const PROB &p, int64_t b, int64_t h, int64_t i0) {
    keys_kept<ROWS> k;
    const int64_t *bs = p.mask_bits_strides;
    const uint32_t *ends = p.mask_bits + b * bs[0] + h * bs[1] + attn_mask_bits_row_words(p.Lk) - 2;
    const int64_t i = i0 + (threadIdx.x & 31);
#pragma unroll
    for (int n = 0; n < ROWS / 32; n++)
      k.r[n] = p.mask_bits && i + 32 * n < p.Lq ? __ldg((const uint2 *)(ends + (i + 32 * n) * bs[2]))
                                                : make_uint2(0x7fffffffu, 0);
    return k;
  }
  template <int ROWS>
  static __device__ __forceinline__ void narrow_to(const PROB &p, const keys_kept<ROWS> &k, int64_t *lo, int64_t *hi) {
    if (!p.mask_bits) return;
    uint32_t first = 0x7fffffffu, end = 0;
#pragma unroll
    for (int n = 0; n < ROWS / 32; n++) first = min(first, k.r[n].x), end = max(end, k.r[n].y);
    first = __reduce_min_sync(0xffffffffu, first), end = __reduce_max_sync(0xffffffffu, end);
    *lo = max(*lo, (int64_t)(first & ~127u)), *hi = min(*hi, (int64_t)end);
    if (*hi <= *lo) *lo = *hi = 0;
  }
  /* whether no pair of rows i0..i1 and keys j0..j1 (inclusive) attends,
   * known for the whole tile (the SIMT backward skips it): never here */
  static __device__ __forceinline__ bool tile_empty(const PROB &, int64_t, int64_t, int64_t, int64_t, int64_t,
                                                    int64_t) {
    return false;
  }
};

/* Element offset of row i of head h of batch b in an operand of strides st
 * (API §6: any batch, head and sequence strides, the last dimension
 * contiguous). */
static __host__ __device__ __forceinline__ int64_t attn_at(const fa_attn_strides &st, int64_t b, int64_t h, int64_t i) {
  return b * st.b + h * st.h + i * st.s;
}
/* lse's place for row i of head h of batch b (the backward reads the forward's, f32). */
static __device__ __forceinline__ float &attn_lse_at(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i) {
  return p.lse[attn_at(p.lse_st, b, h, i)];
}
/* Whether the call wants lse: in f32 (p.lse), or in f64 (p.lse64: an f32 opts.splits piece, src/splits.c;
 * only the kernels that take f32 write that form: attn_lse_store). */
static __device__ __forceinline__ bool attn_wants_lse(const fa_attn_problem &p) { return p.lse || p.lse64; }
/* Whether every row of an operand at ptr (strides st, elements of es
 * bytes) starts on 16 bytes: the pointer and its batch, head and sequence
 * strides in bytes; attn_rows_aligned16: q, k, v and o all do (the
 * tensor-core kernels' 16-byte copies and stores). */
static inline bool attn_rows_on16(const void *ptr, const fa_attn_strides &st, int64_t es) {
  return ((uintptr_t)ptr | (uint64_t)((st.b | st.h | st.s) * es)) % 16 == 0;
}
static inline bool attn_rows_aligned16(const fa_attn_problem *p) {
  const int64_t es = p->compute == FA_F32 ? 4 : 2;
  return attn_rows_on16(p->q, p->q_st, es) && attn_rows_on16(p->k, p->k_st, es) && attn_rows_on16(p->v, p->v_st, es) &&
         attn_rows_on16(p->o, p->o_st, es);
}

/* Whether q, k and v's rows lie D (Dv) elements apart, as in contiguous
 * heads: the tensor-core kernels' DENSE instances, whose row offsets are
 * constants, take these calls. */
static inline bool attn_rows_dense(const fa_attn_problem *p) {
  return p->q_st.s == p->D && p->k_st.s == p->D && p->v_st.s == p->Dv;
}

#ifndef __CUDACC_RTC__
/* A launch of `blocks` query-tile blocks along the grid's x dimension, which
 * takes at most 2^31 - 1: FA_OK, or the error every attention kernel gives. */
static inline fa_status attn_grid_fits(fa_context *ctx, int64_t blocks) {
  if (blocks <= INT32_MAX) return FA_OK;
  return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: attention on cuda: too many query tiles (%lld blocks, at most %d)",
                 (long long)blocks, INT32_MAX);
}

/* One launch of fn (args: its parameters); dependent: a programmatic
 * dependent launch of the kernel queued just before it on s, whose blocks
 * let it be placed (griddepcontrol.launch_dependents, or their end) and
 * for whose memory it waits at griddepcontrol.wait.  Only where both run
 * code for sm_90 or later: sm_80 code has no griddepcontrol. */
static inline cudaError_t attn_launch(const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s, void **args,
                                      bool dependent) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = s;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = &attr, cfg.numAttrs = dependent ? 1 : 0;
  return cudaLaunchKernelExC(&cfg, fn, args);
}
#endif

static __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
static __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* Which part of the per-score rule beyond the key range and the scale
 * (masks, alibi, softcap) a fast kernel's instance compiles (its EXTRAS
 * parameter): none; softcap and alibi; or the masks as well (with softcap
 * and alibi when set).  The instances without masks carry no mask code:
 * compiled in, it cost softcap and alibi 3-8 % (the registers of the
 * paired mask reads; docs/perf/2026-11-25-attention-h100-extras.json).
 * EXTRAS_VARIANT: all of it with a traced score_mod / mask_mod (API §9),
 * instantiated only in the run-time compiled variants
 * (attention_variant.cuh, whose frag_variant_tile applies it). */
enum { EXTRAS_NONE = 0, EXTRAS_SCORE, EXTRAS_MASK, EXTRAS_VARIANT };
static inline int attn_extras_kind(const fa_attn_problem *p) {
  if (p->mask_b || p->mask_f) return EXTRAS_MASK;
  return p->alibi || p->softcap > 0 ? EXTRAS_SCORE : EXTRAS_NONE;
}
/* Whether a call needs any of that rule. */
static inline bool attn_has_extras(const fa_attn_problem *p) { return attn_extras_kind(p) != EXTRAS_NONE; }

/* A query tile's keys narrowed by its rule (attn_rule::kept at the
 * kernel's start, narrow after its first barrier), in the instances of
 * score rule EXTRAS that can hold a mask; nothing (no code) in the others.
 * Made and narrowed by whole warps. */
template <typename PROB, int ROWS, int EXTRAS> struct attn_keys {
  typename attn_rule<PROB>::template keys_kept<ROWS> k;
  __device__ __forceinline__ attn_keys(const PROB &p, int64_t b, int64_t h, int64_t i0) {
    if constexpr (EXTRAS >= EXTRAS_MASK) k = attn_rule<PROB>::template kept<ROWS>(p, b, h, i0);
  }
  __device__ __forceinline__ void narrow(const PROB &p, int64_t *lo, int64_t *hi) const {
    if constexpr (EXTRAS >= EXTRAS_MASK) attn_rule<PROB>::template narrow_to<ROWS>(p, k, lo, hi);
  }
};

/* What a fast kernel instance computes: "flash" (the one-pass online
 * softmax), or one pass of "two_pass": the rows' final (m, l) into
 * p.row_stats from the scores alone (no V), then O with those statistics
 * (no rescaling). */
enum { PASS_FLASH = 0, PASS_STATS, PASS_OUTPUT };

#ifndef __CUDACC_RTC__
/* A launcher's kernel instance for run-time values: f called with
 * std::integral_constant<int, V>() for the first V of Vs equal to v (the
 * last of Vs when none is), so that each kernel's file names its instances
 * by pass and score rule in one line, e.g.
 *   attn_instance<PASS_STATS, PASS_OUTPUT, PASS_FLASH>(pass, [&](auto ps) {
 *     return launch<T, D, decltype(ps)::value>(ctx, p); });  */
template <int V, int... Vs, typename F> static inline fa_status attn_instance(int v, F &&f) {
  if constexpr (sizeof...(Vs) == 0) {
    (void)v;
    return f(std::integral_constant<int, V>());
  } else {
    if (v == V) return f(std::integral_constant<int, V>());
    return attn_instance<Vs...>(v, f);
  }
}
/* f(extras, pass) for the pass and the call's rule (attn_extras_kind): the
 * instances of the kernels that have all three passes and rules. */
template <typename F> static inline fa_status attn_instance_by_rule_and_pass(const fa_attn_problem *p, int pass, F &&f) {
  return attn_instance<EXTRAS_MASK, EXTRAS_SCORE, EXTRAS_NONE>(attn_extras_kind(p), [&](auto x) {
    return attn_instance<PASS_STATS, PASS_OUTPUT, PASS_FLASH>(pass, [&](auto ps) { return f(x, ps); });
  });
}
#endif

/* lse of a finished row: -inf for an empty row (l = 0), NaN stays NaN. */
static __device__ __forceinline__ float row_lse(float m, float l) { return l == 0.f ? -INFINITY : m + logf(l); }
/* A finished row's lse into element `at` of the call's: f32 (p.lse), or
 * f64 (p.lse64: an f32 opts.splits piece, whose merge weighs the pieces by
 * e^(lse - max)) without f32's rounding of m + ln l at |m| (half an ulp of
 * 8192 is 5e-4 on a piece's weight). */
static __device__ __forceinline__ void attn_lse_store(const fa_attn_problem &p, int64_t at, float m, float l) {
  if (p.lse64) p.lse64[at] = l == 0.f ? -INFINITY : (double)m + (double)logf(l);
  else p.lse[at] = row_lse(m, l);
}
/* 1 / l of a finished row: 0 for an empty row (its O is zeros), NaN stays NaN. */
static __device__ __forceinline__ float row_inv(float l) { return l > 0.f ? 1.f / l : (l == l ? 0.f : l); }

#endif
