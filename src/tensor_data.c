/* Element access, copies and conversions.  Every routine works on a host
 * mapping of the tensor: the CPU storage itself, or for a CUDA tensor a
 * staged copy of the span of storage the view covers (until the CUDA
 * backend has its own elementwise kernels, this keeps every method
 * correct on both devices). */
#include "check.h"
#include "internal.h"
#include "binary_op.h"
#include "random_counter.h"

#include <math.h>
#include <string.h>

/* A 0-based index as the 1-based one messages show (no overflow at the top). */
static long long fa_one_based(int64_t i) { return i < INT64_MAX ? (long long)i + 1 : (long long)i; }

typedef struct {
  fa_tensor *t;
  char *base;   /* host address of the view's element 0 */
  void *stage;  /* staging buffer (CUDA) or NULL */
  size_t stage_bytes;
  char *span_dev; /* device address the stage mirrors */
} host_map;

/* The storage range [first, first+count) elements the view touches, relative to t->offset. */
static int64_t span_elems(const fa_tensor *t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] == 0) return 0;
    n += (t->shape[i] - 1) * t->strides[i];
  }
  return n;
}

static fa_status map_host(fa_context *ctx, fa_tensor *t, int read, host_map *m) {
  memset(m, 0, sizeof *m);
  m->t = t;
  if (t->storage->device == FA_CPU) {
    m->base = fa_tensor_ptr(t);
    return FA_OK;
  }
  fa_status st;
  m->stage_bytes = (size_t)span_elems(t) * fa_dtype_size(t->dtype);
  m->stage = fa_host_alloc(ctx, m->stage_bytes, &st);
  if (!m->stage) return st;
  m->span_dev = fa_tensor_ptr(t);
  m->base = m->stage;
  /* a strided view written back must keep the gaps' device contents */
  if ((read || !fa_tensor_is_contiguous(t)) && m->stage_bytes) {
    st = fa_cuda_memcpy(ctx, m->stage, m->span_dev, m->stage_bytes, FA_COPY_D2H);
    if (st) {
      fa_host_free(m->stage, m->stage_bytes);
      m->stage = NULL;
      return st;
    }
  }
  return FA_OK;
}

static fa_status unmap_host(fa_context *ctx, host_map *m, int write_back) {
  fa_status st = FA_OK;
  if (m->stage) {
    if (write_back && m->stage_bytes) st = fa_cuda_memcpy(ctx, m->span_dev, m->stage, m->stage_bytes, FA_COPY_H2D);
    fa_host_free(m->stage, m->stage_bytes);
    m->stage = NULL;
  }
  return st;
}

static fa_status check_same_shape(fa_context *ctx, const fa_tensor *a, const fa_tensor *b, const char *what) {
  int same = a->ndim == b->ndim;
  for (int i = 0; same && i < a->ndim; i++) same = a->shape[i] == b->shape[i];
  if (same) return FA_OK;
  char ba[64], bb[64];
  return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: shapes differ: %s vs %s", what, fa_shape_str(a, ba, sizeof ba),
                 fa_shape_str(b, bb, sizeof bb));
}

int fa_tensor_same_memory(const fa_tensor *a, const fa_tensor *b) {
  const fa_storage *s = a->storage, *t = b->storage;
  if (s == t) return 1;
  if (s->device != t->device || !s->data || !t->data) return 0;
  const uintptr_t s0 = (uintptr_t)s->data, t0 = (uintptr_t)t->data;
  return s0 < t0 + t->nbytes && t0 < s0 + s->nbytes;
}

int fa_tensor_overlaps(const fa_tensor *a, const fa_tensor *b) {
  if (!fa_tensor_same_memory(a, b)) return 0;
  const uintptr_t a0 = (uintptr_t)fa_tensor_ptr(a), a1 = a0 + (uintptr_t)span_elems(a) * fa_dtype_size(a->dtype);
  const uintptr_t b0 = (uintptr_t)fa_tensor_ptr(b), b1 = b0 + (uintptr_t)span_elems(b) * fa_dtype_size(b->dtype);
  return a0 < b1 && b0 < a1;
}

