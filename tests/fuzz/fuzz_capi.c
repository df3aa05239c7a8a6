/* libFuzzer target for the C API's argument checking (README "Reliability").
 *
 * The input is a little program: each step takes an opcode byte and then
 * the bytes it needs, and makes one C API call on a pool of 8 tensor slots
 * (a slot may be empty: the call then gets NULL) with fuzzed shapes,
 * strides, dtypes, devices, views, option structs (every field, enums out
 * of range included), out-parameters and memory limits.  The invariants,
 * checked after every call (abort() on a violation, which libFuzzer
 * reports with the input that caused it):
 *   - the status is FA_OK or one of the fa_status codes;
 *   - a failure leaves a message starting "flashattn:" and no output
 *     tensor (*out == NULL);
 *   - at the end, with every tensor released, the engine holds no memory
 *     and every wrapped host buffer was released exactly once.
 * Memory errors, leaks and undefined behaviour are ASan's and UBSan's.
 * Shapes stay small (the engine's memory limit is 16 MiB during a run, so
 * a huge shape is an error, not an allocation); a wrap only covers memory
 * the host really has (the C API trusts the host for that).
 *
 *   build (clang): CC=clang cmake -S . -B build-fuzz -DFLASHATTN_SANITIZE=ON -DFLASHATTN_CUDA=OFF \
 *                    -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link && cmake --build build-fuzz --target fuzz_capi
 *   run:           build-fuzz/tests/fuzz_capi -max_total_time=600 corpus/ */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

#define NSLOT 8
#define ARENA_BYTES 65536
#define MEM_LIMIT ((size_t)16 << 20)

static fa_context *ctx;
static fa_tensor *pool[NSLOT];
static _Alignas(64) unsigned char arena[ARENA_BYTES]; /* host memory that wraps cover */
static int wraps_made, wraps_released;

/* ---- reading the input ---------------------------------------------------- */
typedef struct {
  const uint8_t *p;
  size_t n;
} reader;

static uint8_t u8(reader *r) {
  if (!r->n) return 0;
  r->n--;
  return *r->p++;
}

static uint64_t u64(reader *r) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++) v = v << 8 | u8(r);
  return v;
}

/* Mostly small sizes; sometimes any int64. */
static int64_t size_val(reader *r) {
  uint8_t b = u8(r);
  if (b < 200) return b % 9;
  if (b < 240) return b % 40;
  if (b < 250) return -(int64_t)(b % 3) - 1;
  return (int64_t)u64(r);
}

/* Any int64, biased to the interesting ones. */
static int64_t int_val(reader *r) {
  static const int64_t special[] = {0, 1, -1, 2, 3, 7, 16, 64, 4096, 4097, -2, INT64_MAX, INT64_MIN, (int64_t)1 << 31, 1 << 24};
  uint8_t b = u8(r);
  if (b < 200) return special[b % (sizeof special / sizeof *special)];
  return (int64_t)u64(r);
}

