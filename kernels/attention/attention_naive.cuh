/* "naive" attention's row kernel (attention_naive.cu runs the method: S =
 * Q·Kᵀ and O = P·V through cuBLAS around it): the score rule and the
 * softmax of each row of S, P written in the inputs' dtype.  A template on
 * the problem type, so that the run-time compiled variants
 * (attention_variant.cuh) instantiate it with their rule (attn_rule). */
#ifndef FA_KERNELS_ATTENTION_NAIVE_CUH
#define FA_KERNELS_ATTENTION_NAIVE_CUH

#include "attention_common.cuh"
#include "online_state.cuh"

#define NAIVE_FLT_MAX 3.402823466e38f /* FLT_MAX (no float.h under NVRTC) */

#define NAIVE_THREADS 256    /* a block: 8 rows (a warp each), or one long row */
/* Longer rows take a block each: with a warp each, the grid that keeps
 * their S within L2 would leave too few warps per SM to keep the memory
 * busy (at 2048 keys it still has about 24). */
#define NAIVE_LONG_ROW 2048

/* e^x is fa_exp (online_state.cuh, on the SFU; weights below 2^-126
 * flushed to 0): the tests' f32 tolerance (1e-5) leaves room for it, so
 * every dtype uses it.  x is always a difference s - m taken in f32 first,
 * so that the rounding of the log2 e product does not grow with the scores'
 * size. */

/* The score of key j, -inf when masked (EXTRAS: PROB's rule, attn_rule).
 * Without extras it is the key range and the scale: no int64 mask offset per element, and the same
 * bits as attn_score (a call with an all-true mask gives the same P). */
template <bool EXTRAS, typename PROB>
static __device__ __forceinline__ float naive_score(const PROB &p, int64_t b, int64_t h, int64_t i, int j, float dot,
                                                    int lo, int hi, float scale) {
  if (EXTRAS) return attn_rule<PROB>::score(p, b, h, i, j, dot, lo, hi);
  return j >= lo && j < hi ? dot * scale : -INFINITY;
}

/* One score into the running (max m, sum d), one exponential: x =
 * e^-|s-m| rescales d when s is the new max (d·x + 1), else is s's weight
 * (d·1 + x).  A masked key (-inf) gets x = 0 (m is clamped to finite for
 * the difference, so that an empty m gives no (-inf) - (-inf) = NaN); a
 * NaN score is dropped by the max but reaches d.  No branches: the
 * unrolled loop's loads can all be issued before its arithmetic. */
static __device__ __forceinline__ void md_add(float s, float &m, float &d) {
  const bool up = s > m;
  const float x = fa_exp(-fabsf(s - fmaxf(m, -NAIVE_FLT_MAX)));
  d = fmaf(d, up ? x : 1.f, up ? 1.f : x);
  m = fmaxf(m, s);
}

/* P of one score, e^(s-m)/d, or -0 for a masked key.  mc is m clamped to
 * finite, so that the exponential is taken for every key without a NaN
 * from (-inf) - (-inf) and the select needs no branch. */
static __device__ __forceinline__ float p_of(float s, float mc, float inv) {
  const float w = fa_exp(s - mc) * inv;
  return s == -INFINITY ? -0.f : w;
}

/* Four P values, stored at once (8 bytes for f16/bf16, 16 for f32). */
template <typename T> struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

/* P = softmax(score rule(S)) per query row, 32·WPR threads a row (WPR = 1:
 * a warp per row, 8 rows a block; WPR = 8: a block per row, for rows past
 * NAIVE_LONG_ROW keys).  Pass 1 reads the row for its online (max, sum),
 * merged across the warp by shuffles and, with a block per row, across its
 * warps through shared memory (one barrier a row); pass 2 re-reads it (the
 * last use: streamed) and writes P = e^(s-m)/d.  Short rows keep a warp
 * each: they would not repay a barrier (an earlier block-per-row kernel ran
 * at a quarter of the bandwidth).  Long rows take a block each so that few
 * are in flight per SM and, with the launcher's grid, their S is still in
 * L2 for pass 2.  When Lk % 4 == 0 every row of S (of P) is 16-byte
 * (8-byte) aligned and is read (written) in chunks of 4; otherwise the
 * tail loops do the whole row one element at a time. */
