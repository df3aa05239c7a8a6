/* DLPack in the C API (API §7, issue 23): zero-copy exchange of tensors
 * with PyTorch, JAX, CuPy and NumPy through DLPack's DLManagedTensor.
 *
 * Import wraps the producer's memory with fa_tensor_wrap, whose release
 * callback calls the DLManagedTensor's deleter: the storage is shared by
 * the tensor and every view of it, so the deleter runs once, when the last
 * of them goes.  Export hands out a DLManagedTensor that holds a reference
 * to the tensor (and so to its storage); its deleter drops that reference
 * and frees the record.  Built without <dlpack/dlpack.h> (CMake's
 * DLPACK_INCLUDE_DIR not found), both calls return FA_ERR_UNSUPPORTED.
 * docs/dlpack.md is the user's description. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

#ifndef FA_HAVE_DLPACK

fa_status fa_tensor_from_dlpack(fa_context *ctx, struct DLManagedTensor *managed, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(managed);
  return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                 "flashattn: fa_tensor_from_dlpack: this build has no DLPack support (dlpack/dlpack.h was not found)");
}

fa_status fa_tensor_to_dlpack(fa_context *ctx, fa_tensor *t, struct DLManagedTensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(t);
  return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                 "flashattn: fa_tensor_to_dlpack: this build has no DLPack support (dlpack/dlpack.h was not found)");
}

#else

#include <dlpack/dlpack.h>

/* kDLBool (DLPack 0.8 and later; Debian 12's header is 0.6): the value is
 * fixed by the standard, so that it is understood whatever header this
 * was built with. */
#define FA_DL_BOOL 6

/* ---- import ---- */

static void release_managed(void *data, void *user) {
  (void)data;
  DLManagedTensor *m = user;
  if (m->deleter) m->deleter(m);
}

static const char *device_type_name(int type) {
  switch (type) {
  case kDLCPU: return "kDLCPU";
  case kDLCUDA: return "kDLCUDA";
  case kDLCUDAHost: return "kDLCUDAHost";
  case kDLOpenCL: return "kDLOpenCL";
  case kDLVulkan: return "kDLVulkan";
  case kDLMetal: return "kDLMetal";
  case kDLVPI: return "kDLVPI";
  case kDLROCM: return "kDLROCM";
  case kDLROCMHost: return "kDLROCMHost";
  case kDLExtDev: return "kDLExtDev";
  case kDLCUDAManaged: return "kDLCUDAManaged";
  default: return "unknown";
  }
}

static fa_status import_device(fa_context *ctx, DLDevice dev, fa_device *out) {
  switch ((int)dev.device_type) {
  case kDLCPU:
  case kDLCUDAHost: /* pinned host memory: the CPU reads it */
    *out = FA_CPU;
    return FA_OK;
  case kDLCUDA:
  case kDLCUDAManaged: {
    if (!fa_cuda_available())
      return fa_fail(ctx, FA_ERR_DEVICE,
                     "flashattn: fa_tensor_from_dlpack: a %s tensor, but device 'cuda' is not available (no usable "
                     "GPU or no CUDA backend in this build)",
                     device_type_name((int)dev.device_type));
    int cur = fa_cuda_current_index();
    if (dev.device_id != cur)
      return fa_fail(ctx, FA_ERR_DEVICE,
                     "flashattn: fa_tensor_from_dlpack: a tensor on CUDA device %d, but the engine runs on the current "
                     "device %d (cudaSetDevice it first)",
                     dev.device_id, cur);
    *out = FA_CUDA;
    return FA_OK;
  }
  default:
    return fa_fail(ctx, FA_ERR_DEVICE,
                   "flashattn: fa_tensor_from_dlpack: device type %d (%s): expected kDLCPU, kDLCUDAHost, kDLCUDA or "
                   "kDLCUDAManaged",
                   (int)dev.device_type, device_type_name((int)dev.device_type));
  }
}

