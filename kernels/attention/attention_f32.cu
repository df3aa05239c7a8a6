/* "flash" for f32 at head dims D = Dv = 64 and 128, exact: no TF32.
 * FlashAttention-2's schedule with S = Q·Kᵀ on the FP64 tensor cores and
 * O += P·V on the CUDA cores, interleaved so that both pipes work at once.
 *
 * Why FP64: an f32 product is exact in f64 and DMMA (mma.sync m16n8k16
 * f64, sm_90) sums in f64, so S comes out at least as accurate as a chain
 * of f32 FMAs, while one DMMA instruction does 2048 multiply-adds: the CUDA
 * cores, which ran both products at 37-38 TFLOP/s (cuBLAS SGEMM: 51), are
 * left with P·V alone.  (The FP64 tensor cores' peak equals the FMAs'.)
 *
 * A block of 128 threads owns 64 query rows of one (batch, head) and walks
 * its key tiles of 32.  Two layouts of the same rows:
 * - S: the m16n8 accumulator layout of attention_frag.cuh (warp w: rows
 *   16w + g and + 8, g = lane / 4; keys 8n + 2(lane % 4) + 0, 1), whose
 *   online softmax it shares;
 * - O: each thread an 8 × D/16 block (rows 8ty.., ty = 2w + lane % 2;
 *   columns 4tx.. and 64 + 4tx.., tx = lane / 2), P·V register-tiled: a
 *   float4 of P and one of V feed 32 FMAs.
 * Both give warp w rows 16w..16w+15, so P (through shared memory, as P·V
 * needs a whole row per thread), the rescale factors and (m, l) pass
 * between them within the warp.
 * The pipeline: S_0 and its softmax; then per tile t, one loop that issues
 * S_{t+1}'s DMMAs and P_t·V_t's FMAs together (per pass at D = 128: 4
 * DMMAs, 8192 multiply-adds a warp, and 256 FMAs a lane, as many), then
 * the softmax of S_{t+1}.  A key tile of 64 spilled (S in f64 takes 64
 * registers beside O's 64).  Run one after the other, the two products
 * measured no faster than the CUDA cores alone (docs/perf run 21's note).
 * Q, K and V tiles are copied by cp.async: Q and K rows padded by 64
 * bytes (F32_QKS), P's 16-byte chunks XOR-swizzled (p_swz), so that the
 * float4 reads are free of bank conflicts and their addresses move by a
 * constant from one pass of the product loop to the next.
 * The softmax subtracts the running max in f32 (one fmaf: s·scale − m)
 * before the exponent (frag_exp_tile's EXACT form), so that the rounding
 * does not grow with the scores' magnitude.
 * A masked key's p = 0 times NaN or inf in V would poison its row, so, as
 * the tensor-core kernels, a block does nothing when the caller's device
 * flag says V holds NaN or inf (the pass that sets it may run beside the
 * kernel: launch_guarded_by_v_flag); the generic kernel, which skips
 * masked keys, runs behind it guarded by the same flag and rewrites every
 * output. */
#include "attention_frag.cuh"
#include "attention_nonfinite.cuh"
#include "attention_registry.h"

#include <cstdio>

#define F32_BR 64
#define F32_BC 32 /* keys a tile */
#define F32_THREADS 128
#define F32_RM 8 /* query rows a thread */

/* Bank conflicts.  Q and K rows are F32_QKS floats apart, 64 bytes more
 * than a row: the S product's float4 reads (8 lanes at a time: rows g,
 * g + 1 of a pair, chunks 4kk + tig) then hit 8 distinct bank groups, and
 * a pass's addresses are the last pass's plus 64 bytes.  This replaced an
 * XOR swizzle on row bit 0 (no more shared memory: two blocks an SM still
 * fit) and took the spills out of the instances with masks (f32 D = 128
 * float mask 15-25 %, plain 1.5-2 % faster).  P's 16-byte chunks are
 * XOR-swizzled by row bit 3 alone: the O layout's float4 reads (rows r and
 * r + 8 in a phase) are free of conflicts, and a thread's eight rows
 * (8ty..) share the key, so that a pass forms one address for its eight P
 * reads.  The S layout's float2 writes (rows g = 0..3 in a phase) are then
 * 4-way conflicts, eight stores a tile; with (row % 4) in the key as well,
 * which made the writes free, the reads' addresses cost integer
 * instructions every pass and D = 128 ran 6 % slower.  (Both measured in
 * docs/perf/2026-11-25-attention-h100-f32-probes.json.)  V rows are read
 * whole by a warp: no conflicts as they are. */
