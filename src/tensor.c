/* Tensors: reference-counted views (shape, strides, offset) over shared,
 * reference-counted storage that the engine or the host owns. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* A 0-based index as the 1-based one messages show (no overflow at the top). */
static long long fa_one_based(int64_t i) { return i < INT64_MAX ? (long long)i + 1 : (long long)i; }

int64_t fa_numel_of(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) n *= shape[i];
  return n;
}

/* The product of the sizes, zeros counted as 1, stays below this: element
 * counts, byte counts and the contiguous strides (which skip zero sizes)
 * of any shape then fit an int64_t, even for an empty tensor such as
 * 0 x 2^40 x 2^40. */
#define FA_MAX_SPAN (INT64_MAX / 16)

int fa_shape_too_large(int ndim, const int64_t *shape) {
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] > 0 && n > FA_MAX_SPAN / shape[i]) return i;
    if (shape[i] > 0) n *= shape[i];
  }
  return -1;
}

static fa_status check_shape(fa_context *ctx, int ndim, const int64_t *shape, const char *what) {
  if (ndim < 1 || ndim > FA_MAX_DIMS)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: expected 1 to 4 dimensions, got %d", what, ndim);
  for (int i = 0; i < ndim; i++)
    if (shape[i] < 0)
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: size of dimension %d must be >= 0, got %lld", what, i + 1,
                     (long long)shape[i]);
  const int i = fa_shape_too_large(ndim, shape);
  if (i >= 0)
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: %s: %lld elements in dimension %d is too many", what,
                   (long long)shape[i], i + 1);
  return FA_OK;
}

static void contiguous_strides(int ndim, const int64_t *shape, int64_t *strides) {
  int64_t s = 1;
  for (int i = ndim - 1; i >= 0; i--) {
    strides[i] = s;
    s *= shape[i] ? shape[i] : 1;
  }
}

static fa_tensor *tensor_alloc(fa_context *ctx, fa_status *st, fa_storage *s, fa_dtype dtype, int ndim,
                               const int64_t *shape, const int64_t *strides, int64_t offset) {
  fa_tensor *t = fa_handle_alloc(ctx, sizeof *t, st);
  if (!t) return NULL;
  atomic_init(&t->refcount, 1);
  t->storage = s;
  t->dtype = dtype;
  t->ndim = ndim;
  memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  memcpy(t->strides, strides, sizeof(int64_t) * (size_t)ndim);
  t->offset = offset;
  return t;
}

static void storage_release(fa_storage *s) {
  if (atomic_fetch_sub(&s->refcount, 1) != 1) return;
  if (s->release) s->release(s->data, s->user);
  else if (s->accounted && s->device == FA_CPU) fa_host_free(s->data, s->nbytes);
  else if (s->accounted && s->device == FA_CUDA) (s->reusable ? fa_cuda_free_reusable : fa_cuda_free)(s->data, s->nbytes);
  fa_host_free(s, sizeof *s);
}

fa_status fa_tensor_new(fa_context *ctx, int ndim, const int64_t *shape, fa_dtype dtype, fa_device device,
                        fa_tensor **out) {
  *out = NULL;
  fa_status st = check_shape(ctx, ndim, shape, "shape");
  if (st) return st;
  if ((unsigned)dtype > FA_BOOL) return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: dtype: unknown dtype %d", (int)dtype);
  if (device == FA_CUDA && !fa_cuda_available())
    return fa_fail(ctx, FA_ERR_DEVICE,
                   "flashattn: device 'cuda' is not available (no usable GPU or no CUDA backend in this build)");
  if (device != FA_CPU && device != FA_CUDA)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: device: expected cpu or cuda");
  fa_storage *s = fa_handle_alloc(ctx, sizeof *s, &st);
  if (!s) return st;
  size_t nbytes = (size_t)fa_numel_of(ndim, shape) * fa_dtype_size(dtype);
  atomic_init(&s->refcount, 1);
  s->device = device;
  s->nbytes = nbytes;
  s->accounted = 1;
  if (device == FA_CPU) s->data = fa_host_alloc(ctx, nbytes, &st);
  else {
    st = fa_cuda_malloc(ctx, &s->data, nbytes);
    s->reusable = fa_cuda_legacy_stream(ctx);
  }
  if (st) {
    fa_host_free(s, sizeof *s);
    return st;
  }
  int64_t strides[FA_MAX_DIMS];
  contiguous_strides(ndim, shape, strides);
  fa_tensor *t = tensor_alloc(ctx, &st, s, dtype, ndim, shape, strides, 0);
  if (!t) storage_release(s);
  *out = t;
  return st;
}

fa_status fa_tensor_empty(fa_context *ctx, int ndim, const int64_t *shape, fa_dtype dtype, fa_device device,
                          fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(shape);
  return fa_tensor_new(ctx, ndim, shape, dtype, device, out);
}

