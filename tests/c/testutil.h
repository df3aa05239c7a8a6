/* Check macros shared by the C tests in tests/c/ (the newer ones): a
 * failing check prints where and why and the test goes on; main returns
 * test_summary(). */
#ifndef FA_TESTUTIL_H
#define FA_TESTUTIL_H

#include <stdio.h>
#include <string.h>

#include "flashattn.h"

static int tu_failures = 0, tu_checks = 0;
static const char *tu_test = "";

#define CHECK(cond, ...)                                                                      \
  do {                                                                                        \
    tu_checks++;                                                                              \
    if (!(cond)) {                                                                            \
      tu_failures++;                                                                          \
      fprintf(stderr, "FAIL %s (%s:%d): %s: ", tu_test, __FILE__, __LINE__, #cond);          \
      fprintf(stderr, __VA_ARGS__);                                                           \
      fprintf(stderr, "\n");                                                                  \
    }                                                                                         \
  } while (0)

#define CHECK_OK(ctx, call)                                                                            \
  do {                                                                                                 \
    fa_status st_ = (call);                                                                            \
    CHECK(st_ == FA_OK, "%s returned %s: %s", #call, fa_status_name(st_), fa_context_error(ctx));     \
  } while (0)

/* The call must fail with `want` and leave a "flashattn:" message. */
#define CHECK_STATUS(ctx, want, call)                                                                    \
  do {                                                                                                   \
    fa_status st_ = (call);                                                                              \
    CHECK(st_ == (want), "%s returned %s, expected %s (%s)", #call, fa_status_name(st_),                \
          fa_status_name(want), st_ == FA_OK ? "" : fa_context_error(ctx));                              \
    if (st_ != FA_OK)                                                                                    \
      CHECK(strncmp(fa_context_error(ctx), "flashattn:", 10) == 0, "message %s", fa_context_error(ctx)); \
  } while (0)

/* A tensor of standard normal values (NULL when that fails). */
static inline fa_tensor *tu_randn(fa_context *ctx, int ndim, const int64_t *shape, fa_dtype dtype, fa_device dev,
                                  uint64_t seed) {
  fa_tensor *t = NULL;
  if (fa_tensor_empty(ctx, ndim, shape, dtype, dev, &t) || fa_tensor_fill_random(ctx, t, FA_FILL_NORMAL, seed)) {
    fa_tensor_release(t);
    return NULL;
  }
  return t;
}

static inline size_t tu_mem_now(void) {
  size_t cur, peak;
  fa_memory(FA_CPU, &cur, &peak);
  return cur;
}

static inline int tu_summary(const char *name) {
  printf("%s: %d checks, %d failures\n", name, tu_checks, tu_failures);
  return tu_failures ? 1 : 0;
}

#endif
