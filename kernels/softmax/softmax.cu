/* Softmax over the last dimension on the GPU.
 *
 * naive / safe / online: the seeds' passes, one kernel per pass, for the
 * experiments (online takes the block size B of the seeds' Triton kernel).
 * fused: a row staged in shared memory, read once.
 * auto: a warp per row with the row in registers for short rows, a block per
 * row for medium rows when there are enough of them; otherwise each row is
 * split over the blocks of a thread-block cluster, each holding its segment
 * on chip, whose (m, d) partials are merged with the seeds' rescale formula
 * through distributed shared memory, so the row is read once and the GPU
 * stays full even with few rows.  Rows longer than a cluster holds are
 * split over the whole grid (read twice when even that cannot hold them).
 * Each thread folds what it holds in two steps, its maximum and then one
 * exponential an element, and f32 keeps those for the store (one multiply
 * an element there).  Anything the vector paths cannot take (misaligned
 * rows, f64) goes to the online kernels.  x's rows lie where the caller's
 * tensor has them (API §6: any strides, each row contiguous; xr says
 * where, fa_state_row); y is contiguous. */
#include "async_copy.cuh"
#include "common.cuh"
#include "online_state.cuh"

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <type_traits>


/* element types: Elem<T> (common.cuh) */

/* Row r of x at xr (a contiguous x: one multiply; a view: its three strides). */
template <typename T>
static __device__ __forceinline__ const T *row_at(const T *x, const fa_state_rows &xr, int64_t r) {
  return x + fa_state_row(&xr, r);
}

/* 16 bytes of T: the unit of every vector load and store. */
template <typename T> struct __align__(16) Vec16 {
  static const int N = 16 / sizeof(T);
  T v[16 / sizeof(T)];
};

/* A block of values v (of type V) folded into s with one rescale (NaN
 * stays in d).  The exponentials are taken in V; a wider state A (double
 * for f32 values) keeps a long sequential sum exact to f32's precision. */
template <typename A, typename V = A>
static __device__ __forceinline__ MD<A> md_add_block(MD<A> s, const V *v, int k) {
  V bm = -(V)INFINITY;
  for (int i = 0; i < k; i++) bm = fmax(bm, v[i]);
  const V m = fmax((V)s.m, bm); /* s.m is a V value */
  if (m == -(V)INFINITY) {
    for (int i = 0; i < k; i++) s.d += v[i] != v[i] ? (A)v[i] : (A)0; /* NaN among -inf */
    return s;
  }
  A d = s.d * (A)fa_exp((V)s.m - m);
  for (int i = 0; i < k; i++) d += (A)fa_exp(v[i] - m);
  s.m = (A)m;
  s.d = d;
  return s;
}

/* Block-wide merge; every thread gets the result.  `scratch` holds 32. */
template <typename A> static __device__ MD<A> block_reduce_md(MD<A> s, MD<A> *scratch) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  s = warp_reduce_md(s);
  __syncthreads(); /* scratch may still be read from a previous call */
  if (lane == 0) scratch[warp] = s;
  __syncthreads();
  MD<A> e = {-(A)INFINITY, (A)0};
  s = lane < nw ? scratch[lane] : e;
  return warp_reduce_md(s);
}

/* A row whose maximum is -inf gives zeros (NaN if a NaN hid among -infs). */
template <typename A> static __device__ __forceinline__ A normalise(A x, MD<A> s) {
  return s.m == -(A)INFINITY ? (s.d == s.d ? (A)0 : s.d) : fa_exp(x - s.m) / s.d;
}

/* ---- 16-byte vectors of a row, held on chip by the auto kernels ----
 * A thread folds what it holds in two steps: its maximum tm, then one
 * exponential an element, e = 2^(x·a - o) (one FFMA; see offset_of).  f32
 * keeps e in place of x, so that the store is y = e·c, one multiply; 16-bit
 * types keep x (e in 16 bits would lose digits) and take e again from the
 * row's maximum. */
template <typename T> constexpr bool keeps_e = sizeof(T) == 4;

/* The E vectors t, t + stride, … of a segment that lie below len. */
template <typename T, int E>
static __device__ __forceinline__ void vec_load(Vec16<T> *buf, const Vec16<T> *src, int64_t t, int64_t stride, int64_t len) {
#pragma unroll
  for (int e = 0; e < E; e++)
    if (t + stride * e < len) buf[e] = src[t + stride * e];
}
/* The same vectors copied into shared memory by cp.async, at dst[TH·e + t] (not waited for). */
template <typename T, int E>
static __device__ __forceinline__ void vec_prefetch(Vec16<T> *dst, const Vec16<T> *src, int64_t t, int64_t stride, int64_t len) {
#pragma unroll
  for (int e = 0; e < E; e++)
    if (t + stride * e < len) cp_async16(&dst[t + stride * e], &src[t + stride * e], 16);
}
/* Their maximum, -inf if none; NaN is passed over (a NaN reaches the row
 * through d).  16-bit values two at a time in their own type: exact, and
 * half the instructions with no conversions. */
template <typename T, int E>
static __device__ __forceinline__ float vec_max(const Vec16<T> *buf, int64_t t, int64_t stride, int64_t len) {
  if constexpr (sizeof(T) == 2) {
    typedef typename Elem<T>::pair P;
    P m;
    m.x = m.y = Elem<T>::store(-INFINITY);
#pragma unroll
    for (int e = 0; e < E; e++)
      if (t + stride * e < len)
#pragma unroll
        for (int i = 0; i < Vec16<T>::N / 2; i++) m = __hmax2(m, ((const P *)buf[e].v)[i]);
    return fmaxf(Elem<T>::load(m.x), Elem<T>::load(m.y));
  } else {
    float m = -INFINITY;
#pragma unroll
    for (int e = 0; e < E; e++)
      if (t + stride * e < len)
#pragma unroll
        for (int i = 0; i < Vec16<T>::N; i++) m = fmaxf(m, Elem<T>::load(buf[e].v[i]));
    return m;
  }
}

