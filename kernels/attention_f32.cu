/* "flash" for f32 at head dims D = Dv = 64 and 128 on the CUDA cores:
 * FlashAttention-2's schedule, register-tiled, exact f32 (every product and
 * sum an f32 fmaf; no TF32).
 *
 * A block of 128 threads owns 64 query rows of one (batch, head) and walks
 * its key tiles of 64.  Each thread owns an 8 × 4 block of S (rows
 * 8ty..8ty+7, keys tx + 16j) and the 8 × D/16 block of O of the same rows
 * (columns 4tx.. and 64 + 4tx..).  Shared memory returns one word a lane a
 * clock (128 bytes per SM) while the SM issues 128 FMAs, so a thread can
 * load about one word per 4 FMAs: a 4 × 4 block of S (a 256-thread block)
 * loads 8 words per 16 FMAs and is bound by the loads; 8 × 4 loads 12 per
 * 32, and O += P·V 8 + 4·D/16 per 8·D/4.
 * Lanes are laid out (tx = lane / 2, ty = 2·warp + lane % 2) so that lanes
 * 2n and 2n+1 read the same K and V addresses and lanes n and n^2 the same
 * Q and P addresses: the patterns for which Volta and Turing are known to
 * pack two lanes into one return (elsewhere the layout costs nothing).
 * The 16 lanes of a row are one warp's, so the row max and sum are
 * shuffles.
 * Q, K and V tiles are copied by cp.async; the 16-byte chunks of Q and P
 * rows are XOR-swizzled by row bit 3 and those of K rows by row % 8, so
 * that the float4 reads are free of bank conflicts without padding: at
 * D = 128 the 112 KB a block uses leave room for two blocks per SM on
 * Hopper (padded rows would not).
 * K and V have one buffer each, filled in a staggered pipeline: V_t is
 * copied while S_t = Q·K_tᵀ and its softmax are computed, K_{t+1} while
 * O += P_t·V_t is; two barriers a tile.
 * P goes through shared memory: the product P·V needs every probability
 * of a row in each thread of the row.
 * The softmax subtracts the running max in f32 (one fmaf: s·scale − m)
 * before ex2.approx of that times log2 e, so that the rounding does not
 * grow with the scores' magnitude.  Key tiles inside every row's range
 * with no mask, softcap or alibi and scale > 0 take only the scale (max of
 * the raw dot products times the scale); the others apply the rule per
 * element (attn_score with EXTRAS, a template flag, else the range).
 * A masked key's p = 0 times NaN or inf in V would poison its row, so, as
 * the tensor-core kernels, the kernel does nothing when the caller's
 * device flag says V holds NaN or inf; the generic kernel, which skips
 * masked keys, runs behind it guarded by the same flag. */
#include "attention_frag.cuh"

#define F32_BR 64
#define F32_BC 64
#define F32_THREADS 128
#define F32_RM 8 /* query rows a thread */

/* Swizzles of 16-byte chunks (XOR on the chunk index): Q and P rows by
 * row bit 3 (the two rows a warp reads at once are 8 apart), K rows by
 * row % 8 (a warp reads 16 consecutive rows), V not at all. */
enum { SW_NONE = 0, SW_Q, SW_K };
template <int SW> static __device__ __forceinline__ int f32_swz(int row) {
  return SW == SW_Q ? ((row >> 3) & 1) << 2 : SW == SW_K ? row & 7 : 0;
}

/* Rows [r0, r0 + ROWS) of a (rows × D) f32 matrix into a tile; rows at or
 * past `limit` are zero-filled, never read. */
template <int D, int ROWS, int SW>
static __device__ __forceinline__ void f32_load_tile(float *tile, const float *src, int64_t r0, int64_t limit) {
  const int CH = D / 4;
#pragma unroll
  for (int it = 0; it < ROWS * CH / F32_THREADS; it++) {
    const int c = threadIdx.x + it * F32_THREADS, row = c / CH, ch = c % CH;
    const bool in = r0 + row < limit;
    const float *g = src + (in ? (r0 + row) * D + ch * 4 : 0);
    cp_async16(tile + (row * CH + (ch ^ f32_swz<SW>(row))) * 4, g, in ? 16 : 0);
  }
}