static fa_status import_dtype(fa_context *ctx, DLDataType t, fa_dtype *out) {
  static const char *const codes[] = {"int", "uint", "float", "opaque handle", "bfloat", "complex", "bool"};
  const char *code = t.code < sizeof codes / sizeof codes[0] ? codes[t.code] : "unknown code";
  if (t.lanes != 1)
    return fa_fail(ctx, FA_ERR_DTYPE,
                   "flashattn: fa_tensor_from_dlpack: dtype %s%u with %u lanes: only lanes = 1 (scalars) is supported",
                   code, (unsigned)t.bits, (unsigned)t.lanes);
  if (t.code == kDLFloat && t.bits == 32) *out = FA_F32;
  else if (t.code == kDLFloat && t.bits == 16) *out = FA_F16;
  else if (t.code == kDLBfloat && t.bits == 16) *out = FA_BF16;
  else if (t.code == kDLFloat && t.bits == 64) *out = FA_F64;
  /* bool: one byte, nonzero = true.  uint8 is taken as bool too: NumPy
   * 1.24 and PyTorch before DLPack 0.8 hand bool out as uint8, and the
   * engine's export does with a DLPack 0.6 header */
  else if ((t.code == FA_DL_BOOL || t.code == kDLUInt) && t.bits == 8) *out = FA_BOOL;
  else
    return fa_fail(ctx, FA_ERR_DTYPE,
                   "flashattn: fa_tensor_from_dlpack: dtype %s%u (code %u, bits %u): expected float32, float16, "
                   "bfloat16, float64, bool or uint8 (taken as bool)",
                   code, (unsigned)t.bits, (unsigned)t.code, (unsigned)t.bits);
  return FA_OK;
}

fa_status fa_tensor_from_dlpack(fa_context *ctx, DLManagedTensor *managed, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(managed);
  const DLTensor *dl = &managed->dl_tensor;
  fa_device device = FA_CPU;
  fa_dtype dtype = FA_F32;
  fa_status st = import_device(ctx, dl->device, &device);
  if (!st) st = import_dtype(ctx, dl->dtype, &dtype);
  if (st) return st;
  if (dl->ndim < 1 || dl->ndim > FA_MAX_DIMS)
    return fa_fail(ctx, FA_ERR_SHAPE,
                   "flashattn: fa_tensor_from_dlpack: expected 1 to 4 dimensions, got %d%s", dl->ndim,
                   dl->ndim == 0 ? " (a scalar: reshape it to 1 element first)" : "");
  if (!dl->shape) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: fa_tensor_from_dlpack: dl_tensor.shape is NULL");
  int ndim = dl->ndim;
  int64_t numel = 1;
  for (int i = 0; i < ndim; i++) {
    if (dl->shape[i] < 0)
      return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: fa_tensor_from_dlpack: size of dimension %d must be >= 0, got %lld",
                     i + 1, (long long)dl->shape[i]);
    if (dl->shape[i] == 0) numel = 0;
  }
  /* Strides as the engine takes them: NULL (and any tensor with no
   * element) is row-major; a dimension of size 1 is never stepped over, so
   * whatever stride the producer gave it (PyTorch's may be anything) is
   * replaced by the row-major one; any other must be >= 0 */
  int64_t strides[FA_MAX_DIMS];
  const int64_t *use_strides = NULL;
  if (dl->strides && numel > 0) {
    int64_t contig = 1;
    for (int i = ndim - 1; i >= 0; i--) {
      if (dl->shape[i] == 1) strides[i] = contig;
      else if (dl->strides[i] < 0)
        return fa_fail(ctx, FA_ERR_ARGUMENT,
                       "flashattn: fa_tensor_from_dlpack: stride %lld of dimension %d (size %lld): negative strides "
                       "are not supported (make the array contiguous first)",
                       (long long)dl->strides[i], i + 1, (long long)dl->shape[i]);
      else strides[i] = dl->strides[i];
      /* the products stay small: wrap checks the shape first (FA_MAX_SPAN) */
      if (contig <= INT64_MAX / 16 / (dl->shape[i] ? dl->shape[i] : 1)) contig *= dl->shape[i];
    }
    use_strides = strides;
  }
  /* the first element: data + byte_offset, aligned to the element size */
  size_t esize = fa_dtype_size(dtype);
  char *data = dl->data;
  if (numel > 0) {
    if (!data) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: fa_tensor_from_dlpack: dl_tensor.data is NULL");
    if (dl->byte_offset > (uint64_t)(UINTPTR_MAX - (uintptr_t)data))
      return fa_fail(ctx, FA_ERR_ARGUMENT,
                     "flashattn: fa_tensor_from_dlpack: byte_offset %llu runs past the end of the address space",
                     (unsigned long long)dl->byte_offset);
    data = (char *)((uintptr_t)data + (uintptr_t)dl->byte_offset);
    if ((uintptr_t)data % esize)
      return fa_fail(ctx, FA_ERR_ARGUMENT,
                     "flashattn: fa_tensor_from_dlpack: the first element (data %p + byte_offset %llu) is not aligned "
                     "to its size, %zu bytes",
                     dl->data, (unsigned long long)dl->byte_offset, esize);
  } else {
    data = NULL; /* nothing is ever read: no pointer arithmetic on what may be NULL */
  }
  st = fa_tensor_wrap(ctx, data, device, dtype, ndim, dl->shape, use_strides, release_managed, managed, out);
  if (st) {
    /* wrap's message, with this function's name: the shape and strides it
     * checks are the DLPack tensor's */
    static const char prefix[] = "flashattn: fa_tensor_wrap: ";
    if (strncmp(ctx->error, prefix, sizeof prefix - 1) == 0) {
      char rest[FA_ERRMSG_LEN];
      snprintf(rest, sizeof rest, "%s", ctx->error + sizeof prefix - 1);
      fa_fail(ctx, st, "flashattn: fa_tensor_from_dlpack: %s", rest);
    }
  }
  return st;
}