int fa_tensor_injective(const fa_tensor *t) {
  /* the dimensions of more than one element by rising stride: each must
   * step past everything the ones inside it span */
  int idx[FA_MAX_DIMS], n = 0;
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] > 1) idx[n++] = i;
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && t->strides[idx[j]] < t->strides[idx[j - 1]]; j--) {
      int x = idx[j];
      idx[j] = idx[j - 1], idx[j - 1] = x;
    }
  int64_t span = 1; /* elements the inner dimensions reach, plus one */
  for (int i = 0; i < n; i++) {
    const int64_t st = t->strides[idx[i]];
    if (st < span) return 0;
    span += st * (t->shape[idx[i]] - 1);
  }
  return 1;
}

fa_status fa_tensor_copy(fa_context *ctx, fa_tensor *dst, fa_tensor *src) {
  FA_NEED(ctx);
  FA_NEED(dst);
  FA_NEED(src);
  fa_status st = check_same_shape(ctx, dst, src, "copy_");
  if (st || (st = fa_check_writable(ctx, dst, "copy_: the destination"))) return st;
  int64_t n = fa_tensor_numel(dst);
  if (n == 0) return FA_OK;
  fa_device dd = dst->storage->device, sd = src->storage->device;
  /* fast paths: contiguous same dtype between or within devices */
  if (dst->dtype == src->dtype && fa_tensor_is_contiguous(dst) && fa_tensor_is_contiguous(src)) {
    size_t bytes = (size_t)n * fa_dtype_size(dst->dtype);
    if (dd == FA_CPU && sd == FA_CPU) {
      memmove(fa_tensor_ptr(dst), fa_tensor_ptr(src), bytes);
      return FA_OK;
    }
    fa_copy_kind kind = dd == FA_CPU ? FA_COPY_D2H : sd == FA_CPU ? FA_COPY_H2D : FA_COPY_D2D;
    return fa_cuda_memcpy(ctx, fa_tensor_ptr(dst), fa_tensor_ptr(src), bytes, kind);
  }
  if (fa_tensor_overlaps(dst, src)) { /* e.g. t:copy_(t:transpose(1,2)): through a temporary */
    fa_tensor *tmp;
    if ((st = fa_tensor_clone(ctx, src, &tmp))) return st;
    st = fa_tensor_copy(ctx, dst, tmp);
    fa_tensor_release(tmp);
    return st;
  }
  if (dd == FA_CUDA && sd == FA_CUDA) return fa_cuda_copy(ctx, dst, src);
  if (dd != sd) { /* one contiguous transfer in src's dtype, then strides and conversion on dst's device */
    fa_tensor *src_c = NULL, *tmp = NULL;
    if (!(st = fa_tensor_contiguous(ctx, src, &src_c)) &&
        !(st = fa_tensor_new_like(ctx, src, src->dtype, dd, &tmp)) && !(st = fa_tensor_copy(ctx, tmp, src_c)))
      st = fa_tensor_copy(ctx, dst, tmp);
    fa_tensor_drop(&src_c);
    fa_tensor_drop(&tmp);
    return st;
  }
  host_map ms, md;
  if ((st = map_host(ctx, src, 1, &ms))) return st;
  if ((st = map_host(ctx, dst, 0, &md))) {
    unmap_host(ctx, &ms, 0);
    return st;
  }
  fa_iter is, id;
  fa_iter_init(&is, src);
  fa_iter_init(&id, dst);
  for (int64_t k = 0; k < n; k++, fa_iter_next(&is), fa_iter_next(&id))
    fa_store_f64(dst->dtype, md.base, id.offset, fa_load_f64(src->dtype, ms.base, is.offset));
  unmap_host(ctx, &ms, 0);
  return unmap_host(ctx, &md, 1);
}

