/* The paged KV cache and opts.splits through the C API (issue 24, API §8):
 * append (ragged) and attend against fa_attention_reference on each
 * sequence's concatenated keys, capacity and pool errors that write
 * nothing, reset, NULL arguments, no leak; splits equal to the unsplit
 * call.  Runs on the CPU (and on CUDA when FLASHATTN_DEVICE=cuda). */
#include <math.h>
#include <stdlib.h>

#include "testutil.h"

static fa_device dev = FA_CPU;

static fa_tensor *randn(fa_context *ctx, int64_t a, int64_t b, int64_t c, int64_t d, uint64_t seed) {
  const int64_t shape[4] = {a, b, c, d};
  return tu_randn(ctx, 4, shape, FA_F32, dev, seed);
}

/* max |a - b| over (possibly -inf) values: -inf must match -inf. */
static double diff(fa_context *ctx, fa_tensor *a, fa_tensor *b) {
  int64_t n = fa_tensor_numel(a);
  if (n != fa_tensor_numel(b)) return INFINITY;
  double *x = malloc(sizeof(double) * (size_t)(n ? n : 1)), *y = malloc(sizeof(double) * (size_t)(n ? n : 1));
  double m = 0;
  if (fa_tensor_read_f64(ctx, a, x) || fa_tensor_read_f64(ctx, b, y)) m = INFINITY;
  for (int64_t i = 0; i < n && m < INFINITY; i++) {
    if (isinf(x[i]) || isinf(y[i])) {
      if (x[i] != y[i]) m = INFINITY;
    } else if (!(fabs(x[i] - y[i]) <= m)) {
      m = fabs(x[i] - y[i]);
    }
  }
  free(x), free(y);
  return m;
}

/* The reference of sequence b: q[b] against K[b, :, :L], V[b, :, :L] of the model tensors. */
static double check_seq(fa_context *ctx, fa_tensor *q, fa_tensor *km, fa_tensor *vm, int64_t b, int64_t L,
                        const fa_attention_opts *op, fa_tensor *o, fa_tensor *lse) {
  fa_tensor *qb = NULL, *kb = NULL, *vb = NULL, *k1 = NULL, *v1 = NULL, *ro = NULL, *rl = NULL, *ob = NULL, *lb = NULL;
  double m = INFINITY;
  if (!fa_tensor_narrow(ctx, q, 0, b, 1, &qb) && !fa_tensor_narrow(ctx, km, 0, b, 1, &k1) &&
      !fa_tensor_narrow(ctx, vm, 0, b, 1, &v1) && !fa_tensor_narrow(ctx, k1, 2, 0, L, &kb) &&
      !fa_tensor_narrow(ctx, v1, 2, 0, L, &vb) && !fa_attention_reference(ctx, qb, kb, vb, op, &ro, &rl) &&
      !fa_tensor_narrow(ctx, o, 0, b, 1, &ob) && !fa_tensor_narrow(ctx, lse, 0, b, 1, &lb)) {
    double a = diff(ctx, ob, ro), c = diff(ctx, lb, rl);
    m = a > c ? a : c;
  }
  fa_tensor *all[] = {qb, kb, vb, k1, v1, ro, rl, ob, lb};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) fa_tensor_release(all[i]);
  return m;
}