/* The exponent of e = 2^(x·a - o) = e^(x - m) / k, hoisted out of the
 * elements: a = log2 e, o = m·a rounded, and k = 2^(o - m·a) takes o's
 * rounding back out once (without it, f32 rows near x = 1e3 came out 4e-5
 * off and near 1e6 1e-2, in a host emulation).  Past |m| = 2^30, where only
 * elements equal to m count, a = 1 and o = m (the rounding of m·a could
 * overflow e); for m = -inf, o = 0, so that -inf gives e = 0 rather than
 * NaN (and +inf gives NaN, as e^(inf - inf) does). */
struct Offset {
  float a, o, k;
};
static __device__ __forceinline__ Offset offset_of(float m) {
  if (m == -INFINITY) return Offset{FA_LOG2E, 0.f, 1.f};
  if (fabsf(m) >= 0x1p30f) return Offset{1.f, m, 1.f};
  const float o = m * FA_LOG2E;
  return Offset{FA_LOG2E, o, exp2_approx(fmaf(-m, FA_LOG2E, o))};
}
/* Σ e over the vectors; KEEP (f32): e overwrites x, for the store. */
template <typename T, int E, bool KEEP>
static __device__ __forceinline__ float vec_exp_sum(Vec16<T> *buf, Offset of, int64_t t, int64_t stride, int64_t len) {
  float d = 0.f;
#pragma unroll
  for (int e = 0; e < E; e++) {
    if (t + stride * e < len) {
#pragma unroll
      for (int i = 0; i < Vec16<T>::N; i++) {
        const float v = exp2_approx(fmaf(Elem<T>::load(buf[e].v[i]), of.a, -of.o));
        d += v;
        if constexpr (KEEP) buf[e].v[i] = Elem<T>::store(v);
      }
    }
  }
  return d;
}
/* A thread's (m, d) over its E vectors in registers, whose maximum tm is
 * taken beforehand, and its S stash vectors (the cluster kernel's: vector
 * E + s at stash[stride·s + t], which only this thread reads or writes):
 * their maximum, then one exponential an element.  A thread with no finite
 * maximum gives (-inf, 0), or NaN d if it held a NaN. */
template <typename T, int E, bool KEEP>
static __device__ __forceinline__ MD<float> vec_fold(float tm, Vec16<T> *buf, Vec16<T> *stash, int S, int64_t t,
                                                     int64_t stride, int64_t len) {
  for (int s = 0; s < S; s++) tm = fmaxf(tm, vec_max<T, 1>(&stash[stride * s + t], t, stride, len - stride * (E + s)));
  const Offset of = offset_of(tm);
  float d = vec_exp_sum<T, E, KEEP>(buf, of, t, stride, len);
  for (int s = 0; s < S; s++) d += vec_exp_sum<T, 1, KEEP>(&stash[stride * s + t], of, t, stride, len - stride * (E + s));
  return MD<float>{tm, d * of.k};
}

/* The store's y = e·c, e from x by the row's offset (a, o), or (KEEP) the
 * e that the thread kept from its fold over its maximum tm.  A row whose
 * maximum is -inf has e = 0, or NaN from a NaN: c = 0 gives zeros, c = NaN
 * (a NaN hid among -infs) NaN throughout. */
struct Scale {
  float a, o, c;
};
template <bool KEEP> static __device__ __forceinline__ Scale store_scale(MD<float> row, float tm) {
  const Offset of = offset_of(row.m);
  if (row.m == -INFINITY) return Scale{of.a, of.o, row.d == row.d ? 0.f : row.d};
  const float inv = 1.f / row.d;
  return Scale{of.a, of.o, (KEEP ? offset_of(tm).k * fa_exp(tm - row.m) : of.k) * inv};
}
/* Writes the vectors as y = e·c; STREAM: past L2 (the output need not stay there). */
template <typename T, int E, bool STREAM, bool KEEP>
static __device__ __forceinline__ void vec_store(Vec16<T> *dst, const Vec16<T> *buf, Scale sc, int64_t t, int64_t stride,
                                                 int64_t len) {
#pragma unroll
  for (int e = 0; e < E; e++) {
    if (t + stride * e < len) {
      Vec16<T> o;
#pragma unroll
      for (int i = 0; i < Vec16<T>::N; i++) {
        const float v = Elem<T>::load(buf[e].v[i]);
        o.v[i] = Elem<T>::store((KEEP ? v : exp2_approx(fmaf(v, sc.a, -sc.o))) * sc.c);
      }
      if (STREAM) __stcs((uint4 *)&dst[t + stride * e], *(const uint4 *)&o);
      else dst[t + stride * e] = o;
    }
  }
}

/* ---- the seeds' passes: one kernel each ---- */

enum { PASS_NAIVE_SUM = 0, PASS_MAX, PASS_SUM, PASS_ONLINE, PASS_ONLINE_WIDE };
/* Values a thread folds in sequence past which the online pass keeps its
 * state in double: a float sum of k terms drifts by about sqrt(k) f32
 * roundings (k = 4096 reached 1.01e-5 once, above f32's 1e-5), and the
 * double state's exp-based merges cost 2-3x on short rows. */
#define ONLINE_WIDE_AFTER 1024

/* One block per row (grid-stride over rows): the statistic of one pass.
 * PASS_NAIVE_SUM holds e^x in T, so f16 overflows past e^11.09. */
