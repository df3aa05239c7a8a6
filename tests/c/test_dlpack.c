/* DLPack in the C API (issue 23, API §7): fa_tensor_from_dlpack and
 * fa_tensor_to_dlpack.  Import of every dtype, zero copy (the data pointer
 * is the producer's, writes go through), byte_offset, strides, views that
 * outlive their base; the producer's deleter called exactly once, when the
 * last reference goes, and never on a failed import (the caller keeps
 * ownership); export of tensors and views; round trips both ways; the
 * memory limit; every engine byte back at the end.  The producer's buffers
 * are malloc'd and freed by its deleter, so that ASan and valgrind see any
 * use after it has run. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "testutil.h"

#ifdef FA_HAVE_DLPACK
#include <dlpack/dlpack.h>

static fa_context *ctx;

/* ---- a producer: a DLManagedTensor over a malloc'd buffer ---- */

typedef struct {
  DLManagedTensor m;
  int64_t shape[8], strides[8];
  void *buf;
  int deleted; /* times its deleter ran */
} producer;

static int deleter_calls;

static void producer_deleter(DLManagedTensor *self) {
  producer *p = self->manager_ctx;
  p->deleted++;
  deleter_calls++;
  free(p->buf);
  p->buf = NULL;
}

/* A producer of `nbytes` bytes (copied from `init` when not NULL), with the
 * tensor's fields set; strides NULL = none given. */
static void producer_init(producer *p, const void *init, size_t nbytes, DLDataType dt, int ndim,
                          const int64_t *shape, const int64_t *strides, uint64_t byte_offset) {
  memset(p, 0, sizeof *p);
  p->buf = malloc(nbytes ? nbytes : 1);
  if (init) memcpy(p->buf, init, nbytes);
  else memset(p->buf, 0, nbytes);
  for (int i = 0; i < ndim && i < 8; i++) {
    p->shape[i] = shape[i];
    if (strides) p->strides[i] = strides[i];
  }
  p->m.dl_tensor.data = p->buf;
  p->m.dl_tensor.device.device_type = kDLCPU;
  p->m.dl_tensor.device.device_id = 0;
  p->m.dl_tensor.ndim = ndim;
  p->m.dl_tensor.dtype = dt;
  p->m.dl_tensor.shape = p->shape;
  p->m.dl_tensor.strides = strides ? p->strides : NULL;
  p->m.dl_tensor.byte_offset = byte_offset;
  p->m.manager_ctx = p;
  p->m.deleter = producer_deleter;
}

static const DLDataType DT_F32 = {kDLFloat, 32, 1}, DT_F16 = {kDLFloat, 16, 1}, DT_BF16 = {kDLBfloat, 16, 1},
                        DT_F64 = {kDLFloat, 64, 1}, DT_BOOL = {6 /* kDLBool */, 8, 1}, DT_U8 = {kDLUInt, 8, 1};

static void read_all(fa_tensor *t, double *vals) { CHECK_OK(ctx, fa_tensor_read_f64(ctx, t, vals)); }

/* An engine tensor filled by fa_tensor_fill_random (NULL on a failure, checked). */
static fa_tensor *filled(int ndim, const int64_t *shape, fa_dtype dt, fa_device dev, fa_fill_kind kind, uint64_t seed) {
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, ndim, shape, dt, dev, &t));
  if (t) CHECK_OK(ctx, fa_tensor_fill_random(ctx, t, kind, seed));
  return t;
}

/* ---- import ---- */

