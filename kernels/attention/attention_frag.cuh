/* What the two tensor-core "flash" kernels (mma.sync in attention_mma.cu,
 * Hopper wgmma in attention_wgmma.cu) share: their tile layouts and the
 * tile loader, asynchronous copies, packing, and the online softmax on
 * score fragments, which the f32 kernel (attention_f32.cu, S from FP64
 * tensor cores in the same layout) uses too.
 *
 * Both hold S and O in the accumulator layout of an m16n8 tile per warp:
 * warp w owns query rows 16w + g and 16w + g + 8 (g = lane / 4); chunk n of
 * 8 columns holds, in this thread, columns 8n + c2 and 8n + c2 + 1
 * (c2 = 2·(lane % 4)) of row A in [n][0..1] and of row B in [n][2..3].
 * The four lanes of a quad share a row. */
#ifndef FA_KERNELS_ATTENTION_FRAG_CUH
#define FA_KERNELS_ATTENTION_FRAG_CUH

#include "async_copy.cuh"
#include "mma_sync.cuh"
#include "attention_nonfinite.cuh"

template <typename T> static __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *(uint32_t *)&h;
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *(uint32_t *)&h;
}

/* Byte offset of 16-byte chunk `chunk` (8 elements) of row `row` in the
 * mma.sync kernel's tiles: row after row of CH chunks, chunks XOR-swizzled
 * by row % 8 (ldmatrix reads them without bank conflicts). */
template <int CH> static __device__ __forceinline__ int swz(int row, int chunk) {
  return (row * CH + (chunk ^ (row & 7))) * 16;
}

/* The same in the wgmma kernel's tiles of ROWS rows: 64-column blocks of
 * ROWS × 128 bytes, chunks swizzled by row % 8 within each 1024-byte group
 * of 8 rows (the hardware's 128-byte swizzle, given 1024-byte aligned
 * blocks). */
template <int ROWS> static __device__ __forceinline__ int sw128(int row, int chunk) {
  return (chunk >> 3) * ROWS * 128 + row * 128 + (((chunk & 7) ^ (row & 7)) << 4);
}

/* This warp's 16 rows from row0 of a tile of ROWS rows (sw128) as the
 * A fragments of its D / 16 k-steps (wgmma with A from registers). */
template <int D, int ROWS>
static __device__ __forceinline__ void sw128_a_frags(uint32_t (*a)[4], const char *tile, int row0, int lane) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++) ldmatrix_x4(a[ks], smem_addr(tile + sw128<ROWS>(row0 + (lane & 15), ks * 2 + (lane >> 4))));
}

/* Byte offset of chunk ch of row r in a tile of CH chunks a row, in either
 * layout (WGMMA: sw128 of ROWS rows, else swz). */
template <bool WGMMA, int ROWS, int CH> static __device__ __forceinline__ int tile_chunk(int r, int ch) {
  return WGMMA ? sw128<ROWS>(r, ch) : swz<CH>(r, ch);
}

/* Rows [r0, r0 + ROWS) of a matrix of DG columns, rows ld elements apart
 * (any multiple of 8: API §6's strided layouts; DG when DENSE), f16/bf16,
 * into a tile of D
 * columns in either layout (WGMMA: sw128, else swz) by THREADS threads, a
 * cp.async per chunk; rows at or past `limit` and columns past DG (a tile
 * wider than the rows) are zero-filled, never read.  Each thread
 * keeps one chunk column and steps down the rows by a multiple of 8, so its
 * swizzle, its addresses and the trip count are fixed: per chunk the loop
 * is a compare, two adds and the copy (the generic form, with the trip
 * count left to the thread index, cost more integer work than the softmax). */
template <typename T, int D, int ROWS, int THREADS, bool WGMMA, bool DENSE, int DG = D>
static __device__ __forceinline__ void load_tile(char *tile, const T *src, int64_t ld, int64_t r0, int64_t limit) {
  const int CH = D / 8, STEP = THREADS / CH; /* chunks a row; rows a pass */
  static_assert(THREADS % CH == 0 && STEP % 8 == 0 && ROWS % STEP == 0, "load_tile: a pass must cover whole rows");
  /* DENSE (rows DG apart, contiguous heads): the passes' offsets are
   * constants of the copy instructions; a runtime stride costs an address
   * computation a copy, 8-18 % of the key loop in 16 bits (A/B of
   * 2026-11-25), hence the kernels' two instances */
  const int64_t row_ld = DENSE ? DG : ld;
  const int chunk = threadIdx.x % CH, row0 = threadIdx.x / CH;
  const int64_t left = limit - r0; /* rows that exist from r0 on */
  const int rows = left >= ROWS ? ROWS : left > 0 ? (int)left : 0;
  const T *g = src + (r0 + row0) * row_ld + chunk * 8;
  char *t = tile + tile_chunk<WGMMA, ROWS, CH>(row0, chunk);
  const int step_bytes = WGMMA ? STEP * 128 : STEP * CH * 16; /* row & 7 is the same every pass */
#pragma unroll
  for (int it = 0; it < ROWS / STEP; it++) {
    const bool in = row0 + it * STEP < rows && chunk < DG / 8;
    cp_async16(t + it * step_bytes, in ? g + it * STEP * row_ld : src, in ? 16 : 0);
  }
}

/* load_tile's copies (sw128 layout) for a run of tiles one after the other, a key loop's K and V:
 * the thread's element offset is made once and stepped a tile at a time, and the rows that exist
 * come as a 32-bit count, so that a tile costs its copies, their predicates and two 64-bit adds.
 * (load_tile made them afresh from the tile's first row in 64 bits: about 60 instructions a key
 * tile for the D = 64 forward's four copies a thread, H200 ncu.)  K and V of one stride share a
 * stream (DENSE: both rows DG apart), which holds one offset in two registers. */
template <typename T, int D, int ROWS, int THREADS, bool DENSE, int DG = D> struct tile_stream {
  static constexpr int CH = D / 8, STEP = THREADS / CH;
  int64_t off; /* the thread's chunk of the next tile's first row, elements from the matrix's start */
  int64_t ld;  /* rows' stride, elements (DG when DENSE: the passes' offsets are constants) */
  /* rows from r0 on of matrices whose rows are row_ld apart */
  __device__ __forceinline__ tile_stream(int64_t row_ld, int64_t r0)
      : off((r0 + threadIdx.x / CH) * (DENSE ? DG : row_ld) + (threadIdx.x % CH) * 8), ld(DENSE ? DG : row_ld) {}
  /* the next tile of src, its first `rows` rows, into tile; the rest zero-filled (their copies name
   * src and read nothing) */
  __device__ __forceinline__ void copy(char *tile, const T *src, int rows) const {
    static_assert(THREADS % CH == 0 && STEP % 8 == 0 && ROWS % STEP == 0, "tile_stream: a pass must cover whole rows");
    const int chunk = threadIdx.x % CH, row0 = threadIdx.x / CH;
    char *t = tile + sw128<ROWS>(row0, chunk);
    const T *g = src + off;
#pragma unroll
    for (int it = 0; it < ROWS / STEP; it++) {
      const bool in = row0 + it * STEP < rows && chunk < DG / 8;
      cp_async16(t + it * STEP * 128, in ? g + it * STEP * ld : src, in ? 16 : 0);
    }
  }
  __device__ __forceinline__ void step() { off += ROWS * ld; }
};