template <typename T, int PASS>
__global__ void __launch_bounds__(512) row_pass_kernel(const T *__restrict__ x, const fa_state_rows xr_at, typename Elem<T>::acc *m,
                                typename Elem<T>::acc *d, int64_t rows, int64_t n, int64_t block) {
  typedef typename Elem<T>::acc A;
  /* PASS_ONLINE_WIDE: the online pass whose threads each fold a long
   * sequence (a small block: all of the row at block = 1), in a double
   * state so that the sum stays within f32's precision (the launcher takes
   * it past ONLINE_WIDE_AFTER values a thread) */
  typedef typename std::conditional<PASS == PASS_ONLINE_WIDE, double, A>::type W;
  __shared__ MD<W> scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = row_at(x, xr_at, r);
    MD<W> s = {-(W)INFINITY, (W)0};
    if constexpr (PASS == PASS_NAIVE_SUM) {
      s.m = 0;
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s.d += Elem<T>::load(Elem<T>::store(fa_exp(Elem<T>::load(xr[j]))));
    } else if constexpr (PASS == PASS_MAX) {
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s.m = fmax(s.m, Elem<T>::load(xr[j]));
      for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s.d += Elem<T>::load(xr[j]) != Elem<T>::load(xr[j]);
    } else if constexpr (PASS == PASS_SUM) {
      A mr = m[r];
      if (mr != -(A)INFINITY)
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) s.d += fa_exp(Elem<T>::load(xr[j]) - mr);
    } else { /* online: the row in blocks of `block` elements, one rescale per block and thread */
      A v[8]; /* folded as A values into the W state */
      for (int64_t b0 = 0; b0 < n; b0 += block) {
        int64_t b1 = b0 + block < n ? b0 + block : n;
        int k = 0;
        for (int64_t j = b0 + threadIdx.x; j < b1; j += blockDim.x) {
          v[k++] = Elem<T>::load(xr[j]);
          if (k == 8) {
            s = md_add_block(s, v, k);
            k = 0;
          }
        }
        if (k) s = md_add_block(s, v, k);
      }
    }
    if constexpr (PASS == PASS_MAX) { /* a NaN anywhere makes the row NaN */
      A nan_count = s.d;
      s.d = 0;
      s = block_reduce_md(s, scratch);
      MD<A> c = {(A)0, nan_count};
      /* reduce the NaN count as a plain sum through the same path */
      c = block_reduce_md(c, scratch);
      if (threadIdx.x == 0) m[r] = c.d > 0 ? (A)NAN : s.m;
    } else if constexpr (PASS == PASS_ONLINE || PASS == PASS_ONLINE_WIDE) {
      s = block_reduce_md(s, scratch);
      if (threadIdx.x == 0) m[r] = (A)s.m, d[r] = (A)s.d;
    } else {
      MD<A> c = {(A)0, s.d};
      c = block_reduce_md(c, scratch);
      if (threadIdx.x == 0) d[r] = c.d;
    }
  }
}

/* Elementwise normalisation with per-row statistics. */
template <typename T, int NAIVE>
__global__ void normalise_kernel(const T *__restrict__ x, const fa_state_rows xr_at, T *__restrict__ y,
                                 const typename Elem<T>::acc *m, const typename Elem<T>::acc *d, int64_t rows, int64_t n) {
  typedef typename Elem<T>::acc A;
  int64_t total = rows * n;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
    int64_t r = i / n;
    A v = Elem<T>::load(row_at(x, xr_at, r)[i - r * n]);
    if (NAIVE) {
      y[i] = Elem<T>::store(Elem<T>::load(Elem<T>::store(fa_exp(v))) / d[r]);
    } else {
      MD<A> s = {m[r], d[r]};
      y[i] = Elem<T>::store(normalise(v, s));
    }
  }
}

/* fused: the row in shared memory (as T), read from global memory once. */
template <typename T> __global__ void __launch_bounds__(1024) fused_kernel(const T *__restrict__ x, const fa_state_rows xr_at, T *__restrict__ y,
                                                                           int64_t rows, int64_t n) {
  typedef typename Elem<T>::acc A;
  extern __shared__ __align__(16) unsigned char fused_smem[];
  T *row = (T *)fused_smem;
  __shared__ MD<A> scratch[32];
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T *xr = row_at(x, xr_at, r);
    MD<A> s = {-(A)INFINITY, (A)0};
    A v[8];
    int k = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
      T t = xr[j];
      row[j] = t;
      v[k++] = Elem<T>::load(t);
      if (k == 8) s = md_add_block(s, v, k), k = 0;
    }
    if (k) s = md_add_block(s, v, k);
    s = block_reduce_md(s, scratch); /* its barriers also publish row[] */
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) y[r * n + j] = Elem<T>::store(normalise(Elem<T>::load(row[j]), s));
    __syncthreads();
  }
}

/* ---- auto, short rows: a warp per row, the row in registers ---- */
template <typename T, int E>
__global__ void warp_rows_kernel(const T *__restrict__ x, const fa_state_rows xr_at, T *__restrict__ y, int64_t rows,
                                 int64_t n) {
  const int VN = Vec16<T>::N;
  constexpr bool KEEP = keeps_e<T>;
  int lane = threadIdx.x & 31;
  int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  int64_t nvec = n / VN;
  for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < rows; r += warps) {
    const Vec16<T> *xr = (const Vec16<T> *)row_at(x, xr_at, r);
    Vec16<T> *yr = (Vec16<T> *)(y + r * n);
    Vec16<T> buf[E];
    vec_load<T, E>(buf, xr, lane, 32, nvec);
    const MD<float> own = vec_fold<T, E, KEEP>(vec_max<T, E>(buf, lane, 32, nvec), buf, NULL, 0, lane, 32, nvec);
    vec_store<T, E, false, KEEP>(yr, buf, store_scale<KEEP>(warp_reduce_md(own), own.m), lane, 32, nvec);
  }
}

