/* What the tensor-core backward kernels share (attention_backward_mma.cu
 * with mma.sync, attention_backward_wgmma.cu with Hopper's wgmma): the
 * rows of a query tile, the score rule and the probabilities on the
 * accumulators' layout (attention_frag.cuh: 16 rows a warp, chunks of 8
 * columns), the store of a warp's gradient rows, and which query rows meet
 * a block's keys. */
#ifndef FA_KERNELS_ATTENTION_BACKWARD_COMMON_CUH
#define FA_KERNELS_ATTENTION_BACKWARD_COMMON_CUH

#include "attention_frag.cuh"

/* N accumulator chunks of 8 columns (16 rows a warp) set to zero. */
template <int N> static __device__ __forceinline__ void bwm_zero(float (*acc)[4]) {
#pragma unroll
  for (int n = 0; n < N; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
}

/* What a block knows of the query rows of its tile (index in the tile):
 * key range, lse (natural and base-2), delta; and where staged with REL
 * (the kernels without the score rule's extras), the key range again as
 * kl, kl + kw relative to the staging's j0 (a dK/dV block's key tile, a
 * dQ block's key 0), kw = 0 for a row that takes nothing: bwm_probs's test
 * of a tile that is not full, one unsigned compare a score where the
 * 64-bit range and the lse test took about 8 (H200, D = 128, 1k causal: a
 * diagonal tile ran at 1.9x a full one's time).  Keys past 2^30 (K and V
 * of 256 GB at D = 64) are not told apart: such a call does not fit.
 * dsc = delta · scale, so that without the extras dS is
 * P · fma(dP, scale, -dsc): one multiply a score fewer than
 * P · (dP - delta) · scale, 1.00-1.02x the D = 64 backward's speed (H200,
 * docs/perf/2026-12-02-backward-dsc-h200.json). */
template <int R> struct bwm_rows {
  int64_t lo[R], hi[R];
  float lse[R], lse2[R], delta[R], dsc[R];
  int kl[R], kw[R];
};

/* What row r's lse and delta give (lse2, dsc; REL: kl, kw), for a row
 * whose key range is [lo, hi) (lse -inf: a row that takes nothing, or one
 * past Lq): whether it takes any of keys [j0, j1), and whether it takes
 * all of them (*all). */
template <int R, bool REL>
static __device__ __forceinline__ bool bwm_row_set(const fa_attn_problem &p, bwm_rows<R> &rows, int r, int64_t lo,
                                                   int64_t hi, float lse, float dl, int64_t j0, int64_t j1, bool *all) {
  rows.lse2[r] = lse * FA_LOG2E, rows.dsc[r] = dl * p.scale_f;
  const bool live = lse != -INFINITY; /* an empty row passes nothing back */
  if constexpr (REL) {
    constexpr int64_t far = 1 << 30; /* past any tile's keys */
    const int64_t kl = min(max(lo - j0, (int64_t)0), far), kh = min(max(hi - j0, (int64_t)0), far);
    rows.kl[r] = (int)kl, rows.kw[r] = live && kh > kl ? (int)(kh - kl) : 0;
  }
  *all = live && lo <= j0 && hi >= j1;
  return live && lo < hi && lo < j1 && hi > j0;
}

/* Row r of the tile at i0 of head h (one thread a row), as bwm_row_set. */
template <int R, bool REL = false>
static __device__ __forceinline__ bool bwm_row_load(const fa_attn_problem &p, const float *delta, bwm_rows<R> &rows,
                                                    int64_t b, int64_t h, int64_t i0, int r, int64_t j0, int64_t j1,
                                                    bool *all) {
  const int64_t i = i0 + r;
  int64_t lo = 0, hi = 0;
  float lse = -INFINITY, dl = 0.f;
  if (i < p.Lq) {
    fa_attn_range_of(&p, b, i, &lo, &hi);
    lse = attn_lse_at(p, b, h, i);
    dl = delta[(b * p.Hq + h) * p.Lq + i];
  }
  rows.lo[r] = lo, rows.hi[r] = hi, rows.lse[r] = lse, rows.delta[r] = dl;
  return bwm_row_set<R, REL>(p, rows, r, lo, hi, lse, dl, j0, j1, all);
}

/* bwm_row_load in two steps, so that no thread waits for lse and delta
 * to come from memory: bwm_row_issue stores the row's key range and copies
 * its lse and delta by cp.async (a row past Lq: -inf and 0 stored);
 * bwm_row_finish, once the thread has waited for its copies, the rest.  In
 * one step, the threads that staged the next tile's rows waited there for a
 * round trip to L2 before they issued this tile's products. */
template <int R>
static __device__ __forceinline__ void bwm_row_issue(const fa_attn_problem &p, const float *delta, bwm_rows<R> &rows,
                                                     int64_t b, int64_t h, int64_t i0, int r) {
  const int64_t i = i0 + r;
  int64_t lo = 0, hi = 0;
  if (i < p.Lq) {
    fa_attn_range_of(&p, b, i, &lo, &hi);
    cp_async4(&rows.lse[r], &attn_lse_at(p, b, h, i), 4);
    cp_async4(&rows.delta[r], delta + (b * p.Hq + h) * p.Lq + i, 4);
  } else {
    rows.lse[r] = -INFINITY, rows.delta[r] = 0.f;
  }
  rows.lo[r] = lo, rows.hi[r] = hi;
}
template <int R, bool REL>
static __device__ __forceinline__ void bwm_row_finish(const fa_attn_problem &p, bwm_rows<R> &rows, int r, int64_t j0,
                                                      int64_t j1, bool *all) {
  bwm_row_set<R, REL>(p, rows, r, rows.lo[r], rows.hi[r], rows.lse[r], rows.delta[r], j0, j1, all);
}

/* The rows of query tile (head h, rows from i0) into rows, a thread a row
 * (*all as bwm_row_load's, true in the other threads). */
template <int R, bool REL = false>
static __device__ __forceinline__ void bwm_stage_row_of_thread(const fa_attn_problem &p, const float *delta,
                                                               bwm_rows<R> &rows, int64_t b, int64_t h, int64_t i0,
                                                               int64_t j0, int64_t j1, bool *all) {
  const int r = (int)threadIdx.x;
  *all = true;
  if (r < R) bwm_row_load<R, REL>(p, delta, rows, b, h, i0, r, j0, j1, all);
}

/* A dK/dV block's stage of query tile (head h, rows from i0): its Q tile
 * at qs and dO tile at qs + qt_bytes (cp.async; WGMMA: load_tile's layout,
 * D the tile's width, DG the rows'), and its rows (bwm_stage_row_of_thread). */
template <typename T, int D, int R, int THREADS, bool WGMMA, int DG = D, bool REL = false>
static __device__ __forceinline__ void bwm_stage_rows(char *qs, int qt_bytes, const fa_attn_problem &p,
                                                      const fa_attn_grads &g, const float *delta, bwm_rows<R> &rows,
                                                      int64_t b, int64_t h, int64_t i0, int64_t j0, int64_t j1,
                                                      bool *all) {
  load_tile<T, D, R, THREADS, WGMMA, false, DG>(qs, (const T *)p.q + attn_at(p.q_st, b, h, 0), p.q_st.s, i0, p.Lq);
  load_tile<T, D, R, THREADS, WGMMA, false, DG>(qs + qt_bytes, (const T *)g.dout + attn_at(g.dout_st, b, h, 0),
                                                g.dout_st.s, i0, p.Lq);
  bwm_stage_row_of_thread<R, REL>(p, delta, rows, b, h, i0, j0, j1, all);
}

/* bwm_probs of a tile whose every row takes every key, under the scale
 * alone. */
template <bool KEY_ROWS, int NC, int R>
static __device__ __forceinline__ void bwm_probs_plain(const fa_attn_problem &p, int qoff, const bwm_rows<R> &rows,
                                                       float (*s)[4], float (*dp)[4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c2 = (lane & 3) * 2;
  const float scale = p.scale_f, k2 = scale * FA_LOG2E;
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int qi = qoff + (KEY_ROWS ? n * 8 + c2 + (e & 1) : g + (e >> 1) * 8);
      const float pr = exp2_approx(fmaf(s[n][e], k2, -rows.lse2[qi]));
      s[n][e] = pr;
      dp[n][e] = pr * fmaf(dp[n][e], scale, -rows.dsc[qi]);
    }
}

/* P and dS in place of one warp's S and dP accumulators (16 rows × 8·NC
 * columns, the layout of attention_frag.cuh).  KEY_ROWS: the rows are keys
 * and the columns query rows (the dK/dV kernels), else the transpose.
 * Entry (row, col) is query i0 + qi, key j0 + kj with qi, kj its row or
 * column plus qoff or koff.  full: every query of the tile takes every key
 * of it (and the rule has no extras: then it is the scale alone).  EXTRAS:
 * the instance with the whole score rule (masks, alibi, softcap: the
 * forward's score_rule steps); without, a tile that is not full only tests
 * the key ranges.  EXTRAS_VARIANT: a traced score_mod / mask_mod (API §9,
 * §10), bwm_variant_probs (attention_variant_rules.cuh) with the tile's
 * state in mask_mod's tiles of 64 x 64 (FA_BLOCK_*; its caller skips the
 * empty ones as a whole). */
/* The variants' side (attention_variant_rules.cuh, run-time compiled
 * units only): the state of mask_mod's tile of 64 query rows from i0 and 64
 * keys from j0 (FA_BLOCK_*; keys past Lk: empty), and the probabilities. */
__device__ int bwm_variant_state(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i0, int64_t j0);
template <bool KEY_ROWS, int NC, int R>
__device__ void bwm_variant_probs(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i0, int64_t j0, int qoff,
                                  int koff, const bwm_rows<R> &rows, bool full, int state, float (*s)[4],
                                  float (*dp)[4]);
/* Whether the kernels tell bwm_probs of tiles whose every row takes every
 * key by the built-in ranges (its full): without extras (then the scale
 * alone applies there), and for the variants (which look further). */
static __host__ __device__ constexpr bool bwm_full_rule(int extras) {
  return extras == EXTRAS_NONE || extras == EXTRAS_VARIANT;
}
template <bool KEY_ROWS, int NC, int R, int EXTRAS, bool REL = false>
static __device__ __forceinline__ void bwm_probs(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i0,
                                                 int64_t j0, int qoff, int koff, const bwm_rows<R> &rows, bool full,
                                                 float (*s)[4], float (*dp)[4], int state = FA_BLOCK_PARTIAL) {
  if constexpr (EXTRAS == EXTRAS_VARIANT) {
    bwm_variant_probs<KEY_ROWS, NC, R>(p, b, h, i0, j0, qoff, koff, rows, full, state, s, dp);
    return;
  }
  const int lane = threadIdx.x & 31, g = lane >> 2, c2 = (lane & 3) * 2;
  const float scale = p.scale_f, k2 = scale * FA_LOG2E;
#define BWM_AT(n, e)                                                                                                 \
  const int row = g + ((e) >> 1) * 8, col = (n) * 8 + c2 + ((e) & 1);                                                \
  const int qi = qoff + (KEY_ROWS ? col : row), kj = koff + (KEY_ROWS ? row : col)
  if (full) {
    bwm_probs_plain<KEY_ROWS, NC, R>(p, qoff, rows, s, dp);
    return;
  }
  if constexpr (REL) { /* the key ranges alone, relative to the tile (rows.kl, rows.kw) */
    static_assert(!EXTRAS, "REL: the rows of a kernel without the score rule's extras");
    const int kbase = KEY_ROWS ? 0 : (int)j0; /* the keys relative to the staging's j0: the key tile's, or 0 */
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 4; e++) {
        BWM_AT(n, e);
        const bool takes = (unsigned)(kbase + kj - rows.kl[qi]) < (unsigned)rows.kw[qi];
        const float pr = exp2_approx(takes ? fmaf(s[n][e], k2, -rows.lse2[qi]) : -INFINITY); /* 0 if not */
        s[n][e] = pr;
        dp[n][e] = takes ? pr * fmaf(dp[n][e], scale, -rows.dsc[qi]) : 0.f; /* (NaN in o reaches delta) */
      }
    return;
  }
  /* the rule of API §2 in the forward's order and with its steps
   * (attn_score's: softcap_step, alibi_step), its per-tile parts taken
   * once: the head's alibi slope, the mask of (b, h), softcap's c and 1/c
   * as score_rule_at takes them; per score the key range, the bool mask,
   * scale, softcap (its value and derivative, tanh from one exp2), alibi,
   * the float mask.  attn_score a score, with 64-bit
   * offsets and the slope loaded each time, ran the extras at 2.3-6.5x the
   * plain call's time.  (A score_rule built here instead of these locals
   * made the D = 128 dK/dV wgmma instance spill 76 bytes.) */
  const float slope = EXTRAS && p.alibi ? (float)p.alibi[h] : 0.f, off = (float)(p.Lk - p.Lq);
  const float cap = EXTRAS ? p.softcap_f : 0.f, inv_cap = EXTRAS ? p.inv_softcap_f : 0.f;
  const int64_t *ms = p.mask_strides, mo = b * ms[0] + h * ms[1];
  const float *mf = EXTRAS && p.mask_f ? (const float *)p.mask_f + mo : NULL;
  const uint8_t *mb = EXTRAS && p.mask_b ? p.mask_b + mo : NULL;
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      BWM_AT(n, e);
      const int64_t i = i0 + qi, j = j0 + kj;
      float pr, chain = scale;
      bool takes = j >= rows.lo[qi] && j < rows.hi[qi] && rows.lse[qi] != -INFINITY;
      if (EXTRAS) {
        const int64_t at = i * ms[2] + j * ms[3]; /* read only for a key in the row's range */
        if (mb && takes) takes = mb[at] != 0;
        float sc = s[n][e] * scale;
        if (cap > 0.f) {
          float dt;
          sc = softcap_step<TANH_SFU2>(sc, cap, inv_cap, &dt);
          chain = scale * dt;
        }
        if (slope != 0.f) sc = alibi_step(sc, slope, (float)i + off - (float)j); /* exact below 2^24 */
        if (mf && takes) sc += mf[at];
        takes = takes && sc != -INFINITY;
        pr = takes ? exp2_approx((sc - rows.lse[qi]) * FA_LOG2E) : 0.f;
      } else {
        pr = takes ? exp2_approx(fmaf(s[n][e], k2, -rows.lse2[qi])) : 0.f;
      }
      s[n][e] = pr;
      /* a key the row does not take passes nothing back, whatever dP holds (NaN in an unattended V) */
      dp[n][e] = !takes  ? 0.f
                 : EXTRAS ? pr * (dp[n][e] - rows.delta[qi]) * chain
                          : pr * fmaf(dp[n][e], scale, -rows.dsc[qi]);
    }
