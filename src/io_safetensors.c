/* .safetensors files: an 8-byte little-endian header length N, N bytes of
 * JSON {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
 * ..., "__metadata__": {...}}, then the byte buffer the offsets index
 * (relative to its start).  The JSON is read by the small parser below
 * (the C API must not need Lua or a JSON library): strings decoded in
 * place, nesting bounded, every number that matters an exact integer. */
#include "io_internal.h"

#include <stdlib.h>
#include <string.h>

#define FA_JSON_MAX_DEPTH 64

static const struct {
  const char *name;
  fa_dtype dt;
} st_dtypes[] = {{"F32", FA_F32}, {"F16", FA_F16}, {"BF16", FA_BF16}, {"F64", FA_F64}, {"BOOL", FA_BOOL}};

/* The length of the valid UTF-8 sequence at p (0 when it is not one). */
static int utf8_seq(const unsigned char *p, const unsigned char *end) {
  unsigned c = p[0];
  if (c < 0x80) return 1;
  int n = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
  if (!n || end - p < n) return 0;
  uint32_t cp = c & (n == 2 ? 0x1Fu : n == 3 ? 0x0Fu : 0x07u);
  for (int i = 1; i < n; i++) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    cp = cp << 6 | (p[i] & 0x3Fu);
  }
  static const uint32_t min[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < min[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0; /* overlong, out of range, surrogate */
  return n;
}

/* ---- JSON ------------------------------------------------------------------ */

typedef struct {
  fa_io_src *s;
  char *p, *start, *end;
} jcur;

static void jws(jcur *j) {
  while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) j->p++;
}

static fa_status jbad(jcur *j, const char *expected) {
  return fa_io_fail(j->s, FA_ERR_ARGUMENT, "malformed safetensors header at byte %lld of the JSON: expected %s",
                    (long long)(j->p - j->start), expected);
}

static int jeat(jcur *j, char ch) {
  jws(j);
  if (j->p < j->end && *j->p == ch) {
    j->p++;
    return 1;
  }
  return 0;
}

static int hex4(const char *p, uint32_t *v) {
  *v = 0;
  for (int i = 0; i < 4; i++) {
    char c = p[i];
    int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (d < 0) return 0;
    *v = *v << 4 | (uint32_t)d;
  }
  return 1;
}

