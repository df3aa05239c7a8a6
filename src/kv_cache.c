/* fa_kv_cache: a paged KV cache (API §8).  A pool of fixed-size pages (K
 * pages and V pages, tensors of the engine), a page table per sequence and
 * the sequences' lengths.  Every argument is checked before anything is
 * written.
 *
 * attend on cuda, for the calls the decode kernel takes (f16/bf16, D = Dv
 * = 64 or 128, at most 64 query rows a key head or Lq <= 16; D = 256, at most
 * 32): the kernel reads the
 * pools through a device copy of the page table, refreshed after appends
 * and resets (the changed entries, without waiting for the device).
 * append on cuda copies every sequence's new positions in one launch a
 * pool (fa_cuda_kv_scatter) when k and v have the cache's dtype and
 * contiguous rows, else by a copy per sequence and page.  On the cpu the
 * kernels read the pools through the table too (fa_attention_cpu_pages:
 * each key tile copied in a run of rows a page, each sequence a call over
 * its own keys, opts.splits the kernel's key chunks).  Elsewhere (cuda's
 * other calls) the sequences' pages are gathered into
 * contiguous K/V (gather_pool: one launch a pool on cuda; a copy a page and
 * head, a launch each, took a chunk of prefill 15-19 ms at 4k positions,
 * B = 8, against 0.25-0.45 now, H200) and fa_attention runs once over them.
 * All align causal, window and alibi to each sequence's own length. */
#include "attn_kernels.h"
#include "check.h"

#include <math.h>
#include <string.h>

struct fa_kv_cache {
  int64_t B, H, D, Dv, capacity, page_size, pages, max_pages; /* max_pages: per sequence */
  fa_dtype dtype;
  fa_device device;
  fa_tensor *kpool, *vpool; /* (pages, H, page_size, D|Dv) */
  int64_t *free_list, n_free; /* a stack of page indices */
  int64_t *table;             /* B x max_pages page indices */
  int64_t *lens;              /* B */
  /* cuda: the table (int32) and the lengths on the device, for the decode
   * kernel, brought up to date by the first attend after an append or
   * reset: only the table entries that changed ([dirty_lo, dirty_hi)) and
   * the lengths, copied without waiting for the device from pinned mirrors
   * (h_table, h_lens) that are written again only once the event
   * `uploaded` (recorded after the copies) has passed.  A whole-table
   * upload with a stream synchronisation cost a decoding loop 2 MB and a
   * wait a step at B = 64, capacity 32k, pages of 16. */
  int32_t *dev_table, *h_table;
  int64_t *dev_lens, *h_lens;
  void *uploaded;
  int64_t dirty_lo, dirty_hi;
  int dev_stale;
};

/* Table entry i (b · max_pages + page) changed. */
static void mark_dirty(fa_kv_cache *c, int64_t i) {
  if (c->dirty_lo >= c->dirty_hi) c->dirty_lo = i, c->dirty_hi = i + 1;
  else if (i < c->dirty_lo) c->dirty_lo = i;
  else if (i >= c->dirty_hi) c->dirty_hi = i + 1;
  c->dev_stale = 1;
}

static size_t dev_table_bytes(const fa_kv_cache *c) { return sizeof(int32_t) * (size_t)(c->B * c->max_pages); }

void fa_kv_cache_opts_init(fa_kv_cache_opts *o) {
  if (!o) return;
  memset(o, 0, sizeof *o);
  o->dtype = FA_F32;
  o->device = FA_DEVICE_NONE;
}

static size_t cache_host_bytes(int64_t B, int64_t max_pages, int64_t pages) {
  return sizeof(struct fa_kv_cache) + sizeof(int64_t) * (size_t)(pages + B * max_pages + B);
}

