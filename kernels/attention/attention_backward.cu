/* The backward pass of attention on the GPU (API §10): FlashAttention's
 * recomputation scheme, nothing of size Lq·Lk stored.
 *
 * Three launches: delta_i = rowsum(dO_i ∘ O_i) for every query row; then
 * dK and dV by key tile (a block owns BW_BC keys of one (batch, KV head)
 * and walks the query rows that meet them in every query head that shares
 * that KV head, so GQA's sums stay in the block); then dQ by query tile (a
 * block owns BW_BR rows of one (batch, head) and walks the key tiles of
 * their range).
 * Both recompute S = Q·Kᵀ and dP = dO·Vᵀ, P = exp(s - lse) with the
 * forward's own score rule (attn_score) and dS = P ∘ (dP - delta) times
 * the rule's derivative.  Each gradient element has one owner that adds
 * its terms in a fixed order: no atomics, the same bits from run to run.
 * (The Hopper kernel, unless the call asks for determinism, adds dQ up
 * from the dK/dV blocks with atomics instead: attention_backward_wgmma.cu.)
 * These SIMT kernels skip zero weights, so NaN or inf in an input reaches
 * only the gradients of the pairs that connect it, as in the reference;
 * they take every dtype and head dim up to 256.  The tensor-core kernels
 * (attention_backward_wgmma.cu on Hopper, attention_backward_mma.cu) take
 * f16/bf16 at D = Dv = 64 and 128 (and 96 on Hopper), guarded by a flag
 * that hands a call with NaN or inf in q, k or dout to the SIMT kernels
 * (bw_guarded).  opts.kernel names one of the three ("wgmma", "mma",
 * "simt"); else the fastest that takes the call runs.  fa_cuda_backward_run
 * is that schedule over a set of launches (fa_bw_kernels): the built-in
 * instances here, or those a Lua variant's expression is compiled into
 * (attention_variant.cu), so that both take the same delta and guard. */
#include "attention_backward_simt.cuh"

extern "C" const char *fa_cuda_attention_backward_refuses(fa_attn_kernel k, const fa_attn_problem *p,
                                                           const fa_attn_grads *g);
extern "C" fa_status fa_cuda_attention_backward_mma(fa_context *ctx, fa_attn_kernel k, const fa_attn_problem *p,
                                                    const fa_attn_grads *g, const float *delta);
extern "C" bool fa_cuda_backward_wgmma_checks_outputs(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g);
extern "C" size_t fa_cuda_backward_wgmma_acc_bytes(const fa_attn_problem *p);

/* delta of every query row (B·Hq·Lq, dense): the sum over Dv of dO·O in
 * f32.  A group of lpr lanes a row (a power of two up to 32, about Dv / V
 * of them; R rows a group, a block's worth of rows apart, their loads
 * issued together: BW_DELTA_ROWS, BW_DELTA_ROWS_FIXED in the FIXED
 * instance), each lane V elements at a time: 16 bytes a load when VEC
 * (rows of o and dout on 16 bytes, Dv a multiple of V), else one element.
 * The row's (b, h, i) in 32-bit arithmetic when the rows fit (U = unsigned).
 * A warp a row with 64-bit divisions made the whole backward 4-6 % slower
 * at D = 64, L = 1k (H200; the kernel was bound by its index arithmetic).
 * flag (or NULL): set when dout holds NaN or inf (bw_guarded), on the way.
 * FIXED (bw_fixed_dq): also each row's multiplier into mult, from
 * Σ|dO_i|, max|O_i| and its KV head's max|K|, max|V| in kvmax
 * (bw_kv_max_kernel); the flag also set when o holds NaN or inf, or where
 * the row has no multiplier. */