#define F32_QKS(D) ((D) + 16)
static __device__ __forceinline__ int p_swz(int row) { return (row >> 3) & 1; }

/* D (16 × 8, f64) += A (16 × 16) · B (16 × 8) on the FP64 tensor cores: a
 * product of two f32 values is exact in f64, and so is its sum with few
 * others.  Lane (g = lane / 4, t = lane % 4) gives A[g][t + 4j] (a[2j]),
 * A[g + 8][t + 4j] (a[2j + 1]) and B[t + 4j][g] (b[j]), j = 0..3, and
 * holds D[g][2t..2t+1] (d0, d1) and D[g + 8][2t..2t+1] (d2, d3). */
static __device__ __forceinline__ void dmma_16x8x16(double (&d)[4], const float4 &qa, const float4 &qb,
                                                    const float4 &kb) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* the shape is sm_90's; fa_cuda_attention_f32_tile checks the build */
  asm("mma.sync.aligned.m16n8k16.row.col.f64.f64.f64.f64 {%0, %1, %2, %3}, {%4, %5, %6, %7, %8, %9, %10, %11}, "
      "{%12, %13, %14, %15}, {%0, %1, %2, %3};\n"
      : "+d"(d[0]), "+d"(d[1]), "+d"(d[2]), "+d"(d[3])
      : "d"((double)qa.x), "d"((double)qb.x), "d"((double)qa.y), "d"((double)qb.y), "d"((double)qa.z),
        "d"((double)qb.z), "d"((double)qa.w), "d"((double)qb.w), "d"((double)kb.x), "d"((double)kb.y),
        "d"((double)kb.z), "d"((double)kb.w));
#else
  (void)d, (void)qa, (void)qb, (void)kb;
  __trap();
#endif
}

/* Rows [r0, r0 + ROWS) of a matrix of D f32 columns, rows ld floats apart
 * (a multiple of 4; D when DENSE), into a tile whose rows are RS floats apart; rows at
 * or past `limit` are zero-filled, never read. */
template <int D, int ROWS, int RS, bool DENSE>
static __device__ __forceinline__ void f32_load_tile(float *tile, const float *src, int64_t ld, int64_t r0,
                                                     int64_t limit) {
  const int CH = D / 4;
  const int64_t row_ld = DENSE ? D : ld; /* DENSE: constant offsets (see load_tile) */
#pragma unroll
  for (int it = 0; it < ROWS * CH / F32_THREADS; it++) {
    const int c = threadIdx.x + it * F32_THREADS, row = c / CH, ch = c % CH;
    const bool in = r0 + row < limit;
    cp_async16(tile + row * RS + ch * 4, src + (in ? (r0 + row) * row_ld + ch * 4 : 0), in ? 16 : 0);
  }
}

