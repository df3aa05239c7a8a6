/* Operands the CPU kernels read in another dtype than they compute in
 * (f16/bf16 in f32, API §2), read where they lie (API §6): each tile a
 * kernel uses is widened into its thread's workspace as it goes, and each
 * finished output tile narrowed into place, so that no operand is copied
 * whole. */
#ifndef FA_CPU_STAGE_H
#define FA_CPU_STAGE_H

#include "internal.h"

#include <stdint.h>

/* rows rows of n elements: src (dtype src_t, rows lds elements apart) into
 * dst (dtype dst_t, rows ldd apart), rounded as fa_convert_n rounds. */
void fa_cpu_stage_rows(fa_dtype dst_t, void *dst, int64_t ldd, fa_dtype src_t, const void *src, int64_t lds,
                       int64_t rows, int64_t n);

/* Whether the n f16 or bf16 values (dtype t) at x are all finite. */
int fa_cpu_all_finite(fa_dtype t, const void *x, int64_t n);

/* Element `at` of an array of dtype t at base. */
static inline const void *fa_cpu_elem(const void *base, fa_dtype t, int64_t at) {
  return (const char *)base + at * (int64_t)fa_dtype_size(t);
}

#endif
