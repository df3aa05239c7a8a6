/* f16 and bf16 as real storage types: conversions round to nearest even and
 * keep inf and NaN. */
#include "internal.h"

#include <string.h>

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
static float bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint16_t fa_f32_to_f16(float f) {
  uint32_t x = f32_bits(f);
  uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) /* inf stays inf; NaN stays a (quiet) NaN */
    return (uint16_t)(sign | 0x7c00 | (x > 0x7f800000u ? 0x200 | ((x >> 13) & 0x3ff) : 0));
  if (x >= 0x477ff000u) return (uint16_t)(sign | 0x7c00); /* >= 65520 rounds to inf */
  if (x >= 0x38800000u) {                                 /* normal in f16 */
    uint32_t r = x - ((uint32_t)(127 - 15) << 23);
    r += 0xfffu + ((r >> 13) & 1u); /* round to nearest even; a carry moves the exponent */
    return (uint16_t)(sign | (r >> 13));
  }
  /* subnormal or zero: adding 0.5 makes the float's ulp 2^-24, the f16
   * subnormal spacing, so the hardware addition rounds for us */
  float a = bits_f32(x) + 0.5f;
  return (uint16_t)(sign | (f32_bits(a) - f32_bits(0.5f)));
}

float fa_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16;
  uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0) {
    float v = (float)m * 0x1p-24f;
    return sign ? -v : v;
  }
  if (e == 31) return bits_f32(sign | 0x7f800000u | (m << 13));
  return bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t fa_f32_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((x >> 16) | 0x40); /* quiet NaN */
  x += 0x7fffu + ((x >> 16) & 1u);
  return (uint16_t)(x >> 16);
}

float fa_bf16_to_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

double fa_load_f64(fa_dtype d, const void *p, int64_t i) {
  switch (d) {
  case FA_F32: return ((const float *)p)[i];
  case FA_F16: return fa_f16_to_f32(((const uint16_t *)p)[i]);
  case FA_BF16: return fa_bf16_to_f32(((const uint16_t *)p)[i]);
  case FA_F64: return ((const double *)p)[i];
  case FA_BOOL: return ((const uint8_t *)p)[i] ? 1.0 : 0.0;
  }
  return 0;
}

/* f16/bf16 go through f32: the double rounding this allows differs from a
 * direct rounding only for doubles within 2^-29 relative of a tie. */
void fa_store_f64(fa_dtype d, void *p, int64_t i, double v) {
  switch (d) {
  case FA_F32: ((float *)p)[i] = (float)v; break;
  case FA_F16: ((uint16_t *)p)[i] = fa_f32_to_f16((float)v); break;
  case FA_BF16: ((uint16_t *)p)[i] = fa_f32_to_bf16((float)v); break;
  case FA_F64: ((double *)p)[i] = v; break;
  case FA_BOOL: ((uint8_t *)p)[i] = v != 0; break;
  }
}

double fa_dtype_round(fa_dtype d, double v) {
  uint64_t buf = 0;
  fa_store_f64(d, &buf, 0, v);
  return fa_load_f64(d, &buf, 0);
}

void fa_convert_n(fa_dtype dst_t, void *dst, fa_dtype src_t, const void *src, int64_t n) {
  if (dst_t == src_t) {
    memmove(dst, src, (size_t)n * fa_dtype_size(src_t));
  } else if (dst_t == FA_F32 && src_t == FA_F16) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = fa_f16_to_f32(((const uint16_t *)src)[i]);
  } else if (dst_t == FA_F32 && src_t == FA_BF16) {
    for (int64_t i = 0; i < n; i++) ((float *)dst)[i] = fa_bf16_to_f32(((const uint16_t *)src)[i]);
  } else if (dst_t == FA_F16 && src_t == FA_F32) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = fa_f32_to_f16(((const float *)src)[i]);
  } else if (dst_t == FA_BF16 && src_t == FA_F32) {
    for (int64_t i = 0; i < n; i++) ((uint16_t *)dst)[i] = fa_f32_to_bf16(((const float *)src)[i]);
  } else {
    for (int64_t i = 0; i < n; i++) fa_store_f64(dst_t, dst, i, fa_load_f64(src_t, src, i));
  }
}
