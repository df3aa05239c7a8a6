/* opts.splits (src/splits.c): calls built from fa_attention and
 * fa_merge_states_n. */
#ifndef FA_SPLITS_H
#define FA_SPLITS_H

#include "check.h"

/* The number of separate calls: "auto" (0) is 1 (the decode kernel chooses
 * its own chunks); never more pieces than keys. */
int64_t fa_attention_splits_resolve(const fa_attention_opts *o, const fa_attn_dims *d);
/* fa_attention for one piece, its keys k and v from the call's key_base
 * on (also ring attention's pieces, from 0): its lse in f64 on the CPU and
 * for f32 on cuda (a 16-bit piece's f32 lse rounds below its dtype), so
 * that the merge loses nothing to an f32 lse; top_left and the variants
 * count keys as the whole call does (fa_attn_problem.key_base). */
fa_status fa_attention_piece(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *opts,
                             int64_t key_base, fa_tensor **o, fa_tensor **lse);
/* The split call of fa_attention (checked arguments, splits > 1). */
fa_status fa_attention_splits_run(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *o,
                                  const fa_attn_dims *d, int64_t splits, fa_tensor **out, fa_tensor **lse);

#endif
