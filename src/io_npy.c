/* .npy files (numpy's format, versions 1.0 to 3.0): the magic "\x93NUMPY",
 * a version, a little-endian header length, then a Python dict literal
 * {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with
 * spaces and a newline, then the elements.  The dict is read by a strict
 * parser of exactly that grammar: nothing of it is ever evaluated. */
#include "io_internal.h"

#include <string.h>

typedef struct {
  const char *p, *start, *end;
} cursor;

typedef struct {
  char descr[8];
  int has_descr, has_fortran, has_shape;
  int fortran;
  int ndim; /* may exceed FA_MAX_DIMS: only the first dims are kept */
  int64_t shape[FA_MAX_DIMS];
} npy_header;

static void skip_ws(cursor *c) {
  while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static int eat(cursor *c, char ch) {
  skip_ws(c);
  if (c->p < c->end && *c->p == ch) {
    c->p++;
    return 1;
  }
  return 0;
}

static fa_status bad(fa_io_src *s, const cursor *c, const char *expected) {
  return fa_io_fail(s, FA_ERR_ARGUMENT, "malformed npy header at byte %d of the dict: expected %s",
                    (int)(c->p - c->start), expected);
}

/* A quoted Python string without escapes (numpy writes none in these fields). */
static fa_status read_str(fa_io_src *s, cursor *c, const char **str, size_t *len) {
  skip_ws(c);
  if (c->p >= c->end || (*c->p != '\'' && *c->p != '"')) return bad(s, c, "a quoted string");
  char q = *c->p++;
  const char *b = c->p;
  while (c->p < c->end && *c->p != q) {
    if (*c->p == '\\' || (unsigned char)*c->p < 0x20) return bad(s, c, "a plain string (no escapes)");
    c->p++;
  }
  if (c->p >= c->end) return bad(s, c, "the closing quote");
  *str = b;
  *len = (size_t)(c->p - b);
  c->p++;
  return FA_OK;
}

/* A non-negative decimal integer (Python 2's numpy wrote a trailing L). */
static fa_status read_int(fa_io_src *s, cursor *c, int64_t *v) {
  skip_ws(c);
  if (c->p >= c->end || *c->p < '0' || *c->p > '9') return bad(s, c, "a non-negative integer");
  if (*c->p == '0' && c->p + 1 < c->end && c->p[1] >= '0' && c->p[1] <= '9')
    return bad(s, c, "an integer without leading zeros (Python's literal)");
  int64_t x = 0;
  while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
    int d = *c->p++ - '0';
    if (x > (INT64_MAX - d) / 10)
      return fa_io_fail(s, FA_ERR_ARGUMENT, "npy header: a shape size does not fit in 64 bits");
    x = x * 10 + d;
  }
  if (c->p < c->end && *c->p == 'L') c->p++;
  *v = x;
  return FA_OK;
}

static fa_status read_shape(fa_io_src *s, cursor *c, npy_header *h) {
  if (!eat(c, '(')) return bad(s, c, "'(' opening the shape tuple");
  h->ndim = 0;
  if (eat(c, ')')) return FA_OK;
  for (;;) {
    int64_t v = 0;
    fa_status st = read_int(s, c, &v);
    if (st) return st;
    if (h->ndim < FA_MAX_DIMS) h->shape[h->ndim] = v;
    if (h->ndim < 1000) h->ndim++; /* counted only to be named in the error */
    skip_ws(c);
    if (h->ndim == 1 && c->p < c->end && *c->p == ')')
      return bad(s, c, "',' after the one size of a 1-D shape: (n,) is a tuple, (n) a number");
    if (eat(c, ')')) return FA_OK;
    if (!eat(c, ',')) return bad(s, c, "',' or ')' in the shape tuple");
    if (eat(c, ')')) return FA_OK; /* (n,) */
  }
}