static void test_import_dtypes(void) {
  tu_test = "import every dtype";
  const int64_t shape[2] = {2, 2};
  const double want[4] = {0, 1, -2, 0.5};
  const float f32[4] = {0, 1, -2, 0.5f};
  const uint16_t f16[4] = {0x0000, 0x3C00, 0xC000, 0x3800};
  const uint16_t bf16[4] = {0x0000, 0x3F80, 0xC000, 0x3F00};
  const double f64[4] = {0, 1, -2, 0.5};
  const uint8_t b8[4] = {0, 1, 0, 7}; /* nonzero = true */
  const double want_b[4] = {0, 1, 0, 1};
  struct {
    const char *name;
    const void *init;
    size_t nbytes;
    DLDataType dt;
    fa_dtype fa;
    const double *want;
  } cases[] = {
      {"f32", f32, sizeof f32, DT_F32, FA_F32, want},       {"f16", f16, sizeof f16, DT_F16, FA_F16, want},
      {"bf16", bf16, sizeof bf16, DT_BF16, FA_BF16, want},  {"f64", f64, sizeof f64, DT_F64, FA_F64, want},
      {"kDLBool", b8, sizeof b8, DT_BOOL, FA_BOOL, want_b}, {"uint8", b8, sizeof b8, DT_U8, FA_BOOL, want_b},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    producer p;
    producer_init(&p, cases[c].init, cases[c].nbytes, cases[c].dt, 2, shape, NULL, 0);
    void *buf = p.buf;
    fa_tensor *t = NULL;
    CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
    if (!t) continue;
    CHECK(fa_tensor_dtype(t) == cases[c].fa, "%s: dtype %s", cases[c].name, fa_dtype_name(fa_tensor_dtype(t)));
    CHECK(fa_tensor_device(t) == FA_CPU, "%s: device", cases[c].name);
    CHECK(fa_tensor_ndim(t) == 2 && fa_tensor_size(t, 0) == 2 && fa_tensor_size(t, 1) == 2, "%s: shape", cases[c].name);
    CHECK(fa_tensor_data(t) == buf, "%s: zero copy: data %p, buffer %p", cases[c].name, fa_tensor_data(t), buf);
    CHECK(fa_tensor_is_contiguous(t), "%s: NULL strides are row-major", cases[c].name);
    double got[4];
    read_all(t, got);
    for (int i = 0; i < 4; i++)
      CHECK(got[i] == cases[c].want[i], "%s: element %d is %g, expected %g", cases[c].name, i, got[i], cases[c].want[i]);
    CHECK(p.deleted == 0, "%s: deleter ran while the tensor lives", cases[c].name);
    fa_tensor_release(t);
    CHECK(p.deleted == 1, "%s: deleter ran %d times after the release", cases[c].name, p.deleted);
  }
}

/* Writes through the engine land in the producer's buffer, and the kernels
 * read the imported tensor. */
static void test_import_zero_copy_writes(void) {
  tu_test = "import: writes and kernels";
  const int64_t shape[2] = {3, 4};
  producer p;
  producer_init(&p, NULL, 12 * sizeof(float), DT_F32, 2, shape, NULL, 0);
  float *buf = p.buf;
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
  if (!t) return;
  CHECK_OK(ctx, fa_tensor_fill(ctx, t, 2.5));
  for (int i = 0; i < 12; i++) CHECK(buf[i] == 2.5f, "buffer[%d] = %g after fill", i, buf[i]);
  int64_t idx[2] = {1, 2};
  CHECK_OK(ctx, fa_tensor_set(ctx, t, idx, -1.0));
  CHECK(buf[6] == -1.0f, "set(1,2) wrote buffer[6] = %g", buf[6]);
  for (int i = 0; i < 12; i++) buf[i] = (float)i;
  fa_tensor *y = NULL;
  CHECK_OK(ctx, fa_softmax(ctx, t, NULL, &y));
  if (y) {
    double v[12];
    read_all(y, v);
    double row0 = 0;
    for (int j = 0; j < 4; j++) row0 += exp(j);
    CHECK(fabs(v[0] - 1 / row0) < 1e-6, "softmax of the imported rows: %g vs %g", v[0], 1 / row0);
    fa_tensor_release(y);
  }
  fa_tensor_release(t);
  CHECK(p.deleted == 1, "deleter ran %d times", p.deleted);
}