fa_status fa_tensor_fill(fa_context *ctx, fa_tensor *t, double value) {
  FA_NEED(ctx);
  FA_NEED(t);
  if (t->storage->device == FA_CUDA) return fa_cuda_fill(ctx, t, -1, 0, value);
  host_map m;
  fa_status st = map_host(ctx, t, 0, &m);
  if (st) return st;
  int64_t n = fa_tensor_numel(t);
  fa_iter it;
  fa_iter_init(&it, t);
  for (int64_t k = 0; k < n; k++, fa_iter_next(&it)) fa_store_f64(t->dtype, m.base, it.offset, value);
  return unmap_host(ctx, &m, 1);
}

fa_status fa_tensor_fill_random(fa_context *ctx, fa_tensor *t, fa_fill_kind kind, uint64_t seed) {
  FA_NEED(ctx);
  FA_NEED(t);
  if ((unsigned)kind > FA_FILL_ARANGE) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: fill: unknown kind %d", (int)kind);
  fa_status st = fa_check_writable(ctx, t, "fill: the tensor"); /* a value an element: one address each */
  if (st) return st;
  if (t->storage->device == FA_CUDA) return fa_cuda_fill(ctx, t, (int)kind, seed, 0);
  host_map m;
  st = map_host(ctx, t, 0, &m);
  if (st) return st;
  int64_t n = fa_tensor_numel(t);
  fa_iter it;
  fa_iter_init(&it, t);
  for (int64_t k = 0; k < n; k++, fa_iter_next(&it)) {
    double v = kind == FA_FILL_UNIFORM  ? fa_rng_uniform_for(t->dtype, fa_random_uniform(seed, (uint64_t)k))
               : kind == FA_FILL_NORMAL ? fa_random_normal(seed, (uint64_t)k)
                                        : (double)k;
    fa_store_f64(t->dtype, m.base, it.offset, v);
  }
  return unmap_host(ctx, &m, 1);
}

static fa_status element_offset(fa_context *ctx, const fa_tensor *t, const int64_t *index, int64_t *off) {
  *off = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (index[i] < 0 || index[i] >= t->shape[i])
      return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: index %lld out of range for dimension %d of size %lld",
                     fa_one_based(index[i]), i + 1, (long long)t->shape[i]);
    *off += index[i] * t->strides[i];
  }
  return FA_OK;
}

fa_status fa_tensor_get(fa_context *ctx, fa_tensor *t, const int64_t *index, double *value) {
  FA_NEED(ctx);
  FA_NEED(t);
  FA_NEED(index);
  FA_NEED(value);
  int64_t off;
  fa_status st = element_offset(ctx, t, index, &off);
  if (st) return st;
  if (t->storage->device == FA_CPU) {
    *value = fa_load_f64(t->dtype, fa_tensor_ptr(t), off);
    return FA_OK;
  }
  uint64_t buf = 0;
  size_t es = fa_dtype_size(t->dtype);
  st = fa_cuda_memcpy(ctx, &buf, (char *)fa_tensor_ptr(t) + off * (int64_t)es, es, FA_COPY_D2H);
  if (!st) *value = fa_load_f64(t->dtype, &buf, 0);
  return st;
}

fa_status fa_tensor_set(fa_context *ctx, fa_tensor *t, const int64_t *index, double value) {
  FA_NEED(ctx);
  FA_NEED(t);
  FA_NEED(index);
  int64_t off;
  fa_status st = element_offset(ctx, t, index, &off);
  if (st) return st;
  if (t->storage->device == FA_CPU) {
    fa_store_f64(t->dtype, fa_tensor_ptr(t), off, value);
    return FA_OK;
  }
  uint64_t buf = 0;
  size_t es = fa_dtype_size(t->dtype);
  fa_store_f64(t->dtype, &buf, 0, value);
  return fa_cuda_memcpy(ctx, (char *)fa_tensor_ptr(t) + off * (int64_t)es, &buf, es, FA_COPY_H2D);
}

fa_status fa_tensor_read_f64(fa_context *ctx, fa_tensor *t, double *out) {
  FA_NEED(ctx);
  FA_NEED(t);
  FA_NEED(out);
  host_map m;
  fa_status st = map_host(ctx, t, 1, &m);
  if (st) return st;
  int64_t n = fa_tensor_numel(t);
  fa_iter it;
  fa_iter_init(&it, t);
  for (int64_t k = 0; k < n; k++, fa_iter_next(&it)) out[k] = fa_load_f64(t->dtype, m.base, it.offset);
  return unmap_host(ctx, &m, 0);
}

