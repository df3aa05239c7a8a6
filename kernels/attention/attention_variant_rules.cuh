/* Attention variants on cuda: the traced expressions (struct fa_variant,
 * defined above this header in the run-time compiled unit, with
 * fa_variant_rules: which of §2's rules the call sets) in the kernels'
 * score rule, in API §9's order: the key range and the bool mask,
 * then mask_mod; for the keys left, the scale, score_mod, then softcap,
 * alibi and the float mask. */
#ifndef FA_KERNELS_ATTENTION_VARIANT_RULES_CUH
#define FA_KERNELS_ATTENTION_VARIANT_RULES_CUH

#include "attention_variant.cuh"

/* The fault of an expression's result (node f, -1: none) into its record. */
static __device__ __forceinline__ void fa_variant_record(long long *rec, int f) {
  if (f >= 0) atomicCAS((unsigned long long *)rec, ~0ull, (unsigned long long)f);
}

/* The score of key j (jf: the same as a float, exact below 2^24; offset kk
 * from the rule's key) of row i of head h, from the scaled dot product; in:
 * the key is in the row's range.  The call's built-in rules are constants
 * of the unit (fa_variant_rules), so that a score pays only for those set. */
static __device__ __forceinline__ float fa_variant_apply(const fa_variant_problem &p, const score_rule &ru, int64_t b,
                                                         int64_t h, int64_t i, int64_t j, float jf, int kk, float s,
                                                         bool in, bool mask_full, int &fs, int &fm) {
  if (fa_variant_rules::bool_mask && in && !rule_mask_keeps(ru, kk)) in = false;
  if (fa_variant::has_mask && in && !mask_full)
    in = fa_variant::mask(p.va, 0.f, b, h, i, j, (float)b, (float)h, (float)i, jf, fm);
  if (!in) return -INFINITY;
  if (fa_variant::has_score) s = fa_variant::score(p.va, s, b, h, i, j, (float)b, (float)h, (float)i, jf, fs);
  if (fa_variant_rules::softcap) s = rule_softcap(ru, s);
  if (fa_variant_rules::alibi) s = rule_alibi(ru, s, (float)kk);
  if (fa_variant_rules::float_mask) s = rule_mask_float(ru, s, kk);
  return s;
}

static __device__ __forceinline__ void fa_variant_faults(const fa_variant_problem &p, int fs, int fm) {
  if (fa_variant::has_score) fa_variant_record(p.va.fault[0], fs);
  if (fa_variant::has_mask) fa_variant_record(p.va.fault[1], fm);
}

/* The tensor-core kernels' tile (frag_score_tile's EXTRAS_VARIANT): rows A
 * and B of this thread, keys j0 + 8n + c2 + e; in range: every key of a
 * full tile (rows before Lq), else columns [a, a + n) of each row.  As the
 * built-in rules do, each step is a pass over the tile without a branch a
 * score (a score at a time, with a branch for each step, ran 2-3x slower):
 * which keys stay is a bit mask a row, and score_mod and mask_mod are
 * evaluated on every score, at positions clamped into [0, Lq) x [0, Lk)
 * (a read the range analysis found safe has no check), their results and
 * faults kept only where the key stays.  Returns whether s was left raw
 * (frag_score_tile). */