static void test_import_views(void) {
  tu_test = "import: views outlive the base";
  const int64_t shape[3] = {2, 3, 4};
  float vals[24];
  for (int i = 0; i < 24; i++) vals[i] = (float)i;
  producer p;
  producer_init(&p, vals, sizeof vals, DT_F32, 3, shape, NULL, 0);
  fa_tensor *t = NULL, *sel = NULL, *nar = NULL, *tr = NULL;
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
  if (!t) return;
  CHECK_OK(ctx, fa_tensor_select(ctx, t, 0, 1, &sel));
  CHECK_OK(ctx, fa_tensor_narrow(ctx, t, 2, 1, 2, &nar));
  CHECK_OK(ctx, fa_tensor_transpose(ctx, t, 1, 2, &tr));
  fa_tensor_release(t);
  CHECK(p.deleted == 0, "deleter ran with views alive");
  int64_t i2[2] = {2, 3}, i3[3] = {1, 3, 2};
  double v = -1;
  if (sel) CHECK_OK(ctx, fa_tensor_get(ctx, sel, i2, &v));
  CHECK(v == 23, "select(0,1)[2][3] = %g", v);
  if (tr) CHECK_OK(ctx, fa_tensor_get(ctx, tr, i3, &v));
  CHECK(v == 12 + 2 * 4 + 3, "transpose[1][3][2] = %g", v);
  fa_tensor_release(sel);
  fa_tensor_release(tr);
  CHECK(p.deleted == 0, "deleter ran with one view alive");
  int64_t i3b[3] = {1, 2, 1};
  if (nar) CHECK_OK(ctx, fa_tensor_get(ctx, nar, i3b, &v));
  CHECK(v == 12 + 8 + 2, "narrow[1][2][1] = %g", v);
  fa_tensor_release(nar);
  CHECK(p.deleted == 1, "deleter ran %d times after the last view", p.deleted);
}

static void test_import_offset_strides(void) {
  tu_test = "import: byte_offset and strides";
  /* a 3 x 2 column-major f64 block that starts 3 elements into the buffer */
  double buf[16];
  for (int i = 0; i < 16; i++) buf[i] = 100 + i;
  const int64_t shape[2] = {3, 2}, strides[2] = {1, 3};
  producer p;
  producer_init(&p, buf, sizeof buf, DT_F64, 2, shape, strides, 3 * sizeof(double));
  char *base = p.buf;
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
  if (t) {
    CHECK(fa_tensor_data(t) == base + 3 * sizeof(double), "data = buffer + byte_offset");
    CHECK(fa_tensor_stride(t, 0) == 1 && fa_tensor_stride(t, 1) == 3, "strides %lld %lld",
          (long long)fa_tensor_stride(t, 0), (long long)fa_tensor_stride(t, 1));
    CHECK(!fa_tensor_is_contiguous(t), "column-major is not contiguous");
    double v[6];
    read_all(t, v);
    const double want[6] = {103, 106, 104, 107, 105, 108};
    for (int i = 0; i < 6; i++) CHECK(v[i] == want[i], "element %d = %g, expected %g", i, v[i], want[i]);
    fa_tensor *c = NULL;
    CHECK_OK(ctx, fa_tensor_contiguous(ctx, t, &c));
    fa_tensor_release(c);
    fa_tensor_release(t);
  }
  CHECK(p.deleted == 1, "deleter ran %d times", p.deleted);

  /* size-1 dimensions: whatever stride the producer gave them is ignored */
  const int64_t shape1[3] = {1, 4, 1}, strides1[3] = {-7, 1, INT64_MAX};
  float f[4] = {1, 2, 3, 4};
  producer_init(&p, f, sizeof f, DT_F32, 3, shape1, strides1, 0);
  t = NULL;
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
  if (t) {
    CHECK(fa_tensor_is_contiguous(t), "size-1 strides ignored");
    double v[4];
    read_all(t, v);
    CHECK(v[0] == 1 && v[3] == 4, "values %g %g", v[0], v[3]);
    fa_tensor_release(t);
  }
  CHECK(p.deleted == 1, "deleter ran %d times", p.deleted);

  /* empty: a NULL data pointer is fine, nothing is read */
  const int64_t shape0[2] = {0, 5}, strides0[2] = {-1, -1};
  producer_init(&p, NULL, 0, DT_F32, 2, shape0, strides0, 12345);
  free(p.buf);
  p.buf = NULL;
  p.m.dl_tensor.data = NULL;
  t = NULL;
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
  CHECK(t && fa_tensor_numel(t) == 0, "empty tensor");
  fa_tensor_release(t);
  CHECK(p.deleted == 1, "deleter ran %d times", p.deleted);

  /* broadcast (stride 0) is a legal input layout */
  const int64_t shapeb[2] = {3, 2}, stridesb[2] = {0, 1};
  float fb[2] = {5, 6};
  producer_init(&p, fb, sizeof fb, DT_F32, 2, shapeb, stridesb, 0);
  t = NULL;
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
  if (t) {
    double v[6];
    read_all(t, v);
    CHECK(v[0] == 5 && v[1] == 6 && v[4] == 5 && v[5] == 6, "broadcast values");
    fa_tensor_release(t);
  }
  CHECK(p.deleted == 1, "deleter ran %d times", p.deleted);
}