static fa_status parse_dict(fa_io_src *s, const char *text, size_t n, npy_header *h) {
  cursor c = {text, text, text + n};
  memset(h, 0, sizeof *h);
  if (!eat(&c, '{')) return bad(s, &c, "'{'");
  while (!eat(&c, '}')) {
    const char *key;
    size_t klen;
    fa_status st = read_str(s, &c, &key, &klen);
    if (st) return st;
    if (!eat(&c, ':')) return bad(s, &c, "':' after a key");
    int *seen;
    if (klen == 5 && memcmp(key, "descr", 5) == 0) {
      const char *d;
      size_t dlen;
      if (eat(&c, '[') || eat(&c, '('))
        return fa_io_fail(s, FA_ERR_DTYPE, "npy: structured dtypes are not supported (f4, f2, f8 or b1 only)");
      if ((st = read_str(s, &c, &d, &dlen))) return st;
      if (dlen >= sizeof h->descr) dlen = sizeof h->descr - 1; /* still refused below, shown cut */
      memcpy(h->descr, d, dlen);
      h->descr[dlen] = 0;
      seen = &h->has_descr;
    } else if (klen == 13 && memcmp(key, "fortran_order", 13) == 0) {
      skip_ws(&c);
      if ((size_t)(c.end - c.p) >= 4 && memcmp(c.p, "True", 4) == 0) h->fortran = 1, c.p += 4;
      else if ((size_t)(c.end - c.p) >= 5 && memcmp(c.p, "False", 5) == 0) h->fortran = 0, c.p += 5;
      else return bad(s, &c, "True or False");
      seen = &h->has_fortran;
    } else if (klen == 5 && memcmp(key, "shape", 5) == 0) {
      if ((st = read_shape(s, &c, h))) return st;
      seen = &h->has_shape;
    } else {
      return fa_io_fail(s, FA_ERR_ARGUMENT, "npy header: unexpected key '%.*s' (expected descr, fortran_order, shape)",
                        (int)(klen > 40 ? 40 : klen), key);
    }
    if (*seen) return fa_io_fail(s, FA_ERR_ARGUMENT, "npy header: key '%.*s' appears twice", (int)klen, key);
    *seen = 1;
    if (eat(&c, '}')) break;
    if (!eat(&c, ',')) return bad(s, &c, "',' or '}'");
  }
  skip_ws(&c);
  if (c.p != c.end) return bad(s, &c, "only spaces and a newline after the dict");
  if (!h->has_descr || !h->has_fortran || !h->has_shape)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "npy header: missing key '%s'",
                      !h->has_descr ? "descr" : !h->has_fortran ? "fortran_order" : "shape");
  return FA_OK;
}

/* descr -> dtype; *swap when the file's byte order is not the machine's. */
static fa_status parse_descr(fa_io_src *s, const char *descr, fa_dtype *dt, int *swap) {
  static const struct {
    const char *code;
    fa_dtype dt;
  } kinds[] = {{"f4", FA_F32}, {"f2", FA_F16}, {"f8", FA_F64}, {"b1", FA_BOOL}};
  char order = descr[0];
  for (size_t i = 0; i < sizeof kinds / sizeof *kinds; i++) {
    if (!order || strcmp(descr + 1, kinds[i].code) != 0) continue;
    int one_byte = kinds[i].dt == FA_BOOL;
    if (order == '<' || order == '>' || (order == '|' && one_byte)) {
      *dt = kinds[i].dt;
      *swap = !one_byte && (order == '>') == fa_io_little_endian();
      return FA_OK;
    }
  }
  return fa_io_fail(s, FA_ERR_DTYPE,
                    "npy: dtype '%s' is not supported (expected '<f4', '<f2', '<f8', '|b1', or '>' for big-endian)",
                    descr);
}

