/* The online softmax's running state, shared by the softmax kernels and
 * the naive attention's softmax: (m, d) = (running max, sum of e^(x - m)),
 * and the seeds' rescale formula that merges two states. */
#ifndef FA_KERNELS_ONLINE_STATE_CUH
#define FA_KERNELS_ONLINE_STATE_CUH

#include "common.cuh"

#include <math.h>

/* e^v on the SFU, as 2^(v·log2 e): about 2 ulp, subnormal results flushed
 * to 0 (far below any probability that matters), -inf -> 0, NaN -> NaN.
 * Softmax is bound by memory only if its exponentials are this cheap.  The
 * f64 reference rows take exp. */
static __device__ __forceinline__ float fa_exp(float v) { return exp2_approx(v * FA_LOG2E); }
static __device__ __forceinline__ double fa_exp(double v) { return exp(v); }

template <typename A> struct MD {
  A m, d;
};

/* d = e^(m1-m)·d1 + e^(m2-m)·d2 with m = max(m1, m2).  Two empty states
 * (m = -inf) add their sums instead: 0, or NaN when a NaN hid among -inf
 * values, which must reach the row whichever state holds it. */
template <typename A> static __device__ __forceinline__ MD<A> md_merge(MD<A> a, MD<A> b) {
  const A m = fmax(a.m, b.m);
  if (m == -(A)INFINITY) return MD<A>{m, a.d + b.d};
  return MD<A>{m, a.d * fa_exp(a.m - m) + b.d * fa_exp(b.m - m)};
}

/* The states of each group of `lanes` adjacent lanes (a power of two up to
 * 32) merged by shuffles; every lane of the group gets the result. */
template <typename A> static __device__ __forceinline__ MD<A> md_reduce_lanes(MD<A> s, int lanes) {
  for (int o = lanes / 2; o > 0; o >>= 1)
    s = md_merge(s, MD<A>{__shfl_xor_sync(0xffffffffu, s.m, o), __shfl_xor_sync(0xffffffffu, s.d, o)});
  return s;
}
template <typename A> static __device__ __forceinline__ MD<A> warp_reduce_md(MD<A> s) { return md_reduce_lanes(s, 32); }

#endif
