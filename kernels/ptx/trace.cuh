/* Cycle marks for studying a kernel's phases: a build configured with
 * -DFLASHATTN_KERNEL_TRACE=ON (never the default: it waits for the device
 * after each traced launch) defines FA_KERNEL_TRACE.  Thread 0 of each
 * warpgroup of block 0 records clock64() (the SM's cycle counter, one
 * clock for all its warps) at marks 0-7 of each of its first 8 tiles, in
 * shared memory, and copies them to a device buffer when it leaves; the
 * launch then prints them (FA_TRACE_REPORT):
 *   TRACE <kernel>
 *   TRACE wg<W> n<N> c0 c1 ... c7        (0: a mark not reached)
 * scripts/probe_trace.lua runs calls and scripts/show_trace.py turns the
 * lines into kilocycles from warpgroup 0's first mark.  Nothing is printed
 * from the device: a call to printf in a kernel makes ptxas serialise its
 * wgmma (C7510).  Without the option every macro is empty.  A kernel calls
 * FA_TRACE_TILE(n) as it starts its n-th tile (its warpgroup's thread 0
 * then records under n), FA_TRACE_MARK(k), and FA_TRACE_DUMP() on its way
 * out; the buffer is this translation unit's, so the launch that reports
 * is in the unit that instantiates the kernel. */
#ifndef FA_KERNELS_TRACE_CUH
#define FA_KERNELS_TRACE_CUH

#if defined(FA_KERNEL_TRACE) && !defined(__CUDACC_RTC__)
#include <cstdio>
#include <cstdlib>
#include <cstring>
static __device__ long long fa_trace_out[4][8][8];
static __device__ int fa_trace_count[4];
#endif

#if defined(FA_KERNEL_TRACE) && !defined(__CUDACC_RTC__) && defined(__CUDA_ARCH__)
__shared__ long long fa_trace_at[4][8][8];
__shared__ int fa_trace_tile[4];
#define FA_TRACE_ME (blockIdx.x == 0 && (threadIdx.x & 127) == 0 && threadIdx.x < 512)
#define FA_TRACE_TILE(n)                                                                                             \
  do {                                                                                                               \
    if (FA_TRACE_ME) {                                                                                               \
      fa_trace_tile[threadIdx.x >> 7] = (n);                                                                         \
      if ((unsigned)(n) < 8u)                                                                                        \
        for (int k_ = 0; k_ < 8; k_++) fa_trace_at[threadIdx.x >> 7][(n)][k_] = 0;                                   \
    }                                                                                                                \
  } while (0)
#define FA_TRACE_MARK(k)                                                                                             \
  do {                                                                                                               \
    if (FA_TRACE_ME && (unsigned)fa_trace_tile[threadIdx.x >> 7] < 8u)                                               \
      fa_trace_at[threadIdx.x >> 7][fa_trace_tile[threadIdx.x >> 7]][(k)] = clock64();                               \
  } while (0)
#define FA_TRACE_DUMP()                                                                                              \
  do {                                                                                                               \
    if (FA_TRACE_ME) {                                                                                               \
      const int w_ = threadIdx.x >> 7, n_ = fa_trace_tile[w_] < 7 ? fa_trace_tile[w_] + 1 : 8;                       \
      for (int i_ = 0; i_ < n_ * 8; i_++) fa_trace_out[w_][i_ / 8][i_ % 8] = fa_trace_at[w_][i_ / 8][i_ % 8];         \
      fa_trace_count[w_] = n_;                                                                                       \
    }                                                                                                                \
  } while (0)
#else
#define FA_TRACE_TILE(n) do {} while (0)
#define FA_TRACE_MARK(k) do {} while (0)
#define FA_TRACE_DUMP() do {} while (0)
#endif

#if defined(FA_KERNEL_TRACE) && !defined(__CUDACC_RTC__)
/* After a traced launch on stream s: waits for it, prints block 0's marks,
 * and clears the counts for the next launch. */
