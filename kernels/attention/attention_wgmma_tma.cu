/* "flash" on Hopper, warp-specialised (the "wgmma_tma" kernel): the
 * wgmma kernel's products and online softmax (attention_wgmma.cuh), fed by
 * the tensor memory accelerator.
 *
 * A block of three warpgroups owns 128 query rows of one (batch, head):
 * warpgroups 0 and 1 (the consumers) compute rows 0-63 and 64-127 as the
 * wgmma kernel does; warpgroup 2 (the producer) gives up its registers
 * (setmaxnreg) and one of its threads brings Q and every key and value
 * tile into shared memory with TMA copies, described by tensor maps over
 * the operands' strides (API §6: any batch, head and sequence strides,
 * rows on 16 bytes), in the 128-byte swizzle that wgmma reads.  The tiles
 * go through rings of KST key and VST value buffers: a copy completes on
 * the buffer's "full" mbarrier, and each consumer warp arrives on its
 * "empty" mbarrier once its products have read it; so the consumers never
 * meet at a block barrier, and no consumer thread spends an instruction on
 * an address or a copy.  Rows past the operand's end come in as zeros
 * (the map's bounds); keys past the tile's range but inside the operand
 * are masked by the score rule as in the wgmma kernel.
 *
 * Order a tile: the producer loads K(t+1) before V(t), the order the
 * consumers need them in (S(t+1) = Q·K(t+1)ᵀ is issued with O += P(t)·V(t)
 * behind it, the wgmma kernel's intra-warpgroup overlap).
 *
 * Tiles {128, BC}: key tiles of 128 or 176 at D = 128 (the automatic
 * choice takes 176 from 2048 keys on: attention_mma.cu), of 64 at D = 256,
 * where the consumers take turns at the tensor cores (PINGPONG).  Measured
 * steps and what was tried: docs/perf/README.md. */
#include "attention_wgmma.cuh"
#include "tma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#define WT_BR 128
#define WT_THREADS 384 /* two consumer warpgroups, then the producer */
#define WT_KST 2
#define WT_VST 2

/* The tensor maps of q, k and v (kernel parameters: __grid_constant__). */
struct wt_maps {
  CUtensorMap q, k, v;
};

static __host__ __device__ constexpr size_t wt_smem_bytes(int D, int BC) {
  return (size_t)(WT_BR + (WT_KST + WT_VST) * BC) * D * 2 + 8 * (1 + 2 * WT_KST + 2 * WT_VST) + 1024; /* + alignment */
}

/* The consumers' turns at the tensor cores (PINGPONG): warpgroup c waits
 * at named barrier WT_TURN + c before it issues a tile's products and lets
 * the other go once its S is in, so that the two issue in turn and one's
 * softmax runs while the other's products do. */
enum { WT_TURN = 3 }; /* barriers 1 and 2: frag_store_staged's */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
static __device__ __forceinline__ void wt_turn_wait(int c) {
  asm volatile("bar.sync %0, 256;" ::"r"(WT_TURN + c) : "memory");
}
/* when `go`: predicated rather than branched around, so that no branch
 * sits in the key loop's issue sequence */
static __device__ __forceinline__ void wt_turn_pass(int c, bool go = true) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p bar.arrive %0, 256;\n}" ::"r"(WT_TURN + (c ^ 1)), "r"((int)go)
               : "memory");
}
#endif

