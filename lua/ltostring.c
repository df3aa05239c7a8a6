/* tostring(t): the values, nested in brackets as PyTorch prints them,
 * elided in the middle of every long dimension when the tensor is large
 * (Torch's rule: more than 1000 elements prints the 3 first and 3 last of
 * each dimension), then the footer `[flashattn.Tensor f32 cuda 2x3]`.
 * Only the shown elements are read, so printing a huge CUDA tensor moves
 * at most 6^4 values. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "lbinding.h"

#define SUMMARY_AT 1000 /* numel above which dimensions are elided */
#define EDGE 3          /* elements kept at each end of an elided dimension */
#define LINE 80         /* wrap the innermost dimension at this width */

typedef struct {
  int nd;
  int64_t cnt[FA_MAX_DIMS];    /* shown entries per dimension */
  int64_t gap[FA_MAX_DIMS];    /* "..." after this shown entry, or -1 */
  int64_t stride[FA_MAX_DIMS]; /* in the array of shown values */
  const double *v;
  int is_bool;
  char fmt[16];
  int width;
} printer;

/* The index in the tensor of shown entry k of dimension d. */
static int64_t source_index(const printer *p, int64_t size, int d, int64_t k) {
  return p->gap[d] >= 0 && k > p->gap[d] ? size - (p->cnt[d] - k) : k;
}

static int fmt_value(const printer *p, double x, char *buf, size_t n) {
  if (p->is_bool) return snprintf(buf, n, "%s", x != 0 ? "true" : "false");
  if (isnan(x)) return snprintf(buf, n, "nan");
  if (isinf(x)) return snprintf(buf, n, x > 0 ? "inf" : "-inf");
  return snprintf(buf, n, p->fmt, x);
}

/* One format for all shown values: integers, fixed point, or scientific. */
static void choose_format(printer *p, int64_t n) {
  int all_int = 1, any = 0;
  double maxabs = 0, minabs = INFINITY;
  for (int64_t i = 0; i < n; i++) {
    double x = p->v[i];
    if (!isfinite(x)) continue;
    any = 1;
    double a = fabs(x);
    if (a != floor(a) || a >= 1e15) all_int = 0;
    if (a > maxabs) maxabs = a;
    if (a > 0 && a < minabs) minabs = a;
  }
  if (any && all_int && maxabs < 1e9) strcpy(p->fmt, "%.0f");
  else if (!any || (maxabs < 1e5 && (minabs >= 1e-4 || minabs == INFINITY))) strcpy(p->fmt, "%.4f");
  else strcpy(p->fmt, "%.4e");
  char buf[64];
  p->width = 1;
  for (int64_t i = 0; i < n; i++) {
    int w = fmt_value(p, p->v[i], buf, sizeof buf);
    if (w > p->width) p->width = w;
  }
}

static void add_spaces(luaL_Buffer *b, int n) {
  while (n-- > 0) luaL_addchar(b, ' ');
}

static void print_dim(const printer *p, luaL_Buffer *b, int d, int64_t off, int indent) {
  if (d >= FA_MAX_DIMS) return; /* never: bounds the recursion for the compiler */
  char buf[64];
  luaL_addchar(b, '[');
  if (d == p->nd - 1) {
    int col = indent + 1;
    for (int64_t k = 0; k < p->cnt[d]; k++) {
      int w = fmt_value(p, p->v[off + k], buf, sizeof buf);
      if (k > 0) {
        luaL_addchar(b, ',');
        if (col + 2 + p->width > LINE) {
          luaL_addchar(b, '\n');
          add_spaces(b, indent + 1);
          col = indent + 1;
        } else {
          luaL_addchar(b, ' ');
          col += 2;
        }
      }
      add_spaces(b, p->width - w);
      luaL_addstring(b, buf);
      col += p->width;
      if (k == p->gap[d]) {
        luaL_addstring(b, ", ...");
        col += 5;
      }
    }
  } else {
    for (int64_t k = 0; k < p->cnt[d]; k++) {
      if (k > 0) {
        luaL_addchar(b, ',');
        for (int i = d; i < p->nd - 1; i++) luaL_addchar(b, '\n'); /* blank lines between blocks */
        add_spaces(b, indent + 1);
      }
      print_dim(p, b, d + 1, off + k * p->stride[d], indent + 1);
      if (k == p->gap[d]) {
        luaL_addstring(b, ",\n");
        add_spaces(b, indent + 1);
        luaL_addstring(b, "...");
      }
    }
  }
  luaL_addchar(b, ']');
}

int fal_tensor_tostring(lua_State *L) {
  fal_box *box = fal_tobox(L, 1);
  if (!box) return fal_typeerror(L, 1, "self", FAL_TENSOR_MT);
  if (!box->t) {
    lua_pushliteral(L, FAL_TENSOR_MT " (freed)"); /* like liolib's "file (closed)" */
    return 1;
  }
  fa_context *ctx = fal_ctx(L);
  fal_pins *pins = fal_pins_open(L); /* t stays alive through the allocations below */
  fa_tensor *t = fal_pin(L, pins, 1, "self");
  printer p;
  int64_t numel = fa_tensor_numel(t), shown = 1, size[FA_MAX_DIMS];
  int summarize = numel > SUMMARY_AT;
  p.nd = fa_tensor_ndim(t);
  p.is_bool = fa_tensor_dtype(t) == FA_BOOL;
  for (int d = 0; d < p.nd; d++) {
    size[d] = fa_tensor_size(t, d);
    int elide = summarize && size[d] > 2 * EDGE;
    p.cnt[d] = elide ? 2 * EDGE : size[d];
    p.gap[d] = elide ? EDGE - 1 : -1;
    shown *= p.cnt[d];
  }
  for (int64_t d = p.nd - 1, s = 1; d >= 0; d--) {
    p.stride[d] = s;
    s *= p.cnt[d];
  }
  double *v = (double *)fal_newbuffer(L, shown, sizeof *v, "tostring");
  p.v = v;
  if (!summarize) {
    FAL_CALL(L, ctx, fa_tensor_read_f64(ctx, t, v));
  } else {
    /* element by element: only the shown ones leave the device */
    int64_t k[FA_MAX_DIMS] = {0}, idx[FA_MAX_DIMS];
    for (int64_t i = 0; i < shown; i++) {
      for (int d = 0; d < p.nd; d++) idx[d] = source_index(&p, size[d], d, k[d]);
      FAL_CALL(L, ctx, fa_tensor_get(ctx, t, idx, &v[i]));
      for (int d = p.nd - 1; d >= 0 && ++k[d] == p.cnt[d]; d--) k[d] = 0;
    }
  }
  choose_format(&p, shown);

  luaL_Buffer b;
  luaL_buffinit(L, &b);
  if (shown == 0) {
    luaL_addstring(&b, "[]");
  } else {
    print_dim(&p, &b, 0, 0, 0);
  }
  char foot[64];
  snprintf(foot, sizeof foot, "\n[" FAL_TENSOR_MT " %s %s ", fa_dtype_name(fa_tensor_dtype(t)),
           fa_device_name(fa_tensor_device(t)));
  luaL_addstring(&b, foot);
  for (int d = 0; d < p.nd; d++) {
    snprintf(foot, sizeof foot, d ? "x%lld" : "%lld", (long long)size[d]);
    luaL_addstring(&b, foot);
  }
  luaL_addchar(&b, ']');
  luaL_pushresult(&b);
  return 1;
}