void fa_kv_cache_destroy(fa_kv_cache *c) {
  if (!c) return;
  if (c->uploaded) (void)fa_cuda_event_wait(NULL, c->uploaded); /* no copy may be leaving the mirrors as they go */
  fa_cuda_event_free(c->uploaded);
  fa_cuda_host_free(c->h_table, dev_table_bytes(c));
  fa_cuda_host_free(c->h_lens, sizeof(int64_t) * (size_t)c->B);
  fa_cuda_free(c->dev_table, dev_table_bytes(c));
  fa_cuda_free(c->dev_lens, sizeof(int64_t) * (size_t)c->B);
  fa_tensor_drop(&c->kpool);
  fa_tensor_drop(&c->vpool);
  fa_host_free(c, cache_host_bytes(c->B, c->max_pages, c->pages));
}

#define KV_MAX_ENTRIES ((int64_t)1 << 40)

fa_status fa_kv_cache_create(fa_context *ctx, const fa_kv_cache_opts *o, fa_kv_cache **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(ctx);
  FA_NEED(o);
  const struct {
    const char *name;
    int64_t v;
  } sizes[] = {{"batch", o->batch}, {"heads", o->heads}, {"dim", o->dim}, {"capacity", o->capacity}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].v < 1 || sizes[i].v > KV_MAX_ENTRIES)
      return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: kv_cache: %s: expected an integer from 1 to 2^40, got %lld",
                     sizes[i].name, (long long)sizes[i].v);
  if (o->dim_v < 0 || o->dim_v > KV_MAX_ENTRIES)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: kv_cache: dim_v: expected an integer from 1 to 2^40 (0 = dim), got %lld",
                   (long long)o->dim_v);
  if (o->page_size < 0 || o->page_size > KV_MAX_ENTRIES)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: kv_cache: page_size: expected an integer from 1 to 2^40 (0 = 16), got %lld",
                   (long long)o->page_size);
  if (o->pages < 0 || o->pages > KV_MAX_ENTRIES)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: kv_cache: pages: expected an integer from 1 to 2^40 (0 = batch * ceil(capacity / "
                   "page_size)), got %lld",
                   (long long)o->pages);
  if (!fa_is_float_dtype(o->dtype))
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: kv_cache: dtype: expected a float dtype (f32, f16, bf16, f64), got %s",
                   fa_dtype_name(o->dtype));
  fa_device dev = o->device == FA_DEVICE_NONE ? ctx->device : o->device;
  if (dev != FA_CPU && dev != FA_CUDA)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: kv_cache: device: expected cpu or cuda");
  if (!fa_backend_available(dev))
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: kv_cache: device %s is not available", fa_device_name(dev));
  const int64_t ps = o->page_size ? o->page_size : 16, maxp = (o->capacity + ps - 1) / ps;
  if (maxp > KV_MAX_ENTRIES / o->batch)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: kv_cache: batch * capacity / page_size is too large");
  const int64_t pages = o->pages ? o->pages : o->batch * maxp, dv = o->dim_v ? o->dim_v : o->dim;
  const int64_t ks[4] = {pages, o->heads, ps, o->dim}, vs[4] = {pages, o->heads, ps, dv};
  /* the pools' shapes as the tensor layer checks them, before anything is allocated: the field at which
   * their sizes' product passes the limit is named */
  static const char *const fields[4] = {"pages", "heads", "page_size", "dim"};
  for (int pool = 0; pool < 2; pool++) {
    const int64_t *sh = pool ? vs : ks;
    const int i = fa_shape_too_large(4, sh);
    if (i >= 0)
      return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                     "flashattn: kv_cache: %s: the %s pool, pages x heads x page_size x %s = %lld x %lld x %lld x "
                     "%lld elements%s, is more than a tensor may hold",
                     pool && i == 3 ? "dim_v" : fields[i], pool ? "V" : "K", pool ? "dim_v" : "dim", (long long)sh[0],
                     (long long)sh[1], (long long)sh[2], (long long)sh[3],
                     o->pages ? "" : " (pages = batch x ceil(capacity / page_size))");
  }
  fa_status st;
  fa_kv_cache *c = fa_host_alloc(ctx, cache_host_bytes(o->batch, maxp, pages), &st);
  if (!c) return st;
  memset(c, 0, sizeof *c);
  c->B = o->batch, c->H = o->heads, c->D = o->dim, c->Dv = dv;
  c->capacity = o->capacity, c->page_size = ps, c->pages = pages, c->max_pages = maxp;
  c->dtype = o->dtype, c->device = dev;
  c->free_list = (int64_t *)(c + 1);
  c->table = c->free_list + pages;
  c->lens = c->table + c->B * maxp;
  for (int64_t i = 0; i < pages; i++) c->free_list[i] = pages - 1 - i; /* page 0 on top */
  c->n_free = pages;
  for (int64_t i = 0; i < c->B * maxp; i++) c->table[i] = -1;
  for (int64_t b = 0; b < c->B; b++) c->lens[b] = 0;
  c->dirty_lo = 0, c->dirty_hi = c->B * maxp, c->dev_stale = 1; /* the device copy is made whole once */
  if ((st = fa_tensor_new(ctx, 4, ks, c->dtype, dev, &c->kpool)) ||
      (st = fa_tensor_new(ctx, 4, vs, c->dtype, dev, &c->vpool))) {
    fa_kv_cache_destroy(c);
    return st;
  }
  *out = c;
  return FA_OK;
}

