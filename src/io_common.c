/* What the .npy and .safetensors readers and writers share: sources that
 * refuse to read past their end, files renamed into place once whole, byte
 * order, and the format of a path (docs/io.md). */
#define _POSIX_C_SOURCE 200809L /* fileno, fstat, fseeko, lstat, open, fdopen */
#include "io_internal.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Long paths are shown by their tail, so that the fault still fits the message. */
#define FA_IO_PATH_SHOWN 240

fa_status fa_io_fail(const fa_io_src *s, fa_status status, const char *fmt, ...) {
  if (!s->ctx) return status;
  char text[FA_ERRMSG_LEN];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  size_t n = strlen(s->label);
  const char *shown = n > FA_IO_PATH_SHOWN ? s->label + (n - FA_IO_PATH_SHOWN) : s->label;
  return fa_fail(s->ctx, status, "flashattn: %s '%s%s': %s", s->op, n > FA_IO_PATH_SHOWN ? "..." : "", shown, text);
}

fa_status fa_io_wrap(const fa_io_src *s, fa_status st) {
  if (!st || !s->ctx) return st;
  static const char prefix[] = "flashattn: ";
  char text[FA_ERRMSG_LEN];
  const char *e = s->ctx->error;
  if (strncmp(e, prefix, sizeof prefix - 1) == 0) e += sizeof prefix - 1;
  snprintf(text, sizeof text, "%s", e);
  return fa_io_fail(s, st, "%s", text);
}

static void src_init(fa_io_src *s, fa_context *ctx, const char *op, const char *label) {
  memset(s, 0, sizeof *s);
  s->ctx = ctx;
  s->op = op;
  s->label = label;
}

/* open(path, flags) that never waits: a FIFO's open would wait for the
 * other end (forever, when nothing opens it), so O_NONBLOCK makes it return
 * at once: for reading, opened; for writing, ENXIO when no process reads it.
 * The flag is taken off again, so that reads and writes are ordinary ones
 * (a regular file ignores it). */
static int open_no_wait(const char *path, int flags) {
  const int fd = open(path, flags | O_NONBLOCK, 0666);
  const int fl = fd < 0 ? -1 : fcntl(fd, F_GETFL);
  if (fl != -1) (void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

fa_status fa_io_open(fa_io_src *s, fa_context *ctx, const char *path) {
  src_init(s, ctx, "load", path);
  const int fd = open_no_wait(path, O_RDONLY); /* a FIFO is then refused by fstat */
  if (fd < 0) return fa_io_fail(s, FA_ERR_ARGUMENT, "cannot open: %s", strerror(errno));
  struct stat sb;
  /* a directory, FIFO or device has no end to check reads against */
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return fa_io_fail(s, FA_ERR_ARGUMENT, "not a regular file");
  }
  s->f = fdopen(fd, "rb");
  if (!s->f) {
    const int e = errno;
    close(fd);
    return fa_io_fail(s, FA_ERR_ARGUMENT, "cannot open: %s", strerror(e));
  }
  s->size = sb.st_size > 0 ? (uint64_t)sb.st_size : 0;
  return FA_OK;
}

void fa_io_src_buffer(fa_io_src *s, fa_context *ctx, const void *data, size_t size) {
  src_init(s, ctx, "load", "buffer");
  s->mem = data;
  s->size = data ? size : 0;
}

void fa_io_close(fa_io_src *s) {
  if (s->f) fclose(s->f);
  s->f = NULL;
}

fa_status fa_io_read(fa_io_src *s, uint64_t off, void *buf, size_t n, const char *what) {
  if (off > s->size || n > s->size - off)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "truncated: %s needs bytes %llu to %llu, the file has %llu", what,
                      (unsigned long long)off, (unsigned long long)off + n, (unsigned long long)s->size);
  if (!n) return FA_OK;
  if (s->mem) {
    memcpy(buf, s->mem + off, n);
    return FA_OK;
  }
  if (off > (uint64_t)INT64_MAX || fseeko(s->f, (off_t)off, SEEK_SET) != 0 || fread(buf, 1, n, s->f) != n)
    return fa_io_fail(s, FA_ERR_ARGUMENT, "cannot read %s (%zu bytes at %llu): %s", what, n, (unsigned long long)off,
                      ferror(s->f) ? strerror(errno) : "the file became shorter while it was read");
  return FA_OK;
}