/* A string, decoded in place (never longer than its text) and NUL-ended. */
static fa_status jstring(jcur *j, char **out, size_t *len) {
  jws(j);
  if (j->p >= j->end || *j->p != '"') return jbad(j, "a string");
  char *w = ++j->p, *begin = w;
  for (;;) {
    if (j->p >= j->end) return jbad(j, "the closing '\"' of a string");
    unsigned char c = (unsigned char)*j->p;
    if (c == '"') break;
    if (c < 0x20) return jbad(j, "no control characters inside a string");
    if (c != '\\') {
      int n = utf8_seq((const unsigned char *)j->p, (const unsigned char *)j->end);
      if (!n) return jbad(j, "valid UTF-8");
      memmove(w, j->p, (size_t)n);
      w += n;
      j->p += n;
      continue;
    }
    if (j->end - j->p < 2) return jbad(j, "an escape after '\\'");
    char e = j->p[1];
    const char *simple = strchr("\"\\/bfnrt", e);
    if (e && simple) {
      *w++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
      j->p += 2;
      continue;
    }
    uint32_t cp, lo;
    if (e != 'u' || j->end - j->p < 6 || !hex4(j->p + 2, &cp)) return jbad(j, "a valid escape");
    j->p += 6;
    if (cp >= 0xD800 && cp <= 0xDBFF) { /* a surrogate pair */
      if (j->end - j->p < 6 || j->p[0] != '\\' || j->p[1] != 'u' || !hex4(j->p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
        return jbad(j, "the low half of a \\u surrogate pair");
      cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
      j->p += 6;
    } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
      return jbad(j, "no lone low surrogate");
    }
    if (cp == 0) return jbad(j, "no \\u0000 (names are C strings)");
    if (cp < 0x80) *w++ = (char)cp;
    else if (cp < 0x800) *w++ = (char)(0xC0 | cp >> 6), *w++ = (char)(0x80 | (cp & 0x3F));
    else if (cp < 0x10000)
      *w++ = (char)(0xE0 | cp >> 12), *w++ = (char)(0x80 | (cp >> 6 & 0x3F)), *w++ = (char)(0x80 | (cp & 0x3F));
    else
      *w++ = (char)(0xF0 | cp >> 18), *w++ = (char)(0x80 | (cp >> 12 & 0x3F)), *w++ = (char)(0x80 | (cp >> 6 & 0x3F)),
      *w++ = (char)(0x80 | (cp & 0x3F));
  }
  j->p++;  /* past the closing quote, which w has not passed: the NUL fits */
  *w = 0;
  *out = begin;
  *len = (size_t)(w - begin);
  return FA_OK;
}

/* A non-negative integer written exactly (no sign, fraction or exponent). */
static fa_status juint(jcur *j, uint64_t *v) {
  jws(j);
  if (j->p >= j->end || *j->p < '0' || *j->p > '9') return jbad(j, "a non-negative integer");
  if (*j->p == '0' && j->end - j->p > 1 && j->p[1] >= '0' && j->p[1] <= '9') return jbad(j, "no leading zeros");
  uint64_t x = 0;
  while (j->p < j->end && *j->p >= '0' && *j->p <= '9') {
    unsigned d = (unsigned)(*j->p - '0');
    if (x > (UINT64_MAX - d) / 10) return jbad(j, "an integer below 2^64");
    x = x * 10 + d;
    j->p++;
  }
  if (j->p < j->end && (*j->p == '.' || *j->p == 'e' || *j->p == 'E')) return jbad(j, "an integer (no fraction or exponent)");
  *v = x;
  return FA_OK;
}

static fa_status jskip(jcur *j, int depth);

static fa_status jskip_number(jcur *j) {
  char *p = j->p;
  if (p < j->end && *p == '-') p++;
  if (p >= j->end || *p < '0' || *p > '9') return jbad(j, "a value");
  if (*p == '0') p++;
  else
    while (p < j->end && *p >= '0' && *p <= '9') p++;
  if (p < j->end && *p == '.') {
    if (++p >= j->end || *p < '0' || *p > '9') return j->p = p, jbad(j, "digits after '.'");
    while (p < j->end && *p >= '0' && *p <= '9') p++;
  }
  if (p < j->end && (*p == 'e' || *p == 'E')) {
    if (++p < j->end && (*p == '+' || *p == '-')) p++;
    if (p >= j->end || *p < '0' || *p > '9') return j->p = p, jbad(j, "digits in the exponent");
    while (p < j->end && *p >= '0' && *p <= '9') p++;
  }
  j->p = p;
  return FA_OK;
}

/* Any JSON value, checked and passed over (__metadata__, unknown fields). */
static fa_status jskip(jcur *j, int depth) {
  jws(j);
  if (j->p >= j->end) return jbad(j, "a value");
  char c = *j->p;
  fa_status st;
  if (c == '{' || c == '[') {
    if (depth >= FA_JSON_MAX_DEPTH) return jbad(j, "at most 64 levels of nesting");
    char close = c == '{' ? '}' : ']';
    j->p++;
    if (jeat(j, close)) return FA_OK;
    do {
      if (c == '{') {
        char *k;
        size_t kl;
        if ((st = jstring(j, &k, &kl))) return st;
        if (!jeat(j, ':')) return jbad(j, "':'");
      }
      if ((st = jskip(j, depth + 1))) return st;
    } while (jeat(j, ','));
    return jeat(j, close) ? FA_OK : jbad(j, c == '{' ? "',' or '}'" : "',' or ']'");
  }
  if (c == '"') {
    char *str;
    size_t n;
    return jstring(j, &str, &n);
  }
  static const char *const words[] = {"true", "false", "null"};
  for (int i = 0; i < 3; i++) {
    size_t n = strlen(words[i]);
    if ((size_t)(j->end - j->p) >= n && memcmp(j->p, words[i], n) == 0) {
      j->p += n;
      return FA_OK;
    }
  }
  return jskip_number(j);
}

/* ---- the header -------------------------------------------------------------- */

typedef struct {
  char *name; /* in the header text, decoded */
  size_t name_len;
  fa_dtype dt;
  int ndim;
  int64_t shape[FA_MAX_DIMS];
  uint64_t begin, end;
} st_entry;

static fa_status entry_fail(fa_io_src *s, fa_status st, const st_entry *e, const char *fmt, const char *detail) {
  return fa_io_fail(s, st, "tensor '%.*s': %s%s", (int)(e->name_len > 80 ? 80 : e->name_len), e->name, fmt, detail);
}

/* One tensor's {"dtype": ..., "shape": [...], "data_offsets": [b, e]},
 * checked against the data buffer's length. */
static fa_status parse_entry(jcur *j, st_entry *e, uint64_t data_len) {
  fa_io_src *s = j->s;
  int have_dtype = 0, have_shape = 0, have_offsets = 0;
  char *dtype = NULL;
  fa_status st;
  if (!jeat(j, '{')) return jbad(j, "'{' opening a tensor's entry");
  if (!jeat(j, '}')) {
    do {
      char *k;
      size_t kl;
      if ((st = jstring(j, &k, &kl))) return st;
      if (!jeat(j, ':')) return jbad(j, "':'");
      int *seen = strcmp(k, "dtype") == 0          ? &have_dtype
                  : strcmp(k, "shape") == 0        ? &have_shape
                  : strcmp(k, "data_offsets") == 0 ? &have_offsets
                                                   : NULL;
      if (seen && *seen) return entry_fail(s, FA_ERR_ARGUMENT, e, "field appears twice: ", k);
      if (seen) *seen = 1;
      if (seen == &have_dtype) {
        size_t dl;
        if ((st = jstring(j, &dtype, &dl))) return st;
      } else if (seen == &have_shape) {
        if (!jeat(j, '[')) return jbad(j, "'[' opening a shape");
        e->ndim = 0;
        if (!jeat(j, ']')) {
          do {
            uint64_t d;
            if ((st = juint(j, &d))) return st;
            if (d > (uint64_t)INT64_MAX) return entry_fail(s, FA_ERR_SHAPE, e, "a shape size past 2^63", "");
            if (e->ndim < FA_MAX_DIMS) e->shape[e->ndim] = (int64_t)d;
            if (e->ndim < 1000) e->ndim++; /* counted only to be named in the error */
          } while (jeat(j, ','));
          if (!jeat(j, ']')) return jbad(j, "',' or ']' in a shape");
        }
      } else if (seen == &have_offsets) {
        if (!jeat(j, '[') || (st = juint(j, &e->begin)) || !jeat(j, ',') || (st = juint(j, &e->end)) || !jeat(j, ']'))
          return st ? st : jbad(j, "data_offsets as [begin, end]");
      } else if ((st = jskip(j, 2))) { /* a field this reader does not know: passed over */
        return st;
      }
    } while (jeat(j, ','));
    if (!jeat(j, '}')) return jbad(j, "',' or '}' in a tensor's entry");
  }
  if (!have_dtype || !have_shape || !have_offsets)
    return entry_fail(s, FA_ERR_ARGUMENT, e, "missing field ",
                      !have_dtype ? "dtype" : !have_shape ? "shape" : "data_offsets");
  size_t i = 0;
  while (i < sizeof st_dtypes / sizeof *st_dtypes && strcmp(dtype, st_dtypes[i].name) != 0) i++;
  if (i == sizeof st_dtypes / sizeof *st_dtypes)
    return fa_io_fail(s, FA_ERR_DTYPE, "tensor '%.*s': dtype '%.16s' is not supported (F32, F16, BF16, F64, BOOL)",
                      (int)(e->name_len > 80 ? 80 : e->name_len), e->name, dtype);
  e->dt = st_dtypes[i].dt;
  if (e->ndim < 1 || e->ndim > FA_MAX_DIMS)
    return fa_io_fail(s, FA_ERR_SHAPE, "tensor '%.*s': %d dimensions: tensors have 1 to %d",
                      (int)(e->name_len > 80 ? 80 : e->name_len), e->name, e->ndim, FA_MAX_DIMS);
  if (e->begin > e->end || e->end > data_len)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "tensor '%.*s': data_offsets [%llu, %llu] outside the %llu-byte data buffer",
                      (int)(e->name_len > 80 ? 80 : e->name_len), e->name, (unsigned long long)e->begin,
                      (unsigned long long)e->end, (unsigned long long)data_len);
  /* the shape's byte count, bounded by the buffer before any product can overflow */
  uint64_t esize = fa_dtype_size(e->dt), fit = data_len / esize, n = 1;
  int empty = 0;
  for (int d = 0; d < e->ndim; d++) {
    uint64_t sz = (uint64_t)e->shape[d];
    if (!sz) empty = 1;
    else if (n > fit / sz) n = fit + 1;
    else n *= sz;
  }
  if (empty) n = 0;
  if (n > fit || n * esize != e->end - e->begin)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "tensor '%.*s': data_offsets hold %llu bytes, its shape and dtype need %s%llu",
                      (int)(e->name_len > 80 ? 80 : e->name_len), e->name, (unsigned long long)(e->end - e->begin),
                      n > fit ? "more than the buffer's " : "", n > fit ? (unsigned long long)data_len : (unsigned long long)(n * esize));
  return FA_OK;
}