template <int NC>
__device__ bool frag_variant_tile(const fa_attn_problem &p0, int64_t b, int64_t h, int64_t hB, int64_t j0, int c2,
                                  bool full, const frag_rows &r, float (*s)[4], int aA, int nA, int aB, int nB) {
  static_assert(NC <= 16, "frag_variant_tile: a row's keys in one 32-bit mask");
  const fa_variant_problem &p = static_cast<const fa_variant_problem &>(p0);
  const score_rule ruA = score_rule_at(p, b, h, r.iA, j0 + c2), ruB = score_rule_at(p, b, hB, r.iB, j0 + c2);
  const bool vA = r.iA < p.Lq, vB = r.iB < p.Lq;
  const int64_t iA = min(r.iA, p.Lq - 1), iB = min(r.iB, p.Lq - 1), jmax = p.Lk - 1;
  const float iAf = (float)iA, iBf = (float)iB, bf = (float)b, hAf = (float)h, hBf = (float)hB;
  const float jf0 = (float)(j0 + c2), jfmax = (float)jmax; /* a key's position: a float add, no conversion */
  int fs = -1, fm = -1;
  /* a key tile inside mask_mod's run of full tiles needs no mask_mod (both
   * rows are in one query tile) */
  bool mask_full = false;
  if (fa_variant::has_mask && p.va.spans) {
    const int *sp = fa_variant_span(p, b, h, r.iA / p.va.spans_br);
    mask_full = j0 >= (int64_t)sp[2] * p.va.spans_bc && j0 + 8 * NC <= (int64_t)sp[3] * p.va.spans_bc;
  }
  /* the common tile: every key in range and kept (rows past Lq are never
   * stored), nothing to mask: the scale, score_mod and the rules alone;
   * with none of them, s stays raw and the scale goes into the exponent,
   * as the built-in kernels do (returns true) */
  if (full && (!fa_variant::has_mask || mask_full) && !fa_variant_rules::bool_mask && !fa_variant_rules::float_mask) {
    if (!fa_variant::has_score && !fa_variant_rules::softcap && !fa_variant_rules::alibi) return true;
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int64_t j = j0 + n * 8 + c2 + e;
        const float jf = jf0 + (float)(n * 8 + e);
        int f1 = -1, f2 = -1;
        s[n][e] *= ruA.scale, s[n][2 + e] *= ruB.scale;
        if (fa_variant::has_score) {
          s[n][e] = fa_variant::score(p.va, s[n][e], b, h, iA, j, bf, hAf, iAf, jf, f1);
          s[n][2 + e] = fa_variant::score(p.va, s[n][2 + e], b, hB, iB, j, bf, hBf, iBf, jf, f2);
          if (fs < 0) fs = f1 >= 0 ? f1 : f2;
        }
        if (fa_variant_rules::softcap) s[n][e] = rule_softcap(ruA, s[n][e]), s[n][2 + e] = rule_softcap(ruB, s[n][2 + e]);
        if (fa_variant_rules::alibi) {
          const float kf = (float)(n * 8 + e);
          s[n][e] = rule_alibi(ruA, s[n][e], kf), s[n][2 + e] = rule_alibi(ruB, s[n][2 + e], kf);
        }
      }
    fa_variant_faults(p, fs, fm);
    return false;
  }
  uint32_t keepA = 0, keepB = 0; /* bit 2n + e: the key stays */
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int col = n * 8 + c2 + e;
      keepA |= (uint32_t)(full ? vA : (unsigned)(col - aA) < (unsigned)nA) << (2 * n + e);
      keepB |= (uint32_t)(full ? vB : (unsigned)(col - aB) < (unsigned)nB) << (2 * n + e);
    }
  if (fa_variant_rules::bool_mask) /* read only at the keys in range */
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const uint32_t bit = 1u << (2 * n + e);
        if ((keepA & bit) && !rule_mask_keeps(ruA, n * 8 + e)) keepA &= ~bit;
        if ((keepB & bit) && !rule_mask_keeps(ruB, n * 8 + e)) keepB &= ~bit;
      }
  if (fa_variant::has_mask && !mask_full)
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const uint32_t bit = 1u << (2 * n + e);
        const int64_t j = min(j0 + n * 8 + c2 + e, jmax);
        const float jf = fminf(jf0 + (float)(n * 8 + e), jfmax);
        int f1 = -1, f2 = -1;
        const bool mA = fa_variant::mask(p.va, 0.f, b, h, iA, j, bf, hAf, iAf, jf, f1);
        const bool mB = fa_variant::mask(p.va, 0.f, b, hB, iB, j, bf, hBf, iBf, jf, f2);
        if (fm < 0) fm = (keepA & bit) && f1 >= 0 ? f1 : (keepB & bit) && f2 >= 0 ? f2 : -1;
        keepA &= mA ? ~0u : ~bit, keepB &= mB ? ~0u : ~bit;
      }
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int q = 0; q < 4; q++) s[n][q] *= ruA.scale;
  if (fa_variant::has_score)
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const uint32_t bit = 1u << (2 * n + e);
        const int64_t j = min(j0 + n * 8 + c2 + e, jmax);
        const float jf = fminf(jf0 + (float)(n * 8 + e), jfmax);
        int f1 = -1, f2 = -1;
        s[n][e] = fa_variant::score(p.va, s[n][e], b, h, iA, j, bf, hAf, iAf, jf, f1);
        s[n][2 + e] = fa_variant::score(p.va, s[n][2 + e], b, hB, iB, j, bf, hBf, iBf, jf, f2);
        if (fs < 0) fs = (keepA & bit) && f1 >= 0 ? f1 : (keepB & bit) && f2 >= 0 ? f2 : -1;
      }
  if (fa_variant_rules::softcap)
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) s[n][e] = rule_softcap(ruA, s[n][e]), s[n][2 + e] = rule_softcap(ruB, s[n][2 + e]);
  if (fa_variant_rules::alibi)
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float kf = (float)(n * 8 + e);
        s[n][e] = rule_alibi(ruA, s[n][e], kf), s[n][2 + e] = rule_alibi(ruB, s[n][2 + e], kf);
      }
  if (fa_variant_rules::float_mask) /* read only at the keys that stay */
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const uint32_t bit = 1u << (2 * n + e);
        if (keepA & bit) s[n][e] = rule_mask_float(ruA, s[n][e], n * 8 + e);
        if (keepB & bit) s[n][2 + e] = rule_mask_float(ruB, s[n][2 + e], n * 8 + e);
      }
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const uint32_t bit = 1u << (2 * n + e);
      s[n][e] = keepA & bit ? s[n][e] : -INFINITY;
      s[n][2 + e] = keepB & bit ? s[n][2 + e] : -INFINITY;
    }
  fa_variant_faults(p, fs, fm);
  return false;
}