fa_status fa_kv_cache_get_info(fa_context *ctx, const fa_kv_cache *c, fa_kv_cache_info *out) {
  FA_NEED(out);
  out->batch = out->heads = out->dim = out->dim_v = out->capacity = out->page_size = out->pages = out->free_pages = -1;
  out->dtype = FA_DTYPE_NONE, out->device = FA_DEVICE_NONE;
  FA_NEED(c);
  out->batch = c->B, out->heads = c->H, out->dim = c->D, out->dim_v = c->Dv, out->capacity = c->capacity;
  out->page_size = c->page_size, out->pages = c->pages, out->free_pages = c->n_free;
  out->dtype = c->dtype, out->device = c->device;
  return FA_OK;
}

fa_status fa_kv_cache_lengths(fa_context *ctx, const fa_kv_cache *c, int64_t *lens) {
  FA_NEED(c);
  FA_NEED(lens);
  memcpy(lens, c->lens, sizeof(int64_t) * (size_t)c->B);
  return FA_OK;
}

static void release_pages(fa_kv_cache *c, int64_t b) {
  int64_t *row = c->table + b * c->max_pages;
  for (int64_t i = 0; i < c->max_pages && row[i] >= 0; i++) {
    c->free_list[c->n_free++] = row[i];
    row[i] = -1;
    mark_dirty(c, b * c->max_pages + i);
  }
  c->lens[b] = 0;
  c->dev_stale = 1;
}

fa_status fa_kv_cache_reset(fa_context *ctx, fa_kv_cache *c, int64_t b) {
  FA_NEED(c);
  if (b < -1 || b >= c->B)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: kv_cache reset: b = %lld: expected -1 (all) or 0 to %lld",
                   (long long)b, (long long)c->B - 1); /* the C argument as given (cache:reset checks its own) */
  if (b >= 0) release_pages(c, b);
  else
    for (int64_t i = 0; i < c->B; i++) release_pages(c, i);
  return FA_OK;
}

/* Checks a (B, H, n, X) operand of append. */
static fa_status check_kv_operand(fa_context *ctx, const fa_kv_cache *c, const fa_tensor *t, const char *name,
                                  int64_t X, int64_t n) {
  fa_status st = fa_check_tensor(ctx, t, name);
  if (st) return st;
  if (!fa_is_float_dtype(t->dtype))
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: kv_cache append: %s: expected a float dtype, got %s", name,
                   fa_dtype_name(t->dtype));
  if (t->storage->device != c->device)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: kv_cache append: %s: expected device %s (the cache's), got %s", name,
                   fa_device_name(c->device), fa_device_name(t->storage->device));
  char buf[64];
  if (t->ndim != 4 || t->shape[0] != c->B || t->shape[1] != c->H || t->shape[3] != X || (n >= 0 && t->shape[2] != n))
    return fa_fail(ctx, FA_ERR_SHAPE,
                   "flashattn: kv_cache append: %s: expected shape (B, Hkv, n, %s) = (%lld, %lld, n, %lld), got %s",
                   name, X == c->D && name[0] == 'k' ? "D" : "Dv", (long long)c->B, (long long)c->H, (long long)X,
                   fa_shape_str(t, buf, sizeof buf));
  return FA_OK;
}

