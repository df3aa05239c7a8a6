/* A branch-free single-precision e^x that compilers vectorise.
 *
 * libm's expf is a call, so a loop over it stays scalar; this polynomial
 * is inlined, uses only +, *, compares and integer shifts, and GCC turns a
 * plain loop over it into SSE2/AVX2/AVX-512 code.  Accuracy: under 1 ulp
 * (0.99 at worst, measured against libm's double exp on every 7th float bit
 * pattern), gradual underflow into subnormals included.  Edge cases as
 * expf: +inf above ~88.72 (so naive softmax overflows where the seeds say),
 * 0 below ~-103.97, NaN for NaN.
 *
 * Method (Cephes expf): x = n·ln2 + r with |r| <= ln2/2, e^r by a
 * polynomial, then 2^n built from exponent bits.  2^n is applied as two
 * factors 2^(n/2)·2^(n-n/2) so that n = 128 (results near FLT_MAX) and
 * n < -126 (subnormal results) need no special path: the products
 * over/underflow exactly as they should.
 *
 * src/cpu/attention_scores.h has an equivalent fa_exp_f32 (written in
 * parallel); one of the two can go. */
#ifndef FA_CPU_FAST_EXP_H
#define FA_CPU_FAST_EXP_H

#include <stdint.h>
#include <string.h>

static inline uint32_t fa_cpu_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static inline float fa_cpu_bits_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* No float ?: anywhere: GCC may turn a float select into two paths through
 * the loop body, and then (without AVX-512 masks) does not vectorise it.
 * Selects are done on integers and with a bit mask instead. */
static inline float fa_expf_fast(float x) {
  /* n = round(x / ln2): adding 1.5·2^23 leaves the rounded value in the
   * low mantissa bits while |x / ln2| < 2^22.  Beyond that (and for
   * inf/NaN) the bits are meaningless and the clamp takes over; the sign
   * bit is dropped to keep the integer arithmetic defined. */
  const float shifter = 12582912.0f;
  float t = x * 1.44269504088896341f + shifter;
  int32_t n = (int32_t)(fa_cpu_f32_bits(t) & 0x7fffffffu) - (int32_t)fa_cpu_f32_bits(shifter);
  n = n < -151 ? -151 : n;
  n = n > 128 ? 128 : n;
  float nf = (float)n;
  float r = (x - nf * 0.693359375f) - nf * -2.12194440e-4f; /* ln2 in two parts, the first exact in n·ln2_hi */
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + r + 1.0f; /* +inf for x past 88.72 or +inf (n = 128, r large); NaN stays NaN */
  int32_t n1 = n / 2, n2 = n - n1; /* each in [-76, 64]: a normal power of two */
  p *= fa_cpu_bits_f32((uint32_t)(n1 + 127) << 23);
  p *= fa_cpu_bits_f32((uint32_t)(n2 + 127) << 23);
  /* e^x < 2^-150 is 0 in float; below -104 the clamped n leaves r large
   * and the polynomial meaningless, so mask the result to +0 there */
  return fa_cpu_bits_f32(fa_cpu_f32_bits(p) & ((uint32_t)(x < -104.0f) - 1u));
}

/* Row kernels marked with this are compiled for AVX-512, AVX2 and the
 * baseline, and the loader picks one for the CPU it runs on (GCC function
 * multiversioning): the build itself targets plain x86-64 (SSE2), which
 * would leave 2-4x of the vector width unused. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(FA_NO_CPU_CLONES)
#define FA_CPU_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FA_CPU_CLONES
#endif
/* (Only on static functions: GCC gives a clone of external linkage an
 * exported ifunc and resolvers whatever -fvisibility says; callers in other
 * files go through a plain function.) */

#endif
