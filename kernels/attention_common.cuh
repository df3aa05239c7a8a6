/* Device helpers shared by the CUDA attention kernels: element loads, the
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

static __device__ __forceinline__ float to_float(float v) { return v; }
static __device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
static __device__ __forceinline__ float to_float(__nv_bfloat16 v) { return fa_bf16_to_float(__bfloat16_as_ushort(v)); }
template <typename T> static __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
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
  ru.scale = (float)p.scale;
  ru.cap = (float)p.softcap, ru.inv_cap = p.softcap > 0 ? (float)(1.0 / p.softcap) : 0.f; /* c fitted to f32 (resolve_options) */
  ru.slope = p.alibi ? (float)p.alibi[h] : 0.f;
  ru.dist0 = (float)(i + p.Lk - p.Lq - j0);
  return ru;
}
/* The steps, on key j0 + k (kf = k as a float). */
static __device__ __forceinline__ float rule_softcap(const score_rule &ru, float s) { return ru.cap * tanhf(s * ru.inv_cap); }
static __device__ __forceinline__ float rule_alibi(const score_rule &ru, float s, float kf) {
  return fmaf(-ru.slope, fabsf(ru.dist0 - kf), s);
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
static __device__ __forceinline__ unsigned rule_mask_bytes2(const score_rule &ru, int k) {
  return *(const uint16_t *)((const uint8_t *)ru.mask + k); /* key k in bits 0-7, k + 1 in bits 8-15 */
}
/* The final score of key j for query row i from the raw dot product, or
 * -inf when the key is outside [lo, hi) or the bool mask says no (the
 * kernels that take one score at a time). */
static __device__ __forceinline__ float attn_score(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                   float dot, int64_t lo, int64_t hi) {
  if (j < lo || j >= hi) return -INFINITY;
  const score_rule ru = score_rule_at(p, b, h, i, j);
  if (ru.mask && !ru.mask_float && !rule_mask_keeps(ru, 0)) return -INFINITY;
  float s = dot * ru.scale;
  if (ru.cap > 0.f) s = rule_softcap(ru, s);
  if (ru.slope != 0.f) s = rule_alibi(ru, s, 0.f);
  if (ru.mask && ru.mask_float) s = rule_mask_float(ru, s, 0);
  return s;
}

/* Element offset of row i of head h of batch b in an operand of strides st
 * (API §6: any batch, head and sequence strides, the last dimension
 * contiguous). */
static __host__ __device__ __forceinline__ int64_t attn_at(const fa_attn_strides &st, int64_t b, int64_t h, int64_t i) {
  return b * st.b + h * st.h + i * st.s;
}
/* lse's place for row i of head h of batch b. */
static __device__ __forceinline__ float &attn_lse_at(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i) {
  return p.lse[attn_at(p.lse_st, b, h, i)];
}
/* Whether every row of q, k, v and o starts on 16 bytes (their pointers,
 * and their batch, head and sequence strides in bytes): the tensor-core
 * kernels' 16-byte copies and stores. */
static inline bool attn_rows_aligned16(const fa_attn_problem *p) {
  const int64_t es = p->compute == FA_F32 ? 4 : 2;
  const fa_attn_strides *st[4] = {&p->q_st, &p->k_st, &p->v_st, &p->o_st};
  uint64_t bits = (uintptr_t)p->q | (uintptr_t)p->k | (uintptr_t)p->v | (uintptr_t)p->o;
  for (int i = 0; i < 4; i++) bits |= (uint64_t)((st[i]->b | st[i]->h | st[i]->s) * es);
  return bits % 16 == 0;
}

/* Whether q, k and v's rows lie D (Dv) elements apart, as in contiguous
 * heads: the tensor-core kernels' DENSE instances, whose row offsets are
 * constants, take these calls. */
static inline bool attn_rows_dense(const fa_attn_problem *p) {
  return p->q_st.s == p->D && p->k_st.s == p->D && p->v_st.s == p->Dv;
}

static __device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
static __device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/* The exponent bits of a 32-bit word's element(s) of dtype T: all set is
 * NaN or inf (one f32, or two f16 / bf16). */
template <typename T> struct nonfinite_bits;
template <> struct nonfinite_bits<float> { static const uint32_t mask = 0x7F800000u; };
template <> struct nonfinite_bits<__half> { static const uint32_t mask = 0x7C007C00u; };
template <> struct nonfinite_bits<__nv_bfloat16> { static const uint32_t mask = 0x7F807F80u; };

/* Whether 16 bytes of T elements hold NaN or inf. */
template <typename T> static __device__ __forceinline__ bool words_nonfinite(const uint4 &w) {
  const uint32_t m = nonfinite_bits<T>::mask;
  if (sizeof(T) == 4) return ((w.x & m) == m) | ((w.y & m) == m) | ((w.z & m) == m) | ((w.w & m) == m);
  return (__vcmpeq2(w.x & m, m) | __vcmpeq2(w.y & m, m) | __vcmpeq2(w.z & m, m) | __vcmpeq2(w.w & m, m)) != 0;
}

/* Sets *flag when any of the n values at v (dtype T) is NaN or inf; 16
 * bytes a load when v is 16-byte aligned. */
template <typename T> __global__ void any_nonfinite_kernel(const T *v, int64_t n, int *flag) {
  typedef typename std::conditional<sizeof(T) == 4, uint32_t, uint16_t>::type W;
  const int per = 16 / sizeof(T);
  const int64_t stride = (int64_t)gridDim.x * blockDim.x, first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int64_t nvec = ((uintptr_t)v % 16) ? 0 : n / per;
  const W m = (W)nonfinite_bits<T>::mask;
  bool bad = false;
  for (int64_t i = first; i < nvec; i += stride) bad |= words_nonfinite<T>(((const uint4 *)v)[i]);
  for (int64_t i = nvec * per + first; i < n; i += stride) bad |= (W)(((const W *)v)[i] & m) == m;
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

/* The same over strided values (API §6): the rows of Dv elements at
 * attn_at(v_st, b, h, l), head (b, h) by head along grid y, its rows along
 * x (no 64-bit division a row).  VEC (rows of 16-byte multiples on 16
 * bytes): each lane takes a 16-byte chunk, a warp 32 >> shift rows a step
 * (a row's chunks on 1 << shift lanes); else a warp a row, a lane an
 * element.  A warp a row with an element a lane made the scan of a strided
 * 64 MB V cost a fifth of the call it guards (2026-11-25, H100). */
template <typename T, bool VEC> __global__ void any_nonfinite_rows_kernel(fa_attn_problem p, int shift, int *flag) {
  typedef typename std::conditional<sizeof(T) == 4, uint32_t, uint16_t>::type W;
  const W m = (W)nonfinite_bits<T>::mask;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int per = VEC ? 32 >> shift : 1, sub = VEC ? lane >> shift : 0, col = VEC ? lane & ((1 << shift) - 1) : lane;
  const int64_t cpr = VEC ? p.Dv * (int64_t)sizeof(T) / 16 : p.Dv; /* chunks (elements) a row */
  const int64_t step = (int64_t)gridDim.x * wpb * per;
  bool bad = false;
  for (int64_t bh = blockIdx.y; bh < p.B * p.Hkv; bh += gridDim.y) {
    const T *head = (const T *)p.v + attn_at(p.v_st, bh / p.Hkv, bh % p.Hkv, 0);
    for (int64_t l = ((int64_t)blockIdx.x * wpb + warp) * per + sub; l < p.Lk; l += step) {
      const T *row = head + l * p.v_st.s;
      if (VEC) {
        for (int64_t c = col; c < cpr; c += 1 << shift) bad |= words_nonfinite<T>(((const uint4 *)row)[c]);
      } else {
        for (int64_t c = col; c < cpr; c += 32) bad |= (W)(((const W *)row)[c] & m) == m;
      }
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

/* Whether v's rows lie one after another, as a contiguous (B, Hkv, Lk, Dv)
 * tensor's (one flat pass then covers them). */
static inline bool attn_v_dense(const fa_attn_problem *p) {
  const fa_attn_strides d = fa_attn_strides_dense(p->Hkv, p->Lk, p->Dv);
  return (p->B == 1 || p->v_st.b == d.b) && (p->Hkv == 1 || p->v_st.h == d.h) && (p->Lk == 1 || p->v_st.s == d.s);
}

/* Queues on stream s the pass that sets *flag when the values v (f32, f16
 * or bf16) hold NaN or inf. */
template <typename T> static inline void queue_nonfinite_scan_typed(const fa_attn_problem *p, int *flag, cudaStream_t s) {
  const int64_t n = p->B * p->Hkv * p->Lk * p->Dv;
  const unsigned blocks = (unsigned)min((n / 8 + 255) / 256 + 1, (int64_t)2048);
  if (attn_v_dense(p)) {
    any_nonfinite_kernel<T><<<blocks, 256, 0, s>>>((const T *)p->v, n, flag);
    return;
  }
  const int64_t es = sizeof(T), cpr = p->Dv * es / 16, heads = p->B * p->Hkv;
  const bool vec = (p->Dv * es) % 16 == 0 &&
                   (((uintptr_t)p->v | (uint64_t)((p->v_st.b | p->v_st.h | p->v_st.s) * es)) % 16) == 0;
  int shift = 0; /* a row's chunks on 1 << shift lanes (at most 32) */
  while (vec && shift < 5 && (1 << shift) < cpr) shift++;
  const dim3 grid((unsigned)max((int64_t)1, blocks / max(heads, (int64_t)1)), (unsigned)min(heads, (int64_t)65535));
  if (vec) any_nonfinite_rows_kernel<T, true><<<grid, 256, 0, s>>>(*p, shift, flag);
  else any_nonfinite_rows_kernel<T, false><<<grid, 256, 0, s>>>(*p, 0, flag);
}
static inline cudaError_t queue_nonfinite_scan(const fa_attn_problem *p, int *flag, cudaStream_t s) {
  if (p->B * p->Hkv * p->Lk * p->Dv <= 0) return cudaSuccess;
  if (p->compute == FA_F32) queue_nonfinite_scan_typed<float>(p, flag, s);
  else if (p->compute == FA_F16) queue_nonfinite_scan_typed<__half>(p, flag, s);
  else queue_nonfinite_scan_typed<__nv_bfloat16>(p, flag, s);
  return cudaGetLastError();
}

/* A device int (from the pool: the caller frees it with fa_cuda_free) set
 * to 0 on the stream; with scan, then set to 1 when the values v hold NaN
 * or inf: one pass over v, no wait. */
static inline fa_status values_nonfinite_flag(fa_context *ctx, const fa_attn_problem *p, int **flag, bool scan = true) {
  *flag = NULL;
  void *f = NULL;
  fa_status st = fa_cuda_malloc(ctx, &f, sizeof(int));
  if (st) return st;
  cudaStream_t s = fa_cuda_stream(ctx);
  cudaError_t err = cudaMemsetAsync(f, 0, sizeof(int), s);
  if (err == cudaSuccess && scan) err = queue_nonfinite_scan(p, (int *)f, s);
  if ((st = fa_cuda_error(ctx, err, "the NaN/inf check of v"))) {
    fa_cuda_free(f, sizeof(int));
    return st;
  }
  *flag = (int *)f;
  return FA_OK;
}

/* Which part of the per-score rule beyond the key range and the scale
 * (masks, alibi, softcap) a fast kernel's instance compiles (its EXTRAS
 * parameter): none; softcap and alibi; or the masks as well (with softcap
 * and alibi when set).  The instances without masks carry no mask code:
 * compiled in, it cost softcap and alibi 3-8 % (the registers of the
 * paired mask reads; docs/perf/2026-11-25-attention-h100-extras.json). */
enum { EXTRAS_NONE = 0, EXTRAS_SCORE, EXTRAS_MASK };
static inline int attn_extras_kind(const fa_attn_problem *p) {
  if (p->mask_b || p->mask_f) return EXTRAS_MASK;
  return p->alibi || p->softcap > 0 ? EXTRAS_SCORE : EXTRAS_NONE;
}
/* Whether a call needs any of that rule. */
static inline bool attn_has_extras(const fa_attn_problem *p) { return attn_extras_kind(p) != EXTRAS_NONE; }

/* Queues run(ctx, g, pass) for a fast kernel guarded against NaN or inf in
 * V: g is *p with v_nonfinite set to a fresh device flag, which comes back
 * in *v_flag for the caller to free and to guard its fallback (a kernel
 * that skips masked keys, run after this one) with.  The flag is set while
 * the kernel runs, and a block that starts after it is set does nothing;
 * the fallback then rewrites every output.  With self_check the kernel's
 * blocks check their shares of V themselves (g.v_self_check).
 * Else a pass over V sets it from a side stream, queued after the kernel
 * so that it takes the SMs the kernel's last blocks leave idle (in front
 * of the kernel it cost about 5 % of a 16-bit call at L = 1024), and the
 * context's stream waits for it before anything that follows. */
static inline fa_status launch_guarded_by_v_flag(fa_context *ctx, const fa_attn_problem *p, int pass, int **v_flag,
                                                 fa_status (*run)(fa_context *, const fa_attn_problem *, int),
                                                 bool self_check) {
  int *flag = NULL;
  fa_status st = values_nonfinite_flag(ctx, p, &flag, false);
  if (st) return st;
  fa_attn_problem g = *p;
  g.v_nonfinite = flag;
  g.v_self_check = self_check;
  cudaStream_t side = 0;
  if (!self_check && (st = fa_cuda_fork(ctx, &side))) {
    fa_cuda_free(flag, sizeof(int));
    return st;
  }
  st = run(ctx, &g, pass);
  if (!self_check) {
    const cudaError_t err = st ? cudaSuccess : queue_nonfinite_scan(p, flag, side);
    const fa_status joined = fa_cuda_join(ctx); /* waits here when it cannot be queued */
    if (!st) st = err != cudaSuccess ? fa_cuda_error(ctx, err, "the NaN/inf check of v") : joined;
  }
  if (st) fa_cuda_free(flag, sizeof(int)); /* stream-ordered: after the work queued */
  else *v_flag = flag;
  return st;
}

/* What a fast kernel instance computes: "flash" (the one-pass online
 * softmax), or one pass of "two_pass": the rows' final (m, l) into
 * p.row_stats from the scores alone (no V), then O with those statistics
 * (no rescaling). */
enum { PASS_FLASH = 0, PASS_STATS, PASS_OUTPUT };

/* Queues algo ("flash" or "two_pass") on a fast kernel through run: one
 * guarded launch for flash; for two_pass the statistics pass (it reads no
 * V, so needs no guard) and the guarded output pass, both with *p's
 * row_stats. */
static inline fa_status launch_fast_passes(fa_context *ctx, const fa_attn_problem *p, fa_attention_algo algo,
                                           int **v_flag,
                                           fa_status (*run)(fa_context *, const fa_attn_problem *, int),
                                           bool self_check = false) {
  if (algo != FA_ATTN_TWO_PASS) return launch_guarded_by_v_flag(ctx, p, PASS_FLASH, v_flag, run, self_check);
  fa_status st = run(ctx, p, PASS_STATS);
  return st ? st : launch_guarded_by_v_flag(ctx, p, PASS_OUTPUT, v_flag, run, self_check);
}

/* lse of a finished row: -inf for an empty row (l = 0), NaN stays NaN. */
static __device__ __forceinline__ float row_lse(float m, float l) { return l == 0.f ? -INFINITY : m + logf(l); }
/* 1 / l of a finished row: 0 for an empty row (its O is zeros), NaN stays NaN. */
static __device__ __forceinline__ float row_inv(float l) { return l > 0.f ? 1.f / l : (l == l ? 0.f : l); }

#endif