/* ---- auto, medium and long rows: a block per row or row segment ----
 * Each thread holds E 16-byte vectors of its block's item in registers: one
 * read, one write, a block-wide merge of the warps' (m, d) through shared
 * memory.  Medium rows are one item each (ITEM_ROW).  Long rows are cut
 * into segs segments of E·threads vectors, an item each, so that few rows
 * still fill the GPU.  ITEM_SEGMENT: the block publishes its segment's
 * partial, counts itself in on the row, waits for the row's other segments
 * and merges them with the seeds' rescale formula before it writes; all
 * blocks are resident (a cooperative launch), a row's segments are
 * consecutive items taken in order, and a block publishes before it waits,
 * so every wait ends.  Rows too long for the resident blocks take two
 * launches instead: ITEM_STATS publishes every segment's partial, then
 * ITEM_WRITE reads each segment again, merges its row and writes (three
 * passes over memory instead of two, but any length and the whole GPU).
 * Measured on H200 against the alternatives
 * (docs/perf/2026-11-22-softmax-h200-split-variants.json):
 * segments staged in shared memory through cp.async, with the next one
 * copied in during the wait, 0.58-0.67 x copy even with the waits removed;
 * publishing an item ahead and reading it again from L2 to write it,
 * 0.55-0.65; ITEM_SEGMENT, 0.65-0.77.  ITEM_ROW asks for 1024 threads an
 * SM (64 registers a thread): left free, ptxas gave the 16-bit kernels of
 * the two-step fold 71-95, and a 512-thread block an SM instead of two. */
enum { ITEM_ROW = 0, ITEM_SEGMENT, ITEM_STATS, ITEM_WRITE };

