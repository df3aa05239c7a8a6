/* Attention variants through the C API (API §9): fa_expr_new's checks on
 * malformed nodes, fa_expr_eval, fa_block_mask_*, and fa_attention with
 * mask_mod / score_mod / block_mask against the built-in options; nothing
 * leaks (the engine's host bytes come back to where they were). */
#include "testutil.h"

#include "../../src/expr.h"

#include <math.h>

static fa_expr_node node(int op, int is_bool, int a0, int a1, double c) {
  fa_expr_node x;
  memset(&x, 0, sizeof x);
  x.op = (uint8_t)op, x.is_bool = (uint8_t)is_bool, x.a[0] = a0, x.a[1] = a1, x.c = c;
  return x;
}

int main(void) {
  fa_context *ctx = NULL;
  if (fa_context_create(FA_CPU, &ctx)) return 1;
  const size_t base = tu_mem_now();
  fa_expr *causal = NULL, *alibi = NULL, *bad = NULL;

  tu_test = "malformed";
  fa_expr_node fwd[2] = {node(FA_X_ADD, 0, 0, 1, 0), node(FA_X_Q, 0, 0, 0, 0)};
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_new(ctx, fwd, 2, NULL, NULL, 0, &bad));
  fa_expr_node op = node(FA_X_COUNT, 0, 0, 0, 0);
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_new(ctx, &op, 1, NULL, NULL, 0, &bad));
  fa_expr_node load = node(FA_X_LOAD, 0, 0, 0, 0);
  load.ndim = 1;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_new(ctx, &load, 1, NULL, NULL, 0, &bad));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_new(ctx, fwd, 0, NULL, NULL, 0, &bad));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_new(ctx, NULL, 1, NULL, NULL, 0, &bad));
  CHECK(bad == NULL, "no expression on failure");

  tu_test = "eval";
  fa_expr_node c[3] = {node(FA_X_Q, 0, 0, 0, 0), node(FA_X_K, 0, 0, 0, 0), node(FA_X_GE, 1, 0, 1, 0)};
  CHECK_OK(ctx, fa_expr_new(ctx, c, 3, NULL, NULL, 0, &causal));
  CHECK(fa_expr_eval(causal, 0, 0, 0, 3, 2) == 1 && fa_expr_eval(causal, 0, 0, 0, 2, 3) == 0, "q >= k");
  /* s - slopes[h] * |q - k|, slopes = {0.5, 0.25} */
  double sl[2] = {0.5, 0.25};
  int64_t two = 2;
  fa_tensor *slopes = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, sl, FA_CPU, FA_F64, 1, &two, NULL, NULL, NULL, &slopes));
  fa_expr_node a[8] = {node(FA_X_S, 0, 0, 0, 0), node(FA_X_H, 0, 0, 0, 0), node(FA_X_LOAD, 0, 1, 0, 0),
                       node(FA_X_Q, 0, 0, 0, 0), node(FA_X_K, 0, 0, 0, 0), node(FA_X_SUB, 0, 3, 4, 0),
                       node(FA_X_ABS, 0, 5, 0, 0), node(FA_X_MUL, 0, 2, 6, 0)};
  a[2].ndim = 1;
  fa_expr_node a2[9];
  memcpy(a2, a, sizeof a);
  a2[8] = node(FA_X_SUB, 0, 0, 7, 0);
  const char *names[1] = {"slopes"};
  CHECK_OK(ctx, fa_expr_new(ctx, a2, 9, &slopes, names, 1, &alibi));
  fa_tensor_release(slopes); /* the expression holds its own reference */
  CHECK(fabs(fa_expr_eval(alibi, 1, 0, 1, 5, 1) - (1 - 0.25 * 4)) < 1e-15, "alibi");

  tu_test = "block_mask";
  fa_block_mask *bm = NULL;
  CHECK_OK(ctx, fa_block_mask_new(ctx, causal, 1, 2, 64, 64, 16, 16, &bm));
  int64_t counts[3];
  fa_block_mask_counts(bm, counts);
  CHECK(counts[FA_BLOCK_EMPTY] == 12 && counts[FA_BLOCK_FULL] == 12 && counts[FA_BLOCK_PARTIAL] == 8,
        "counts %lld %lld %lld", (long long)counts[0], (long long)counts[1], (long long)counts[2]);
  CHECK(fa_block_mask_tile(bm, 0, 1, 3, 0) == FA_BLOCK_FULL && fa_block_mask_tile(bm, 0, 0, 0, 3) == FA_BLOCK_EMPTY &&
            fa_block_mask_tile(bm, 1, 0, 0, 0) == -1,
        "tiles");
  /* NULL is never a crash: a NULL array is not written, a NULL mask or expression gives zeros / NaN */
  fa_block_mask_counts(bm, NULL);
  fa_block_mask_sizes(bm, NULL);
  int64_t sizes[6] = {9, 9, 9, 9, 9, 9};
  fa_block_mask_sizes(NULL, sizes);
  CHECK(sizes[0] == 0 && sizes[5] == 0, "sizes of no mask");
  CHECK(isnan(fa_expr_eval(NULL, 0, 0, 0, 0, 0)), "value of no expression");
  fa_block_mask_free(bm);
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_block_mask_new(ctx, alibi, 1, 1, 8, 8, 4, 4, &bm));
  CHECK(bm == NULL, "no block mask on failure");
  CHECK_OK(ctx, fa_block_mask_new(ctx, causal, 1, 2, 64, 64, 16, 16, &bm));

  tu_test = "attention";
  int64_t shape[4] = {1, 2, 64, 8};
  fa_tensor *q = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 1), *k = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 2),
            *v = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 3);
  fa_attention_opts o, ref;
  fa_attention_opts_init(&o);
  fa_attention_opts_init(&ref);
  ref.causal = FA_CAUSAL_TOP_LEFT;
  ref.alibi = sl, ref.n_alibi = 2;
  o.mask_mod = causal, o.score_mod = alibi, o.block_mask = bm, o.tile_q = o.tile_k = 16;
  fa_tensor *o1 = NULL, *o2 = NULL;
  double diff = 1;
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &o, &o1, NULL));
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &ref, &o2, NULL));
  if (o1 && o2) CHECK_OK(ctx, fa_max_abs_diff(ctx, o1, o2, &diff));
  CHECK(diff < 1e-5, "variant vs options: %g", diff);
  fa_tensor_release(o1);
  o.tile_q = 32; /* not the block mask's tile */
  CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_attention(ctx, q, k, v, &o, &o1, NULL));
  o.tile_q = 16, o.mask_mod = NULL;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &o, &o1, NULL));
  o.mask_mod = alibi, o.block_mask = NULL; /* numbers where booleans are needed */
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &o, &o1, NULL));
  o.mask_mod = causal, o.splits = 2; /* the CPU's pieces count keys from their start: the unsplit call's result */
  fa_tensor *split = NULL, *whole = NULL;
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &o, &split, NULL));
  o.splits = 1;
  CHECK_OK(ctx, fa_attention(ctx, q, k, v, &o, &whole, NULL));
  double split_diff = 1;
  if (split && whole) CHECK_OK(ctx, fa_max_abs_diff(ctx, split, whole, &split_diff));
  CHECK(split_diff < 1e-5, "mask_mod with splits 2: %g", split_diff);
  fa_tensor_release(split), fa_tensor_release(whole);
  fa_tensor_release(o2);
  fa_tensor_release(q);
  fa_tensor_release(k);
  fa_tensor_release(v);
  fa_block_mask_free(bm);
  fa_expr_free(causal);
  fa_expr_free(alibi);
  fa_expr_free(NULL);
  fa_block_mask_free(NULL);
  CHECK(tu_mem_now() == base, "host bytes %zu, were %zu", tu_mem_now(), base);
  fa_context_destroy(ctx);
  return tu_summary("test_expr");
}