/* A block whose query tile has no key (ntiles = 0, block-uniform) skips the
 * key loop and with it the loop's wait for the copies and its barrier; the
 * staged output store then writes into Q's tile.  cp.async completes per
 * thread, so each thread waiting for its own copies is not enough: another
 * thread's copy of Q may still land on the staged output (wrong rows, a
 * different one each run: the Lq >> Lk causal race of issue 21).  Every
 * copy is waited for and the block meets before any thread writes the
 * tile.  Called by the whole block. */
static __device__ __forceinline__ void settle_copies_without_keys(int ntiles) {
  if (ntiles > 0) return;
  cp_async_wait<0>();
  __syncthreads();
}

/* The running state of this thread's two query rows. */
struct frag_rows {
  int64_t iA, iB, loA, hiA, loB, hiB; /* rows, and their key ranges [lo, hi) */
  float mA, mB, lA, lB;               /* running max, this thread's part of the row sum */
  /* the variants' (frag_variant_tile): the keys of mask_mod's run of full
   * tiles for this query tile, read from its span record at the first key
   * tile (vf_lo < 0: not yet); a read a key tile cost the all-true mask_mod
   * about 10 % (H200) */
  mutable int vf_lo = -1, vf_hi = 0;
};

/* Block blk's query tile of BR rows; q, k, v point at its head's rows
 * (GQA: the key/value head of query head h; rows p.*_st.s apart); out()
 * and lse() at its head's output rows and lse entries (NULL without lse),
 * made at the end (held through the key loop, they cost registers).
 * Blocks go head by head, the long
 * causal tiles of a head first; with p.sched_heads = G > 1, groups of G
 * heads go tile row by tile row, longest first, so that the grid ends on
 * short tiles while a group's keys and values still fit in L2.  The index
 * arithmetic is done in I: unsigned by default (the launches checked that
 * the blocks fit; 64-bit divisions are software loops, a few hundred
 * instructions at every block's start: +2-4 % at L = 1024), int64_t for the
 * f32 kernel, which sits at its register cap and spilled with the 32-bit
 * form (-3-5 % at D = 64, docs/perf/2026-11-22-attention-h200-run14.json). */
template <typename T, int D, int BR, typename I = unsigned> struct frag_qtile {
  int64_t bh, b, h, i0;
  const T *q, *k, *v;
  __device__ __forceinline__ T *out(const fa_attn_problem &p) const { return (T *)p.o + attn_at(p.o_st, b, h, 0); }
  __device__ __forceinline__ float *lse(const fa_attn_problem &p) const {
    return p.lse ? p.lse + attn_at(p.lse_st, b, h, 0) : NULL;
  }
  __device__ __forceinline__ frag_qtile(const attn_params &p, int64_t blk64) {
    const I blk = (I)blk64, qtiles = (I)((p.Lq + BR - 1) / BR), BH = (I)(p.B * p.Hq), Hq = (I)p.Hq;
    const I G = p.sched_heads > 1 ? (I)p.sched_heads : (I)1;
    const I grp = blk / (G * qtiles), in = blk % (G * qtiles), gh = min(G, BH - grp * G);
    const I ubh = grp * G + in % gh, uh = ubh % Hq;
    bh = ubh, b = ubh / Hq, h = uh, i0 = (int64_t)(qtiles - 1 - in / gh) * BR;
    const int64_t hk = uh / (Hq / (I)p.Hkv);
    q = (const T *)p.q + attn_at(p.q_st, b, h, 0);
    k = (const T *)p.k + attn_at(p.k_st, b, hk, 0), v = (const T *)p.v + attn_at(p.v_st, b, hk, 0);
  }
};

/* The state of rows i0 + rA and i0 + rB of batch b, before any key. */
static __device__ __forceinline__ frag_rows frag_rows_start(const fa_attn_problem &p, int64_t b, int64_t i0, int rA,
                                                            int rB) {
  frag_rows r = {i0 + rA, i0 + rB, 0, 0, 0, 0, -INFINITY, -INFINITY, 0.f, 0.f};
  if (r.iA < p.Lq) fa_attn_range_of(&p, b, r.iA, &r.loA, &r.hiA);
  if (r.iB < p.Lq) fa_attn_range_of(&p, b, r.iB, &r.loB, &r.hiB);
  return r;
}

/* softcap and alibi (score_rule's steps) as passes over a tile's scores
 * of rows A and B, keys 8n + e from the rules' first.  softcap's tanh:
 * TANH_SFU1 where c <= 128 (the score then within 4e-5 of c·tanh(s/c)),
 * tanhf for the f32 kernel (EXACT) and for larger c. */
template <int NC, tanh_form F>
static __device__ __forceinline__ void frag_softcap_as(const score_rule &ruA, const score_rule &ruB, float (*s)[4]) {
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 2; e++)
      s[n][e] = rule_softcap<F>(ruA, s[n][e]), s[n][2 + e] = rule_softcap<F>(ruB, s[n][2 + e]);
}
template <int NC, bool EXACT>
static __device__ __forceinline__ void frag_softcap_pass(const score_rule &ruA, const score_rule &ruB, float (*s)[4]) {
  if (!EXACT && ruA.cap <= 128.f) frag_softcap_as<NC, TANH_SFU1>(ruA, ruB, s); /* rows A and B: the call's one c */
  else frag_softcap_as<NC, TANH_LIBM>(ruA, ruB, s);
}
template <int NC>
static __device__ __forceinline__ void frag_alibi_pass(const score_rule &ruA, const score_rule &ruB, float (*s)[4]) {
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const float kf = (float)(n * 8 + e);
      s[n][e] = rule_alibi(ruA, s[n][e], kf), s[n][2 + e] = rule_alibi(ruB, s[n][2 + e], kf);
    }
}

/* Whether every row of the warp has this tile's keys on one side of its
 * alibi diagonal (dist0 - k >= 0 for all of its keys k, or <= 0), so that
 * the bias -slope·|dist0 - k| is linear in k there; called by whole warps
 * (a vote: the warp takes one path). */