/* Every refused import: the status, a message naming the function, *out
 * cleared, the deleter not run; the caller then still owns it. */
static void refuse(producer *p, fa_status want, const char *word) {
  fa_tensor *t = (fa_tensor *)&ctx; /* poison: the call must clear it */
  int before = deleter_calls;
  CHECK_STATUS(ctx, want, fa_tensor_from_dlpack(ctx, &p->m, &t));
  CHECK(t == NULL, "*out not cleared");
  CHECK(deleter_calls == before && p->deleted == 0, "deleter ran on a refused import");
  CHECK(strstr(fa_context_error(ctx), "fa_tensor_from_dlpack") != NULL, "message: %s", fa_context_error(ctx));
  if (word) CHECK(strstr(fa_context_error(ctx), word) != NULL, "'%s' not in: %s", word, fa_context_error(ctx));
  p->m.deleter(&p->m); /* the caller's to free */
  CHECK(p->deleted == 1, "deleter");
}

static void test_import_errors(void) {
  tu_test = "import: errors leave ownership with the caller";
  const int64_t s1[1] = {4}, s2[2] = {2, 2}, s5[5] = {1, 1, 1, 1, 4};
  producer p;
#define FRESH(dt, nd, shape, strides, off) producer_init(&p, NULL, 64, dt, nd, shape, strides, off)

  FRESH(DT_F32, 0, s1, NULL, 0);
  refuse(&p, FA_ERR_SHAPE, "scalar");
  FRESH(DT_F32, 5, s5, NULL, 0);
  refuse(&p, FA_ERR_SHAPE, "got 5");
  FRESH(DT_F32, -1, s1, NULL, 0);
  refuse(&p, FA_ERR_SHAPE, "dimensions");

  static const struct {
    DLDataType dt;
    const char *word;
  } bad_dtypes[] = {{{kDLFloat, 32, 4}, "lanes"},  {{kDLInt, 32, 1}, "int32"},      {{kDLUInt, 16, 1}, "uint16"},
                    {{kDLFloat, 8, 1}, "float8"},  {{kDLComplex, 64, 1}, "complex64"}, {{kDLBfloat, 32, 1}, "bfloat32"},
                    {{6, 1, 1}, "bool1"},          {{200, 32, 1}, "code 200"}};
  for (size_t i = 0; i < sizeof bad_dtypes / sizeof bad_dtypes[0]; i++) {
    FRESH(bad_dtypes[i].dt, 1, s1, NULL, 0);
    refuse(&p, FA_ERR_DTYPE, bad_dtypes[i].word);
  }

  FRESH(DT_F32, 1, s1, NULL, 0);
  p.m.dl_tensor.device.device_type = kDLOpenCL;
  refuse(&p, FA_ERR_DEVICE, "kDLOpenCL");
  FRESH(DT_F32, 1, s1, NULL, 0);
  p.m.dl_tensor.device.device_type = (DLDeviceType)99;
  refuse(&p, FA_ERR_DEVICE, "99");
  if (!fa_backend_available(FA_CUDA)) {
    FRESH(DT_F32, 1, s1, NULL, 0);
    p.m.dl_tensor.device.device_type = kDLCUDA;
    refuse(&p, FA_ERR_DEVICE, "not available");
  } else {
    FRESH(DT_F32, 1, s1, NULL, 0);
    p.m.dl_tensor.device.device_type = kDLCUDA;
    p.m.dl_tensor.device.device_id = 1000;
    refuse(&p, FA_ERR_DEVICE, "device 1000");
  }

  const int64_t neg[2] = {2, 2}, negs[2] = {-2, 1};
  FRESH(DT_F32, 2, neg, negs, 0);
  refuse(&p, FA_ERR_ARGUMENT, "negative");
  const int64_t bad[2] = {2, -3};
  FRESH(DT_F32, 2, bad, NULL, 0);
  refuse(&p, FA_ERR_SHAPE, "-3");
  const int64_t huge[2] = {2, 2}, huges[2] = {INT64_MAX / 2, 1};
  FRESH(DT_F32, 2, huge, huges, 0);
  refuse(&p, FA_ERR_ARGUMENT, "stride");
  const int64_t big[4] = {INT64_MAX / 4, 16, 16, 16};
  FRESH(DT_F32, 4, big, NULL, 0);
  refuse(&p, FA_ERR_OUT_OF_MEMORY, "too many");

  FRESH(DT_F32, 2, s2, NULL, 2); /* byte_offset 2: not on a float's boundary */
  refuse(&p, FA_ERR_ARGUMENT, "aligned");
  FRESH(DT_F32, 2, s2, NULL, UINT64_MAX - 1);
  refuse(&p, FA_ERR_ARGUMENT, "byte_offset");
  FRESH(DT_F32, 2, s2, NULL, 0);
  p.m.dl_tensor.shape = NULL;
  refuse(&p, FA_ERR_ARGUMENT, "shape");
  FRESH(DT_F32, 2, s2, NULL, 0);
  p.m.dl_tensor.data = NULL; /* the deleter still frees p.buf */
  refuse(&p, FA_ERR_ARGUMENT, "data");
#undef FRESH

  /* NULL arguments */
  fa_tensor *t = NULL;
  DLManagedTensor *m = NULL;
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_from_dlpack(ctx, NULL, &t));
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_to_dlpack(ctx, NULL, &m));
  CHECK(fa_tensor_from_dlpack(NULL, NULL, &t) == FA_ERR_ARGUMENT, "NULL context");
  CHECK(fa_tensor_to_dlpack(NULL, NULL, &m) == FA_ERR_ARGUMENT, "NULL context");
  producer_init(&p, NULL, 16, DT_F32, 1, s1, NULL, 0);
  CHECK_STATUS(ctx, FA_ERR_ARGUMENT, fa_tensor_from_dlpack(ctx, &p.m, NULL));
  CHECK(fa_tensor_from_dlpack(NULL, &p.m, &t) == FA_ERR_ARGUMENT && t == NULL, "NULL context");
  CHECK(p.deleted == 0, "deleter ran");
  p.m.deleter(&p.m);

  /* a NULL deleter is legal: nothing to call */
  producer_init(&p, NULL, 16, DT_F32, 1, s1, NULL, 0);
  p.m.deleter = NULL;
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
  fa_tensor_release(t);
  CHECK(p.deleted == 0, "no deleter to run");
  free(p.buf);
}