static __device__ __forceinline__ unsigned load_acquire(const unsigned *p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

/* The whole (m, d) of row r, to every thread, from its segs partials.  With
 * arrived (ITEM_SEGMENT): publishes item w's partial s first and waits until
 * all of the row's segments are in. */
static __device__ MD<float> merge_row(MD<float> s, int64_t w, int64_t r, int segs, MD<float> *partials,
                                      unsigned *arrived, MD<float> *row_state) {
  const MD<float> *rp = partials + r * segs;
  if (arrived && threadIdx.x == 0) {
    partials[w] = s;
    __threadfence(); /* the partial is visible before the count says so */
    atomicAdd(&arrived[r], 1u);
  }
  if (threadIdx.x < 32) { /* warp 0 waits for the row and merges it */
    if (arrived && threadIdx.x == 0)
      while (load_acquire(&arrived[r]) < (unsigned)segs) __nanosleep(32);
    __syncwarp();
    __threadfence();
    MD<float> all = {-INFINITY, 0.f};
    for (int j = threadIdx.x; j < segs; j += 32) { /* L2 reads: other blocks wrote them */
      MD<float> p = {__ldcg(&rp[j].m), __ldcg(&rp[j].d)};
      all = md_merge(all, p);
    }
    all = warp_reduce_md(all);
    if (threadIdx.x == 0) *row_state = all;
  }
  __syncthreads();
  MD<float> out = *row_state;
  if (!arrived) __syncthreads(); /* no block_reduce_md barrier comes before the next item rewrites it */
  return out;
}

template <typename T, int E, int WARPS, int MODE>
__global__ void __launch_bounds__(WARPS * 32, MODE == ITEM_ROW ? 1024 / (WARPS * 32) : 2)
    block_rows_kernel(const T *__restrict__ x, const fa_state_rows xr_at, T *__restrict__ y, int64_t rows, int64_t n,
                      int segs, MD<float> *partials, unsigned *arrived) {
  const int VN = Vec16<T>::N, TH = WARPS * 32;
  constexpr bool KEEP = keeps_e<T> && MODE != ITEM_WRITE; /* ITEM_WRITE takes e from x at the store */
  __shared__ MD<float> scratch[32];
  __shared__ MD<float> row_state;
  const int64_t nvec = n / VN, seg_vecs = MODE == ITEM_ROW ? nvec : (int64_t)E * TH, items = rows * segs;
  for (int64_t w = blockIdx.x; w < items; w += gridDim.x) {
    const int64_t r = w / segs, lo = (w % segs) * seg_vecs, len = min(seg_vecs, nvec - lo);
    const Vec16<T> *xr = (const Vec16<T> *)row_at(x, xr_at, r) + lo;
    Vec16<T> *yr = (Vec16<T> *)(y + r * n) + lo;
    Vec16<T> buf[E];
    vec_load<T, E>(buf, xr, threadIdx.x, TH, len);
    MD<float> own = {-INFINITY, 0.f}, s = own;
    if (MODE != ITEM_WRITE) {
      own = vec_fold<T, E, KEEP>(vec_max<T, E>(buf, threadIdx.x, TH, len), buf, NULL, 0, threadIdx.x, TH, len);
      s = block_reduce_md(own, scratch);
    }
    if (MODE == ITEM_STATS) {
      if (threadIdx.x == 0) partials[w] = s;
      continue;
    }
    if (MODE == ITEM_SEGMENT || MODE == ITEM_WRITE)
      s = merge_row(s, w, r, segs, partials, MODE == ITEM_SEGMENT ? arrived : NULL, &row_state);
    vec_store<T, E, true, KEEP>(yr, buf, store_scale<KEEP>(s, own.m), threadIdx.x, TH, len);
  }
}

/* ---- auto, long rows: a thread-block cluster per row ----
 * The row is cut over the CL blocks of a cluster; each block holds its
 * segment of per_thread vectors a thread on chip, up to E in registers and
 * S = per_thread - E more in shared memory (copied in by cp.async while
 * the registers' maximum is taken; f32 writes its exponentials back into
 * the thread's own slots).  With PIPE, the segment fits registers
 * and the stash holds the block's next segment instead, copied in while
 * this one is folded, exchanged and written.  Each block sends its (m, d) partial
 * into every block of the cluster (st.async), counted on the receiver's
 * mbarrier, and merges the CL partials it received.  One read, one write, no global counter or
 * spin-wait, and no cluster barrier a row: its release would wait for the
 * block's previous stores (measured: a cluster of one block with it ran
 * 10 % below the block-per-row kernel).  A ring of bulk copies (TMA) in
 * place of the stash, each chunk written out as soon as its y was in place
 * and the next row's copied in behind it, was 5-15 % slower (run 11). */
enum { CLUSTER_E = 8, CLUSTER_MAX = 16 };
template <typename T, int E, int TH, bool PIPE>
__global__ void __launch_bounds__(TH, 1024 / TH)
    cluster_rows_kernel(const T *__restrict__ x, const fa_state_rows xr_at, T *__restrict__ y, int64_t rows, int64_t n,
                        int per_thread) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* clusters; the launcher takes this code only when built so */
  const int VN = Vec16<T>::N;
  constexpr bool KEEP = keeps_e<T>;
  /* 128-byte aligned: after the 528 bytes of static shared memory below, a
   * 16-byte aligned stash put each warp's 512-byte access over 5 lines of
   * 128 bytes instead of 4 (3-7 % of the row time, run 11) */
  extern __shared__ __align__(128) unsigned char cluster_smem[];
  Vec16<T> *stash = (Vec16<T> *)cluster_smem; /* [S or E][TH]: each thread reads back only its own */
  __shared__ MD<float> scratch[32];
  __shared__ __align__(8) float partials[2][CLUSTER_MAX][2]; /* [row parity][sender]: (m, d) */
  __shared__ __align__(8) uint64_t arrived[2];                 /* [row parity]: counts the partials' bytes */
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  const unsigned cl = cluster.num_blocks(), rank = cluster.block_rank();
  const int S = PIPE ? 0 : max(0, per_thread - E);
  const int64_t nvec = n / VN, seg = (int64_t)TH * per_thread, lo = (int64_t)rank * seg;
  const int64_t len = max((int64_t)0, min(seg, nvec - lo));
  const int64_t nclusters = gridDim.x / cl;
  if (threadIdx.x == 0) {
    mbar_init(smem_addr(&arrived[0]), 1);
    mbar_init(smem_addr(&arrived[1]), 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster.sync(); /* every block's mbarriers are ready before any partial is sent */
  unsigned k = 0;
  if (PIPE && blockIdx.x / cl < rows) {
    vec_prefetch<T, E>(stash, (const Vec16<T> *)row_at(x, xr_at, blockIdx.x / cl) + lo, threadIdx.x, TH, len);
    cp_async_commit();
  }
  for (int64_t r = blockIdx.x / cl; r < rows; r += nclusters, k++) {
    const unsigned b = k & 1; /* a block may send row k+1's partial while others still merge row k */
    const Vec16<T> *xr = (const Vec16<T> *)row_at(x, xr_at, r) + lo;
    Vec16<T> *yr = (Vec16<T> *)(y + r * n) + lo;
    if (threadIdx.x == 0 && cl > 1) mbar_expect(smem_addr(&arrived[b]), cl * 8);
    Vec16<T> buf[E];
    if (PIPE) { /* the segment came in during the previous row; the next one comes in during this row */
      cp_async_wait<0>();
      vec_load<T, E>(buf, stash, threadIdx.x, TH, len);
      __syncwarp(); /* orders these reads of the slots before the copies that overwrite them */
      if (r + nclusters < rows)
        vec_prefetch<T, E>(stash, (const Vec16<T> *)row_at(x, xr_at, r + nclusters) + lo, threadIdx.x, TH, len);
      cp_async_commit();
    } else { /* stash vector s: element TH·(E + s) + thread of the segment */
      for (int s = 0; s < S; s++)
        vec_prefetch<T, 1>(stash + s * TH, xr + (int64_t)TH * (E + s), threadIdx.x, TH, len - (int64_t)TH * (E + s));
      cp_async_commit();
      vec_load<T, E>(buf, xr, threadIdx.x, TH, len);
    }
    const float tm = vec_max<T, E>(buf, threadIdx.x, TH, len); /* while the stash comes in */
    if (!PIPE) cp_async_wait<0>();
    const MD<float> own = vec_fold<T, E, KEEP>(tm, buf, stash, S, threadIdx.x, TH, len);
    MD<float> st = block_reduce_md(own, scratch);
    if (cl > 1) { /* (a cluster of one has nothing to exchange, and st.async needs two blocks) */
      if (threadIdx.x < cl) /* thread j sends this block's partial to block j */
        st_async_f2(cluster_map(smem_addr(&partials[b][rank][0]), threadIdx.x), st.m, st.d,
                    cluster_map(smem_addr(&arrived[b]), threadIdx.x));
      mbar_wait_cluster(smem_addr(&arrived[b]), (k >> 1) & 1); /* st_async from the cluster's blocks */
      MD<float> all = {-INFINITY, 0.f};
      const int lane = threadIdx.x & 31;
      if (lane < (int)cl) all = MD<float>{partials[b][lane][0], partials[b][lane][1]};
      st = warp_reduce_md(all);
    }
    const Scale sc = store_scale<KEEP>(st, own.m);
    vec_store<T, E, true, KEEP>(yr, buf, sc, threadIdx.x, TH, len);
    for (int s = 0; s < S; s++)
      vec_store<T, 1, true, KEEP>(yr + (int64_t)TH * (E + s), &stash[s * TH + threadIdx.x], sc, threadIdx.x, TH,
                                  len - (int64_t)TH * (E + s));
  }
  cluster.sync(); /* no block leaves while a partial may still be on its way to it */
#endif
}

/* ---- launchers ---- */

/* The launchers below size their grids by the device's SMs and opt-in
 * shared memory (fa_cuda_props, dp); the cluster kernel runs only where the
 * build's sm_90 code does (dp.sm90_code: a kernel JIT-compiled from older
 * PTX has an empty body). */

static int grid_for_rows(int64_t rows) {
  int64_t g = rows < 65535 ? rows : 65535;
  return (int)(g > 0 ? g : 1);
}

template <typename T>
static fa_status seeds_passes(fa_context *ctx, fa_softmax_algo algo, int64_t block, const T *x, const fa_state_rows &xr,
                              T *y, int64_t rows, int64_t n) {
  typedef typename Elem<T>::acc A;
  cudaStream_t st = fa_cuda_stream(ctx);
  fa_status status;
  void *stats = NULL;
  size_t bytes = 2 * (size_t)rows * sizeof(A);
  if ((status = fa_cuda_malloc(ctx, &stats, bytes))) return status;
  A *m = (A *)stats, *d = m + rows;
  int grid = grid_for_rows(rows), threads = n >= 1024 ? 512 : n >= 256 ? 256 : 128;
  if (algo == FA_SOFTMAX_NAIVE) {
    row_pass_kernel<T, PASS_NAIVE_SUM><<<grid, threads, 0, st>>>(x, xr, m, d, rows, n, block);
  } else if (algo == FA_SOFTMAX_SAFE) {
    row_pass_kernel<T, PASS_MAX><<<grid, threads, 0, st>>>(x, xr, m, d, rows, n, block);
    if (cudaPeekAtLastError() == cudaSuccess) row_pass_kernel<T, PASS_SUM><<<grid, threads, 0, st>>>(x, xr, m, d, rows, n, block);
  } else {
    const int64_t lanes = min(block, (int64_t)threads), per_thread = (n + lanes - 1) / lanes;
    constexpr int WIDE = std::is_same<A, double>::value ? PASS_ONLINE : PASS_ONLINE_WIDE; /* f64: double already */
    if (per_thread > ONLINE_WIDE_AFTER) row_pass_kernel<T, WIDE><<<grid, threads, 0, st>>>(x, xr, m, d, rows, n, block);
    else row_pass_kernel<T, PASS_ONLINE><<<grid, threads, 0, st>>>(x, xr, m, d, rows, n, block);
  }
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) {
    int64_t total = rows * n, blocks = (total + 255) / 256;
    int g = (int)(blocks < 65535 * 8 ? blocks : 65535 * 8);
    if (algo == FA_SOFTMAX_NAIVE) normalise_kernel<T, 1><<<g, 256, 0, st>>>(x, xr, y, m, d, rows, n);
    else normalise_kernel<T, 0><<<g, 256, 0, st>>>(x, xr, y, m, d, rows, n);
    err = cudaGetLastError();
  }
  /* the statistics are freed once the kernels that read them are done */
  cudaError_t serr = cudaStreamSynchronize(st);
  fa_cuda_free_on(ctx, stats, bytes);
  if (err == cudaSuccess) err = serr;
  return fa_cuda_error(ctx, err, "softmax kernels");
}

template <typename T>
static fa_status fused(fa_context *ctx, const T *x, const fa_state_rows &xr, T *y, int64_t rows, int64_t n) {
  size_t smem = (size_t)n * sizeof(T);
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(fused_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int threads = n >= 4096 ? 1024 : n >= 512 ? 256 : 128;
  fused_kernel<T><<<grid_for_rows(rows), threads, smem, fa_cuda_stream(ctx)>>>(x, xr, y, rows, n);
  FA_CUDA_CHECK_LAUNCH(ctx, "fused_kernel");
  return FA_OK;
}

template <typename T, int E>
static fa_status warp_rows(fa_context *ctx, const fa_cuda_props &dp, const T *x, const fa_state_rows &xr, T *y,
                           int64_t rows, int64_t n) {
  int64_t blocks = (rows + 7) / 8;
  int grid = (int)(blocks < (int64_t)dp.sms * 64 ? blocks : (int64_t)dp.sms * 64);
  warp_rows_kernel<T, E><<<grid, 256, 0, fa_cuda_stream(ctx)>>>(x, xr, y, rows, n);
  FA_CUDA_CHECK_LAUNCH(ctx, "warp_rows_kernel");
  return FA_OK;
}

template <typename T, int E, int WARPS>
static fa_status block_rows(fa_context *ctx, const fa_cuda_props &dp, const T *x, const fa_state_rows &xr, T *y,
                            int64_t rows, int64_t n) {
  int64_t cap = (int64_t)dp.sms * (2048 / (WARPS * 32)) * 4;
  int grid = (int)(rows < cap ? rows : cap);
  block_rows_kernel<T, E, WARPS, ITEM_ROW><<<grid, WARPS * 32, 0, fa_cuda_stream(ctx)>>>(x, xr, y, rows, n, 1, NULL, NULL);
  FA_CUDA_CHECK_LAUNCH(ctx, "block_rows_kernel");
  return FA_OK;
}

/* Long rows: segments of SPLIT_E vectors a thread, in as many blocks as
 * can be resident (ITEM_SEGMENT), or, when a row has more segments than
 * that or the GPU is shared, in two launches (ITEM_STATS, ITEM_WRITE). */
enum { SPLIT_E = 8, SPLIT_WARPS = 16 };
template <typename T>
static fa_status split_rows(fa_context *ctx, const fa_cuda_props &dp, const T *x, const fa_state_rows &xr, T *y,
                            int64_t rows, int64_t n) {
  const int threads = SPLIT_WARPS * 32;
  const int64_t nvec = n / (16 / sizeof(T)), seg_vecs = (int64_t)SPLIT_E * threads;
  const int64_t segs = (nvec + seg_vecs - 1) / seg_vecs, items = rows * segs;
  if (segs > INT32_MAX) return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: softmax on cuda: rows too long");
  int per_sm = 0;
  FA_CUDA_CHECK(ctx, cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                         &per_sm, block_rows_kernel<T, SPLIT_E, SPLIT_WARPS, ITEM_SEGMENT>, threads, 0));
  const int64_t resident = (int64_t)per_sm * dp.sms;
  int isegs = (int)segs;
  size_t pbytes = (size_t)items * sizeof(MD<float>), cbytes = (size_t)rows * sizeof(unsigned);
  void *partials = NULL, *arrived = NULL;
  cudaStream_t stream = fa_cuda_stream(ctx);
  fa_status st = fa_cuda_malloc(ctx, &partials, pbytes);
  if (st) return st;
  MD<float> *pp = (MD<float> *)partials;
  cudaError_t err = cudaErrorCooperativeLaunchTooLarge;
  if (segs <= resident) { /* a row's blocks can all be resident at once */
    if ((st = fa_cuda_malloc(ctx, &arrived, cbytes))) {
      fa_cuda_free_on(ctx, partials, pbytes);
      return st;
    }
    unsigned *ap = (unsigned *)arrived;
    int grid = (int)(items < resident ? items : resident);
    err = cudaMemsetAsync(arrived, 0, cbytes, stream);
    if (err == cudaSuccess) {
      void *args[] = {(void *)&x,    (void *)&xr,    (void *)&y,  (void *)&rows,
                      (void *)&n,    (void *)&isegs, (void *)&pp, (void *)&ap};
      err = cudaLaunchCooperativeKernel((const void *)block_rows_kernel<T, SPLIT_E, SPLIT_WARPS, ITEM_SEGMENT>,
                                        dim3(grid), dim3(threads), args, 0, stream);
    }
    fa_cuda_free_on(ctx, arrived, cbytes); /* stream-ordered: after the kernel */
  }
  if (err == cudaErrorCooperativeLaunchTooLarge || err == cudaErrorNotSupported) {
    /* too long for one wave, other work holds part of the GPU, or no cooperative launch here */
    (void)cudaGetLastError();
    int grid = (int)(items < (int64_t)dp.sms * 64 ? items : (int64_t)dp.sms * 64);
    block_rows_kernel<T, SPLIT_E, SPLIT_WARPS, ITEM_STATS><<<grid, threads, 0, stream>>>(x, xr, y, rows, n, isegs, pp, NULL);
    err = cudaGetLastError();
    if (err == cudaSuccess) {
      block_rows_kernel<T, SPLIT_E, SPLIT_WARPS, ITEM_WRITE><<<grid, threads, 0, stream>>>(x, xr, y, rows, n, isegs, pp, NULL);
      err = cudaGetLastError();
    }
  }
  fa_cuda_free_on(ctx, partials, pbytes); /* stream-ordered: after the kernels */
  return fa_cuda_error(ctx, err, "block_rows_kernel (split rows)");
}

/* Long rows on clusters: the layout for rows of nvec vectors of elem-byte
 * elements (threads a block, blocks a cluster, vectors a thread, PIPE), the
 * first of these that holds the row.  Measured on the H200 (run 5 of
 * docs/perf/2026-11-22-softmax-h200-*.json, f16 and f32 at 1024 x 131072
 * and 256 x 2^20): for 2-byte elements, whose conversions and exponentials
 * take twice the time a byte, blocks of 1024 threads with the next segment
 * copied in while this one is worked on (PIPE; without it 4 % slower);
 * else blocks of 512 threads, two an SM, the row in registers in up to 8
 * blocks (f32: 17 % faster than 1024 threads, where PIPE spills); f32 rows
 * up to twice that, two blocks an SM with a stash of 8 vectors a thread
 * (f32 512 x 2^18: 5 % faster than the next; run 10); else 1024 threads
 * with a stash of 8, the smallest cluster that holds the row (16 blocks of
 * 1024 threads leave SMs idle: 7 clusters on 132 SMs; larger stashes were
 * slower; at 2^20 f16 two blocks of 512 an SM in clusters of 16 were 4 %
 * slower, and at 2^17 f32 1024 threads in clusters of 2, all SMs busy, 8 %
 * slower than two blocks of 512 an SM in clusters of 8 on 120 SMs). */
typedef struct {
  int threads, cl, per_thread, pipe;
  size_t smem; /* the stash: the segment's vectors past registers, or (PIPE) the next segment */
} cluster_plan;

static int plan_cluster(int64_t nvec, int elem, int smem_optin, cluster_plan *pl) {
  static const struct {
    int threads, stash, cl_max, pipe, elem; /* elem: the element size served, 0 for any */
  } shapes[] = {{1024, 0, 4, 1, 2}, {512, 0, 8, 0, 0}, {512, 8, 8, 0, 4}, {1024, 8, 16, 0, 0}};
  for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
    const int64_t th = shapes[i].threads, stash = shapes[i].stash, pipe = shapes[i].pipe;
    const int64_t cl = (nvec + th * (CLUSTER_E + stash) - 1) / (th * (CLUSTER_E + stash));
    const int64_t per_thread = (nvec + cl * th - 1) / (cl * th);
    const size_t smem = (size_t)(pipe ? (int64_t)CLUSTER_E : max((int64_t)0, per_thread - CLUSTER_E)) * th * 16;
    if ((shapes[i].elem && elem != shapes[i].elem) || cl > shapes[i].cl_max || smem > (size_t)smem_optin) continue;
    *pl = cluster_plan{(int)th, (int)cl, (int)per_thread, (int)pipe, smem};
    return 1;
  }
  return 0;
}