/* A growing array of entries in counted memory. */
typedef struct {
  st_entry *v;
  size_t n, cap;
} entry_list;

static fa_status push_entry(fa_io_src *s, entry_list *l, st_entry **out) {
  if (l->n == l->cap) {
    size_t cap = l->cap ? 2 * l->cap : 16;
    fa_status st;
    st_entry *v = fa_host_alloc(s->ctx, cap * sizeof *v, &st);
    if (!v) return fa_io_wrap(s, st);
    if (l->n) memcpy(v, l->v, l->n * sizeof *v);
    fa_host_free(l->v, l->cap * sizeof *v);
    l->v = v;
    l->cap = cap;
  }
  *out = &l->v[l->n++];
  memset(*out, 0, sizeof **out);
  return FA_OK;
}

static fa_status parse_header(fa_io_src *s, char *text, size_t n, uint64_t data_len, entry_list *l) {
  jcur j = {s, text, text, text + n};
  fa_status st;
  if (n == 0 || text[0] != '{') return jbad(&j, "'{' as the header's first byte");
  j.p++;
  if (!jeat(&j, '}')) {
    int metadata = 0;
    do {
      char *name;
      size_t len;
      if ((st = jstring(&j, &name, &len))) return st;
      if (!jeat(&j, ':')) return jbad(&j, "':' after a tensor name");
      if (strcmp(name, "__metadata__") == 0) {
        if (metadata++) return jbad(&j, "one '__metadata__' (it appears twice)");
        if ((st = jskip(&j, 1))) return st;
        continue;
      }
      st_entry *e = NULL;
      if ((st = push_entry(s, l, &e))) return st;
      e->name = name;
      e->name_len = len;
      if ((st = parse_entry(&j, e, data_len))) return st;
    } while (jeat(&j, ','));
    if (!jeat(&j, '}')) return jbad(&j, "',' or '}' after a tensor's entry");
  }
  jws(&j);
  if (j.p != j.end) return jbad(&j, "only whitespace after the header's closing '}'");
  return FA_OK;
}