static double dbl_val(reader *r) {
  static const double special[] = {0, 1, -1, 0.5, 2, 100, -0.0, 1e-300, 1e300, 0.125};
  uint8_t b = u8(r);
  if (b < 180) return special[b % (sizeof special / sizeof *special)];
  if (b < 200) return b % 2 ? INFINITY : -INFINITY;
  if (b < 210) return NAN;
  uint64_t bits = u64(r);
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

/* A slot index, or -1 for "no tensor" (NULL). */
static int slot_or_null(reader *r) {
  uint8_t b = u8(r);
  return b % 10 < NSLOT ? b % 10 : -1;
}

static fa_tensor *tensor_arg(reader *r) {
  int i = slot_or_null(r);
  return i < 0 ? NULL : pool[i];
}

/* Puts t into a slot (releasing what was there). */
static void keep(reader *r, fa_tensor *t) {
  if (!t) return;
  int i = u8(r) % NSLOT;
  fa_tensor_release(pool[i]);
  pool[i] = t;
}

/* ---- the invariants ---------------------------------------------------------- */
static void violated(const char *what, const char *call, fa_status st) {
  fprintf(stderr, "fuzz_capi: %s: %s returned %d (%s): %s\n", what, call, (int)st, fa_status_name(st),
          fa_context_error(ctx));
  abort();
}

/* A call that returns a status and maybe output tensors (NULL when none). */
static fa_status checked(const char *call, fa_status st, fa_tensor **out1, fa_tensor **out2) {
  if ((unsigned)st > FA_ERR_BACKEND) violated("a status out of range", call, st);
  if (st != FA_OK) {
    if (strncmp(fa_context_error(ctx), "flashattn:", 10) != 0) violated("a message without flashattn:", call, st);
    if ((out1 && *out1) || (out2 && *out2)) violated("an output tensor on failure", call, st);
  }
  return st;
}
#define CALL(expr, o1, o2) checked(#expr, (expr), (o1), (o2))

static void on_release(void *data, void *user) {
  (void)data;
  (void)user;
  wraps_released++;
}

/* ---- steps ------------------------------------------------------------------------ */
/* Where a call puts its result: &v, or now and then NULL (an error). */
static fa_tensor **result(reader *r, fa_tensor **v) { return u8(r) % 16 == 0 ? NULL : v; }

static void read_shape(reader *r, int *ndim, int64_t shape[FA_MAX_DIMS + 1]) {
  *ndim = u8(r) % 6; /* 0 and 5 are invalid */
  for (int i = 0; i < FA_MAX_DIMS + 1; i++) shape[i] = i < *ndim ? size_val(r) : 1;
}

static void step_new(reader *r) {
  int ndim;
  int64_t shape[FA_MAX_DIMS + 1];
  read_shape(r, &ndim, shape);
  fa_dtype dtype = (fa_dtype)(u8(r) % 6);
  fa_device device = (fa_device)(u8(r) % 3);
  fa_tensor *t = NULL;
  if (CALL(fa_tensor_empty(ctx, ndim, u8(r) % 32 ? shape : NULL, dtype, device, result(r, &t)), &t, NULL) != FA_OK)
    return;
  uint8_t how = u8(r);
  if (how % 3 == 0) CALL(fa_tensor_fill(ctx, t, dbl_val(r)), NULL, NULL);
  else CALL(fa_tensor_fill_random(ctx, t, (fa_fill_kind)(how % 5), u64(r)), NULL, NULL);
  keep(r, t);
}

static void step_wrap(reader *r) {
  int ndim = 1 + u8(r) % 4;
  fa_dtype dtype = (fa_dtype)(u8(r) % 5);
  int64_t shape[FA_MAX_DIMS], strides[FA_MAX_DIMS];
  int with_strides = u8(r) & 1;
  int64_t last = 0; /* the element offset of the last element */
  for (int i = 0; i < ndim; i++) {
    shape[i] = u8(r) % 9;
    strides[i] = u8(r) % 17;
    if (shape[i] > 0) last += (shape[i] - 1) * strides[i];
  }
  size_t es = fa_dtype_size(dtype);
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) numel *= shape[i];
  if (!with_strides) last = numel - 1;
  if (numel > 0 && (last + 1) * (int64_t)es > ARENA_BYTES) return; /* more than the host has: not a test of ours */
  size_t off = (size_t)(u8(r) % 16) * 8;
  if (numel > 0 && off + (size_t)(last + 1) * es > ARENA_BYTES) off = 0;
  fa_tensor *t = NULL;
  int expect_release = 1;
  if (CALL(fa_tensor_wrap(ctx, arena + off, FA_CPU, dtype, ndim, shape, with_strides ? strides : NULL, on_release,
                          NULL, &t),
           &t, NULL) != FA_OK)
    expect_release = 0;
  wraps_made += expect_release;
  keep(r, t);
}

static void step_view(reader *r) {
  fa_tensor *t = tensor_arg(r), *v = NULL;
  fa_tensor **pv = result(r, &v);
  switch (u8(r) % 7) {
  case 0: {
    int ndim;
    int64_t shape[FA_MAX_DIMS + 1];
    read_shape(r, &ndim, shape);
    if (u8(r) % 4 == 0 && ndim > 0) shape[u8(r) % ndim] = -1;
    CALL(fa_tensor_view(ctx, t, ndim, u8(r) % 16 ? shape : NULL, pv), &v, NULL);
    break;
  }
  case 1: CALL(fa_tensor_select(ctx, t, (int)(int8_t)u8(r), int_val(r), pv), &v, NULL); break;
  case 2: CALL(fa_tensor_narrow(ctx, t, (int)(int8_t)u8(r) % 5, int_val(r), int_val(r), pv), &v, NULL); break;
  case 3: CALL(fa_tensor_transpose(ctx, t, (int)(int8_t)u8(r) % 5, (int)(int8_t)u8(r) % 5, pv), &v, NULL); break;
  case 4: CALL(fa_tensor_contiguous(ctx, t, pv), &v, NULL); break;
  case 5: CALL(fa_tensor_to(ctx, t, (fa_dtype)(u8(r) % 6), (fa_device)(u8(r) % 3), pv), &v, NULL); break;
  default: CALL(fa_tensor_clone(ctx, t, pv), &v, NULL); break;
  }
  keep(r, v);
}