/* Launches the rows on clusters of pl when the GPU can hold such a cluster
 * (*taken = 1); else leaves them to the caller (*taken = 0). */
template <typename T, int TH, bool PIPE>
static fa_status cluster_launch(fa_context *ctx, const T *x, const fa_state_rows &xr, T *y, int64_t rows, int64_t n,
                                cluster_plan pl, int *taken) {
  void (*fn)(const T *, const fa_state_rows, T *, int64_t, int64_t, int) = cluster_rows_kernel<T, CLUSTER_E, TH, PIPE>;
  if (cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)pl.smem) != cudaSuccess ||
      (pl.cl > 8 && cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)) {
    (void)cudaGetLastError(); /* more shared memory or a larger cluster than this GPU allows */
    return FA_OK;
  }
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = (unsigned)pl.cl, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)pl.cl);
  cfg.blockDim = dim3(TH);
  cfg.dynamicSmemBytes = pl.smem;
  cfg.stream = fa_cuda_stream(ctx);
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  int active = 0;
  if (cudaOccupancyMaxActiveClusters(&active, (const void *)fn, &cfg) != cudaSuccess || active == 0) {
    (void)cudaGetLastError(); /* the GPU is shared, or cannot place such a cluster */
    return FA_OK;
  }
  cfg.gridDim = dim3((unsigned)(min(rows, (int64_t)active) * pl.cl)); /* resident clusters, a row at a time each */
  FA_CUDA_CHECK(ctx, cudaLaunchKernelEx(&cfg, fn, x, xr, y, rows, n, pl.per_thread));
  *taken = 1;
  return FA_OK;
}