#undef BWM_AT
}

/* The warp's 16 rows × 8·CH accumulators, rows r0 + (0..15) of a dense
 * (rows, DG) matrix out: their first DG columns (a tile wider than the
 * rows: D = 96 held as 128), rows at or past limit not written; CHECK:
 * the words written folded into *seen (fold_nonfinite_pairs). */
template <typename T, int CH, int DG = CH * 8, bool CHECK = false>
static __device__ __forceinline__ void bwm_store(T *out, int64_t r0, int64_t limit, const float (*acc)[4],
                                                 uint32_t *seen = nullptr) {
  const int lane = threadIdx.x & 31, g = lane >> 2, c2 = (lane & 3) * 2;
  const int64_t ra = r0 + g, rb = ra + 8;
#pragma unroll
  for (int d = 0; d < DG / 8; d++) {
    const uint32_t wa = pack2<T>(acc[d][0], acc[d][1]), wb = pack2<T>(acc[d][2], acc[d][3]);
    if (ra < limit) {
      *(uint32_t *)(out + ra * DG + d * 8 + c2) = wa;
      if constexpr (CHECK) fold_nonfinite_pairs<T>(*seen, wa);
    }
    if (rb < limit) {
      *(uint32_t *)(out + rb * DG + d * 8 + c2) = wb;
      if constexpr (CHECK) fold_nonfinite_pairs<T>(*seen, wb);
    }
  }
}

