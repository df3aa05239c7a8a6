/* "flash" on Hopper, warp-specialised (the "wgmma_tma" kernel): the host
 * side, the operands' tensor maps and the launches; the kernels and their
 * design: attention_wgmma_tma.cuh. */
#include "attention_registry.h"
#include "attention_wgmma_tma.cuh"

#include <cudaTypedefs.h>

#include <cstdio>

#include <algorithm>
#include <cstring>

/* cuTensorMapEncodeTiled, from the driver through the runtime (no link
 * against libcuda); NULL when the driver has none.  Asked once: a static
 * initialised by a lambda, which C++ makes thread-safe (a volatile flag
 * let a thread on a weakly ordered host see it set before the pointer). */
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void *f = NULL;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) ==
            cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      return (PFN_cuTensorMapEncodeTiled_v12000)f;
    (void)cudaGetLastError();
    return (PFN_cuTensorMapEncodeTiled_v12000)NULL;
  }();
  return fn;
}

/* wt_encode_operand: 0 also for a stride the copy engine cannot take (e.g.
 * 0, a broadcast). */
int wt_encode_operand(CUtensorMap *m, fa_dtype dt, const void *base, const fa_attn_strides &st, int64_t L, int64_t H,
                      int64_t B, int D, int rows) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return 0;
  const cuuint64_t dim[4] = {(cuuint64_t)D, (cuuint64_t)(L > 0 ? L : 1), (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t stride[3] = {(cuuint64_t)st.s * 2, (cuuint64_t)st.h * 2, (cuuint64_t)st.b * 2};
  const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1}, step[4] = {1, 1, 1, 1};
  return encode(m, dt == FA_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
                (void *)base, dim, stride, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* What a call's maps are made of: the same key, the same maps (a buffer
 * freed and allocated again at the same address maps alike). */
struct wt_maps_key {
  fa_dtype dt;
  const void *q, *k, *v;
  fa_attn_strides q_st, k_st, v_st;
  int64_t B, Hq, Hkv, Lq, Lk, D, bc;
};

/* O's map (wt_maps.o: boxes of 64 columns by a warp's 16 rows), made only
 * where the persistent form stages O in a tile of its own (wt_o_tile: the
 * other forms store from the threads), and kept as the last call's on this
 * thread apart from q, k and v's: a loop of calls that each take a new
 * output encodes it alone. */
struct wt_output_key {
  fa_dtype dt;
  const void *o;
  fa_attn_strides o_st;
  int64_t B, Hq, Lq, D, Dv, bc;
};

static void wt_encode_output(const fa_attn_problem *p, wt_maps *m) {
  static thread_local wt_output_key last_key;
  static thread_local CUtensorMap last_map;
  static thread_local int last_ok = -1;
  wt_output_key key;
  memset(&key, 0, sizeof key);
  key.dt = p->compute, key.o = p->o, key.o_st = p->o_st;
  key.B = p->B, key.Hq = p->Hq, key.Lq = p->Lq, key.D = p->D, key.Dv = p->Dv, key.bc = p->tile_k;
  if (last_ok < 0 || memcmp(&key, &last_key, sizeof key) != 0) {
    last_ok = p->o && p->Dv == p->D && wt_o_tile((int)p->D, (int)p->tile_k) &&
              wt_encode_operand(&last_map, p->compute, p->o, p->o_st, p->Lq, p->Hq, p->B, (int)p->D, 16);
    last_key = key;
  }
  m->o_mapped = last_ok;
  if (last_ok) m->o = last_map;
}

/* The last call's maps on this thread, kept: a loop of calls on the same
 * tensors (decoding, benchmarks) encodes them once, and the registry's
 * check (tma_takes) and the launch share one encoding. */
int wt_encode_maps(const fa_attn_problem *p, wt_maps *m) {
  static thread_local wt_maps_key last_key;
  static thread_local wt_maps last_maps;
  static thread_local int last_ok = -1; /* -1: none yet */
  wt_maps_key key;
  memset(&key, 0, sizeof key); /* the padding too: compared bytewise */
  key.dt = p->compute, key.q = p->q, key.k = p->k, key.v = p->v;
  key.q_st = p->q_st, key.k_st = p->k_st, key.v_st = p->v_st;
  key.B = p->B, key.Hq = p->Hq, key.Hkv = p->Hkv, key.Lq = p->Lq, key.Lk = p->Lk, key.D = p->D, key.bc = p->tile_k;
  if (last_ok < 0 || memcmp(&key, &last_key, sizeof key) != 0) {
    const int D = (int)p->D, BC = (int)p->tile_k;
    last_ok = wt_encode_operand(&last_maps.q, p->compute, p->q, p->q_st, p->Lq, p->Hq, p->B, D, WT_BR) &&
              wt_encode_operand(&last_maps.k, p->compute, p->k, p->k_st, p->Lk, p->Hkv, p->B, D, BC) &&
              wt_encode_operand(&last_maps.v, p->compute, p->v, p->v_st, p->Lk, p->Hkv, p->B, D, BC);
    last_key = key;
  }
  if (!last_ok) return 0;
  *m = last_maps;
  wt_encode_output(p, m);
  return 1;
}

template <typename T, int D, int BC, int EXTRAS>
static fa_status launch(fa_context *ctx, const attn_params *p, const wt_maps &m) {
  const size_t smem = wt_form_smem_bytes(D, BC, false);
  /* turns at D = 256 (+5-12 %); at D = 128 they cost up to a tenth at
   * L = 16k (H200, 2026-11-27, docs/perf/2026-11-27-attention-h200-tma.json) */
  void (*kernel)(const attn_params, const wt_maps) = attn_wgmma_tma_kernel<T, D, BC, EXTRAS, D == 256>;
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int64_t blocks = p->B * p->Hq * ((p->Lq + WT_BR - 1) / WT_BR);
  if (fa_status st = attn_grid_fits(ctx, blocks)) return st;
  kernel<<<(unsigned)blocks, wt_threads(D, BC), smem, fa_cuda_stream(ctx)>>>(*p, m);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_wgmma_tma_kernel");
  FA_TRACE_REPORT(fa_cuda_stream(ctx), "attn_wgmma_tma_kernel");
  return FA_OK;
}

/* The persistent form's grid, a block an SM (at most `tiles`), and its
 * tile counter: the spare int of the call's NaN/inf flag (flag, whose
 * memset zeroed it; fa_flag_counter).  Every persistent launch, built-in or
 * variant, is guarded by such a flag (launch_fast_passes, the variants'
 * fast path), so a missing one is a fault of the engine's own. */
fa_status wt_persistent_grid(fa_context *ctx, int64_t tiles, int *flag, unsigned *grid, int **next) {
  *next = fa_flag_counter(flag);
  if (!*next)
    return fa_fail(ctx, FA_ERR_BACKEND, "flashattn: the persistent kernel has no tile counter (no NaN/inf flag)");
  fa_cuda_props dp;
  if (fa_status st = fa_cuda_device_props(ctx, &dp)) return st;
  *grid = (unsigned)std::min(tiles, (int64_t)dp.sms);
  return FA_OK;
}

/* The persistent form (see its kernel). */
template <typename T, int D, int BC, int EXTRAS>
static fa_status launch_persistent(fa_context *ctx, const attn_params *p, const wt_maps &m) {
  const size_t smem = wt_form_smem_bytes(D, BC, true);
  void (*kernel)(const attn_params, const wt_maps, int *) = attn_wgmma_tma_persistent_kernel<T, D, BC, EXTRAS>;
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const int64_t tiles = p->B * p->Hq * ((p->Lq + WT_BR - 1) / WT_BR);
  if (fa_status st = attn_grid_fits(ctx, tiles)) return st;
  if (tiles <= 0) return FA_OK;
  unsigned grid = 0;
  int *next = NULL;
  if (fa_status st = wt_persistent_grid(ctx, tiles, p->v_nonfinite, &grid, &next)) return st;
  kernel<<<grid, wt_threads(D, BC), smem, fa_cuda_stream(ctx)>>>(*p, m, next);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_wgmma_tma_persistent_kernel");
  FA_TRACE_REPORT(fa_cuda_stream(ctx), "attn_wgmma_tma_persistent_kernel");
  return FA_OK;
}

static double tma_tile_keys(const fa_attn_problem *p);

/* The instances whose persistent form takes a bool mask (below): one test for the dispatch at run time
 * and for the instances launch_extras compiles. */
static constexpr bool wt_mask_persistent(int D, int BC) { return D == 64 || (D == 128 && BC == 128); }

/* The persistent form takes a bool mask at D = 64 (read as bits, Q in
 * registers, the scheduler warp: 1.02-1.15 x the block a tile, most at
 * 1024 keys; H200, docs/perf/2026-12-03-mask-persistent-h200.json) and at
 * D = 128 where a query tile takes fewer than 8192 keys (tma_tile_keys; Q
 * in shared memory, no scheduler warp; key tiles of 128, a mask's default).
 * There the benchmark's mask (one key in ten off) ran at 1.08-1.15 x the
 * block a tile at 1024 keys, 1.03-1.08 x at 2048, 1.02 x causal at 4096,
 * 0.99 x not causal at 4096 and causal at 8192, and masks whose rows are
 * short at 1.03-1.23 x (documents, key padding, a band; L 2048 and 4096);
 * at 8192 keys not causal it lost 2 % (H200, in turns in one process,
 * docs/perf/2026-12-04-mask-persistent-d128-h200.json; the scheduler warp
 * made no difference).  No other mask (wt_persistent_fits). */
static bool wt_persistent(const attn_params *p, const wt_maps &m) {
  const bool bool_persistent =
      p->mask_b && wt_mask_persistent((int)p->D, (int)p->tile_k) && (p->D == 64 || tma_tile_keys(p) < 8192);
  const bool masked = attn_extras_kind(p) == EXTRAS_MASK && !bool_persistent;
  return wt_persistent_fits(m, p->D, p->tile_k, p->Lk, masked);
}

/* The call's score rule on the persistent form, or on a block a query tile
 * (the masks, and the consumers taking turns at D = 256). */
template <typename T, int D, int BC> static fa_status launch_extras(fa_context *ctx, const attn_params *p, const wt_maps &m) {
  const int x = attn_extras_kind(p);
  if constexpr (wt_sm_blocks(D, BC) == 1) /* the persistent form: a block an SM */
    if (wt_persistent(p, m)) {
      if constexpr (wt_mask_persistent(D, BC))
        if (x == EXTRAS_MASK) return launch_persistent<T, D, BC, EXTRAS_MASK>(ctx, p, m);
      if (x == EXTRAS_SCORE) return launch_persistent<T, D, BC, EXTRAS_SCORE>(ctx, p, m);
      return launch_persistent<T, D, BC, EXTRAS_NONE>(ctx, p, m);
    }
  if (x == EXTRAS_MASK) return launch<T, D, BC, EXTRAS_MASK>(ctx, p, m);
  if (x == EXTRAS_SCORE) return launch<T, D, BC, EXTRAS_SCORE>(ctx, p, m);
  return launch<T, D, BC, EXTRAS_NONE>(ctx, p, m);
}

template <typename T> static fa_status tma_typed(fa_context *ctx, const attn_params *p, const wt_maps &m) {
  if (p->D == 64 && p->tile_k == 128) return launch_extras<T, 64, 128>(ctx, p, m);
  if (p->D == 64) return launch_extras<T, 64, 64>(ctx, p, m);
  if (p->D == 256 && p->tile_k == 80) return launch_extras<T, 256, 80>(ctx, p, m);
  if (p->D == 256) return launch_extras<T, 256, 64>(ctx, p, m);
  if (p->tile_k == 176) return launch_extras<T, 128, 176>(ctx, p, m);
  return launch_extras<T, 128, 128>(ctx, p, m);
}

/* The call's tensor maps: encoded by tma_takes and tma_queue and read by
 * run_flash, which launch_fast_passes calls on the same thread before it
 * returns. */
static thread_local wt_maps call_maps;

static fa_status run_flash(fa_context *ctx, const attn_params *p, int pass) {
  (void)pass; /* PASS_FLASH, the one pass queued */
  if (p->compute == FA_F16) return tma_typed<__half>(ctx, p, call_maps);
  return tma_typed<__nv_bfloat16>(ctx, p, call_maps);
}

/* ---- its registry entry ---- */

/* f16/bf16 at D = Dv = 64, 128 or 256 on Hopper */
static int tma_fit(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc, char *why, size_t n) {
  if (!attn_fit_16bit(dt, D, Dv, D == 64 || D == 128 || D == 256, "64, 128 or 256", why, n)) return 0;
  if (!fa_cuda_wgmma_usable()) {
    snprintf(why, n, "it needs a Hopper GPU (sm_90) and sm_90a code in this build");
    return 0;
  }
  *br = WT_BR, *bc = D == 64 ? 128 : wgmma_key_tile(D);
  return 1;
}

/* key tiles of 128 (its default at D = 64 and 128), 176 at D = 128, 64 at D = 64 and 64 or 80 at D = 256 */
static bool tma_tile_ok(int64_t D, int64_t br, int64_t bc) {
  return br == WT_BR && ((D == 64 && (bc == 64 || bc == 128)) || (D == 128 && (bc == 128 || bc == 176)) ||
                         (D == 256 && (bc == 64 || bc == 80)));
}

/* The keys a query tile of the call takes, on average over its rows: all of them, fewer under a
 * causal mask (bottom-right: the Lk - Lq before the diagonal and half the rest; top-left: row i
 * takes min(i + 1, Lk)), at most a window's width plus the tile's rows where both sides are bounded. */
static double tma_tile_keys(const fa_attn_problem *p) {
  const double Lq = (double)p->Lq, Lk = (double)p->Lk, n = Lq < Lk ? Lq : Lk;
  double keys = Lk;
  if (p->causal == FA_CAUSAL_BOTTOM_RIGHT) keys = Lk - n / 2;
  else if (p->causal == FA_CAUSAL_TOP_LEFT) keys = Lq > 0 ? (n * (n + 1) / 2 + (Lq - n) * Lk) / Lq : 0;
  const int64_t right = p->win_right >= 0 ? p->win_right : p->causal != FA_CAUSAL_NONE ? 0 : -1;
  if (p->has_window && p->win_left >= 0 && right >= 0 && (double)(p->win_left + right + WT_BR) < keys)
    keys = (double)(p->win_left + right + WT_BR);
  return keys;
}

/* The key tile a call runs with.  automatic: at D = 128 the default key tile of 128 becomes 176 where
 * a query tile takes 8192 keys or more on average (tma_tile_keys), without masks (the masks' instance
 * spills).  Since the O tile (session 36) and the key loops without f64 work (session 37), 128 is the
 * faster below that: at L = 2048 1.01-1.04x not causal and 1.10-1.12x causal, at 4096 1.01-1.02x and
 * 1.04-1.05x, causal 8192 (4096 keys a tile) 1.00-1.02x; 176 above it: 8192 not causal 1.01-1.08x,
 * 16384 1.10-1.16x not causal and 1.01-1.05x causal (H200, bf16 and f16, three runs, one build:
 * docs/perf/2026-11-30-key-tile-h200.json).  A window narrower than that spans few key tiles, of
 * which 176 wide take more keys than it needs (a 128-wide window at L = 4096: 17.8k cycles a query
 * tile against 11.7k for two full tiles of 128; the trace build).
 * At D = 256 the default 64 becomes 80 (FlashAttention-3's tile there: S = Q·Kᵀ's products 80 wide, each
 * tile's fixed costs spread over more keys; 224 KB of tiles) where a query tile takes 1024 keys or more,
 * without masks: against 64 in one process, both orders, two processes (H200, bf16,
 * docs/perf/2026-12-01-d256-key-tile-80-h200.json): 1.02-1.06x from 1024 keys not causal and 2048
 * causal, 1.04-1.08x at 16384; at 1024 causal (576 keys a tile) 0.98-1.00x; softcap 0.97-1.04x, alibi
 * 0.97-1.19x; a bool or float mask 0.82-0.95x (its instance spills 52 bytes where 16). */
static int64_t tma_key_tile(const fa_attn_problem *p, bool automatic) {
  if (!automatic || attn_extras_kind(p) == EXTRAS_MASK) return p->tile_k;
  if (p->D == 128 && p->tile_k == 128 && tma_tile_keys(p) >= 8192) return 176;
  if (p->D == 256 && p->tile_k == 64 && tma_tile_keys(p) >= 1024) return 80;
  return p->tile_k;
}

/* "flash" only, rows on 16 bytes, and operands the copy engine can map
 * (e.g. not a stride of 0) with the tile it will run: the maps tma_queue
 * then finds made (wt_encode_maps keeps the last) */
static bool tma_takes(const fa_attn_problem *p, fa_attention_algo algo, bool automatic) {
  if (algo != FA_ATTN_FLASH || !attn_rows_aligned16(p)) return false;
  fa_attn_problem call = *p;
  call.tile_k = tma_key_tile(p, automatic);
  return wt_encode_maps(&call, &call_maps);
}

static fa_status tma_queue(fa_context *ctx, const attn_params *p, fa_attention_algo, bool automatic, int **v_flag) {
  attn_params call = *p;
  call.tile_k = tma_key_tile(p, automatic);
  if (!wt_encode_maps(&call, &call_maps)) /* tma_takes made them */
    return fa_fail(ctx, FA_ERR_BACKEND, "flashattn: attention on cuda: the driver refused the operands' tensor maps");
  return launch_fast_passes(ctx, &call, FA_ATTN_FLASH, v_flag, run_flash, V_CHECK_OUTPUT);
}

/* What it leaves to the wgmma kernel (two blocks an SM of 64 keys): dense
 * rows at D = 64 with key tiles of 64, where its blocks have no producer
 * (attention_wgmma_tma.cuh: WT_FED) and ran at 0.92-1.0 x the wgmma kernel;
 * on strided rows (a transposed or packed view) at 0.98-1.08 x (median
 * 1.05) the wgmma kernel's strided copies (H200, 2026-11-29,
 * docs/perf/2026-11-29-tma-d64-fed-h200.json).  Bool masks on short causal
 * rows went to the wgmma kernel too until their bits and persistent form:
 * now it runs them 1.16-1.18 x as fast as that kernel at L = 1024 and 2048
 * (H200, 2026-12-03, docs/perf/2026-12-03-mask-persistent-h200.json).  Its
 * default at D = 64, tiles of 128 with a producer, it keeps otherwise. */
static bool tma_declines(const fa_attn_problem *p, bool rows_dense) {
  return p->D == 64 && rows_dense && p->tile_k == 64;
}

const attn_entry attn_entry_wgmma_tma = {FA_KERNEL_WGMMA_TMA, ATTN_ALGO(FA_ATTN_FLASH), false, tma_fit, tma_tile_ok,
                                        tma_takes,           tma_queue,                true,  tma_declines, ATTN_MASK_BITS_RANGES};