template <int NC>
static __device__ __forceinline__ bool frag_alibi_one_side(const score_rule &ruA, const score_rule &ruB) {
  const float kl = (float)((NC - 1) * 8 + 1); /* this thread's last key of the tile, from its first */
  return __all_sync(0xffffffffu, (ruA.dist0 >= kl || ruA.dist0 <= 0.f) && (ruB.dist0 >= kl || ruB.dist0 <= 0.f));
}
/* The scale and alibi of such a tile in two FMAs a score: the bias as
 * ±slope·k ∓ slope·dist0, then s·scale plus it (frag_alibi_pass after the
 * scale took a multiply, an add and an FMA: the alibi rule cost about a
 * fifth of the D = 128 forward's time). */
template <int NC>
static __device__ __forceinline__ void frag_alibi_linear(const score_rule &ruA, const score_rule &ruB, float scale,
                                                         float (*s)[4]) {
  const float aA = ruA.dist0 > 0.f ? ruA.slope : -ruA.slope, aB = ruB.dist0 > 0.f ? ruB.slope : -ruB.slope;
  const float cA = -aA * ruA.dist0, cB = -aB * ruB.dist0;
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const float kf = (float)(n * 8 + e);
      s[n][e] = fmaf(s[n][e], scale, fmaf(aA, kf, cA)), s[n][2 + e] = fmaf(s[n][2 + e], scale, fmaf(aB, kf, cB));
    }
}

/* EXTRAS_VARIANT's rule, defined in attention_variant.cuh (run-time
 * compiled: it calls the traced expression's code). */
template <int NC, bool EXACT>
__device__ bool frag_variant_tile(const fa_attn_problem &p, int64_t b, int64_t h, int64_t hB, int64_t j0, int c2,
                                  bool full, const frag_rows &r, float (*s)[4], int aA, int nA, int aB, int nB);

/* This thread's maxima of rows A and B over a tile's scores (raised from
 * *mA, *mB), in C independent chains a row joined at the end (a power of
 * 2): exact in any order (fmaxf skips a NaN in every order).  Four chains
 * made the FP8 kernel 2-4 % faster; in the 16-bit kernels they cost 4 % at
 * D = 64 and gained nothing at D = 128 and 256 (H200, 2026-12-03,
 * docs/perf/2026-12-03-lazy-max-h200.json). */
template <int NC, int C = 1> static __device__ __forceinline__ void frag_tile_max(float (*s)[4], float *mA, float *mB) {
  float a[C], b[C];
#pragma unroll
  for (int c = 0; c < C; c++) a[c] = c ? -INFINITY : *mA, b[c] = c ? -INFINITY : *mB;
#pragma unroll
  for (int n = 0; n < NC; n++)
    a[n % C] = fmaxf(a[n % C], fmaxf(s[n][0], s[n][1])), b[n % C] = fmaxf(b[n % C], fmaxf(s[n][2], s[n][3]));
#pragma unroll
  for (int w = 1; w < C; w *= 2)
#pragma unroll
    for (int c = 0; c + w < C; c += 2 * w) a[c] = fmaxf(a[c], a[c + w]), b[c] = fmaxf(b[c], b[c + w]);
  *mA = a[0], *mB = b[0];
}

/* The key range as the rows' column bounds inside a tile of 8·NC keys
 * from j0, [a, a + n): one 32-bit compare a score (a causal diagonal tile
 * takes this path). */
struct frag_cols {
  int aA, nA, aB, nB;
};
template <int NC> static __device__ __forceinline__ frag_cols frag_cols_of(const frag_rows &r, int64_t j0) {
  const int64_t W = NC * 8;
  frag_cols c;
  c.aA = (int)max(min(r.loA - j0, W), (int64_t)0), c.nA = (int)max(min(r.hiA - j0, W), (int64_t)0) - c.aA;
  c.aB = (int)max(min(r.loB - j0, W), (int64_t)0), c.nB = (int)max(min(r.hiB - j0, W), (int64_t)0) - c.aB;
  return c;
}

/* -inf at the columns outside the rows' ranges k (a tile not wholly inside them). */
template <int NC> static __device__ __forceinline__ void frag_mask_cols(float (*s)[4], const frag_cols &k, int c2) {
#pragma unroll
  for (int n = 0; n < NC; n++)
#pragma unroll
    for (int e = 0; e < 2; e++) {
      const int col = n * 8 + c2 + e;
      if ((unsigned)(col - k.aA) >= (unsigned)k.nA) s[n][e] = -INFINITY;
      if ((unsigned)(col - k.aB) >= (unsigned)k.nB) s[n][2 + e] = -INFINITY;
    }
}

/* Row i's bool mask bits (p.mask_bits, which the dispatch makes for every
 * kernel that scores in fragments: attention_mask_bits.cu) for the keys
 * this thread holds in the tile of 8·NC keys from j0, keys j0 + c2 + 8n + e
 * (e = 0, 1) at bit 8(n % 4) + e of u[n / 4]; all set for a row past Lq
 * (valid false), which has no mask row.  One 16-, 8- or 4-byte load where
 * the tile starts at a multiple of its width in words (a thread's keys are
 * then those words' bits from c2 on), else NC / 4 + 1 words shifted into
 * place; a row's padding keeps both inside it. */
template <int NC>
static __device__ __forceinline__ void frag_mask_bits(const fa_attn_problem &p, int64_t b, int64_t h, int64_t i,
                                                      bool valid, int64_t j0, int c2, uint32_t (&u)[(NC + 3) / 4]) {
  constexpr int NW = (NC + 3) / 4;
  if (!valid) {
#pragma unroll
    for (int q = 0; q < NW; q++) u[q] = 0xffffffffu;
    return;
  }
  const int64_t *bs = p.mask_bits_strides;
  const uint32_t *row = p.mask_bits + b * bs[0] + h * bs[1] + i * bs[2];
  if constexpr (NW == 4 || NW == 2 || NW == 1)
    if ((j0 & (32 * NW - 1)) == 0) {
      const uint32_t *w = row + (j0 >> 5);
      if constexpr (NW == 4) {
        const uint4 x = *(const uint4 *)w;
        u[0] = x.x >> c2, u[1] = x.y >> c2, u[2] = x.z >> c2, u[3] = x.w >> c2;
      } else if constexpr (NW == 2) {
        const uint2 x = *(const uint2 *)w;
        u[0] = x.x >> c2, u[1] = x.y >> c2;
      } else {
        u[0] = w[0] >> c2;
      }
      return;
    }
  const int64_t k = j0 + c2;
  const uint32_t *w = row + (k >> 5);
  uint32_t x[NW + 1];
#pragma unroll
  for (int q = 0; q <= NW; q++) x[q] = w[q];
#pragma unroll
  for (int q = 0; q < NW; q++) u[q] = __funnelshift_r(x[q], x[q + 1], (unsigned)(k & 31));
}