static __device__ __forceinline__ float f4_at(const float4 &v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

/* PASS (attention_common.cuh): flash, or the statistics pass of two_pass
 * (no V, no P) or its output pass (probabilities final, no rescaling). */
template <int D, bool EXTRAS, int PASS>
__global__ void __launch_bounds__(F32_THREADS, D == 64 && !EXTRAS ? 3 : 2) attn_f32_kernel(fa_attn_problem p) {
  const bool WITH_V = PASS != PASS_STATS;
  if (WITH_V && *p.v_nonfinite) return; /* the fallback's */
  const int CH = D / 4, NH = D / 64, PCH = F32_BC / 4; /* chunks of a Q/K/V row, column halves, chunks of a P row */
  extern __shared__ __align__(16) float f32_smem[];
  float *Qs = f32_smem, *Ks = Qs + F32_BR * D, *Vs = Ks + F32_BC * D, *Ps = Vs + F32_BC * D;
  __shared__ int row_lo[F32_BR], row_hi[F32_BR]; /* the rows' key ranges (the caller checked Lk, Lq < 2^31) */

  const int tid = threadIdx.x, lane = tid & 31, ty = (tid >> 5) * 2 + (lane & 1), tx = lane >> 1;
  const frag_qtile<float, D, F32_BR, int64_t> qt(p, blockIdx.x); /* 64-bit: see frag_qtile */
  const int64_t bh = qt.bh, b = qt.b, h = qt.h, i0 = qt.i0;

  f32_load_tile<D, F32_BR, SW_Q>(Qs, qt.q, i0, p.Lq);
  cp_async_commit();
  if (tid < F32_BR) {
    int64_t lo = 0, hi = 0;
    if (i0 + tid < p.Lq) fa_attn_range_of(&p, b, i0 + tid, &lo, &hi);
    row_lo[tid] = (int)lo, row_hi[tid] = (int)hi;
  }
  int64_t t_lo, t_hi, all_lo, all_hi;
  tile_key_range<F32_BR>(p, b, i0, &t_lo, &t_hi, &all_lo, &all_hi); /* its barrier publishes row_lo, row_hi */
  const int ntiles = (int)((t_hi - t_lo + F32_BC - 1) / F32_BC);
  if (ntiles > 0) f32_load_tile<D, F32_BC, SW_K>(Ks, qt.k, t_lo, t_hi);
  cp_async_commit();

  const float scale = (float)p.scale;
  const bool scale_pos = p.scale > 0;
  const int xq = f32_swz<SW_Q>(F32_RM * ty), xk = f32_swz<SW_K>(tx); /* the same for all rows of this thread */
  const float4 *Q4 = (const float4 *)Qs + F32_RM * ty * CH, *K4 = (const float4 *)Ks + tx * CH;
  const float4 *P4 = (const float4 *)Ps + F32_RM * ty * PCH, *V4 = (const float4 *)Vs + tx;
  float *Pw = Ps + F32_RM * ty * F32_BC + tx; /* P[row][tx + 16j] is Pw[i·64 + 16·(j ^ (ty & 1))] */

  float m[F32_RM], l[F32_RM];
  float4 o[F32_RM][NH];
#pragma unroll
  for (int i = 0; i < F32_RM; i++) {
    m[i] = -INFINITY, l[i] = 0.f;
    /* PASS_OUTPUT: m holds the row's final offset m + ln l, P = exp(s - m - ln l) */
    if (PASS == PASS_OUTPUT) m[i] = frag_stats_offset(p, bh, i0 + F32_RM * ty + i) / FA_LOG2E;
#pragma unroll
    for (int c = 0; c < NH; c++) o[i][c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }

  for (int t = 0; t < ntiles; t++) {
    const int64_t j0 = t_lo + (int64_t)t * F32_BC;
    cp_async_wait<0>();
    __syncthreads(); /* K_t (and Q) are in; every thread is past P·V of tile t - 1: V and P are free */
    if (WITH_V) f32_load_tile<D, F32_BC, SW_NONE>(Vs, qt.v, j0, t_hi);
    cp_async_commit();

    /* S = Q·K_tᵀ: rows 8ty + i, keys tx + 16j, d in the order 0..D-1 */
    float s[F32_RM][4];
#pragma unroll
    for (int i = 0; i < F32_RM; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll(D == 64 ? 2 : 4)
    for (int c = 0; c < CH; c++) {
      float4 a[F32_RM], kb[4];
#pragma unroll
      for (int i = 0; i < F32_RM; i++) a[i] = Q4[i * CH + (c ^ xq)];
#pragma unroll
      for (int j = 0; j < 4; j++) kb[j] = K4[j * 16 * CH + (c ^ xk)];
#pragma unroll
      for (int i = 0; i < F32_RM; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
          s[i][j] = fmaf(a[i].x, kb[j].x, s[i][j]);
          s[i][j] = fmaf(a[i].y, kb[j].y, s[i][j]);
          s[i][j] = fmaf(a[i].z, kb[j].z, s[i][j]);
          s[i][j] = fmaf(a[i].w, kb[j].w, s[i][j]);
        }
    }

    /* the score rule, the online max across the row's 16 lanes, P = exp(s - m) */
    const bool fast = !EXTRAS && scale_pos && j0 >= all_lo && j0 + F32_BC <= all_hi;
    const float sc = fast ? scale : 1.f; /* s raw (fast) or scaled */
#pragma unroll
    for (int i = 0; i < F32_RM; i++) {
      float tm;
      if (fast) {
        tm = fmaxf(fmaxf(s[i][0], s[i][1]), fmaxf(s[i][2], s[i][3])) * scale;
      } else {
        const int r = F32_RM * ty + i;
        const int64_t lo = row_lo[r], hi = row_hi[r];
        tm = -INFINITY;
#pragma unroll
        for (int j = 0; j < 4; j++) {
          const int64_t kj = j0 + tx + 16 * j;
          float x;
          if (EXTRAS) x = attn_score(p, b, h, i0 + r, kj, s[i][j], lo, hi); /* rows past Lq: lo = hi = 0 */
          else x = kj >= lo && kj < hi ? s[i][j] * scale : -INFINITY;
          s[i][j] = x, tm = fmaxf(tm, x);
        }
      }
      float alpha = 1.f, off;
      if (PASS == PASS_OUTPUT) {
        off = m[i];
      } else {
#pragma unroll
        for (int x = 2; x < 32; x <<= 1) tm = fmaxf(tm, __shfl_xor_sync(0xffffffffu, tm, x));
        const float nm = fmaxf(m[i], tm);
        alpha = nm == -INFINITY ? 1.f : exp2_approx((m[i] - nm) * FA_LOG2E);
        off = nm == -INFINITY ? 0.f : nm;
        m[i] = nm;
      }
      float sum = 0.f;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const float pj = exp2_approx(fmaf(s[i][j], sc, -off) * FA_LOG2E); /* -inf -> 0 */
        s[i][j] = pj, sum += pj;
      }
      if (PASS != PASS_OUTPUT) l[i] = l[i] * alpha + sum; /* this thread's part: reduced across the row at the end */
      if (PASS == PASS_FLASH)
#pragma unroll
        for (int c = 0; c < NH; c++) o[i][c].x *= alpha, o[i][c].y *= alpha, o[i][c].z *= alpha, o[i][c].w *= alpha;
      if (WITH_V)
#pragma unroll
        for (int j = 0; j < 4; j++) Pw[i * F32_BC + 16 * (j ^ (ty & 1))] = s[i][j];
    }
    if (!WITH_V) { /* the statistics pass: the next K tile once every thread is past this one */
      __syncthreads();
      if (t + 1 < ntiles) f32_load_tile<D, F32_BC, SW_K>(Ks, qt.k, j0 + F32_BC, t_hi);
      cp_async_commit();
      continue;
    }

    cp_async_wait<0>();
    __syncthreads(); /* V_t and P are in; every thread is past S_t: K is free */
    if (t + 1 < ntiles) f32_load_tile<D, F32_BC, SW_K>(Ks, qt.k, j0 + F32_BC, t_hi);
    cp_async_commit();

    /* O += P·V_t: keys 4c..4c+3 a step */
#pragma unroll(D == 64 ? 4 : 2)
    for (int c = 0; c < PCH; c++) {
      float4 pr[F32_RM];
#pragma unroll
      for (int i = 0; i < F32_RM; i++) pr[i] = P4[i * PCH + (c ^ xq)];
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
  }
  cp_async_wait<0>(); /* no copy in flight at the exit (no key tile: Q's) */

  /* O / l (an empty row, l = 0: zeros and lse = -inf; NaN stays NaN); the
   * statistics pass writes (m, l), the output pass's O is final */
#pragma unroll
  for (int i = 0; i < F32_RM; i++) {
    if (PASS != PASS_OUTPUT)
#pragma unroll
      for (int x = 2; x < 32; x <<= 1) l[i] += __shfl_xor_sync(0xffffffffu, l[i], x);
    const int64_t row = i0 + F32_RM * ty + i;
    if (row >= p.Lq) continue;
    if (PASS == PASS_STATS) {
      if (tx == 0) p.row_stats[2 * (bh * p.Lq + row)] = m[i], p.row_stats[2 * (bh * p.Lq + row) + 1] = l[i];
      continue;
    }
    const float inv = PASS == PASS_OUTPUT ? 1.f : row_inv(l[i]);
    float4 *out = (float4 *)((float *)p.o + (bh * p.Lq + row) * D) + tx;
#pragma unroll
    for (int hh = 0; hh < NH; hh++)
      out[16 * hh] = make_float4(o[i][hh].x * inv, o[i][hh].y * inv, o[i][hh].z * inv, o[i][hh].w * inv);
    if (p.lse && tx == 0) {
      const float *st = p.row_stats + 2 * (bh * p.Lq + row); /* PASS_OUTPUT: the statistics pass's */
      p.lse[bh * p.Lq + row] = PASS == PASS_OUTPUT ? row_lse(st[0], st[1]) : row_lse(m[i], l[i]);
    }
  }
}

static size_t f32_smem_bytes(int D) { return sizeof(float) * (size_t)(F32_BR * D + 2 * F32_BC * D + F32_BR * F32_BC); }

template <int D, bool EXTRAS, int PASS> static fa_status launch_f32(fa_context *ctx, const fa_attn_problem *p) {
  const size_t smem = f32_smem_bytes(D);
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(attn_f32_kernel<D, EXTRAS, PASS>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  /* as much of the SM's memory as shared as the kernel can use: two blocks an SM at D = 128 */
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(attn_f32_kernel<D, EXTRAS, PASS>,
                                          cudaFuncAttributePreferredSharedMemoryCarveout,
                                          (int)cudaSharedmemCarveoutMaxShared));
  int64_t blocks = p->B * p->Hq * ((p->Lq + F32_BR - 1) / F32_BR);
  if (blocks > INT32_MAX) return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: attention on cuda: too many query tiles");
  attn_f32_kernel<D, EXTRAS, PASS><<<(unsigned)blocks, F32_THREADS, smem, fa_cuda_stream(ctx)>>>(*p);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_f32_kernel");
  return FA_OK;
}

template <int D, bool EXTRAS> static fa_status launch_f32_pass(fa_context *ctx, const fa_attn_problem *p, int pass) {
  if (pass == PASS_STATS) return launch_f32<D, EXTRAS, PASS_STATS>(ctx, p);
  if (pass == PASS_OUTPUT) return launch_f32<D, EXTRAS, PASS_OUTPUT>(ctx, p);
  return launch_f32<D, EXTRAS, PASS_FLASH>(ctx, p);
}

/* Queues algo ("flash", or "two_pass" with p->row_stats set) on the
 * register-tiled f32 kernel when the call fits (f32, D = Dv = 64 or 128,
 * 16-byte aligned q, k, v, o, the default tile {64, 64}, Lq and Lk below
 * 2^31) and the device has the shared memory (a block takes 112 KB at
 * D = 128: not on GPUs with 99 KB a block).  Then *v_flag is a device flag
 * (the caller frees it), set on the stream when V holds NaN or inf: the
 * kernel reading V has then done nothing, and the caller's fallback, which
 * skips masked keys, must run guarded by it.  *v_flag stays NULL when the
 * call does not fit. */
extern "C" fa_status fa_cuda_attention_f32(fa_context *ctx, const fa_attn_problem *p, fa_attention_algo algo,
                                           int **v_flag) {
  *v_flag = NULL;
  if (p->compute != FA_F32 || p->D != p->Dv || (p->D != 64 && p->D != 128)) return FA_OK;
  if (((uintptr_t)p->q | (uintptr_t)p->k | (uintptr_t)p->v | (uintptr_t)p->o) % 16) return FA_OK;
  if (p->tile_q != F32_BR || p->tile_k != F32_BC || p->Lq > INT32_MAX || p->Lk > INT32_MAX) return FA_OK;
  int dev = 0, smem_optin = 0;
  FA_CUDA_CHECK(ctx, cudaGetDevice(&dev));
  FA_CUDA_CHECK(ctx, cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (f32_smem_bytes((int)p->D) + 1024 > (size_t)smem_optin) return FA_OK; /* + the static 576 bytes */
  const bool x = attn_has_extras(p);
  if (p->D == 64) return launch_fast_passes(ctx, p, algo, v_flag, x ? launch_f32_pass<64, true> : launch_f32_pass<64, false>);
  return launch_fast_passes(ctx, p, algo, v_flag, x ? launch_f32_pass<128, true> : launch_f32_pass<128, false>);
}
