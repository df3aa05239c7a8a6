/* NaN or inf in V, end to end: the one place of the protocol.
 *
 * API §2: NaN and inf in the inputs reach only the rows they touch.  The
 * fast kernels (tensor cores: attention_wgmma.cu, attention_mma.cu; exact
 * f32: attention_f32.cu) multiply P by whole tiles of V, where a masked
 * key's weight is 0 and 0 · NaN = NaN would reach rows that never attend
 * the key; the SIMT kernel (attention.cu) and naive's skipping product
 * (attention_naive.cu) skip masked keys and are exact, but slow.  So:
 *  1. values_nonfinite_flag makes a device flag, 0 on the stream (with a
 *     second int beside it, zeroed by the same memset: the tile counter of
 *     a persistent kernel the flag guards, fa_flag_counter);
 *  2. launch_guarded_by_v_flag queues the fast kernel with p.v_nonfinite =
 *     the flag, which is set (p.v_self_check says by what) when V holds NaN
 *     or inf: by a scan of V from a side stream queued beside the kernel
 *     (V_CHECK_SCAN, queue_nonfinite_scan), by the kernel's blocks, each a
 *     share of V after its output (V_CHECK_SHARE, v_check_share), or, for
 *     the kernels that hold every SM (the warp-specialised ones: a scan
 *     beside them waits for them), when a row's output comes out NaN or
 *     inf while its softmax sum is finite (V_CHECK_OUTPUT,
 *     note_nonfinite_rows): the only way a non-finite V changes a result,
 *     0 or p times NaN or inf in some key tile the row visited, whatever
 *     the tensor cores make of 0 · inf;
 *  3. a fast block reads the flag at its start and, once it is set, leaves
 *     without writing (leave_for_fallback: the block decides as one);
 *  4. the SIMT kernel runs behind it with the same flag (tiled_typed in
 *     attention.cu; on Hopper code a programmatic dependent launch whose
 *     blocks wait for the fast kernel's memory, tiled_launch): it returns
 *     at once while the flag is 0, else rewrites every output (two_pass:
 *     its output pass, on the statistics the fast statistics pass wrote
 *     from the scores alone).
 * The flag may be set while the fast kernel runs: blocks that started
 * before write outputs the fallback then overwrites, so the result never
 * depends on the timing.  With V_CHECK_OUTPUT a NaN or inf of V that no
 * visited tile holds sets nothing: no row's result depends on it.  naive
 * does the same with its own skipping P·V kernel behind cuBLAS.  The
 * problem's fields: v_nonfinite, v_self_check (attention_common.cuh). */
#ifndef FA_KERNELS_ATTENTION_NONFINITE_CUH
#define FA_KERNELS_ATTENTION_NONFINITE_CUH

#include "async_copy.cuh"
#include "attention_common.cuh"

/* Who sets attn_params.v_nonfinite (its v_self_check): see above. */
enum { V_CHECK_SCAN = 0, V_CHECK_SHARE, V_CHECK_OUTPUT };

/* The exponent bits of a 32-bit word's element(s) of dtype T: all set is
 * NaN or inf (one f32, or two f16 / bf16). */
template <typename T> struct nonfinite_bits;
template <> struct nonfinite_bits<float> { static const uint32_t mask = 0x7F800000u; };
template <> struct nonfinite_bits<__half> { static const uint32_t mask = 0x7C007C00u; };
template <> struct nonfinite_bits<__nv_bfloat16> { static const uint32_t mask = 0x7F807F80u; };

/* NaN or inf in 16 bytes of T elements, as bits to OR together over many
 * loads and test once (words_nonfinite): an element's exponent field plus
 * its lowest bit carries into the bit above the field (the element's sign
 * bit) only when the field is all ones; a smaller field stays below it,
 * so no carry crosses into the next element.  Two integer operations a
 * word where a compare a 16-bit half took several (__vcmpeq2). */
