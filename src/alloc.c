/* Engine-owned memory, counted per device so that fa_memory() tells what
 * the engine holds and fa_set_memory_limit() can refuse a request cleanly. */
#include "internal.h"

#include <stdlib.h>

#define FA_NDEV 2

static atomic_size_t mem_current[FA_NDEV];
static atomic_size_t mem_peak[FA_NDEV];
static atomic_size_t mem_limit[FA_NDEV];

static int dev_index(fa_device d) { return d == FA_CUDA ? 1 : 0; }

int fa_mem_acquire(fa_device device, size_t nbytes) {
  int i = dev_index(device);
  size_t limit = atomic_load(&mem_limit[i]);
  size_t cur = atomic_load(&mem_current[i]);
  for (;;) {
    if (limit && (nbytes > limit || cur > limit - nbytes)) return 0;
    if (atomic_compare_exchange_weak(&mem_current[i], &cur, cur + nbytes)) break;
  }
  size_t now = cur + nbytes, peak = atomic_load(&mem_peak[i]);
  while (now > peak && !atomic_compare_exchange_weak(&mem_peak[i], &peak, now)) {
  }
  return 1;
}

void fa_mem_release(fa_device device, size_t nbytes) { atomic_fetch_sub(&mem_current[dev_index(device)], nbytes); }

/* The host-facing calls below take a device from the host: one that is
 * neither cpu nor cuda names no device, holds nothing and has no limit
 * (these calls return no status; it must not stand for the cpu). */
static int known(fa_device d) { return d == FA_CPU || d == FA_CUDA; }

void fa_memory(fa_device device, size_t *current, size_t *peak) {
  int i = dev_index(device), ok = known(device);
  if (current) *current = ok ? atomic_load(&mem_current[i]) : 0;
  if (peak) *peak = ok ? atomic_load(&mem_peak[i]) : 0;
}

void fa_reset_peak(fa_device device) {
  if (!known(device)) return;
  int i = dev_index(device);
  atomic_store(&mem_peak[i], atomic_load(&mem_current[i]));
}

void fa_set_memory_limit(fa_device device, size_t bytes) {
  if (known(device)) atomic_store(&mem_limit[dev_index(device)], bytes);
}
size_t fa_memory_limit(fa_device device) { return known(device) ? atomic_load(&mem_limit[dev_index(device)]) : 0; }

static fa_status over_limit(fa_context *ctx, size_t nbytes) {
  return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                 "flashattn: out of memory: %zu bytes requested on cpu (engine holds %zu, limit %zu)", nbytes,
                 atomic_load(&mem_current[0]), atomic_load(&mem_limit[0]));
}

/* p from the host's allocator, or NULL with the counted bytes given back. */
static void *host_result(fa_context *ctx, void *p, size_t nbytes, fa_status *st) {
  if (!p) {
    fa_mem_release(FA_CPU, nbytes);
    *st = fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: out of memory: the host could not give %zu bytes", nbytes);
    return NULL;
  }
  *st = FA_OK;
  return p;
}

void *fa_host_alloc(fa_context *ctx, size_t nbytes, fa_status *st) {
  size_t rounded = (nbytes + 63) & ~(size_t)63;
  if (rounded < nbytes || !fa_mem_acquire(FA_CPU, nbytes)) {
    *st = over_limit(ctx, nbytes);
    return NULL;
  }
  return host_result(ctx, rounded ? aligned_alloc(64, rounded) : malloc(1), nbytes, st);
}

void fa_host_free(void *p, size_t nbytes) {
  if (!p) return;
  free(p);
  fa_mem_release(FA_CPU, nbytes);
}

void *fa_handle_alloc(fa_context *ctx, size_t nbytes, fa_status *st) {
  if (!fa_mem_acquire(FA_CPU, nbytes)) {
    *st = over_limit(ctx, nbytes);
    return NULL;
  }
  return host_result(ctx, calloc(1, nbytes), nbytes, st);
}