fa_status fa_tensor_write_f64(fa_context *ctx, fa_tensor *t, const double *values) {
  FA_NEED(ctx);
  FA_NEED(t);
  FA_NEED(values);
  host_map m;
  fa_status st = fa_check_writable(ctx, t, "write_f64: the tensor");
  if (st || (st = map_host(ctx, t, 0, &m))) return st;
  int64_t n = fa_tensor_numel(t);
  fa_iter it;
  fa_iter_init(&it, t);
  for (int64_t k = 0; k < n; k++, fa_iter_next(&it)) fa_store_f64(t->dtype, m.base, it.offset, values[k]);
  return unmap_host(ctx, &m, 1);
}

/* A new tensor of t's shape in dtype on device holding t's values, in *out
 * (NULL on failure): fa_tensor_to's copy and fa_tensor_clone's. */
static fa_status copy_to_new(fa_context *ctx, fa_tensor *t, fa_dtype dtype, fa_device device, fa_tensor **out) {
  fa_tensor *r;
  fa_status st = fa_tensor_new_like(ctx, t, dtype, device, &r);
  if (st) return st;
  if (dtype != t->dtype && device != t->storage->device && device == FA_CUDA) {
    /* convert on the host, then one upload */
    fa_tensor *h;
    st = fa_tensor_to(ctx, t, dtype, FA_CPU, &h);
    if (!st) st = fa_tensor_copy(ctx, r, h);
    fa_tensor_drop(&h);
  } else {
    st = fa_tensor_copy(ctx, r, t);
  }
  if (st) fa_tensor_drop(&r);
  *out = r;
  return st;
}

fa_status fa_tensor_to(fa_context *ctx, fa_tensor *t, fa_dtype dtype, fa_device device, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(t);
  if (dtype == t->dtype && device == t->storage->device) {
    fa_tensor_retain(t);
    *out = t;
    return FA_OK;
  }
  return copy_to_new(ctx, t, dtype, device, out);
}

fa_status fa_tensor_clone(fa_context *ctx, fa_tensor *t, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(t);
  return copy_to_new(ctx, t, t->dtype, t->storage->device, out);
}

fa_status fa_tensor_contiguous(fa_context *ctx, fa_tensor *t, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(t);
  if (fa_tensor_is_contiguous(t)) {
    fa_tensor_retain(t);
    *out = t;
    return FA_OK;
  }
  return fa_tensor_clone(ctx, t, out);
}

fa_status fa_tensor_cpu_contiguous(fa_context *ctx, fa_tensor *t, fa_dtype dtype, fa_tensor **out) {
  if (t->dtype == dtype && t->storage->device == FA_CPU) return fa_tensor_contiguous(ctx, t, out);
  fa_tensor *r;
  fa_status st = fa_tensor_new_like(ctx, t, dtype, FA_CPU, &r);
  if (st) {
    *out = NULL;
    return st;
  }
  st = fa_tensor_copy(ctx, r, t);
  if (st) fa_tensor_drop(&r);
  *out = r;
  return st;
}

/* ---- reductions and elementwise arithmetic (accumulated in f64) ---- */

