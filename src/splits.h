/* opts.splits (src/splits.c): calls built from fa_attention and
 * fa_merge_states_n. */
#ifndef FA_SPLITS_H
#define FA_SPLITS_H

#include "check.h"

/* opts.splits: < 0 is an error; > 1 with causal top_left is unsupported
 * (not checked for the reference, which ignores splits). */
fa_status fa_attention_splits_check(fa_context *ctx, const fa_attention_opts *o, int reference);
/* The number of pieces: "auto" (0) is 1 until the split-KV kernel comes;
 * never more pieces than keys. */
int64_t fa_attention_splits_resolve(const fa_attention_opts *o, const fa_attn_dims *d);
/* The split call of fa_attention (checked arguments, splits > 1). */
fa_status fa_attention_splits_run(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                                  const fa_attn_dims *d, int64_t splits, fa_tensor **out, fa_tensor **lse);

#endif
