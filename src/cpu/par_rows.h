/* Loops over rows that run across the OpenMP threads only when they are
 * worth it.  An OpenMP region still costs its barrier's futex calls when
 * its `if` clause keeps it to one thread (1.4 us a region on the 2-core
 * machine, 2026-12-08: half of a tiny softmax call), so the one-thread
 * form is a plain loop outside OpenMP. */
#ifndef FA_CPU_PAR_ROWS_H
#define FA_CPU_PAR_ROWS_H

#include <stdint.h>

/* for (int64_t r = 0; r < n; r++) { body }: statically scheduled over the
 * threads when par, else here (omp_get_thread_num() is 0 there). */
#define FA_PAR_ROWS(par, r, n, ...)                                                                                    \
  do {                                                                                                                 \
    const int64_t fa_rows_n_ = (n);                                                                                    \
    if (par) {                                                                                                         \
      _Pragma("omp parallel for schedule(static)") for (int64_t r = 0; r < fa_rows_n_; r++) { __VA_ARGS__ }            \
    } else {                                                                                                           \
      for (int64_t r = 0; r < fa_rows_n_; r++) { __VA_ARGS__ }                                                         \
    }                                                                                                                  \
  } while (0)

#endif
