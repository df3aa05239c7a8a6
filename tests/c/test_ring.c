/* fa_shard, fa_unshard and fa_ring_attention from C (API §11): NULL
 * contexts, arrays, entries and result pointers are argument errors that
 * write nothing; the ring equals fa_attention on the whole tensors; failures
 * keep no memory.  The Lua suite tests/lua/test_ring.lua covers the rest. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "testutil.h"

static fa_context *ctx;

static fa_tensor *randn(int64_t b, int64_t h, int64_t l, int64_t d, uint64_t seed) {
  const int64_t shape[4] = {b, h, l, d};
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 4, shape, FA_F32, FA_CPU, &t));
  CHECK_OK(ctx, fa_tensor_fill_random(ctx, t, FA_FILL_NORMAL, seed));
  return t;
}

static size_t host_bytes(void) {
  size_t cur = 0;
  fa_memory(FA_CPU, &cur, NULL);
  return cur;
}

static void release_all(fa_tensor **ts, int n) {
  for (int i = 0; i < n; i++)
    if (ts[i]) fa_tensor_release(ts[i]), ts[i] = NULL;
}

static void test_nulls(void) {
  tu_test = "NULL arguments";
  fa_tensor *t = randn(1, 2, 8, 4, 1), *sh[4] = {NULL, NULL, NULL, NULL}, *out = NULL;
  CHECK_STATUS(NULL, FA_ERR_ARGUMENT, fa_shard(NULL, t, 2, -2, FA_SHARD_CONTIGUOUS, sh));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_shard(ctx, NULL, 2, -2, FA_SHARD_CONTIGUOUS, sh));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_shard(ctx, t, 2, -2, FA_SHARD_CONTIGUOUS, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_shard(ctx, t, 2, -2, (fa_shard_layout)7, sh));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_shard(ctx, t, 2, 4, FA_SHARD_CONTIGUOUS, sh));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_shard(ctx, t, 0, -2, FA_SHARD_CONTIGUOUS, sh));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_shard(ctx, t, 5, -2, FA_SHARD_ZIGZAG, sh));
  CHECK(!sh[0] && !sh[1], "nothing written on failure");

  CHECK_STATUS(NULL, FA_ERR_ARGUMENT, fa_unshard(NULL, 1, &t, -2, FA_SHARD_CONTIGUOUS, &out));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_unshard(ctx, 1, NULL, -2, FA_SHARD_CONTIGUOUS, &out));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_unshard(ctx, 1, &t, -2, FA_SHARD_CONTIGUOUS, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_unshard(ctx, 2, sh, -2, FA_SHARD_CONTIGUOUS, &out));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_unshard(ctx, 0, &t, -2, FA_SHARD_CONTIGUOUS, &out));
  CHECK(!out, "nothing written on failure");

  fa_tensor *qs[2] = {t, t}, *none[2] = {t, NULL}, *outs[2] = {NULL, NULL}, *lses[2] = {NULL, NULL};
  CHECK_STATUS(NULL, FA_ERR_ARGUMENT, fa_ring_attention(NULL, 2, qs, qs, qs, NULL, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 2, qs, qs, qs, NULL, FA_SHARD_CONTIGUOUS, NULL, lses));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 2, NULL, qs, qs, NULL, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 2, qs, NULL, qs, NULL, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 2, qs, qs, NULL, NULL, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 2, none, qs, qs, NULL, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 2, qs, none, qs, NULL, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 2, qs, qs, none, NULL, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 0, qs, qs, qs, NULL, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 2, qs, qs, qs, NULL, 9, outs, lses));
  fa_attention_opts o;
  fa_attention_opts_init(&o);
  o.splits = 2;
  CHECK_STATUS(ctx, FA_ERR_UNSUPPORTED, fa_ring_attention(ctx, 2, qs, qs, qs, &o, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK(strstr(fa_context_error(ctx), "opts.splits") != NULL, "names the option: %s", fa_context_error(ctx));
  CHECK(!outs[0] && !outs[1] && !lses[0] && !lses[1], "nothing written on failure");
  /* kv_lens count the whole sequence's keys (t twice: L = 16) */
  const int64_t lens[1] = {17};
  fa_attention_opts_init(&o);
  o.kv_lens = lens, o.n_kv_lens = 1;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 2, qs, qs, qs, &o, FA_SHARD_CONTIGUOUS, outs, lses));
  CHECK(strstr(fa_context_error(ctx), "Lk = 16") != NULL, "names the whole length: %s", fa_context_error(ctx));
  CHECK(!outs[0] && !outs[1] && !lses[0] && !lses[1], "nothing written on failure");
  fa_tensor_release(t);
}

