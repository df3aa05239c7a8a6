/* Blocks kept for the next request of the same byte count (block_keep.c):
 * the host's large blocks (alloc.c) and the device's small ones
 * (kernels/core/memory.cu) share this keeper; each caller says which
 * blocks it offers and how it gives them back. */
#ifndef FA_BLOCK_KEEP_H
#define FA_BLOCK_KEEP_H

#include <pthread.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FA_KEEP_CLASSES 16    /* byte counts kept at once */
#define FA_KEEP_DEPTH_MAX 256 /* blocks a byte count, at most */

typedef struct {
  int depth;        /* blocks a byte count (<= FA_KEEP_DEPTH_MAX) */
  size_t total_max; /* bytes kept in all */
  size_t bytes;     /* kept now */
  pthread_mutex_t lock;
  struct {
    size_t n; /* the byte count; a class with no block is free */
    int count;
    void *p[FA_KEEP_DEPTH_MAX];
  } cls[FA_KEEP_CLASSES];
} fa_block_keep;

/* A keeper of `depth` blocks a byte count and total_max bytes in all, for a static definition. */
#define FA_BLOCK_KEEP_INIT(depth, total_max) {(depth), (total_max), 0, PTHREAD_MUTEX_INITIALIZER, {{0, 0, {0}}}}

/* A kept block of exactly n bytes (the latest kept first), or NULL. */
void *fa_block_keep_take(fa_block_keep *k, size_t n);
/* Keeps p (n bytes) when its byte count has a class and room, with at
 * most `room` bytes kept after it (SIZE_MAX: the keeper's own bound);
 * 0 when the caller must give it back itself. */
int fa_block_keep_put(fa_block_keep *k, void *p, size_t n, size_t room);
/* Every kept block given back through release. */
void fa_block_keep_drain(fa_block_keep *k, void (*release)(void *p));

#ifdef __cplusplus
}
#endif

#endif