static void test_memory_limit(void) {
  tu_test = "memory limit";
  const int64_t s1[1] = {4};
  size_t m0 = tu_mem_now();
  producer p;
  producer_init(&p, NULL, 16, DT_F32, 1, s1, NULL, 0);
  fa_set_memory_limit(FA_CPU, m0 + 8); /* no room for a tensor's records */
  fa_tensor *t = (fa_tensor *)&ctx;
  CHECK_STATUS(ctx, FA_ERR_OUT_OF_MEMORY, fa_tensor_from_dlpack(ctx, &p.m, &t));
  CHECK(t == NULL && p.deleted == 0, "refused import under the limit kept ownership");
  fa_set_memory_limit(FA_CPU, 0);
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
  CHECK(tu_mem_now() > m0, "the records are counted");
  /* export under the limit: refused, the tensor's references untouched */
  fa_set_memory_limit(FA_CPU, tu_mem_now() + 8);
  DLManagedTensor *m = (DLManagedTensor *)&ctx;
  CHECK_STATUS(ctx, FA_ERR_OUT_OF_MEMORY, fa_tensor_to_dlpack(ctx, t, &m));
  CHECK(m == NULL, "*out cleared");
  fa_set_memory_limit(FA_CPU, 0);
  fa_tensor_release(t); /* the one reference: the deleter runs now */
  CHECK(p.deleted == 1, "deleter ran %d times (a refused export kept a reference?)", p.deleted);
  CHECK(tu_mem_now() == m0, "memory %zu, expected %zu", tu_mem_now(), m0);
}

