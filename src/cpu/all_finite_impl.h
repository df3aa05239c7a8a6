/* FA_R(all_finite) for one compute type (attention_instantiate.h): what
 * the forward's and the backward's _impl.h both ask of an operand before
 * they trust a tile product with it.  No include guard on purpose. */

/* Whether x[0..n) holds no NaN or inf (x·0 is 0 exactly for finite x);
 * partial sums per lane let GCC vectorise without reassociating. */
static inline int FA_R(all_finite)(const REAL *x, int64_t n) {
  REAL lane[16] = {0}, sum = 0;
  int64_t j = 0;
  for (; j + 16 <= n; j += 16)
    for (int k = 0; k < 16; k++) lane[k] += x[j + k] * 0;
  for (; j < n; j++) sum += x[j] * 0;
  for (int k = 0; k < 16; k++) sum += lane[k];
  return sum == 0;
}