/* path ends in ext (lower case), in any case */
static int ends_with(const char *path, const char *ext) {
  size_t n = strlen(path), m = strlen(ext);
  if (n < m) return 0;
  for (size_t i = 0; i < m; i++)
    if (tolower((unsigned char)path[n - m + i]) != ext[i]) return 0;
  return 1;
}

fa_status fa_io_check_save_path(const fa_io_src *s, const char *path, fa_file_format fmt) {
  if (!*path) /* else the file would be written beside "" (in the working directory), then fail to move */
    return fa_io_fail(s, FA_ERR_ARGUMENT, "cannot open for writing: the path is empty");
  if (fmt == FA_FILE_NPY && ends_with(path, ".safetensors"))
    return fa_io_fail(s, FA_ERR_ARGUMENT, "an .npy file at a .safetensors path (loading follows the extension)");
  if (fmt == FA_FILE_SAFETENSORS && ends_with(path, ".npy"))
    return fa_io_fail(s, FA_ERR_ARGUMENT, "a .safetensors file at an .npy path (loading follows the extension)");
  return FA_OK;
}

/* A new or regular file is written beside the path and renamed onto it
 * once whole (fa_io_finish), so that a failed save leaves what was there
 * (a file of the same mode); anything else (a device, a FIFO, a symbolic
 * link) is written in place and never removed: it is not the engine's.
 * Nothing waits: a FIFO that no process reads is an error at once. */
