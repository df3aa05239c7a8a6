/* Attention on the GPU: the SIMT tiled kernel's launchers
 * (attention_tiled.cuh) behind "flash" and "two_pass", and the seeds'
 * one-row recurrence behind "flash_row".  "flash" runs on the SIMT kernel
 * for the calls that the faster kernels (attention_wgmma.cu,
 * attention_mma.cu, attention_f32.cu) do not take, and behind them when V
 * holds NaN or inf. */
#include "attention_tiled.cuh"

extern "C" fa_status fa_cuda_attention_mma(fa_context *ctx, const fa_attn_problem *p, fa_attention_algo algo,
                                           fa_attn_kernel kernel, int **v_flag);
extern "C" fa_status fa_cuda_attention_f32(fa_context *ctx, const fa_attn_problem *p, fa_attention_algo algo,
                                           int **v_flag);

/* "flash_row": the seeds' one-pass recurrence, one thread per query row,
 * keys and values read straight from device memory, no tiling. */
template <typename T> __global__ void attn_row_kernel(fa_attn_problem p) {
  const int64_t row = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= p.B * p.Hq * p.Lq) return;
  const int64_t i = row % p.Lq, bh = row / p.Lq, b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
  const int D = (int)p.D, Dv = (int)p.Dv;
  const T *q = (const T *)p.q + attn_at(p.q_st, b, h, i);
  const T *k = (const T *)p.k + attn_at(p.k_st, b, hk, 0);
  const T *v = (const T *)p.v + attn_at(p.v_st, b, hk, 0);
  const int64_t ks = p.k_st.s, vs = p.v_st.s;
  float o[256];
  for (int c = 0; c < Dv; c++) o[c] = 0.f;
  float m = -INFINITY, d = 0.f;
  int64_t lo, hi;
  fa_attn_range_of(&p, b, i, &lo, &hi);
  for (int64_t j = lo; j < hi; j++) {
    float dot = 0.f;
    for (int c = 0; c < D; c++) dot = fmaf(to_float(q[c]), to_float(k[j * ks + c]), dot);
    float s = attn_score(p, b, h, i, j, dot, lo, hi);
    if (s == -INFINITY) continue;
    /* a NaN score is dropped by fmaxf but reaches d and o through e */
    float m_new = fmaxf(m, s), alpha = m == -INFINITY ? 0.f : expf(m - m_new), e = expf(s - m_new);
    d = d * alpha + e;
    for (int c = 0; c < Dv; c++) o[c] = o[c] * alpha + e * to_float(v[j * vs + c]);
    m = m_new;
  }
  float inv = row_inv(d);
  T *orow = (T *)p.o + attn_at(p.o_st, b, h, i);
  for (int c = 0; c < Dv; c++) orow[c] = from_float<T>(o[c] * inv);
  if (p.lse) attn_lse_at(p, b, h, i) = row_lse(m, d);
}

/* ---- launchers ---- */


/* A user's tile: any the SIMT kernel holds in shared memory, and the
 * default tile of the call (a tensor-core tile, which may be larger). */
extern "C" fa_status fa_cuda_attention_check_tile(fa_context *ctx, fa_dtype dt, int64_t D, int64_t Dv, int64_t br,
                                                  int64_t bc) {
  int smem_max = 0;
  int64_t def_br = 0, def_bc = 0;
  fa_cuda_attention_default_tile(dt, D, Dv, &def_br, &def_bc);
  if (br == def_br && bc == def_bc) return FA_OK;
  /* a tile of a tensor-core kernel that takes the call (the SIMT fallback fits it to itself),
   * e.g. wgmma_tma's {128, 176} */
  char why[8];
  int64_t kbr = 0, kbc = 0;
  for (fa_attn_kernel k : {FA_KERNEL_WGMMA_TMA, FA_KERNEL_WGMMA, FA_KERNEL_MMA})
    if (fa_cuda_attention_kernel_fit(k, dt, D, Dv, &kbr, &kbc, why, sizeof why) &&
        fa_cuda_attention_kernel_tile_ok(k, D, br, bc))
      return FA_OK;
  fa_status st = tiled_smem_max(ctx, &smem_max);
  if (st) return st;
  int ok_br = br >= 1 && br <= 128;
  if (Dv > 32 * MAX_DV_PER_LANE)
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: attention on cuda: value head dimension Dv = %lld is above %d",
                   (long long)Dv, 32 * MAX_DV_PER_LANE);
  if (!ok_br || bc < 1 || bc > 256 || tiled_smem(block_rows((int)br), (int)bc, D, Dv) > (size_t)smem_max) {
    int64_t bc_max = 0;
    while (bc_max < 256 && tiled_smem(block_rows(ok_br ? (int)br : 1), (int)bc_max + 1, D, Dv) <= (size_t)smem_max)
      bc_max++;
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: opts.tile: on cuda with D = %lld, Dv = %lld the valid tiles are 1 <= Br <= 128 and "
                   "1 <= Bc <= %lld (shared memory: %d bytes), and the default {%lld, %lld}; got {%lld, %lld}",
                   (long long)D, (long long)Dv, (long long)bc_max, smem_max, (long long)def_br, (long long)def_bc,
                   (long long)br, (long long)bc);
  }
  return FA_OK;
}