fa_status fa_tensor_new_like(fa_context *ctx, const fa_tensor *like, fa_dtype dtype, fa_device device,
                             fa_tensor **out) {
  return fa_tensor_new(ctx, like->ndim, like->shape, dtype, device, out);
}

/* Strides given with a wrapped tensor: each >= 0, and the furthest element
 * any index could address - sizes 1 and 0 counted as 1 - within
 * FA_MAX_SPAN of the first, so that the offsets of iteration,
 * select and narrow (which may step over a size-1 or size-0 dimension's
 * stride) stay far from overflow.  *span: elements from the first to past
 * the last (0 for an empty tensor). */
static fa_status check_strides(fa_context *ctx, int ndim, const int64_t *shape, const int64_t *strides,
                               int64_t *span) {
  int64_t reach = 0;
  for (int i = 0; i < ndim; i++) {
    int64_t steps = shape[i] > 1 ? shape[i] - 1 : 1;
    if (strides[i] < 0 || strides[i] > (FA_MAX_SPAN - reach) / steps)
      return fa_fail(ctx, FA_ERR_ARGUMENT,
                     "flashattn: fa_tensor_wrap: stride %lld of dimension %d (size %lld): expected 0 to %lld, with "
                     "every addressable element within %lld (2^59) elements of the first",
                     (long long)strides[i], i + 1, (long long)shape[i],
                     (long long)((FA_MAX_SPAN - reach) / steps), (long long)FA_MAX_SPAN);
    reach += steps * strides[i];
  }
  int64_t n = 1;
  for (int i = 0; i < ndim; i++) {
    if (shape[i] == 0) n = 0;
    if (n) n += (shape[i] - 1) * strides[i];
  }
  *span = n;
  return FA_OK;
}

fa_status fa_tensor_wrap(fa_context *ctx, void *data, fa_device device, fa_dtype dtype, int ndim,
                         const int64_t *shape, const int64_t *strides, void (*release)(void *data, void *user),
                         void *user, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(shape);
  fa_status st = check_shape(ctx, ndim, shape, "fa_tensor_wrap: shape");
  if (st) return st;
  if ((unsigned)dtype > FA_BOOL) return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: fa_tensor_wrap: unknown dtype %d", (int)dtype);
  if (device != FA_CPU && device != FA_CUDA)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: fa_tensor_wrap: device: expected cpu or cuda");
  if (!fa_backend_available(device)) /* as fa_tensor_empty: no tensor that every later use would refuse */
    return fa_fail(ctx, FA_ERR_DEVICE,
                   "flashattn: fa_tensor_wrap: device 'cuda' is not available (no usable GPU or no CUDA backend in "
                   "this build)");
  if (!data && fa_numel_of(ndim, shape) > 0)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: fa_tensor_wrap: data is NULL");
  /* every kernel reads elements as their type: a misaligned one is undefined
   * behaviour on the CPU and a fault on the GPU */
  if ((uintptr_t)data % fa_dtype_size(dtype))
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: fa_tensor_wrap: data %p: expected an address aligned to the element size (%s: %zu "
                   "bytes)",
                   data, fa_dtype_name(dtype), fa_dtype_size(dtype));
  int64_t st_[FA_MAX_DIMS];
  int64_t span = 0;
  if (strides) {
    if ((st = check_strides(ctx, ndim, shape, strides, &span))) return st;
    memcpy(st_, strides, sizeof(int64_t) * (size_t)ndim);
  } else {
    contiguous_strides(ndim, shape, st_);
    span = fa_numel_of(ndim, shape);
  }
  fa_storage *s = fa_handle_alloc(ctx, sizeof *s, &st);
  if (!s) return st;
  atomic_init(&s->refcount, 1);
  s->device = device;
  s->data = data;
  s->nbytes = (size_t)span * fa_dtype_size(dtype);
  s->release = release;
  s->user = user;
  fa_tensor *t = tensor_alloc(ctx, &st, s, dtype, ndim, shape, st_, 0);
  if (!t) fa_host_free(s, sizeof *s); /* not storage_release: on failure `release` is not called */
  *out = t;
  return st;
}

void fa_tensor_retain(fa_tensor *t) {
  if (t) atomic_fetch_add(&t->refcount, 1);
}

void fa_tensor_release(fa_tensor *t) {
  if (!t || atomic_fetch_sub(&t->refcount, 1) != 1) return;
  storage_release(t->storage);
  fa_host_free(t, sizeof *t);
}