static void test_cache(fa_context *ctx) {
  tu_test = "cache";
  enum { B = 3, H = 2, HQ = 4, D = 8, DV = 4, CAP = 20 };
  for (int64_t ps = 1; ps <= 16; ps = ps == 1 ? 3 : ps == 3 ? 16 : 17) {
    fa_kv_cache_opts co;
    fa_kv_cache_opts_init(&co);
    co.batch = B, co.heads = H, co.dim = D, co.dim_v = DV, co.capacity = CAP, co.page_size = ps, co.device = dev;
    fa_kv_cache *c = NULL;
    CHECK_OK(ctx, fa_kv_cache_create(ctx, &co, &c));
    if (!c) return;
    /* the model: K and V of each sequence, contiguous, on the device */
    fa_tensor *km = randn(ctx, B, H, CAP, D, 1), *vm = randn(ctx, B, H, CAP, DV, 2);
    int64_t lens_now[B] = {0, 0, 0};
    const int64_t steps[3][B] = {{5, 0, 2}, {1, 1, 1}, {4, 7, 0}};
    for (int s = 0; s < 3; s++) {
      const int64_t n = 7;
      fa_tensor *k = randn(ctx, B, H, n, D, 10 + (uint64_t)s), *v = randn(ctx, B, H, n, DV, 20 + (uint64_t)s);
      CHECK_OK(ctx, fa_kv_cache_append(ctx, c, k, v, steps[s], B));
      for (int64_t b = 0; b < B; b++) { /* the same positions into the model */
        fa_tensor *kb = NULL, *kk = NULL, *dst = NULL, *d1 = NULL;
        for (int w = 0; w < 2; w++) {
          fa_tensor *src = w ? v : k, *mod = w ? vm : km;
          if (!steps[s][b]) continue;
          if (!fa_tensor_narrow(ctx, src, 0, b, 1, &kb) && !fa_tensor_narrow(ctx, kb, 2, 0, steps[s][b], &kk) &&
              !fa_tensor_narrow(ctx, mod, 0, b, 1, &d1) && !fa_tensor_narrow(ctx, d1, 2, lens_now[b], steps[s][b], &dst))
            CHECK_OK(ctx, fa_tensor_copy(ctx, dst, kk));
          fa_tensor_release(kb), fa_tensor_release(kk), fa_tensor_release(dst), fa_tensor_release(d1);
          kb = kk = dst = d1 = NULL;
        }
        lens_now[b] += steps[s][b];
      }
      int64_t got[B];
      CHECK_OK(ctx, fa_kv_cache_lengths(ctx, c, got));
      for (int64_t b = 0; b < B; b++) CHECK(got[b] == lens_now[b], "seq %lld: %lld, expected %lld", (long long)b, (long long)got[b], (long long)lens_now[b]);
      for (int causal = 0; causal < 2; causal++) {
        fa_tensor *q = randn(ctx, B, HQ, 3, D, 30 + (uint64_t)s), *o = NULL, *lse = NULL;
        fa_attention_opts op;
        fa_attention_opts_init(&op);
        op.causal = causal ? FA_CAUSAL_BOTTOM_RIGHT : FA_CAUSAL_NONE;
        op.return_lse = 1;
        CHECK_OK(ctx, fa_kv_cache_attend(ctx, c, q, &op, &o, &lse));
        for (int64_t b = 0; o && lse && b < B; b++) {
          double m = check_seq(ctx, q, km, vm, b, lens_now[b], &op, o, lse);
          CHECK(m < 1e-4, "page %lld step %d causal %d seq %lld: max diff %g", (long long)ps, s, causal, (long long)b, m);
        }
        fa_tensor_release(q), fa_tensor_release(o), fa_tensor_release(lse);
      }
      fa_tensor_release(k), fa_tensor_release(v);
    }
    /* past capacity: nothing written */
    fa_kv_cache_info before, after;
    CHECK_OK(ctx, fa_kv_cache_get_info(ctx, c, &before));
    fa_tensor *k = randn(ctx, B, H, 12, D, 40), *v = randn(ctx, B, H, 12, DV, 41);
    const int64_t too_many[B] = {11, 0, 0}; /* 10 + 11 > 20 */
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_append(ctx, c, k, v, too_many, B));
    CHECK(strstr(fa_context_error(ctx), "capacity") != NULL, "%s", fa_context_error(ctx));
    const int64_t bad_len[B] = {0, 13, 0};
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_append(ctx, c, k, v, bad_len, B));
    CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_kv_cache_append(ctx, c, k, v, bad_len, 2));
    CHECK_STATUS(ctx, FA_ERR_SHAPE, fa_kv_cache_append(ctx, c, v, v, NULL, 0));
    CHECK_OK(ctx, fa_kv_cache_get_info(ctx, c, &after));
    CHECK(after.free_pages == before.free_pages, "free pages %lld -> %lld", (long long)before.free_pages, (long long)after.free_pages);
    int64_t got[B];
    CHECK_OK(ctx, fa_kv_cache_lengths(ctx, c, got));
    for (int64_t b = 0; b < B; b++) CHECK(got[b] == lens_now[b], "seq %lld changed", (long long)b);
    /* reset one, then all: pages back */
    CHECK_OK(ctx, fa_kv_cache_reset(ctx, c, 1));
    CHECK_OK(ctx, fa_kv_cache_lengths(ctx, c, got));
    CHECK(got[1] == 0 && got[0] == lens_now[0], "reset(1)");
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_reset(ctx, c, B));
    CHECK_OK(ctx, fa_kv_cache_reset(ctx, c, -1));
    CHECK_OK(ctx, fa_kv_cache_get_info(ctx, c, &after));
    CHECK(after.free_pages == after.pages, "reset all: %lld of %lld free", (long long)after.free_pages, (long long)after.pages);
    fa_tensor_release(k), fa_tensor_release(v), fa_tensor_release(km), fa_tensor_release(vm);
    fa_kv_cache_destroy(c);
  }
}