/* The first row m in [a, z) where row m's key range ends after j0
 * (FIRST_END; else starts at j1 or later), z if none: a test that never
 * goes from true back to false along the rows.  One warp searches, each
 * round testing 32 rows evenly spread over what is left and keeping the gap
 * where the test turns: three rounds up to 32k rows (one thread bisecting
 * took a dK/dV block's start ~2 us at L = 1k, the block waiting at a
 * barrier; H200 ncu, 2026-11-30). */
template <bool FIRST_END>
static __device__ int64_t bwm_first_row(const fa_attn_problem &p, int64_t b, int64_t j, int64_t a, int64_t z) {
  const int lane = threadIdx.x & 31;
  while (a < z) { /* the answer lies in [a, z]; a and z are the same in every lane */
    const int64_t step = (z - a + 31) / 32, m = a + lane * step;
    bool before = false;
    if (m < z) {
      int64_t lo, hi;
      fa_attn_range_of(&p, b, m, &lo, &hi);
      before = FIRST_END ? hi <= j : lo < j;
    }
    const int64_t c = __popc(__ballot_sync(0xffffffffu, before)); /* the rows tested before the test turns */
    const int64_t a1 = c == 0 ? a : a + (c - 1) * step + 1;
    z = min(a + c * step, z), a = a1;
  }
  return a;
}

