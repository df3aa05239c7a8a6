/* Counter-based random numbers: value i of the stream of seed s depends on
 * (s, i) alone (splitmix64's finaliser over a Weyl sequence), so that every
 * device and dtype sees the same values.  Compiled for the host (src/random.c,
 * the binding's default seeds) and the device (kernels/tensor/tensor_ops.cu): the
 * generator exists once. */
#ifndef FA_RANDOM_COUNTER_H
#define FA_RANDOM_COUNTER_H

#include <math.h>
#include <stdint.h>

#include "flashattn.h"
#include "host_device.h"

#define FA_GOLDEN_GAMMA 0x9e3779b97f4a7c15ULL

/* splitmix64's finaliser: a strong 64-bit mix. */
FA_HOST_DEVICE static inline uint64_t fa_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/* splitmix64's n-th output for a state starting at 0. */
FA_HOST_DEVICE static inline uint64_t fa_splitmix64(uint64_t n) { return fa_mix64(n * FA_GOLDEN_GAMMA); }

/* The top 53 bits as a double in [0, 1). */
FA_HOST_DEVICE static inline double fa_bits_to_unit(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }

/* Uniform in [0, 1). */
FA_HOST_DEVICE static inline double fa_rng_uniform(uint64_t seed, uint64_t i) {
  return fa_bits_to_unit(fa_mix64(fa_mix64(seed) + i * FA_GOLDEN_GAMMA));
}

/* A uniform value as it is stored in dtype: never rounded up to 1 (the
 * largest value below 1 of f32, f16, bf16 instead, which rounding leaves
 * as it is), so that [0, 1) holds in every dtype. */
FA_HOST_DEVICE static inline double fa_rng_uniform_for(int dtype, double u) {
  const double top = dtype == FA_F32 ? 1 - 0x1.0p-24 : dtype == FA_F16 ? 1 - 0x1.0p-11 : dtype == FA_BF16 ? 1 - 0x1.0p-8 : u;
  return u < top ? u : top;
}

/* Standard normal: Box-Muller from two streams of the same counter. */
FA_HOST_DEVICE static inline double fa_rng_normal(uint64_t seed, uint64_t i) {
  const uint64_t base = fa_mix64(seed ^ 0x6a09e667f3bcc909ULL);
  const double u1 = fa_bits_to_unit(fa_mix64(base + (2 * i) * FA_GOLDEN_GAMMA));
  const double u2 = fa_bits_to_unit(fa_mix64(base + (2 * i + 1) * FA_GOLDEN_GAMMA));
  return sqrt(-2.0 * log(1.0 - u1)) * cos(6.283185307179586 * u2); /* 1 - u1 in (0, 1]: log is finite */
}

#endif