static void test_pool_and_nulls(fa_context *ctx) {
  tu_test = "pool";
  fa_kv_cache_opts co;
  fa_kv_cache_opts_init(&co);
  co.batch = 2, co.heads = 1, co.dim = 4, co.capacity = 8, co.page_size = 2, co.pages = 3, co.device = dev;
  fa_kv_cache *c = NULL;
  CHECK_OK(ctx, fa_kv_cache_create(ctx, &co, &c));
  fa_tensor *k = randn(ctx, 2, 1, 4, 4, 50);
  CHECK_STATUS(ctx, FA_ERR_OUT_OF_MEMORY, fa_kv_cache_append(ctx, c, k, k, NULL, 0)); /* 4 pages > 3 */
  CHECK(strstr(fa_context_error(ctx), "pool") != NULL, "%s", fa_context_error(ctx));
  const int64_t fit[2] = {4, 2};
  CHECK_OK(ctx, fa_kv_cache_append(ctx, c, k, k, fit, 2));
  fa_tensor *q = randn(ctx, 2, 1, 1, 4, 51), *o = NULL, *lse = NULL;
  fa_attention_opts op;
  fa_attention_opts_init(&op);
  op.kv_lens = fit, op.n_kv_lens = 2;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_attend(ctx, c, q, &op, &o, &lse));
  CHECK(strstr(fa_context_error(ctx), "kv_lens") != NULL, "%s", fa_context_error(ctx));
  CHECK(o == NULL && lse == NULL, "nothing returned");
  /* NULLs */
  fa_kv_cache *c2 = c;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_create(ctx, NULL, &c2));
  CHECK(c2 == NULL, "create failure clears *out");
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_append(ctx, NULL, k, k, NULL, 0));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_append(ctx, c, NULL, k, NULL, 0));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_attend(ctx, c, NULL, NULL, &o, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_attend(ctx, c, q, NULL, NULL, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_lengths(ctx, c, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_reset(ctx, NULL, -1));
  fa_kv_cache_info info;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_get_info(ctx, NULL, &info));
  CHECK(info.batch == -1, "NULL cache info");
  co.capacity = 0;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_kv_cache_create(ctx, &co, &c2));
  fa_kv_cache_destroy(NULL);
  fa_kv_cache_destroy(c);
  fa_tensor_release(k), fa_tensor_release(q);
}

static void test_splits(fa_context *ctx) {
  tu_test = "splits";
  fa_tensor *q = randn(ctx, 2, 4, 2, 16, 60), *k = randn(ctx, 2, 2, 45, 16, 61), *v = randn(ctx, 2, 2, 45, 8, 62);
  const int64_t kv[2] = {45, 17};
  const double alibi[4] = {0.1, 0.2, 0.3, 0.4};
  for (int rule = 0; rule < 4; rule++) {
    fa_attention_opts op;
    fa_attention_opts_init(&op);
    CHECK(op.splits == 0, "init: auto");
    op.return_lse = 1;
    if (rule == 1) op.causal = FA_CAUSAL_BOTTOM_RIGHT, op.has_window = 1, op.window_left = 5, op.window_right = 0;
    if (rule == 2) op.kv_lens = kv, op.n_kv_lens = 2, op.causal = FA_CAUSAL_BOTTOM_RIGHT;
    if (rule == 3) op.alibi = alibi, op.n_alibi = 4, op.softcap = 2;
    fa_tensor *o1 = NULL, *l1 = NULL;
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &op, &o1, &l1));
    for (int64_t s = 2; s <= 9; s += 7) {
      fa_tensor *o = NULL, *l = NULL;
      op.splits = s;
      CHECK_OK(ctx, fa_attention(ctx, q, k, v, &op, &o, &l));
      if (o && l && o1 && l1) {
        double a = diff(ctx, o, o1), b = diff(ctx, l, l1);
        CHECK(a < 1e-5 && b < 1e-5, "rule %d splits %lld: %g %g", rule, (long long)s, a, b);
      }
      fa_tensor_release(o), fa_tensor_release(l);
    }
    op.splits = -1;
    fa_tensor *o = NULL;
    CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_attention(ctx, q, k, v, &op, &o, NULL));
    fa_tensor_release(o1), fa_tensor_release(l1);
    /* top_left: the CPU's pieces count keys from their start; on cuda past the decode kernel's Lq it is
     * refused (Lq = 2 here: the decode kernel takes it) */
    op.splits = 1, op.causal = FA_CAUSAL_TOP_LEFT, o1 = l1 = NULL;
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &op, &o1, &l1));
    op.splits = 3;
    fa_tensor *l = NULL;
    CHECK_OK(ctx, fa_attention(ctx, q, k, v, &op, &o, &l));
    if (o && l && o1 && l1)
      CHECK(diff(ctx, o, o1) < 1e-5 && diff(ctx, l, l1) < 1e-5, "rule %d top_left splits 3: %g %g", rule,
            diff(ctx, o, o1), diff(ctx, l, l1));
    fa_tensor_release(o), fa_tensor_release(l), fa_tensor_release(o1), fa_tensor_release(l1);
  }
  fa_tensor_release(q), fa_tensor_release(k), fa_tensor_release(v);
}

int main(void) {
  const char *d = getenv("FLASHATTN_DEVICE");
  if (d && fa_device_parse(d, &dev)) dev = FA_CPU;
  fa_context *ctx = NULL;
  if (fa_context_create(dev, &ctx) != FA_OK) {
    printf("test_kv_cache: device %s not available, skipped\n", fa_device_name(dev));
    return 0;
  }
  size_t before = tu_mem_now();
  test_cache(ctx);
  test_pool_and_nulls(ctx);
  test_splits(ctx);
  CHECK(tu_mem_now() == before, "engine memory %zu, expected %zu (a leak)", tu_mem_now(), before);
  fa_context_destroy(ctx);
  return tu_summary("test_kv_cache");
}