/* The first run of sequence b's positions [pos, pos + count) that lies in
 * one page: its page and row offset there; returns its length. */
static int64_t page_run(const fa_kv_cache *c, int64_t b, int64_t pos, int64_t count, int64_t *page, int64_t *off) {
  *page = c->table[b * c->max_pages + pos / c->page_size], *off = pos % c->page_size;
  return count < c->page_size - *off ? count : c->page_size - *off;
}

/* Copies positions [from, from + count) of sequence b of src (B, H, n, X)
 * into the pool at the sequence's positions [pos, pos + count); the pages
 * are already in the table. */
static fa_status copy_into_pages(fa_context *ctx, const fa_kv_cache *c, fa_tensor *pool, fa_tensor *src, int64_t b,
                                 int64_t from, int64_t pos, int64_t count) {
  fa_status st = FA_OK;
  fa_tensor *sb = NULL;
  if ((st = fa_tensor_select(ctx, src, 0, b, &sb))) return st; /* (H, n, X) */
  while (count > 0 && !st) {
    int64_t page, off;
    const int64_t m = page_run(c, b, pos, count, &page, &off);
    fa_tensor *pg = NULL, *dst = NULL, *s = NULL;
    if (!(st = fa_tensor_select(ctx, pool, 0, page, &pg)) && !(st = fa_tensor_narrow(ctx, pg, 1, off, m, &dst)) &&
        !(st = fa_tensor_narrow(ctx, sb, 1, from, m, &s)))
      st = fa_tensor_copy(ctx, dst, s);
    fa_tensor_drop(&pg), fa_tensor_drop(&dst), fa_tensor_drop(&s);
    pos += m, from += m, count -= m;
  }
  fa_tensor_drop(&sb);
  return st;
}

/* cuda: whether append's copies go by fa_cuda_kv_scatter (k and v of the
 * pools' dtype with contiguous rows, every index within int32). */
static int scatter_fits(const fa_kv_cache *c, const fa_tensor *k, const fa_tensor *v) {
  return c->device == FA_CUDA && k->dtype == c->dtype && v->dtype == c->dtype &&
         (k->shape[3] <= 1 || k->strides[3] == 1) && (v->shape[3] <= 1 || v->strides[3] == 1) &&
         c->B <= INT32_MAX && k->shape[2] <= INT32_MAX && c->pages <= INT32_MAX && c->page_size <= INT32_MAX;
}

/* The new positions of every sequence (its pages already in the table)
 * copied by segments of rows within one page, batches of FA_KV_SEGMENTS a
 * launch for K and for V. */
static fa_status scatter_into_pages(fa_context *ctx, const fa_kv_cache *c, fa_tensor *k, fa_tensor *v,
                                    const int64_t *lens, int64_t n) {
  fa_kv_segments s;
  s.n = 0;
  fa_status st = FA_OK;
  for (int64_t b = 0; b < c->B && !st; b++) {
    int64_t pos = c->lens[b], from = 0, count = lens ? lens[b] : n;
    while (count > 0 && !st) {
      int64_t page, off;
      const int64_t m = page_run(c, b, pos, count, &page, &off);
      s.seg[s.n++] = (fa_kv_segment){(int32_t)b, (int32_t)from, (int32_t)page, (int32_t)off, (int32_t)m};
      pos += m, from += m, count -= m;
      if (s.n == FA_KV_SEGMENTS) { /* a full batch */
        if (!(st = fa_cuda_kv_scatter(ctx, &s, c->kpool, k))) st = fa_cuda_kv_scatter(ctx, &s, c->vpool, v);
        s.n = 0;
      }
    }
  }
  if (!st && s.n && !(st = fa_cuda_kv_scatter(ctx, &s, c->kpool, k))) st = fa_cuda_kv_scatter(ctx, &s, c->vpool, v);
  return st;
}