/* The query rows whose key ranges meet keys [j0, j1) of batch b, as
 * [*r0, *r1): an interval, since causal, window and kv_lens leave each row
 * one range whose ends do not decrease from row to row (src/attn_range.h);
 * called by a whole warp (r0 and r1 the lanes' own: the ballots do not
 * order shared memory between the lanes). */
static __device__ void bwm_rows_meeting(const fa_attn_problem &p, int64_t b, int64_t j0, int64_t j1, int64_t *r0,
                                        int64_t *r1) {
  *r0 = bwm_first_row<true>(p, b, j0, 0, p.Lq);
  *r1 = bwm_first_row<false>(p, b, j1, *r0, p.Lq);
}

/* The query tiles of a dK/dV block, every query head of its KV head in
 * turn: tile t is head h0 + t / n, rows from i0 + (t % n)·BR. */
struct bwm_qtiles {
  int64_t h0, i0, n, count;
  uint32_t mul; /* t / n = (t · mul) >> shift for t < 2^31 (bwm_qtiles_meeting) */
  int shift;
  __device__ __forceinline__ int64_t head(int64_t t) const { return h0 + div(t); }
  __device__ __forceinline__ int64_t row(int64_t t, int BR) const { return i0 + (t - div(t) * n) * BR; }
  /* A multiply and a shift: the 64-bit division that was here (a branch to
   * a 32-bit one, about 20 dependent instructions) ran twice a query tile
   * in the fused kernel's loop, once between the S/dP products and the
   * probabilities; without it the default takes 0.91-0.98x the time and
   * the deterministic call 0.95-0.97x at D = 64-128, and the spills of
   * D = 64's instances fell from 80 to 64 bytes (default) and from 52 to 0
   * (fixed point) (H200, bf16, three rounds in turns,
   * docs/perf/2026-12-02-backward-tile-division-h200.json) */
  __device__ __forceinline__ int64_t div(int64_t t) const { return (int64_t)(((uint64_t)(uint32_t)t * mul) >> shift); }
};

