/* The block keeper of block_keep.h. */
#include "block_keep.h"

void *fa_block_keep_take(fa_block_keep *k, size_t n) {
  void *p = NULL;
  pthread_mutex_lock(&k->lock);
  for (int c = 0; c < FA_KEEP_CLASSES; c++)
    if (k->cls[c].n == n && k->cls[c].count > 0) {
      p = k->cls[c].p[--k->cls[c].count];
      k->bytes -= n;
      break;
    }
  pthread_mutex_unlock(&k->lock);
  return p;
}

int fa_block_keep_put(fa_block_keep *k, void *p, size_t n, size_t room) {
  int kept = 0;
  pthread_mutex_lock(&k->lock);
  int c = 0, empty = -1;
  for (; c < FA_KEEP_CLASSES && k->cls[c].n != n; c++)
    if (empty < 0 && k->cls[c].count == 0) empty = c;
  if (c == FA_KEEP_CLASSES && empty >= 0) k->cls[c = empty].n = n;
  const size_t after = k->bytes + n;
  if (c < FA_KEEP_CLASSES && k->cls[c].count < k->depth && after >= n && after <= k->total_max && after <= room) {
    k->cls[c].p[k->cls[c].count++] = p;
    k->bytes = after;
    kept = 1;
  }
  pthread_mutex_unlock(&k->lock);
  return kept;
}

void fa_block_keep_drain(fa_block_keep *k, void (*release)(void *p)) {
  pthread_mutex_lock(&k->lock);
  for (int c = 0; c < FA_KEEP_CLASSES; c++)
    while (k->cls[c].count > 0) release(k->cls[c].p[--k->cls[c].count]);
  k->bytes = 0;
  pthread_mutex_unlock(&k->lock);
}
