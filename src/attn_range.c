/* fa_attn_key_range: the CPU's entry to the shared rule in attn_range.h. */
#include "attn_range.h"

void fa_attn_key_range(const fa_attn_problem *p, int64_t b, int64_t i, int64_t *lo, int64_t *hi) {
  fa_attn_range_of(p, b, i, lo, hi);
}
