/* Counter-based random numbers for the CPU's fills (random_counter.h: the
 * generator the CUDA fills use too). */
#include "internal.h"
#include "random_counter.h"

double fa_random_uniform(uint64_t seed, uint64_t index) { return fa_rng_uniform(seed, index); }

double fa_random_normal(uint64_t seed, uint64_t index) { return fa_rng_normal(seed, index); }

uint64_t fa_seed_at(uint64_t n) { return fa_splitmix64(n); }
