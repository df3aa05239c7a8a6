/* .npy and .safetensors through the C API (API §7, docs/io.md): round
 * trips of every dtype and rank (views and, when a GPU is there, cuda
 * tensors too), files built byte by byte as numpy and the safetensors
 * library write them, and malformed, truncated and hostile files: each
 * one an error naming the file, nothing returned, no engine memory kept. */
#define _POSIX_C_SOURCE 200809L /* mkdtemp, access */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

#include "testutil.h"

static fa_context *ctx;
static char dir[256];

static const char *tmp_path(const char *name) {
  static char buf[512];
  snprintf(buf, sizeof buf, "%s/%s", dir, name);
  return buf;
}

static fa_tensor *random_tensor(fa_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, ndim, shape, dt, FA_CPU, &t));
  if (!t) return NULL;
  if (dt == FA_BOOL) {
    int64_t n = fa_tensor_numel(t);
    double *v = calloc((size_t)n + 1, sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)((i * 7 + (int64_t)seed) % 3 == 0);
    CHECK_OK(ctx, fa_tensor_write_f64(ctx, t, v));
    free(v);
  } else {
    CHECK_OK(ctx, fa_tensor_fill_random(ctx, t, FA_FILL_NORMAL, seed));
  }
  return t;
}

static int same_shape(const fa_tensor *a, const fa_tensor *b) {
  if (fa_tensor_ndim(a) != fa_tensor_ndim(b)) return 0;
  for (int i = 0; i < fa_tensor_ndim(a); i++)
    if (fa_tensor_size(a, i) != fa_tensor_size(b, i)) return 0;
  return 1;
}

static void check_equal(fa_tensor *got, fa_tensor *want, const char *what) {
  CHECK(got && same_shape(got, want), "%s: shape", what);
  if (!got || !same_shape(got, want)) return;
  double d = -1;
  CHECK_OK(ctx, fa_max_abs_diff(ctx, got, want, &d));
  CHECK(d == 0, "%s: max |diff| %g", what, d);
}

/* ---- round trips ------------------------------------------------------------ */

static const fa_dtype all_dtypes[] = {FA_F32, FA_F16, FA_BF16, FA_F64, FA_BOOL};
static const int64_t shapes[4][4] = {{7}, {3, 5}, {2, 3, 4}, {2, 1, 3, 2}};

static void test_npy_round_trip(fa_device device) {
  tu_test = "npy round trip";
  for (size_t d = 0; d < 5; d++)
    for (int r = 1; r <= 4; r++) {
      fa_tensor *t = random_tensor(all_dtypes[d], r, shapes[r - 1], 10 * d + (uint64_t)r), *src = t, *back = NULL;
      if (device == FA_CUDA) CHECK_OK(ctx, fa_tensor_to(ctx, t, fa_tensor_dtype(t), FA_CUDA, &src));
      CHECK_OK(ctx, fa_save_npy(ctx, tmp_path("rt.npy"), src));
      CHECK_OK(ctx, fa_load_npy(ctx, tmp_path("rt.npy"), device, &back));
      /* numpy has no bf16: it is written as f32, exactly */
      fa_dtype want = all_dtypes[d] == FA_BF16 ? FA_F32 : all_dtypes[d];
      CHECK(fa_tensor_dtype(back) == want, "dtype %s -> %s", fa_dtype_name(all_dtypes[d]),
            fa_dtype_name(fa_tensor_dtype(back)));
      CHECK(fa_tensor_device(back) == device, "device");
      check_equal(back, t, fa_dtype_name(all_dtypes[d]));
      if (src != t) fa_tensor_release(src);
      fa_tensor_release(back);
      fa_tensor_release(t);
    }
  /* a transposed view and an empty tensor */
  int64_t s2[2] = {3, 4}, s0[3] = {2, 0, 3};
  fa_tensor *t = random_tensor(FA_F32, 2, s2, 5), *v = NULL, *back = NULL;
  CHECK_OK(ctx, fa_tensor_transpose(ctx, t, 0, 1, &v));
  CHECK_OK(ctx, fa_save_npy(ctx, tmp_path("view.npy"), v));
  CHECK_OK(ctx, fa_load_npy(ctx, tmp_path("view.npy"), FA_CPU, &back));
  check_equal(back, v, "transposed view");
  fa_tensor_release(back);
  fa_tensor_release(v);
  fa_tensor_release(t);
  t = random_tensor(FA_F16, 3, s0, 1);
  CHECK_OK(ctx, fa_save_npy(ctx, tmp_path("empty.npy"), t));
  back = NULL;
  CHECK_OK(ctx, fa_load_npy(ctx, tmp_path("empty.npy"), FA_CPU, &back));
  CHECK(back && fa_tensor_numel(back) == 0 && fa_tensor_size(back, 1) == 0, "empty tensor");
  fa_tensor_release(back);
  fa_tensor_release(t);
}

