/* Engine-owned memory, counted per device so that fa_memory() tells what
 * the engine holds and fa_set_memory_limit() can refuse a request cleanly. */
#include "block_keep.h"
#include "internal.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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

/* Large blocks kept for the next allocation of the same byte count.  A
 * block the host's malloc gives afresh is new pages, and the first write
 * to each is a page fault: in a loop of CPU attention calls (B = 1, H = 8,
 * L = 1024, D = 64, f32: an output of 2 MiB a call, which the collector
 * frees by the dozen and malloc gives back to the system) the faults took
 * 14-19 % of the samples (perf); kept, 60 causal calls took 0.69 s against
 * 0.78 and 30 plain ones 0.61 against 0.63 (whole processes, 2 cores,
 * 2026-12-08).  Blocks of at least KEEP_MIN_BYTES, up to KEEP_DEPTH of
 * each of FA_KEEP_CLASSES byte counts and KEEP_TOTAL_BYTES in all
 * (block_keep.h; under a set limit, within what the live blocks leave of
 * it); fa_memory() counts live blocks only, and an allocation the host
 * refuses gives the kept ones back (it fails still, as
 * the out-of-memory tests expect; a retry finds the room).
 * Off under AddressSanitizer and with FLASHATTN_NO_HOST_CACHE set (for
 * valgrind): a kept block is neither freed nor poisoned, so a read after
 * its tensor's free would go unseen. */
#define KEEP_MIN_BYTES ((size_t)256 << 10)
#define KEEP_DEPTH 32
#define KEEP_TOTAL_BYTES ((size_t)128 << 20)
static fa_block_keep kept = FA_BLOCK_KEEP_INIT(KEEP_DEPTH, KEEP_TOTAL_BYTES);
static pthread_once_t keep_once = PTHREAD_ONCE_INIT;
static int keep_on;

#if defined(__SANITIZE_ADDRESS__)
#define FA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FA_ASAN 1
#endif
#endif

static void keep_setup(void) {
#ifdef FA_ASAN
  keep_on = 0;
#else
  const char *off = getenv("FLASHATTN_NO_HOST_CACHE");
  keep_on = !(off && *off && *off != '0');
#endif
}

/* Whether blocks of n (rounded) bytes are kept. */
static int keeps(size_t n) {
  if (n < KEEP_MIN_BYTES) return 0;
  pthread_once(&keep_once, keep_setup);
  return keep_on;
}

/* Keeps p (n rounded bytes) if there is room (under a set limit, live and
 * kept bytes together stay within it); else 0. */
static int keep_put(void *p, size_t n) {
  if (!keeps(n)) return 0;
  const size_t limit = atomic_load(&mem_limit[0]), live = atomic_load(&mem_current[0]);
  return fa_block_keep_put(&kept, p, n, !limit ? SIZE_MAX : live <= limit ? limit - live : 0);
}

void *fa_host_alloc(fa_context *ctx, size_t nbytes, fa_status *st) {
  size_t rounded = (nbytes + 63) & ~(size_t)63;
  if (rounded < nbytes || !fa_mem_acquire(FA_CPU, nbytes)) {
    *st = over_limit(ctx, nbytes);
    return NULL;
  }
  void *p = keeps(rounded) ? fa_block_keep_take(&kept, rounded) : NULL;
  if (!p) p = rounded ? aligned_alloc(64, rounded) : malloc(1);
  if (!p) fa_block_keep_drain(&kept, free); /* for the caller's retry (the Lua binding collects and calls again) */
  return host_result(ctx, p, nbytes, st);
}

void fa_host_free(void *p, size_t nbytes) {
  if (!p) return;
  fa_mem_release(FA_CPU, nbytes);
  if (!keep_put(p, (nbytes + 63) & ~(size_t)63)) free(p);
}

/* Zeroed, and from fa_host_alloc, as fa_host_free expects of every block. */
void *fa_handle_alloc(fa_context *ctx, size_t nbytes, fa_status *st) {
  void *p = fa_host_alloc(ctx, nbytes, st);
  if (p) memset(p, 0, nbytes);
  return p;
}