static inline void fa_trace_report(cudaStream_t s, const char *kernel) {
  long long at[4][8][8];
  int count[4];
  if (cudaStreamSynchronize(s) != cudaSuccess || cudaMemcpyFromSymbol(at, fa_trace_out, sizeof at) != cudaSuccess ||
      cudaMemcpyFromSymbol(count, fa_trace_count, sizeof count) != cudaSuccess)
    return;
  printf("TRACE %s\n", kernel);
  for (int w = 0; w < 4; w++)
    for (int n = 0; n < count[w] && n < 8; n++)
      printf("TRACE wg%d n%d %lld %lld %lld %lld %lld %lld %lld %lld\n", w, n, at[w][n][0], at[w][n][1], at[w][n][2],
             at[w][n][3], at[w][n][4], at[w][n][5], at[w][n][6], at[w][n][7]);
  fflush(stdout);
  memset(count, 0, sizeof count);
  (void)cudaMemcpyToSymbol(fa_trace_count, count, sizeof count);
}
#define FA_TRACE_REPORT(stream, kernel) fa_trace_report(stream, kernel)
#else
#define FA_TRACE_REPORT(stream, kernel) do {} while (0)
#endif

/* Block timelines, in the same build: thread 0 of each of a kernel's first
 * FA_TIMELINE_BLOCKS blocks records the globaltimer (ns, one clock for the
 * whole GPU) at marks 0-7 (FA_TIMELINE_MARK; 0 also records its SM), and
 * the launch prints them (FA_TIMELINE_REPORT):
 *   TIMELINE <kernel> <blocks>
 *   TIMELINE <block> <sm> t0 t1 ... t7          (0: a mark not reached)
 * where the kernel says what its marks are (the fused backward's: start,
 * first tile's barrier, key loop's end, stores' end; then 4-7 inside its
 * start; the globaltimer ticks every 32 ns, so shorter phases read as 0 or 32).
 * scripts/show_timeline.py turns them into the phases' shares and the SMs'
 * idle time; scripts/probe_trace.lua --backward runs such calls. */
#define FA_TIMELINE_BLOCKS 16384
#if defined(FA_KERNEL_TRACE) && !defined(__CUDACC_RTC__)
#define FA_TIMELINE_MARKS 8
typedef unsigned long long fa_timeline_row[FA_TIMELINE_MARKS + 1]; /* the marks, then the SM */
static __device__ fa_timeline_row fa_timeline_at[FA_TIMELINE_BLOCKS];
#endif
#if defined(FA_KERNEL_TRACE) && !defined(__CUDACC_RTC__) && defined(__CUDA_ARCH__)
#define FA_TIMELINE_MARK(k)                                                                                          \
  do {                                                                                                               \
    if (threadIdx.x == 0 && blockIdx.x < FA_TIMELINE_BLOCKS) {                                                       \
      unsigned long long t_;                                                                                         \
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_));                                                       \
      fa_timeline_at[blockIdx.x][(k)] = t_;                                                                          \
      if ((k) == 0) {                                                                                                \
        unsigned s_;                                                                                                 \
        asm volatile("mov.u32 %0, %%smid;" : "=r"(s_));                                                            \
        fa_timeline_at[blockIdx.x][FA_TIMELINE_MARKS] = s_;                                                        \
      }                                                                                                              \
    }                                                                                                                \
  } while (0)
#else
#define FA_TIMELINE_MARK(k) do {} while (0)
#endif

#if defined(FA_KERNEL_TRACE) && !defined(__CUDACC_RTC__)
/* After a timed launch of `blocks` blocks on stream s: waits for it,
 * prints the first FA_TIMELINE_BLOCKS blocks' marks and clears them. */
static inline void fa_timeline_report(cudaStream_t s, const char *kernel, long long blocks) {
  const long long n = blocks < FA_TIMELINE_BLOCKS ? blocks : FA_TIMELINE_BLOCKS;
  const size_t bytes = sizeof(fa_timeline_row) * (size_t)n;
  fa_timeline_row *at = n > 0 ? (fa_timeline_row *)malloc(bytes) : NULL;
  void *dev = NULL;
  if (at && cudaStreamSynchronize(s) == cudaSuccess && cudaMemcpyFromSymbol(at, fa_timeline_at, bytes) == cudaSuccess) {
    printf("TIMELINE %s %lld\n", kernel, n);
    for (long long i = 0; i < n; i++) {
      printf("TIMELINE %lld %llu", i, at[i][FA_TIMELINE_MARKS]);
      for (int k = 0; k < FA_TIMELINE_MARKS; k++) printf(" %llu", at[i][k]);
      printf("\n");
    }
    fflush(stdout);
    if (cudaGetSymbolAddress(&dev, fa_timeline_at) == cudaSuccess) (void)cudaMemset(dev, 0, bytes);
  }
  free(at);
}
#define FA_TIMELINE_REPORT(stream, kernel, blocks) fa_timeline_report(stream, kernel, blocks)
#else
#define FA_TIMELINE_REPORT(stream, kernel, blocks) do {} while (0)
#endif

#endif