fa_status fa_kv_cache_append(fa_context *ctx, fa_kv_cache *c, fa_tensor *k, fa_tensor *v, const int64_t *lens,
                             int64_t n_lens) {
  FA_NEED(ctx);
  FA_NEED(c);
  fa_status st;
  if ((st = check_kv_operand(ctx, c, k, "k", c->D, -1))) return st;
  const int64_t n = k->shape[2];
  if ((st = check_kv_operand(ctx, c, v, "v", c->Dv, n))) return st;
  if (!lens && n_lens)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: kv_cache append: lens is NULL with n_lens = %lld (both or neither)",
                   (long long)n_lens);
  if (lens && n_lens != c->B)
    return fa_fail(ctx, FA_ERR_SHAPE, "flashattn: kv_cache append: lens: expected %lld entries (one per sequence), got %lld",
                   (long long)c->B, (long long)n_lens);
  int64_t need = 0;
  for (int64_t b = 0; b < c->B; b++) {
    const int64_t add = lens ? lens[b] : n;
    if (add < 0 || add > n)
      return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: kv_cache append: lens[%lld]: expected 0 to n = %lld, got %lld",
                     (long long)b + 1, (long long)n, (long long)add);
    if (add > c->capacity - c->lens[b])
      return fa_fail(ctx, FA_ERR_ARGUMENT,
                     "flashattn: kv_cache append: sequence %lld: %lld + %lld positions exceed the capacity %lld "
                     "(nothing was written)",
                     (long long)b + 1, (long long)c->lens[b], (long long)add, (long long)c->capacity);
    need += (c->lens[b] + add + c->page_size - 1) / c->page_size - (c->lens[b] + c->page_size - 1) / c->page_size;
  }
  if (need > c->n_free)
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY,
                   "flashattn: kv_cache append: %lld new pages needed, %lld free in the pool of %lld (nothing was "
                   "written)",
                   (long long)need, (long long)c->n_free, (long long)c->pages);
  /* take the pages (given back on failure: the lengths stay as they were) */
  for (int64_t b = 0; b < c->B; b++) {
    const int64_t add = lens ? lens[b] : n;
    int64_t *row = c->table + b * c->max_pages;
    for (int64_t p = (c->lens[b] + c->page_size - 1) / c->page_size; p * c->page_size < c->lens[b] + add; p++) {
      row[p] = c->free_list[--c->n_free];
      mark_dirty(c, b * c->max_pages + p);
    }
  }
  if (scatter_fits(c, k, v)) st = scatter_into_pages(ctx, c, k, v, lens, n);
  else
    for (int64_t b = 0; b < c->B && !st; b++) {
      const int64_t add = lens ? lens[b] : n;
      if (!add) continue;
      if (!(st = copy_into_pages(ctx, c, c->kpool, k, b, 0, c->lens[b], add)))
        st = copy_into_pages(ctx, c, c->vpool, v, b, 0, c->lens[b], add);
    }
  if (st) { /* undo: the pages taken go back, in the reverse order */
    for (int64_t b = c->B - 1; b >= 0; b--) {
      int64_t *row = c->table + b * c->max_pages;
      const int64_t add = lens ? lens[b] : n;
      const int64_t first = (c->lens[b] + c->page_size - 1) / c->page_size;
      for (int64_t p = (c->lens[b] + add + c->page_size - 1) / c->page_size - 1; p >= first; p--) {
        c->free_list[c->n_free++] = row[p];
        row[p] = -1;
      }
    }
    return st;
  }
  for (int64_t b = 0; b < c->B; b++) c->lens[b] += lens ? lens[b] : n;
  c->dev_stale = 1;
  return FA_OK;
}

/* Every sequence's positions of pool gathered into a fresh (B, H, L, X),
 * L the longest sequence's length: sequence b's rows first, or (right)
 * last, so that its last key is key L - 1; the other rows zeroed (never a
 * freed page's old values: a kernel may read a key tile's padding); mask
 * (B·L bytes on the cache's device, or NULL) gets 1 where a sequence's
 * key lies.  One launch through the device table (made current by
 * sync_device_table): cuda's alone (the cpu reads the pages in place). */
