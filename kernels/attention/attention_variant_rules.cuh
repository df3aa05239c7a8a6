/* Attention variants on cuda: the traced expressions (struct fa_variant,
 * defined above this header in the run-time compiled unit) in the
 * kernels' score rule, in API §9's order: the key range and the bool mask,
 * then mask_mod; for the keys left, the scale, score_mod, then softcap,
 * alibi and the float mask. */
#ifndef FA_KERNELS_ATTENTION_VARIANT_RULES_CUH
#define FA_KERNELS_ATTENTION_VARIANT_RULES_CUH

#include "attention_variant.cuh"

/* The fault of an expression's result (node f, -1: none) into its record. */
static __device__ __forceinline__ void fa_variant_record(long long *rec, int f) {
  if (f >= 0) atomicCAS((unsigned long long *)rec, ~0ull, (unsigned long long)f);
}

/* The score of key j (offset kk from the rule's key) of row i of head h,
 * from the scaled dot product; in: the key is in the row's range. */
static __device__ __forceinline__ float fa_variant_apply(const fa_variant_problem &p, const score_rule &ru, int64_t b,
                                                         int64_t h, int64_t i, int64_t j, int kk, float s, bool in,
                                                         int &fs, int &fm) {
  if (in && ru.mask && !ru.mask_float && !rule_mask_keeps(ru, kk)) in = false;
  if (fa_variant::has_mask && in) in = fa_variant::mask(p.va, 0.f, b, h, i, j, fm);
  if (!in) return -INFINITY;
  if (fa_variant::has_score) s = fa_variant::score(p.va, s, b, h, i, j, fs);
  if (ru.cap > 0.f) s = rule_softcap(ru, s);
  if (ru.slope != 0.f) s = rule_alibi(ru, s, (float)kk);
  if (ru.mask && ru.mask_float) s = rule_mask_float(ru, s, kk);
  return s;
}

static __device__ __forceinline__ void fa_variant_faults(const fa_variant_problem &p, int fs, int fm) {
  if (fa_variant::has_score) fa_variant_record(p.va.fault[0], fs);
  if (fa_variant::has_mask) fa_variant_record(p.va.fault[1], fm);
}

/* The tensor-core kernels' tile (frag_score_tile's EXTRAS_VARIANT): rows A
 * and B of this thread, keys j0 + 8n + c2 + e; in range: every key of a
 * full tile (rows before Lq), else columns [a, a + n) of each row. */
template <int NC>
__device__ void frag_variant_tile(const fa_attn_problem &p0, int64_t b, int64_t h, int64_t hB, int64_t j0, int c2,
                                  bool full, const frag_rows &r, float (*s)[4], int aA, int nA, int aB, int nB) {
  const fa_variant_problem &p = static_cast<const fa_variant_problem &>(p0);
  const score_rule ruA = score_rule_at(p, b, h, r.iA, j0 + c2), ruB = score_rule_at(p, b, hB, r.iB, j0 + c2);
  const bool vA = r.iA < p.Lq, vB = r.iB < p.Lq;
  int fs = -1, fm = -1;
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int col = n * 8 + c2 + e, kk = n * 8 + e;
      const bool inA = full ? vA : (unsigned)(col - aA) < (unsigned)nA;
      const bool inB = full ? vB : (unsigned)(col - aB) < (unsigned)nB;
      s[n][e] = fa_variant_apply(p, ruA, b, h, r.iA, j0 + col, kk, s[n][e] * ruA.scale, inA, fs, fm);
      s[n][2 + e] = fa_variant_apply(p, ruB, b, hB, r.iB, j0 + col, kk, s[n][2 + e] * ruB.scale, inB, fs, fm);
    }
  fa_variant_faults(p, fs, fm);
}

/* The SIMT kernel's key at a time. */
template <> struct attn_rule<fa_variant_problem> {
  static __device__ __forceinline__ float score(const fa_variant_problem &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                float dot, int64_t lo, int64_t hi) {
    if (j < lo || j >= hi) return -INFINITY;
    const score_rule ru = score_rule_at(p, b, h, i, j);
    int fs = -1, fm = -1;
    const float s = fa_variant_apply(p, ru, b, h, i, j, 0, dot * ru.scale, true, fs, fm);
    fa_variant_faults(p, fs, fm);
    return s;
  }
};

#endif