/* The ring over n shards against fa_attention on the whole tensors; with
 * rules, a window, alibi and kv_lens at the whole sequence's positions. */
static void test_ring_equals_attention(void) {
  tu_test = "ring equals attention";
  fa_tensor *q = randn(2, 4, 11, 8, 11), *k = randn(2, 2, 11, 8, 12), *v = randn(2, 2, 11, 8, 13);
  const double slopes[4] = {0.5, 0.25, 1, 2};
  const int64_t lens[2] = {11, 5};
  for (int rules = 0; rules <= 1; rules++)
  for (int layout = FA_SHARD_CONTIGUOUS; layout <= FA_SHARD_ZIGZAG; layout++)
    for (int causal = 0; causal <= 1; causal++)
      for (int n = 1; n <= 4; n++) {
        if (layout == FA_SHARD_ZIGZAG && 2 * n > 11) continue;
        fa_tensor *qs[4] = {0}, *ks[4] = {0}, *vs[4] = {0}, *os[4] = {0}, *ls[4] = {0};
        fa_tensor *o = NULL, *lse = NULL, *want = NULL, *want_lse = NULL, *lse_all = NULL;
        fa_attention_opts opts;
        fa_attention_opts_init(&opts);
        opts.causal = causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
        opts.return_lse = 1;
        if (rules) {
          opts.has_window = 1, opts.window_left = 3, opts.window_right = 1;
          opts.alibi = slopes, opts.n_alibi = 4;
          opts.kv_lens = lens, opts.n_kv_lens = 2;
        }
        CHECK_OK(ctx, fa_shard(ctx, q, n, -2, (fa_shard_layout)layout, qs));
        CHECK_OK(ctx, fa_shard(ctx, k, n, -2, (fa_shard_layout)layout, ks));
        CHECK_OK(ctx, fa_shard(ctx, v, n, 2, (fa_shard_layout)layout, vs));
        CHECK_OK(ctx, fa_ring_attention(ctx, n, qs, ks, vs, &opts, layout, os, ls));
        CHECK_OK(ctx, fa_attention(ctx, q, k, v, &opts, &want, &want_lse));
        CHECK_OK(ctx, fa_unshard(ctx, n, os, -2, (fa_shard_layout)layout, &o));
        CHECK_OK(ctx, fa_unshard(ctx, n, ls, -1, (fa_shard_layout)layout, &lse_all));
        double e = 1, le = 1;
        CHECK_OK(ctx, fa_rel_error(ctx, o, want, &e));
        CHECK_OK(ctx, fa_max_abs_diff(ctx, lse_all, want_lse, &le));
        CHECK(e < 1e-5 && le < 1e-4, "rules %d layout %d causal %d n %d: rel error %g, lse %g", rules, layout, causal,
              n, e, le);
        /* without lses */
        release_all(os, n);
        CHECK_OK(ctx, fa_ring_attention(ctx, n, qs, ks, vs, rules ? &opts : NULL, layout, os, NULL));
        release_all(qs, n), release_all(ks, n), release_all(vs, n), release_all(os, n), release_all(ls, n);
        fa_tensor *all[5] = {o, lse, want, want_lse, lse_all};
        release_all(all, 5);
      }
  fa_tensor_release(q), fa_tensor_release(k), fa_tensor_release(v);
}

/* A host's mask_mod (the builder's document mask, q >= k within a
 * document read from a captured tensor) counts the whole sequence's
 * positions in the ring as in fa_attention; a read past the tensor fails
 * both alike and keeps nothing. */