static fa_status gather_pool(fa_context *ctx, const fa_kv_cache *c, const fa_tensor *pool, int64_t X, int64_t L,
                             int right, uint8_t *mask, fa_tensor **out) {
  const int64_t shape[4] = {c->B, c->H, L, X};
  fa_status st = fa_tensor_new(ctx, 4, shape, c->dtype, c->device, out);
  if (!st && (st = fa_cuda_kv_gather(ctx, c->dev_table, c->max_pages, c->dev_lens, pool, *out, right, mask)))
    fa_tensor_drop(out);
  return st;
}

/* attend's arguments; *d: the call as one over the longest sequence, its
 * options checked as fa_attention checks them (fa_check_attention_options:
 * scale, causal, window, alibi, softcap, out, lse_out) and splits. */
static fa_status check_attend(fa_context *ctx, const fa_kv_cache *c, const fa_tensor *q, const fa_attention_opts *o,
                              fa_attn_dims *d) {
  fa_status st = fa_check_tensor(ctx, q, "q");
  if (st) return st;
  if (q->dtype != c->dtype)
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: kv_cache attend: q: expected dtype %s (the cache's), got %s",
                   fa_dtype_name(c->dtype), fa_dtype_name(q->dtype));
  if (q->storage->device != c->device)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: kv_cache attend: q: expected device %s (the cache's), got %s",
                   fa_device_name(c->device), fa_device_name(q->storage->device));
  char buf[64];
  /* Hq = 0 is a multiple: an empty output, as fa_attention gives */
  if (q->ndim != 4 || q->shape[0] != c->B || q->shape[3] != c->D || q->shape[1] % c->H)
    return fa_fail(ctx, FA_ERR_SHAPE,
                   "flashattn: kv_cache attend: q: expected shape (B, Hq, Lq, D) = (%lld, a multiple of %lld, Lq, "
                   "%lld), got %s",
                   (long long)c->B, (long long)c->H, (long long)c->D, fa_shape_str(q, buf, sizeof buf));
  const char *bad = o->algo != FA_ATTN_AUTO           ? "algo"
                    : o->tile_q || o->tile_k          ? "tile"
                    : o->mask                         ? "mask"
                    : o->kv_lens                      ? "kv_lens (the cache's lengths are the key lengths)"
                    : o->score_mod                    ? "score_mod (not in this version)"
                    : o->mask_mod                     ? "mask_mod (not in this version)"
                    : o->kernel && o->kernel[0]       ? "kernel (the cache chooses: the decode kernel, or the gather)"
                                                      : NULL;
  if (bad)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: kv_cache attend: opts.%s does not apply (scale, causal, window, alibi, softcap, "
                   "return_lse, out, lse_out, splits do)",
                   bad);
  memset(d, 0, sizeof *d);
  d->rank = 4, d->B = c->B, d->Hq = q->shape[1], d->Hkv = c->H, d->Lq = q->shape[2], d->D = c->D, d->Dv = c->Dv;
  for (int64_t b = 0; b < c->B; b++) d->Lk = c->lens[b] > d->Lk ? c->lens[b] : d->Lk;
  d->device = c->device, d->dtype = c->dtype, d->kernel = FA_KERNEL_AUTO;
  return fa_check_attention_options(ctx, q, o, 0, d);
}

/* The device copies of the table and the lengths, made or brought up to
 * date (see struct fa_kv_cache); no API call at all when they are, so
 * that a host may capture attend into a CUDA graph then. */
