/* Attention variants on cuda (API §9): the CUDA C of a traced score_mod
 * and mask_mod (variant_codegen.c). */
#ifndef FA_VARIANT_CODEGEN_H
#define FA_VARIANT_CODEGEN_H

#include "expr.h"

/* The numbers a variant's code reads from its launch's arguments
 * (fa_variant_args.cf and .ci: kernels/attention/attention_variant_args.cuh,
 * whose sizes must be these) rather than holding them as literals, so that
 * the text, the compiled kernels' cache key, stays the same for every value
 * that types the same way: a new window width or softcap compiles nothing. */
#define FA_VARIANT_FLOATS 24
#define FA_VARIANT_INTS 16
typedef struct {
  float f[FA_VARIANT_FLOATS];
  long long i[FA_VARIANT_INTS];
  int nf, ni;
} fa_variant_consts;

/* The source of `struct fa_variant` (kernels/attention/attention_variant.cuh
 * says what it must define) for score_mod and mask_mod (either may be
 * NULL) in a call of bounds {B, Hq, Lq, Lk}: malloc'd text, or NULL when
 * out of memory.  score_mod's captured tensors take argument slots 0..,
 * mask_mod's the slots after them.  Reads whose indices stay inside their
 * tensor for every position of such a call are not checked; the others
 * (unsafe) have a slot each in the fault record.  The text depends on the
 * bounds only through which reads are unsafe; reads[0] and reads[1]: the
 * unsafe reads of score_mod and mask_mod.  consts gets the numbers the
 * text reads from the arguments (NULL: every number a literal). */
char *fa_variant_source(const fa_expr *score_mod, const fa_expr *mask_mod, const int64_t *bounds, int *reads,
                        fa_variant_consts *consts);
/* The unsafe reads of e (0 for NULL) before node `node` (-1: all of them);
 * -1 when out of memory. */
int fa_variant_unsafe_reads(const fa_expr *e, const int64_t *bounds, int node);

#endif
