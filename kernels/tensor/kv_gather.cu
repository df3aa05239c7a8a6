/* The paged KV cache's attend on cuda, for the calls the decode kernel does
 * not take (API §8): every sequence's positions of a pool gathered through
 * the device page table into one contiguous (B, H, L, X) in one launch, L
 * the longest sequence, the other rows zeroed: a sequence's rows at the
 * start, or (right) at the end, so that its last key is key L - 1.  It was
 * a copy per sequence, head run and page (2048 launches a sequence at 32k
 * positions in pages of 16). */
#include "common.cuh"

/* A chunk of `rows` rows of one (b, h) per block iteration, in units of
 * type U (the rows' bytes are a multiple of sizeof(U): 16 where they can
 * be, the pool and dst starting at allocations' aligned bases).  mask (or
 * NULL): (B, L) bytes, 1 where a key of the sequence lies, written by the
 * blocks of head 0 (MASK a template argument: tested at run time, every
 * gather took 1.5-2 % more time, the unmasked ones too; a row's page found
 * once by a group of threads a row gained nothing; H200, session 72). */
template <typename U, bool MASK>
__global__ void kv_gather_kernel(const U *pool, U *dst, uint8_t *mask, const int32_t *table, const int64_t *lens,
                                 int64_t H, int64_t ps, int64_t units, int64_t max_pages, int64_t L, int64_t rows,
                                 int64_t chunks_per_head, int64_t chunks, bool right) {
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t bh = c / chunks_per_head, r0 = c % chunks_per_head * rows, b = bh / H, h = bh % H;
    const int64_t n = min(rows, L - r0), len = lens[b], pad = right ? L - len : 0;
    U *out = dst + (bh * L + r0) * units;
    for (int64_t e = threadIdx.x; e < n * units; e += blockDim.x) {
      const int64_t r = r0 + e / units - pad, x = e % units; /* the sequence's row */
      const bool in = r >= 0 && r < len;
      U val;
      if (in) {
        const int64_t page = table[b * max_pages + r / ps];
        val = pool[((page * H + h) * ps + r % ps) * units + x];
      } else {
        memset(&val, 0, sizeof val);
      }
      out[e] = val;
      if (MASK && h == 0 && x == 0) mask[b * L + r0 + e / units] = in;
    }
  }
}

template <typename U>
static void launch_gather(cudaStream_t stream, const void *pool, void *dst, uint8_t *mask, const int32_t *table,
                          const int64_t *lens, int64_t B, int64_t H, int64_t ps, int64_t row_bytes, int64_t max_pages,
                          int64_t L, bool right) {
  const int threads = 256;
  const int64_t units = row_bytes / (int64_t)sizeof(U);
  /* about 16 KB a chunk, whole rows */
  const int64_t rows = max((int64_t)1, min(L, (int64_t)16384 / row_bytes));
  const int64_t per_head = (L + rows - 1) / rows, chunks = B * H * per_head;
  const unsigned grid = (unsigned)min(chunks, (int64_t)1 << 20);
  const auto kernel = mask ? kv_gather_kernel<U, true> : kv_gather_kernel<U, false>;
  kernel<<<grid, threads, 0, stream>>>((const U *)pool, (U *)dst, mask, table, lens, H, ps, units, max_pages, L, rows,
                                       per_head, chunks, right);
}

extern "C" fa_status fa_cuda_kv_gather(fa_context *ctx, const int32_t *table, int64_t max_pages, const int64_t *lens,
                                       const fa_tensor *pool, fa_tensor *dst, int right, uint8_t *mask) {
  const int64_t B = dst->shape[0], H = dst->shape[1], L = dst->shape[2], X = dst->shape[3];
  if (B * H * L * X == 0) return FA_OK;
  const int64_t ps = pool->shape[2], row_bytes = X * (int64_t)fa_dtype_size(dst->dtype);
  const void *src = fa_tensor_ptr(pool);
  void *out = fa_tensor_ptr(dst);
  cudaStream_t stream = fa_cuda_stream(ctx);
  if (row_bytes % 16 == 0)
    launch_gather<uint4>(stream, src, out, mask, table, lens, B, H, ps, row_bytes, max_pages, L, right);
  else if (row_bytes % 8 == 0)
    launch_gather<uint2>(stream, src, out, mask, table, lens, B, H, ps, row_bytes, max_pages, L, right);
  else if (row_bytes % 4 == 0)
    launch_gather<uint32_t>(stream, src, out, mask, table, lens, B, H, ps, row_bytes, max_pages, L, right);
  else
    launch_gather<uint16_t>(stream, src, out, mask, table, lens, B, H, ps, row_bytes, max_pages, L, right);
  FA_CUDA_CHECK_LAUNCH(ctx, "kv_gather_kernel");
  return FA_OK;
}