fa_status fa_tensor_reduce(fa_context *ctx, fa_tensor *t, fa_reduce_op op, double *out) {
  FA_NEED(ctx);
  FA_NEED(t);
  FA_NEED(out);
  int64_t n = fa_tensor_numel(t);
  if (n == 0 && (op == FA_REDUCE_MAX || op == FA_REDUCE_MIN))
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: %s of an empty tensor", op == FA_REDUCE_MAX ? "max" : "min");
  if ((unsigned)op > FA_REDUCE_NORM) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: unknown reduction %d", (int)op);
  if (t->storage->device == FA_CUDA) {
    double r[6];
    fa_status st = fa_cuda_reduce(ctx, t, r);
    if (!st) *out = r[4] > 0 ? NAN : op == FA_REDUCE_SUM ? r[0] : op == FA_REDUCE_NORM ? sqrt(r[1]) : op == FA_REDUCE_MAX ? r[2] : r[3];
    return st;
  }
  host_map m;
  fa_status st = map_host(ctx, t, 1, &m);
  if (st) return st;
  fa_iter it;
  fa_iter_init(&it, t);
  double acc = op == FA_REDUCE_MAX ? -INFINITY : op == FA_REDUCE_MIN ? INFINITY : 0.0;
  int nan = 0;
  for (int64_t k = 0; k < n; k++, fa_iter_next(&it)) {
    double v = fa_load_f64(t->dtype, m.base, it.offset);
    nan |= isnan(v);
    if (op == FA_REDUCE_SUM) acc += v;
    else if (op == FA_REDUCE_NORM) acc += v * v;
    else if (op == FA_REDUCE_MAX) acc = v > acc ? v : acc;
    else acc = v < acc ? v : acc;
  }
  *out = nan ? NAN : op == FA_REDUCE_NORM ? sqrt(acc) : acc;
  return unmap_host(ctx, &m, 0);
}

fa_status fa_tensor_isfinite(fa_context *ctx, fa_tensor *t, int *out) {
  FA_NEED(ctx);
  FA_NEED(t);
  FA_NEED(out);
  if (t->storage->device == FA_CUDA) {
    double r[6];
    fa_status st = fa_cuda_reduce(ctx, t, r);
    if (!st) *out = r[5] == 0;
    return st;
  }
  host_map m;
  fa_status st = map_host(ctx, t, 1, &m);
  if (st) return st;
  int64_t n = fa_tensor_numel(t);
  fa_iter it;
  fa_iter_init(&it, t);
  int ok = 1;
  for (int64_t k = 0; k < n && ok; k++, fa_iter_next(&it)) ok = isfinite(fa_load_f64(t->dtype, m.base, it.offset));
  *out = ok;
  return unmap_host(ctx, &m, 0);
}

fa_status fa_tensor_binary(fa_context *ctx, fa_tensor *a, fa_binary_op op, fa_tensor *b, double scalar,
                           fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(a);
  static const char *names[] = {"add", "sub", "mul", "div", "rsub", "rdiv"};
  if ((unsigned)op > FA_BIN_RDIV) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: unknown binary op %d", (int)op);
  fa_status st;
  if (b) {
    if ((st = check_same_shape(ctx, a, b, names[op]))) return st;
    if (b->storage->device != a->storage->device)
      return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: %s: operands on different devices (%s and %s)", names[op],
                     fa_device_name(a->storage->device), fa_device_name(b->storage->device));
  }
  fa_tensor *r;
  if ((st = fa_tensor_new_like(ctx, a, a->dtype, a->storage->device, &r))) return st;
  if (a->storage->device == FA_CUDA) {
    if ((st = fa_cuda_binary(ctx, r, a, b, (int)op, scalar))) fa_tensor_drop(&r);
    *out = r;
    return st;
  }
  host_map ma, mb = {0}, mr;
  if ((st = map_host(ctx, a, 1, &ma))) goto fail_r;
  if (b && (st = map_host(ctx, b, 1, &mb))) goto fail_a;
  if ((st = map_host(ctx, r, 0, &mr))) goto fail_b;
  int64_t n = fa_tensor_numel(a);
  fa_iter ia, ib;
  fa_iter_init(&ia, a);
  if (b) fa_iter_init(&ib, b);
  for (int64_t k = 0; k < n; k++, fa_iter_next(&ia)) {
    double y = scalar;
    if (b) {
      y = fa_load_f64(b->dtype, mb.base, ib.offset);
      fa_iter_next(&ib);
    }
    fa_store_f64(r->dtype, mr.base, k, fa_binary_apply(op, fa_load_f64(a->dtype, ma.base, ia.offset), y));
  }
  st = unmap_host(ctx, &mr, 1);
fail_b:
  if (b) unmap_host(ctx, &mb, 0);
fail_a:
  unmap_host(ctx, &ma, 0);
