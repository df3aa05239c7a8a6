/* Operands the CPU kernels read in another dtype than they compute in
 * (f16/bf16 in f32, API §2), read where they lie (API §6): each tile a
 * kernel uses is widened into its thread's workspace as it goes, and each
 * finished output tile narrowed into place, so that no operand is copied
 * whole. */
#ifndef FA_CPU_STAGE_H
#define FA_CPU_STAGE_H

#include "internal.h"

#include <stdint.h>
#include <string.h>

/* rows rows of n elements: src (dtype src_t, rows lds elements apart) into
 * dst (dtype dst_t, rows ldd apart), rounded as fa_convert_n rounds. */
void fa_cpu_stage_rows(fa_dtype dst_t, void *dst, int64_t ldd, fa_dtype src_t, const void *src, int64_t lds,
                       int64_t rows, int64_t n);

/* Whether the n f16 or bf16 values (dtype t) at x are all finite. */
int fa_cpu_all_finite(fa_dtype t, const void *x, int64_t n);

/* f16 bits -> f32 as fa_f16_to_f32 gives it: the magnitude's bits moved
 * into f32's places and scaled by 2^112 (the exponent bias difference;
 * exact, subnormals included), inf and NaN given f32's top exponent
 * instead.  Selects by masks, no branch, so that loops of it vectorise. */
static inline float fa_cpu_f16_value(uint16_t h) {
  const uint32_t mag = (uint32_t)(h & 0x7fffu) << 13;
  float f;
  memcpy(&f, &mag, 4);
  f *= 0x1p112f;
  uint32_t u;
  memcpy(&u, &f, 4);
  const uint32_t special = -(uint32_t)((h & 0x7c00u) == 0x7c00u); /* inf or NaN: all ones */
  u = (u & ~special) | ((mag | 0x7f800000u) & special);
  u |= (uint32_t)(h & 0x8000u) << 16;
  memcpy(&f, &u, 4);
  return f;
}

static inline float fa_cpu_bf16_value(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

/* The value of f16 (t = FA_F16) or bf16 bits h in f32. */
static inline float fa_cpu_half_value(fa_dtype t, uint16_t h) {
  return t == FA_BF16 ? fa_cpu_bf16_value(h) : fa_cpu_f16_value(h);
}

/* Element `at` of an array of dtype t at base. */
static inline const void *fa_cpu_elem(const void *base, fa_dtype t, int64_t at) {
  return (const char *)base + at * (int64_t)fa_dtype_size(t);
}

#endif