template <typename T> static __device__ __forceinline__ uint32_t nonfinite_low_bits() {
  return nonfinite_bits<T>::mask & ~(nonfinite_bits<T>::mask << 1); /* each element's lowest exponent bit */
}
template <typename T> static __device__ __forceinline__ uint32_t words_nonfinite_bits(const uint4 &w) {
  const uint32_t m = nonfinite_bits<T>::mask, low = nonfinite_low_bits<T>();
  return ((w.x & m) + low) | ((w.y & m) + low) | ((w.z & m) + low) | ((w.w & m) + low);
}
/* The bits of words_nonfinite_bits that say NaN or inf: the sign bits. */
template <typename T> static __device__ __forceinline__ bool nonfinite_in_bits(uint32_t bits) {
  return (bits & (nonfinite_bits<T>::mask + nonfinite_low_bits<T>())) != 0;
}
/* Whether 16 bytes of T elements hold NaN or inf. */
template <typename T> static __device__ __forceinline__ bool words_nonfinite(const uint4 &w) {
  return nonfinite_in_bits<T>(words_nonfinite_bits<T>(w));
}

/* NaN or inf among the f16 / bf16 pairs of words folded into acc, one
 * instruction a word: acc = w · 0 + acc per half, which stays ±0 while
 * every w was finite and is NaN (sticky) once one held NaN or inf (0 · inf
 * is NaN); pairs_nonfinite(acc) tells.  For outputs checked where they are
 * written (the backward's fused instances: bw_guarded), where
 * words_nonfinite_bits takes three a word. */
template <typename T> static __device__ __forceinline__ void fold_nonfinite_pairs(uint32_t &acc, uint32_t w) {
  static_assert(sizeof(T) == 2, "pairs of f16 or bf16");
  if constexpr (std::is_same<T, __half>::value) asm("fma.rn.f16x2 %0, %1, %2, %0;" : "+r"(acc) : "r"(w), "r"(0u));
  else asm("fma.rn.bf16x2 %0, %1, %2, %0;" : "+r"(acc) : "r"(w), "r"(0u));
}
/* The four words of 16 bytes stored, folded as fold_nonfinite_pairs does. */
template <typename T> static __device__ __forceinline__ void fold_nonfinite_words(uint32_t &acc, const uint4 &w) {
  fold_nonfinite_pairs<T>(acc, w.x), fold_nonfinite_pairs<T>(acc, w.y), fold_nonfinite_pairs<T>(acc, w.z);
  fold_nonfinite_pairs<T>(acc, w.w);
}
static __device__ __forceinline__ bool pairs_nonfinite(uint32_t acc) { return (acc & 0x7FFF7FFFu) != 0; }

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

#ifndef __CUDACC_RTC__ /* host side: not in the run-time compiled variants */
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

/* The bytes of a flag of values_nonfinite_flag: the flag, then a spare
 * int, both 0 on the stream, for a persistent kernel's tile counter
 * (fa_flag_counter): one memset a call where there were two, each a few
 * µs of a short call's fixed cost. */
#define FA_FLAG_BYTES (2 * sizeof(int))
/* The tile counter that comes with flag (0 until a kernel counts on it;
 * one kernel a flag), or NULL without a flag. */
static inline int *fa_flag_counter(int *flag) { return flag ? flag + 1 : NULL; }

/* A device int (from the pool: the caller frees it with fa_cuda_free_on,
 * FA_FLAG_BYTES) set to 0 on the stream, its spare int too; with scan,
 * then set to 1 when the values v hold NaN or inf: one pass over v, no
 * wait. */
static inline fa_status values_nonfinite_flag(fa_context *ctx, const fa_attn_problem *p, int **flag, bool scan = true) {
  *flag = NULL;
  void *f = NULL;
  fa_status st = fa_cuda_malloc(ctx, &f, FA_FLAG_BYTES);
  if (st) return st;
  cudaStream_t s = fa_cuda_stream(ctx);
  cudaError_t err = cudaMemsetAsync(f, 0, FA_FLAG_BYTES, s);
  if (err == cudaSuccess && scan) err = queue_nonfinite_scan(p, (int *)f, s);
  if ((st = fa_cuda_error(ctx, err, "the NaN/inf check of v"))) {
    fa_cuda_free_on(ctx, f, FA_FLAG_BYTES);
    return st;
  }
  *flag = (int *)f;
  return FA_OK;
}

