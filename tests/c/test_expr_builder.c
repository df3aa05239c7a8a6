/* Attention variants built from C (fa_expr_builder, API §9 for hosts):
 * the §9 examples built node by node and evaluated against their closed
 * forms, an attention call with them against the built-in options, every
 * misuse kept and reported once, tensors held past their owner's release,
 * nothing leaked. */
#include "testutil.h"

#include "../../src/expr.h"

#include <math.h>

static int op2(fa_expr_builder *x, const char *op, int a, int b) { return fa_expr_apply(x, op, a, b); }

/* The first misuse comes back from fa_expr_build as an argument error naming it. */
static void expect_misuse(fa_context *ctx, fa_expr_builder *x, const char *what) {
  fa_expr *e = NULL;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_build(x, 0, &e));
  CHECK(e == NULL, "no expression after a misuse");
  CHECK(strstr(fa_context_error(ctx), what) != NULL, "message '%s' names '%s'", fa_context_error(ctx), what);
  fa_expr_builder_free(x);
}

int main(void) {
  fa_context *ctx = NULL;
  if (fa_context_create(FA_CPU, &ctx)) return 1;
  const size_t base = tu_mem_now();
  fa_expr_builder *x = NULL;

  tu_test = "rules"; /* the shared table (src/expr.h) is positional: each operation at its place */
  const struct {
    int op;
    const char *name;
  } named[] = {{FA_X_ADD, "+"}, {FA_X_POW, "^"},   {FA_X_NEG, "neg"}, {FA_X_FLOOR, "floor"}, {FA_X_MIN, "min"},
               {FA_X_LT, "lt"}, {FA_X_EQ, "eq"},   {FA_X_NE, "ne"},   {FA_X_AND, "and"},     {FA_X_NOT, "not"}};
  for (size_t i = 0; i < sizeof named / sizeof named[0]; i++)
    CHECK(fa_expr_rule_of(named[i].op)->name && strcmp(fa_expr_rule_of(named[i].op)->name, named[i].name) == 0,
          "op %d is %s", named[i].op, named[i].name);
  CHECK(!fa_expr_rule_of(FA_X_WHERE)->name && !fa_expr_rule_of(FA_X_LOAD)->name && !fa_expr_rule_of(FA_X_K)->name &&
            !fa_expr_rule_of(FA_X_COUNT),
        "no names for the rest");

  tu_test = "examples";
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  const int s = fa_expr_arg(x, "s"), h = fa_expr_arg(x, "h"), q = fa_expr_arg(x, "q"), k = fa_expr_arg(x, "k");
  /* alibi: s - slopes[h] * |q - k| */
  double sl[2] = {0.5, 0.25};
  int64_t two = 2;
  fa_tensor *slopes = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, sl, FA_CPU, FA_F64, 1, &two, NULL, NULL, NULL, &slopes));
  const int slope = fa_expr_load(x, slopes, "slopes", 1, &h);
  fa_tensor_release(slopes); /* the builder holds its own reference */
  const int alibi = op2(x, "-", s, op2(x, "*", slope, fa_expr_apply(x, "abs", op2(x, "-", q, k), -1)));
  /* softcap: tanh(s / 30) * 30 */
  const int thirty = fa_expr_number(x, 30);
  const int softcap = op2(x, "*", fa_expr_apply(x, "tanh", op2(x, "/", s, thirty), -1), thirty);
  /* causal and a sliding window of 3: q >= k and q - k <= 3 */
  const int causal = op2(x, "ge", q, k);
  const int sliding = op2(x, "and", causal, op2(x, "le", op2(x, "-", q, k), fa_expr_number(x, 3)));
  /* document: doc[q] == doc[k] and q >= k */
  float docs[6] = {1, 1, 1, 2, 2, 3};
  int64_t six = 6;
  fa_tensor *doc = NULL;
  CHECK_OK(ctx, fa_tensor_wrap(ctx, docs, FA_CPU, FA_F32, 1, &six, NULL, NULL, NULL, &doc));
  const int document = op2(x, "and", op2(x, "eq", fa_expr_load(x, doc, "doc", 1, &q), fa_expr_load(x, doc, NULL, 1, &k)), causal);
  /* fa.where(q > 2, s, -s) */
  const int flip = fa_expr_where(x, op2(x, "gt", q, fa_expr_number(x, 2)), s, fa_expr_apply(x, "neg", s, -1));
  fa_expr *e_alibi = NULL, *e_softcap = NULL, *e_sliding = NULL, *e_doc = NULL, *e_flip = NULL;
  CHECK_OK(ctx, fa_expr_build(x, alibi, &e_alibi));
  CHECK_OK(ctx, fa_expr_build(x, softcap, &e_softcap));
  CHECK_OK(ctx, fa_expr_build(x, sliding, &e_sliding));
  CHECK_OK(ctx, fa_expr_build(x, document, &e_doc));
  CHECK_OK(ctx, fa_expr_build(x, flip, &e_flip));
  fa_expr_builder_free(x);
  fa_tensor_release(doc); /* the expression holds its own reference */
  /* 0-based positions in fa_expr_eval; the expressions see 1-based ones */
  CHECK(fabs(fa_expr_eval(e_alibi, 1, 0, 1, 5, 1) - (1 - 0.25 * 4)) < 1e-15, "alibi");
  CHECK(fabs(fa_expr_eval(e_softcap, 45, 0, 0, 0, 0) - 30 * tanh(1.5)) < 1e-12, "softcap");
  CHECK(fa_expr_eval(e_sliding, 0, 0, 0, 5, 2) == 1 && fa_expr_eval(e_sliding, 0, 0, 0, 5, 1) == 0 &&
            fa_expr_eval(e_sliding, 0, 0, 0, 2, 3) == 0,
        "sliding");
  CHECK(fa_expr_eval(e_doc, 0, 0, 0, 2, 0) == 1 && fa_expr_eval(e_doc, 0, 0, 0, 3, 2) == 0 &&
            fa_expr_eval(e_doc, 0, 0, 0, 4, 3) == 1,
        "document");
  CHECK(fa_expr_eval(e_flip, 2, 0, 0, 2, 0) == 2 && fa_expr_eval(e_flip, 2, 0, 0, 1, 0) == -2, "where");

  tu_test = "attention";
  int64_t shape[4] = {1, 2, 40, 8};
  fa_tensor *tq = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 1), *tk = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 2),
            *tv = tu_randn(ctx, 4, shape, FA_F32, FA_CPU, 3);
  fa_attention_opts o, ref;
  fa_attention_opts_init(&o);
  fa_attention_opts_init(&ref);
  o.mask_mod = e_sliding, o.score_mod = e_alibi;
  ref.causal = FA_CAUSAL_TOP_LEFT, ref.has_window = 1, ref.window_left = 3, ref.window_right = 0;
  ref.alibi = sl, ref.n_alibi = 2;
  fa_tensor *o1 = NULL, *o2 = NULL;
  double diff = 1;
  CHECK_OK(ctx, fa_attention(ctx, tq, tk, tv, &o, &o1, NULL));
  CHECK_OK(ctx, fa_attention(ctx, tq, tk, tv, &ref, &o2, NULL));
  if (o1 && o2) CHECK_OK(ctx, fa_max_abs_diff(ctx, o1, o2, &diff));
  CHECK(diff < 1e-5, "built variant vs options: %g", diff);
  fa_tensor_release(o1);
  fa_tensor_release(o2);
  o.mask_mod = e_alibi; /* a number where a boolean is needed */
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, tq, tk, tv, &o, &o1, NULL));
  fa_tensor_release(tq);
  fa_tensor_release(tk);
  fa_tensor_release(tv);

  tu_test = "misuse";
  const struct {
    const char *op, *what;
    int kinds; /* 0: two numbers, 1: two booleans, 2: a number and a boolean */
  } bad[] = {{"and", "and needs booleans", 0}, {"+", "+ needs numbers", 1}, {"eq", "eq compares", 2},
             {"not", "not needs booleans", 0}, {"tanh", "tanh needs numbers", 1}, {"xor", "unknown operation", 0}};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
    const int n = fa_expr_number(x, 1), t = fa_expr_boolean(x, 1);
    const int a = bad[i].kinds == 1 ? t : n, b = bad[i].kinds == 0 ? n : t;
    CHECK(fa_expr_apply(x, bad[i].op, a, b) == -1, "%s refused", bad[i].op);
    CHECK(fa_expr_number(x, 2) == -1 && fa_expr_arg(x, "q") == -1, "every later call refused");
    expect_misuse(ctx, x, bad[i].what);
  }
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  CHECK(fa_expr_apply(x, "+", 0, 1) == -1, "operands that are no nodes");
  expect_misuse(ctx, x, "not a node");
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  CHECK(fa_expr_apply(x, NULL, fa_expr_arg(x, "q"), -1) == -1, "a NULL operation");
  expect_misuse(ctx, x, "unknown operation NULL");
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  CHECK(fa_expr_arg(x, "z") == -1, "unknown argument");
  expect_misuse(ctx, x, "unknown argument \"z\"");
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  CHECK(fa_expr_arg(x, NULL) == -1, "NULL argument");
  expect_misuse(ctx, x, "unknown argument NULL");
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  {
    const int n = fa_expr_number(x, 1);
    CHECK(fa_expr_where(x, n, n, n) == -1, "a number as the condition");
  }
  expect_misuse(ctx, x, "condition is a number");
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  {
    const int c = fa_expr_boolean(x, 0), n = fa_expr_number(x, 1);
    CHECK(fa_expr_where(x, c, n, c) == -1, "where of two kinds");
  }
  expect_misuse(ctx, x, "chooses between a number and a boolean");
  /* tensor reads */
  int64_t sh2[2] = {2, 3};
  fa_tensor *m2 = tu_randn(ctx, 2, sh2, FA_F32, FA_CPU, 4);
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  {
    const int i1 = fa_expr_arg(x, "h");
    CHECK(fa_expr_load(x, m2, "bias", 1, &i1) == -1, "one index for a 2-D tensor");
  }
  expect_misuse(ctx, x, "1 indices for a 2-D tensor");
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  {
    const int ix[2] = {fa_expr_arg(x, "h"), fa_expr_boolean(x, 1)};
    CHECK(fa_expr_load(x, m2, "bias", 2, ix) == -1, "a boolean index");
  }
  expect_misuse(ctx, x, "index 2 is a boolean");
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  {
    const int i1 = fa_expr_arg(x, "h");
    CHECK(fa_expr_load(x, NULL, "bias", 1, &i1) == -1, "a NULL tensor");
  }
  expect_misuse(ctx, x, "the tensor is NULL");
  /* more than 16 tensors, more than 4096 nodes */
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  {
    fa_tensor *many[17];
    const int64_t one = 1;
    const int i1 = fa_expr_number(x, 1);
    int last = 0;
    for (int i = 0; i < 17; i++) {
      many[i] = tu_randn(ctx, 1, &one, FA_F32, FA_CPU, 10 + i);
      last = fa_expr_load(x, many[i], NULL, 1, &i1);
    }
    CHECK(last == -1, "a 17th tensor refused");
    for (int i = 0; i < 17; i++) fa_tensor_release(many[i]);
  }
  expect_misuse(ctx, x, "more than 16 tensors");
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  {
    int last = 0;
    for (int i = 0; i <= 4096; i++) last = fa_expr_number(x, i);
    CHECK(last == -1, "node 4097 refused");
  }
  expect_misuse(ctx, x, "more than 4096 nodes");
  /* fa_expr_build's own checks */
  CHECK_OK(ctx, fa_expr_builder_new(ctx, &x));
  fa_expr *none = NULL;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_build(x, 0, &none));
  fa_expr_number(x, 1);
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_build(x, 1, &none));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_build(x, 0, NULL));
  CHECK(none == NULL, "nothing built");
  fa_expr_builder_free(x);
  CHECK(fa_expr_build(NULL, 0, &none) == FA_ERR_ARGUMENT, "a NULL builder to build");
  CHECK(fa_expr_number(NULL, 1) == -1 && fa_expr_apply(NULL, "+", 0, 0) == -1 && fa_expr_where(NULL, 0, 0, 0) == -1 &&
            fa_expr_load(NULL, m2, NULL, 0, NULL) == -1 && fa_expr_arg(NULL, "q") == -1 && fa_expr_boolean(NULL, 1) == -1,
        "a NULL builder");
  fa_expr_builder_free(NULL);
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_expr_builder_new(ctx, NULL));
  fa_tensor_release(m2);

  fa_expr_free(e_alibi);
  fa_expr_free(e_softcap);
  fa_expr_free(e_sliding);
  fa_expr_free(e_doc);
  fa_expr_free(e_flip);
  CHECK(tu_mem_now() == base, "host bytes %zu, were %zu", tu_mem_now(), base);
  fa_context_destroy(ctx);
  return tu_summary("test_expr_builder");
}