/* The score rules as variant structs, one a kernel instance's EXTRAS: the
 * built-in rule of API §2 in three tiers (none of its extras; softcap and
 * alibi; those and the masks) and the traced variants of §9, each through
 * the same tile hook, apply<NC>: the score rule on key tile
 * [j0, j0 + 8·NC) of this thread's raw dot products in s: scaled scores,
 * -inf outside a row's range or where the mask says no; *tmA, *tmB: this
 * thread's maxima of rows A and B, in scaled units; it returns whether s
 * stayed raw (the scale folded into the exponent: frag_exp_factor).  full:
 * every key of the tile is inside both rows' ranges (rows before Lq) and
 * scale > 0.  Row B is of head hB when given (>= 0: the decode kernel
 * packs the query heads of one key head into a tile), else of head h as
 * row A.  The kernels call it through frag_score_tile.
 *
 * EXTRAS_SCORE and EXTRAS_MASK (this template): each option is a pass over
 * the tile under one branch, so that a score pays for the options set and
 * the unrolled passes schedule as straight code (attn_score a score, with a
 * branch for each option, was 1.8-3.2x slower in bf16: call 1 of
 * docs/perf/2026-11-25-attention-h100-extras.json); EXTRAS_SCORE compiles
 * no mask pass.  On a full tile the key range needs no test a score, and
 * a float mask's key pairs are read in one access where its rows allow; a
 * bool mask is read as bits (frag_mask_bits), a few words a row. */
template <int EXTRAS> struct frag_rule {
  template <int NC, bool LINEAR_ALIBI = false, bool EXACT = false>
  static __device__ __forceinline__ bool apply(const fa_attn_problem &p, int64_t b, int64_t h, int64_t j0, int c2,
                                               bool full, const frag_rows &r, float (*s)[4], float *tmA, float *tmB,
                                               int64_t hB) {
    const float scale = p.scale_f;
    float mA = -INFINITY, mB = -INFINITY;
    const frag_cols k = frag_cols_of<NC>(r, j0);
    const int aA = k.aA, nA = k.nA, aB = k.aB, nB = k.nB;
    /* the rule for each row from this thread's first column on.  A mask is
     * read only at keys in range: all of a full tile's for the rows before
     * Lq (rows past it have no mask row; their scores are never stored),
     * else the row's columns [a, a + n). */
    const score_rule ruA = score_rule_at(p, b, h, r.iA, j0 + c2),
                     ruB = score_rule_at(p, b, hB < 0 ? h : hB, r.iB, j0 + c2);
    const bool vA = r.iA < p.Lq, vB = r.iB < p.Lq;
#define FRAG_IN(X, col) (full ? v##X : (unsigned)((col) - a##X) < (unsigned)n##X)
    /* rows A and B may be of two heads (hB: decode's packing), one of slope 0 */
    const bool alibi = hB >= 0 ? p.alibi != NULL : ruA.slope != 0.f;
    /* a full tile under nothing but a bool mask keeps s raw, as EXTRAS_NONE
     * does (the scale folded into the exponent: a multiply a score less,
     * 1-3 % at D = 64) */
    const bool raw = full && !(ruA.cap > 0.f) && !alibi && !(ruA.mask && ruA.mask_float);
    if (raw) {
    } else if (LINEAR_ALIBI && alibi && !(ruA.cap > 0.f) && frag_alibi_one_side<NC>(ruA, ruB)) {
      frag_alibi_linear<NC>(ruA, ruB, scale, s);
    } else {
#pragma unroll
      for (int n = 0; n < NC; n++)
#pragma unroll
        for (int q = 0; q < 4; q++) s[n][q] *= scale;
      if (ruA.cap > 0.f) frag_softcap_pass<NC, EXACT>(ruA, ruB, s);
      if (alibi) frag_alibi_pass<NC>(ruA, ruB, s);
    }
    /* a full tile whose mask rows allow it reads a thread's key pairs in one
     * access each (a pair could cross the end of a row elsewhere) */
    const bool pairs = full && ruA.pairs && ruB.pairs;
    if (EXTRAS == EXTRAS_MASK && ruA.mask && ruA.mask_float && pairs)
#pragma unroll
      for (int n = 0; n < NC; n++) {
        if (vA) {
          const float2 m = rule_mask_float2(ruA, n * 8);
          s[n][0] += m.x, s[n][1] += m.y;
        }
        if (vB) {
          const float2 m = rule_mask_float2(ruB, n * 8);
          s[n][2] += m.x, s[n][3] += m.y;
        }
      }
    else if (EXTRAS == EXTRAS_MASK && ruA.mask && ruA.mask_float)
#pragma unroll
      for (int n = 0; n < NC; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          const int col = n * 8 + c2 + e, k = n * 8 + e;
          if (FRAG_IN(A, col)) s[n][e] = rule_mask_float(ruA, s[n][e], k);
          if (FRAG_IN(B, col)) s[n][2 + e] = rule_mask_float(ruB, s[n][2 + e], k);
        }
    if (EXTRAS == EXTRAS_MASK && ruA.mask && !ruA.mask_float) { /* bool: its bits (frag_mask_bits) */
      constexpr int NW = (NC + 3) / 4;
      uint32_t uA[NW], uB[NW];
      frag_mask_bits<NC>(p, b, h, r.iA, vA, j0, c2, uA);
      frag_mask_bits<NC>(p, b, hB < 0 ? h : hB, r.iB, vB, j0, c2, uB);
#pragma unroll
      for (int n = 0; n < NC; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
          if (!((uA[n >> 2] >> (8 * (n & 3) + e)) & 1u)) s[n][e] = -INFINITY;
          if (!((uB[n >> 2] >> (8 * (n & 3) + e)) & 1u)) s[n][2 + e] = -INFINITY;
        }
    }
#undef FRAG_IN
    if (!full) frag_mask_cols<NC>(s, k, c2); /* the key range: a pass only on the tiles that need it */
    frag_tile_max<NC>(s, &mA, &mB);
    if (raw) mA *= scale, mB *= scale;
    *tmA = mA, *tmB = mB;
    return raw;
  }
};

/* Bit i set where column 8i + c (key group i, parity c) lies in [a, a + n):
 * a thread's columns of one parity on a tile of 8·NC keys, tested as bits. */
template <int NC> static __device__ __forceinline__ uint32_t frag_col_bits(int a, int n, int c) {
  const int lo = (a - c + 7) >> 3, hi = (a + n - c + 7) >> 3; /* a - c >= -7; hi <= NC */
  if constexpr (NC < 32) return (1u << hi) - (1u << lo);
  else return (uint32_t)((1ull << hi) - (1ull << lo)); /* 1u << 32 is undefined */
}

