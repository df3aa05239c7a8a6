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
 * of the unit (fa_variant_rules), so that a score pays only for those set.
 * chain (the SIMT backward; else NULL): the score's derivative by the dot
 * product, for a key that stays (the scale, times score_mod's derivative
 * by its s, times softcap's 1 - tanh^2; alibi and the float mask add
 * constants). */
static __device__ __forceinline__ float fa_variant_apply(const fa_variant_problem &p, const score_rule &ru, int64_t b,
                                                         int64_t h, int64_t i, int64_t j, float jf, int kk, float s,
                                                         bool in, bool mask_full, int &fs, int &fm,
                                                         float *chain = nullptr) {
  if (fa_variant_rules::bool_mask && in && !rule_mask_keeps(ru, kk)) in = false;
  j += p.key_base, jf += (float)p.key_base; /* an opts.splits piece: the whole call's k (0 otherwise) */
  if (fa_variant::has_mask && in && !mask_full)
    in = fa_variant::mask(p.va, 0.f, b, h, i, j, (float)b, (float)h, (float)i, jf, fm);
  if (!in) return -INFINITY;
  float c = ru.scale, ds = 1.f;
  if (fa_variant::has_score && chain)
    s = fa_variant::score_grad(p.va, s, b, h, i, j, (float)b, (float)h, (float)i, jf, fs, ds), c *= ds;
  else if (fa_variant::has_score)
    s = fa_variant::score(p.va, s, b, h, i, j, (float)b, (float)h, (float)i, jf, fs);
  if (fa_variant_rules::softcap) {
    float dt;
    s = rule_softcap(ru, s, &dt);
    c *= dt;
  }
  if (fa_variant_rules::alibi) s = rule_alibi(ru, s, (float)kk);
  if (fa_variant_rules::float_mask) s = rule_mask_float(ru, s, kk);
  if (chain) *chain = c;
  return s;
}

static __device__ __forceinline__ void fa_variant_faults(const fa_variant_problem &p, int fs, int fm) {
  if (fa_variant::has_score) fa_variant_record(p.va.fault[0], fs);
  if (fa_variant::has_mask) fa_variant_record(p.va.fault[1], fm);
}

/* The positions of a thread's two rows (A, B) and keys in a tile, as the
 * expressions take them: rows clamped into [0, Lq), keys, when CLAMP, into
 * [0, Lk) (an unchecked read is in range only there); each also as a float
 * (exact below 2^24), a key's from this thread's first by a float add.  A
 * key is worked out in 32 bits, unsigned (plan_variant sends no call of
 * 2^31 keys or more here), so that a read's offset k * stride is a 32 x
 * 64-bit multiply after a 32-bit clamp: a 64-bit key took 13 instructions
 * a key to a document mask's read (the H200's SASS). */
struct variant_rows {
  int64_t b, hA, hB, iA, iB;
  unsigned j0, jmax;
  float bf, hAf, hBf, iAf, iBf, jf0, jfmax;
  __device__ __forceinline__ variant_rows(const fa_attn_problem &p, int64_t b_, int64_t h, int64_t hB_,
                                          const frag_rows &r, int64_t j0_, int c2) {
    b = b_, hA = h, hB = hB_, iA = min(r.iA, p.Lq - 1), iB = min(r.iB, p.Lq - 1);
    /* key_base: an opts.splits piece's keys, numbered as the whole call's */
    j0 = (unsigned)(p.key_base + j0_ + c2), jmax = (unsigned)(p.key_base + p.Lk - 1);
    bf = (float)b, hAf = (float)hA, hBf = (float)hB, iAf = (float)iA, iBf = (float)iB;
    jf0 = (float)(p.key_base + j0_ + c2), jfmax = (float)(p.key_base + p.Lk - 1);
  }
  template <bool CLAMP> __device__ __forceinline__ void key(int n, int e, int64_t *j, float *jf) const {
    unsigned u = j0 + (unsigned)(n * 8 + e);
    *jf = jf0 + (float)(n * 8 + e);
    if (CLAMP) u = min(u, jmax), *jf = fminf(*jf, jfmax);
    *j = (int64_t)u;
  }
};

