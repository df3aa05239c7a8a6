/* CPU backend facts: thread count, SIMD level, and BLAS set-up. */
#include "internal.h"

#include <omp.h>
#include <pthread.h>

#ifdef FA_HAVE_OPENBLAS_THREADS
#include <cblas.h>
#endif

int fa_cpu_threads(void) { return omp_get_max_threads(); }

/* Below about 2^17 operations a call ran faster on one thread than on
 * two: waking a team costs microseconds (2 cores, AVX2, 2026-11-30, a
 * GQA decode call of 8k operations: 5.2 us a call on one thread against
 * 13.4 on two; 65k: 11.5 against 12.1; 2.1M: 44 against 32). */
#define FA_CPU_PAR_MIN_FLOPS 131072.0

int fa_cpu_threads_for(int64_t items, double flops) {
  int threads = omp_get_max_threads();
  if (flops < FA_CPU_PAR_MIN_FLOPS) threads = 1;
  if (items < threads) threads = items > 0 ? (int)items : 1;
  return threads;
}

/* The widest vector ISA of the machine we run on (not the one we were
 * compiled for): the hot kernels carry AVX-512/AVX2 clones picked at load. */
const char *fa_cpu_simd(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
  __builtin_cpu_init(); /* needed if we are called before constructors ran */
  if (__builtin_cpu_supports("avx512f")) return "avx512";
  if (__builtin_cpu_supports("avx2")) return "avx2";
  if (__builtin_cpu_supports("avx")) return "avx";
  if (__builtin_cpu_supports("sse2")) return "sse2";
  return "scalar";
#elif defined(__aarch64__) || defined(__ARM_NEON)
  return "neon";
#else
  return "scalar";
#endif
}

#ifdef FA_HAVE_OPENBLAS_THREADS
/* OpenBLAS built on OpenMP implements this with omp_set_num_threads(),
 * which would leave the engine's own parallel loops one thread wide:
 * put the OpenMP setting back. */
static void blas_one_thread(void) {
  int nt = omp_get_max_threads();
  openblas_set_num_threads(1);
  omp_set_num_threads(nt);
}
#endif

/* The engine runs independent BLAS calls on its own OpenMP threads; a
 * threaded BLAS inside each would oversubscribe the cores.  Note that this
 * is process-wide: a host that uses OpenBLAS itself sees one thread too. */
void fa_cpu_blas_init(void) {
#ifdef FA_HAVE_OPENBLAS_THREADS
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once(&once, blas_one_thread);
#endif
}