/* Whether the scale is positive (a tile whose rows all take all its keys then runs under the scale
 * alone), as an integer test of the double's bits: the scale is finite (src/check.c), and a finite
 * double is > 0 exactly when its bits, read as a signed 64-bit integer, are.  ptxas rematerialises
 * a value it can recompute from the parameters rather than hold a register, and an f64 compare
 * `p.scale > 0` became a DSETP at every key tile (an empty asm hid it from NVVM, not from ptxas).
 * A DSETP waits for the pipe that Hopper's FP64 shares with the tensor cores: issued right after
 * the products, it held the warp until they were done (13 % of the stall samples of the D = 64
 * forward, 11.6 % at D = 128, H200 ncu); an integer compare runs on the ALU.  (`p.scale_f > 0.f`,
 * the f32 scale, measured 0.95-1.00x this test: docs/perf/2026-11-30-scale-test-h200.json.) */
static __device__ __forceinline__ bool frag_scale_positive(const fa_attn_problem &p) {
  return __double_as_longlong(p.scale) > 0;
}

/* EXTRAS_NONE: the scale alone.  s stays raw under a positive scale (only
 * the maxima are scaled; the exponent takes the scale); a partial tile's
 * columns outside the rows' ranges go to -inf, tested as a bit a score
 * (frag_col_bits) instead of an add, a compare and a multiply a score
 * (causal 0.985-0.998x the time, H100:
 * docs/perf/2026-12-07-diag-tile-bits-h100.json). */
template <> struct frag_rule<EXTRAS_NONE> {
  template <int NC, bool = false, bool = false>
  static __device__ __forceinline__ bool apply(const fa_attn_problem &p, int64_t, int64_t, int64_t j0, int c2,
                                               bool full, const frag_rows &r, float (*s)[4], float *tmA, float *tmB,
                                               int64_t) {
    const float scale = p.scale_f;
    float mA = -INFINITY, mB = -INFINITY;
    if (full) {
      frag_tile_max<NC>(s, &mA, &mB);
      mA *= scale, mB *= scale;
      *tmA = mA, *tmB = mB;
      return true;
    }
    const bool raw = frag_scale_positive(p); /* else max(s)·scale is not the scores' max */
    if (!raw)
#pragma unroll
      for (int n = 0; n < NC; n++)
#pragma unroll
        for (int q = 0; q < 4; q++) s[n][q] *= scale;
    const frag_cols k = frag_cols_of<NC>(r, j0);
    const uint32_t bA[2] = {frag_col_bits<NC>(k.aA, k.nA, c2), frag_col_bits<NC>(k.aA, k.nA, c2 + 1)};
    const uint32_t bB[2] = {frag_col_bits<NC>(k.aB, k.nB, c2), frag_col_bits<NC>(k.aB, k.nB, c2 + 1)};
#pragma unroll
    for (int n = 0; n < NC; n++)
#pragma unroll
      for (int e = 0; e < 2; e++) {
        if (!((bA[e] >> n) & 1u)) s[n][e] = -INFINITY;
        if (!((bB[e] >> n) & 1u)) s[n][2 + e] = -INFINITY;
      }
    frag_tile_max<NC>(s, &mA, &mB);
    if (raw) mA *= scale, mB *= scale;
    *tmA = mA, *tmB = mB;
    return raw;
  }
};

/* EXTRAS_VARIANT: a traced score_mod / mask_mod with the built-in rule
 * (frag_variant_tile, run-time compiled). */
template <> struct frag_rule<EXTRAS_VARIANT> {
  template <int NC, bool = false, bool EXACT = false>
  static __device__ __forceinline__ bool apply(const fa_attn_problem &p, int64_t b, int64_t h, int64_t j0, int c2,
                                               bool full, const frag_rows &r, float (*s)[4], float *tmA, float *tmB,
                                               int64_t hB) {
    const float scale = p.scale_f;
    float mA = -INFINITY, mB = -INFINITY;
    const frag_cols k = frag_cols_of<NC>(r, j0);
    const bool raw = frag_variant_tile<NC, EXACT>(p, b, h, hB < 0 ? h : hB, j0, c2, full, r, s, k.aA, k.nA, k.aB, k.nB);
    frag_tile_max<NC>(s, &mA, &mB);
    if (raw) mA *= scale, mB *= scale;
    *tmA = mA, *tmB = mB;
    return raw;
  }
};

/* The kernels' one entry to the rule of their instance (frag_rule).
 * LINEAR_ALIBI: alibi on tiles to one side of the diagonal as two FMAs a
 * score (frag_alibi_linear), for the instances where it was measured
 * faster: the Hopper kernels at D = 128, +2-5 % with alibi; at D = 64
 * their alibi instances ran 1-3.5 % slower with it, at D = 256 0.96-1.02x
 * (H200, 2026-11-29: docs/perf/2026-11-29-alibi-linear-h200.json). */
template <int NC, int EXTRAS, bool LINEAR_ALIBI = false, bool EXACT = false>
static __device__ __forceinline__ bool frag_score_tile(const fa_attn_problem &p, int64_t b, int64_t h, int64_t j0,
                                                       int c2, bool full, const frag_rows &r, float (*s)[4],
                                                       float *tmA, float *tmB, int64_t hB = -1) {
  return frag_rule<EXTRAS>::template apply<NC, LINEAR_ALIBI, EXACT>(p, b, h, j0, c2, full, r, s, tmA, tmB, hB);
}

/* The multiplier of a tile's s in the exponent: scale when frag_score_tile
 * left s raw (it says so: a full tile without extras, or a variant's with
 * nothing but a mask_mod it need not evaluate), else 1; in base-2 units
 * (times log2 e) unless EXACT. */
template <bool EXACT = false>
static __device__ __forceinline__ float frag_exp_factor(const fa_attn_problem &p, bool raw) {
  return (raw ? p.scale_f : 1.f) * (EXACT ? 1.f : FA_LOG2E);
}

/* s = 2^(s·k - off) in place for rows A and B (-inf -> 0), and this
 * thread's sums of each row.  EXACT (the f32 kernel): k and off in natural
 * units, p = 2^((s·k - off)·log2 e), so that the rounding of the exponent
 * does not grow with the scores' magnitude (one more multiply). */
template <int NC, bool EXACT = false, int C = 1 /* chains a row, as frag_tile_max's */>
static __device__ __forceinline__ void frag_exp_tile(float (*s)[4], float k, float offA, float offB, float *sumA,
                                                     float *sumB) {
  float a[C], b[C];
#pragma unroll
  for (int c = 0; c < C; c++) a[c] = b[c] = 0.f;
  const float u = EXACT ? FA_LOG2E : 1.f;
#pragma unroll
  for (int n = 0; n < NC; n++) {
#pragma unroll
    for (int e = 0; e < 2; e++) {
      float pa = exp2_approx(fmaf(s[n][e], k, -offA) * u);
      float pb = exp2_approx(fmaf(s[n][2 + e], k, -offB) * u);
      s[n][e] = pa, s[n][2 + e] = pb;
      a[n % C] += pa, b[n % C] += pb;
    }
  }
#pragma unroll
  for (int w = 1; w < C; w *= 2)
#pragma unroll
    for (int c = 0; c + w < C; c += 2 * w) a[c] += a[c + w], b[c] += b[c + w];
  *sumA = a[0], *sumB = b[0];
}

