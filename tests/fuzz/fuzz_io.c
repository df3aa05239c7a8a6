/* libFuzzer target over the .npy and .safetensors readers (API §7,
 * docs/io.md).  Every input is given to both, through the buffer entry
 * points (the same code the file readers run, with the source's end at
 * the input's end).  The invariants, checked after each read (abort() on a
 * violation, which libFuzzer reports with the input):
 *   - a failure leaves "flashattn: load 'buffer': ..." and returns nothing;
 *   - a success returns tensors of 1 to 4 dimensions whose bytes lie within
 *     the input, and for safetensors distinct names in ascending order;
 *   - the engine holds the same memory before and after.
 * Reads past the input, leaks and undefined behaviour are ASan's and
 * UBSan's.  The engine's memory limit is 64 MiB during a run, so a huge
 * shape is an error, not an allocation.
 *
 *   build (clang): see tests/fuzz/fuzz_capi.c; --target fuzz_io
 *   run:           build-fuzz/tests/fuzz_io -max_total_time=600 corpus/ tests/fuzz/corpus_io */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

static fa_context *ctx;

static void fail(const char *why) {
  fprintf(stderr, "fuzz_io: %s (%s)\n", why, fa_context_error(ctx));
  abort();
}

static void check_failure(fa_status st, int returned) {
  static const char prefix[] = "flashattn: load 'buffer': ";
  if (strncmp(fa_context_error(ctx), prefix, sizeof prefix - 1) != 0) fail("message does not name the buffer");
  if (st > FA_ERR_BACKEND) fail("unknown status");
  if (returned) fail("a failed read returned something");
}

static size_t tensor_bytes(const fa_tensor *t) {
  if (fa_tensor_ndim(t) < 1 || fa_tensor_ndim(t) > FA_MAX_DIMS) fail("rank out of range");
  return (size_t)fa_tensor_numel(t) * fa_dtype_size(fa_tensor_dtype(t));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static const uint8_t none = 0;
  if (!ctx) {
    if (fa_context_create(FA_CPU, &ctx) != FA_OK) abort();
    fa_set_memory_limit(FA_CPU, (size_t)64 << 20);
  }
  if (!data) data = &none; /* an empty input */
  size_t before, after;
  fa_memory(FA_CPU, &before, NULL);

  fa_tensor *t = (fa_tensor *)&none; /* must be cleared on failure */
  fa_status st = fa_load_npy_buffer(ctx, data, size, FA_CPU, &t);
  if (st) check_failure(st, t != NULL);
  else if (!t || tensor_bytes(t) > size) fail("npy: a tensor larger than the input");
  if (!st) fa_tensor_release(t);

  char **names = (char **)&none;
  fa_tensor **ts = (fa_tensor **)&none;
  size_t count = 1;
  st = fa_load_safetensors_buffer(ctx, data, size, FA_CPU, &names, &ts, &count);
  if (st) {
    check_failure(st, names || ts || count);
  } else {
    size_t total = 0;
    for (size_t i = 0; i < count; i++) {
      if (!ts[i] || !names[i]) fail("safetensors: a NULL entry");
      if (i && strcmp(names[i - 1], names[i]) >= 0) fail("safetensors: names not ascending");
      total += tensor_bytes(ts[i]);
    }
    if (total > size) fail("safetensors: tensors larger than the input");
    fa_safetensors_free(names, ts, count);
  }

  fa_memory(FA_CPU, &after, NULL);
  if (after != before) fail("engine memory kept");
  return 0;
}