static void step_elements(reader *r) {
  fa_tensor *t = tensor_arg(r), *b = tensor_arg(r), *res = NULL;
  int64_t idx[FA_MAX_DIMS];
  double v = 0, buf[512];
  int ok = 0;
  for (int i = 0; i < FA_MAX_DIMS; i++) idx[i] = u8(r) % 2 ? int_val(r) : u8(r) % 4;
  int null_out = u8(r) % 16 == 0; /* a NULL place for the result */
  double *pv = null_out ? NULL : &v;
  switch (u8(r) % 10) {
  case 0: CALL(fa_tensor_get(ctx, t, null_out ? NULL : idx, &v), NULL, NULL); break;
  case 1: CALL(fa_tensor_set(ctx, t, null_out ? NULL : idx, dbl_val(r)), NULL, NULL); break;
  case 2: CALL(fa_tensor_copy(ctx, t, b), NULL, NULL); break;
  case 3: CALL(fa_tensor_reduce(ctx, t, (fa_reduce_op)(u8(r) % 5), pv), NULL, NULL); break;
  case 4: CALL(fa_tensor_isfinite(ctx, t, null_out ? NULL : &ok), NULL, NULL); break;
  case 5:
    CALL(fa_tensor_binary(ctx, t, (fa_binary_op)(u8(r) % 5), b, dbl_val(r), result(r, &res)), &res, NULL);
    keep(r, res);
    break;
  case 6:
    CALL(fa_rel_error(ctx, t, b, pv), NULL, NULL);
    CALL(fa_max_abs_diff(ctx, t, b, pv), NULL, NULL);
    break;
  case 7:
    if (!t || fa_tensor_numel(t) <= 512) CALL(fa_tensor_read_f64(ctx, t, null_out ? NULL : buf), NULL, NULL);
    break;
  case 8:
    if (!t || fa_tensor_numel(t) <= 512) {
      for (int i = 0; i < 512; i++) buf[i] = (double)(i % 7) - 3.0;
      CALL(fa_tensor_write_f64(ctx, t, null_out ? NULL : buf), NULL, NULL);
    }
    break;
  default:
    if (u8(r) % 2) CALL(fa_tensor_fill(ctx, t, dbl_val(r)), NULL, NULL);
    else CALL(fa_tensor_fill_random(ctx, t, (fa_fill_kind)(u8(r) % 5), u64(r)), NULL, NULL);
    break;
  }
}

static void step_attention(reader *r) {
  fa_tensor *q = tensor_arg(r), *k = tensor_arg(r), *v = tensor_arg(r), *o = NULL, *lse = NULL;
  fa_attention_opts opts;
  fa_attention_opts_init(&opts);
  int64_t lens[8];
  double slopes[8];
  uint8_t fields = u8(r), more = u8(r);
  if (fields & 1) opts.algo = (fa_attention_algo)(int8_t)u8(r) % 7;
  if (fields & 2) opts.has_scale = 1, opts.scale = dbl_val(r);
  if (fields & 4) opts.causal = (fa_causal)(int8_t)u8(r) % 5;
  if (fields & 8) opts.has_window = 1, opts.window_left = int_val(r), opts.window_right = int_val(r);
  if (fields & 16) opts.mask = tensor_arg(r);
  if (fields & 32) { /* kv_lens: n entries of an array that really holds them */
    opts.n_kv_lens = u8(r) % 9;
    for (int i = 0; i < 8; i++) lens[i] = u8(r) % 2 ? int_val(r) : u8(r) % 10;
    opts.kv_lens = lens;
  }
  if (fields & 64) {
    opts.n_alibi = u8(r) % 9;
    for (int i = 0; i < 8; i++) slopes[i] = dbl_val(r);
    opts.alibi = slopes;
  }
  if (fields & 128) opts.softcap = dbl_val(r);
  if (more & 1) opts.tile_q = int_val(r), opts.tile_k = int_val(r);
  if (more & 2) opts.return_lse = 1;
  if (more & 4) opts.out = tensor_arg(r);
  if (more & 8) opts.lse_out = tensor_arg(r);
  int want_lse = (more & 16) != 0;
  const fa_attention_opts *po = (more & 32) ? NULL : &opts;
  fa_cost c;
  switch (more >> 6) {
  case 0:
    CALL(fa_attention(ctx, q, k, v, po, result(r, &o), want_lse ? &lse : NULL), &o, &lse);
    break;
  case 1:
    CALL(fa_attention_reference(ctx, q, k, v, po, result(r, &o), want_lse ? &lse : NULL), &o, &lse);
    break;
  default:
    CALL(fa_cost_attention(ctx, q, k, v, po, u8(r) % 16 ? &c : NULL), NULL, NULL);
    break;
  }
  keep(r, o);
  keep(r, lse);
}