/* How far (natural units) a tile's max may pass a row's running max before
 * the running max is raised, in the lazy form of frag_rows_max: P = exp(s -
 * m) then stays at most 2^8 (in range in f32 and in P's 16-bit forms, whose
 * relative rounding is the same at any magnitude), and once a row's max has
 * settled its O is not rescaled at all (frag_rescale_moved). */
#define FA_MAX_SLACK 5.5451774f /* 8 ln 2 */

/* The rows' running maxima r.mA, r.mB raised to this thread's tile maxima
 * tmA, tmB (reduced across the quad here); *alphaA, *alphaB = exp(m_old -
 * m_new), 1 for a row still empty.  LAZY: a running max is raised only
 * where the tile's passes it by more than FA_MAX_SLACK (the first finite
 * one always), and else stays as it is, with alpha = 1. */
template <bool LAZY = false>
static __device__ __forceinline__ void frag_rows_max(frag_rows &r, float tmA, float tmB, float *alphaA, float *alphaB) {
  tmA = fmaxf(tmA, __shfl_xor_sync(0xffffffffu, tmA, 1));
  tmA = fmaxf(tmA, __shfl_xor_sync(0xffffffffu, tmA, 2));
  tmB = fmaxf(tmB, __shfl_xor_sync(0xffffffffu, tmB, 1));
  tmB = fmaxf(tmB, __shfl_xor_sync(0xffffffffu, tmB, 2));
  /* lazy: -inf - -inf and NaN compare false (the max stays), as fmaxf keeps it */
  const float nmA = LAZY ? (tmA - r.mA > FA_MAX_SLACK ? tmA : r.mA) : fmaxf(r.mA, tmA);
  const float nmB = LAZY ? (tmB - r.mB > FA_MAX_SLACK ? tmB : r.mB) : fmaxf(r.mB, tmB);
  *alphaA = nmA == -INFINITY ? 1.f : exp2_approx((r.mA - nmA) * FA_LOG2E);
  *alphaB = nmB == -INFINITY ? 1.f : exp2_approx((r.mB - nmB) * FA_LOG2E);
  r.mA = nmA, r.mB = nmB;
}

/* One key tile [j0, j0 + 8·NC) of the online softmax: the score rule, the
 * tile max across the quad, P = exp(s - m) in s, the row sums;
 * *alphaA, *alphaB = exp(m_old - m_new), by which O must be scaled
 * (frag_rescale) before P·V is added to it.  LAZY: frag_rows_max's lazy
 * maxima (then frag_rescale_moved). */
template <int NC, int EXTRAS, bool EXACT = false, bool LINEAR_ALIBI = false, bool LAZY = false>
static __device__ __forceinline__ void frag_softmax_tile(const fa_attn_problem &p, int64_t b, int64_t h, int64_t j0,
                                                         int c2, bool full, frag_rows &r, float (*s)[4],
                                                         float *alphaA, float *alphaB, int64_t hB = -1) {
  float tmA, tmB;
  const bool raw = frag_score_tile<NC, EXTRAS, LINEAR_ALIBI, EXACT>(p, b, h, j0, c2, full, r, s, &tmA, &tmB, hB);
  frag_rows_max<LAZY>(r, tmA, tmB, alphaA, alphaB);
  const float nmA = r.mA, nmB = r.mB;
  const float u = EXACT ? 1.f : FA_LOG2E;
  const float offA = nmA == -INFINITY ? 0.f : nmA * u, offB = nmB == -INFINITY ? 0.f : nmB * u;
  float sumA, sumB;
  frag_exp_tile<NC, EXACT>(s, frag_exp_factor<EXACT>(p, raw), offA, offB, &sumA, &sumB);
  r.lA = r.lA * *alphaA + sumA; /* reduced across the quad at the end */
  r.lB = r.lB * *alphaB + sumB;
}

/* "two_pass", output pass: one key tile's final probabilities exp(s - m) / l
 * in s, the score rule applied (offA, offB: frag_stats_offset<EXACT>). */
template <int NC, int EXTRAS, bool EXACT = false>
static __device__ __forceinline__ void frag_probs_tile(const fa_attn_problem &p, int64_t b, int64_t h, int64_t j0,
                                                       int c2, bool full, const frag_rows &r, float (*s)[4],
                                                       float offA, float offB) {
  float tmA, tmB, sumA, sumB; /* unused: the statistics are final */
  const bool raw = frag_score_tile<NC, EXTRAS, false, EXACT>(p, b, h, j0, c2, full, r, s, &tmA, &tmB);
  frag_exp_tile<NC, EXACT>(s, frag_exp_factor<EXACT>(p, raw), offA, offB, &sumA, &sumB);
}

/* The row sums: this thread's parts added across the quad. */
static __device__ __forceinline__ void frag_sum_quad(frag_rows &r) {
  r.lA += __shfl_xor_sync(0xffffffffu, r.lA, 1);
  r.lA += __shfl_xor_sync(0xffffffffu, r.lA, 2);
  r.lB += __shfl_xor_sync(0xffffffffu, r.lB, 1);
  r.lB += __shfl_xor_sync(0xffffffffu, r.lB, 2);
}

/* "two_pass", statistics pass: (m, l) of rows A and B into p.row_stats. */
static __device__ __forceinline__ void frag_stats_store(const attn_params &p, int64_t bh, int lane, frag_rows &r) {
  frag_sum_quad(r);
  if ((lane & 3) == 0) {
    if (r.iA < p.Lq) p.row_stats[2 * (bh * p.Lq + r.iA)] = r.mA, p.row_stats[2 * (bh * p.Lq + r.iA) + 1] = r.lA;
    if (r.iB < p.Lq) p.row_stats[2 * (bh * p.Lq + r.iB)] = r.mB, p.row_stats[2 * (bh * p.Lq + r.iB) + 1] = r.lB;
  }
}