/* ---- export ---- */

static void test_export(void) {
  tu_test = "export every dtype";
  const fa_dtype dts[5] = {FA_F32, FA_F16, FA_BF16, FA_F64, FA_BOOL};
  const uint8_t codes[5] = {kDLFloat, kDLFloat, kDLBfloat, kDLFloat, DLPACK_VERSION >= 80 ? 6 : kDLUInt};
  const uint8_t bits[5] = {32, 16, 16, 64, 8};
  size_t m0 = tu_mem_now();
  for (int d = 0; d < 5; d++) {
    const int64_t shape[3] = {2, 3, 4};
    fa_tensor *t = filled(3, shape, dts[d], FA_CPU, FA_FILL_ARANGE, 0);
    if (!t) continue;
    DLManagedTensor *m = NULL;
    CHECK_OK(ctx, fa_tensor_to_dlpack(ctx, t, &m));
    if (!m) {
      fa_tensor_release(t);
      continue;
    }
    const DLTensor *dl = &m->dl_tensor;
    CHECK(dl->data == fa_tensor_data(t) && dl->byte_offset == 0, "%s: zero copy", fa_dtype_name(dts[d]));
    CHECK(dl->device.device_type == kDLCPU && dl->device.device_id == 0, "%s: device", fa_dtype_name(dts[d]));
    CHECK(dl->dtype.code == codes[d] && dl->dtype.bits == bits[d] && dl->dtype.lanes == 1,
          "%s: dtype code %u bits %u lanes %u", fa_dtype_name(dts[d]), dl->dtype.code, dl->dtype.bits, dl->dtype.lanes);
    CHECK(dl->ndim == 3 && dl->shape[0] == 2 && dl->shape[1] == 3 && dl->shape[2] == 4, "%s: shape",
          fa_dtype_name(dts[d]));
    CHECK(dl->strides && dl->strides[0] == 12 && dl->strides[1] == 4 && dl->strides[2] == 1, "%s: strides",
          fa_dtype_name(dts[d]));
    CHECK(m->deleter != NULL, "deleter");
    /* the DLManagedTensor keeps the memory alive after the tensor goes */
    fa_tensor_release(t);
    if (dts[d] == FA_F32) CHECK(((float *)dl->data)[23] == 23.0f, "last element after the release");
    if (dts[d] == FA_F64) CHECK(((double *)dl->data)[5] == 5.0, "element 5 after the release");
    if (dts[d] == FA_BOOL) CHECK(((uint8_t *)dl->data)[0] == 0 && ((uint8_t *)dl->data)[1] == 1, "bools");
    m->deleter(m);
  }
  CHECK(tu_mem_now() == m0, "memory %zu, expected %zu", tu_mem_now(), m0);
}