fail_r:
  if (st) fa_tensor_drop(&r);
  *out = r;
  return st;
}

/* A sum of squares kept as scale²·ssq (LAPACK's dlassq), so that f64
 * values near the ends of the range (1e300, 1e-300) neither overflow nor
 * vanish when squared. */
typedef struct {
  double scale, ssq;
} sumsq;

static void sumsq_add(sumsq *s, double x) {
  const double ax = fabs(x);
  if (ax == 0) return;
  if (isnan(ax)) {
    s->ssq = NAN;
  } else if (s->scale < ax) {
    const double r = isinf(ax) ? 0 : s->scale / ax;
    s->ssq = 1 + s->ssq * r * r;
    s->scale = ax;
  } else {
    const double r = isinf(ax) ? 1 : ax / s->scale; /* two infinities: one each */
    s->ssq += r * r;
  }
}

/* ‖x‖ / ‖y‖ from their sums of squares: 0/0 is 0, x/0 inf, NaN stays. */
static double sumsq_ratio(sumsq x, sumsq y) {
  if (isnan(x.ssq) || isnan(y.ssq)) return NAN;
  if (x.scale == 0) return 0;
  if (y.scale == 0) return INFINITY;
  return x.scale / y.scale * sqrt(x.ssq / y.ssq);
}

/* Both comparison helpers walk a and b together on the host. */
static fa_status compare(fa_context *ctx, fa_tensor *a, fa_tensor *b, const char *what, sumsq *num, sumsq *den,
                         double *maxdiff) {
  fa_status st = check_same_shape(ctx, a, b, what);
  if (st) return st;
  host_map ma, mb;
  if ((st = map_host(ctx, a, 1, &ma))) return st;
  if ((st = map_host(ctx, b, 1, &mb))) {
    unmap_host(ctx, &ma, 0);
    return st;
  }
  int64_t n = fa_tensor_numel(a);
  fa_iter ia, ib;
  fa_iter_init(&ia, a);
  fa_iter_init(&ib, b);
  sumsq s_num = {0, 0}, s_den = {0, 0};
  double md = 0;
  for (int64_t k = 0; k < n; k++, fa_iter_next(&ia), fa_iter_next(&ib)) {
    double x = fa_load_f64(a->dtype, ma.base, ia.offset), y = fa_load_f64(b->dtype, mb.base, ib.offset);
    double d = x - y;
    if (x == y) d = 0; /* equal infinities */
    sumsq_add(&s_num, d);
    sumsq_add(&s_den, y);
    double ad = fabs(d);
    if (ad > md || isnan(ad)) md = isnan(md) ? md : ad;
  }
  *num = s_num, *den = s_den, *maxdiff = md;
  unmap_host(ctx, &ma, 0);
  return unmap_host(ctx, &mb, 0);
}

fa_status fa_rel_error(fa_context *ctx, fa_tensor *a, fa_tensor *ref, double *out) {
  FA_NEED(ctx);
  FA_NEED(a);
  FA_NEED(ref);
  FA_NEED(out);
  sumsq num, den;
  double md;
  fa_status st = compare(ctx, a, ref, "rel_error", &num, &den, &md);
  if (st) return st;
  *out = sumsq_ratio(num, den);
  return FA_OK;
}

fa_status fa_max_abs_diff(fa_context *ctx, fa_tensor *a, fa_tensor *b, double *out) {
  FA_NEED(ctx);
  FA_NEED(a);
  FA_NEED(b);
  FA_NEED(out);
  sumsq num, den;
  return compare(ctx, a, b, "max_abs_diff", &num, &den, out);
}

fa_state_rows fa_tensor_rows(const fa_tensor *t) {
  fa_state_rows r = {{1, 1, 1}, {0, 0, 0}};
  for (int d = t->ndim - 2, i = 3; d >= 0; d--) {
    if (i < 3 && t->strides[d] == r.stride[i] * r.size[i]) r.size[i] *= t->shape[d];
    else i--, r.size[i] = t->shape[d], r.stride[i] = t->strides[d];
  }
  return r;
}