/* "two_pass", output pass: from the rows' final (m, l), the offsets that
 * make 2^(s·k - off) = exp(s - m) / l, so that P comes out normalised:
 * m·log2 e + log2 l (0 for an empty row, whose scores are all -inf; NaN
 * when l is, so that the row comes out NaN).  EXACT (the f32 kernel): m
 * alone in natural units, and the caller divides O by l, as the one-pass
 * kernels do: m + ln l as one f32 is rounded at the scores' magnitude,
 * which under alibi with causal top_left at 16k keys (every score near
 * -slope·16k) put up to 5e-4 on every weight of a row (f32 error 3.6e-4
 * against the one-pass kernel's 1.4e-4, H200, docs/perf/README.md session
 * 61; seed 6105 of the oracle).  The 16-bit kernels' form rounds alike,
 * within their dtype's tolerance. */
template <bool EXACT = false>
static __device__ __forceinline__ float frag_stats_offset(const attn_params &p, int64_t bh, int64_t i) {
  if (i >= p.Lq) return 0.f;
  const float m = p.row_stats[2 * (bh * p.Lq + i)], l = p.row_stats[2 * (bh * p.Lq + i) + 1];
  if (m == -INFINITY) return l == l || EXACT ? 0.f : l;
  return EXACT ? m : fmaf(m, FA_LOG2E, log2f(l));
}

/* O *= alpha per row. */
template <int DC> static __device__ __forceinline__ void frag_rescale(float (*o)[4], float alphaA, float alphaB) {
#pragma unroll
  for (int d = 0; d < DC; d++) o[d][0] *= alphaA, o[d][1] *= alphaA, o[d][2] *= alphaB, o[d][3] *= alphaB;
}

/* The same, skipped where no row of the warp moved its max (alpha = 1 would
 * leave O as it is): with frag_rows_max's lazy maxima most tiles skip it, as
 * do the decode kernel's long key streams with exact ones.  In the prefill
 * kernels with exact maxima some row of a warp moves at almost every tile,
 * and the test cost more than it saved (H200,
 * docs/perf/2026-11-22-attention-h200-run5.json). */
template <int DC> static __device__ __forceinline__ void frag_rescale_moved(float (*o)[4], float alphaA, float alphaB) {
  if (__any_sync(0xffffffffu, alphaA != 1.f || alphaB != 1.f)) frag_rescale<DC>(o, alphaA, alphaB);
}

/* The end of the rows: the factors 1 / l that finish O (the quad's sums
 * first; an empty row, l = 0, gives zeros, NaN stays NaN), or 1 when
 * NORMALIZED (the output pass of "two_pass", whose O is final). */
template <bool NORMALIZED>
static __device__ __forceinline__ void frag_finish(frag_rows &r, float *invA, float *invB) {
  *invA = *invB = 1.f;
  if (!NORMALIZED) {
    frag_sum_quad(r);
    *invA = row_inv(r.lA), *invB = row_inv(r.lB);
  }
}

/* lse of rows A and B into lse (the head's entries, NULL: none wanted;
 * -inf for an empty row); NORMALIZED: from p.row_stats. */
template <bool NORMALIZED>
static __device__ __forceinline__ void frag_lse_store(const attn_params &p, int64_t bh, float *lse, int lane,
                                                      const frag_rows &r) {
  if (lse && (lane & 3) == 0) {
    const float *st = p.row_stats + 2 * bh * p.Lq;
    const int64_t ls = p.lse_st.s;
    if (r.iA < p.Lq) lse[r.iA * ls] = NORMALIZED ? row_lse(st[2 * r.iA], st[2 * r.iA + 1]) : row_lse(r.mA, r.lA);
    if (r.iB < p.Lq) lse[r.iB * ls] = NORMALIZED ? row_lse(st[2 * r.iB], st[2 * r.iB + 1]) : row_lse(r.mB, r.lB);
  }
}

/* O / l into out (the head's rows, p.o_st.s apart) straight from the
 * fragments, 4 bytes a store (each store instruction touches 8 rows), and
 * lse. */
template <typename T, int D, bool NORMALIZED>
static __device__ __forceinline__ void frag_store(const attn_params &p, int64_t bh, T *out, float *lse, int lane,
                                                  frag_rows &r, float (*o)[4]) {
  const int c2 = (lane & 3) * 2;
  const int64_t os = p.o_st.s;
  float invA, invB;
  frag_finish<NORMALIZED>(r, &invA, &invB);
#pragma unroll
  for (int d = 0; d < D / 8; d++) {
    const int col = d * 8 + c2;
    if (r.iA < p.Lq) *(uint32_t *)(out + r.iA * os + col) = pack2<T>(o[d][0] * invA, o[d][1] * invA);
    if (r.iB < p.Lq) *(uint32_t *)(out + r.iB * os + col) = pack2<T>(o[d][2] * invB, o[d][3] * invB);
  }
  frag_lse_store<NORMALIZED>(p, bh, lse, lane, r);
}

/* The same through shared memory: the fragments' 4-byte pieces go into the
 * rows of `tile` that this group of GROUP threads owns (GROUP / 2 rows: a
 * warp's 16 with mma.sync, a warpgroup's 64 with wgmma) in the tile's
 * layout (tile_chunk), free of bank conflicts;
 * then out as a 16-byte chunk a thread, consecutive threads along a row.
 * The wgmma kernel's bf16/f16 L = 1024 causal calls ran 6-12 % faster so
 * than with frag_store (docs/perf/2026-11-22-attention-h200-run27.json).
 * The group's rows of the tile must be read no more (Q's, once the
 * products are done). */
/* A lane's pieces of O / l (rows rA and rA + 8, columns c2, c2 + 1 of each
 * 8-column chunk) into `tile` in its layout (tile_chunk): frag_store_staged's,
 * and the warp-specialised kernel's staging for its bulk stores. */
template <typename T, int D, bool WGMMA, int ROWS>
static __device__ __forceinline__ void frag_stage(char *tile, int rA, int c2, const float (*o)[4], float invA,
                                                  float invB) {
  constexpr int CH = D / 8;
#pragma unroll
  for (int d = 0; d < CH; d++) {
    *(uint32_t *)(tile + tile_chunk<WGMMA, ROWS, CH>(rA, d) + c2 * 2) = pack2<T>(o[d][0] * invA, o[d][1] * invA);
    *(uint32_t *)(tile + tile_chunk<WGMMA, ROWS, CH>(rA + 8, d) + c2 * 2) = pack2<T>(o[d][2] * invB, o[d][3] * invB);
  }
}