template <typename T>
static fa_status cluster_rows(fa_context *ctx, const fa_cuda_props &dp, const T *x, const fa_state_rows &xr, T *y,
                              int64_t rows, int64_t n, int *taken) {
  cluster_plan pl;
  *taken = 0;
  if (!dp.sm90_code || !plan_cluster(n / (16 / sizeof(T)), (int)sizeof(T), dp.smem_optin - 1024, &pl)) return FA_OK;
  if constexpr (sizeof(T) == 2) /* PIPE only for 2-byte elements */
    if (pl.pipe) return cluster_launch<T, 1024, true>(ctx, x, xr, y, rows, n, pl, taken);
  return pl.threads == 512 ? cluster_launch<T, 512, false>(ctx, x, xr, y, rows, n, pl, taken)
                           : cluster_launch<T, 1024, false>(ctx, x, xr, y, rows, n, pl, taken);
}

template <typename T>
static fa_status softmax_typed(fa_context *ctx, fa_softmax_algo algo, int64_t block, const T *x, const fa_state_rows &xr,
                               T *y, int64_t rows, int64_t n) {
  fa_cuda_props dp;
  fa_status st = fa_cuda_device_props(ctx, &dp);
  if (st) return st;
  if (block <= 0) block = 1024;
  if (algo == FA_SOFTMAX_FUSED) return fused<T>(ctx, x, xr, y, rows, n);
  if (algo != FA_SOFTMAX_AUTO) return seeds_passes<T>(ctx, algo, block, x, xr, y, rows, n);
  const int64_t VN = 16 / sizeof(T);
  int aligned = n % VN == 0 && ((uintptr_t)x % 16) == 0 && ((uintptr_t)y % 16) == 0;
  for (int i = 0; i < 3; i++) /* every row of x starts on 16 bytes */
    if (xr.size[i] > 1 && xr.stride[i] % VN) aligned = 0;
  if constexpr (sizeof(T) < 8) { /* f64 rows take the online kernels */
    if (!aligned) return seeds_passes<T>(ctx, FA_SOFTMAX_ONLINE, block, x, xr, y, rows, n);
    int64_t nvec = n / VN;
    if (nvec <= 32) return warp_rows<T, 1>(ctx, dp, x, xr, y, rows, n);
    if (nvec <= 64) return warp_rows<T, 2>(ctx, dp, x, xr, y, rows, n);
    if (nvec <= 128) return warp_rows<T, 4>(ctx, dp, x, xr, y, rows, n);
    if (nvec <= 256) return warp_rows<T, 8>(ctx, dp, x, xr, y, rows, n);
    /* rows that fill the GPU: a block per row with the row in registers */
    if (rows >= 2 * (int64_t)dp.sms) {
      if (nvec <= 512) return block_rows<T, 8, 2>(ctx, dp, x, xr, y, rows, n);
      if (nvec <= 1024) return block_rows<T, 8, 4>(ctx, dp, x, xr, y, rows, n);
      if (nvec <= 2048) return block_rows<T, 8, 8>(ctx, dp, x, xr, y, rows, n);
      if (nvec <= 4096) return block_rows<T, 8, 16>(ctx, dp, x, xr, y, rows, n);
      if (nvec <= 8192) return block_rows<T, 8, 32>(ctx, dp, x, xr, y, rows, n);
    }
    int taken = 0;
    fa_status cst = cluster_rows<T>(ctx, dp, x, xr, y, rows, n, &taken);
    return cst || taken ? cst : split_rows<T>(ctx, dp, x, xr, y, rows, n);
  }
  (void)aligned;
  return seeds_passes<T>(ctx, FA_SOFTMAX_ONLINE, block, x, xr, y, rows, n);
}