/* A row's kept keys, a bit each (2n + e): 32 bits up to key tiles of 128,
 * 64 past them (176). */
template <int NC> using variant_keep = typename std::conditional<NC <= 16, uint32_t, unsigned long long>::type;
static_assert(sizeof(variant_keep<22>) == 8, "variant_keep: tiles of 176 keys in 64 bits");

/* The fault to keep of a key's two scores (f1: row A's, f2: row B's), where
 * the key stays (bit of keepA, keepB). */
template <typename K>
static __device__ __forceinline__ int variant_kept_fault(K keepA, K keepB, K bit, int f1, int f2) {
  return (keepA & bit) && f1 >= 0 ? f1 : (keepB & bit) && f2 >= 0 ? f2 : -1;
}

/* score_mod over the tile (s scaled), its faults kept where the key stays. */
template <int NC, bool CLAMP>
static __device__ __forceinline__ void variant_score_pass(const fa_variant_problem &p, const variant_rows &w,
                                                          float (*s)[4], variant_keep<NC> keepA,
                                                          variant_keep<NC> keepB, int &fs) {
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      int64_t j;
      float jf;
      w.key<CLAMP>(n, e, &j, &jf);
      int f1 = -1, f2 = -1;
      s[n][e] = fa_variant::score(p.va, s[n][e], w.b, w.hA, w.iA, j, w.bf, w.hAf, w.iAf, jf, f1);
      s[n][2 + e] = fa_variant::score(p.va, s[n][2 + e], w.b, w.hB, w.iB, j, w.bf, w.hBf, w.iBf, jf, f2);
      if (fs < 0) fs = variant_kept_fault(keepA, keepB, (variant_keep<NC>)1 << (2 * n + e), f1, f2);
    }
}

/* mask_mod at key (n, e) of rows A and B (the keys clamped), their faults
 * in f1, f2. */