static void step_softmax(reader *r) {
  fa_tensor *x = tensor_arg(r), *y = NULL;
  fa_softmax_opts opts;
  fa_softmax_opts_init(&opts);
  uint8_t fields = u8(r);
  if (fields & 1) opts.algo = (fa_softmax_algo)(int8_t)u8(r) % 7;
  if (fields & 2) opts.block = int_val(r);
  if (fields & 4) opts.out = tensor_arg(r);
  fa_cost c;
  if (fields & 8) CALL(fa_cost_softmax(ctx, x, (fields & 16) ? NULL : &opts, (fields & 32) ? NULL : &c), NULL, NULL);
  else CALL(fa_softmax(ctx, x, (fields & 16) ? NULL : &opts, result(r, &y)), &y, NULL);
  keep(r, y);
}

static void step_matmul(reader *r) {
  fa_tensor *a = tensor_arg(r), *b = tensor_arg(r), *c = NULL;
  fa_matmul_opts opts;
  fa_matmul_opts_init(&opts);
  uint8_t fields = u8(r);
  if (fields & 1) opts.algo = (fa_matmul_algo)(int8_t)u8(r) % 6;
  if (fields & 2) opts.tile = int_val(r);
  if (fields & 4) opts.out = tensor_arg(r);
  CALL(fa_matmul(ctx, a, b, (fields & 8) ? NULL : &opts, result(r, &c)), &c, NULL);
  keep(r, c);
}

static void step_merge(reader *r) {
  fa_tensor *o1 = tensor_arg(r), *l1 = tensor_arg(r), *o2 = tensor_arg(r), *l2 = tensor_arg(r), *o = NULL, *l = NULL;
  CALL(fa_merge_states(ctx, o1, l1, o2, l2, result(r, &o), result(r, &l)), &o, &l);
  keep(r, o);
  keep(r, l);
}

static void step_misc(reader *r) {
  switch (u8(r) % 6) {
  case 0: { /* a tight limit for the next steps */
    size_t cur;
    fa_memory(FA_CPU, &cur, NULL);
    fa_set_memory_limit(FA_CPU, cur + 1 + (size_t)(u8(r) % 64) * 64); /* 0 would mean no limit */
    break;
  }
  case 1: fa_set_memory_limit(FA_CPU, MEM_LIMIT); break;
  case 2: { /* release a slot */
    int i = u8(r) % NSLOT;
    fa_tensor_release(pool[i]);
    pool[i] = NULL;
    break;
  }
  case 3: { /* an extra reference, dropped at once */
    fa_tensor *t = tensor_arg(r);
    fa_tensor_retain(t);
    fa_tensor_release(t);
    break;
  }
  case 4: {
    fa_device_info_t info;
    CALL(fa_device_info(ctx, (fa_device)(u8(r) % 3), u8(r) % 8 ? &info : NULL), NULL, NULL);
    break;
  }
  default: CALL(fa_context_set_device(ctx, (fa_device)(u8(r) % 3)), NULL, NULL); break;
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) abort();
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size};
  fa_set_memory_limit(FA_CPU, MEM_LIMIT);
  fa_context_set_device(ctx, FA_CPU);
  wraps_made = wraps_released = 0;
  for (int steps = 0; r.n > 0 && steps < 64; steps++) {
    switch (u8(&r) % 9) {
    case 0: step_new(&r); break;
    case 1: step_wrap(&r); break;
    case 2: step_view(&r); break;
    case 3: step_elements(&r); break;
    case 4: step_attention(&r); break;
    case 5: step_softmax(&r); break;
    case 6: step_matmul(&r); break;
    case 7: step_merge(&r); break;
    default: step_misc(&r); break;
    }
  }
  for (int i = 0; i < NSLOT; i++) {
    fa_tensor_release(pool[i]);
    pool[i] = NULL;
  }
  fa_set_memory_limit(FA_CPU, 0);
  size_t cur;
  fa_memory(FA_CPU, &cur, NULL);
  if (cur != 0) {
    fprintf(stderr, "fuzz_capi: the engine holds %zu bytes with every tensor released (leak)\n", cur);
    abort();
  }
  if (wraps_released != wraps_made) {
    fprintf(stderr, "fuzz_capi: %d wrapped buffers, %d released\n", wraps_made, wraps_released);
    abort();
  }
  return 0;
}