#define BW_DELTA_ROWS 4 /* rows a group of lanes (the FIXED instance's: bw_delta_launch) */
template <typename T, bool VEC, typename U, bool FIXED = false, int R = BW_DELTA_ROWS>
__global__ void __launch_bounds__(BW_THREADS)
    bw_delta_kernel(fa_attn_problem p, fa_attn_grads g, float *delta, int lpr, int *flag, const unsigned *kvmax,
                    float *mult, int64_t zero4) {
  constexpr int V = VEC ? 16 / sizeof(T) : 1;
#if __CUDA_ARCH__ >= 900
  /* the fused kernel queued next (fa_cuda_backward_wgmma_run: a programmatic dependent launch) may be
   * placed on the multiprocessors as this grid's last wave drains and load its first K and V tiles; it
   * waits for this grid's memory (delta, dq_acc's zeros, FIXED's multipliers) before it reads or adds
   * into any of them */
  asm volatile("griddepcontrol.launch_dependents;");
#endif
  if (g.dq_acc) { /* its share of the zero4 float4s of dq_acc, stored before the reads (nothing waits for them) */
    const int64_t share = (zero4 + gridDim.x - 1) / gridDim.x, z0 = (int64_t)blockIdx.x * share;
    const int64_t z1 = min(z0 + share, zero4);
    for (int64_t z = z0 + threadIdx.x; z < z1; z += BW_THREADS) ((float4 *)g.dq_acc)[z] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int per_block = BW_THREADS / lpr, sub = threadIdx.x % lpr;
  const U rows = (U)(p.B * p.Hq * p.Lq), Lq = (U)p.Lq, Hq = (U)p.Hq;
  U row[R], at[R]; /* at (FIXED): where the row's KV head's max|K|, max|V| are in kvmax */
  const T *o[R], *d[R];
  float acc[R], l1[R], omax[R]; /* FIXED: Σ|dO_i|, max|O_i| */
  bool bad = false;
#pragma unroll
  for (int k = 0; k < R; k++) {
    row[k] = ((U)blockIdx.x * (U)R + (U)k) * (U)per_block + (U)(threadIdx.x / lpr);
    const U i = row[k] % Lq, bh = row[k] / Lq, b = bh / Hq, h = bh % Hq;
    o[k] = row[k] < rows ? (const T *)p.o + attn_at(p.o_st, b, h, i) : NULL;
    d[k] = row[k] < rows ? (const T *)g.dout + attn_at(g.dout_st, b, h, i) : NULL;
    if constexpr (FIXED) at[k] = 2 * (b * (U)p.Hkv + h / (Hq / (U)p.Hkv));
    acc[k] = l1[k] = omax[k] = 0.f;
  }
  /* each step's loads of the R rows issued together (a row a group: 47.5 us for the 134 MB of o and dout,
   * 2.8 TB/s; four: 38 us; H200 ncu, bf16, D = 128, 256k rows) */
  for (int64_t e = (int64_t)sub * V; e < p.Dv; e += (int64_t)lpr * V) {
    if (VEC) {
      uint4 x[R], y[R];
#pragma unroll
      for (int k = 0; k < R; k++)
        if (o[k]) x[k] = *(const uint4 *)(o[k] + e), y[k] = *(const uint4 *)(d[k] + e);
#pragma unroll
      for (int k = 0; k < R; k++) {
        if (!o[k]) continue;
        const T *xs = (const T *)&x[k], *ys = (const T *)&y[k];
#pragma unroll
        for (int c = 0; c < V; c++) {
          const float ov = to_float(xs[c]), dv = to_float(ys[c]);
          acc[k] = fmaf(ov, dv, acc[k]);
          if (FIXED) l1[k] += fabsf(dv), omax[k] = fmaxf(omax[k], fabsf(ov));
        }
        bad |= words_nonfinite<T>(y[k]) || (FIXED && words_nonfinite<T>(x[k]));
      }
    } else {
      float x[R], y[R];
#pragma unroll
      for (int k = 0; k < R; k++)
        if (o[k]) x[k] = to_float(o[k][e]), y[k] = to_float(d[k][e]);
#pragma unroll
      for (int k = 0; k < R; k++) {
        if (!o[k]) continue;
        acc[k] = fmaf(x[k], y[k], acc[k]);
        if (FIXED) l1[k] += fabsf(y[k]), omax[k] = fmaxf(omax[k], fabsf(x[k]));
        bad |= !isfinite(y[k]) || (FIXED && !isfinite(x[k]));
      }
    }
  }
#pragma unroll
  for (int k = 0; k < R; k++) {
    for (int off = lpr / 2; off > 0; off >>= 1) { /* within the group: every lane ends with the sums */
      acc[k] += __shfl_xor_sync(0xffffffffu, acc[k], off);
      if (FIXED)
        l1[k] += __shfl_xor_sync(0xffffffffu, l1[k], off),
            omax[k] = fmaxf(omax[k], __shfl_xor_sync(0xffffffffu, omax[k], off));
    }
    if (row[k] < rows && sub == 0) delta[row[k]] = acc[k];
  }
  if constexpr (FIXED) {
    /* the group's R multipliers side by side: lane sub makes row k0 + sub's (its values picked by
     * selects, not indexed, so they stay in registers); one lane making four rows' one after the
     * other, the FIXED kernel took 76 us against the default's 38, side by side 64 (H200 ncu, bf16,
     * D = 128, L = 1k) */
    for (int k0 = 0; k0 < R; k0 += lpr) {
      const int mine = k0 + sub;
      U r = rows, a = 0;
      float s = 0.f, om = 0.f;
#pragma unroll
      for (int k = 0; k < R; k++)
        if (k == mine) r = row[k], a = at[k], s = l1[k], om = omax[k];
      if (r < rows) {
        const float m = bw_fixed_mult(p.scale_f, __uint_as_float(kvmax[a]), __uint_as_float(kvmax[a + 1]), s, om);
        mult[r] = m;
        bad |= m == 0.f;
      }
    }
  }
  if (flag && __syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
}

/* bw_delta_kernel's launch on `blocks` blocks: its FIXED instance with
 * fixed (f16 and bf16 alone: the wgmma kernels' dtypes), BW_DELTA_ROWS_FIXED
 * rows a group (bw_delta_group_rows).  Its 98 registers at four rows (two
 * blocks an SM) read o and dout in 65 us at D = 128, L = 1k; at two rows,
 * 54 registers and four blocks, 58 us (H200 ncu, bf16, 256k rows; the
 * default's four rows at 80 registers and three blocks: 39 us). */
#define BW_DELTA_ROWS_FIXED 2
template <typename T> static constexpr bool bw_delta_fixed(bool fixed) { return fixed && sizeof(T) == 2; }
template <typename T> static constexpr int bw_delta_group_rows(bool fixed) {
  return bw_delta_fixed<T>(fixed) ? BW_DELTA_ROWS_FIXED : BW_DELTA_ROWS;
}
template <typename T, bool VEC, typename U>
static void bw_delta_launch(unsigned blocks, cudaStream_t s, const fa_attn_problem *p, const fa_attn_grads *g,
                            float *delta, int lpr, int *flag, bool fixed, int64_t zero4) {
  if constexpr (sizeof(T) == 2)
    if (bw_delta_fixed<T>(fixed)) {
      bw_delta_kernel<T, VEC, U, true, BW_DELTA_ROWS_FIXED><<<blocks, BW_THREADS, 0, s>>>(
          *p, *g, delta, lpr, flag, bw_fixed_kvmax(delta, p), bw_fixed_mults(delta, p), zero4);
      return;
    }
  bw_delta_kernel<T, VEC, U><<<blocks, BW_THREADS, 0, s>>>(*p, *g, delta, lpr, flag, NULL, NULL, zero4);
}

/* max|K| and max|V| of each (batch, KV head) (FIXED, bw_fixed_dq) into
 * kvmax, zeroed before (the bits of floats of one sign order as unsigned
 * integers do), a block BW_MAX_ROWS rows of one head in 16-byte loads (the
 * wgmma kernels' rows); flag set where K or V holds NaN or inf. */
#define BW_MAX_ROWS 64
template <typename T> __global__ void __launch_bounds__(256) bw_kv_max_kernel(fa_attn_problem p, unsigned *kvmax, int *flag) {
  constexpr int V = 16 / sizeof(T);
  const int64_t per = (p.Lk + BW_MAX_ROWS - 1) / BW_MAX_ROWS, bhk = blockIdx.x / per, j0 = blockIdx.x % per * BW_MAX_ROWS;
  const int64_t b = bhk / p.Hkv, hk = bhk % p.Hkv;
  const int rows = (int)min((int64_t)BW_MAX_ROWS, p.Lk - j0), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float m[2] = {0.f, 0.f};
  bool bad = false;
#pragma unroll
  for (int t = 0; t < 2; t++) {
    const T *x = (const T *)(t ? p.v : p.k);
    const fa_attn_strides st = t ? p.v_st : p.k_st;
    const int cpr = (int)((t ? p.Dv : p.D) / V);
    for (int e = threadIdx.x; e < rows * cpr; e += 256) {
      const uint4 u = *(const uint4 *)(x + attn_at(st, b, hk, j0 + e / cpr) + e % cpr * V);
      const T *xs = (const T *)&u;
#pragma unroll
      for (int k = 0; k < V; k++) m[t] = fmaxf(m[t], fabsf(to_float(xs[k])));
      bad |= words_nonfinite<T>(u);
    }
  }
  __shared__ float part[2][8];
#pragma unroll
  for (int t = 0; t < 2; t++) {
    for (int off = 16; off > 0; off >>= 1) m[t] = fmaxf(m[t], __shfl_xor_sync(0xffffffffu, m[t], off));
    if (lane == 0) part[t][warp] = m[t];
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *flag = 1;
  if (threadIdx.x < 2) {
    float x = 0.f;
    for (int w = 0; w < 8; w++) x = fmaxf(x, part[threadIdx.x][w]);
    atomicMax(kvmax + 2 * bhk + threadIdx.x, __float_as_uint(x));
  }
}
template <typename T> static fa_status bw_kv_max(fa_context *ctx, const fa_attn_problem *p, unsigned *kvmax, int *flag) {
  static_assert(sizeof(T) == 2, "fixed: the wgmma kernels' f16 and bf16 alone");
  const int64_t blocks = p->B * p->Hkv * ((p->Lk + BW_MAX_ROWS - 1) / BW_MAX_ROWS);
  cudaStream_t s = fa_cuda_stream(ctx);
  fa_status st = attn_grid_fits(ctx, blocks);
  if (!st) st = fa_cuda_error(ctx, cudaMemsetAsync(kvmax, 0, (size_t)(2 * p->B * p->Hkv) * sizeof(unsigned), s),
                              "the backward's max|K|, max|V|");
  if (st || blocks == 0) return st;
  bw_kv_max_kernel<T><<<(unsigned)blocks, 256, 0, s>>>(*p, kvmax, flag);
  FA_CUDA_CHECK_LAUNCH(ctx, "bw_kv_max_kernel");
  return FA_OK;
}

/* Queues bw_delta_kernel for the call (flag, fixed: as the kernel's, FIXED). */
template <typename T> static fa_status bw_delta(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g,
                                                float *delta, int *flag, bool fixed) {
  const int64_t rows = p->B * p->Hq * p->Lq;
  const int64_t es = (int64_t)sizeof(T), V = 16 / es;
  const bool vec = p->Dv % V == 0 && attn_rows_on16(p->o, p->o_st, es) && attn_rows_on16(g->dout, g->dout_st, es);
  const int64_t chunks = vec ? p->Dv / V : p->Dv;
  int lpr = 1;
  while (lpr < 32 && lpr < chunks) lpr *= 2;
  const int64_t per = bw_delta_group_rows<T>(fixed) * (BW_THREADS / lpr), blocks = (rows + per - 1) / per;
  static_assert(BW_DELTA_ROWS_FIXED <= BW_DELTA_ROWS, "small's bound: the default's rows a group, the more");
  fa_status st = attn_grid_fits(ctx, blocks);
  if (st || blocks == 0) return st;
  const bool small = rows <= (int64_t)UINT32_MAX - BW_DELTA_ROWS * BW_THREADS; /* the last block's row indices too */
  const int64_t zero4 = g->dq_acc ? (int64_t)(fa_cuda_backward_wgmma_acc_bytes(p) / 16) : 0;
  cudaStream_t s = fa_cuda_stream(ctx);
  if (vec && small) bw_delta_launch<T, true, unsigned>((unsigned)blocks, s, p, g, delta, lpr, flag, fixed, zero4);
  else if (vec) bw_delta_launch<T, true, int64_t>((unsigned)blocks, s, p, g, delta, lpr, flag, fixed, zero4);
  else if (small) bw_delta_launch<T, false, unsigned>((unsigned)blocks, s, p, g, delta, lpr, flag, fixed, zero4);
  else bw_delta_launch<T, false, int64_t>((unsigned)blocks, s, p, g, delta, lpr, flag, fixed, zero4);
  FA_CUDA_CHECK_LAUNCH(ctx, "bw_delta_kernel");
  return FA_OK;
}


template <typename T, int DMAX>
static fa_status bw_launch(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta,
                           const int *only_if) {
  const bw_simt_plan pl = bw_simt_plan_of(p);
  unsigned kgrid = 0, qgrid = 0;
  if (fa_status st = bw_simt_grids(ctx, only_if, pl, &kgrid, &qgrid)) return st;
  cudaStream_t s = fa_cuda_stream(ctx);
  if (pl.kblocks > 0) {
    FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(bw_dkdv_kernel<T, DMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)pl.smem_kv));
    bw_dkdv_kernel<T, DMAX><<<kgrid, BW_THREADS, pl.smem_kv, s>>>(*p, *g, delta, only_if);
    FA_CUDA_CHECK_LAUNCH(ctx, "bw_dkdv_kernel");
  }
  if (pl.qblocks > 0) {
    FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(bw_dq_kernel<T, DMAX>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)pl.smem_q));
    bw_dq_kernel<T, DMAX><<<qgrid, BW_THREADS, pl.smem_q, s>>>(*p, *g, delta, only_if);
    FA_CUDA_CHECK_LAUNCH(ctx, "bw_dq_kernel");
  }
  return FA_OK;
}