static __device__ __forceinline__ void variant_mask_pair(const fa_variant_problem &p, const variant_rows &w, int n,
                                                         int e, bool &mA, bool &mB, int &f1, int &f2) {
  int64_t j;
  float jf;
  w.key<true>(n, e, &j, &jf);
  f1 = f2 = -1;
  mA = fa_variant::mask(p.va, 0.f, w.b, w.hA, w.iA, j, w.bf, w.hAf, w.iAf, jf, f1);
  mB = fa_variant::mask(p.va, 0.f, w.b, w.hB, w.iB, j, w.bf, w.hBf, w.iBf, jf, f2);
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
template <int NC, bool EXACT>
__device__ bool frag_variant_tile(const fa_attn_problem &p0, int64_t b, int64_t h, int64_t hB, int64_t j0, int c2,
                                  bool full, const frag_rows &r, float (*s)[4], int aA, int nA, int aB, int nB) {
  typedef variant_keep<NC> K;
  const fa_variant_problem &p = static_cast<const fa_variant_problem &>(p0);
  const score_rule ruA = score_rule_at(p, b, h, r.iA, j0 + c2), ruB = score_rule_at(p, b, hB, r.iB, j0 + c2);
  const bool vA = r.iA < p.Lq, vB = r.iB < p.Lq;
  const variant_rows w(p, b, h, hB, r, j0, c2);
  int fs = -1, fm = -1;
  /* a key tile inside mask_mod's run of full tiles needs no mask_mod (both
   * rows are in one query tile) */
  bool mask_full = false;
  if (fa_variant::has_mask && p.va.spans) {
    if (r.vf_lo < 0) {
      const int *sp = fa_variant_span(p, b, h, r.iA / p.va.spans_br);
      const long long bc = p.va.spans_bc, cap = 0x7fffffffLL; /* a run ending past 2^31 - 1 keys: clamped (fewer full) */
      r.vf_lo = (int)min((long long)sp[2] * bc, cap), r.vf_hi = (int)min((long long)sp[3] * bc, cap);
    }
    mask_full = j0 >= r.vf_lo && j0 + 8 * NC <= r.vf_hi;
  }
  /* the common tile: every key in range and kept (rows past Lq are never
   * stored), nothing to mask: the scale, score_mod and the rules alone;
   * with none of them, s stays raw and the scale goes into the exponent,
   * as the built-in kernels do (returns true) */
  const bool plain = full && (!fa_variant::has_mask || mask_full) && !fa_variant_rules::bool_mask &&
                     !fa_variant_rules::float_mask;
  if (plain && !fa_variant::has_score && !fa_variant_rules::softcap && !fa_variant_rules::alibi) return true;
  /* direct: with mask_mod the only step that asks which keys stay (no
   * score_mod, no mask tensor), the key range and mask_mod go straight
   * into the one select a score at the end, without a row's bit mask (a
   * document mask's partial tile: 9 instructions a score -> 5 in the PTX) */
  constexpr bool direct = !fa_variant::has_score && !fa_variant_rules::bool_mask && !fa_variant_rules::float_mask;
  K keepA = ~(K)0, keepB = ~(K)0; /* bit 2n + e: the key stays */
  if (!direct && !plain) {
    keepA = keepB = 0;
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const int col = n * 8 + c2 + e;
        keepA |= (K)(full ? vA : (unsigned)(col - aA) < (unsigned)nA) << (2 * n + e);
        keepB |= (K)(full ? vB : (unsigned)(col - aB) < (unsigned)nB) << (2 * n + e);
      }
  }
  if (!plain && fa_variant_rules::bool_mask) /* read only at the keys in range */
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const K bit = (K)1 << (2 * n + e);
        if ((keepA & bit) && !rule_mask_keeps(ruA, n * 8 + e)) keepA &= ~bit;
        if ((keepB & bit) && !rule_mask_keeps(ruB, n * 8 + e)) keepB &= ~bit;
      }
  if (!direct && !plain && fa_variant::has_mask && !mask_full)
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const K bit = (K)1 << (2 * n + e);
        int f1, f2;
        bool mA, mB;
        variant_mask_pair(p, w, n, e, mA, mB, f1, f2);
        if (fm < 0) fm = variant_kept_fault(keepA, keepB, bit, f1, f2);
        keepA &= mA ? ~(K)0 : ~bit, keepB &= mB ? ~(K)0 : ~bit;
      }
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int q = 0; q < 4; q++) s[n][q] *= ruA.scale;
  /* a plain tile's keys are all in range: no clamp, every fault kept */
  if (fa_variant::has_score && plain) variant_score_pass<NC, false>(p, w, s, ~(K)0, ~(K)0, fs);
  else if (fa_variant::has_score) variant_score_pass<NC, true>(p, w, s, keepA, keepB, fs);
  if (fa_variant_rules::softcap) frag_softcap_pass<NC, EXACT>(ruA, ruB, s);
  if (fa_variant_rules::alibi) frag_alibi_pass<NC>(ruA, ruB, s);
  if (!plain && direct) {
    /* the key range as columns [a, a + n) of each row (all of a full
     * tile's in rows before Lq) */
    const int rA = full ? 0 : aA, rB = full ? 0 : aB;
    const unsigned wA = full ? (vA ? 8 * NC : 0) : nA, wB = full ? (vB ? 8 * NC : 0) : nB;
    if (fa_variant::has_mask && !mask_full) /* a loop of its own: a branch a score otherwise */
#pragma unroll
      for (int n = 0; n < NC; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int col = n * 8 + c2 + e;
          int f1, f2;
          bool mA, mB;
          variant_mask_pair(p, w, n, e, mA, mB, f1, f2);
          const bool kA = (unsigned)(col - rA) < wA, kB = (unsigned)(col - rB) < wB;
          if (fm < 0) fm = kA && f1 >= 0 ? f1 : kB && f2 >= 0 ? f2 : -1;
          s[n][e] = kA && mA ? s[n][e] : -INFINITY;
          s[n][2 + e] = kB && mB ? s[n][2 + e] : -INFINITY;
        }
    else
#pragma unroll
      for (int n = 0; n < NC; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int col = n * 8 + c2 + e;
          if ((unsigned)(col - rA) >= wA) s[n][e] = -INFINITY;
          if ((unsigned)(col - rB) >= wB) s[n][2 + e] = -INFINITY;
        }
  } else if (!plain) {
    if (fa_variant_rules::float_mask) /* read only at the keys that stay */
#pragma unroll
      for (int n = 0; n < NC; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const K bit = (K)1 << (2 * n + e);
          if (keepA & bit) s[n][e] = rule_mask_float(ruA, s[n][e], n * 8 + e);
          if (keepB & bit) s[n][2 + e] = rule_mask_float(ruB, s[n][2 + e], n * 8 + e);
        }
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const K bit = (K)1 << (2 * n + e);
        s[n][e] = keepA & bit ? s[n][e] : -INFINITY;
        s[n][2 + e] = keepB & bit ? s[n][2 + e] : -INFINITY;
      }
  }
  fa_variant_faults(p, fs, fm);
  return false;
}