static void test_export_views(void) {
  tu_test = "export views";
  size_t m0 = tu_mem_now();
  const int64_t shape[3] = {2, 3, 4};
  fa_tensor *t = filled(3, shape, FA_F32, FA_CPU, FA_FILL_ARANGE, 0), *nar = NULL, *tr = NULL, *sel = NULL;
  if (!t) return;
  CHECK_OK(ctx, fa_tensor_narrow(ctx, t, 2, 1, 2, &nar));
  CHECK_OK(ctx, fa_tensor_transpose(ctx, t, 0, 2, &tr));
  CHECK_OK(ctx, fa_tensor_select(ctx, t, 1, 2, &sel));
  fa_tensor_release(t);
  DLManagedTensor *mn = NULL, *mt = NULL, *ms = NULL;
  if (nar) CHECK_OK(ctx, fa_tensor_to_dlpack(ctx, nar, &mn));
  if (tr) CHECK_OK(ctx, fa_tensor_to_dlpack(ctx, tr, &mt));
  if (sel) CHECK_OK(ctx, fa_tensor_to_dlpack(ctx, sel, &ms));
  fa_tensor_release(nar);
  fa_tensor_release(tr);
  fa_tensor_release(sel);
  if (mn) {
    const DLTensor *d = &mn->dl_tensor;
    CHECK(d->ndim == 3 && d->shape[2] == 2 && d->strides[0] == 12 && d->strides[1] == 4 && d->strides[2] == 1,
          "narrow: shape/strides");
    /* element [1][2][1] of the narrow is t[1][2][2] = 22 */
    CHECK(((float *)d->data)[1 * 12 + 2 * 4 + 1] == 22.0f, "narrow: data points at its first element");
    mn->deleter(mn);
  }
  if (mt) {
    const DLTensor *d = &mt->dl_tensor;
    CHECK(d->shape[0] == 4 && d->shape[2] == 2 && d->strides[0] == 1 && d->strides[2] == 12, "transpose: strides");
    CHECK(((float *)d->data)[3 * 1 + 1 * 4 + 1 * 12] == 12 + 4 + 3, "transpose: element [3][1][1]");
    mt->deleter(mt);
  }
  if (ms) {
    const DLTensor *d = &ms->dl_tensor;
    CHECK(d->ndim == 2 && d->shape[0] == 2 && d->shape[1] == 4 && d->strides[0] == 12 && d->strides[1] == 1,
          "select: shape/strides");
    CHECK(((float *)d->data)[0] == 8.0f && ((float *)d->data)[12 + 3] == 12 + 8 + 3, "select: values");
    ms->deleter(ms);
  }
  CHECK(tu_mem_now() == m0, "memory %zu, expected %zu", tu_mem_now(), m0);
}

/* export -> import: one storage chain, the same memory; import -> export ->
 * import: the producer's deleter once, at the very end. */
static void test_round_trips(void) {
  tu_test = "round trips";
  size_t m0 = tu_mem_now();
  const int64_t shape[2] = {4, 5};
  fa_tensor *t = filled(2, shape, FA_BF16, FA_CPU, FA_FILL_NORMAL, 7);
  if (!t) return;
  fa_tensor *tt = NULL;
  CHECK_OK(ctx, fa_tensor_transpose(ctx, t, 0, 1, &tt));
  DLManagedTensor *m = NULL;
  if (tt) CHECK_OK(ctx, fa_tensor_to_dlpack(ctx, tt, &m));
  fa_tensor *back = NULL;
  if (m) CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, m, &back));
  if (back) {
    CHECK(fa_tensor_data(back) == fa_tensor_data(tt), "same memory");
    CHECK(fa_tensor_dtype(back) == FA_BF16 && fa_tensor_stride(back, 0) == 1 && fa_tensor_stride(back, 1) == 5,
          "dtype and strides survive");
    double d = -1;
    CHECK_OK(ctx, fa_max_abs_diff(ctx, back, tt, &d));
    CHECK(d == 0, "values differ by %g", d);
  }
  fa_tensor_release(t);
  fa_tensor_release(tt);
  CHECK(tu_mem_now() > m0, "the export still holds the storage");
  fa_tensor_release(back); /* runs the export's deleter, which drops the last reference */
  CHECK(tu_mem_now() == m0, "memory %zu, expected %zu", tu_mem_now(), m0);

  /* import -> export -> import */
  float f[6] = {1, 2, 3, 4, 5, 6};
  const int64_t s[2] = {2, 3};
  producer p;
  producer_init(&p, f, sizeof f, DT_F32, 2, s, NULL, 4);
  p.m.dl_tensor.shape[1] = 2; /* 2 x 2 from element 1 with row stride 3 */
  p.m.dl_tensor.strides = p.strides;
  p.strides[0] = 3, p.strides[1] = 1;
  fa_tensor *a = NULL, *b = NULL;
  DLManagedTensor *ma = NULL;
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &a));
  if (a) CHECK_OK(ctx, fa_tensor_to_dlpack(ctx, a, &ma));
  fa_tensor_release(a);
  CHECK(p.deleted == 0, "producer's deleter ran early");
  if (ma) {
    CHECK(ma->dl_tensor.data == (char *)p.buf + 4 && ma->dl_tensor.strides[0] == 3, "re-export: pointer and strides");
    CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, ma, &b));
  }
  if (b) {
    double v[4];
    read_all(b, v);
    CHECK(v[0] == 2 && v[1] == 3 && v[2] == 5 && v[3] == 6, "values %g %g %g %g", v[0], v[1], v[2], v[3]);
  }
  CHECK(p.deleted == 0, "producer's deleter ran early");
  fa_tensor_release(b);
  CHECK(p.deleted == 1, "producer's deleter ran %d times", p.deleted);
  CHECK(tu_mem_now() == m0, "memory %zu, expected %zu", tu_mem_now(), m0);
}