/* The SIMT kernels for the call (only_if: as bw_dkdv_kernel's). */
template <typename T>
static fa_status bw_simt(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta,
                         const int *only_if) {
  const int dmax = bw_simt_plan_of(p).dmax;
  if (dmax == 64) return bw_launch<T, 64>(ctx, p, g, delta, only_if);
  if (dmax == 128) return bw_launch<T, 128>(ctx, p, g, delta, only_if);
  return bw_launch<T, 256>(ctx, p, g, delta, only_if);
}

/* Queues on s the passes over q and k that set *flag when one holds NaN
 * or inf (attention_nonfinite.cuh's scan of v, pointed at each; dout is
 * checked by the delta kernel, which reads all of it anyway). */
static cudaError_t bw_queue_scans(const fa_attn_problem *p, int *flag, cudaStream_t s) {
  const struct {
    const void *x;
    fa_attn_strides st;
    int64_t heads, len, width;
  } ops[2] = {{p->q, p->q_st, p->Hq, p->Lq, p->D}, {p->k, p->k_st, p->Hkv, p->Lk, p->D}};
  for (int i = 0; i < 2; i++) {
    fa_attn_problem t = *p;
    t.v = ops[i].x, t.v_st = ops[i].st, t.Hkv = ops[i].heads, t.Lk = ops[i].len, t.Dv = ops[i].width;
    const cudaError_t err = queue_nonfinite_scan(&t, flag, s);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

/* The tensor-core kernel k guarded against NaN or inf in q, k or dout (API
 * §2: they reach only the pairs that connect them; a tile product's 0 · NaN
 * would carry them into masked pairs' gradients), as the forward guards V
 * (attention_nonfinite.cuh): the delta kernel checks dout on its way, and
 * passes over q and k queued on a side stream beside the kernels set a
 * flag too; the SIMT kernels, which skip zero weights, run behind with the
 * flag and rewrite every gradient only when it is set.  (The tensor-core
 * kernels do not read the flag: the check at their start made ptxas spill
 * 24-76 bytes in their score-rule instances, and a call with NaN or inf
 * only costs their time once more.)
 *
 * outputs (the wgmma kernel's fused instances,
 * fa_cuda_backward_wgmma_checks_outputs): no passes over q and k; the
 * kernels set the flag (g->nonfinite) where a gradient they write holds
 * NaN or inf.  That sees every NaN or inf the tensor cores took in: each
 * product's result flows into a gradient's f32 sums (S into P into dV, dP
 * into dS into dK and dQ), where NaN stays NaN and inf stays inf or turns
 * NaN, and the conversion keeps both; where S's inf left P zero (exp of
 * -inf), the inf of q or k still meets dS again in dK = dSᵀ·Q and dQ = dS·K
 * (0 · inf = NaN).  With fixed, dQ's sums are integers, where NaN and inf
 * leave no trace; q's still show in dK or dV (S NaN or +inf: P, then dV;
 * -inf: dK's 0 · inf), and k and v are checked by bw_kv_max_kernel, which
 * reads them for their maxima anyway.  Only conservative: finite inputs
 * whose gradients overflow (f16) also take the SIMT kernels, which
 * overflow alike.  The passes had cost 35 us of 916 at L = 1k, D = 128
 * (bf16, H200, torch's profiler), run before the main kernel rather than
 * beside it: their 2048 blocks held the SMs. */
template <typename T>
static fa_status bw_guarded(fa_context *ctx, fa_attn_kernel k, const fa_attn_problem *p, const fa_attn_grads *g,
                            float *delta, const fa_bw_kernels *ks, bool fixed, bool outputs) {
  int *flag = NULL;
  cudaStream_t side = 0;
  fa_status st = values_nonfinite_flag(ctx, p, &flag, false);
  if (st) return st;
  if constexpr (sizeof(T) == 2) /* fixed: f16 and bf16 alone */
    if (fixed) st = bw_kv_max<T>(ctx, p, bw_fixed_kvmax(delta, p), flag);
  if (st || (st = bw_delta<T>(ctx, p, g, delta, flag, fixed)) || (!outputs && (st = fa_cuda_fork(ctx, &side)))) {
    fa_cuda_free_on(ctx, flag, FA_FLAG_BYTES);
    return st;
  }
  if (outputs) {
    fa_attn_grads gc = *g;
    gc.nonfinite = flag;
    st = ks->fast(ctx, k, p, &gc, delta, ks->user);
  } else {
    /* the scans first: the fast kernels may queue work of their own behind them on the side stream
     * (bw_launch_beside's dQ kernel) */
    const cudaError_t err = bw_queue_scans(p, flag, side);
    st = err != cudaSuccess ? fa_cuda_error(ctx, err, "the NaN/inf check of q and k")
                            : ks->fast(ctx, k, p, g, delta, ks->user);
    const fa_status joined = fa_cuda_join(ctx); /* waits here when it cannot be queued */
    if (!st) st = joined;
  }
  if (!st) st = ks->simt(ctx, p, g, delta, flag, ks->user);
  fa_cuda_free_on(ctx, flag, FA_FLAG_BYTES); /* stream-ordered: after the work queued */
  return st;
}

template <typename T>
static fa_status bw_typed(fa_context *ctx, fa_attn_kernel k, const fa_attn_problem *p, const fa_attn_grads *g,
                          float *delta, const fa_bw_kernels *ks, bool fixed, bool outputs) {
  if (k != FA_KERNEL_SIMT) return bw_guarded<T>(ctx, k, p, g, delta, ks, fixed, outputs);
  fa_status st = bw_delta<T>(ctx, p, g, delta, NULL, false);
  return st ? st : ks->simt(ctx, p, g, delta, NULL, ks->user);
}

/* The kernel named (FA_KERNEL_WGMMA, MMA or SIMT), or the fastest that
 * takes the call (FA_KERNEL_AUTO), among wgmma down to `last` (MMA: all;
 * WGMMA: the variants', which have no mma instance) and simt: FA_OK and
 * *k, or why the named one does not take it. */
extern "C" fa_status fa_cuda_backward_choose(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g,
                                             fa_attn_kernel last, fa_attn_kernel *k) {
  static const fa_attn_kernel order[2] = {FA_KERNEL_WGMMA, FA_KERNEL_MMA};
  static const char *const names[2] = {"wgmma", "mma"};
  const int n = last == FA_KERNEL_WGMMA ? 1 : 2;
  if (n == 1 && *k == FA_KERNEL_MMA)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: opts.kernel: the backward with opts.score_mod or "
                                            "opts.mask_mod runs on the wgmma or the simt kernel on cuda");
  for (int i = 0; i < n; i++) {
    if (*k != FA_KERNEL_AUTO && *k != order[i]) continue;
    const char *why = fa_cuda_attention_backward_refuses(order[i], p, g);
    if (!why) return *k = order[i], FA_OK;
    if (*k == order[i])
      return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: opts.kernel: the backward's %s kernel does not take this call: %s",
                     names[i], why);
  }
  *k = FA_KERNEL_SIMT;
  return FA_OK;
}