static int by_name(const void *a, const void *b) {
  return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}
static int by_offset(const void *a, const void *b) {
  const st_entry *x = *(const st_entry *const *)a, *y = *(const st_entry *const *)b;
  return x->begin != y->begin ? (x->begin < y->begin ? -1 : 1) : x->end != y->end ? (x->end < y->end ? -1 : 1) : 0;
}

/* Names distinct, and the offsets cover the buffer exactly: no overlap
 * (two tensors sharing bytes), no hole, nothing after the last. */
static fa_status check_layout(fa_io_src *s, entry_list *l, uint64_t data_len) {
  if (l->n) qsort(l->v, l->n, sizeof *l->v, by_name); /* qsort may not take NULL, even for 0 */
  for (size_t i = 1; i < l->n; i++)
    if (strcmp(l->v[i - 1].name, l->v[i].name) == 0)
      return fa_io_fail(s, FA_ERR_ARGUMENT, "tensor name '%.80s' appears twice", l->v[i].name);
  fa_status st = FA_OK;
  size_t bytes = (l->n ? l->n : 1) * sizeof(st_entry *);
  st_entry **order = fa_host_alloc(s->ctx, bytes, &st);
  if (!order) return fa_io_wrap(s, st);
  for (size_t i = 0; i < l->n; i++) order[i] = &l->v[i];
  qsort(order, l->n, sizeof *order, by_offset);
  uint64_t at = 0;
  for (size_t i = 0; i < l->n && !st; i++) {
    if (order[i]->begin < at)
      st = fa_io_fail(s, FA_ERR_ARGUMENT, "tensors '%.80s' and '%.80s' overlap in the data buffer", order[i - 1]->name,
                      order[i]->name);
    else if (order[i]->begin > at)
      st = fa_io_fail(s, FA_ERR_ARGUMENT, "a hole of %llu bytes in the data buffer before tensor '%.80s'",
                      (unsigned long long)(order[i]->begin - at), order[i]->name);
    at = order[i]->end;
  }
  if (!st && at != data_len)
    st = fa_io_fail(s, FA_ERR_ARGUMENT, "%llu bytes in the data buffer after the last tensor's data",
                    (unsigned long long)(data_len - at));
  fa_host_free(order, bytes);
  return st;
}