fa_status fa_io_create(fa_io_src *s, fa_context *ctx, const char *path) {
  src_init(s, ctx, "save", path);
  struct stat sb;
  const int exists = lstat(path, &sb) == 0;
  if (!exists || S_ISREG(sb.st_mode)) {
    static atomic_uint counter; /* names unique within the process; O_EXCL settles races with others */
    const size_t n = strlen(path) + 48;
    if (!(s->tmp = malloc(n))) return fa_io_fail(s, FA_ERR_OUT_OF_MEMORY, "out of host memory");
    int fd = -1;
    for (int attempt = 0; attempt < 16 && fd < 0; attempt++) {
      snprintf(s->tmp, n, "%s.%ld.%u.tmp", path, (long)getpid(), atomic_fetch_add(&counter, 1u));
      fd = open(s->tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
      if (fd < 0 && errno != EEXIST) break;
    }
    if (fd >= 0 && exists) (void)fchmod(fd, sb.st_mode & 07777); /* the old file's mode, whatever the umask */
    if (fd < 0 || !(s->f = fdopen(fd, "wb"))) {
      const int err = errno;
      if (fd >= 0) close(fd), remove(s->tmp);
      free(s->tmp), s->tmp = NULL;
      return fa_io_fail(s, FA_ERR_ARGUMENT, "cannot open for writing: %s", strerror(err));
    }
    return FA_OK;
  }
  const int fd = open_no_wait(path, O_WRONLY | O_CREAT | O_TRUNC); /* fopen "wb" would wait for a FIFO's reader */
  if (fd < 0) {
    const int err = errno;
    return fa_io_fail(s, FA_ERR_ARGUMENT, "cannot open for writing: %s%s", strerror(err),
                      err == ENXIO ? " (a FIFO is written only while a process reads it)" : "");
  }
  if (!(s->f = fdopen(fd, "wb"))) {
    const int err = errno;
    close(fd);
    return fa_io_fail(s, FA_ERR_ARGUMENT, "cannot open for writing: %s", strerror(err));
  }
  return FA_OK;
}

fa_status fa_io_write(fa_io_src *s, const void *buf, size_t n) {
  if (n && fwrite(buf, 1, n, s->f) != n) return fa_io_fail(s, FA_ERR_BACKEND, "cannot write: %s", strerror(errno));
  return FA_OK;
}

fa_status fa_io_write_tensor(fa_io_src *s, const fa_tensor *t) {
  const size_t size = fa_dtype_size(t->dtype);
  const int64_t n = fa_numel_of(t->ndim, t->shape);
  const int is_bool = t->dtype == FA_BOOL;
  if ((fa_io_little_endian() || size < 2) && !is_bool) return fa_io_write(s, fa_tensor_ptr(t), (size_t)n * size);
  unsigned char buf[4096];
  const unsigned char *p = fa_tensor_ptr(t);
  int64_t per = (int64_t)(sizeof buf / size);
  for (int64_t i = 0; i < n; i += per) {
    int64_t k = n - i < per ? n - i : per;
    memcpy(buf, p + (size_t)i * size, (size_t)k * size);
    if (is_bool) fa_io_normalize_bool(buf, k); /* a wrapped tensor's bytes may be any nonzero value */
    else fa_io_swap(buf, size, k);
    fa_status st = fa_io_write(s, buf, (size_t)k * size);
    if (st) return st;
  }
  return FA_OK;
}

fa_status fa_io_finish(fa_io_src *s, const char *path, fa_status st) {
  if (s->f) {
    const int failed = fclose(s->f) != 0; /* buffered bytes that did not reach the disk show up here */
    s->f = NULL;
    if (!st && failed) st = fa_io_fail(s, FA_ERR_BACKEND, "cannot write: %s", strerror(errno));
  }
  if (s->tmp) { /* the whole file onto the path, or nothing changed there */
    if (!st && rename(s->tmp, path) != 0) st = fa_io_fail(s, FA_ERR_BACKEND, "cannot write: %s", strerror(errno));
    if (st) remove(s->tmp);
    free(s->tmp), s->tmp = NULL;
  }
  return st;
}

int fa_io_little_endian(void) {
  const uint16_t one = 1;
  unsigned char b;
  memcpy(&b, &one, 1);
  return b == 1;
}

void fa_io_swap(void *p, size_t size, int64_t n) {
  unsigned char *b = p;
  if (size < 2) return;
  for (int64_t i = 0; i < n; i++, b += size)
    for (size_t j = 0; j < size / 2; j++) {
      unsigned char c = b[j];
      b[j] = b[size - 1 - j];
      b[size - 1 - j] = c;
    }
}

void fa_io_normalize_bool(unsigned char *p, int64_t n) {
  for (int64_t i = 0; i < n; i++) p[i] = p[i] != 0;
}

fa_status fa_io_place(fa_io_src *s, fa_tensor **t, fa_device device) {
  if (device == FA_CPU) return FA_OK;
  fa_tensor *moved;
  fa_status st = fa_tensor_to(s->ctx, *t, (*t)->dtype, device, &moved);
  fa_tensor_release(*t);
  *t = moved;
  return st;
}

fa_status fa_io_host_copy(fa_io_src *s, fa_tensor *t, int widen_bf16, fa_tensor **out) {
  fa_status st = fa_tensor_cpu_contiguous(s->ctx, t, t->dtype, out);
  if (st || !widen_bf16 || t->dtype != FA_BF16) return st;
  /* bf16 is f32's top half: widened by the bits, every NaN payload kept
   * (a conversion through float arithmetic would quiet a signalling NaN) */
  fa_tensor *w = NULL;
  if ((st = fa_tensor_new_like(s->ctx, *out, FA_F32, FA_CPU, &w))) {
    fa_tensor_drop(out);
    return st;
  }
  const uint16_t *src = fa_tensor_ptr(*out);
  uint32_t *dst = fa_tensor_ptr(w);
  const int64_t n = fa_numel_of(w->ndim, w->shape);
  for (int64_t i = 0; i < n; i++) dst[i] = (uint32_t)src[i] << 16;
  fa_tensor_release(*out);
  *out = w;
  return FA_OK;
}

/* A device the readers can place tensors on (checked before any reading). */
static fa_status check_device(fa_context *ctx, fa_device device) {
  if (device != FA_CPU && device != FA_CUDA)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: load: device: expected cpu or cuda, got %d", (int)device);
  if (!fa_backend_available(device))
    return fa_fail(ctx, FA_ERR_DEVICE,
                   "flashattn: load: device 'cuda' is not available (no usable GPU or no CUDA backend in this build)");
  return FA_OK;
}

/* ---- the public entry points ---------------------------------------------- */

fa_status fa_load_npy(fa_context *ctx, const char *path, fa_device device, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(path);
  fa_status st = check_device(ctx, device);
  if (st) return st;
  fa_io_src s;
  if ((st = fa_io_open(&s, ctx, path))) return st;
  st = fa_npy_read(&s, device, out);
  fa_io_close(&s);
  return st;
}

fa_status fa_load_npy_buffer(fa_context *ctx, const void *data, size_t size, fa_device device, fa_tensor **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(data);
  fa_status st = check_device(ctx, device);
  if (st) return st;
  fa_io_src s;
  fa_io_src_buffer(&s, ctx, data, size);
  return fa_npy_read(&s, device, out);
}

/* Every result pointer cleared first, so that a failure returns nothing. */
#define FA_ST_OUTS_NEED()                                                                                              \
  do {                                                                                                                 \
    FA_NEED(names);                                                                                                    \
    FA_NEED(tensors);                                                                                                  \
    FA_NEED(count);                                                                                                    \
    *names = NULL;                                                                                                     \
    *tensors = NULL;                                                                                                   \
    *count = 0;                                                                                                        \
    FA_NEED(ctx);                                                                                                      \
  } while (0)

fa_status fa_load_safetensors(fa_context *ctx, const char *path, fa_device device, char ***names,
                              fa_tensor ***tensors, size_t *count) {
  FA_ST_OUTS_NEED();
  FA_NEED(path);
  fa_status st = check_device(ctx, device);
  if (st) return st;
  fa_io_src s;
  if ((st = fa_io_open(&s, ctx, path))) return st;
  st = fa_safetensors_read(&s, device, names, tensors, count);
  fa_io_close(&s);
  return st;
}

fa_status fa_load_safetensors_buffer(fa_context *ctx, const void *data, size_t size, fa_device device,
                                     char ***names, fa_tensor ***tensors, size_t *count) {
  FA_ST_OUTS_NEED();
  FA_NEED(data);
  fa_status st = check_device(ctx, device);
  if (st) return st;
  fa_io_src s;
  fa_io_src_buffer(&s, ctx, data, size);
  return fa_safetensors_read(&s, device, names, tensors, count);
}

fa_status fa_file_format_of(fa_context *ctx, const char *path, fa_file_format *out) {
  FA_NEED(out);
  *out = 0;
  FA_NEED(ctx);
  FA_NEED(path);
  if (ends_with(path, ".npy")) *out = FA_FILE_NPY;
  if (ends_with(path, ".safetensors")) *out = FA_FILE_SAFETENSORS;
  if (*out) return FA_OK;
  fa_io_src s;
  fa_status st = fa_io_open(&s, ctx, path);
  if (st) return st;
  unsigned char head[9];
  size_t n = s.size < sizeof head ? (size_t)s.size : sizeof head;
  st = fa_io_read(&s, 0, head, n, "the first bytes");
  fa_io_close(&s);
  if (st) return st;
  if (n >= 6 && memcmp(head, "\x93NUMPY", 6) == 0) *out = FA_FILE_NPY;
  else if (n == 9 && head[8] == '{') *out = FA_FILE_SAFETENSORS;
  else
    return fa_io_fail(&s, FA_ERR_ARGUMENT,
                      "unknown format: expected a .npy file (magic \\x93NUMPY) or a .safetensors file (an 8-byte "
                      "header length, then '{')");
  return FA_OK;
}