extern "C" int64_t fa_cuda_softmax_fused_max_n(fa_dtype dt) {
  fa_cuda_props dp;
  if (!fa_cuda_device_props_quiet(&dp)) return 0;
  return (int64_t)(dp.smem_optin - 1024) / (int64_t)fa_dtype_size(dt);
}

extern "C" fa_status fa_cuda_softmax(fa_context *ctx, fa_softmax_algo algo, int64_t block, fa_dtype dt,
                                     const void *x, const fa_state_rows *xr, void *y, int64_t rows, int64_t n) {
  if (rows == 0 || n == 0) return FA_OK;
  switch (dt) {
  case FA_F32: return softmax_typed<float>(ctx, algo, block, (const float *)x, *xr, (float *)y, rows, n);
  case FA_F16: return softmax_typed<__half>(ctx, algo, block, (const __half *)x, *xr, (__half *)y, rows, n);
  case FA_BF16:
    return softmax_typed<__nv_bfloat16>(ctx, algo, block, (const __nv_bfloat16 *)x, *xr, (__nv_bfloat16 *)y, rows, n);
  case FA_F64: return softmax_typed<double>(ctx, algo, block, (const double *)x, *xr, (double *)y, rows, n);
  default: return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: softmax: dtype %s has no CUDA kernel", fa_dtype_name(dt));
  }
}