/* ---- results ------------------------------------------------------------------ */

/* names, tensors and the name bytes live in one counted block; its size
 * sits in front of it for fa_safetensors_free. */
typedef struct {
  size_t nbytes;
  size_t count;
} st_block;

static fa_status new_block(fa_io_src *s, const entry_list *l, char ***names, fa_tensor ***tensors) {
  size_t bytes = sizeof(st_block) + l->n * (sizeof(char *) + sizeof(fa_tensor *));
  for (size_t i = 0; i < l->n; i++) bytes += l->v[i].name_len + 1; /* within the header's size: no overflow */
  fa_status st;
  st_block *b = fa_host_alloc(s->ctx, bytes, &st);
  if (!b) return fa_io_wrap(s, st);
  b->nbytes = bytes;
  b->count = l->n;
  char **nv = (char **)(b + 1);
  fa_tensor **tv = (fa_tensor **)(nv + l->n);
  char *text = (char *)(tv + l->n);
  for (size_t i = 0; i < l->n; i++) {
    nv[i] = text;
    memcpy(text, l->v[i].name, l->v[i].name_len + 1);
    text += l->v[i].name_len + 1;
    tv[i] = NULL;
  }
  *names = nv;
  *tensors = tv;
  return FA_OK;
}

void fa_safetensors_free(char **names, fa_tensor **tensors, size_t count) {
  if (tensors)
    for (size_t i = 0; i < count; i++) fa_tensor_release(tensors[i]);
  if (!names) return;
  st_block *b = (st_block *)names - 1;
  fa_host_free(b, b->nbytes);
}

static fa_status read_tensors(fa_io_src *s, const entry_list *l, uint64_t data_start, fa_device device,
                              fa_tensor **tv) {
  for (size_t i = 0; i < l->n; i++) {
    const st_entry *e = &l->v[i];
    fa_status st = fa_tensor_new(s->ctx, e->ndim, e->shape, e->dt, FA_CPU, &tv[i]);
    if (st) return fa_io_wrap(s, st);
    char what[128];
    snprintf(what, sizeof what, "the data of tensor '%.80s'", e->name);
    int64_t n = fa_numel_of(e->ndim, e->shape);
    if ((st = fa_io_read(s, data_start + e->begin, fa_tensor_ptr(tv[i]), (size_t)(e->end - e->begin), what))) return st;
    if (!fa_io_little_endian()) fa_io_swap(fa_tensor_ptr(tv[i]), fa_dtype_size(e->dt), n);
    if (e->dt == FA_BOOL) fa_io_normalize_bool(fa_tensor_ptr(tv[i]), n);
    if ((st = fa_io_place(s, &tv[i], device))) return fa_io_wrap(s, st);
  }
  return FA_OK;
}