static void test_ring_variant(void) {
  tu_test = "ring with a host's mask_mod";
  const size_t before = host_bytes();
  enum { L = 21 };
  fa_tensor *q = randn(1, 2, L, 8, 31), *k = randn(1, 2, L, 8, 32), *v = randn(1, 2, L, 8, 33), *doc = NULL;
  float d[L];
  for (int i = 0; i < L; i++) d[i] = (float)(i / 6);
  const int64_t dshape[1] = {L}, shortshape[1] = {L - 1};
  CHECK_OK(ctx, fa_tensor_wrap(ctx, d, FA_CPU, FA_F32, 1, dshape, NULL, NULL, NULL, &doc));
  fa_expr *masks[2] = {NULL, NULL};
  for (int m = 0; m < 2; m++) { /* 1: a tensor one short, read at the last query */
    fa_tensor *t = doc;
    if (m) CHECK_OK(ctx, fa_tensor_wrap(ctx, d, FA_CPU, FA_F32, 1, shortshape, NULL, NULL, NULL, &t));
    fa_expr_builder *x = NULL;
    CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
    const int qi = fa_expr_arg(x, "q"), ki = fa_expr_arg(x, "k");
    const int dq = fa_expr_load(x, t, "doc", 1, &qi), dk = fa_expr_load(x, t, "doc", 1, &ki);
    const int same = fa_expr_apply(x, "eq", dq, dk), past = fa_expr_apply(x, "ge", qi, ki);
    CHECK_OK(ctx, fa_expr_build(x, fa_expr_apply(x, "and", same, past), &masks[m]));
    fa_expr_builder_free(x);
    if (m) fa_tensor_release(t);
  }
  for (int layout = FA_SHARD_CONTIGUOUS; layout <= FA_SHARD_ZIGZAG; layout++) {
    fa_tensor *qs[3] = {0}, *ks[3] = {0}, *vs[3] = {0}, *os[3] = {0}, *o = NULL, *want = NULL;
    fa_attention_opts opts;
    fa_attention_opts_init(&opts);
    opts.mask_mod = masks[0];
    CHECK_OK(ctx, fa_shard(ctx, q, 3, -2, (fa_shard_layout)layout, qs));
    CHECK_OK(ctx, fa_shard(ctx, k, 3, -2, (fa_shard_layout)layout, ks));
    CHECK_OK(ctx, fa_shard(ctx, v, 3, -2, (fa_shard_layout)layout, vs));
    CHECK_OK(ctx, fa_ring_attention(ctx, 3, qs, ks, vs, &opts, layout, os, NULL));
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &opts, &want, NULL));
    CHECK_OK(ctx, fa_unshard(ctx, 3, os, -2, (fa_shard_layout)layout, &o));
    double e = 1;
    CHECK_OK(ctx, fa_rel_error(ctx, o, want, &e));
    CHECK(e < 1e-5, "layout %d: rel error %g", layout, e);
    release_all(os, 3);
    opts.mask_mod = masks[1];
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_ring_attention(ctx, 3, qs, ks, vs, &opts, layout, os, NULL));
    const char *msg = fa_context_error(ctx); /* q = k = 21 reads past both ways: either is the first */
    CHECK(strstr(msg, "doc[q]: index 21 out of range 1..20") || strstr(msg, "doc[k]: index 21 out of range 1..20"),
          "the read as written, its index in the whole sequence: %s", msg);
    CHECK(!os[0] && !os[1] && !os[2], "nothing written on failure");
    release_all(qs, 3), release_all(ks, 3), release_all(vs, 3);
    fa_tensor *all[2] = {o, want};
    release_all(all, 2);
  }
  fa_expr_free(masks[0]), fa_expr_free(masks[1]);
  fa_tensor_release(q), fa_tensor_release(k), fa_tensor_release(v), fa_tensor_release(doc);
  CHECK(host_bytes() == before, "host bytes %zu, before %zu", host_bytes(), before);
}

/* Failures in the middle of the ring (a head count that does not divide,
 * found by fa_attention) keep nothing. */
static void test_failures_keep_nothing(void) {
  tu_test = "failures keep nothing";
  const size_t before = host_bytes();
  fa_tensor *q = randn(1, 3, 8, 4, 21), *k = randn(1, 2, 8, 4, 22);
  fa_tensor *qs[2] = {0}, *ks[2] = {0}, *os[2] = {0}, *ls[2] = {0};
  CHECK_OK(ctx, fa_shard(ctx, q, 2, -2, FA_SHARD_ZIGZAG, qs));
  CHECK_OK(ctx, fa_shard(ctx, k, 2, -2, FA_SHARD_ZIGZAG, ks));
  fa_status st = fa_ring_attention(ctx, 2, qs, ks, ks, NULL, FA_SHARD_ZIGZAG, os, ls);
  CHECK(st != FA_OK, "Hq = 3, Hkv = 2 must fail");
  CHECK(!os[0] && !os[1] && !ls[0] && !ls[1], "nothing written on failure");
  release_all(qs, 2), release_all(ks, 2);
  fa_tensor_release(q), fa_tensor_release(k);
  CHECK(host_bytes() == before, "host bytes %zu, before %zu", host_bytes(), before);
}

int main(void) {
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) return 1;
  test_nulls();
  test_ring_equals_attention();
  test_ring_variant();
  test_failures_keep_nothing();
  fa_context_destroy(ctx);
  return tu_summary("test_ring");
}