static __device__ __forceinline__ float f4_at(const float4 &v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

/* S += Q·K_tᵀ over Q/K chunk ch of every lane's k-slot, for NN
 * key octets from KB: the S layout's rows r0, r0 + 8 from QA, QA + 8 rows;
 * lane t's float4 gives k-slots t, t + 4, t + 8, t + 12 (the order of a
 * dot product's terms is free, as long as Q and K agree). */
template <int D, int NN>
static __device__ __forceinline__ void f32_s_step(double (*acc)[4], const float4 *QA, const float4 *KB, int ch) {
  const int QS = F32_QKS(D) / 4; /* float4s from one Q or K row to the next */
  const float4 qa = QA[ch], qb = QA[8 * QS + ch];
  float4 kb[NN];
#pragma unroll
  for (int n = 0; n < NN; n++) kb[n] = KB[8 * n * QS + ch];
#pragma unroll
  for (int n = 0; n < NN; n++) dmma_16x8x16(acc[n], qa, qb, kb[n]);
}

/* O += P·V_t over keys 4c..4c+3: the O layout's rows 8ty.., columns 4tx..
 * and 64 + 4tx.. (V4 points at column chunk tx of key 0). */
template <int D>
static __device__ __forceinline__ void f32_pv_step(float4 (*o)[D / 64], const float4 *Ps, const float4 *V4, int c,
                                                   int ty) {
  const int CH = D / 4, NH = D / 64, PCH = F32_BC / 4;
  float4 pr[F32_RM];
#pragma unroll
  for (int i = 0; i < F32_RM; i++) {
    const int r = F32_RM * ty + i;
    pr[i] = Ps[r * PCH + (c ^ p_swz(r))];
  }
#pragma unroll
  for (int k = 0; k < 4; k++) {
    float4 vv[NH];
#pragma unroll
    for (int hh = 0; hh < NH; hh++) vv[hh] = V4[(4 * c + k) * CH + 16 * hh];
#pragma unroll
    for (int i = 0; i < F32_RM; i++) {
      const float pk = f4_at(pr[i], k);
#pragma unroll
      for (int hh = 0; hh < NH; hh++) {
        o[i][hh].x = fmaf(pk, vv[hh].x, o[i][hh].x);
        o[i][hh].y = fmaf(pk, vv[hh].y, o[i][hh].y);
        o[i][hh].z = fmaf(pk, vv[hh].z, o[i][hh].z);
        o[i][hh].w = fmaf(pk, vv[hh].w, o[i][hh].w);
      }
    }
  }
}

/* The products of one step of the pipeline, interleaved: S_{t+1} = Q·K_{t+1}ᵀ
 * (DO_S, FP64 tensor cores, from zero) and O += P_t·V_t (DO_PV, FMAs on
 * the CUDA cores).  Each pass of the loop gives the tensor cores NN
 * products of 16 × 8 × 16 and the CUDA cores 8·4·D/16 FMAs a lane, the
 * same work both ways, so that both pipes are busy at once from one warp. */
template <int D, bool DO_S, bool DO_PV>
static __device__ __forceinline__ void f32_tile_products(double (*acc)[4], float4 (*o)[D / 64], const float4 *QA,
                                                         const float4 *KB, int t4, const float4 *Ps,
                                                         const float4 *V4, int ty) {
  const int KSTEPS = D / 16, NQ = (F32_BC / 4) / KSTEPS, NN = (F32_BC / 8) / NQ; /* P chunks and key octets a step */
  if (DO_S)
#pragma unroll
    for (int n = 0; n < F32_BC / 8; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0;
#pragma unroll 1 /* unrolled, the next step's loads spill */
  for (int kk = 0; kk < KSTEPS; kk++) {
    const int ch = 4 * kk + t4;
#pragma unroll
    for (int q = 0; q < NQ; q++) {
      if (DO_S) f32_s_step<D, NN>(acc + q * NN, QA, KB + q * NN * 8 * (F32_QKS(D) / 4), ch);
      if (DO_PV) f32_pv_step<D>(o, Ps, V4, kk * NQ + q, ty);
    }
  }
}

/* S_t (key tile j0) in acc, in the S layout → the score rule, the online
 * max across the quad, P_t = exp(s - m) into shared memory (Pw: this
 * lane's P entries, p_swz'd), and O (the O layout) scaled by the rows'
 * alpha, which pass through row_alpha (flash); the output pass's P final
 * (offA, offB: the rows' m + ln l). */
template <int D, int EXTRAS, int PASS>
static __device__ __forceinline__ void f32_softmax_tile(const attn_params &p, int64_t b, int64_t h, int64_t j0,
                                                        bool full, frag_rows &r, float offA, float offB,
                                                        double (*acc)[4], float4 (*o)[D / 64], float *row_alpha,
                                                        float2 *Pw, int rA, int t4, int ty) {
  const int NT = F32_BC / 8, NH = D / 64;
  float s[NT][4];
#pragma unroll
  for (int n = 0; n < NT; n++)
#pragma unroll
    for (int e = 0; e < 4; e++) s[n][e] = (float)acc[n][e];
  if (PASS == PASS_OUTPUT) {
    frag_probs_tile<NT, EXTRAS, true>(p, b, h, j0, 2 * t4, full, r, s, offA, offB);
  } else {
    float alphaA, alphaB;
    frag_softmax_tile<NT, EXTRAS, true>(p, b, h, j0, 2 * t4, full, r, s, &alphaA, &alphaB);
    if (PASS == PASS_FLASH && t4 == 0) row_alpha[rA] = alphaA, row_alpha[rA + 8] = alphaB;
  }
  if (PASS == PASS_STATS) return;
  __syncwarp(); /* this warp's lanes are past P_{t-1}·V_{t-1}: P is free */
#pragma unroll
  for (int n = 0; n < NT; n++) {
    Pw[2 * ((2 * n + (t4 >> 1)) ^ p_swz(rA))] = make_float2(s[n][0], s[n][1]);
    Pw[8 * (F32_BC / 2) + 2 * ((2 * n + (t4 >> 1)) ^ p_swz(rA + 8))] = make_float2(s[n][2], s[n][3]);
  }
  if (PASS != PASS_FLASH) return;
  __syncwarp(); /* row_alpha of this warp's rows */
#pragma unroll
  for (int i = 0; i < F32_RM; i++) {
    const float alpha = row_alpha[F32_RM * ty + i];
#pragma unroll
    for (int c = 0; c < NH; c++) o[i][c].x *= alpha, o[i][c].y *= alpha, o[i][c].z *= alpha, o[i][c].w *= alpha;
  }
}

/* Key chunks of one "flash" launch (f32_chunk_count): where the query
 * tiles are too few to fill the GPU (a few query rows against many keys),
 * blocks [c·qblocks, (c + 1)·qblocks) take the keys of chunk c of each
 * query tile's range (`keys` keys from its start on, whole key tiles) and
 * write its normalised O and (m, l) to o and ml (row b·Hq·Lq + h·Lq + i,
 * D floats a row), which attn_f32_merge_kernel merges.  Each chunk's sums
 * run over fewer keys, so the output is also more accurate.  One query row
 * against 32k keys: at D = 64 (B 3, 16 heads) five chunks took 0.66 ms
 * against 2.17 in one, their largest error 1.8e-6 of the largest output
 * against 5.3e-6; at D = 128 (B 1, 8 heads) 32 chunks 0.215 ms against
 * 3.70, 4.9e-7 against 4.4e-6 (H200, docs/perf/2026-12-04-f32-chunks-h200.json).
 * n = 1: no chunks (qblocks is then the grid). */
struct f32_chunks {
  int n;
  int64_t keys, qblocks;
  float *o;
  float2 *ml;
};

/* PASS (attention_common.cuh): flash, or the statistics pass of two_pass
 * (no V, no P) or its output pass (probabilities final but for 1 / l, no rescaling). */
template <int D, int EXTRAS, int PASS, bool DENSE = true>
__global__ void __launch_bounds__(F32_THREADS, 2) attn_f32_kernel(attn_params p, f32_chunks ch) {
  const bool WITH_V = PASS != PASS_STATS;
  const int v_bad = WITH_V ? *p.v_nonfinite : 0; /* see leave_for_fallback */
  const int CH = D / 4, NH = D / 64, NT = F32_BC / 8; /* chunks of a Q/K/V row, column halves, key octets */
  extern __shared__ __align__(16) float f32_smem[];
  const int QKS = F32_QKS(D);
  float *Qs = f32_smem, *Ks = Qs + F32_BR * QKS, *Vs = Ks + 2 * F32_BC * QKS, *Ps = Vs + 2 * F32_BC * D; /* K_j, V_j in buffer j % 2 */
  __shared__ float row_alpha[F32_BR], row_m[F32_BR], row_l[F32_BR]; /* from the S layout to the O layout (a warp's rows) */

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ty = warp * 2 + (lane & 1), tx = lane >> 1;     /* the O layout: rows 8ty.., columns 4tx.., 64 + 4tx.. */
  const int g = lane >> 2, t4 = lane & 3, rA = 16 * warp + g; /* the S layout: rows rA, rA + 8, keys 8n + 2t4 + 0, 1 */
  const int chunk = ch.n > 1 ? (int)(blockIdx.x / ch.qblocks) : 0;
  const frag_qtile<float, D, F32_BR, int64_t> qt(p, ch.n > 1 ? blockIdx.x % ch.qblocks : blockIdx.x); /* 64-bit: see frag_qtile */
  const int64_t bh = qt.bh, b = qt.b, h = qt.h, i0 = qt.i0;

  const int64_t k_ld = p.k_st.s, v_ld = p.v_st.s; /* row strides (API §6) */
  f32_load_tile<D, F32_BR, QKS, DENSE>(Qs, qt.q, p.q_st.s, i0, p.Lq);
  cp_async_commit();
  frag_rows r = frag_rows_start(p, b, i0, rA, rA + 8);
  int64_t t_lo, t_hi, all_lo, all_hi;
  tile_key_range<F32_BR>(p, b, i0, &t_lo, &t_hi, &all_lo, &all_hi);
  if (ch.n > 1) { /* this chunk's whole key tiles of the range (none past its end) */
    const int64_t lo = t_lo + chunk * ch.keys;
    t_hi = lo < t_hi ? min(t_hi, lo + ch.keys) : lo;
    t_lo = lo;
  }
  const int ntiles = (int)((t_hi - t_lo + F32_BC - 1) / F32_BC);
  if (ntiles > 0) f32_load_tile<D, F32_BC, QKS, DENSE>(Ks, qt.k, k_ld, t_lo, t_hi);
  cp_async_commit();
  if (ntiles > 1) f32_load_tile<D, F32_BC, QKS, DENSE>(Ks + F32_BC * QKS, qt.k, k_ld, t_lo + F32_BC, t_hi);
  if (ntiles > 0 && WITH_V) f32_load_tile<D, F32_BC, D, DENSE>(Vs, qt.v, v_ld, t_lo, t_hi);
  cp_async_commit();
  if (leave_for_fallback(v_bad)) return;

  const bool scale_pos = frag_scale_positive(p);
  const float4 *QA = (const float4 *)Qs + rA * (QKS / 4), *KB = (const float4 *)Ks + g * (QKS / 4);
  const float4 *P4 = (const float4 *)Ps, *V4 = (const float4 *)Vs + tx;
  const int KBUF = F32_BC * QKS / 4, VBUF = F32_BC * CH; /* float4s a K, a V buffer */
  float2 *Pw = (float2 *)(Ps + rA * F32_BC) + (t4 & 1); /* P[rA + 8e][8n + 2t4..] at Pw[8e·32 + 2·((2n + t4/2) ^ swz)] */
  float offA = 0.f, offB = 0.f; /* PASS_OUTPUT: the rows' final m, P = exp(s - m), O / l at the end */
  if (PASS == PASS_OUTPUT) offA = frag_stats_offset<true>(p, bh, r.iA), offB = frag_stats_offset<true>(p, bh, r.iB);

  double acc[NT][4];
  float4 o[F32_RM][NH];
#pragma unroll
  for (int i = 0; i < F32_RM; i++)
#pragma unroll
    for (int c = 0; c < NH; c++) o[i][c] = make_float4(0.f, 0.f, 0.f, 0.f);

  /* The pipeline: S_0 and its softmax; then, for each tile t, the copies
   * of K_{t+2} and V_{t+1} into the buffers of K_t and V_{t-1}, S_{t+1}
   * and O += P_t·V_t together, and the softmax of S_{t+1}: one barrier a
   * tile.  P, row_alpha are a warp's own rows: warp barriers order them. */
  if (ntiles > 0) {
    cp_async_wait<1>();
    __syncthreads(); /* Q and K_0 are in */
    f32_tile_products<D, true, false>(acc, o, QA, KB, t4, P4, V4, ty);
    f32_softmax_tile<D, EXTRAS, PASS>(p, b, h, t_lo, scale_pos && t_lo >= all_lo && t_lo + F32_BC <= all_hi, r, offA, offB,
                                      acc, o, row_alpha, Pw, rA, t4, ty);
  }
  for (int t = 0; t < ntiles; t++) {
    const int64_t j1 = t_lo + (int64_t)(t + 1) * F32_BC;
    const bool more = t + 1 < ntiles;
    cp_async_wait<0>();
    __syncthreads(); /* K_{t+1} and V_t are in; every warp is past K_t and V_{t-1} */
    if (t + 2 < ntiles) f32_load_tile<D, F32_BC, QKS, DENSE>(Ks + (t & 1) * F32_BC * QKS, qt.k, k_ld, j1 + F32_BC, t_hi);
    if (more && WITH_V) f32_load_tile<D, F32_BC, D, DENSE>(Vs + ((t + 1) & 1) * F32_BC * D, qt.v, v_ld, j1, t_hi);
    cp_async_commit();
    const float4 *kb = KB + ((t + 1) & 1) * KBUF, *vb = V4 + (t & 1) * VBUF;
    if (more && WITH_V) f32_tile_products<D, true, true>(acc, o, QA, kb, t4, P4, vb, ty);
    else if (more) f32_tile_products<D, true, false>(acc, o, QA, kb, t4, P4, vb, ty);
    else if (WITH_V) f32_tile_products<D, false, true>(acc, o, QA, kb, t4, P4, vb, ty);
    if (!more) break;
    f32_softmax_tile<D, EXTRAS, PASS>(p, b, h, j1, scale_pos && j1 >= all_lo && j1 + F32_BC <= all_hi, r, offA, offB,
                                      acc, o, row_alpha, Pw, rA, t4, ty);
  }
  cp_async_wait<0>(); /* no copy in flight at the exit (no key tile: Q's) */

  /* the rows' (m, l): the statistics pass writes them, the others hand
   * them to the O layout (the same warp's rows) */
  if (PASS == PASS_STATS) {
    frag_stats_store(p, bh, lane, r);
    return;
  }
  if (PASS == PASS_FLASH) frag_sum_quad(r);
  if (t4 == 0) row_m[rA] = r.mA, row_l[rA] = r.lA, row_m[rA + 8] = r.mB, row_l[rA + 8] = r.lB;
  __syncwarp();

  /* O / l (an empty row, l = 0: zeros and lse = -inf; NaN stays NaN); the
   * output pass's l is the statistics pass's */
#pragma unroll
  for (int i = 0; i < F32_RM; i++) {
    const int rr = F32_RM * ty + i;
    const int64_t row = i0 + rr;
    if (row >= p.Lq) continue;
    const float inv = row_inv(PASS == PASS_OUTPUT ? p.row_stats[2 * (bh * p.Lq + row) + 1] : row_l[rr]);
    if (PASS == PASS_FLASH && ch.n > 1) { /* the chunk's state, for the merge */
      const int64_t at = (int64_t)chunk * (p.B * p.Hq * p.Lq) + bh * p.Lq + row;
      float4 *part = (float4 *)(ch.o + at * D) + tx;
#pragma unroll
      for (int hh = 0; hh < NH; hh++)
        part[16 * hh] = make_float4(o[i][hh].x * inv, o[i][hh].y * inv, o[i][hh].z * inv, o[i][hh].w * inv);
      if (tx == 0) ch.ml[at] = make_float2(row_m[rr], row_l[rr]);
      continue;
    }
    float4 *out = (float4 *)(qt.out(p) + row * p.o_st.s) + tx;
#pragma unroll
    for (int hh = 0; hh < NH; hh++)
      out[16 * hh] = make_float4(o[i][hh].x * inv, o[i][hh].y * inv, o[i][hh].z * inv, o[i][hh].w * inv);
    if (attn_wants_lse(p) && tx == 0) {
      const float *st = p.row_stats + 2 * (bh * p.Lq + row); /* PASS_OUTPUT: the statistics pass's */
      attn_lse_store(p, attn_at(p.lse_st, b, h, row), PASS == PASS_OUTPUT ? st[0] : row_m[rr],
                     PASS == PASS_OUTPUT ? st[1] : row_l[rr]);
    }
  }
}

static size_t f32_smem_bytes(int D) {
  return sizeof(float) * (size_t)((F32_BR + 2 * F32_BC) * F32_QKS(D) + 2 * F32_BC * D + F32_BR * F32_BC);
}

/* The key chunks' merge: a warp a row, its lanes D / 32 columns each.
 * Chunk c weighs e^(m_c - M)·l_c (M the largest m of the chunks with
 * keys): from (m, l), not from an f32 lse as the decode kernel's 16-bit
 * merge (attention_decode.cuh), whose rounding, half an ulp of |lse| (5e-4
 * near 8192), would weigh more than an f32 output's.  In the chunks'
 * order (the same result every run); a chunk with
 * no key (l = 0) weighs nothing, NaN in a chunk's m or l makes the row
 * NaN (NaN or inf in its q or k, as one chunk would give).  Where V holds
 * NaN or inf the chunks wrote nothing and the SIMT kernel behind rewrites
 * every output (leave_for_fallback), so the merge leaves too. */
template <int D> __global__ void __launch_bounds__(128) attn_f32_merge_kernel(attn_params p, f32_chunks ch) {
  if (leave_for_fallback(*p.v_nonfinite)) return;
  constexpr int PER = D / 32;
  const int64_t R = p.B * p.Hq * p.Lq, row = (int64_t)blockIdx.x * 4 + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= R) return;
  float M = -INFINITY;
  bool nan = false;
  for (int c = 0; c < ch.n; c++) {
    const float2 ml = ch.ml[c * R + row];
    nan |= ml.x != ml.x || ml.y != ml.y;
    if (ml.y > 0.f) M = fmaxf(M, ml.x);
  }
  float acc[PER], den = 0.f;
#pragma unroll
  for (int j = 0; j < PER; j++) acc[j] = 0.f;
  for (int c = 0; c < ch.n; c++) {
    const float2 ml = ch.ml[c * R + row];
    if (!(ml.y > 0.f)) continue;
    const float w = expf(ml.x - M) * ml.y;
    const float *x = ch.o + (c * R + row) * D + lane * PER;
    den += w;
#pragma unroll
    for (int j = 0; j < PER; j++) acc[j] += w * x[j];
  }
  if (nan) den = __int_as_float(0x7fc00000);
  const int64_t i = row % p.Lq, bh = row / p.Lq, b = bh / p.Hq, h = bh % p.Hq;
  const float inv = row_inv(den);
  float *out = (float *)p.o + attn_at(p.o_st, b, h, i) + lane * PER;
#pragma unroll
  for (int j = 0; j < PER; j++) out[j] = acc[j] * inv;
  if (attn_wants_lse(p) && lane == 0) attn_lse_store(p, attn_at(p.lse_st, b, h, i), nan ? den : M, den);
}

/* The key chunks of a "flash" launch of `blocks` query tiles (keys: a
 * chunk's, a multiple of F32_BC), 1 for none: where the blocks leave
 * slots of the GPU free (two blocks an SM), as many chunks as fill them,
 * each of 16 key tiles (512 keys) or more, at most 64; none where the
 * call asks for one piece (opts.splits = 1). */
#define F32_CHUNK_TILES 16
static int f32_chunk_count(const attn_params *p, int64_t blocks, int sms, int64_t *keys) {
  const int64_t tiles = (p->Lk + F32_BC - 1) / F32_BC, slots = 2 * (int64_t)sms;
  if (p->splits == 1 || blocks <= 0 || blocks * 2 > slots) return 1;
  const int64_t n = min(min(slots / blocks, tiles / F32_CHUNK_TILES), (int64_t)64);
  if (n < 2) return 1;
  const int64_t per = (tiles + n - 1) / n;
  *keys = per * F32_BC;
  return (int)((tiles + per - 1) / per);
}

template <int D, int EXTRAS, int PASS> static fa_status launch_f32(fa_context *ctx, const attn_params *p) {
  const size_t smem = f32_smem_bytes(D);
  void (*kernel)(attn_params, f32_chunks) = attn_rows_dense(p) ? attn_f32_kernel<D, EXTRAS, PASS, true>
                                                                    : attn_f32_kernel<D, EXTRAS, PASS, false>;
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  /* as much of the SM's memory as shared as the kernel can use: two blocks an SM at D = 128 */
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                          (int)cudaSharedmemCarveoutMaxShared));
  const int64_t blocks = p->B * p->Hq * ((p->Lq + F32_BR - 1) / F32_BR), rows = p->B * p->Hq * p->Lq;
  f32_chunks ch = {1, 0, blocks, NULL, NULL};
  fa_status st = FA_OK;
  if (PASS == PASS_FLASH) {
    fa_cuda_props dp;
    if ((st = fa_cuda_device_props(ctx, &dp))) return st;
    ch.n = f32_chunk_count(p, blocks, dp.sms, &ch.keys);
  }
  if ((st = attn_grid_fits(ctx, blocks * ch.n)) || (ch.n > 1 && (st = attn_grid_fits(ctx, (rows + 3) / 4)))) return st;
  size_t part_bytes = 0;
  void *part = NULL;
  if (ch.n > 1) { /* the chunks' states: (n, rows, D) outputs, then (n, rows) pairs (m, l) */
    part_bytes = sizeof(float) * (size_t)(ch.n * rows) * (size_t)(D + 2);
    if ((st = fa_cuda_malloc(ctx, &part, part_bytes))) return st;
    ch.o = (float *)part, ch.ml = (float2 *)((float *)part + (size_t)(ch.n * rows) * D);
  }
  cudaStream_t s = fa_cuda_stream(ctx);
  kernel<<<(unsigned)(blocks * ch.n), F32_THREADS, smem, s>>>(*p, ch);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess && ch.n > 1) attn_f32_merge_kernel<D><<<(unsigned)((rows + 3) / 4), 128, 0, s>>>(*p, ch);
  if (err == cudaSuccess) err = cudaGetLastError();
  fa_cuda_free_on(ctx, part, part_bytes); /* after the kernels, on their stream */
  return fa_cuda_error(ctx, err, "launch of attn_f32_kernel");
}