fa_status fa_npy_read(fa_io_src *s, fa_device device, fa_tensor **out) {
  *out = NULL;
  unsigned char pre[12];
  fa_status st = fa_io_read(s, 0, pre, 10, "the npy magic and version");
  if (st) return st;
  if (memcmp(pre, "\x93NUMPY", 6) != 0)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "not an npy file (it does not start with \\x93NUMPY)");
  uint64_t hlen, prefix;
  if (pre[7] != 0)
    return fa_io_fail(s, FA_ERR_UNSUPPORTED, "npy format version %d.%d is not supported (1.0, 2.0, 3.0)", pre[6],
                      pre[7]);
  if (pre[6] == 1) {
    hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
    prefix = 10;
  } else if (pre[6] == 2 || pre[6] == 3) {
    if ((st = fa_io_read(s, 10, pre + 10, 2, "the npy header length"))) return st;
    hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 | (uint64_t)pre[11] << 24;
    prefix = 12;
  } else {
    return fa_io_fail(s, FA_ERR_UNSUPPORTED, "npy format version %d.%d is not supported (1.0, 2.0, 3.0)", pre[6],
                      pre[7]);
  }
  if (hlen > FA_NPY_MAX_HEADER)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "npy header of %llu bytes is larger than the %u this reader accepts",
                      (unsigned long long)hlen, FA_NPY_MAX_HEADER);
  char *text = fa_host_alloc(s->ctx, (size_t)hlen, &st);
  if (!text) return fa_io_wrap(s, st);
  npy_header h;
  st = fa_io_read(s, prefix, text, (size_t)hlen, "the npy header");
  if (!st) st = parse_dict(s, text, (size_t)hlen, &h);
  fa_host_free(text, (size_t)hlen);
  if (st) return st;
  fa_dtype dt = FA_F32;
  int swap = 0;
  if ((st = parse_descr(s, h.descr, &dt, &swap))) return st;
  if (h.fortran)
    return fa_io_fail(s, FA_ERR_UNSUPPORTED,
                      "npy: Fortran (column-major) order is not supported; save a C-order array "
                      "(numpy.ascontiguousarray)");
  if (h.ndim < 1 || h.ndim > FA_MAX_DIMS)
    return fa_io_fail(s, FA_ERR_SHAPE, "npy: %d dimensions: tensors have 1 to %d", h.ndim, FA_MAX_DIMS);
  /* the element count against what the file holds, before any multiplication can overflow */
  uint64_t esize = fa_dtype_size(dt), avail = s->size - prefix - hlen, fit = avail / esize, n = 1;
  int empty = 0;
  for (int i = 0; i < h.ndim; i++) {
    uint64_t d = (uint64_t)h.shape[i];
    if (!d) empty = 1;
    else if (n > fit / d) n = fit + 1; /* more than the file holds; stays a bound */
    else n *= d;
  }
  if (empty) n = 0;
  if (n > fit)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "truncated: the shape needs more than the %llu data bytes the file has",
                      (unsigned long long)avail);
  if (n * esize != avail)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "%llu bytes after the data (the shape needs %llu): not one npy array",
                      (unsigned long long)(avail - n * esize), (unsigned long long)(n * esize));
  fa_tensor *t;
  if ((st = fa_tensor_new(s->ctx, h.ndim, h.shape, dt, FA_CPU, &t))) return fa_io_wrap(s, st);
  if (!(st = fa_io_read(s, prefix + hlen, fa_tensor_ptr(t), (size_t)(n * esize), "the data"))) {
    if (swap) fa_io_swap(fa_tensor_ptr(t), (size_t)esize, (int64_t)n);
    if (dt == FA_BOOL) fa_io_normalize_bool(fa_tensor_ptr(t), (int64_t)n);
    st = fa_io_wrap(s, fa_io_place(s, &t, device));
  }
  if (st) fa_tensor_drop(&t);
  *out = t;
  return st;
}

/* ---- writing ---------------------------------------------------------------- */

fa_status fa_save_npy(fa_context *ctx, const char *path, fa_tensor *t) {
  FA_NEED(ctx);
  FA_NEED(path);
  FA_NEED(t);
  fa_io_src s = {.ctx = ctx, .op = "save", .label = path};
  fa_tensor *c;
  fa_status st = fa_io_check_save_path(&s, path, FA_FILE_NPY);
  if (st) return st;
  st = fa_io_host_copy(&s, t, 1, &c);
  if (st) return fa_io_wrap(&s, st);
  static const char *const descr[] = {[FA_F32] = "<f4", [FA_F16] = "<f2", [FA_F64] = "<f8", [FA_BOOL] = "|b1"};
  char dims[128] = "", head[256];
  size_t used = 0;
  for (int i = 0; i < c->ndim; i++)
    used += (size_t)snprintf(dims + used, sizeof dims - used, "%s%lld", i ? ", " : "", (long long)c->shape[i]);
  if (c->ndim == 1) snprintf(dims + used, sizeof dims - used, ",");
  int len = snprintf(head + 10, sizeof head - 10, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr[c->dtype], dims);
  /* spaces and a newline up to a multiple of 64 bytes, as numpy pads */
  size_t total = (10 + (size_t)len + 1 + 63) / 64 * 64, hlen = total - 10;
  memcpy(head, "\x93NUMPY\x01\x00", 8);
  head[8] = (char)(hlen & 0xff);
  head[9] = (char)(hlen >> 8);
  memset(head + 10 + len, ' ', hlen - (size_t)len - 1);
  head[total - 1] = '\n';
  if (!(st = fa_io_create(&s, ctx, path))) {
    st = fa_io_write(&s, head, total);
    if (!st) st = fa_io_write_tensor(&s, c);
    st = fa_io_finish(&s, path, st);
  }
  fa_tensor_release(c);
  return st;
}
