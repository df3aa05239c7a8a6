/* Tile conversions of the CPU kernels (stage.h).  The widening loops are
 * branch-free so that GCC vectorises them: they run once per tile a
 * kernel visits, not once per call. */
#include "cpu/stage.h"

#include "cpu/fast_exp.h"

/* The loops of stage.h's conversions, which GCC vectorises (their selects
 * are masks, not branches). */
FA_CPU_CLONES
static void widen_f16(float *restrict dst, const uint16_t *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = fa_cpu_f16_value(src[i]);
}

FA_CPU_CLONES
static void widen_bf16(float *restrict dst, const uint16_t *restrict src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = fa_cpu_bf16_value(src[i]);
}

void fa_cpu_stage_rows(fa_dtype dst_t, void *dst, int64_t ldd, fa_dtype src_t, const void *src, int64_t lds,
                       int64_t rows, int64_t n) {
  for (int64_t r = 0; r < rows; r++) {
    void *d = (char *)dst + r * ldd * (int64_t)fa_dtype_size(dst_t);
    const void *s = fa_cpu_elem(src, src_t, r * lds);
    if (dst_t == FA_F32 && src_t == FA_F16) widen_f16(d, s, n);
    else if (dst_t == FA_F32 && src_t == FA_BF16) widen_bf16(d, s, n);
    else fa_convert_n(dst_t, d, src_t, s, n);
  }
}

/* An f16 or bf16 value is inf or NaN when its exponent bits are all ones. */
FA_CPU_CLONES
static int half_all_finite(const uint16_t *x, int64_t n, uint16_t exponent) {
  int bad = 0;
  for (int64_t i = 0; i < n; i++) bad |= (x[i] & exponent) == exponent;
  return !bad;
}

int fa_cpu_all_finite(fa_dtype t, const void *x, int64_t n) {
  return half_all_finite(x, n, t == FA_BF16 ? 0x7f80u : 0x7c00u);
}