template <typename T, bool EXTRAS, int WPR, typename PROB = fa_attn_problem>
__global__ void __launch_bounds__(NAIVE_THREADS)
    naive_softmax_kernel(PROB p, const float *__restrict__ S, T *__restrict__ P, int64_t rows) {
  static_assert(WPR == 1 || 32 * WPR == NAIVE_THREADS, "the barrier needs every thread of a block on one row");
  const int nt = 32 * WPR, t = threadIdx.x % nt, rpb = NAIVE_THREADS / nt; /* threads a row, place, rows a block */
  const int lane = threadIdx.x & 31;
  const int64_t Lk = p.Lk;
  const int nv = Lk % 4 ? 0 : (int)(Lk / 4); /* float4 chunks a row (Lk <= INT32_MAX) */
  const float scale = p.scale_f;
  constexpr int U = EXTRAS ? 2 : 4; /* chunks a thread has in flight (fewer with attn_score's registers) */
  __shared__ float2 part[2][WPR]; /* the warps' states, two rows' worth: one barrier a row */
  int buf = 0;
  for (int64_t row = (int64_t)blockIdx.x * rpb + threadIdx.x / nt; row < rows;
       row += (int64_t)gridDim.x * rpb, buf ^= 1) {
    const int64_t i = row % p.Lq, bh = row / p.Lq, b = bh / p.Hq, h = bh % p.Hq;
    const float *srow = S + row * Lk;
    T *prow = P + row * Lk;
    int64_t lo64, hi64;
    fa_attn_range_of(&p, b, i, &lo64, &hi64);
    const int lo = (int)lo64, hi = (int)hi64; /* both in [0, Lk] */

    float m = -INFINITY, d = 0.f;
#pragma unroll(U)
    for (int c = t; c < nv; c += nt) {
      const float4 s = ((const float4 *)srow)[c];
      md_add(naive_score<EXTRAS, PROB>(p, b, h, i, 4 * c, s.x, lo, hi, scale), m, d);
      md_add(naive_score<EXTRAS, PROB>(p, b, h, i, 4 * c + 1, s.y, lo, hi, scale), m, d);
      md_add(naive_score<EXTRAS, PROB>(p, b, h, i, 4 * c + 2, s.z, lo, hi, scale), m, d);
      md_add(naive_score<EXTRAS, PROB>(p, b, h, i, 4 * c + 3, s.w, lo, hi, scale), m, d);
    }
#pragma unroll(U)
    for (int64_t j = 4 * (int64_t)nv + t; j < Lk; j += nt)
      md_add(naive_score<EXTRAS, PROB>(p, b, h, i, (int)j, srow[j], lo, hi, scale), m, d);
    MD<float> st = warp_reduce_md(MD<float>{m, d});
    if (WPR > 1) { /* each warp merges all the warps' states alike, so every thread gets the same (m, d) */
      if (lane == 0) part[buf][threadIdx.x >> 5] = make_float2(st.m, st.d);
      __syncthreads();
      const float2 w = part[buf][lane % WPR];
      st = md_reduce_lanes(MD<float>{w.x, w.y}, WPR);
    }
    m = st.m, d = st.d;

    const float inv = row_inv(d), mc = fmaxf(m, -NAIVE_FLT_MAX);
    /* a masked key's weight is -0: the same product in cuBLAS, and a mark
     * for the path that must skip masked keys (non-finite values in v).
     * U chunks are loaded before any is stored: a store between two loads
     * would hold the second back (the compiler cannot tell S from P). */
    for (int c0 = t; c0 < nv; c0 += U * nt) {
      float4 s[U];
#pragma unroll
      for (int q = 0; q < U; q++)
        if (c0 + q * nt < nv) s[q] = __ldcs((const float4 *)srow + c0 + q * nt);
#pragma unroll
      for (int q = 0; q < U; q++) {
        const int c = c0 + q * nt;
        if (c >= nv) break;
        Vec4<T> w;
        w.v[0] = from_float<T>(p_of(naive_score<EXTRAS, PROB>(p, b, h, i, 4 * c, s[q].x, lo, hi, scale), mc, inv));
        w.v[1] = from_float<T>(p_of(naive_score<EXTRAS, PROB>(p, b, h, i, 4 * c + 1, s[q].y, lo, hi, scale), mc, inv));
        w.v[2] = from_float<T>(p_of(naive_score<EXTRAS, PROB>(p, b, h, i, 4 * c + 2, s[q].z, lo, hi, scale), mc, inv));
        w.v[3] = from_float<T>(p_of(naive_score<EXTRAS, PROB>(p, b, h, i, 4 * c + 3, s[q].w, lo, hi, scale), mc, inv));
        ((Vec4<T> *)prow)[c] = w;
      }
    }
    for (int64_t j = 4 * (int64_t)nv + t; j < Lk; j += nt)
      prow[j] = from_float<T>(p_of(naive_score<EXTRAS, PROB>(p, b, h, i, (int)j, __ldcs(&srow[j]), lo, hi, scale), mc, inv));
    if (attn_wants_lse(p) && t == 0) attn_lse_store(p, attn_at(p.lse_st, b, h, i), m, d);
  }
}

#ifndef __CUDACC_RTC__
/* The grid of the row kernel (WPR warps a row): at most one block per row
 * group (and 2^18), and, for rows whose S (4·Lk bytes) would not stay in L2
 * between the two passes, only as many blocks as keep the rows in flight to
 * half of L2, at least one a SM (a row longer than that misses L2 whatever
 * the schedule). */
static inline fa_status naive_softmax_grid(fa_context *ctx, const fa_attn_problem *p, int wpr, int64_t rows,
                                           int64_t *grid) {
  const int64_t rpb = NAIVE_THREADS / (32 * wpr);
  fa_cuda_props dp;
  if (fa_status st = fa_cuda_device_props(ctx, &dp)) return st;
  const int64_t fit = (int64_t)dp.l2_bytes / 2 / (4 * fa_max64(p->Lk, 1)) / rpb;
  const int64_t g = (rows + rpb - 1) / rpb;
  *grid = fa_min64(g, fa_min64(fa_max64(fit, dp.sms), 65536 * 4));
  return FA_OK;
}
/* "naive" for p (S and P in memory, the products by cuBLAS, NaN or inf in V
 * handled): the row kernel launched by launch(ctx, p, S, P, rows, user)
 * when given (a variant's compiled instance: attention_variant.cu), else
 * the built-in rule's (attention_naive.cu). */
typedef fa_status (*naive_softmax_launch)(fa_context *ctx, const fa_attn_problem *p, const float *S, void *P,
                                          int64_t rows, void *user);
extern "C" fa_status fa_cuda_attention_naive_with(fa_context *ctx, const fa_attn_problem *p, naive_softmax_launch launch,
                                                  void *user);
/* The warps a row: a block for rows past NAIVE_LONG_ROW keys. */
static inline int naive_softmax_wpr(const fa_attn_problem *p) { return p->Lk > NAIVE_LONG_ROW ? NAIVE_THREADS / 32 : 1; }
#endif

#endif