fa_status fa_safetensors_read(fa_io_src *s, fa_device device, char ***names, fa_tensor ***tensors, size_t *count) {
  unsigned char len8[8];
  fa_status st = fa_io_read(s, 0, len8, 8, "the 8-byte header length");
  if (st) return st;
  uint64_t n = 0;
  for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
  if (n > FA_ST_MAX_HEADER)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "safetensors header length %llu is past the format's limit of %u bytes",
                      (unsigned long long)n, FA_ST_MAX_HEADER);
  if (n > s->size - 8)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "truncated: the header length says %llu bytes, the file has %llu after it",
                      (unsigned long long)n, (unsigned long long)(s->size - 8));
  uint64_t data_len = s->size - 8 - n;
  char *text = fa_host_alloc(s->ctx, (size_t)n + 1, &st);
  if (!text) return fa_io_wrap(s, st);
  entry_list l = {0};
  char **nv = NULL;
  fa_tensor **tv = NULL;
  if (!(st = fa_io_read(s, 8, text, (size_t)n, "the JSON header")) &&
      !(st = parse_header(s, text, (size_t)n, data_len, &l)) && !(st = check_layout(s, &l, data_len)) &&
      !(st = new_block(s, &l, &nv, &tv)))
    st = read_tensors(s, &l, 8 + n, device, tv);
  if (st) {
    fa_safetensors_free(nv, tv, l.n);
  } else {
    *names = nv;
    *tensors = tv;
    *count = l.n;
  }
  fa_host_free(l.v, l.cap * sizeof *l.v);
  fa_host_free(text, (size_t)n + 1);
  return st;
}

/* ---- writing ------------------------------------------------------------------ */

typedef struct {
  char *p;
  size_t n, cap;
  fa_io_src *s;
} sbuf;

static fa_status put(sbuf *b, const char *text, size_t n) {
  if (n > b->cap - b->n) {
    size_t cap = b->cap ? b->cap : 256;
    while (n > cap - b->n) {
      if (cap > SIZE_MAX / 2) return fa_io_fail(b->s, FA_ERR_OUT_OF_MEMORY, "header too large");
      cap *= 2;
    }
    fa_status st;
    char *p = fa_host_alloc(b->s->ctx, cap, &st);
    if (!p) return fa_io_wrap(b->s, st);
    if (b->n) memcpy(p, b->p, b->n);
    fa_host_free(b->p, b->cap);
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->n, text, n);
  b->n += n;
  return FA_OK;
}

static fa_status put_str(sbuf *b, const char *text) { return put(b, text, strlen(text)); }

/* A JSON string: quotes, backslashes and control characters escaped. */
static fa_status put_name(sbuf *b, const char *name) {
  fa_status st = put(b, "\"", 1);
  for (const char *p = name; *p && !st; p++) {
    char esc[8];
    unsigned char c = (unsigned char)*p;
    if (c == '"' || c == '\\') esc[0] = '\\', esc[1] = (char)c, esc[2] = 0;
    else if (c < 0x20) snprintf(esc, sizeof esc, "\\u%04x", c);
    else esc[0] = (char)c, esc[1] = 0;
    st = put_str(b, esc);
  }
  return st ? st : put(b, "\"", 1);
}

typedef struct {
  const char *name;
  fa_tensor *t;
} named;

static int named_cmp(const void *a, const void *b) { return strcmp(((const named *)a)->name, ((const named *)b)->name); }

static fa_status check_names(fa_io_src *s, named *v, size_t count) {
  for (size_t i = 0; i < count; i++) {
    if (!v[i].name) return fa_io_fail(s, FA_ERR_ARGUMENT, "names[%zu] is NULL", i);
    if (!v[i].t) return fa_io_fail(s, FA_ERR_ARGUMENT, "tensors[%zu] ('%.80s') is NULL", i, v[i].name);
    const unsigned char *p = (const unsigned char *)v[i].name, *end = p + strlen(v[i].name);
    for (int k; p < end; p += k)
      if (!(k = utf8_seq(p, end))) return fa_io_fail(s, FA_ERR_ARGUMENT, "tensor name #%zu is not valid UTF-8", i + 1);
    if (strcmp(v[i].name, "__metadata__") == 0)
      return fa_io_fail(s, FA_ERR_ARGUMENT, "'__metadata__' is reserved by the format, not a tensor name");
  }
  qsort(v, count, sizeof *v, named_cmp);
  for (size_t i = 1; i < count; i++)
    if (strcmp(v[i - 1].name, v[i].name) == 0)
      return fa_io_fail(s, FA_ERR_ARGUMENT, "tensor name '%.80s' given twice", v[i].name);
  return FA_OK;
}