template <typename T, int BR, int MODE>
static fa_status launch_tiled(fa_context *ctx, const fa_attn_problem *p) {
  int bc = (int)p->tile_k;
  size_t smem = tiled_smem(BR, bc, p->D, p->Dv);
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(attn_tiled_kernel<T, BR, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)smem));
  int br = (int)p->tile_q;
  int64_t blocks = p->B * p->Hq * ((p->Lq + br - 1) / br), grid = 0;
  if (fa_status st = tiled_grid(ctx, blocks, p->v_nonfinite != NULL, &grid)) return st;
  if (fa_status st = attn_grid_fits(ctx, grid)) return st;
  if (grid == 0) return FA_OK;
  attn_tiled_kernel<T, BR, MODE><<<(unsigned)grid, NWARPS * 32, smem, fa_cuda_stream(ctx)>>>(*p, br, bc, blocks);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_tiled_kernel");
  return FA_OK;
}

template <typename T, int MODE> static fa_status tiled_by_br(fa_context *ctx, const fa_attn_problem *p) {
  switch (block_rows((int)p->tile_q)) {
  case 8: return launch_tiled<T, 8, MODE>(ctx, p);
  case 16: return launch_tiled<T, 16, MODE>(ctx, p);
  case 32: return launch_tiled<T, 32, MODE>(ctx, p);
  case 64: return launch_tiled<T, 64, MODE>(ctx, p);
  default: return launch_tiled<T, 128, MODE>(ctx, p);
  }
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

/* "flash" or "two_pass" (p->row_stats set): the tensor-core kernels
 * (f16/bf16) or the register-tiled f32 kernel when the call fits, then this
 * file's kernel, which takes every call: alone when they did not fit, else
 * guarded by their flag (it runs only when V holds NaN or inf, for
 * two_pass only the output pass, on the statistics they wrote). */
template <typename T>
static fa_status tiled_typed(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel, const fa_attn_problem *in) {
  fa_attn_problem sched = *in;
  fa_status st = schedule_heads(ctx, in, &sched.sched_heads);
  if (st) return st;
  const fa_attn_problem *p = &sched;
  int *v_flag = NULL;
  /* the fast kernels: the one named, or (auto) the f32 kernel for f32,
   * else the tensor cores; a named "simt" runs alone */
  if (kernel == FA_KERNEL_F32 || (kernel == FA_KERNEL_AUTO && p->compute == FA_F32))
    st = fa_cuda_attention_f32(ctx, p, algo, &v_flag);
  else if (kernel != FA_KERNEL_SIMT)
    st = fa_cuda_attention_mma(ctx, p, algo, kernel, &v_flag);
  if (st) return st;
  if (!v_flag && kernel != FA_KERNEL_AUTO && kernel != FA_KERNEL_SIMT) /* checked before: operands off 16 bytes? */
    return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: opts.kernel: the kernel named declined the call on cuda");
  /* this file's kernel alone or behind them, with the call's tile where it
   * holds it, else a smaller one (the default tile is a tensor-core tile,
   * and a call they do not take, e.g. rows off 16 bytes, gets it too) */
  fa_attn_problem fallback = *p;
  fallback.v_nonfinite = v_flag;
  if ((st = simt_fit_tile(ctx, &fallback))) {
    fa_cuda_free(v_flag, sizeof(int));
    return st;
  }
  if (!v_flag && algo == FA_ATTN_TWO_PASS) {
    st = tiled_by_br<T, MODE_STATS>(ctx, &fallback);
    return st ? st : tiled_by_br<T, MODE_OUTPUT>(ctx, &fallback);
  }
  if (!v_flag) return tiled_by_br<T, MODE_FLASH>(ctx, &fallback);
  st = algo == FA_ATTN_TWO_PASS ? tiled_by_br<T, MODE_OUTPUT>(ctx, &fallback) : tiled_by_br<T, MODE_FLASH>(ctx, &fallback);
  fa_cuda_free(v_flag, sizeof(int)); /* stream-ordered: after the kernels */
  return st;
}

template <typename T>
static fa_status attention_typed(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel, const fa_attn_problem *p) {
  if (algo == FA_ATTN_FLASH_ROW) {
    int64_t rows = p->B * p->Hq * p->Lq, blocks = (rows + 127) / 128;
    attn_row_kernel<T><<<(unsigned)blocks, 128, 0, fa_cuda_stream(ctx)>>>(*p);
    FA_CUDA_CHECK_LAUNCH(ctx, "attn_row_kernel");
    return FA_OK;
  }
  if (algo != FA_ATTN_TWO_PASS) return tiled_typed<T>(ctx, algo, kernel, p);
  size_t bytes = sizeof(float) * 2 * (size_t)(p->B * p->Hq * p->Lq);
  void *stats = NULL;
  fa_status st = fa_cuda_malloc(ctx, &stats, bytes);
  if (st) return st;
  fa_attn_problem g = *p;
  g.row_stats = (float *)stats;
  st = tiled_typed<T>(ctx, algo, kernel, &g);
  fa_cuda_free(stats, bytes); /* stream-ordered: after both passes */
  return st;
}

extern "C" fa_status fa_cuda_attention_fused(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel,
                                             const fa_attn_problem *p) {
  switch (p->compute) {
  case FA_F32: return attention_typed<float>(ctx, algo, kernel, p);
  case FA_F16: return attention_typed<__half>(ctx, algo, kernel, p);
  case FA_BF16: return attention_typed<__nv_bfloat16>(ctx, algo, kernel, p);
  default:
    return fa_fail(ctx, FA_ERR_DTYPE, "flashattn: attention on cuda takes f32, f16 or bf16, got %s",
                   fa_dtype_name(p->compute));
  }
}