/* Queues the scan of V that sets flag on the side stream (fa_cuda_fork's),
 * beside the kernels queued since the fork, and makes the context's stream
 * wait for it (fa_cuda_join, also after a failed launch, st): the status
 * of the whole. */
static inline fa_status join_nonfinite_scan(fa_context *ctx, const fa_attn_problem *p, int *flag, cudaStream_t side,
                                            fa_status st) {
  const cudaError_t err = st ? cudaSuccess : queue_nonfinite_scan(p, flag, side);
  const fa_status joined = fa_cuda_join(ctx); /* waits here when it cannot be queued */
  if (st) return st;
  return err != cudaSuccess ? fa_cuda_error(ctx, err, "the NaN/inf check of v") : joined;
}

/* Queues run(ctx, g, pass) for a fast kernel guarded against NaN or inf in
 * V: g is *p with v_nonfinite set to a fresh device flag, which comes back
 * in *v_flag for the caller to free and to guard its fallback (a kernel
 * that skips masked keys, run after this one) with.  The flag is set while
 * the kernel runs, and a block that starts after it is set does nothing;
 * the fallback then rewrites every output.  check (g.v_self_check): who
 * sets it.  V_CHECK_SCAN: a pass over V from a side stream, queued after
 * the kernel so that it takes the SMs the kernel's last blocks leave idle
 * (in front of the kernel it cost about 5 % of a 16-bit call at L = 1024),
 * and the context's stream waits for it before anything that follows;
 * else the kernel itself. */
static inline fa_status launch_guarded_by_v_flag(fa_context *ctx, const attn_params *p, int pass, int **v_flag,
                                                 fa_status (*run)(fa_context *, const attn_params *, int),
                                                 int check) {
  int *flag = NULL;
  fa_status st = values_nonfinite_flag(ctx, p, &flag, false);
  if (st) return st;
  attn_params g = *p;
  g.v_nonfinite = flag;
  g.v_self_check = check;
  cudaStream_t side = 0;
  if (check == V_CHECK_SCAN && (st = fa_cuda_fork(ctx, &side))) {
    fa_cuda_free_on(ctx, flag, FA_FLAG_BYTES);
    return st;
  }
  st = run(ctx, &g, pass);
  if (check == V_CHECK_SCAN) st = join_nonfinite_scan(ctx, p, flag, side, st);
  if (st) fa_cuda_free_on(ctx, flag, FA_FLAG_BYTES); /* stream-ordered: after the work queued */
  else *v_flag = flag;
  return st;
}

/* Queues algo ("flash" or "two_pass") on a fast kernel through run: one
 * guarded launch for flash; for two_pass the statistics pass (it reads no
 * V, so needs no guard) and the guarded output pass, both with *p's
 * row_stats. */
static inline fa_status launch_fast_passes(fa_context *ctx, const attn_params *p, fa_attention_algo algo,
                                           int **v_flag,
                                           fa_status (*run)(fa_context *, const attn_params *, int),
                                           int check = V_CHECK_SCAN) {
  if (algo != FA_ATTN_TWO_PASS) return launch_guarded_by_v_flag(ctx, p, PASS_FLASH, v_flag, run, check);
  fa_status st = run(ctx, p, PASS_STATS);
  return st ? st : launch_guarded_by_v_flag(ctx, p, PASS_OUTPUT, v_flag, run, check);
}

#endif

/* Whether a fast kernel's block leaves its call to the fallback: v_bad, the
 * flag that V holds NaN or inf, is read at the block's start and tested
 * once the first copies are on their way, so that the read's latency is
 * not in front of them; a block that leaves waits for its copies first.
 * The flag may be set while the kernel runs (launch_guarded_by_v_flag), so
 * two threads of one block can read different values: the block decides
 * as one (__syncthreads_or), or some threads would leave and the rest wait
 * at a barrier they never reach.  Called by the whole block. */
static __device__ __forceinline__ bool leave_for_fallback(int v_bad) {
  if (!__syncthreads_or(v_bad)) return false;
  cp_async_wait<0>();
  return true;
}

