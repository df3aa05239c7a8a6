/* Counter-based random numbers: element i of a fill with seed s depends on
 * (s, i) alone, so every device and dtype sees the same values (the CUDA
 * backend uses the same mixing function). */
#include "internal.h"

#include <math.h>

/* splitmix64's finaliser: a strong 64-bit mix. */
static uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

static double bits_to_unit(uint64_t x) { return (double)(x >> 11) * 0x1.0p-53; }

double fa_random_uniform(uint64_t seed, uint64_t index) {
  return bits_to_unit(mix64(mix64(seed) + index * 0x9e3779b97f4a7c15ULL));
}

/* Box-Muller from two streams of the same counter. */
double fa_random_normal(uint64_t seed, uint64_t index) {
  uint64_t base = mix64(seed ^ 0x6a09e667f3bcc909ULL);
  double u1 = bits_to_unit(mix64(base + (2 * index) * 0x9e3779b97f4a7c15ULL));
  double u2 = bits_to_unit(mix64(base + (2 * index + 1) * 0x9e3779b97f4a7c15ULL));
  double r = sqrt(-2.0 * log(1.0 - u1)); /* 1 - u1 in (0, 1]: log is finite */
  return r * cos(6.283185307179586 * u2);
}