/* The SIMT kernels' key at a time: the score, and (score_chain, the
 * backward) its derivative by the dot product (fa_variant_apply's chain). */
template <> struct attn_rule<fa_variant_problem> {
  static constexpr bool tiles = fa_variant::has_mask;
  static __device__ __forceinline__ float score_chain(const fa_variant_problem &p, int64_t b, int64_t h, int64_t i,
                                                      int64_t j, float dot, int64_t lo, int64_t hi, float *chain) {
    if (j < lo || j >= hi) return -INFINITY;
    const score_rule ru = score_rule_at(p, b, h, i, j);
    int fs = -1, fm = -1;
    const float s = fa_variant_apply(p, ru, b, h, i, j, (float)j, 0, dot * ru.scale, true, false, fs, fm, chain);
    fa_variant_faults(p, fs, fm);
    return s;
  }
  static __device__ __forceinline__ float score(const fa_variant_problem &p, int64_t b, int64_t h, int64_t i, int64_t j,
                                                float dot, int64_t lo, int64_t hi) {
    return score_chain(p, b, h, i, j, dot, lo, hi, nullptr);
  }
  /* the SIMT backward: a tile mask_mod leaves empty as a whole (fa_variant::tile,
   * the same in every thread of the block) */
  static __device__ __forceinline__ bool tile_empty(const fa_variant_problem &p, int64_t b, int64_t h, int64_t i0,
                                                    int64_t i1, int64_t j0, int64_t j1) {
    return fa_variant::has_mask && fa_variant::has_tile &&
           fa_variant::tile(p.va, b, h, i0, i1, p.key_base + j0, p.key_base + j1) == 0;
  }
  /* the tensor-core kernels: the keys of mask_mod's nonempty tiles, in two
   * steps as the built-in rule's (kept at a block's start, narrow_to after
   * its first barrier; attn_keys); the tile's rows (ROWS) aside:
   * mask_mod's spans have their own (spans_br) */
  template <int ROWS> struct keys_kept {
    int first, end; /* in tiles of spans_bc keys */
  };
  template <int ROWS>
  static __device__ __forceinline__ keys_kept<ROWS> kept(const fa_variant_problem &p, int64_t b, int64_t h,
                                                         int64_t i0) {
    if (!fa_variant::has_mask || !p.va.spans) return keys_kept<ROWS>{0, 0};
    const int *sp = fa_variant_span(p, b, h, i0 / p.va.spans_br);
    return keys_kept<ROWS>{sp[0], sp[1]};
  }
  template <int ROWS>
  static __device__ __forceinline__ void narrow_to(const fa_variant_problem &p, const keys_kept<ROWS> &k, int64_t *lo,
                                                   int64_t *hi) {
    if (!fa_variant::has_mask || !p.va.spans) return;
    const int64_t first = (int64_t)k.first * p.va.spans_bc, end = (int64_t)k.end * p.va.spans_bc;
    *lo = max(*lo, first), *hi = min(*hi, end);
    if (*hi <= *lo) *lo = *hi = 0; /* nothing attended: zeros, lse = -inf */
  }
  template <int ROWS>
  static __device__ __forceinline__ void narrow(const fa_variant_problem &p, int64_t b, int64_t h, int64_t i0,
                                                int64_t *lo, int64_t *hi) {
    narrow_to<ROWS>(p, kept<ROWS>(p, b, h, i0), lo, hi);
  }
};

