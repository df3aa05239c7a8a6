/* The registry's CUDA attention kernels (attention_registry.h): the table,
 * what src/ asks of it (a kernel's fit, tiles and default tile), and the
 * dispatch: the kernel named or the first that takes the call, scheduled,
 * then the SIMT kernel behind a fast one for NaN/inf in V. */
#include "attention_nonfinite.cuh"
#include "attention_registry.h"

#include <cstdio>

/* In the registry's order (src/attn_kernels.c), fastest first: the
 * automatic choice is the first that takes the call and its algo (decode,
 * first there too, only when named). */
static const attn_entry *const table[] = {&attn_entry_decode, &attn_entry_wgmma_tma, &attn_entry_wgmma,
                                          &attn_entry_mma,    &attn_entry_f32,       &attn_entry_simt,
                                          &attn_entry_naive,  &attn_entry_row,       &attn_entry_wgmma_fp8};

static const attn_entry *attn_entry_of(fa_attn_kernel k) {
  for (const attn_entry *e : table)
    if (e->id == k) return e;
  return NULL;
}

static bool entry_takes(const attn_entry *e, const fa_attn_problem *p, fa_attention_algo algo, bool automatic) {
  char why[8];
  int64_t br, bc;
  return (e->algos & ATTN_ALGO(algo)) && (!e->fit || e->fit(p->compute, p->D, p->Dv, &br, &bc, why, sizeof why)) &&
         (!e->tile_ok || e->tile_ok(p->D, p->tile_q, p->tile_k)) && e->takes(p, algo, automatic);
}

/* A kernel may take a tile of its own (own_tile) when chosen, not named, for a built-in rule
 * (a variant's instances keep the call's tile) and no opts.tile was given. */
static bool own_tile(fa_attn_kernel named, const fa_attn_problem *p, bool variant) {
  return named == FA_KERNEL_AUTO && !variant && !p->tile_given;
}

const attn_entry *attn_entry_pick(fa_attn_kernel named, const fa_attn_problem *p, fa_attention_algo algo, bool variant) {
  for (const attn_entry *e : table)
    if ((named == FA_KERNEL_AUTO ? !e->named_only && !(e->declines && e->declines(p, attn_rows_dense(p)))
                                 : e->id == named) &&
        (!variant || e->variant_hook) && entry_takes(e, p, algo, own_tile(named, p, variant)))
      return e;
  return NULL;
}

bool attn_fast_tile(fa_dtype dt, int64_t D, int64_t Dv, int64_t br, int64_t bc) {
  char why[8];
  int64_t kbr, kbc;
  for (const attn_entry *e : table)
    if (e != &attn_entry_simt && e->fit && e->fit(dt, D, Dv, &kbr, &kbc, why, sizeof why) && e->tile_ok(D, br, bc))
      return true;
  return false;
}

/* the tensor-core kernels' and decode's shared part of fit (attention_registry.h) */
int attn_fit_16bit(fa_dtype dt, int64_t D, int64_t Dv, bool dims, const char *dims_text, char *why, size_t n) {
  if (dt != FA_F16 && dt != FA_BF16) snprintf(why, n, "%s inputs; it takes f16 or bf16", fa_dtype_name(dt));
  else if (D != Dv || !dims)
    snprintf(why, n, "D = %lld, Dv = %lld; it takes D = Dv = %s", (long long)D, (long long)Dv, dims_text);
  else return 1;
  return 0;
}

extern "C" int fa_cuda_attention_kernel_fit(fa_attn_kernel kernel, fa_dtype dt, int64_t D, int64_t Dv, int64_t *br,
                                            int64_t *bc, char *why, size_t n) {
  const attn_entry *e = attn_entry_of(kernel);
  if (!e || !e->fit) {
    snprintf(why, n, "not a tiled kernel");
    return 0;
  }
  return e->fit(dt, D, Dv, br, bc, why, n);
}

extern "C" int fa_cuda_attention_kernel_tile_ok(fa_attn_kernel kernel, int64_t D, int64_t br, int64_t bc) {
  const attn_entry *e = attn_entry_of(kernel);
  return e && e->tile_ok && e->tile_ok(D, br, bc);
}

extern "C" int fa_cuda_attention_kernel_declines(fa_attn_kernel kernel, const fa_attn_problem *p, int rows_dense) {
  const attn_entry *e = attn_entry_of(kernel);
  return e && e->declines && e->declines(p, rows_dense != 0);
}

/* The default tile of "flash" on cuda: that of the first fast kernel that
 * fits the call (the Hopper kernels' {128, 64 or 128}, mma.sync's
 * {16·warps, 64} elsewhere, the f32 kernel's {64, 32}), else {64, 64} for
 * the SIMT kernel. */