static void test_safetensors_round_trip(fa_device device) {
  tu_test = "safetensors round trip";
  const char *names[8] = {"z.last", "a/first", "caf\xc3\xa9 \"q\"\\\n", "bf16", "f64", "bool", "view", "empty"};
  fa_tensor *ts[8], *src[8];
  int64_t s0[2] = {0, 5};
  for (int i = 0; i < 5; i++) ts[i] = random_tensor(all_dtypes[i], i % 4 + 1, shapes[i % 4], 100 + (uint64_t)i);
  fa_tensor *base = random_tensor(FA_F32, 3, shapes[2], 7);
  CHECK_OK(ctx, fa_tensor_transpose(ctx, base, 0, 2, &ts[5]));
  CHECK_OK(ctx, fa_tensor_narrow(ctx, base, 2, 1, 2, &ts[6]));
  ts[7] = random_tensor(FA_F64, 2, s0, 1);
  for (int i = 0; i < 8; i++) {
    src[i] = ts[i];
    if (device == FA_CUDA) CHECK_OK(ctx, fa_tensor_to(ctx, ts[i], fa_tensor_dtype(ts[i]), FA_CUDA, &src[i]));
  }
  CHECK_OK(ctx, fa_save_safetensors(ctx, tmp_path("rt.safetensors"), 8, names, src));
  char **got_names = NULL;
  fa_tensor **got = NULL;
  size_t n = 0;
  CHECK_OK(ctx, fa_load_safetensors(ctx, tmp_path("rt.safetensors"), device, &got_names, &got, &n));
  CHECK(n == 8, "count %zu", n);
  for (size_t i = 1; i < n; i++) CHECK(strcmp(got_names[i - 1], got_names[i]) < 0, "sorted: %s", got_names[i]);
  for (size_t i = 0; i < n; i++) {
    int k = 0;
    while (k < 8 && strcmp(names[k], got_names[i]) != 0) k++;
    CHECK(k < 8, "unexpected name '%s'", got_names[i]);
    if (k == 8) continue;
    CHECK(fa_tensor_dtype(got[i]) == fa_tensor_dtype(ts[k]), "%s: dtype", names[k]);
    CHECK(fa_tensor_device(got[i]) == device, "%s: device", names[k]);
    check_equal(got[i], ts[k], names[k]);
  }
  /* a host may take a tensor out and free the rest */
  fa_tensor *kept = n ? got[0] : NULL;
  if (n) got[0] = NULL;
  fa_safetensors_free(got_names, got, n);
  fa_tensor_release(kept);
  for (int i = 0; i < 8; i++) {
    if (src[i] != ts[i]) fa_tensor_release(src[i]);
    fa_tensor_release(ts[i]);
  }
  fa_tensor_release(base);
  /* no tensors at all: a valid file with an empty header */
  CHECK_OK(ctx, fa_save_safetensors(ctx, tmp_path("none.safetensors"), 0, NULL, NULL));
  CHECK_OK(ctx, fa_load_safetensors(ctx, tmp_path("none.safetensors"), FA_CPU, &got_names, &got, &n));
  CHECK(n == 0, "empty file count %zu", n);
  fa_safetensors_free(got_names, got, n);
}

/* ---- files written by hand ---------------------------------------------------- */

/* A version-1.0 npy: magic, header padded to 64 bytes, data. */
static size_t npy_bytes(unsigned char *buf, const char *dict, const void *data, size_t n) {
  size_t len = strlen(dict), total = (10 + len + 1 + 63) / 64 * 64, hlen = total - 10;
  memcpy(buf, "\x93NUMPY\x01\x00", 8);
  buf[8] = (unsigned char)(hlen & 0xff);
  buf[9] = (unsigned char)(hlen >> 8);
  memcpy(buf + 10, dict, len);
  memset(buf + 10 + len, ' ', hlen - len - 1);
  buf[total - 1] = '\n';
  if (n) memcpy(buf + total, data, n);
  return total + n;
}