/* With p.v_self_check (launch_guarded_by_v_flag), the block of query tile
 * qi of nq checks the qi-th nq-th of its head's V (its rows of Dv = D
 * elements, p.v_st.s apart; all Lk keys, as the pass
 * over V does: a NaN no row attends costs the fallback's time, not a wrong
 * result) from global memory, mostly L2, after its output is out: off the
 * kernel's key loop, where the check from shared memory made the kernels
 * 2-6 % slower.  With two blocks an SM the other hides the reads, and this
 * cost less than the pass over V queued in front of the kernel (about 5 % of
 * a 16-bit call at D = 64, L = 1024); with one block an SM (D = 128) it cost
 * more (docs/perf/2026-11-25-attention-h100-f32-probes.json, calls 1, 13,
 * 14).  Against the pass from the side stream (call 19, D = 128) it has not
 * been measured.  Rows of Dv elements: 16-byte multiples on the fast paths. */
template <typename T, int D, int BR>
static __device__ __forceinline__ void v_check_share(const attn_params &p, const T *v, int64_t i0) {
  if (p.v_self_check != V_CHECK_SHARE) return;
  const int CPR = D * (int)sizeof(T) / 16; /* 16-byte chunks a row */
  const int64_t nq = (p.Lq + BR - 1) / BR, qi = i0 / BR, n = p.Lk * CPR, vs = p.v_st.s;
  const int64_t lo = n * qi / nq, hi = n * (qi + 1) / nq;
  bool bad = false;
#pragma unroll 4
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
    bad |= words_nonfinite<T>(*(const uint4 *)(v + (i / CPR) * vs + (i % CPR) * (16 / sizeof(T))));
  if (bad) *p.v_nonfinite = 1;
}

/* With V_CHECK_OUTPUT: sets the flag when a row of this warp holds NaN or
 * inf in its output while its softmax sum is finite (a NaN or inf sum
 * comes of Q or K, and the row is NaN whatever V holds).  o: this thread's
 * accumulators of rows A and B (columns 8d + c2, + 1 in [d][0..1] and
 * [d][2..3]), lA, lB: its parts of the rows' sums, both before the final
 * scaling.  A value's test is one FMA: x · 0 is NaN exactly when x is NaN
 * or inf (±0 otherwise; IEEE, no build here uses fast math), and a NaN
 * carries through the sum; two sums a row, so that the FMAs do not all wait
 * for each other.  (An exponent test, two integer operations and an OR a
 * value, was 200 of the 600 instructions of the persistent kernel's
 * epilogue at D = 128.)  Once a query tile (the scan of V it replaces took
 * 19 us of a 300 us call at L = 4096, H200).  Called by the whole warp. */
template <int DC>
static __device__ __forceinline__ void note_nonfinite_rows(const attn_params &p, const float (*o)[4], float lA,
                                                           float lB) {
  if (p.v_self_check != V_CHECK_OUTPUT) return;
  float a0 = 0.f, a1 = 0.f, b0 = 0.f, b1 = 0.f;
#pragma unroll
  for (int d = 0; d < DC; d++) {
    a0 = fmaf(o[d][0], 0.f, a0), a1 = fmaf(o[d][1], 0.f, a1);
    b0 = fmaf(o[d][2], 0.f, b0), b1 = fmaf(o[d][3], 0.f, b1);
  }
  const uint32_t m = 0x7F800000u, low = 0x00800000u; /* an all-ones exponent carries into the sign bit */
  uint32_t la = (__float_as_uint(lA) & m) + low, lb = (__float_as_uint(lB) & m) + low;
  la |= __shfl_xor_sync(0xffffffffu, la, 1), lb |= __shfl_xor_sync(0xffffffffu, lb, 1);
  la |= __shfl_xor_sync(0xffffffffu, la, 2), lb |= __shfl_xor_sync(0xffffffffu, lb, 2);
  const bool bad = (isnan(a0 + a1) && !(la >> 31)) || (isnan(b0 + b1) && !(lb >> 31));
  if (__any_sync(0xffffffffu, bad) && (threadIdx.x & 31) == 0) *p.v_nonfinite = 1;
}

#endif