template <typename T, int D, int BC, int EXTRAS, bool PINGPONG>
__global__ void __launch_bounds__(WT_THREADS, 1) attn_wgmma_tma_kernel(const fa_attn_problem p, const __grid_constant__ wt_maps tm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int QB = WT_BR * D * 2, KB = BC * D * 2; /* bytes of the Q tile, of a K or V tile */
  const int v_bad = *p.v_nonfinite; /* see leave_for_fallback */
  extern __shared__ __align__(128) char wt_smem_raw[];
  /* the swizzle is computed on address bits: tiles must be 1024-byte aligned */
  char *Qs = wt_smem_raw + ((1024 - (smem_addr(wt_smem_raw) & 1023)) & 1023);
  char *Ks = Qs + QB, *Vs = Ks + WT_KST * KB;
  const uint32_t bar_q = smem_addr(Vs + WT_VST * KB), full_k = bar_q + 8, empty_k = full_k + 8 * WT_KST;
  const uint32_t full_v = empty_k + 8 * WT_KST, empty_v = full_v + 8 * WT_VST;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const frag_qtile<T, D, WT_BR> qt(p, blockIdx.x);
  const int64_t bh = qt.bh, b = qt.b, h = qt.h, i0 = qt.i0;
  if (tid == 0) {
    mbar_init(bar_q, 1);
    for (int s = 0; s < WT_KST; s++) mbar_init(full_k + 8 * s, 1), mbar_init(empty_k + 8 * s, 8); /* 8 consumer warps */
    for (int s = 0; s < WT_VST; s++) mbar_init(full_v + 8 * s, 1), mbar_init(empty_v + 8 * s, 8);
    mbar_init_fence();
  }
  int64_t t_lo, t_hi, all_lo, all_hi;
  tile_key_range<WT_BR>(p, b, i0, &t_lo, &t_hi, &all_lo, &all_hi); /* its barrier also publishes the mbarriers */
  const int ntiles = (int)((t_hi - t_lo + BC - 1) / BC);
  if (leave_for_fallback(v_bad)) return;

  if (wg == 2) { /* the producer */
    warpgroup_regs_dec<24>();
    if (tid == 2 * 128) {
      const int hk = (int)(h / (p.Hq / p.Hkv)), bi = (int)b;
      mbar_expect(bar_q, QB);
#pragma unroll
      for (int c = 0; c < D / 64; c++) tma_load_4d(smem_addr(Qs) + c * WT_BR * 128, &tm.q, c * 64, (int)i0, (int)h, bi, bar_q);
      /* tile t of a ring of n buffers: wait for its buffer (the phase before
       * the first passes at once), then its columns in 64-wide blocks */
      auto load = [&](const CUtensorMap *m, char *ring, uint32_t full, uint32_t empty, int n, int t) {
        const int s = t % n;
        mbar_wait(empty + 8 * s, ((t / n) & 1) ^ 1);
        mbar_expect(full + 8 * s, KB);
#pragma unroll
        for (int c = 0; c < D / 64; c++)
          tma_load_4d(smem_addr(ring + s * KB) + c * BC * 128, m, c * 64, (int)(t_lo + (int64_t)t * BC), hk, bi, full + 8 * s);
      };
      if (ntiles > 0) load(&tm.k, Ks, full_k, empty_k, WT_KST, 0);
      for (int t = 0; t < ntiles; t++) {
        if (t + 1 < ntiles) load(&tm.k, Ks, full_k, empty_k, WT_KST, t + 1);
        load(&tm.v, Vs, full_v, empty_v, WT_VST, t);
      }
    }
    return;
  }
  warpgroup_regs_inc<240>();

  const int g = lane >> 2, c2 = (lane & 3) * 2;
  const int rA = warp * 16 + g, rB = rA + 8;
  frag_rows r = frag_rows_start(p, b, i0, rA, rB);
  const bool scale_pos = p.scale > 0;
  float o[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  const uint32_t q_base = smem_addr(Qs) + wg * 64 * 128; /* this warpgroup's 64 rows */
  float s[BC / 8][4];
  uint32_t pa[BC / 16][4]; /* P of the previous tile, as A fragments */
  mbar_wait(bar_q, 0);
  if (PINGPONG && wg == 1 && ntiles > 0) wt_turn_pass(1); /* warpgroup 0 goes first */

  for (int t = 0; t < ntiles; t++) {
    const int64_t j0 = t_lo + (int64_t)t * BC;
    const int kb = t % WT_KST;
    mbar_wait(full_k + 8 * kb, (t / WT_KST) & 1);
    if (PINGPONG) wt_turn_wait(wg);
    qk_issue<T, D, WT_BR, BC>(s, q_base, smem_addr(Ks + kb * KB));
    if (t > 0) {
      const int vb = (t - 1) % WT_VST;
      mbar_wait(full_v + 8 * vb, ((t - 1) / WT_VST) & 1);
      pv_issue<T, D, BC>(o, pa, smem_addr(Vs + vb * KB));
    }
    if (t > 0) wgmma_wait<1>();
    else wgmma_wait<0>();
    /* the turn passes once S is in (a barrier between the products' issue
     * and this wait made ptxas serialise them); every turn warpgroup 0
     * takes is passed back, but for its last */
    if (PINGPONG) wt_turn_pass(wg, wg == 0 || t + 1 < ntiles);
    wgmma_hold<BC / 2>(&s[0][0]);
    if (lane == 0) mbar_arrive(empty_k + 8 * kb); /* this warp's reads of K(t) are done */

    const bool full = scale_pos && j0 >= all_lo && j0 + BC <= all_hi;
    float alphaA = 1.f, alphaB = 1.f;
    frag_softmax_tile<BC / 8, EXTRAS>(p, b, h, j0, c2, full, r, s, &alphaA, &alphaB);

    wgmma_wait<0>();
    wgmma_hold<D / 2>(&o[0][0]);
    if (t > 0 && lane == 0) mbar_arrive(empty_v + 8 * ((t - 1) % WT_VST));
    frag_rescale<D / 8>(o, alphaA, alphaB);
    p_pack<T, BC>(pa, s);
  }
  if (ntiles > 0) { /* the last tile's P·V */
    const int vb = (ntiles - 1) % WT_VST;
    mbar_wait(full_v + 8 * vb, ((ntiles - 1) / WT_VST) & 1);
    pv_issue<T, D, BC>(o, pa, smem_addr(Vs + vb * KB));
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&o[0][0]);
  }
  /* O leaves through this warpgroup's rows of Q's tile (its products are done) */
  frag_store_staged<T, D, false, true, WT_BR, 128>(p, bh, qt.out(p), qt.lse(p), i0, lane, r, o, Qs);
#endif
}

