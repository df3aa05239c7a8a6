/* The seeds' merge of two partial states in log space, exists once for the
 * CPU (src/cpu/merge.c) and the GPU (kernels/matmul/matmul.cu). */
#ifndef FA_MERGE_WEIGHTS_H
#define FA_MERGE_WEIGHTS_H

#include <math.h>

#include "host_device.h"

/* Two states of lse a and b (neither -inf: an empty state is the caller's
 * case): their weights *w1 + *w2 = 1 and the merged lse, log(e^a + e^b).
 * The weights come from the difference d = a - b alone, 1 / (1 + e^-|d|)
 * and e^-|d| times that: with lse = max + log1p(e^-|d|) first and the
 * weights e^(a - lse), e^(b - lse) after, lse's rounding at |lse| ~ 1e16
 * (scale 1e16) lost log 2, and both weights came out 1.  NaN in either, or
 * both +inf, gives NaN; one +inf takes that state whole. */
FA_HOST_DEVICE static inline double fa_merge_weights(double a, double b, double *w1, double *w2) {
  const double d = a - b, e = exp(-fabs(d)), big = 1 / (1 + e), small = e * big;
  *w1 = d >= 0 ? big : small;
  *w2 = d >= 0 ? small : big;
  return (d >= 0 ? a : b) + log1p(e);
}

#endif