/* The accessors' neutral values for a NULL tensor are in flashattn.h. */
int fa_tensor_ndim(const fa_tensor *t) { return t ? t->ndim : 0; }
int64_t fa_tensor_size(const fa_tensor *t, int dim) { return t && dim >= 0 && dim < t->ndim ? t->shape[dim] : -1; }
int64_t fa_tensor_stride(const fa_tensor *t, int dim) { return t && dim >= 0 && dim < t->ndim ? t->strides[dim] : -1; }
int64_t fa_tensor_numel(const fa_tensor *t) { return t ? fa_numel_of(t->ndim, t->shape) : -1; }
fa_dtype fa_tensor_dtype(const fa_tensor *t) { return t ? t->dtype : FA_DTYPE_NONE; }
fa_device fa_tensor_device(const fa_tensor *t) { return t ? t->storage->device : FA_DEVICE_NONE; }
void *fa_tensor_data(const fa_tensor *t) { return t ? fa_tensor_ptr(t) : NULL; }

int fa_tensor_is_contiguous(const fa_tensor *t) {
  if (!t) return 0;
  /* an empty tensor has no element out of place (its strides, which
   * count a size 0 as 1, would otherwise fail the test below) */
  for (int i = 0; i < t->ndim; i++)
    if (t->shape[i] == 0) return 1;
  int64_t s = 1;
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] != 1 && t->strides[i] != s) return 0;
    s *= t->shape[i];
  }
  return 1;
}

/* ---- views ---- */

static fa_status make_view(fa_context *ctx, fa_tensor *t, int ndim, const int64_t *shape, const int64_t *strides,
                           int64_t offset, fa_tensor **out) {
  fa_status st;
  fa_tensor *v = tensor_alloc(ctx, &st, t->storage, t->dtype, ndim, shape, strides, offset);
  if (!v) return st;
  atomic_fetch_add(&t->storage->refcount, 1);
  *out = v;
  return FA_OK;
}

static fa_status check_dim(fa_context *ctx, const fa_tensor *t, int dim, const char *what) {
  if (dim < 0 || dim >= t->ndim)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: %s: dimension %lld out of range for a %d-D tensor", what,
                   (long long)dim + 1, t->ndim);
  return FA_OK;
}

/* shape_in with its one -1 inferred, into shape, checked against t's
 * element count; what names the call in errors. */
static fa_status resolve_shape(fa_context *ctx, const fa_tensor *t, int ndim, const int64_t *shape_in,
                               int64_t *shape, const char *what) {
  if (ndim < 1 || ndim > FA_MAX_DIMS)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: expected 1 to 4 dimensions, got %d", what, ndim);
  int infer = -1;
  int64_t known = 1, span = 1, n = fa_tensor_numel(t);
  for (int i = 0; i < ndim; i++) {
    shape[i] = shape_in[i];
    if (shape[i] == -1 && infer < 0) infer = i;
    else if (shape[i] < 0)
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: bad size %lld for dimension %d", what, (long long)shape[i],
                     i + 1);
    else if (shape[i] && span > FA_MAX_SPAN / shape[i]) /* before it can wrap around to n */
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: size %lld of dimension %d is too large", what,
                     (long long)shape[i], i + 1);
    else {
      known *= shape[i];
      if (shape[i]) span *= shape[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || n % known)
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: cannot infer dimension %d for %lld elements", what, infer + 1,
                     (long long)n);
    shape[infer] = n / known;
    known *= shape[infer];
  }
  char buf[64];
  if (known != n)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: %s: shape has %lld elements but the tensor (%s) has %lld", what,
                   (long long)known, fa_shape_str(t, buf, sizeof buf), (long long)n);
  return FA_OK;
}

/* Strides that make t's elements, in row-major order, a tensor of `shape`
 * (as many elements) without moving them, as PyTorch's view finds them:
 * each run of t's dimensions that are contiguous with one another
 * (stride[d - 1] = size[d]·stride[d], size-1 dimensions aside) must be
 * covered by whole dimensions of the new shape.  0 when none exist. */
static int view_strides(const fa_tensor *t, int ndim, const int64_t *shape, int64_t *strides) {
  if (fa_tensor_numel(t) == 0) {
    contiguous_strides(ndim, shape, strides);
    return 1;
  }
  int vd = ndim - 1;
  int64_t base = t->strides[t->ndim - 1], tn = 1, vn = 1;
  for (int d = t->ndim - 1; d >= 0; d--) {
    tn *= t->shape[d];
    if (d == 0 || (t->shape[d - 1] != 1 && t->strides[d - 1] != tn * base)) { /* a run ends at d */
      while (vd >= 0 && (vn < tn || shape[vd] == 1)) {
        strides[vd] = vn * base;
        vn *= shape[vd--];
      }
      if (vn != tn) return 0;
      if (d > 0) base = t->strides[d - 1], tn = 1, vn = 1;
    }
  }
  return vd == -1;
}

/* fa_tensor_view, and fa_tensor_reshape (may_copy); the callers check the
 * pointers, so that a NULL is named with the API call */
