/* A bool mask as bits, made once a call for the kernels that score a tile
 * in accumulator fragments (frag_rule): a thread there reads its row's
 * keys of a tile in one 16-byte load (a key tile of 128 from a multiple of
 * 128) or a few words, where it read a byte pair a column block (sixteen
 * loads a row and tile of 128 keys).  Bit k % 32 of word k / 32 of a row is
 * key k; rows (attn_mask_bits_row_words) end in two chunks of four
 * words, so that a tile's words read from any key of the row stay in it,
 * and start 16 bytes apart.  The last two words of a row hold the first
 * key it keeps and one past the last (mask_ranges_kernel), from which the
 * tensor-core kernels narrow a query tile's keys to those some row keeps
 * (attn_rule::kept, attn_keys): a structured mask (documents, blocks,
 * padding) skips the key tiles it leaves empty.  The mask's broadcast dimensions
 * (stride 0) stay broadcast: a (1, 1, Lq, Lk) mask is Lq rows. */
#include "attention_registry.h"

/* A warp a word at a time: lane l reads key 32·w + l of the row, and the
 * warp's ballot is the word (the lanes read consecutive bytes when the
 * mask's keys are contiguous). */
static __global__ void mask_bits_kernel(const uint8_t *m, int64_t ms0, int64_t ms1, int64_t ms2, int64_t ms3,
                                        int64_t mh, int64_t ml, int64_t lk, int64_t row_words, int64_t words,
                                        uint32_t *bits) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t w = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; w < words; w += warps) {
    const int64_t row = w / row_words, k = (w % row_words) * 32 + lane;
    const int64_t i = row % ml, h = row / ml % mh, b = row / ml / mh;
    const bool keep = k < lk && m[b * ms0 + h * ms1 + i * ms2 + k * ms3] != 0;
    const uint32_t x = __ballot_sync(0xffffffffu, keep);
    if (lane == 0) bits[w] = x;
  }
}

/* A warp a row of bits: its first kept key and one past its last
 * (0x7fffffff and 0 where it keeps none) into its last two words. */
static __global__ void mask_ranges_kernel(uint32_t *bits, int64_t rows, int64_t row_words, int64_t key_words) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
  for (int64_t r = (blockIdx.x * (int64_t)blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
    uint32_t *row = bits + r * row_words;
    unsigned first = 0x7fffffffu, end = 0;
    for (int64_t w = lane; w < key_words; w += 32)
      if (const uint32_t x = row[w])
        first = min(first, (unsigned)(32 * w + __ffs((int)x) - 1)), end = (unsigned)(32 * w + 32 - __clz((int)x));
    first = __reduce_min_sync(0xffffffffu, first), end = __reduce_max_sync(0xffffffffu, end);
    if (lane == 0) row[row_words - 2] = first, row[row_words - 1] = end;
  }
}

/* p's bool mask as bits at p->mask_bits (*bytes of device memory, freed by
 * the caller behind the kernels that read it), with p->mask_bits_strides
 * (words) and, with ranges, the rows' kept ranges (a launch more: decode
 * does not narrow); p->mask_bits stays NULL on failure. */
fa_status attn_mask_bits_queue(fa_context *ctx, attn_params *p, bool ranges, size_t *bytes) {
  const int64_t *ms = p->mask_strides;
  const int64_t mb = ms[0] ? p->B : 1, mh = ms[1] ? p->Hq : 1, ml = ms[2] ? p->Lq : 1;
  const int64_t row_words = attn_mask_bits_row_words(p->Lk), words = mb * mh * ml * row_words;
  *bytes = sizeof(uint32_t) * (size_t)words;
  fa_cuda_props dp;
  if (fa_status st = fa_cuda_device_props(ctx, &dp)) return st;
  uint32_t *bits = NULL;
  if (fa_status st = fa_cuda_malloc(ctx, (void **)&bits, *bytes)) return st;
  const int threads = 256;
  const int64_t blocks = min((words + threads / 32 - 1) / (threads / 32), (int64_t)dp.sms * 8);
  mask_bits_kernel<<<(unsigned)blocks, threads, 0, fa_cuda_stream(ctx)>>>(p->mask_b, ms[0], ms[1], ms[2], ms[3], mh,
                                                                          ml, p->Lk, row_words, words, bits);
  cudaError_t e = cudaGetLastError();
  const char *what = "launch of mask_bits_kernel";
  if (e == cudaSuccess && ranges) {
    const int64_t rows = mb * mh * ml;
    const int64_t row_blocks = min((rows + threads / 32 - 1) / (threads / 32), (int64_t)dp.sms * 8);
    mask_ranges_kernel<<<(unsigned)row_blocks, threads, 0, fa_cuda_stream(ctx)>>>(bits, rows, row_words,
                                                                                   (p->Lk + 31) / 32);
    e = cudaGetLastError(), what = "launch of mask_ranges_kernel";
  }
  if (e != cudaSuccess) {
    fa_cuda_free_on(ctx, bits, *bytes);
    return fa_cuda_error(ctx, e, what);
  }
  p->mask_bits = bits;
  p->mask_bits_strides[0] = ms[0] ? mh * ml * row_words : 0;
  p->mask_bits_strides[1] = ms[1] ? ml * row_words : 0;
  p->mask_bits_strides[2] = ms[2] ? row_words : 0;
  return FA_OK;
}