/* The SIMT kernel's key at a time. */
template <> struct attn_rule<fa_variant_problem> {
  static __device__ __forceinline__ float score(const fa_variant_problem &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                float dot, int64_t lo, int64_t hi) {
    if (j < lo || j >= hi) return -INFINITY;
    const score_rule ru = score_rule_at(p, b, h, i, j);
    int fs = -1, fm = -1;
    const float s = fa_variant_apply(p, ru, b, h, i, j, (float)j, 0, dot * ru.scale, true, false, fs, fm);
    fa_variant_faults(p, fs, fm);
    return s;
  }
  /* the tensor-core kernels: the keys of mask_mod's nonempty tiles */
  static __device__ __forceinline__ void narrow(const fa_variant_problem &p, int64_t b, int64_t h, int64_t i0,
                                                int64_t *lo, int64_t *hi) {
    if (!fa_variant::has_mask || !p.va.spans) return;
    const int *sp = fa_variant_span(p, b, h, i0 / p.va.spans_br);
    const int64_t first = (int64_t)sp[0] * p.va.spans_bc, end = (int64_t)sp[1] * p.va.spans_bc;
    *lo = max(*lo, first), *hi = min(*hi, end);
    if (*hi <= *lo) *lo = *hi = 0; /* nothing attended: zeros, lse = -inf */
  }
};

/* mask_mod over the tiles of BR query rows and BC keys: one block a (b, h,
 * query tile) (b, h: 0 where the expression does not use them, spans_sb,
 * spans_sh = 0), every pair of each key tile evaluated (on the positions
 * inside Lq and Lk), then the tile's span record (spans, for the attention
 * kernels) or its state (states, nk a query tile: fa.block_mask).  Reads
 * out of range are recorded for fa.block_mask only: the attention kernels
 * evaluate mask_mod again on the keys they attend, and record them there. */
template <int BR, int BC>
__global__ void __launch_bounds__(256) fa_variant_spans_kernel(fa_variant_problem p, int *spans, uint8_t *states,
                                                               long long nb, long long nh) {
  const long long nq = p.va.spans_nq, blk = blockIdx.x, qt = blk % nq;
  const long long b = blk / nq / nh, h = blk / nq % nh;
  const long long nk = (p.Lk + BC - 1) / BC;
  const int Lq = (int)p.Lq, Lk = (int)p.Lk; /* below 2^31 (checked) */
  const float bf = (float)b, hf = (float)h;
  int first = -1, end = -1, f_first = 0, f_end = 0, run = -1;
  for (long long kt = 0; kt < nk; kt++) {
    bool any = false, all = true;
    /* a tile decided as a whole needs no pair evaluated (the same verdict in every thread) */
    const int verdict = fa_variant::has_tile ? fa_variant::tile(p.va, b, h, qt * BR, min(qt * BR + BR, (long long)p.Lq) - 1,
                                                                kt * BC, min(kt * BC + BC, (long long)p.Lk) - 1)
                                             : 2;
    if (verdict != 2) any = all = verdict == 1;
    for (int idx = threadIdx.x; verdict == 2 && idx < BR * BC; idx += 256) {
      const int i = (int)qt * BR + idx / BC, j = (int)kt * BC + idx % BC;
      if (i >= Lq || j >= Lk) continue;
      int f = -1;
      const bool m = fa_variant::mask(p.va, 0.f, b, h, i, j, bf, hf, (float)i, (float)j, f);
      if (states && f >= 0) fa_variant_record(p.va.fault[1], f);
      any |= m, all &= m;
    }
    if (verdict == 2) any = __syncthreads_or(any), all = __syncthreads_and(all);
    if (states && threadIdx.x == 0) states[blk * nk + kt] = any ? (all ? FA_BLOCK_FULL : FA_BLOCK_PARTIAL) : FA_BLOCK_EMPTY;
    if (any) {
      if (first < 0) first = (int)kt;
      end = (int)kt + 1;
    }
    if (all) { /* the longest run of full tiles */
      if (run < 0) run = (int)kt;
      if ((int)kt + 1 - run > f_end - f_first) f_first = run, f_end = (int)kt + 1;
    } else {
      run = -1;
    }
  }
  (void)nb;
  if (spans && threadIdx.x == 0) {
    int *sp = spans + 4 * blk;
    sp[0] = first < 0 ? 0 : first, sp[1] = first < 0 ? 0 : end, sp[2] = f_first, sp[3] = f_end;
  }
}

#endif