extern "C" void fa_cuda_attention_default_tile(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc) {
  char why[8];
  for (const attn_entry *e : table)
    if (e != &attn_entry_simt && e->fit && e->fit(dt, D, Dv, br, bc, why, sizeof why)) return;
  *br = 64, *bc = 64;
}

/* Heads a group of the fast kernels' block order (frag_qtile): with causal
 * masks the tiles of a head differ in length, and taking a group's
 * longest first ends the grid on short ones (the tail of long blocks cost
 * up to a tenth at L = 1024).  f16/bf16: a group's keys and values are
 * kept to about half of L2, so that they are still read once from memory,
 * and the heads split into equal groups (the smallest divisor of B·Hq from
 * that size up to twice it): a short last group started its long tiles in
 * the grid's last wave (f16/bf16 2-6 % at L = 4096 and 16384).  f32: all
 * heads in one group, the longest tiles of the whole grid first; at a
 * tenth of the f16 rate its key/value reads stay far below the memory
 * bandwidth without L2 reuse (D = 128: +4 % at L = 1024, +9 % at L = 4096;
 * docs/perf/2026-11-22-attention-h200-run23.json). */
static fa_status schedule_heads(fa_context *ctx, const fa_attn_problem *p, int64_t *heads) {
  *heads = 1;
  if (p->causal == FA_CAUSAL_NONE) return FA_OK;
  const int64_t bh = p->B * p->Hq;
  if (p->compute == FA_F32) {
    *heads = bh;
    return FA_OK;
  }
  fa_cuda_props dp;
  if (fa_status st = fa_cuda_device_props(ctx, &dp)) return st;
  const int64_t kv = p->Lk * (p->D + p->Dv) * 2;
  const int64_t fit = max((int64_t)1, min(bh, (int64_t)dp.l2_bytes / 2 / max(kv, (int64_t)1)));
  *heads = fit;
  for (int64_t g = fit; g <= min(bh, 2 * fit) && g < fit + 4096; g++) /* bounded: a host loop a call */
    if (bh % g == 0) {
      *heads = g;
      break;
    }
  return FA_OK;
}

/* The one dispatch (src/internal.h): the entry named, or the first that
 * takes the call (attn_entry_pick); for the tiled kernels their block
 * order (schedule_heads); for "two_pass" its row statistics, allocated
 * here; then the queue, and behind a fast kernel the SIMT kernel guarded by
 * its NaN/inf flag: it runs only when V holds NaN or inf, and then rewrites
 * every output (attention_nonfinite.cuh). */
extern "C" fa_status fa_cuda_attention_run(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel,
                                           const fa_attn_paging *paging, int64_t splits, const fa_attn_problem *in) {
  if (in->compute != FA_F32 && in->compute != FA_F16 && in->compute != FA_BF16)
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: attention on cuda takes f32, f16 or bf16, got %s",
                   fa_dtype_name(in->compute));
  const attn_entry *e = attn_entry_pick(kernel, in, algo, false);
  if (!e) /* named, and checked before (fa_check_attention_kernel): e.g. operands off 16 bytes */
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: opts.kernel: the kernel named declined the call on cuda");
  attn_params p = attn_params_of(*in);
  p.paging = paging, p.splits = splits;
  fa_status st = e->fit ? schedule_heads(ctx, in, &p.sched_heads) : FA_OK;
  const size_t stats_bytes = algo == FA_ATTN_TWO_PASS ? sizeof(float) * 2 * (size_t)(p.B * p.Hq * p.Lq) : 0;
  if (!st && stats_bytes) st = fa_cuda_malloc(ctx, (void **)&p.row_stats, stats_bytes);
  if (st) return st;
  size_t bits_bytes = 0;
  p.mask_bits = NULL; /* only this call's, made here and freed below */
  if (e->mask_read != ATTN_MASK_BYTES && p.mask_b)
    st = attn_mask_bits_queue(ctx, &p, e->mask_read == ATTN_MASK_BITS_RANGES, &bits_bytes);
  int *v_flag = NULL;
  if (!st) st = e->queue(ctx, &p, algo, own_tile(kernel, in, false), &v_flag);
  if (!st && v_flag) st = attn_simt_queue(ctx, &p, algo, v_flag);
  if (v_flag) fa_cuda_free_on(ctx, v_flag, FA_FLAG_BYTES); /* stream-ordered: after the kernels */
  if (p.mask_bits) fa_cuda_free_on(ctx, (void *)p.mask_bits, bits_bytes);
  if (stats_bytes) fa_cuda_free_on(ctx, p.row_stats, stats_bytes); /* after both passes */
  return st;
}