static fa_status sync_device_table(fa_context *ctx, fa_kv_cache *c) {
  const size_t tb = dev_table_bytes(c), lb = sizeof(int64_t) * (size_t)c->B;
  fa_status st = FA_OK;
  if (!c->dev_stale) return FA_OK;
  if ((!c->dev_table && (st = fa_cuda_malloc(ctx, (void **)&c->dev_table, tb))) ||
      (!c->dev_lens && (st = fa_cuda_malloc(ctx, (void **)&c->dev_lens, lb))) ||
      (!c->h_table && (st = fa_cuda_host_alloc(ctx, (void **)&c->h_table, tb))) ||
      (!c->h_lens && (st = fa_cuda_host_alloc(ctx, (void **)&c->h_lens, lb))) ||
      (!c->uploaded && (st = fa_cuda_event_new(ctx, &c->uploaded))))
    return st;
  if ((st = fa_cuda_event_wait(ctx, c->uploaded))) return st; /* the last copies have left the mirrors */
  const int64_t lo = c->dirty_lo, hi = c->dirty_hi;
  for (int64_t i = lo; i < hi; i++) c->h_table[i] = (int32_t)c->table[i];
  memcpy(c->h_lens, c->lens, lb);
  if ((st = fa_cuda_memcpy(ctx, c->dev_table + lo, c->h_table + lo, sizeof(int32_t) * (size_t)(hi > lo ? hi - lo : 0),
                           FA_COPY_H2D_PINNED)) ||
      (st = fa_cuda_memcpy(ctx, c->dev_lens, c->h_lens, lb, FA_COPY_H2D_PINNED)) ||
      (st = fa_cuda_event_record(ctx, c->uploaded)))
    return st; /* still stale: the next attend copies again */
  c->dirty_lo = c->dirty_hi = 0, c->dev_stale = 0;
  return FA_OK;
}

/* A call a sequence on its rows of kb, vb (gathered with each sequence's
 * keys first), each writing its rows of o and lse: for top_left causal
 * beside a rule aligned to the sequence's end, which one call over keys
 * placed at the end could not count from the start. */
static fa_status attend_each(fa_context *ctx, const fa_kv_cache *c, fa_tensor *q, fa_tensor *kb, fa_tensor *vb,
                             const fa_attention_opts *opts, fa_tensor **o, fa_tensor **lse) {
  const int want_lse = opts->return_lse || lse || opts->lse_out;
  fa_attention_opts so = *opts;
  so.return_lse = want_lse;
  const int64_t oshape[4] = {q->shape[0], q->shape[1], q->shape[2], c->Dv};
  fa_tensor *ro = NULL, *rl = NULL, *qb = NULL, *kv[2] = {NULL, NULL}, *rs = NULL, *ls = NULL, *ob = NULL, *lb = NULL;
  fa_status st = fa_tensor_new(ctx, 4, oshape, q->dtype, c->device, &ro);
  if (!st && want_lse) st = fa_tensor_new(ctx, 3, oshape, FA_F32, c->device, &rl);
  for (int64_t b = 0; b < c->B && !st; b++) {
    fa_tensor *seq[2] = {NULL, NULL};
    for (int i = 0; i < 2 && !st; i++)
      if (!(st = fa_tensor_narrow(ctx, i ? vb : kb, 0, b, 1, &seq[i])))
        st = fa_tensor_narrow(ctx, seq[i], 2, 0, c->lens[b], &kv[i]);
    fa_tensor_drop(&seq[0]), fa_tensor_drop(&seq[1]);
    if (!st && !(st = fa_tensor_narrow(ctx, q, 0, b, 1, &qb)) && !(st = fa_tensor_narrow(ctx, ro, 0, b, 1, &rs)) &&
        !(want_lse && (st = fa_tensor_narrow(ctx, rl, 0, b, 1, &ls)))) {
      so.out = rs, so.lse_out = ls; /* the call writes straight into the sequence's rows */
      st = fa_attention(ctx, qb, kv[0], kv[1], &so, &ob, want_lse ? &lb : NULL);
    }
    fa_tensor_drop(&rs), fa_tensor_drop(&ls), fa_tensor_drop(&kv[0]), fa_tensor_drop(&kv[1]), fa_tensor_drop(&qb),
        fa_tensor_drop(&ob), fa_tensor_drop(&lb);
  }
  if (!st)
    st = fa_attn_deliver(ctx, q, 4, c->Dv, ro, want_lse ? rl : NULL, opts->out, opts->lse_out, q->dtype, FA_F32,
                         c->device, o, lse);
  fa_tensor_drop(&ro), fa_tensor_drop(&rl);
  return st;
}