/* ---- the tensor-core backward (attention_backward_wgmma.cuh) ---- */

/* mask_mod's tile of 64 rows from i0 and 64 keys from j0 (both multiples
 * of 64; FA_BLOCK_*): partial without a tile record. */
__device__ int bwm_variant_state(const fa_attn_problem &p0, int64_t b, int64_t h, int64_t i0, int64_t j0) {
  const fa_variant_problem &p = static_cast<const fa_variant_problem &>(p0);
  if (j0 >= p.Lk) return FA_BLOCK_EMPTY;
  if (!fa_variant::has_mask || !p.va.tiles) return FA_BLOCK_PARTIAL;
  const long long at = ((b * p.va.spans_sb + h * p.va.spans_sh) * p.va.spans_nq + i0 / 64) * p.va.tiles_nk + j0 / 64;
  return p.va.tiles[at];
}

/* The dK/dV block of keys [j0, j1) of KV head hk: its query rows [span[0],
 * span[1]) (the built-in ranges', in shared memory) narrowed in place to
 * the 64-row tiles where mask_mod leaves some pair of some head of the
 * group (called by the whole block). */
__device__ void bwm_variant_rows(const fa_attn_problem &p0, int64_t b, int64_t hk, int64_t j0, int64_t j1, int64_t *span) {
  const fa_variant_problem &p = static_cast<const fa_variant_problem &>(p0);
  const int64_t r0 = span[0], r1 = span[1];
  if (!fa_variant::has_mask || !p.va.tiles || r1 <= r0) return;
  __shared__ int found[2];
  if (threadIdx.x == 0) found[0] = 0x7fffffff, found[1] = -1;
  __syncthreads();
  const int64_t group = p.Hq / p.Hkv, q0 = r0 / 64, nq = (r1 + 63) / 64 - q0, k0 = j0 / 64, nk = (j1 + 63) / 64 - k0;
  int lo = 0x7fffffff, hi = -1;
  for (int64_t u = threadIdx.x; u < group * nq * nk; u += blockDim.x) {
    const int64_t h = hk * group + u / (nq * nk), qt = q0 + u / nk % nq, kt = k0 + u % nk;
    if (bwm_variant_state(p, b, h, qt * 64, kt * 64) != FA_BLOCK_EMPTY) lo = min(lo, (int)qt), hi = max(hi, (int)qt);
  }
  if (hi >= 0) atomicMin(&found[0], lo), atomicMax(&found[1], hi);
  __syncthreads(); /* every thread has read span */
  if (threadIdx.x == 0) {
    if (found[1] < 0) span[0] = span[1] = 0;
    else span[0] = max(r0, (int64_t)found[0] * 64), span[1] = min(r1, (int64_t)found[1] * 64 + 64);
  }
  __syncthreads();
}

/* bwm_probs for a variant: P and dS of one warp's accumulators (the layout
 * and roles of bwm_probs; full: every row takes every key by the built-in
 * ranges), a score at a time through fa_variant_apply
 * with its derivative (scale, score_mod's by s, softcap's), mask_mod
 * skipped on a full tile; an empty tile gives zeros.  Rows past Lq have
 * lse = -inf and keys past Lk lie outside every range: no expression is
 * evaluated there.  The per-head rule is built once (alibi's distance
 * from the tile's corner), per score only when a bool or float mask is
 * set (its row). */