__device__ void bwm_variant_rows(const fa_attn_problem &p, int64_t b, int64_t hk, int64_t j0, int64_t j1, int64_t *span);

/* The query tiles of the dK/dV block of keys [j0, j1) of KV head hk in
 * batch b, BR rows a tile (called by the whole block); EXTRAS_VARIANT:
 * narrowed to the rows of mask_mod's nonempty tiles (bwm_variant_rows).
 * SHUFFLED: the span read through shuffles from lane 0, which ptxas knows
 * give every lane of the warp the same value; read from shared memory it is
 * a per-thread value to ptxas, and so is all the index work of the loop over
 * the tiles (bwg_dkdv_kernel's SPAN_SHUFFLED says where it paid). */
template <int EXTRAS = EXTRAS_NONE, bool SHUFFLED = false>
static __device__ bwm_qtiles bwm_qtiles_meeting(const fa_attn_problem &p, int64_t b, int64_t hk, int64_t j0,
                                                int64_t j1, int BR) {
  __shared__ int64_t span[2];
  if (threadIdx.x < 32) {
    int64_t r0, r1;
    bwm_rows_meeting(p, b, j0, j1, &r0, &r1);
    if (threadIdx.x == 0) span[0] = r0, span[1] = r1;
  }
  __syncthreads();
  if constexpr (EXTRAS == EXTRAS_VARIANT) bwm_variant_rows(p, b, hk, j0, j1, span);
  bwm_qtiles qt; /* from span in shared memory: from copies in registers, ptxas spilled 140-200 bytes in the loop */
  if constexpr (SHUFFLED) {
    const int64_t s0 = __shfl_sync(0xffffffffu, span[0], 0), s1 = __shfl_sync(0xffffffffu, span[1], 0);
    qt.h0 = hk * (p.Hq / p.Hkv), qt.i0 = s0 / BR * BR;
    qt.n = s1 > s0 ? (s1 - qt.i0 + BR - 1) / BR : 0, qt.count = p.Hq / p.Hkv * qt.n;
  } else { /* the reads as they were: through copies here too, ptxas scheduled these instances otherwise */
    qt.h0 = hk * (p.Hq / p.Hkv), qt.i0 = span[0] / BR * BR;
    qt.n = span[1] > span[0] ? (span[1] - qt.i0 + BR - 1) / BR : 0, qt.count = p.Hq / p.Hkv * qt.n;
  }
  /* t < count < 2^31 (Hq·Lq rows of Q past 2^37 would be 16 TB); l = ceil(log2 n), mul = ceil(2^(31+l) / n) < 2^32:
   * the product's excess over t / n is below t / 2^(31+l) < 1 / n, so its floor is t / n's */
  const int l = qt.n > 1 ? 32 - __clz((unsigned)(qt.n - 1)) : 0;
  qt.shift = 31 + l, qt.mul = qt.n > 0 ? (uint32_t)((((uint64_t)1 << qt.shift) + qt.n - 1) / qt.n) : 0;
  return qt;
}