fa_status fa_kv_cache_attend(fa_context *ctx, fa_kv_cache *c, fa_tensor *q, const fa_attention_opts *opts,
                             fa_tensor **o, fa_tensor **lse) {
  if (o) *o = NULL;
  if (lse) *lse = NULL;
  FA_NEED(o);
  FA_NEED(ctx);
  FA_NEED(c);
  fa_attention_opts defaults;
  if (!opts) {
    fa_attention_opts_init(&defaults);
    opts = &defaults;
  }
  fa_attn_dims d;
  fa_status st = check_attend(ctx, c, q, opts, &d);
  if (st) return st;
  if (c->pages <= INT32_MAX && d.Lk <= INT32_MAX && c->page_size <= INT32_MAX &&
      fa_attn_decode_takes(&d, opts)) { /* the table is int32, the kernel's key arithmetic 32-bit */
    if ((st = sync_device_table(ctx, c))) return st;
    const fa_attn_paged_kv kv = {c->kpool, c->vpool,
                                 {c->dev_table, c->max_pages, c->page_size, c->H * c->page_size * c->D,
                                  c->H * c->page_size * c->Dv},
                                 c->dev_lens, c->lens};
    return fa_attention_paged(ctx, q, &kv, opts, &d, o, lse);
  }
  if (c->device == FA_CPU) { /* no gather (which took 15x the call); opts.splits: the kernel's key chunks */
    const fa_attn_pages pg = {c->table, c->lens, c->max_pages, c->page_size, c->H * c->page_size * c->D,
                              c->H * c->page_size * c->Dv};
    return fa_attention_cpu_pages(ctx, q, c->kpool, c->vpool, &pg, opts, &d, o, lse);
  }
  /* cuda's other calls: the sequences gathered into contiguous K and V of the longest length L (one launch a
   * pool) and one call over the batch: the lengths as kv_lens, or, where they differ and a rule is aligned
   * to a sequence's end (bottom-right causal with Lq > 1, a window, alibi), each sequence's keys at the end
   * of its L and a (B, 1, 1, L) bool mask of them: the rules then count from each sequence's end (with
   * top_left causal, which counts from its start, a call a sequence: attend_each) */
  if (c->pages > INT32_MAX)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                   "flashattn: kv_cache attend: %lld pages: the device page table holds at most 2^31 - 1",
                   (long long)c->pages);
  if ((st = sync_device_table(ctx, c))) return st;
  const int64_t L = d.Lk;
  int equal = 1;
  for (int64_t b = 0; b < c->B; b++) equal &= c->lens[b] == L;
  const int aligned = !equal && ((opts->causal == FA_CAUSAL_BOTTOM_RIGHT && d.Lq > 1) || opts->has_window || opts->alibi);
  const int each = aligned && opts->causal == FA_CAUSAL_TOP_LEFT, right = aligned && !each;
  fa_tensor *kb = NULL, *vb = NULL, *mask = NULL;
  const int64_t mshape[4] = {c->B, 1, 1, L}; /* right: the keys that are a sequence's, made with K */
  if ((right && (st = fa_tensor_new(ctx, 4, mshape, FA_BOOL, c->device, &mask))) ||
      (st = gather_pool(ctx, c, c->kpool, c->D, L, right, mask ? fa_tensor_ptr(mask) : NULL, &kb)) ||
      (st = gather_pool(ctx, c, c->vpool, c->Dv, L, right, NULL, &vb)))
    goto done;
  if (each) {
    st = attend_each(ctx, c, q, kb, vb, opts, o, lse);
    goto done;
  }
  fa_attention_opts so = *opts;
  if (right) {
    so.mask = mask;
  } else if (!equal) {
    so.kv_lens = c->lens, so.n_kv_lens = c->B;
  }
  st = fa_attention(ctx, q, kb, vb, &so, o, lse);
done:
  fa_tensor_drop(&kb), fa_tensor_drop(&vb), fa_tensor_drop(&mask);
  return st;
}