template <bool KEY_ROWS, int NC, int R>
__device__ void bwm_variant_probs(const fa_attn_problem &p0, int64_t b, int64_t h, int64_t i0, int64_t j0, int qoff,
                                  int koff, const bwm_rows<R> &rows, bool full, int state, float (*s)[4],
                                  float (*dp)[4]) {
  const fa_variant_problem &p = static_cast<const fa_variant_problem &>(p0);
  constexpr bool masks = fa_variant_rules::bool_mask || fa_variant_rules::float_mask;
  /* mask_mod alone, a full tile that the built-in ranges leave whole: the scale alone, as without a rule */
  constexpr bool mask_only = !fa_variant::has_score && !masks && !fa_variant_rules::softcap && !fa_variant_rules::alibi;
  if (mask_only && full && state == FA_BLOCK_FULL) {
    bwm_probs_plain<KEY_ROWS, NC, R>(p, qoff, rows, s, dp);
    return;
  }
  const int lane = threadIdx.x & 31, g = lane >> 2, c2 = (lane & 3) * 2;
  const score_rule ru0 = score_rule_at(p, b, h, i0, j0);
  const bool mask_full = state == FA_BLOCK_FULL, none = state == FA_BLOCK_EMPTY;
  int fs = -1, fm = -1;
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int row = g + (e >> 1) * 8, col = n * 8 + c2 + (e & 1);
      const int qi = qoff + (KEY_ROWS ? col : row), kj = koff + (KEY_ROWS ? row : col);
      const int i = (int)i0 + qi, j = (int)j0 + kj; /* below 2^31 (fa_check) */
      const bool in = !none && j >= rows.lo[qi] && j < rows.hi[qi] && rows.lse[qi] != -INFINITY;
      const score_rule ru = masks && in ? score_rule_at(p, b, h, i, j) : ru0;
      int f1 = -1, f2 = -1;
      float chain = 0.f;
      const float sc = fa_variant_apply(p, ru, b, h, i, j, (float)j, masks ? 0 : kj - qi, s[n][e] * ru0.scale, in,
                                        mask_full, f1, f2, &chain);
      fs = fs < 0 ? f1 : fs, fm = fm < 0 ? f2 : fm;
      const bool takes = sc != -INFINITY; /* a key the row does not take passes nothing back */
      const float pr = takes ? exp2_approx((sc - rows.lse[qi]) * FA_LOG2E) : 0.f;
      s[n][e] = pr;
      dp[n][e] = takes ? pr * (dp[n][e] - rows.delta[qi]) * chain : 0.f;
    }
  fa_variant_faults(p, fs, fm);
}

/* The verdict of mask_mod's tile of query tile qt and key tile kt by its
 * pairs (inside Lq and Lk), evaluated by one warp: FA_BLOCK_EMPTY, _FULL or
 * _PARTIAL.  decide: the verdict only, so that the warp stops at the first
 * round of pairs (32 lanes x 8) that has both a kept and a dropped pair;
 * else every pair is evaluated and its bad reads recorded (fa.block_mask,
 * whose call reports them).  Pair n is row n % BR, key (row + o(n / BR)) %
 * BC, o(m) = m·S % BC with S about 0.618·BC and prime to BC (a permutation
 * of the offsets): a round takes every row (BR <= 256) and keys across the
 * tile, so that a boundary in either (a document's, the diagonal) shows in
 * the first, and the offsets of the first rounds spread over the tile, so
 * that a corner of kept pairs (a document that starts late in the query
 * tile and ends early in the key tile) shows soon.  With offsets in order
 * (o(m) = m) such a tile of a document mask took 21-30 rounds (L = 4096 and
 * 16384, the bench's documents), and the block, which waits for its
 * slowest warp, as long; with the spread one round each. */
static __host__ __device__ constexpr int fa_pair_stride(int bc) {
  int s = bc * 618 / 1000 | 1, a = 0, b = 0;
  for (;; s += 2) { /* the first odd s from 0.618·bc prime to bc */
    for (a = s, b = bc; b;) {
      const int t = a % b;
      a = b, b = t;
    }
    if (a == 1) return s;
  }
}