/* The rows of the dQ block's query tile at i0 of head h into rows (its
 * first R threads, one a row), and the keys any of them takes as
 * [*t_lo, *t_hi) (0, 0 for none); called by the whole block. */
template <int R, bool REL = false>
static __device__ void bwm_tile_keys(const fa_attn_problem &p, const float *delta, bwm_rows<R> &rows, int64_t b,
                                     int64_t h, int64_t i0, int64_t *t_lo, int64_t *t_hi) {
  __shared__ int64_t span[2];
  bool unused;
  if (threadIdx.x < R) bwm_row_load<R, REL>(p, delta, rows, b, h, i0, threadIdx.x, 0, p.Lk, &unused);
  __syncthreads();
  if (threadIdx.x == 0) {
    int64_t lo = INT64_MAX, hi = 0;
    for (int r = 0; r < R; r++)
      if (rows.lo[r] < rows.hi[r] && rows.lse[r] != -INFINITY) lo = min(lo, rows.lo[r]), hi = max(hi, rows.hi[r]);
    span[0] = lo < hi ? lo : 0, span[1] = lo < hi ? hi : 0;
  }
  __syncthreads();
  *t_lo = span[0], *t_hi = span[1];
}

/* The deterministic dQ of the wgmma kernels (bw_fixed_dq): a query row's
 * partial sums of dQ_i = Σ_j dS_ij·K_j are added as int32 multiples of
 * 1 / m_i, m_i a power of two.  |dS_ij| ≤ scale · P_ij · |dP_ij - delta_i|
 * (softcap's derivative is at most 1), |dP_ij| ≤ Σ|dO_i| · max|V| and
 * |delta_i| ≤ Σ|dO_i| · max|O_i|: so every partial sum of dQ_i is below
 * bound · Σ_j P_ij, bound = scale · max|K| · Σ|dO_i| · (max|V| + max|O_i|),
 * max|K| and max|V| over the row's KV head, and m_i = 2^27 /
 * 2^ceil(log2 bound).  With lse from the forward a row's P sums to 1, and
 * a sum stays below 2^27; one whose lse lies up to log 16 under the
 * forward's still fits in 31 bits.  Rounding to integers costs at most
 * bound · 2^-28 a key tile: some 2^-18 of the row's largest possible dQ
 * after 1024 tiles, where the output's dtype keeps 2^-9 (bf16) or 2^-12
 * (f16).  1 where the bound is 0 (every dS or K is); 0 where it passes
 * 2^153 or is not finite: the caller's NaN/inf flag then hands the call to
 * the SIMT kernels. */