template <typename T, int D, bool NORMALIZED, bool WGMMA, int ROWS, int GROUP>
static __device__ __forceinline__ void frag_store_staged(const attn_params &p, int64_t bh, T *out, float *lse,
                                                         int64_t i0, int lane, frag_rows &r, float (*o)[4], char *tile) {
  static_assert(GROUP == 32 || (GROUP == 128 && ROWS == 128), "frag_store_staged: a warp, or a warpgroup of two");
  const int CH = D / 8, c2 = (lane & 3) * 2;
  const int rA = (int)(r.iA - i0); /* the tile rows of this lane's pieces: rA and rA + 8 */
  float invA, invB;
  frag_finish<NORMALIZED>(r, &invA, &invB);
  cp_async_wait<0>(); /* none of this thread's copies in flight at the exit (the zero-filled ones past the last tile) */
  /* A warp's tile (mma.sync): every lane has read its Q fragments (ldmatrix) before any lane
   * overwrites Q's rows.  With no key tile no barrier lies between the two (racecheck on the
   * Lq >> Lk cases, 2026-11-25: WAR hazards between ldmatrix and these stores). */
  if (GROUP == 32) __syncwarp();
  frag_stage<T, D, WGMMA, ROWS>(tile, rA, c2, o, invA, invB);
  if (GROUP == 32) __syncwarp();
  else if (threadIdx.x < 128) asm volatile("bar.sync 1, 128;" ::: "memory"); /* barrier 0 is the block's */
  else asm volatile("bar.sync 2, 128;" ::: "memory");
  const int t = threadIdx.x % GROUP, row0 = (threadIdx.x / GROUP) * (GROUP / 2);
  const int64_t os = p.o_st.s;
  T *rows = out + i0 * os;
  /* the group's chunks read first, then written, each store predicated on
   * its row (a branch a row around a read and a store made them wait for
   * each other, one at a time) */
  uint4 chunk[CH / 2];
#pragma unroll
  for (int it = 0; it < CH / 2; it++) {
    const int c = it * GROUP + t, row = row0 + c / CH, ch = c % CH;
    chunk[it] = *(const uint4 *)(tile + tile_chunk<WGMMA, ROWS, CH>(row, ch));
  }
  const int64_t left = p.Lq - i0; /* rows of the tile before Lq */
#pragma unroll
  for (int it = 0; it < CH / 2; it++) {
    const int c = it * GROUP + t, row = row0 + c / CH, ch = c % CH;
    if (row < left) *(uint4 *)(rows + row * os + ch * 8) = chunk[it];
  }
  frag_lse_store<NORMALIZED>(p, bh, lse, lane, r);
}

/* The key range of a query tile, in parts: the union of its rows'
 * non-empty ranges [ulo, uhi) and the keys inside every row's range
 * [alo, ahi), rows past Lq aside; fold adds row i, fold_warp combines the
 * parts of a warp's lanes. */
struct tile_range {
  int64_t ulo, uhi, alo, ahi;
  static __device__ __forceinline__ tile_range none() { return tile_range{INT64_MAX, 0, 0, INT64_MAX}; }
  __device__ __forceinline__ void fold(const fa_attn_problem &p, int64_t b, int64_t i) {
    if (i >= p.Lq) return;
    int64_t lo = 0, hi = 0;
    fa_attn_range_of(&p, b, i, &lo, &hi);
    if (lo < hi) ulo = min(ulo, lo), uhi = max(uhi, hi);
    alo = max(alo, lo), ahi = min(ahi, hi);
  }
  __device__ __forceinline__ void fold(const tile_range &o) {
    ulo = min(ulo, o.ulo), uhi = max(uhi, o.uhi), alo = max(alo, o.alo), ahi = min(ahi, o.ahi);
  }
  __device__ __forceinline__ void fold_warp() {
    for (int o = 16; o > 0; o >>= 1) {
      tile_range x;
      x.ulo = __shfl_xor_sync(0xffffffffu, (long long)ulo, o), x.uhi = __shfl_xor_sync(0xffffffffu, (long long)uhi, o);
      x.alo = __shfl_xor_sync(0xffffffffu, (long long)alo, o), x.ahi = __shfl_xor_sync(0xffffffffu, (long long)ahi, o);
      fold(x);
    }
  }
  /* the union as [*t_lo, *t_hi), (0, 0) when every row is empty */
  __device__ __forceinline__ void keys(int64_t *t_lo, int64_t *t_hi) const {
    const bool any = ulo < uhi;
    *t_lo = any ? ulo : 0, *t_hi = any ? uhi : 0;
  }
  /* Rows [i0, i0 + BR) of batch b by one warp (every lane gets it).  A
   * row's range never moves back as the row grows (fa_attn_range_of: lo
   * and hi are non-decreasing in i), and the rows that attend some key are
   * consecutive (both of its bounds on the row are non-decreasing, the
   * upper one rising no slower), so where the tile's first and last rows
   * before Lq both attend some key, those two rows give the union and the
   * intersection; else every row is folded.  (Every row folded, four a
   * lane, was about 450 instructions a query tile in the persistent
   * kernel's producer.) */
  template <int BR>
  static __device__ __forceinline__ tile_range of_tile(const fa_attn_problem &p, int64_t b, int64_t i0, int lane) {
    const int64_t last = min(i0 + BR, p.Lq) - 1;
    int64_t lo = 0, hi = 0;
    if (lane < 2) fa_attn_range_of(&p, b, lane ? last : i0, &lo, &hi);
    const int64_t lo0 = __shfl_sync(0xffffffffu, (long long)lo, 0), hi0 = __shfl_sync(0xffffffffu, (long long)hi, 0);
    const int64_t lo1 = __shfl_sync(0xffffffffu, (long long)lo, 1), hi1 = __shfl_sync(0xffffffffu, (long long)hi, 1);
    if (lo0 < hi0 && lo1 < hi1) return tile_range{lo0, hi1, lo1, hi0};
    tile_range r = none();
#pragma unroll
    for (int k = 0; k < BR / 32; k++) r.fold(p, b, i0 + k * 32 + lane);
    r.fold_warp();
    return r;
  }
};

/* The key range of a query tile [i0, i0 + BR): the union of its rows'
 * non-empty ranges as [*t_lo, *t_hi) (0, 0 when every row is empty), and
 * the keys inside every row's range (rows past Lq aside) as
 * [*all_lo, *all_hi), empty when all_hi <= all_lo.  Called by the whole
 * block: a row a thread, reduced in parallel (a serial pass over the rows
 * would stall every block's start). */
template <int BR>
static __device__ __forceinline__ void tile_key_range(const fa_attn_problem &p, int64_t b, int64_t i0, int64_t *t_lo,
                                                      int64_t *t_hi, int64_t *all_lo, int64_t *all_hi) {
  __shared__ tile_range part[BR / 32];
  const int tid = threadIdx.x;
  if (tid < BR) {
    tile_range r = tile_range::none();
    r.fold(p, b, i0 + tid);
    r.fold_warp();
    if ((tid & 31) == 0) part[tid >> 5] = r;
  }
  __syncthreads();
  tile_range r = tile_range::none();
#pragma unroll
  for (int w = 0; w < BR / 32; w++) r.fold(part[w]);
  r.keys(t_lo, t_hi);
  *all_lo = r.alo, *all_hi = r.ahi;
}

#endif