static fa_status view_of(fa_context *ctx, fa_tensor *t, int ndim, const int64_t *shape_in, int may_copy,
                         fa_tensor **out) {
  int64_t shape[FA_MAX_DIMS], strides[FA_MAX_DIMS];
  fa_status st = resolve_shape(ctx, t, ndim, shape_in, shape, may_copy ? "reshape" : "view");
  if (st) return st;
  if (view_strides(t, ndim, shape, strides)) return make_view(ctx, t, ndim, shape, strides, t->offset, out);
  if (!may_copy)
    return fa_fail(ctx, FA_ERR_SHAPE,
                   "flashattn: view: the tensor's strides do not allow this shape without a copy (use reshape)");
  fa_tensor *c = NULL;
  if ((st = fa_tensor_contiguous(ctx, t, &c))) return st;
  contiguous_strides(ndim, shape, strides);
  st = make_view(ctx, c, ndim, shape, strides, c->offset, out);
  fa_tensor_release(c); /* the view holds the copy's storage */
  return st;
}

#define VIEW_ARGS_NEEDED() \
  FA_NEED(out);               \
  *out = NULL;                \
  FA_NEED(ctx);               \
  FA_NEED(t);                 \
  FA_NEED(shape)

fa_status fa_tensor_view(fa_context *ctx, fa_tensor *t, int ndim, const int64_t *shape, fa_tensor **out) {
  VIEW_ARGS_NEEDED();
  return view_of(ctx, t, ndim, shape, 0, out);
}

fa_status fa_tensor_reshape(fa_context *ctx, fa_tensor *t, int ndim, const int64_t *shape, fa_tensor **out) {
  VIEW_ARGS_NEEDED();
  return view_of(ctx, t, ndim, shape, 1, out);
}

fa_status fa_tensor_select(fa_context *ctx, fa_tensor *t, int dim, int64_t index, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(t);
  fa_status st = check_dim(ctx, t, dim, "select");
  if (st) return st;
  if (t->ndim == 1)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: select: a 1-D tensor has no sub-tensor (use get)");
  if (index < 0 || index >= t->shape[dim])
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: index %lld out of range for dimension %d of size %lld",
                   fa_one_based(index), dim + 1, (long long)t->shape[dim]);
  int64_t shape[FA_MAX_DIMS], strides[FA_MAX_DIMS];
  int k = 0;
  for (int i = 0; i < t->ndim; i++)
    if (i != dim) {
      shape[k] = t->shape[i];
      strides[k++] = t->strides[i];
    }
  return make_view(ctx, t, k, shape, strides, t->offset + index * t->strides[dim], out);
}

fa_status fa_tensor_narrow(fa_context *ctx, fa_tensor *t, int dim, int64_t start, int64_t len, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(t);
  fa_status st = check_dim(ctx, t, dim, "narrow");
  if (st) return st;
  if (start < 0 || len < 0 || start > t->shape[dim] || len > t->shape[dim] - start)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: narrow: start %lld and length %lld do not fit dimension %d of size %lld",
                   fa_one_based(start), (long long)len, dim + 1, (long long)t->shape[dim]);
  int64_t shape[FA_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  shape[dim] = len;
  return make_view(ctx, t, t->ndim, shape, t->strides, t->offset + (len ? start * t->strides[dim] : 0), out);
}

fa_status fa_tensor_transpose(fa_context *ctx, fa_tensor *t, int d1, int d2, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(t);
  fa_status st = check_dim(ctx, t, d1, "transpose");
  if (!st) st = check_dim(ctx, t, d2, "transpose");
  if (st) return st;
  int64_t shape[FA_MAX_DIMS], strides[FA_MAX_DIMS];
  memcpy(shape, t->shape, sizeof shape);
  memcpy(strides, t->strides, sizeof strides);
  shape[d1] = t->shape[d2], shape[d2] = t->shape[d1];
  strides[d1] = t->strides[d2], strides[d2] = t->strides[d1];
  return make_view(ctx, t, t->ndim, shape, strides, t->offset, out);
}

/* ---- iteration in row-major order over a strided tensor ---- */

void fa_iter_init(fa_iter *it, const fa_tensor *t) {
  it->ndim = t->ndim;
  memcpy(it->shape, t->shape, sizeof it->shape);
  memcpy(it->strides, t->strides, sizeof it->strides);
  memset(it->idx, 0, sizeof it->idx);
  it->offset = 0;
}

void fa_iter_next(fa_iter *it) {
  for (int d = it->ndim - 1; d >= 0; d--) {
    it->offset += it->strides[d];
    if (++it->idx[d] < it->shape[d]) return;
    it->offset -= it->strides[d] * it->idx[d];
    it->idx[d] = 0;
  }
}