static __device__ __forceinline__ float bw_fixed_mult(float scale, float kmax, float vmax, float dout_l1, float omax) {
  const float f[4] = {fabsf(scale), kmax, dout_l1, vmax + omax};
  int e = 0;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    if (!(f[k] < INFINITY)) return 0.f; /* inf or NaN */
    if (f[k] == 0.f) return 1.f;
    int ek;
    frexpf(f[k], &ek); /* f[k] < 2^ek */
    e += ek;
  }
  return 27 - e < -126 ? 0.f : ldexpf(1.f, min(27 - e, 127));
}

#ifndef __CUDACC_RTC__
/* Whether the call's dQ is added in fixed point (bw_fixed_mult): the
 * built-in rules' deterministic calls on the wgmma kernels, whose delta
 * buffer then holds each row's multiplier after delta, and max|K|, max|V|
 * of each KV head after those (fa_cuda_backward_run).  Every length since
 * its fused kernel's rows came in two steps and its tile index without a
 * division (sessions 56-57): causal calls of 1k keys, which took the two
 * kernels at D = 64 and the key tiles' order (adds into a query tile
 * waiting for the key tile before) at D = 96 and 128, now take 0.92 / 0.94
 * / 0.94x their time (bf16, H200, three rounds in turns,
 * docs/perf/2026-12-02-backward-tile-division-h200.json); from 2k keys and
 * at 1k not causal it was already the faster by 1.0-1.14x. */
static inline bool bw_fixed_dq(const fa_attn_problem *p, const fa_attn_grads *g) {
  return g->deterministic && p->B * p->Hq * p->Lq > 0;
}
/* Where fa_cuda_backward_run's delta buffer holds, with bw_fixed_dq, the
 * rows' multipliers (B·Hq·Lq floats after delta) and each KV head's
 * max|K|, max|V| (2·B·Hkv, as unsigned bits, after those). */
static inline float *bw_fixed_mults(const float *delta, const fa_attn_problem *p) {
  return (float *)delta + p->B * p->Hq * p->Lq;
}
static inline unsigned *bw_fixed_kvmax(const float *delta, const fa_attn_problem *p) {
  return (unsigned *)(bw_fixed_mults(delta, p) + p->B * p->Hq * p->Lq);
}

/* A backward kernel's launch (dK/dV, dQ, or dK/dV adding dQ): its grid of
 * `blocks` blocks of `threads`, its dynamic shared memory, and its name for errors. */
struct bw_launch_spec {
  const void *kernel;
  int64_t blocks;
  int threads;
  size_t smem;
  const char *name;
};

/* One launch of kernel k on stream s (args: its parameters), its shared memory allowed first; dependent:
 * a programmatic dependent launch of the kernel queued just before it on s (attn_launch). */
static inline cudaError_t bw_launch_on(const bw_launch_spec &k, void **args, cudaStream_t s, bool dependent = false) {
  const cudaError_t err = cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)k.smem);
  if (err != cudaSuccess) return err;
  return attn_launch(k.kernel, dim3((unsigned)k.blocks), dim3(k.threads), k.smem, s, args, dependent);
}

/* The two-kernel schedule's launches (args: both kernels' parameters):
 * dK/dV on the context's stream, dQ on the side stream beside it
 * (fa_cuda_fork, then fa_cuda_join).  Neither reads what the other
 * writes (dQ recomputes S and dP from q, k, v, dout, lse and delta), so
 * dQ's blocks take the multiprocessors that dK/dV's last wave leaves idle,
 * and the call has one grid's tail instead of two. */
static inline fa_status bw_launch_beside(fa_context *ctx, const bw_launch_spec &kv, const bw_launch_spec &q,
                                         void **args) {
  fa_status st = attn_grid_fits(ctx, kv.blocks);
  cudaStream_t side = 0;
  if (st || (st = attn_grid_fits(ctx, q.blocks)) || (st = fa_cuda_fork(ctx, &side))) return st;
  const bw_launch_spec *const ks[2] = {&kv, &q};
  const cudaStream_t streams[2] = {fa_cuda_stream(ctx), side};
  for (int i = 0; i < 2 && !st; i++)
    if (ks[i]->blocks > 0) st = fa_cuda_error(ctx, bw_launch_on(*ks[i], args, streams[i]), ks[i]->name);
  const fa_status joined = fa_cuda_join(ctx); /* also after a failed launch: the streams stay in step */
  return st ? st : joined;
}
#endif

#endif