static fa_status builtin_fast(fa_context *ctx, fa_attn_kernel k, const fa_attn_problem *p, const fa_attn_grads *g,
                              const float *delta, void *);

/* The call on kernel k (FA_KERNEL_SIMT, or a tensor-core kernel that takes
 * it) through the launches ks: delta, the kernels, and the guard. */
extern "C" fa_status fa_cuda_backward_run(fa_context *ctx, fa_attn_kernel k, const fa_attn_problem *p,
                                          const fa_attn_grads *g, const fa_bw_kernels *ks) {
  /* fixed-point dQ: delta, each row's multiplier, each KV head's max|K| and max|V| (bw_fixed_dq) */
  const bool fixed = k == FA_KERNEL_WGMMA && ks->fast == builtin_fast && bw_fixed_dq(p, g);
  /* the gradients checked for NaN and inf where they are written, in place of passes over q and k (bw_guarded) */
  const bool outputs = k == FA_KERNEL_WGMMA && ks->fast == builtin_fast && fa_cuda_backward_wgmma_checks_outputs(ctx, p, g);
  const int64_t rows = p->B * p->Hq * p->Lq;
  const size_t bytes = (size_t)(fixed ? 2 * rows + 2 * p->B * p->Hkv : rows) * sizeof(float);
  float *delta = NULL;
  fa_status st = fa_cuda_malloc(ctx, (void **)&delta, bytes);
  if (st) return st;
  /* the fused instances' dQ sums (the default's and FIXED's), zeroed by the delta kernel as it reads o and dout:
   * a memset of their own took 30 us of a 1k call at D = 128 (134 MB at the write rate), the delta kernel 44 */
  fa_attn_grads ga = *g;
  const size_t acc_bytes = outputs ? fa_cuda_backward_wgmma_acc_bytes(p) : 0;
  if (acc_bytes && (st = fa_cuda_malloc(ctx, (void **)&ga.dq_acc, acc_bytes))) {
    fa_cuda_free_on(ctx, delta, bytes);
    return st;
  }
  switch (p->compute) {
  case FA_F16: st = bw_typed<__half>(ctx, k, p, &ga, delta, ks, fixed, outputs); break;
  case FA_BF16: st = bw_typed<__nv_bfloat16>(ctx, k, p, &ga, delta, ks, fixed, outputs); break;
  default: st = bw_typed<float>(ctx, k, p, &ga, delta, ks, false, false); break;
  }
  fa_cuda_free_on(ctx, delta, bytes); /* stream-ordered: after the kernels */
  if (ga.dq_acc) fa_cuda_free_on(ctx, ga.dq_acc, acc_bytes);
  return st;
}

static fa_status builtin_fast(fa_context *ctx, fa_attn_kernel k, const fa_attn_problem *p, const fa_attn_grads *g,
                              const float *delta, void *) {
  return fa_cuda_attention_backward_mma(ctx, k, p, g, delta);
}
static fa_status builtin_simt(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta,
                              const int *only_if, void *) {
  switch (p->compute) {
  case FA_F16: return bw_simt<__half>(ctx, p, g, delta, only_if);
  case FA_BF16: return bw_simt<__nv_bfloat16>(ctx, p, g, delta, only_if);
  default: return bw_simt<float>(ctx, p, g, delta, only_if);
  }
}

extern "C" fa_status fa_cuda_attention_backward(fa_context *ctx, fa_attn_kernel kernel, const fa_attn_problem *p,
                                                const fa_attn_grads *g) {
  fa_status st = fa_cuda_backward_choose(ctx, p, g, FA_KERNEL_MMA, &kernel);
  if (st) return st;
  const fa_bw_kernels ks = {builtin_fast, builtin_simt, NULL};
  return fa_cuda_backward_run(ctx, kernel, p, g, &ks);
}