/* Exports and imports of one tensor from many references: every count
 * balances. */
static void test_refcounts(void) {
  tu_test = "reference counts";
  size_t m0 = tu_mem_now();
  const int64_t s[1] = {8};
  producer p;
  producer_init(&p, NULL, 8 * sizeof(float), DT_F32, 1, s, NULL, 0);
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, &p.m, &t));
  if (!t) return;
  DLManagedTensor *ms[16] = {0};
  for (int i = 0; i < 16; i++) CHECK_OK(ctx, fa_tensor_to_dlpack(ctx, t, &ms[i]));
  fa_tensor_retain(t);
  fa_tensor_release(t);
  fa_tensor_release(t);
  for (int i = 0; i < 15; i++)
    if (ms[i]) ms[i]->deleter(ms[i]);
  CHECK(p.deleted == 0, "deleter ran with one export alive");
  if (ms[15]) ms[15]->deleter(ms[15]);
  CHECK(p.deleted == 1, "deleter ran %d times", p.deleted);
  CHECK(tu_mem_now() == m0, "memory %zu, expected %zu", tu_mem_now(), m0);
}

static void test_cuda(void) {
  if (!fa_backend_available(FA_CUDA)) return;
  tu_test = "cuda export and import";
  const int64_t shape[2] = {3, 4};
  fa_tensor *t = filled(2, shape, FA_F16, FA_CUDA, FA_FILL_ARANGE, 0);
  if (!t) return;
  DLManagedTensor *m = NULL;
  CHECK_OK(ctx, fa_tensor_to_dlpack(ctx, t, &m));
  if (m) {
    CHECK(m->dl_tensor.device.device_type == kDLCUDA && m->dl_tensor.device.device_id >= 0, "kDLCUDA");
    fa_tensor *b = NULL;
    CHECK_OK(ctx, fa_tensor_from_dlpack(ctx, m, &b));
    CHECK(b && fa_tensor_device(b) == FA_CUDA && fa_tensor_data(b) == fa_tensor_data(t), "cuda round trip");
    double sum = 0;
    if (b) CHECK_OK(ctx, fa_tensor_reduce(ctx, b, FA_REDUCE_SUM, &sum));
    CHECK(sum == 66, "sum %g", sum);
    fa_tensor_release(b);
  }
  fa_tensor_release(t);
}

int main(void) {
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) {
    fprintf(stderr, "no context\n");
    return 1;
  }
  size_t m0 = tu_mem_now();
  test_import_dtypes();
  test_import_zero_copy_writes();
  test_import_views();
  test_import_offset_strides();
  test_import_errors();
  test_memory_limit();
  test_export();
  test_export_views();
  test_round_trips();
  test_refcounts();
  test_cuda();
  tu_test = "end";
  CHECK(deleter_calls >= 20, "deleters ran %d times", deleter_calls);
  CHECK(tu_mem_now() == m0, "engine memory %zu at the end, %zu at the start", tu_mem_now(), m0);
  fa_context_destroy(ctx);
  return tu_summary("test_dlpack");
}

#else /* built without <dlpack/dlpack.h>: both calls say so */

int main(void) {
  fa_context *ctx = NULL;
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) return 1;
  const int64_t s[1] = {2};
  fa_tensor *t = NULL;
  CHECK_OK(ctx, fa_tensor_empty(ctx, 1, s, FA_F32, FA_CPU, &t));
  struct DLManagedTensor *m = NULL;
  tu_test = "no DLPack";
  CHECK_STATUS(ctx, FA_ERR_UNSUPPORTED, fa_tensor_to_dlpack(ctx, t, &m));
  CHECK(m == NULL, "*out cleared");
  fa_tensor_release(t);
  fa_context_destroy(ctx);
  printf("test_dlpack: built without dlpack/dlpack.h\n");
  return tu_summary("test_dlpack");
}

#endif