template <int BR, int BC>
static __device__ int fa_variant_tile_pairs(const fa_variant_problem &p, long long b, long long h, long long qt,
                                            long long kt, int lane, bool decide) {
  constexpr int PER = 8, ROUND = 32 * PER, S = fa_pair_stride(BC);
  const int Lq = (int)p.Lq, Lk = (int)p.Lk; /* below 2^31 (checked) */
  const float bf = (float)b, hf = (float)h;
  bool any = false, all = true;
  for (int r0 = 0; r0 < BR * BC; r0 += ROUND) {
#pragma unroll
    for (int e = 0; e < PER; e++) {
      const int idx = r0 + e * 32 + lane, row = idx % BR;
      const int i = (int)qt * BR + row, j = (int)kt * BC + (row + idx / BR * S % BC) % BC;
      if (idx >= BR * BC || i >= Lq || j >= Lk) continue;
      int f = -1;
      const long long jk = p.key_base + j; /* an opts.splits piece: the whole call's k */
      const bool m = fa_variant::mask(p.va, 0.f, b, h, i, jk, bf, hf, (float)i, (float)jk, f);
      if (!decide && f >= 0) fa_variant_record(p.va.fault[1], f);
      any |= m, all &= m;
    }
    any = __any_sync(~0u, any), all = __all_sync(~0u, all);
    if (decide && any && !all) break;
  }
  return any ? (all ? FA_BLOCK_FULL : FA_BLOCK_PARTIAL) : FA_BLOCK_EMPTY;
}

/* mask_mod over the tiles of BR query rows and BC keys: one block a (b, h,
 * query tile) (b, h: 0 where the expression does not use them, spans_sb,
 * spans_sh = 0), its key tiles CHUNK at a time, a warp a key tile: the
 * warp decides it as a whole where fa_variant::tile can (its reads split
 * among the lanes), else evaluates its pairs (fa_variant_tile_pairs), and
 * the tiles' span record (spans, for the attention kernels) and/or their
 * states (states, nk a query tile: fa.block_mask, and the backward's tiles)
 * are written.  Reads out of range are recorded for fa.block_mask only (no
 * spans): the attention kernels, forward and backward, evaluate mask_mod
 * again on the keys they attend, and record them there (a pair outside the
 * built-in ranges is not an error).  A thread a tile, with the block on
 * each undecided tile in turn, took 78 us at L = 4096 for a document mask
 * (H200: ncu), about a fifth of the call; a warp a tile, which stops at the
 * first round of pairs that decides it, is the fix. */
template <int BR, int BC>
__global__ void __launch_bounds__(FA_SPANS_THREADS) fa_variant_spans_kernel(fa_variant_problem p, int *spans,
                                                                            uint8_t *states, long long nh) {
  constexpr int CHUNK = 256, WARPS = FA_SPANS_THREADS / 32;
  __shared__ uint8_t state[CHUNK];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const long long nq = p.va.spans_nq, blk = blockIdx.x, qt = blk % nq;
  const long long b = blk / nq / nh, h = blk / nq % nh;
  const long long nk = (p.Lk + BC - 1) / BC, Lk = p.Lk;
  const long long q1 = min(qt * BR + BR, (long long)p.Lq) - 1;
  fa_span_builder span = fa_span_start();
  for (long long c0 = 0; c0 < nk; c0 += CHUNK) {
    const int n = (int)min((long long)CHUNK, nk - c0);
    for (int u = warp; u < n; u += WARPS) { /* the same in every lane of the warp */
      const long long kt = c0 + u, k1 = min(kt * BC + BC, Lk) - 1;
      int verdict = 2;
      if (fa_variant::has_tile)
        verdict = fa_variant::tile(p.va, b, h, qt * BR, q1, p.key_base + kt * BC, p.key_base + k1, lane, 32);
      int st = verdict == 1 ? FA_BLOCK_FULL : FA_BLOCK_EMPTY;
      if (verdict == 2) st = fa_variant_tile_pairs<BR, BC>(p, b, h, qt, kt, lane, spans != nullptr);
      if (lane == 0) state[u] = (uint8_t)st;
    }
    __syncthreads();
    if (states)
      for (int u = threadIdx.x; u < n; u += FA_SPANS_THREADS) states[blk * nk + c0 + u] = state[u];
    if (spans && threadIdx.x == 0)
      for (int u = 0; u < n; u++)
        fa_span_add(span, (int)(c0 + u), state[u] != FA_BLOCK_EMPTY, state[u] == FA_BLOCK_FULL);
    __syncthreads(); /* state is the next chunk's */
  }
  if (spans && threadIdx.x == 0) fa_span_store(span, spans + 4 * blk);
}

#endif
