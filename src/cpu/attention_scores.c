/* Shared score and online-softmax steps of the CPU attention algorithms,
 * for f32 and f64, from attention_scores_impl.h. */
#include "cpu/attention_scores.h"
#include "cpu/fast_exp.h"
#include "cpu/stage.h"
#include "expr.h"

#include <math.h>

/* Row maxima for the online step.  The result is the largest score; a NaN
 * either is the result or is left for the exp to spread through the row,
 * and a row whose other scores are all -inf returns its NaN so that it is
 * not taken for an empty row. */

/* f32 bits mapped onto int32 in the order of the values (-0 and +0 both 0,
 * NaN beyond ±inf): an integer max is a reduction GCC vectorises, which a
 * float max that honours NaN is not, and the max costs as much as the exp
 * when scalar. */
static inline int32_t f32_order_key(float x) {
  const uint32_t u = fa_cpu_f32_bits(x);
  const int32_t mag = (int32_t)(u & 0x7fffffffu), neg = (int32_t)(u >> 31);
  return (mag ^ -neg) + neg; /* neg ? -mag : mag */
}

static inline float f32_from_order_key(int32_t k) {
  return k < 0 ? fa_cpu_bits_f32(0x80000000u | (uint32_t)-k) : fa_cpu_bits_f32((uint32_t)k);
}

static inline float row_max_f32(const float *s, int64_t n) {
  int32_t key = f32_order_key(-INFINITY);
  for (int64_t j = 0; j < n; j++) {
    const int32_t kj = f32_order_key(s[j]);
    key = kj > key ? kj : key;
  }
  const float mx = f32_from_order_key(key);
  if (mx == -INFINITY)
    for (int64_t j = 0; j < n; j++)
      if (s[j] != s[j]) return s[j];
  return mx;
}

static inline double row_max_f64(const double *s, int64_t n) {
  double mx = -INFINITY;
  for (int64_t j = 0; j < n; j++) mx = s[j] > mx ? s[j] : mx;
  if (mx == -INFINITY)
    for (int64_t j = 0; j < n; j++)
      if (s[j] != s[j]) return s[j];
  return mx;
}

#define FA_IMPL "cpu/attention_scores_impl.h"
#include "cpu/attention_instantiate.h"