static fa_status build_header(sbuf *b, const named *v, size_t count) {
  fa_status st = put(b, "{", 1);
  uint64_t at = 0;
  for (size_t i = 0; i < count && !st; i++) {
    const fa_tensor *t = v[i].t;
    char text[256];
    size_t used = 0;
    const char *dn = "?";
    for (size_t k = 0; k < sizeof st_dtypes / sizeof *st_dtypes; k++)
      if (st_dtypes[k].dt == t->dtype) dn = st_dtypes[k].name;
    used += (size_t)snprintf(text, sizeof text, ":{\"dtype\":\"%s\",\"shape\":[", dn);
    for (int d = 0; d < t->ndim; d++)
      used += (size_t)snprintf(text + used, sizeof text - used, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    uint64_t bytes = (uint64_t)fa_numel_of(t->ndim, t->shape) * fa_dtype_size(t->dtype);
    if (bytes > UINT64_MAX - at) return fa_io_fail(b->s, FA_ERR_OUT_OF_MEMORY, "the tensors' bytes add past 2^64");
    snprintf(text + used, sizeof text - used, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)at,
             (unsigned long long)(at + bytes));
    at += bytes;
    if (i) st = put(b, ",", 1);
    if (!st) st = put_name(b, v[i].name);
    if (!st) st = put_str(b, text);
  }
  if (!st) st = put(b, "}", 1);
  while (!st && (8 + b->n) % 8) st = put(b, " ", 1); /* the data buffer starts 8-byte aligned */
  if (!st && b->n > FA_ST_MAX_HEADER)
    st = fa_io_fail(b->s, FA_ERR_ARGUMENT, "the header would be %zu bytes, past the format's %u", b->n, FA_ST_MAX_HEADER);
  return st;
}

fa_status fa_save_safetensors(fa_context *ctx, const char *path, size_t count, const char *const *names,
                              fa_tensor *const *tensors) {
  FA_NEED(ctx);
  FA_NEED(path);
  if (count) {
    FA_NEED(names);
    FA_NEED(tensors);
  }
  fa_io_src s = {.ctx = ctx, .op = "save", .label = path};
  fa_status st = fa_io_check_save_path(&s, path, FA_FILE_SAFETENSORS);
  if (st) return st;
  if (count > SIZE_MAX / sizeof(named)) return fa_io_fail(&s, FA_ERR_ARGUMENT, "count %zu is too large", count);
  size_t vbytes = (count ? count : 1) * sizeof(named);
  named *v = fa_host_alloc(ctx, vbytes, &st);
  if (!v) return fa_io_wrap(&s, st);
  for (size_t i = 0; i < count; i++) v[i] = (named){names[i], tensors[i]};
  sbuf b = {NULL, 0, 0, &s};
  if (!(st = check_names(&s, v, count)) && !(st = build_header(&b, v, count)) && !(st = fa_io_create(&s, ctx, path))) {
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)b.n >> (8 * i));
    st = fa_io_write(&s, len8, 8);
    if (!st) st = fa_io_write(&s, b.p, b.n);
    for (size_t i = 0; i < count && !st; i++) { /* one host copy at a time */
      fa_tensor *c;
      if ((st = fa_io_wrap(&s, fa_io_host_copy(&s, v[i].t, 0, &c)))) break;
      st = fa_io_write_tensor(&s, c);
      fa_tensor_release(c);
    }
    st = fa_io_finish(&s, path, st);
  }
  fa_host_free(b.p, b.cap);
  fa_host_free(v, vbytes);
  return st;
}