/* cuTensorMapEncodeTiled, from the driver through the runtime (no link
 * against libcuda); NULL when the driver has none.  Racing threads store
 * the same pointer. */
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
  static PFN_cuTensorMapEncodeTiled_v12000 volatile fn;
  static volatile int asked;
  if (!asked) {
    void *f = NULL;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) == cudaSuccess &&
        found == cudaDriverEntryPointSuccess)
      fn = (PFN_cuTensorMapEncodeTiled_v12000)f;
    else
      (void)cudaGetLastError();
    asked = 1;
  }
  return fn;
}

/* The map of an operand at base (strides st, L rows of D elements a head,
 * H heads, B batches) read in boxes of 64 columns by `rows` rows, swizzled
 * for wgmma; rows past L come in as zeros.  0 when the driver refuses it
 * (a stride the copy engine cannot take, e.g. 0 for a broadcast). */
static int encode_operand(CUtensorMap *m, fa_dtype dt, const void *base, const fa_attn_strides &st, int64_t L,
                          int64_t H, int64_t B, int D, int rows) {
  PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (!encode) return 0;
  const cuuint64_t dim[4] = {(cuuint64_t)D, (cuuint64_t)(L > 0 ? L : 1), (cuuint64_t)H, (cuuint64_t)B};
  const cuuint64_t stride[3] = {(cuuint64_t)st.s * 2, (cuuint64_t)st.h * 2, (cuuint64_t)st.b * 2};
  const cuuint32_t box[4] = {64, (cuuint32_t)rows, 1, 1}, step[4] = {1, 1, 1, 1};
  return encode(m, dt == FA_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4,
                (void *)base, dim, stride, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

static int encode_maps(const fa_attn_problem *p, wt_maps *m) {
  const int D = (int)p->D, BC = (int)p->tile_k;
  return encode_operand(&m->q, p->compute, p->q, p->q_st, p->Lq, p->Hq, p->B, D, WT_BR) &&
         encode_operand(&m->k, p->compute, p->k, p->k_st, p->Lk, p->Hkv, p->B, D, BC) &&
         encode_operand(&m->v, p->compute, p->v, p->v_st, p->Lk, p->Hkv, p->B, D, BC);
}

template <typename T, int D, int BC, int EXTRAS>
static fa_status launch(fa_context *ctx, const fa_attn_problem *p, const wt_maps &m) {
  const size_t smem = wt_smem_bytes(D, BC);
  /* turns at D = 256 (+5-12 %); at D = 128 they cost up to a tenth at
   * L = 16k (H200, 2026-11-27, docs/perf/2026-11-27-attention-h200-tma.json) */
  void (*kernel)(const fa_attn_problem, const wt_maps) = attn_wgmma_tma_kernel<T, D, BC, EXTRAS, D == 256>;
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int64_t blocks = p->B * p->Hq * ((p->Lq + WT_BR - 1) / WT_BR);
  if (fa_status st = attn_grid_fits(ctx, blocks)) return st;
  kernel<<<(unsigned)blocks, WT_THREADS, smem, fa_cuda_stream(ctx)>>>(*p, m);
  FA_CUDA_CHECK_LAUNCH(ctx, "attn_wgmma_tma_kernel");
  return FA_OK;
}

template <typename T, int D, int BC> static fa_status launch_extras(fa_context *ctx, const fa_attn_problem *p, const wt_maps &m) {
  const int x = attn_extras_kind(p);
  if (x == EXTRAS_MASK) return launch<T, D, BC, EXTRAS_MASK>(ctx, p, m);
  if (x == EXTRAS_SCORE) return launch<T, D, BC, EXTRAS_SCORE>(ctx, p, m);
  return launch<T, D, BC, EXTRAS_NONE>(ctx, p, m);
}

template <typename T> static fa_status tma_typed(fa_context *ctx, const fa_attn_problem *p, const wt_maps &m) {
  if (p->D == 256) return launch_extras<T, 256, 64>(ctx, p, m);
  if (p->tile_k == 176) return launch_extras<T, 128, 176>(ctx, p, m);
  return launch_extras<T, 128, 128>(ctx, p, m);
}

/* The call's tensor maps: encoded once by fa_cuda_attention_wgmma_tma_flash
 * and read by run_flash, which launch_fast_passes calls on the same thread
 * before it returns. */
static thread_local wt_maps call_maps;

static fa_status run_flash(fa_context *ctx, const fa_attn_problem *p, int pass) {
  (void)pass; /* PASS_FLASH, the one pass queued */
  if (p->compute == FA_F16) return tma_typed<__half>(ctx, p, call_maps);
  return tma_typed<__nv_bfloat16>(ctx, p, call_maps);
}

/* Queues "flash" on this kernel, guarded against NaN/inf in V
 * (launch_fast_passes: *v_flag, *st), when it takes the call: f16/bf16,
 * D = Dv = 128 or 256, one of its tiles, rows on 16 bytes, and operands
 * the copy engine can map; else returns 0 and queues nothing.  The caller
 * has checked that the Hopper kernels run here (fa_cuda_wgmma_usable). */
extern "C" int fa_cuda_attention_wgmma_tma_flash(fa_context *ctx, const fa_attn_problem *p, int **v_flag,
                                                 fa_status *st) {
  if ((p->compute != FA_F16 && p->compute != FA_BF16) || p->D != p->Dv ||
      !fa_cuda_attention_kernel_tile_ok(FA_KERNEL_WGMMA_TMA, p->D, p->tile_q, p->tile_k) || !attn_rows_aligned16(p) ||
      !encode_maps(p, &call_maps))
    return 0;
  *st = launch_fast_passes(ctx, p, FA_ATTN_FLASH, v_flag, run_flash);
  return 1;
}