/* ---- export ---- */

/* The record handed out: the DLManagedTensor first, the arrays its
 * DLTensor points to, and the reference it holds. */
typedef struct {
  DLManagedTensor managed;
  int64_t shape[FA_MAX_DIMS];
  int64_t strides[FA_MAX_DIMS];
  fa_tensor *tensor;
} fa_dlpack_export;

static void export_deleter(DLManagedTensor *self) {
  if (!self) return;
  fa_dlpack_export *e = self->manager_ctx;
  fa_tensor_release(e->tensor);
  fa_host_free(e, sizeof *e);
}

static DLDataType export_dtype(fa_dtype d) {
  DLDataType t = {kDLFloat, 32, 1};
  switch (d) {
  case FA_F32: break;
  case FA_F16: t.bits = 16; break;
  case FA_BF16: t.code = kDLBfloat, t.bits = 16; break;
  case FA_F64: t.bits = 64; break;
  case FA_BOOL:
#if DLPACK_VERSION >= 80
    t.code = kDLBool, t.bits = 8;
#else
    t.code = kDLUInt, t.bits = 8; /* consumers of DLPack 0.6 know no bool */
#endif
    break;
  }
  return t;
}

fa_status fa_tensor_to_dlpack(fa_context *ctx, fa_tensor *t, DLManagedTensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(t);
  DLDevice dev = {kDLCPU, 0};
  if (t->storage->device == FA_CUDA) {
    dev.device_type = kDLCUDA;
    dev.device_id = fa_cuda_current_index();
    if (dev.device_id < 0)
      return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: fa_tensor_to_dlpack: the current CUDA device cannot be told");
  }
  fa_status st;
  fa_dlpack_export *e = fa_handle_alloc(ctx, sizeof *e, &st);
  if (!e) return st;
  fa_tensor_retain(t);
  e->tensor = t;
  int64_t numel = fa_numel_of(t->ndim, t->shape);
  for (int i = 0; i < t->ndim; i++) {
    e->shape[i] = t->shape[i];
    e->strides[i] = t->strides[i];
  }
  DLTensor *dl = &e->managed.dl_tensor;
  /* The first element's address itself, byte_offset 0: what PyTorch hands
   * out, and what consumers that ignore byte_offset (older PyTorch) read
   * correctly.  An empty tensor whose storage has no memory gives NULL. */
  dl->data = numel > 0 || t->storage->data ? fa_tensor_ptr(t) : NULL;
  dl->device = dev;
  dl->ndim = t->ndim;
  dl->dtype = export_dtype(t->dtype);
  dl->shape = e->shape;
  dl->strides = e->strides;
  dl->byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = export_deleter;
  *out = &e->managed;
  return FA_OK;
}

#endif
