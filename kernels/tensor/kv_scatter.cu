/* The paged KV cache's append on cuda (API §8): the new positions of every
 * sequence copied into their pages in one launch per pool and batch of
 * segments, instead of a copy per sequence and page (a decoding loop at
 * B = 64 spent about 420 µs a step in those launches, H200). */
#include "common.cuh"

/* A segment per block: rows [from, from + count) of src's batch entry b,
 * every head, into rows [off, off + count) of pool page `page`; elements
 * of E bytes moved as such (the pool and src share the dtype), src's last
 * dimension contiguous. */
template <typename E>
__global__ void kv_scatter_kernel(fa_kv_segments s, char *pool, const char *src, int64_t H, int64_t ps, int64_t X,
                                  int64_t sb, int64_t sh, int64_t sn) {
  const fa_kv_segment g = s.seg[blockIdx.x];
  const int64_t per_head = (int64_t)g.count * X, total = H * per_head;
  E *dst = (E *)pool;
  const E *from = (const E *)src;
  for (int64_t e = threadIdx.x; e < total; e += blockDim.x) {
    const int64_t h = e / per_head, r = e % per_head / X, x = e % X;
    dst[((g.page * H + h) * ps + g.off + r) * X + x] = from[g.b * sb + h * sh + (g.from + r) * sn + x];
  }
}

extern "C" fa_status fa_cuda_kv_scatter(fa_context *ctx, const fa_kv_segments *s, fa_tensor *pool,
                                        const fa_tensor *src) {
  if (s->n <= 0) return FA_OK;
  const int64_t H = pool->shape[1], ps = pool->shape[2], X = pool->shape[3];
  const size_t es = fa_dtype_size(src->dtype);
  char *p = (char *)fa_tensor_ptr(pool);
  const char *q = (const char *)fa_tensor_ptr(src);
  const int64_t *st = src->strides;
  cudaStream_t stream = fa_cuda_stream(ctx);
  const int threads = 128;
  if (es == 2) kv_scatter_kernel<uint16_t><<<s->n, threads, 0, stream>>>(*s, p, q, H, ps, X, st[0], st[1], st[2]);
  else if (es == 4) kv_scatter_kernel<uint32_t><<<s->n, threads, 0, stream>>>(*s, p, q, H, ps, X, st[0], st[1], st[2]);
  else kv_scatter_kernel<uint64_t><<<s->n, threads, 0, stream>>>(*s, p, q, H, ps, X, st[0], st[1], st[2]);
  FA_CUDA_CHECK_LAUNCH(ctx, "kv_scatter_kernel");
  return FA_OK;
}