template <int D> static fa_status launch_f32_extras(fa_context *ctx, const attn_params *p, int pass) {
  return attn_instance_by_rule_and_pass(p, pass, [&](auto x, auto ps) {
    return launch_f32<D, decltype(x)::value, decltype(ps)::value>(ctx, p);
  });
}

/* ---- its registry entry ---- */

/* f32 at D = Dv = 64 or 128; the kernel needs sm_90 (the f64 m16n8k16
 * shape): a Hopper GPU and sm_90 code in the binary, which is what the
 * wgmma kernel's probe asks. */
static int f32_fit(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc, char *why, size_t n) {
  if (dt != FA_F32) snprintf(why, n, "%s inputs; it takes f32", fa_dtype_name(dt));
  else if (D != Dv || (D != 64 && D != 128))
    snprintf(why, n, "D = %lld, Dv = %lld; it takes D = Dv = 64 or 128", (long long)D, (long long)Dv);
  else if (!fa_cuda_wgmma_usable()) snprintf(why, n, "it needs a Hopper GPU (sm_90) and sm_90a code in this build");
  else return *br = F32_BR, *bc = F32_BC, 1;
  return 0;
}

static bool f32_tile_ok(int64_t D, int64_t br, int64_t bc) {
  return (D == 64 || D == 128) && br == F32_BR && bc == F32_BC;
}

/* rows on 16 bytes, Lq and Lk below 2^31 (its 32-bit row indices), and
 * the shared memory (112 KB a block at D = 128, two blocks an SM) */
static bool f32_takes(const fa_attn_problem *p, fa_attention_algo, bool) {
  fa_cuda_props dp;
  return attn_rows_aligned16(p) && p->Lq <= INT32_MAX && p->Lk <= INT32_MAX && fa_cuda_device_props_quiet(&dp) &&
         f32_smem_bytes((int)p->D) + 1024 <= (size_t)dp.smem_optin; /* + the static 832 bytes */
}

static fa_status f32_queue(fa_context *ctx, const attn_params *p, fa_attention_algo algo, bool, int **v_flag) {
  return launch_fast_passes(ctx, p, algo, v_flag, p->D == 64 ? launch_f32_extras<64> : launch_f32_extras<128>);
}

const attn_entry attn_entry_f32 = {FA_KERNEL_F32, ATTN_FLASH_OR_TWO_PASS, false, f32_fit, f32_tile_ok, f32_takes, f32_queue,
                                  false,         NULL,        true};