/* safetensors: 8-byte length, the JSON as given, data. */
static size_t st_bytes(unsigned char *buf, const char *json, const void *data, size_t n) {
  size_t len = strlen(json);
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)len >> (8 * i));
  memcpy(buf + 8, json, len);
  if (n) memcpy(buf + 8 + len, data, n);
  return 8 + len + n;
}

static void test_known_bytes(void) {
  tu_test = "known bytes";
  unsigned char buf[4096];
  fa_tensor *t = NULL;
  double v[6];
  /* numpy's own header for np.array([1.5, -2.0], dtype='<f4') */
  const unsigned char f4[8] = {0, 0, 0xc0, 0x3f, 0, 0, 0, 0xc0};
  size_t n = npy_bytes(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4, 8);
  CHECK(n == 136, "npy size %zu", n); /* numpy pads the header to 128 bytes */
  CHECK_OK(ctx, fa_load_npy_buffer(ctx, buf, n, FA_CPU, &t));
  CHECK(t && fa_tensor_dtype(t) == FA_F32 && fa_tensor_ndim(t) == 1 && fa_tensor_size(t, 0) == 2, "f4 tensor");
  if (t) {
    CHECK_OK(ctx, fa_tensor_read_f64(ctx, t, v));
    CHECK(v[0] == 1.5 && v[1] == -2.0, "values %g %g", v[0], v[1]);
  }
  fa_tensor_release(t);
  /* big-endian f8, shape (1, 2), the L suffix of Python 2 and double quotes */
  const unsigned char be[16] = {0x40, 0x08, 0, 0, 0, 0, 0, 0, 0xbf, 0xf0, 0, 0, 0, 0, 0, 0};
  n = npy_bytes(buf, "{\"descr\": '>f8', 'shape': (1L, 2L), 'fortran_order': False}", be, 16);
  t = NULL;
  CHECK_OK(ctx, fa_load_npy_buffer(ctx, buf, n, FA_CPU, &t));
  if (t) {
    CHECK_OK(ctx, fa_tensor_read_f64(ctx, t, v));
    CHECK(fa_tensor_dtype(t) == FA_F64 && v[0] == 3.0 && v[1] == -1.0, "big-endian f8: %g %g", v[0], v[1]);
  }
  fa_tensor_release(t);
  /* bool, nonzero bytes read as true; f2 */
  const unsigned char b1[3] = {0, 1, 7};
  n = npy_bytes(buf, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", b1, 3);
  t = NULL;
  CHECK_OK(ctx, fa_load_npy_buffer(ctx, buf, n, FA_CPU, &t));
  if (t) {
    CHECK_OK(ctx, fa_tensor_read_f64(ctx, t, v));
    CHECK(fa_tensor_dtype(t) == FA_BOOL && v[0] == 0 && v[1] == 1 && v[2] == 1, "bool %g %g %g", v[0], v[1], v[2]);
  }
  fa_tensor_release(t);
  const unsigned char f2[4] = {0x00, 0x3c, 0x00, 0xc0}; /* 1.0, -2.0 */
  n = npy_bytes(buf, "{'descr': '<f2', 'fortran_order': False, 'shape': (2, 1), }", f2, 4);
  t = NULL;
  CHECK_OK(ctx, fa_load_npy_buffer(ctx, buf, n, FA_CPU, &t));
  if (t) {
    CHECK_OK(ctx, fa_tensor_read_f64(ctx, t, v));
    CHECK(fa_tensor_dtype(t) == FA_F16 && v[0] == 1.0 && v[1] == -2.0, "f2 %g %g", v[0], v[1]);
  }
  fa_tensor_release(t);
  /* version 2.0: a 4-byte header length */
  n = npy_bytes(buf, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", f4, 8);
  memmove(buf + 12, buf + 10, n - 10);
  buf[6] = 2, buf[8] = (unsigned char)(n - 18), buf[9] = 0, buf[10] = 0, buf[11] = 0; /* hlen: all but prefix and data */
  t = NULL;
  CHECK_OK(ctx, fa_load_npy_buffer(ctx, buf, n + 2, FA_CPU, &t));
  CHECK(t && fa_tensor_numel(t) == 2, "version 2.0");
  fa_tensor_release(t);

  /* safetensors as the reference library writes it, __metadata__ skipped,
   * an unknown field passed over, escapes in a name */
  const unsigned char data[10] = {0x80, 0x3f, 0x00, 0x40, 1, 0, 0, 0, 0, 0}; /* bf16 1, 2; bool 1, 0; f16 0 */
  n = st_bytes(buf,
               "{\"__metadata__\":{\"format\":\"pt\",\"nested\":[1,{\"x\":null}]},"
               "\"w\\u00e9\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[0,4],\"extra\":[true, -1.5e3]},"
               "\"m\":{\"shape\":[1,2],\"dtype\":\"BOOL\",\"data_offsets\":[4,6]},"
               "\"z\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[6,10]}}   ",
               data, 10);
  char **names = NULL;
  fa_tensor **ts = NULL;
  size_t count = 0;
  CHECK_OK(ctx, fa_load_safetensors_buffer(ctx, buf, n, FA_CPU, &names, &ts, &count));
  CHECK(count == 3, "count %zu", count);
  if (count == 3) {
    CHECK(strcmp(names[0], "m") == 0 && strcmp(names[1], "w\xc3\xa9") == 0 && strcmp(names[2], "z") == 0,
          "names %s %s %s", names[0], names[1], names[2]);
    CHECK_OK(ctx, fa_tensor_read_f64(ctx, ts[1], v));
    CHECK(fa_tensor_dtype(ts[1]) == FA_BF16 && v[0] == 1.0 && v[1] == 2.0, "bf16 %g %g", v[0], v[1]);
    CHECK_OK(ctx, fa_tensor_read_f64(ctx, ts[0], v));
    CHECK(fa_tensor_dtype(ts[0]) == FA_BOOL && v[0] == 1 && v[1] == 0, "bool");
  }
  fa_safetensors_free(names, ts, count);
}

/* ---- malformed files ------------------------------------------------------------ */

typedef struct {
  const char *what;
  const char *text; /* the dict (npy) or JSON (safetensors) */
  size_t data;      /* data bytes after it (zeros) */
  const char *word; /* a word the message must hold */
} bad_case;

static const bad_case bad_npy[] = {
    {"missing key", "{'descr': '<f4', 'shape': (2,), }", 8, "fortran_order"},
    {"extra key", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", 8, "unexpected key"},
    {"key twice", "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", 8, "twice"},
    {"int dtype", "{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 8, "<i4"},
    {"native order", "{'descr': '=f4', 'fortran_order': False, 'shape': (2,), }", 8, "=f4"},
    {"object dtype", "{'descr': '|O', 'fortran_order': False, 'shape': (2,), }", 16, "|O"},
    {"structured", "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8, "structured"},
    {"fortran", "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16, "Fortran"},
    {"scalar", "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, "0 dimensions"},
    {"5-D", "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 2), }", 8, "5 dimensions"},
    {"truncated data", "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8, "truncated"},
    {"trailing data", "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 8, "after the data"},
    {"huge shape", "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 4611686018427387904), }", 8,
     "truncated"},
    {"overflowing size", "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", 8, "64 bits"},
    {"negative size", "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,), }", 8, "integer"},
    {"open tuple", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, }", 8, "integer"},
    {"open string", "{'descr': '<f4, 'fortran_order': False, 'shape': (2,), }", 8, "malformed"},
    {"escape", "{'descr': '<f\\4', 'fortran_order': False, 'shape': (2,), }", 8, "escape"},
    {"not a dict", "['descr', '<f4']", 8, "'{'"},
    {"python code", "__import__('os').system('true')", 8, "'{'"},
    {"text after", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } x", 8, "after the dict"},
    {"bad bool", "{'descr': '<f4', 'fortran_order': 0, 'shape': (2,), }", 8, "True or False"},
};

static const bad_case bad_st[] = {
    {"not an object", "[1, 2]", 0, "'{'"},
    {"leading space", " {}", 0, "'{'"},
    {"open object", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "malformed"},
    {"int dtype", "{\"a\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "I32"},
    {"scalar", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}", 4, "'a': 0 dimensions"},
    {"5-D", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "'a': 5 dimensions"},
    {"past the end", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, "outside"},
    {"reversed", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, "outside"},
    {"size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}}", 8, "need 8"},
    {"overflowing shape",
     "{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", 8, "more than"},
    {"overlap",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1],"
     "\"data_offsets\":[4,8]}}",
     8, "overlap"},
    {"hole", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, "hole"},
    {"trailing", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8, "after the last"},
    {"duplicate name",
     "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],"
     "\"data_offsets\":[4,8]}}",
     8, "twice"},
    {"field twice", "{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "twice"},
    {"missing field", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, "data_offsets"},
    {"fraction", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 4, "integer"},
    {"negative", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, "integer"},
    {"three offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 4, "data_offsets"},
    {"offset past 2^64", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,18446744073709551616]}}", 4,
     "2^64"},
    {"NUL in a name", "{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "u0000"},
    {"lone surrogate", "{\"\\udc00\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "surrogate"},
    {"bad UTF-8", "{\"\xc3\x28\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "UTF-8"},
    {"overlong UTF-8", "{\"\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "UTF-8"},
    {"control char", "{\"a\nb\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "control"},
    {"bad escape", "{\"a\\x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "escape"},
    {"bad literal", "{\"__metadata__\":tru}", 0, "value"},
    {"bad number", "{\"__metadata__\":{\"a\":1.}}", 0, "digits"},
    {"text after", "{} {}", 0, "after the header"},
    {"entry not object", "{\"a\":[1]}", 0, "'{'"},
};

/* A failure: a status, a message naming the source and `word`, nothing returned. */
static void check_refused(fa_status st, const char *label, const char *word, const char *what, int nothing) {
  const char *msg = fa_context_error(ctx);
  char want[300];
  snprintf(want, sizeof want, "flashattn: load '%s'", label);
  CHECK(st != FA_OK, "%s: accepted", what);
  if (st == FA_OK) return;
  CHECK(strncmp(msg, want, strlen(want)) == 0, "%s: message '%s' does not start with \"%s\"", what, msg, want);
  CHECK(!word || strstr(msg, word), "%s: message '%s' does not say '%s'", what, msg, word);
  CHECK(nothing, "%s: a result was returned", what);
}

static void test_malformed(void) {
  tu_test = "malformed";
  static unsigned char buf[65536 * 2], zeros[64];
  size_t base = tu_mem_now();
  for (size_t i = 0; i < sizeof bad_npy / sizeof *bad_npy; i++) {
    size_t n = npy_bytes(buf, bad_npy[i].text, zeros, bad_npy[i].data);
    fa_tensor *t = NULL;
    check_refused(fa_load_npy_buffer(ctx, buf, n, FA_CPU, &t), "buffer", bad_npy[i].word, bad_npy[i].what, !t);
  }
  for (size_t i = 0; i < sizeof bad_st / sizeof *bad_st; i++) {
    size_t n = st_bytes(buf, bad_st[i].text, zeros, bad_st[i].data);
    char **names = NULL;
    fa_tensor **ts = NULL;
    size_t count = 7;
    fa_status st = fa_load_safetensors_buffer(ctx, buf, n, FA_CPU, &names, &ts, &count);
    check_refused(st, "buffer", bad_st[i].word, bad_st[i].what, !names && !ts && !count);
    if (st == FA_OK) fa_safetensors_free(names, ts, count);
  }
  /* the prefix and lengths themselves */
  fa_tensor *t = NULL;
  check_refused(fa_load_npy_buffer(ctx, buf, 0, FA_CPU, &t), "buffer", "truncated", "empty npy", !t);
  check_refused(fa_load_npy_buffer(ctx, "\x93NUMPZ\x01\x00\x10\x00", 10, FA_CPU, &t), "buffer", "not an npy", "magic", !t);
  check_refused(fa_load_npy_buffer(ctx, "\x93NUMPY\x04\x00\x10\x00", 10, FA_CPU, &t), "buffer", "version 4.0",
                "version", !t);
  check_refused(fa_load_npy_buffer(ctx, "\x93NUMPY\x01\x00\xff\xff{", 11, FA_CPU, &t), "buffer", "truncated",
                "header past the end", !t);
  memcpy(buf, "\x93NUMPY\x02\x00\x00\x00\x10\x00", 12); /* a 1 MiB header length */
  check_refused(fa_load_npy_buffer(ctx, buf, sizeof buf, FA_CPU, &t), "buffer", "65536", "header too large", !t);
  char **names = NULL;
  fa_tensor **ts = NULL;
  size_t count = 0;
  check_refused(fa_load_safetensors_buffer(ctx, "{}", 2, FA_CPU, &names, &ts, &count), "buffer", "truncated",
                "short", !names);
  memcpy(buf, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
  check_refused(fa_load_safetensors_buffer(ctx, buf, 10, FA_CPU, &names, &ts, &count), "buffer", "limit",
                "header length 2^64-1", !names);
  memcpy(buf, "\x00\xe1\xf5\x05\x00\x00\x00\x00{}", 10); /* 100,000,000: within the limit, past the end */
  check_refused(fa_load_safetensors_buffer(ctx, buf, 10, FA_CPU, &names, &ts, &count), "buffer", "truncated",
                "header past the end", !names);
  /* nesting far past the limit, in a metadata value */
  size_t n = 0;
  n += (size_t)sprintf((char *)buf + 8, "{\"__metadata__\":");
  for (int i = 0; i < 1000; i++) buf[8 + n++] = '[';
  for (int i = 0; i < 1000; i++) buf[8 + n++] = ']';
  buf[8 + n++] = '}';
  for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(n >> (8 * i));
  check_refused(fa_load_safetensors_buffer(ctx, buf, n + 8, FA_CPU, &names, &ts, &count), "buffer", "nesting",
                "deep nesting", !names);
  CHECK(tu_mem_now() == base, "engine memory %zu after the refusals, %zu before", tu_mem_now(), base);
}

/* Every prefix of a valid file is refused; every one-byte change is
 * either refused or read (no crash, no leak: ASan and valgrind watch). */
static void test_truncations(void) {
  tu_test = "truncations";
  int64_t s[2] = {3, 4};
  fa_tensor *t = random_tensor(FA_F32, 2, s, 3), *b = random_tensor(FA_BF16, 1, s, 4);
  const char *names[2] = {"t", "b"};
  fa_tensor *ts2[2] = {t, b};
  CHECK_OK(ctx, fa_save_npy(ctx, tmp_path("tr.npy"), t));
  CHECK_OK(ctx, fa_save_safetensors(ctx, tmp_path("tr.safetensors"), 2, names, ts2));
  size_t base = tu_mem_now();
  for (int kind = 0; kind < 2; kind++) {
    unsigned char file[1024];
    FILE *f = fopen(tmp_path(kind ? "tr.safetensors" : "tr.npy"), "rb");
    size_t n = f ? fread(file, 1, sizeof file, f) : 0;
    if (f) fclose(f);
    CHECK(n > 64 && n < sizeof file, "file size %zu", n);
    for (size_t len = 0; len < n; len++) {
      fa_tensor *r = NULL;
      char **nm = NULL;
      fa_tensor **rs = NULL;
      size_t count = 0;
      fa_status st = kind ? fa_load_safetensors_buffer(ctx, file, len, FA_CPU, &nm, &rs, &count)
                          : fa_load_npy_buffer(ctx, file, len, FA_CPU, &r);
      char what[64];
      snprintf(what, sizeof what, "%s prefix of %zu bytes", kind ? "safetensors" : "npy", len);
      check_refused(st, "buffer", NULL, what, !r && !nm);
    }
    for (size_t pos = 0; pos < n; pos++)
      for (int bit = 0; bit < 8; bit += 3) {
        file[pos] ^= (unsigned char)(1 << bit);
        fa_tensor *r = NULL;
        char **nm = NULL;
        fa_tensor **rs = NULL;
        size_t count = 0;
        fa_status st = kind ? fa_load_safetensors_buffer(ctx, file, n, FA_CPU, &nm, &rs, &count)
                            : fa_load_npy_buffer(ctx, file, n, FA_CPU, &r);
        CHECK(st == FA_OK || strncmp(fa_context_error(ctx), "flashattn: load 'buffer': ", 26) == 0, "flip %zu: %s",
              pos, fa_context_error(ctx));
        fa_tensor_release(r);
        fa_safetensors_free(nm, rs, count);
        file[pos] ^= (unsigned char)(1 << bit);
      }
  }
  CHECK(tu_mem_now() == base, "engine memory %zu after the truncations, %zu before", tu_mem_now(), base);
  fa_tensor_release(t);
  fa_tensor_release(b);
}

static void test_files_and_limits(void) {
  tu_test = "files and limits";
  fa_tensor *t = NULL;
  char **names = NULL;
  fa_tensor **ts = NULL;
  size_t count = 0;
  /* the path is named; a directory and a missing file are refused */
  check_refused(fa_load_npy(ctx, tmp_path("missing.npy"), FA_CPU, &t), tmp_path("missing.npy"), "cannot open",
                "missing file", !t);
  check_refused(fa_load_npy(ctx, dir, FA_CPU, &t), dir, "regular file", "a directory", !t);
  check_refused(fa_load_safetensors(ctx, dir, FA_CPU, &names, &ts, &count), dir, "regular file", "a directory", !ts);
  /* a file too short for its own header */
  FILE *f = fopen(tmp_path("short.npy"), "wb");
  if (f) {
    fwrite("\x93NUMPY\x01\x00\x40\x00{'descr'", 1, 17, f);
    fclose(f);
  }
  check_refused(fa_load_npy(ctx, tmp_path("short.npy"), FA_CPU, &t), tmp_path("short.npy"), "truncated", "short file",
                !t);
  /* formats by extension and by content */
  fa_file_format fmt = 0;
  CHECK_OK(ctx, fa_file_format_of(ctx, "no/such/FILE.NPY", &fmt));
  CHECK(fmt == FA_FILE_NPY, "by extension");
  int64_t s[1] = {4};
  fa_tensor *x = random_tensor(FA_F32, 1, s, 9);
  CHECK_OK(ctx, fa_save_npy(ctx, tmp_path("sniff.bin"), x));
  CHECK_OK(ctx, fa_file_format_of(ctx, tmp_path("sniff.bin"), &fmt));
  CHECK(fmt == FA_FILE_NPY, "npy by content");
  const char *one = "x";
  CHECK_OK(ctx, fa_save_safetensors(ctx, tmp_path("sniff.dat"), 1, &one, &x));
  CHECK_OK(ctx, fa_file_format_of(ctx, tmp_path("sniff.dat"), &fmt));
  CHECK(fmt == FA_FILE_SAFETENSORS, "safetensors by content");
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_file_format_of(ctx, "/proc/self/cmdline", &fmt));
  /* saving: refused names and an unwritable path, no file left behind */
  const char *dup[2] = {"a", "a"}, *meta = "__metadata__", *bad = "\xff";
  fa_tensor *two[2] = {x, x};
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_save_safetensors(ctx, tmp_path("dup.safetensors"), 2, dup, two));
  CHECK(strstr(fa_context_error(ctx), "twice") && strstr(fa_context_error(ctx), "dup.safetensors"), "%s",
        fa_context_error(ctx));
  CHECK(access(tmp_path("dup.safetensors"), F_OK) != 0, "a refused save left a file");
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_save_safetensors(ctx, tmp_path("m.safetensors"), 1, &meta, &x));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_save_safetensors(ctx, tmp_path("m.safetensors"), 1, &bad, &x));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_save_safetensors(ctx, tmp_path("m.safetensors"), 1, NULL, &x));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_save_npy(ctx, "/nonexistent-dir/x.npy", x));
  CHECK(strstr(fa_context_error(ctx), "/nonexistent-dir/x.npy"), "%s", fa_context_error(ctx));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_save_npy(ctx, NULL, x));
  /* an empty path (a temporary file was written in the working directory first), and a path whose extension
   * names the other format (fa.load follows the extension: it could not read the file back) */
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_save_npy(ctx, "", x));
  CHECK(strstr(fa_context_error(ctx), "empty"), "%s", fa_context_error(ctx));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_save_npy(ctx, tmp_path("other.SafeTensors"), x));
  CHECK(strstr(fa_context_error(ctx), ".safetensors path"), "%s", fa_context_error(ctx));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_save_safetensors(ctx, tmp_path("other.npy"), 1, &one, &x));
  CHECK(strstr(fa_context_error(ctx), ".npy path"), "%s", fa_context_error(ctx));
  CHECK(access(tmp_path("other.SafeTensors"), F_OK) != 0 && access(tmp_path("other.npy"), F_OK) != 0,
        "a refused save left a file");
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_load_npy(ctx, tmp_path("sniff.bin"), FA_CPU, NULL));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_load_safetensors(ctx, tmp_path("sniff.dat"), FA_CPU, NULL, &ts, &count));
  CHECK_STATUS(ctx, FA_ERR_DEVICE, fa_load_npy(ctx, tmp_path("sniff.bin"), (fa_device)7, &t));
  fa_safetensors_free(NULL, NULL, 0);
  /* the engine's memory limit holds for what a file asks */
  int64_t big[2] = {256, 1024};
  fa_tensor *large = random_tensor(FA_F32, 2, big, 2);
  CHECK_OK(ctx, fa_save_npy(ctx, tmp_path("large.npy"), large));
  CHECK_OK(ctx, fa_save_safetensors(ctx, tmp_path("large.safetensors"), 1, &one, &large));
  fa_tensor_release(large);
  size_t base = tu_mem_now();
  fa_set_memory_limit(FA_CPU, base + 65536);
  CHECK_STATUS(ctx, FA_ERR_OUT_OF_MEMORY, fa_load_npy(ctx, tmp_path("large.npy"), FA_CPU, &t));
  CHECK(strstr(fa_context_error(ctx), "large.npy") && strstr(fa_context_error(ctx), "out of memory"), "%s",
        fa_context_error(ctx));
  CHECK_STATUS(ctx, FA_ERR_OUT_OF_MEMORY, fa_load_safetensors(ctx, tmp_path("large.safetensors"), FA_CPU, &names, &ts,
                                                              &count));
  fa_set_memory_limit(FA_CPU, 0);
  CHECK(tu_mem_now() == base, "engine memory %zu, %zu before", tu_mem_now(), base);
  fa_tensor_release(x);
}

/* fa.load in a state: 1 when it read the file, else 0 with `word` in the error. */
static int lua_load_ok(lua_State *L, const char *p, const char *word) {
  lua_getglobal(L, "flashattn");
  lua_getfield(L, -1, "load");
  lua_pushstring(L, p);
  int ok = lua_pcall(L, 1, 1, 0) == LUA_OK;
  if (!ok) CHECK(strstr(lua_tostring(L, -1), word), "message %s", lua_tostring(L, -1));
  lua_pop(L, 2);
  return ok;
}

/* A sandbox without io keeps fa.load/fa.save from files unless the host allows it. */
static void test_lua_file_access(void) {
  tu_test = "lua file access";
  int64_t s[1] = {2};
  fa_tensor *x = random_tensor(FA_F32, 1, s, 1);
  CHECK_OK(ctx, fa_save_npy(ctx, tmp_path("lua.npy"), x));
  fa_tensor_release(x);
  lua_State *L = luaL_newstate();
  luaL_requiref(L, "_G", luaopen_base, 1);
  luaL_requiref(L, "flashattn", luaopen_flashattn, 1);
  lua_pop(L, 2);
  CHECK(!lua_load_ok(L, tmp_path("lua.npy"), "file access is not available"), "a state without io read a file");
  fa_lua_set_file_access(L, 1);
  CHECK(lua_load_ok(L, tmp_path("lua.npy"), ""), "allowed by the host, refused");
  lua_close(L);
  L = luaL_newstate();
  luaL_openlibs(L);
  luaL_requiref(L, "flashattn", luaopen_flashattn, 1);
  lua_pop(L, 1);
  CHECK(lua_load_ok(L, tmp_path("lua.npy"), ""), "a state with io refused");
  fa_lua_set_file_access(L, 0);
  CHECK(!lua_load_ok(L, tmp_path("lua.npy"), "file access"), "refused by the host, read");
  lua_close(L);
}

int main(void) {
  snprintf(dir, sizeof dir, "%s/fa_test_io_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) return 1;
  size_t base = tu_mem_now();
  test_npy_round_trip(FA_CPU);
  test_safetensors_round_trip(FA_CPU);
  if (fa_backend_available(FA_CUDA)) {
    test_npy_round_trip(FA_CUDA);
    test_safetensors_round_trip(FA_CUDA);
  }
  test_known_bytes();
  test_malformed();
  test_truncations();
  test_files_and_limits();
  test_lua_file_access();
  tu_test = "end";
  CHECK(tu_mem_now() == base, "engine memory %zu at the end, %zu at the start", tu_mem_now(), base);
  fa_context_destroy(ctx);
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return tu_summary("test_io");
}
