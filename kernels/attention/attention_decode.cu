/* The decode kernel's registry entry and its fit (API §8).  The kernel and
 * its launches are in attention_decode.cuh, instantiated a dtype a file
 * (attention_decode_bf16.cu, attention_decode_f16.cu). */
#include "attention_decode.cuh"

extern "C" int fa_cuda_attention_decode_fit(fa_dtype dt, int64_t D, int64_t Dv, int64_t Hq, int64_t Hkv, int64_t Lq,
                                            char *why, size_t n) {
  const int64_t rows = Hkv > 0 ? Hq / Hkv * Lq : 0;
  if (!attn_fit_16bit(dt, D, Dv, D == 64 || D == 128 || D == 256, "64, 128 or 256", why, n)) return 0;
  if (D == 256) { /* two row groups at most (DEC_ROWS_D256), its tiles in the device's shared memory */
    fa_cuda_props dp;
    if (rows > DEC_ROWS_D256) {
      snprintf(why, n, "%lld query rows a key head (Hq / Hkv · Lq) at D = 256; it takes at most %d there",
               (long long)rows, DEC_ROWS_D256);
      return 0;
    }
    if (!fa_cuda_device_props_quiet(&dp) || dec_smem_bytes(256, 2) + DEC_STATIC_SMEM > (size_t)dp.smem_optin) {
      snprintf(why, n, "D = 256 needs %zu bytes of shared memory a block; this device has fewer",
               dec_smem_bytes(256, 2) + DEC_STATIC_SMEM);
      return 0;
    }
    return 1;
  }
  if (rows <= DEC_ROWS || (Lq <= DEC_MAX_LQ_BLOCKS && rows <= DEC_MAX_ROWS)) return 1; /* rows and blocks in int */
  snprintf(why, n, "%lld query rows a key head (Hq / Hkv · Lq) at Lq = %lld; it takes at most 64, or Lq up to 16 "
           "and 2^24 rows", (long long)rows, (long long)Lq);
  return 0;
}

/* ---- its registry entry: "flash", taken when named (src/ names it where it
 * fits, fa_attn_decode_takes: its split of the keys replaces src/'s) ---- */

static bool decode_takes(const fa_attn_problem *, fa_attention_algo, bool) { return true; }

/* Queues the decode kernel for p (checked to fit again: fa_cuda_attention_decode_fit,
 * and rows on 16 bytes); p->paging: the page table of a paged cache, or NULL;
 * p->splits: the chunks of keys (0: chosen from the shape and the GPU). */
static fa_status decode_queue(fa_context *ctx, const attn_params *p, fa_attention_algo, bool, int **v_flag) {
  *v_flag = NULL;
  const fa_attn_paging *pg = p->paging;
  const int64_t splits = p->splits;
  char why[128];
  if (!fa_cuda_attention_decode_fit(p->compute, p->D, p->Dv, p->Hq, p->Hkv, p->Lq, why, sizeof why) ||
      !attn_rows_aligned16(p))
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: the decode kernel does not take this call");
  decode_args a;
  memset(&a, 0, sizeof a);
  a.G = (int)(p->Hq / p->Hkv), a.rows = (int)(a.G * p->Lq), a.row_blocks = (int)decode_row_blocks(a.rows);
  a.pg_shift = -1;
  if (p->kv_lens_host && p->B <= FA_KV_LENS_INLINE) {
    a.lens_inline = 1;
    memcpy(a.lens, p->kv_lens_host, sizeof(int64_t) * (size_t)p->B);
  } else if (p->kv_lens_host && !p->kv_lens) { /* src/ leaves the device copy out only for batches that fit */
    return fa_fail(ctx, FA_ERR_BACKEND, "flashattn: the decode kernel: %lld lengths, none on the device",
                   (long long)p->B);
  }
  if (pg) {
    a.pg = *pg;
    for (int sh = 0; sh < 62; sh++)
      if (((int64_t)1 << sh) == pg->page_size) a.pg_shift = sh;
  }
  return p->compute == FA_F16 ? decode_launch<__half>(ctx, p, a, splits) : decode_launch<__nv_bfloat16>(ctx, p, a, splits);
}

const attn_entry attn_entry_decode = {FA_KERNEL_DECODE, ATTN_ALGO(FA_ATTN_FLASH), true, NULL, NULL, decode_takes,
                                      decode_queue,     false, NULL, ATTN_MASK_BITS};
