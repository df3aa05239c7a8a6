/* Reading and writing .npy and .safetensors files (io_*.c; API §7,
 * docs/io.md).  Both readers take their bytes from an fa_io_src, a file or
 * a host buffer, through fa_io_read, which refuses any range past the end
 * that was measured when the source was opened: nothing is read past a
 * file's end, whatever its header claims. */
#ifndef FA_IO_INTERNAL_H
#define FA_IO_INTERNAL_H

#include "internal.h"

#include <stdio.h>

/* The largest npy header (the text after the magic and the length field);
 * numpy writes about 128 bytes for a 4-D shape, and refuses more than
 * 10000 when it reads. */
#define FA_NPY_MAX_HEADER 65536u
/* The largest safetensors JSON header, as the format itself says. */
#define FA_ST_MAX_HEADER 100000000u

typedef struct {
  fa_context *ctx;
  const char *op;    /* "load" or "save": the first word of every message */
  const char *label; /* the path, or "buffer" */
  FILE *f;           /* NULL for a buffer */
  const unsigned char *mem;
  uint64_t size; /* bytes there are to read */
  char *tmp;     /* save: the file written, renamed onto the path once whole (malloc'd), or NULL */
} fa_io_src;

/* "flashattn: <op> '<label>': <text>" into the context; returns status. */
fa_status fa_io_fail(const fa_io_src *s, fa_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* The engine's own failure (out of memory, ...) re-prefixed with the file. */
fa_status fa_io_wrap(const fa_io_src *s, fa_status st);
/* Opens a regular file for reading and measures it. */
fa_status fa_io_open(fa_io_src *s, fa_context *ctx, const char *path);
void fa_io_src_buffer(fa_io_src *s, fa_context *ctx, const void *data, size_t size);
void fa_io_close(fa_io_src *s);
/* Exactly n bytes at offset off (an error naming `what` when they are not
 * all inside the source). */
fa_status fa_io_read(fa_io_src *s, uint64_t off, void *buf, size_t n, const char *what);

/* A save's path, checked before any work: not empty, and no extension that
 * names the other format (fa.load and fa_file_format_of follow it). */
fa_status fa_io_check_save_path(const fa_io_src *s, const char *path, fa_file_format fmt);
/* Opens path for writing ("save '<path>': ..." on failure). */
fa_status fa_io_create(fa_io_src *s, fa_context *ctx, const char *path);
fa_status fa_io_write(fa_io_src *s, const void *buf, size_t n);
/* The elements of a contiguous host tensor in little-endian order
 * (swapped on a big-endian machine through a small buffer), bools as 0 or 1. */
fa_status fa_io_write_tensor(fa_io_src *s, const fa_tensor *t);
/* Closes a file being written; on failure (st != FA_OK, or a failing
 * close) removes it, so that no half-written file is left. */
fa_status fa_io_finish(fa_io_src *s, const char *path, fa_status st);

/* Whether the machine stores numbers little-endian (the files' order). */
int fa_io_little_endian(void);
/* Reverses the bytes of each of n elements of `size` bytes. */
void fa_io_swap(void *p, size_t size, int64_t n);
/* Bools read from a file: every nonzero byte becomes 1. */
void fa_io_normalize_bool(unsigned char *p, int64_t n);
/* t on `device` (t itself when it is there already; consumes t). */
fa_status fa_io_place(fa_io_src *s, fa_tensor **t, fa_device device);
/* Contiguous CPU copy of t for writing (bf16 widened to f32 where `widen_bf16`). */
fa_status fa_io_host_copy(fa_io_src *s, fa_tensor *t, int widen_bf16, fa_tensor **out);

/* Readers over a source (the public fa_load_* open one and call these). */
fa_status fa_npy_read(fa_io_src *s, fa_device device, fa_tensor **out);
fa_status fa_safetensors_read(fa_io_src *s, fa_device device, char ***names, fa_tensor ***tensors, size_t *count);

#endif
