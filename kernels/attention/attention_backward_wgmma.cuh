/* The backward pass on Hopper tensor cores (sm_90a) for f16 and bf16 at
 * D = Dv = 64, 96 (held as 128 wide) and 128: the schedule of attention_backward_mma.cu with
 * warpgroup MMA (wgmma), whose operands come straight from shared memory
 * (the layout of the forward's attention_wgmma.cu: 128-byte rows,
 * XOR-swizzled, one 64-column block after the other), so that a tile
 * staged once serves a warpgroup's 64 rows without ldmatrix traffic.
 *
 * dK/dV: a block of one warpgroup owns 64 keys of one (batch, KV head).
 * Per query tile of 64 rows (128 in the fused instances at D = 64:
 * bwg_rows_tile): Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (both operands in shared
 * memory; K in registers in that instance's TMA form: KREG), the
 * probabilities on the accumulators
 * (attention_backward_common.cuh), then dV += Pᵀ·dO and dK += dSᵀ·Q with
 * Pᵀ and dSᵀ repacked in registers as the A operands and dO, Q read
 * transposed from shared memory.  dQ: a block of one warpgroup owns 64
 * query rows; per key tile of 64, S = Q·Kᵀ, dP = dO·Vᵀ (Q and dO in
 * registers: bwg_dq_rows_in_registers), dQ += dS·K.  The
 * next tile's copies fly while one is computed (two stages).  The fused
 * dQ instance of the default takes Q and dO by TMA (one thread issuing the
 * copies, an mbarrier a stage) wherever the copy engine takes their strides,
 * and stores dK and dV through shared memory in whole rows: 1.02-1.07x at
 * D = 128 and 1.09-1.11x at D = 96 against cp.async from every thread
 * (bf16, H200, docs/perf/2026-11-30-backward-tma-h200.json).
 *
 * Unless the call asks for determinism, dQ is not a second kernel: a dK/dV
 * block of two warpgroups (128 keys, 64 each) also computes its share
 * dS·K of each query tile (dSᵀ of both staged in shared memory as the
 * transposed A operand, K read transposed as B; each warpgroup half of
 * D, or at D = 64 half of the 128 rows) and adds it into an f32 copy of
 * dQ with vector atomics; a last launch converts that copy.  This takes
 * two of the seven products (S and dP recomputed by the dQ kernel) out of
 * the work.  The atomics' traffic
 * (Lq·D·4 bytes a head per key block) is what bounds it (bf16, D = 128,
 * L = 16k, H200): with blocks of 64 keys and 8-byte adds in dQ's own
 * layout the adds took the call from 11.5 to 21.3 ms; blocks of 128 keys,
 * their query walks staggered (no two blocks of a head on the same rows)
 * and dq_acc laid out so that a warp's 16-byte adds cover 512 contiguous
 * bytes: 14.4 ms (11.9 without the adds; the two kernels 16.7).  TMA bulk
 * reductions from shared memory instead of the atomics: 5 % slower.  The
 * order of the atomic adds varies from run to run, so the rounding of dQ
 * does too.
 *
 * With opts.deterministic the blocks add as without it,
 * but in fixed point (the FIXED instances: bwg_add_dq, multipliers by
 * bw_fixed_mult): int32 sums, the same in any order.  The
 * Lua variants' calls take the walk instead (bwg_walk, the kernel's WALK instances):
 * C blocks a (batch, KV head), block c taking key tiles c, 2C - 1 - c,
 * 2C + c, ... in turn and adding into its own copy c of dq_acc, which the
 * conversion sums in the order of c; each element of a copy is added to by
 * one thread alone, in its program order.  C is chosen to fill the GPU
 * (bwg_copies).  Where the copies that the blocks at work add into pass a
 * few L2s (long calls; BWG_COPIES_L2 in attention_backward_wgmma.cu),
 * determinism takes the two kernels (seven products instead of five).
 *
 * The kernels are templates on the problem type PROB, so that the Lua
 * variants' run-time compiled units (attention_variant.cuh) instantiate
 * them with EXTRAS_VARIANT: then the probabilities come from
 * bwm_variant_probs, the dK/dV blocks walk only the query tiles, and the
 * dQ blocks only the key tiles, where mask_mod's 64 x 64 tiles are not
 * empty; the host side is attention_backward_wgmma.cu. */
#ifndef FA_KERNELS_ATTENTION_BACKWARD_WGMMA_CUH
#define FA_KERNELS_ATTENTION_BACKWARD_WGMMA_CUH

#include "attention_backward_common.cuh"
#include "tma.cuh"
#include "trace.cuh"
#include "wgmma_ops.cuh"

/* The tensor maps of q and dout (boxes of 64 columns by the tile's rows,
 * bwg_rows_tile) and of k and v (by the block's keys) for the dK/dV
 * kernel's TMA instances (a kernel parameter: __grid_constant__); zeros for
 * the other instances. */
struct bwg_maps {
  CUtensorMap q, dout, k, v;
};

/* One warpgroup a block, two blocks an SM, 64 keys (dK/dV) or query rows
 * (dQ) a block; tiles of 64 query rows (dK/dV) or keys (dQ).  Two
 * warpgroups a block (128 keys or rows, one block an SM) ran at 0.80-0.96x
 * (bf16 on an H200, 2026-11-27): the blocks of one warpgroup do not meet
 * at barriers, so one's softmax runs while the other's products are on the
 * tensor cores. */
#define BWG_THREADS 128 /* one warpgroup */
#define BWG_OWN 64      /* keys a dK/dV block, query rows a dQ block */
#define BWG_BR 64       /* query rows a dK/dV tile */
/* The width of the tiles in shared memory: D = 96 is held as 128 (whole
 * 64-column swizzle blocks, as the forward's attention_wgmma.cu does), its
 * last 32 columns zero, never stored. */
#define BWG_PAD(D) ((D) == 96 ? 128 : (D))
#define BWG_BC 64       /* keys a dQ tile */

/* The query rows of a dK/dV tile: BWG_BR, but 128 for the fused dQ
 * instances of the built-in rules at D = 64 (FlashAttention-3's tile
 * there), whose tiles of 64 left a block's chain of products and
 * elementwise steps too short for the tensor cores: S and dP as m64n128
 * products, and each warpgroup adds dQ for 64 query rows of its own over
 * the block's 128 keys (bwg_dkdv_kernel's ROWSPLIT).  Not the Lua
 * variants' (mask_mod's tiles are 64 x 64), nor the walk's (D = 64 has
 * none). */
static constexpr __host__ __device__ int bwg_rows_tile(int DG, int EXTRAS, bool DQ, bool WALK) {
  return DG == 64 && DQ && !WALK && EXTRAS != EXTRAS_VARIANT ? 128 : BWG_BR;
}

#ifndef __CUDACC_RTC__
/* The dynamic shared memory of each kernel (+ 1024: the swizzle wants
 * 1024-byte aligned tiles); br: bwg_rows_tile's. */
static inline size_t bwg_smem_dkdv(int D, bool dq, int br) {
  const int keys = dq ? 2 * BWG_OWN : BWG_OWN; /* two warpgroups with dQ */
  return (size_t)(2 * keys + 4 * br) * D * 2 + (dq ? keys * br * 2 : 0) + 1024;
}
static inline size_t bwg_smem_dq(int D) { return (size_t)(2 * BWG_OWN + 4 * BWG_BC) * D * 2 + 1024; }
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* acc = A·Bᵀ over D (k-steps of 16): A the warpgroup's 64 rows at a_base of
 * a tile of AR rows, B the N rows of a tile at b_base; both K-major in the
 * swizzled layout (k-step ks reads 32 bytes into the 128-byte rows of
 * column block ks / 4).  Issued, not committed. */
template <typename T, int D, int N, int AR>
static __device__ __forceinline__ void bwg_abt(float *acc, uint32_t a_base, uint32_t b_base) {
  const uint64_t a = wgmma_desc(a_base, 16, 1024), b = wgmma_desc(b_base, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < D / 16; ks++)
    wgmma_ss<T, N>(acc, wgmma_desc_add(a, (ks >> 2) * AR * 128 + (ks & 3) * 32),
                   wgmma_desc_add(b, (ks >> 2) * N * 128 + (ks & 3) * 32), ks > 0);
}

/* X's accumulators (64 × 16·KS, P or dS) packed in T as wgmma's A
 * fragments, k-step kk in xa[kk]: done before the products are issued, so
 * that no register they read is written while they run. */
template <typename T, int KS>
static __device__ __forceinline__ void bwg_pack(uint32_t (*xa)[4], const float (*x)[4]) {
#pragma unroll
  for (int kk = 0; kk < KS; kk++) {
    xa[kk][0] = pack2<T>(x[2 * kk][0], x[2 * kk][1]), xa[kk][1] = pack2<T>(x[2 * kk][2], x[2 * kk][3]);
    xa[kk][2] = pack2<T>(x[2 * kk + 1][0], x[2 * kk + 1][1]), xa[kk][3] = pack2<T>(x[2 * kk + 1][2], x[2 * kk + 1][3]);
  }
}

/* acc += X·B: X packed by bwg_pack, B the 16·KS rows of a tile at b_base
 * read N-major (as the forward reads V): rows kk·16.. are 2048 bytes on,
 * column blocks 16·KS·128 bytes apart.  Issued, not committed. */
template <typename T, int D, int KS>
static __device__ __forceinline__ void bwg_xb(float *acc, const uint32_t (*xa)[4], uint32_t b_base) {
  const uint64_t b = wgmma_desc(b_base, KS * 16 * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < KS; kk++) wgmma_rs_tb<T, D>(acc, xa[kk], wgmma_desc_add(b, kk * 2048), 1);
}

/* dSᵀ (the warp's 16 keys × BR query rows, packed by bwg_pack) into ds as
 * T: per 64 query rows a block of KEYS 128-byte rows, a key a row (the
 * warp's rows from 16 · its index in the block), swizzled as the tiles
 * are, so that a block reads as the A operand of dQ = dS·K for its 64 rows
 * stored M-major (transposed). */
template <int BR, int KEYS>
static __device__ __forceinline__ void bwg_stage_ds(char *ds, const uint32_t (*da)[4]) {
  const int lane = threadIdx.x & 31, ra = (threadIdx.x >> 5) * 16 + (lane >> 2), c4 = (lane & 3) * 4;
#pragma unroll
  for (int kk = 0; kk < BR / 16; kk++)
#pragma unroll
    for (int h = 0; h < 2; h++) { /* columns 16·kk + 8·h.. */
      char *blk = ds + (kk >> 2) * KEYS * 128; /* the 64 query rows of these columns */
      const int chunk = (2 * kk + h) & 7;
      *(uint32_t *)(blk + ra * 128 + ((chunk ^ (ra & 7)) << 4) + c4) = da[kk][2 * h];
      *(uint32_t *)(blk + (ra + 8) * 128 + ((chunk ^ ((ra + 8) & 7)) << 4) + c4) = da[kk][2 * h + 1];
    }
}

/* dq = dS·K over the KEYS keys, N of K's columns from column n0 (a
 * multiple of 32): dS from bwg_stage_ds at ds_base, K the block's key tile
 * at k_base read N-major (as the forward reads V; 64-column blocks KEYS
 * rows long).  Issued, not committed; dq is overwritten. */
template <typename T, int N, int KEYS>
static __device__ __forceinline__ void bwg_ds_k(float *dq, uint32_t ds_base, uint32_t k_base, int n0) {
  const uint64_t a = wgmma_desc(ds_base, KEYS * 128, 1024),
                 b = wgmma_desc(k_base + (n0 >> 6) * KEYS * 128 + (n0 & 63) * 2, KEYS * 128, 1024);
#pragma unroll
  for (int kk = 0; kk < KEYS / 16; kk++)
    wgmma_ss_tt<T, N>(dq, wgmma_desc_add(a, kk * 2048), wgmma_desc_add(b, kk * 2048), kk > 0);
}

/* dq_acc's layout: per (batch, head) and query tile of BWG_BR = 64 rows,
 * the tile's 64 × DG sums in the order of the accumulators: chunk of 8
 * columns, then warp (16 rows), lane, and the lane's 4 values (rows g and
 * g + 8, two columns each).  A warp's share of a chunk is then 512
 * contiguous bytes, and a warpgroup's share of a tile one contiguous run;
 * rows past Lq hold zeros (their dS is zero), never read. */
static __device__ __forceinline__ int64_t bwg_acc_tile(int64_t bh, int64_t qtiles, int64_t i0, int DG) {
  return (bh * qtiles + i0 / BWG_BR) * BWG_BR * DG;
}

/* The warp's 16 rows × N columns of dq (its chunks from n0 / 8 of the tile
 * at acc, dq_acc's layout) added in with 16-byte atomics; chunks at or past
 * DG left alone.  A warpgroup's share staged in shared memory and added by
 * one bulk reduction of the copy engine (cp.reduce.async.bulk .add.f32)
 * was slower: 0.80-0.89x the call's speed, in a fixed order or not (H200,
 * docs/perf/2026-12-01-backward-order-waits-h200.json).
 *
 * FIXED: int32 sums instead, the warp's values times their rows'
 * multipliers (m0 for row g, m8 for g + 8: bw_fixed_mult, powers of two),
 * rounded and added by 4-byte reductions, value k of a lane's four at
 * k·32 + lane of its 512 bytes, so that each reduction of a warp covers
 * 128 contiguous bytes.  Integer adds give the same sum in any order:
 * determinism at the atomics' pace (an H200 adds int32 reductions so laid
 * out as fast as the float4 atomics, 3.8 TB/s within L2). */
template <int N, int DG, bool FIXED = false>
static __device__ __forceinline__ void bwg_add_dq(float *acc, int n0, const float (*dq)[4], float m0 = 1.f,
                                                  float m8 = 1.f) {
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3;
#pragma unroll
  for (int d = 0; d < N / 8; d++) {
    if (DG % N != 0 && n0 + d * 8 >= DG) break; /* D = 96's padding; else folded away */
    float *c = acc + ((n0 / 8 + d) * 4 + w) * 128;
    if constexpr (FIXED) {
      int *ci = (int *)c + lane;
      atomicAdd(ci, __float2int_rn(dq[d][0] * m0)), atomicAdd(ci + 32, __float2int_rn(dq[d][1] * m0));
      atomicAdd(ci + 64, __float2int_rn(dq[d][2] * m8)), atomicAdd(ci + 96, __float2int_rn(dq[d][3] * m8));
    } else {
      atomicAdd((float4 *)(c + lane * 4), make_float4(dq[d][0], dq[d][1], dq[d][2], dq[d][3]));
    }
  }
}

/* The warp's 16 rows × DG of acc (its accumulators: chunk d of 8 columns
 * in acc[d], rows g and g + 8) stored as T at rows r0.. of out (those
 * below limit), through shared memory at st (16 rows of DG·2 + 16 bytes:
 * the pad spreads a fragment's 8 rows over the banks): whole rows in
 * 16-byte stores, where the fragments give 4-byte stores 8 rows apart
 * (ncu, D = 128, L = 1k: those stores and their drain at the exit took
 * ~10 % of the dK/dV blocks' samples). */
template <typename T, int DG, bool CHECK = false>
static __device__ __forceinline__ void bwg_store_rows(T *out, int64_t r0, int64_t limit, const float (*acc)[4],
                                                      char *st, uint32_t &seen) {
  constexpr int RB = DG * 2 + 16, CHUNKS = DG / 8;
  const int lane = threadIdx.x & 31, g = lane >> 2, c4 = (lane & 3) * 4;
#pragma unroll
  for (int d = 0; d < CHUNKS; d++) {
    *(uint32_t *)(st + g * RB + d * 16 + c4) = pack2<T>(acc[d][0], acc[d][1]);
    *(uint32_t *)(st + (g + 8) * RB + d * 16 + c4) = pack2<T>(acc[d][2], acc[d][3]);
  }
  __syncwarp();
#pragma unroll
  for (int q = lane; q < 16 * CHUNKS; q += 32) {
    const int r = q / CHUNKS, c = q % CHUNKS;
    if (r0 + r < limit) {
      const uint4 w = *(const uint4 *)(st + r * RB + c * 16);
      *(uint4 *)(out + (r0 + r) * DG + c * 8) = w;
      if constexpr (CHECK) fold_nonfinite_words<T>(seen, w);
    }
  }
  __syncwarp(); /* st free again */
}
#define BWG_STORE_BYTES(DG) (16 * ((DG) * 2 + 16)) /* bwg_store_rows' st, a warp's */

static __device__ __forceinline__ char *bwg_aligned(char *raw) {
  return raw + ((1024 - (smem_addr(raw) & 1023)) & 1023);
}
#endif

/* Whether the dQ kernel holds its Q and dO rows in registers for S and dP
 * (wgmma_rs_kmajor), at D = 128 (+1.5 %
 * for the deterministic calls from 8k keys).  Not at D = 64: there ptxas
 * 13.0 miscompiles the loop, writing dS's packed fragments into the
 * registers that hold dO's, which the next key tile's dP then reads (the
 * PTX keeps them apart; SASS and the failing checks:
 * docs/perf/2026-11-29-backward-d64-fused-h200.json). */
static constexpr __host__ __device__ bool bwg_dq_rows_in_registers(int DG, int EXTRAS) {
  return DG == 128 && EXTRAS == EXTRAS_NONE;
}

/* How the dK/dV blocks take their key tiles: `ctas` blocks a (batch, KV
 * head); in the WALK instances block c takes tiles c, 2·ctas - 1 - c,
 * 2·ctas + c, ... (a snake, so that a causal call's long and short tiles
 * even out) and adds its dQ into dq_acc + c·copy; the others take tile c
 * alone (ctas = the key tiles), adding into dq_acc. */
struct bwg_walk {
  int64_t ctas, copy;
  const float *fixed; /* FIXED: each query row's multiplier (B·Hq·Lq, bw_fixed_mult) */
  /* not WALK: the last `tail` (batch, KV head)s of the grid come key tile by key tile (their first tiles,
   * the longest in a causal call, then their second ...), the others head by head (bwg_tail) */
  int64_t tail;
};

/* Whether a fused TMA instance takes K and V by TMA too, and issues its first tile's Q and dO before the delta
 * kernel's wait (bwg_dkdv_kernel's KV_TMA; the host makes k's and v's maps for those alone), where it paid (H100,
 * bf16, 1k-16k keys, time against cp.async's; docs/perf/2026-12-06-backward-kv-tma-h100.json): the default at
 * D = 128 0.985-0.999x and D = 96 0.993-1.001x, the fixed point at D = 96 0.976-0.984x and D = 64 0.988-0.998x;
 * not the default at D = 64 (28 bytes more of spills, 1.02-1.04x) nor the fixed point at D = 128 (1.001-1.010x) */
static constexpr __host__ __device__ bool bwg_kv_tma(int DG, bool FIXED) { return FIXED ? DG != 128 : DG != 64; }

/* Where a TMA instance of the fused kernel finishes staging a query tile's
 * rows.  ONE_STEP: thread r < BR loads row r's lse and delta when the
 * tile's Q and dO are issued, a tile ahead (bwm_row_load), and waits there
 * for them, before this tile's products.  Else in two steps
 * (bwm_row_issue: the range, lse and delta by cp.async, and FIXED's
 * multiplier; then bwm_row_finish): AT_START at the tile's start, before
 * its barrier; AT_END at the end of the tile before, while its dK is on the
 * tensor cores.  Chosen by measure, three rounds in turns (H200, bf16,
 * docs/perf/2026-12-02-backward-rows-staged-h200.json): against one step,
 * FIXED at the start 0.91-0.97x the time at D = 64 and 128, 0.96-1.00x at
 * D = 96; the default at D = 128 at the end 0.954-0.983x (at the start
 * 1.02-1.04x); the default at D = 64 and 96 0.99-1.03x in either two-step
 * form, so one step there.  The
 * score rules' instances were not measured: one step, as before.  Since
 * the first step stores a row past Lq whole (no tile row and no second
 * 64-bit division a tile for the second), FIXED has run at 0.94-0.98x the
 * time of that form again, the default at D = 128 at 0.995-1.013x. */
enum { BWG_ROWS_ONE_STEP, BWG_ROWS_AT_START, BWG_ROWS_AT_END };
static constexpr __host__ __device__ int bwg_rows_staged(int DG, int EXTRAS, bool TMA, bool FIXED) {
  return !TMA || EXTRAS != EXTRAS_NONE ? BWG_ROWS_ONE_STEP
         : FIXED                       ? BWG_ROWS_AT_START
         : DG == 128                   ? BWG_ROWS_AT_END
                                       : BWG_ROWS_ONE_STEP;
}

/* Without DQ: one warpgroup, three blocks an SM at D = 64 without extras
 * (168 registers, no spill): 1.11-1.14x two (H200, 2026-11-27); the
 * extras' instance spills there.  DQ: two warpgroups (128 keys) that add
 * their share of dQ into dq_acc (f32, bwg_acc_tile's layout). */
template <typename T, int DG, int EXTRAS, bool DQ, typename PROB = fa_attn_problem, bool WALK = false,
          bool TMA = false, bool FIXED = false>
__global__ void __launch_bounds__(DQ ? 2 * BWG_THREADS : BWG_THREADS, DQ ? 1 : DG == 64 && !EXTRAS ? 3 : 2)
    bwg_dkdv_kernel(PROB p, fa_attn_grads g, const float *delta, float *dq_acc, bwg_walk walk,
                    const __grid_constant__ bwg_maps tm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!FIXED || (DQ && !WALK && !attn_rule<PROB>::tiles), "FIXED: the default's schedule, "
                                                                   "its bound on dS (no score_mod)");
  static_assert(!TMA || (!attn_rule<PROB>::tiles && !WALK), "TMA: every query tile staged (a stage's uses counted), "
                                                              "one turn (the stages' uses start at 0)");
  /* TMA: the query tiles' Q and dO come by the tensor memory accelerator,
   * issued by thread 0 and completing on qbar[stage], instead of cp.async
   * from every thread (whose address arithmetic was ~15 % of the loop's
   * instructions, H200 ncu at L = 1k) */
  constexpr bool KV_TMA = TMA && bwg_kv_tma(DG, FIXED); /* K and V by TMA too (below) */
  __shared__ __align__(8) uint64_t qbar[KV_TMA ? 3 : 2]; /* the stages' barriers, then K and V's */
  /* a trace build's block timeline: start, then the (last turn's) first tile, loop's end, stores' end; 4-7: after
   * the barrier inits, after the block's indices and K/V's issue, after the query-tile search, K and V landed */
  FA_TIMELINE_MARK(0);
  if constexpr (TMA)
    if (threadIdx.x == 0) {
      mbar_init(smem_addr(&qbar[0]), 1), mbar_init(smem_addr(&qbar[1]), 1);
      if constexpr (KV_TMA) mbar_init(smem_addr(&qbar[2]), 1);
      mbar_init_fence();
      tma_prefetch_map(&tm.q), tma_prefetch_map(&tm.dout);
    } /* published by the barriers before the first copy (bwm_qtiles_meeting's; KV_TMA's K and V are thread 0's own,
       * after its fence) */
  FA_TIMELINE_MARK(4); /* (a trace build: marks 4-7 inside the start, show_timeline.py's START_PHASES) */
  constexpr int D = BWG_PAD(DG), CH = D / 8, BR = bwg_rows_tile(DG, EXTRAS, DQ, WALK), NC = BR / 8;
  constexpr int QT = BR * D * 2; /* bytes of a Q or dO tile */
  /* DQ: each warpgroup adds dQ for the tile's 64 rows of its own, all D columns (ROWSPLIT: tiles of 128
   * rows), or for all 64 rows, D / 2 columns of them */
  constexpr bool ROWSPLIT = BR == 2 * BWG_BR;
  constexpr int WGS = DQ ? 2 : 1, KEYS = WGS * BWG_OWN, THREADS = WGS * BWG_THREADS;
  constexpr int NQ = ROWSPLIT ? D : D / WGS; /* dQ columns a warpgroup */
  static_assert(!ROWSPLIT || DQ, "tiles of 128 rows: the default's fused dQ, or its FIXED form");
  /* this warp's keys of K in registers as Sᵀ's A operand (wgmma_rs_kmajor), a third less of the shared
   * memory's bandwidth for that product: in the default's TMA instance at D = 64, 1.01-1.03x its speed
   * (H200, docs/perf/2026-12-01-backward-d64-rows128-h200.json); its other instances spill 140-340 bytes
   * with it, and D = 96 and 128 have no room beside dK and dV.  V too (as with tiles of 64) spills. */
  constexpr bool KREG = ROWSPLIT && EXTRAS == EXTRAS_NONE && TMA && !FIXED;
  /* the rows' key ranges relative to the key tile (bwm_rows): not the walk's instance (28 bytes of spills) */
  constexpr bool REL = EXTRAS == EXTRAS_NONE && !WALK;
  /* the built-in rules' fused instances: the dK and dV they write are checked for NaN and inf (g.nonfinite;
   * bw_guarded) */
  constexpr bool CHECK = DQ && !WALK && EXTRAS != EXTRAS_VARIANT;
  extern __shared__ __align__(128) char bwg_raw[];
  __shared__ bwm_rows<BR> rows[2];
  __shared__ float fmul[FIXED ? 2 : 1][BR]; /* FIXED: the staged query tiles' multipliers */
  char *Ks = bwg_aligned(bwg_raw), *Vs = Ks + KEYS * D * 2, *Qs = Vs + KEYS * D * 2; /* Q, dO, Q, dO, dSᵀ */
  /* wg warp-uniform: the descriptors of this warpgroup's keys are worked out in uniform registers */
  const int warp = threadIdx.x >> 5, wg = warpgroup_uniform();
  char *dSs = Qs + 4 * QT;
  /* HELD: the aligned base and qbar's address held in registers: outside WALK walk.copy is 0, a value ptxas
   * cannot rebuild, so it keeps them instead of rebuilding them from SR_CgaCtaId in every query tile (the
   * forward's wt_layout::at; 0.980-0.997x the time, H200).  The plain rule only: the score rules' D = 96
   * instances spilled 72-116 bytes with it; they take the addresses as before (the same SASS) */
  constexpr bool HELD = !WALK && EXTRAS == EXTRAS_NONE;
  const uint32_t held = HELD ? (uint32_t)walk.copy : 0u;
  const uint32_t k_base = smem_addr(Ks) + held, v_base = HELD ? k_base + KEYS * D * 2 : smem_addr(Vs);
  const uint32_t qs_base = v_base + KEYS * D * 2, qbar_base = smem_addr(&qbar[0]) + held;
  /* stage s's Q tile (dO's follows it; q_tile(2): the dSᵀ tile after both stages) and its barrier */
  auto q_tile = [&](int s) { return HELD ? qs_base + s * 2 * QT : smem_addr(Qs + s * 2 * QT); };
  auto q_bar = [&](int s) { return HELD ? qbar_base + 8 * s : smem_addr(&qbar[s]); };
  const uint32_t kv_bar = q_bar(2); /* KV_TMA: K and V's, used once (one turn) */
  const int64_t ktiles = (p.Lk + KEYS - 1) / KEYS;
  const int64_t blk = blockIdx.x;
  const int64_t per = WALK ? walk.ctas : ktiles; /* blocks a (batch, KV head) */
  /* the block's (batch, KV head) and its key tile or (WALK) its place c among the head's blocks: head by head,
   * the last walk.tail heads key tile by key tile (bwg_tail; 0 in the WALK instances); the grid is below 2^31 */
  const uint32_t tail0 = (uint32_t)(p.B * p.Hkv - walk.tail), lead = tail0 * (uint32_t)per; /* tail0: its first head */
  const uint32_t ub = (uint32_t)blk, ur = ub - lead, tail = max((uint32_t)walk.tail, 1u);
  const uint32_t ubhk = ub < lead ? ub / (uint32_t)per : tail0 + ur % tail;
  const int64_t c = ub < lead ? ub % (uint32_t)per : ur / tail, b = ubhk / (uint32_t)p.Hkv, hk = ubhk % (uint32_t)p.Hkv;
  float *const acc = DQ && WALK ? dq_acc + c * walk.copy : dq_acc;
  /* WALK: the tiles c, 2C - 1 - c, 2C + c, ... in turn; else tile c alone,
   * the do-while's one pass folded away (a turn loop, or a lambda called
   * per turn, in the instances that take one tile changed their register
   * allocation: 40-76 bytes of spills in the default's) */
  int64_t turn = 0;
  do {
    const int64_t kt = WALK ? turn * per + (turn & 1 ? per - 1 - c : c) : c;
    if (WALK && kt >= ktiles) break; /* block-uniform: the last turn's tiles run out from its high end */
    const int64_t j0 = kt * KEYS, j1 = min(j0 + KEYS, p.Lk);
    /* KV_TMA: K and V issued by thread 0 before the block's query-tile search, and the first tile's Q and dO
     * before the delta kernel's wait (they are not its output).  With every thread's cp.async, Q and dO's copies
     * began 2 us after a block's start and its first tile 3.9-4.1 us after it; now K and V go out at 0.5 us and
     * land at about 3.2, the first tile begins at 3.6-3.7 (a block's timeline, H100, bf16, 1k keys, D = 128:
     * docs/perf/2026-12-06-backward-prologue-h100.json and -kv-tma-h100.json).  The landing is the blocks' shared
     * intake, not the copies' issue: 2.9-3.1 us to the first tile for a block starting beside the fewest others,
     * 4.1-4.5 beside the most; the next wave's K and V prefetched into L2 took 0.35 us off and its code cost more
     * (docs/perf/2026-12-06-backward-l2-next-wave-tried-h100.json) */
    if constexpr (KV_TMA) {
      if (threadIdx.x == 0) {
        mbar_expect(kv_bar, 2 * KEYS * D * 2);
        tma_load_tile<D, KEYS>(k_base, &tm.k, (int)j0, (int)hk, (int)b, kv_bar);
        tma_load_tile<D, KEYS>(v_base, &tm.v, (int)j0, (int)hk, (int)b, kv_bar);
      }
    } else {
      load_tile<T, D, KEYS, THREADS, true, false, DG>(Ks, (const T *)p.k + attn_at(p.k_st, b, hk, 0), p.k_st.s, j0,
                                                      p.Lk);
      load_tile<T, D, KEYS, THREADS, true, false, DG>(Vs, (const T *)p.v + attn_at(p.v_st, b, hk, 0), p.v_st.s, j0,
                                                      p.Lk);
    }
    FA_TIMELINE_MARK(5);
    /* the span by shuffles (bwm_qtiles_meeting) in the default's fused instances but D = 64's with a mask or
     * score rule: with the rules 0.71-0.94x the time at D = 128 (float mask 0.71, softcap 0.90, alibi 0.94),
     * 0.78-0.92x at D = 96, while D = 64's took 1.05-1.19x (its cp.async form also spilled, 12 -> 44 bytes); the
     * plain rule's and the Lua variants' 0.978-1.005x (H100, bf16, L = 4k;
     * docs/perf/2026-12-07-backward-span-shuffle-h100.json).  The deterministic (FIXED) instances were mixed with
     * it (float mask 0.85-0.98x, alibi at D = 128 1.06x, the plain rule up to 1.01x:
     * docs/perf/2026-12-07-backward-span-deterministic-tried-h100.json); WALK and the two kernels not measured */
    constexpr bool SPAN_SHUFFLED = DQ && !WALK && !FIXED && !(DG == 64 && EXTRAS == EXTRAS_MASK);
    const bwm_qtiles qt = bwm_qtiles_meeting<EXTRAS, SPAN_SHUFFLED>(p, b, hk, j0, j1, BR);
    FA_TIMELINE_MARK(6);
    /* DQ: the blocks of one head start their walk at different query tiles
     * (and wrap around), spread over the walk by their key tile: all
     * starting at the first, they would add into the same dQ rows at the
     * same time, and atomics on one address are serialised */
    const int64_t rot = DQ && qt.count > 0 ? kt * qt.count / ktiles : 0;
    auto visit = [&](int64_t t) { return t + rot < qt.count ? t + rot : t + rot - qt.count; };
    /* variants: mask_mod's states of the tile staged last, for this warpgroup's keys and the other's; a tile
     * empty for both is neither loaded nor computed */
    int state_next = FA_BLOCK_PARTIAL, other_next = FA_BLOCK_PARTIAL;
    constexpr int ROWS_AT = bwg_rows_staged(DG, EXTRAS, TMA, FIXED);
    constexpr bool SPLIT_ROWS = ROWS_AT != BWG_ROWS_ONE_STEP, FINISH_LATE = ROWS_AT == BWG_ROWS_AT_END;
    /* what: 1 the tile's copies, 2 its rows (and FIXED's multipliers), which read the delta kernel's output */
    auto stage = [&](int64_t t, int s, bool *all, int what) {
      const int64_t u = visit(t), h = qt.head(u), i0 = qt.row(u, BR);
      if constexpr (attn_rule<PROB>::tiles) {
        state_next = bwm_variant_state(p, b, h, i0, j0 + wg * BWG_OWN);
        other_next = DQ ? bwm_variant_state(p, b, h, i0, j0 + (1 - wg) * BWG_OWN) : state_next;
        if (state_next == FA_BLOCK_EMPTY && other_next == FA_BLOCK_EMPTY) return;
      }
      if constexpr (TMA) {
        if ((what & 1) && threadIdx.x == 0) {
          const uint32_t bar = q_bar(s), dst = q_tile(s);
          mbar_expect(bar, 2 * QT);
          /* tma_load_tile's boxes, Q's and dO's in turn (the order measured; the two tiles one after the other
           * change ptxas's registers by up to 4); D = 96: the second box's last 32 columns come in as zeros */
#pragma unroll
          for (int c = 0; c < D / 64; c++) {
            tma_load_4d(dst + c * BR * 128, &tm.q, c * 64, (int)i0, (int)h, (int)b, bar);
            tma_load_4d(dst + QT + c * BR * 128, &tm.dout, c * 64, (int)i0, (int)h, (int)b, bar);
          }
        }
        if (!(what & 2)) return;
        if constexpr (SPLIT_ROWS) {
          if (threadIdx.x < BR) bwm_row_issue<BR>(p, delta, rows[s], b, h, i0, threadIdx.x);
        } else {
          bwm_stage_row_of_thread<BR, REL>(p, delta, rows[s], b, h, i0, j0, j1, all);
        }
      } else {
        bwm_stage_rows<T, D, BR, THREADS, true, DG, REL>(Qs + s * 2 * QT, QT, p, g, delta, rows[s], b, h, i0, j0, j1,
                                                         all);
      }
      if constexpr (FIXED) /* published as rows[s] is, by the barrier at the tile's start */
        if (threadIdx.x < BR) {
          const int64_t i = i0 + threadIdx.x;
          const float *m = walk.fixed + (b * p.Hq + h) * p.Lq + i;
          if constexpr (SPLIT_ROWS) cp_async4(&fmul[s][threadIdx.x], i < p.Lq ? m : walk.fixed, i < p.Lq ? 4 : 0);
          else fmul[s][threadIdx.x] = i < p.Lq ? *m : 0.f;
        }
    };
    bool all_next = true;
    /* SPLIT_ROWS: the second step for the tile staged in stage s (all_next: whether its rows take every key) */
    auto finish_rows = [&](int s) {
      cp_async_wait<0>();
      all_next = true;
      if (threadIdx.x < BR) bwm_row_finish<BR, REL>(p, rows[s], threadIdx.x, j0, j1, &all_next);
    };
    /* CHECK (the built-in fused instances; bwg_waits says the same on the host): launched behind the delta
     * kernel as its programmatic dependent, so K and V above load while its last blocks run; delta, dq_acc's
     * zeros and FIXED's multipliers are its, read from the first stage on */
    if constexpr (KV_TMA) /* Q and dO are not the delta kernel's: their copies go before the wait */
      if (qt.count > 0) stage(0, 0, &all_next, 1);
    if constexpr (CHECK) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (qt.count > 0) stage(0, 0, &all_next, KV_TMA ? 2 : 3);
    cp_async_commit();
    float dk[CH][4], dv[CH][4];
    bwm_zero<CH>(dk), bwm_zero<CH>(dv);
    uint32_t ka[KREG ? D / 16 : 1][4];
    if constexpr (KREG) {
      cp_async_wait<0>(); /* K and V (Q and dO come by TMA) */
      __syncthreads();
      sw128_a_frags<D, KEYS>(ka, Ks, warp * 16, threadIdx.x & 31);
    }
    const uint32_t kw_base = k_base + wg * BWG_OWN * 128, vw_base = v_base + wg * BWG_OWN * 128; /* this warpgroup's keys */
    /* One barrier a query tile (two with DQ): after it this tile's copies
     * and rows are in, and every warp is past the last tile, so stage s ^ 1
     * (and the dSᵀ tile) may be written again. */
    bool landed = false; /* DQ: this tile's copies waited for and fenced at the end of the last one */
    /* Q_SHUFFLED (below): the stage's base through a shuffle, at D = 96 at the tile's top (Q_TOP) */
    constexpr bool Q_SHUFFLED = FIXED && TMA && EXTRAS == EXTRAS_NONE, Q_TOP = Q_SHUFFLED && DG == 96;
    for (int64_t t = 0; t < qt.count; t++) {
      const int s = (int)(t & 1);
      const uint32_t q_top = Q_TOP ? __shfl_sync(0xffffffffu, q_tile(s), (int)held) : 0u;
      if (!landed) { /* TMA: K and V, before the first tile */
        if constexpr (KV_TMA) mbar_wait(kv_bar, 0);
        cp_async_wait<0>();
        fence_proxy_async();
        if (t == 0) FA_TIMELINE_MARK(7);
      }
      landed = TMA;
      if (SPLIT_ROWS && (!FINISH_LATE || t == 0)) finish_rows(s); /* this tile's rows, copied a tile ago */
      if constexpr (TMA) mbar_wait(q_bar(s), (unsigned)(t >> 1) & 1); /* stage s's use t / 2 */
      const bool full = __syncthreads_and(all_next) && bwm_full_rule(EXTRAS) && j1 - j0 == KEYS;
      if (t == 0) FA_TIMELINE_MARK(1);
      const int state = state_next, other = other_next;
      if (t + 1 < qt.count) stage(t + 1, s ^ 1, &all_next, 3); /* the next tile's copies fly while this one computes */
      cp_async_commit();
      if (attn_rule<PROB>::tiles && state == FA_BLOCK_EMPTY && other == FA_BLOCK_EMPTY) continue; /* the whole block's */
      /* the deterministic TMA instances of the plain rule (those measured): the stage's base through a shuffle
       * from lane `held` (0 at run time; every lane holds the same value).  ptxas kept qs_base in a per-thread
       * register and moved each k-step's descriptor to the uniform datapath by R2UR, two a product (74 in the
       * D = 128 instance, 0 in its loop after); a shuffle's result it moves once (from lane 0 it dropped the
       * shuffle as a no-op).  Deterministic calls 0.979-0.990x the time at D = 128, 0.990-0.995x at D = 64; at
       * D = 96 0.993-0.997x here, 0.982-0.990x with the shuffle at the tile's top (Q_TOP); in the default
       * instances the same change, here or at the tile's top, cost 1.01-1.04x, so they keep the R2UR form (H100,
       * bf16 and f16, docs/perf/2026-12-07-backward-stage-base-h100.json) */
      const uint32_t q_base = Q_TOP        ? q_top
                              : Q_SHUFFLED ? __shfl_sync(0xffffffffu, q_tile(s), (int)held)
                                           : q_tile(s);
      const uint32_t do_base = q_base + QT;
      float sc[NC][4], dp[NC][4];
      wgmma_fence();
      if constexpr (KREG) wgmma_rs_kmajor<T, DG, BR>(&sc[0][0], ka, q_base); /* Sᵀ = K·Qᵀ */
      else bwg_abt<T, DG, BR, KEYS>(&sc[0][0], kw_base, q_base);
      bwg_abt<T, DG, BR, KEYS>(&dp[0][0], vw_base, do_base); /* dPᵀ = V·dOᵀ */
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_hold<BR / 2>(&sc[0][0]);
      wgmma_hold<BR / 2>(&dp[0][0]);
      const int64_t u = visit(t); /* here, not above: live across the products it cost ptxas 140-400 bytes of spills */
      bwm_probs<true, NC, BR, EXTRAS, REL>(p, b, qt.head(u), qt.row(u, BR), j0, 0, warp * 16, rows[s], full, sc, dp,
                                           state);
      uint32_t pa[BR / 16][4], da[BR / 16][4];
      bwg_pack<T, BR / 16>(pa, sc);
      bwg_pack<T, BR / 16>(da, dp);
      float dq[DQ ? NQ / 8 : 1][4];
      /* DQ: this warpgroup's first dQ row in the tile and first column (ROWSPLIT: its 64 rows, else its
       * columns); here, not at the kernel's top: live across the loop, ptxas spilled 108 bytes in an instance */
      const int wrow = ROWSPLIT ? wg * BWG_BR : 0, wcol = ROWSPLIT ? 0 : wg * NQ;
      wgmma_hold<D / 2>(&dv[0][0]);
      wgmma_hold<D / 2>(&dk[0][0]);
      wgmma_fence();
      bwg_xb<T, D, BR / 16>(&dv[0][0], pa, do_base); /* dV += Pᵀ·dO */
      /* DQ: dV on the tensor cores while dSᵀ is staged and the warpgroups
       * meet; then dQ's share, then dK, committed apart, so that the share's
       * adds are issued while dK runs */
      if constexpr (DQ) {
        wgmma_commit();
        bwg_stage_ds<BR, KEYS>(dSs, da);
        fence_proxy_async();
        __syncthreads(); /* both warpgroups' dSᵀ rows are in */
        wgmma_fence();
        bwg_ds_k<T, NQ, KEYS>(&dq[0][0], q_tile(2) + wrow / 64 * KEYS * 128, k_base,
                              wcol); /* dQ's share: dS·K, NQ columns (bwg_stage_ds: a block of KEYS rows a 64 rows) */
        wgmma_commit();
      }
      bwg_xb<T, D, BR / 16>(&dk[0][0], da, q_base); /* dK += dSᵀ·Q */
      wgmma_commit();
      if constexpr (DQ) {
        wgmma_wait<1>();
        wgmma_hold<NQ / 2>(&dq[0][0]);
        /* the next tile's copies (issued a tile ago) waited for and fenced
         * here, before the adds: at the loop's head the fence (a membar)
         * waited for the adds to complete (ncu: 6 % of the samples there) */
        if constexpr (!TMA) {
          cp_async_wait<0>();
          fence_proxy_async();
          landed = true;
        }
        /* dq_acc's tiles are of BWG_BR rows (bwg_acc_tile); ROWSPLIT: this warpgroup's half of the tile */
        const int64_t bh = b * p.Hq + qt.head(u), qtiles = (p.Lq + BWG_BR - 1) / BWG_BR;
        const int64_t i0 = qt.row(u, BR) + wrow;
        if (!ROWSPLIT || i0 < p.Lq) { /* (a half past Lq: no tile of dq_acc) */
          const int r = wrow + (warp & 3) * 16 + ((threadIdx.x & 31) >> 2); /* FIXED: the rows' multipliers */
          bwg_add_dq<NQ, DG, FIXED>(acc + bwg_acc_tile(bh, qtiles, i0, DG), wcol, dq, FIXED ? fmul[s][r] : 1.f,
                                    FIXED ? fmul[s][r + 8] : 1.f);
        }
      }
      if (SPLIT_ROWS && FINISH_LATE && t + 1 < qt.count) finish_rows(s ^ 1); /* the next tile's, while dK is on the tensor cores */
      wgmma_wait<0>();
      wgmma_hold<D / 2>(&dv[0][0]);
      wgmma_hold<D / 2>(&dk[0][0]);
    }
    FA_TIMELINE_MARK(2);
    cp_async_wait<0>(); /* no copy in flight at the exit or the next turn (a block whose keys no row takes) */
    if constexpr (KV_TMA)
      if (qt.count == 0) mbar_wait(kv_bar, 0); /* no copy into the block's memory after it ends */
    const int64_t r0 = (b * p.Hkv + hk) * p.Lk, j = j0 + warp * 16;
    static_assert(WGS * 4 * BWG_STORE_BYTES(DG) <= 4 * QT, "the warps' staging fits where the Q and dO tiles were");
    uint32_t seen = 0; /* CHECK: fold_nonfinite_words over what is stored */
    if constexpr (TMA && !WALK) { /* (the cp.async and WALK instances spill with it: 8-160 bytes) */
      __syncthreads(); /* every warp's products are past the tiles */
      char *st = Qs + warp * BWG_STORE_BYTES(DG);
      bwg_store_rows<T, DG, CHECK>((T *)g.dk + r0 * DG, j, p.Lk, dk, st, seen);
      bwg_store_rows<T, DG, CHECK>((T *)g.dv + r0 * DG, j, p.Lk, dv, st, seen);
    } else {
      bwm_store<T, CH, DG, CHECK>((T *)g.dk + r0 * DG, j, p.Lk, dk, &seen);
      bwm_store<T, CH, DG, CHECK>((T *)g.dv + r0 * DG, j, p.Lk, dv, &seen);
    }
    if constexpr (CHECK)
      if (g.nonfinite && __any_sync(0xffffffffu, pairs_nonfinite(seen)) && (threadIdx.x & 31) == 0) *g.nonfinite = 1;
    FA_TIMELINE_MARK(3);
    if (WALK) __syncthreads(); /* every warp is done with the tiles before the next turn's copies land in them */
  } while (WALK && ++turn * per < ktiles);
#endif
}

template <typename T, int DG, int EXTRAS, typename PROB = fa_attn_problem>
__global__ void __launch_bounds__(BWG_THREADS, 2)
    bwg_dq_kernel(PROB p, fa_attn_grads g, const float *delta) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int D = BWG_PAD(DG), CH = D / 8, NC = BWG_BC / 8, KT = BWG_BC * D * 2; /* bytes of a K or V tile */
  constexpr int ROWS = BWG_OWN, THREADS = BWG_THREADS;
  extern __shared__ __align__(128) char bwg_raw[];
  __shared__ bwm_rows<ROWS> rows;
  char *Qs = bwg_aligned(bwg_raw), *dOs = Qs + ROWS * D * 2, *Ks = dOs + ROWS * D * 2; /* K, V, K, V */
  const int warp = threadIdx.x >> 5, tid = threadIdx.x;
  const int64_t qtiles = (p.Lq + ROWS - 1) / ROWS, blk = blockIdx.x;
  const int64_t bh = blk / qtiles, i0 = (qtiles - 1 - blk % qtiles) * ROWS; /* long causal tiles first */
  const int64_t b = bh / p.Hq, h = bh % p.Hq, hk = h / (p.Hq / p.Hkv);
  load_tile<T, D, ROWS, THREADS, true, false, DG>(Qs, (const T *)p.q + attn_at(p.q_st, b, h, 0), p.q_st.s, i0, p.Lq);
  load_tile<T, D, ROWS, THREADS, true, false, DG>(dOs, (const T *)g.dout + attn_at(g.dout_st, b, h, 0),
                                                      g.dout_st.s, i0, p.Lq);
  constexpr bool QO_REGS = bwg_dq_rows_in_registers(DG, EXTRAS);
  if constexpr (QO_REGS) cp_async_commit(); /* a group of their own: read into registers before the loop */
  int64_t t_lo, t_hi;
  constexpr bool REL = EXTRAS == EXTRAS_NONE; /* the rows' key ranges relative to key 0 (bwm_rows) */
  bwm_tile_keys<ROWS, REL>(p, delta, rows, b, h, i0, &t_lo, &t_hi);
  if constexpr (attn_rule<PROB>::tiles) { /* key tiles on mask_mod's tiles, its nonempty ones */
    t_lo = t_lo / BWG_BC * BWG_BC;
    attn_rule<PROB>::template narrow<BWG_OWN>(p, b, h, i0, &t_lo, &t_hi);
  }
  const int64_t ntiles = (t_hi - t_lo + BWG_BC - 1) / BWG_BC;
  const T *k = (const T *)p.k + attn_at(p.k_st, b, hk, 0), *v = (const T *)p.v + attn_at(p.v_st, b, hk, 0);
  int state_next = FA_BLOCK_PARTIAL; /* variants: mask_mod's state of the tile staged last (empty: not loaded) */
  auto stage = [&](int64_t t, int s) {
    if constexpr (attn_rule<PROB>::tiles)
      if ((state_next = bwm_variant_state(p, b, h, i0, t_lo + t * BWG_BC)) == FA_BLOCK_EMPTY) return;
    load_tile<T, D, BWG_BC, THREADS, true, false, DG>(Ks + s * 2 * KT, k, p.k_st.s, t_lo + t * BWG_BC, p.Lk);
    load_tile<T, D, BWG_BC, THREADS, true, false, DG>(Ks + s * 2 * KT + KT, v, p.v_st.s, t_lo + t * BWG_BC, p.Lk);
  };
  if (ntiles > 0) stage(0, 0);
  cp_async_commit(); /* with Q and dO */
  float dq[CH][4];
  bwm_zero<CH>(dq);
  const uint32_t q_base = smem_addr(Qs), do_base = smem_addr(dOs);
  uint32_t qa[QO_REGS ? D / 16 : 1][4], oa[QO_REGS ? D / 16 : 1][4]; /* this warp's rows as A fragments */
  if constexpr (QO_REGS) {
    cp_async_wait<1>(); /* Q and dO; the first key tile's group stays in flight */
    __syncthreads();
    sw128_a_frags<D, ROWS>(qa, Qs, warp * 16, tid & 31);
    sw128_a_frags<D, ROWS>(oa, dOs, warp * 16, tid & 31);
  }
  for (int64_t t = 0; t < ntiles; t++) {
    const int s = (int)(t & 1);
    const int64_t j0 = t_lo + t * BWG_BC;
    cp_async_wait<0>();
    fence_proxy_async();
    const bool all = tid >= ROWS || (i0 + tid < p.Lq && rows.lse[tid] != -INFINITY && rows.lo[tid] <= j0 &&
                                         rows.hi[tid] >= j0 + BWG_BC);
    /* one barrier a tile, as the dK/dV kernel's: this tile's copies are in, stage s ^ 1 is free */
    const bool full = __syncthreads_and(all) && bwm_full_rule(EXTRAS);
    const int state = state_next;
    if (t + 1 < ntiles) stage(t + 1, s ^ 1);
    cp_async_commit();
    if (attn_rule<PROB>::tiles && state == FA_BLOCK_EMPTY) continue; /* the whole block's */
    const uint32_t k_base = smem_addr(Ks + s * 2 * KT), v_base = k_base + KT;
    float sc[NC][4], dp[NC][4];
    wgmma_fence();
    if constexpr (QO_REGS) {
      wgmma_rs_kmajor<T, DG, BWG_BC>(&sc[0][0], qa, k_base);  /* S = Q·Kᵀ */
      wgmma_rs_kmajor<T, DG, BWG_BC>(&dp[0][0], oa, v_base); /* dP = dO·Vᵀ */
    } else {
      bwg_abt<T, DG, BWG_BC, ROWS>(&sc[0][0], q_base, k_base);
      bwg_abt<T, DG, BWG_BC, ROWS>(&dp[0][0], do_base, v_base);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<BWG_BC / 2>(&sc[0][0]);
    wgmma_hold<BWG_BC / 2>(&dp[0][0]);
    bwm_probs<false, NC, ROWS, EXTRAS, REL>(p, b, h, i0, j0, warp * 16, 0, rows, full, sc, dp, state);
    uint32_t da[BWG_BC / 16][4];
    bwg_pack<T, BWG_BC / 16>(da, dp);
    wgmma_hold<D / 2>(&dq[0][0]);
    wgmma_fence();
    bwg_xb<T, D, BWG_BC / 16>(&dq[0][0], da, k_base); /* dQ += dS·K */
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&dq[0][0]);
  }
  cp_async_wait<0>();
  bwm_store<T, CH, DG>((T *)g.dq + bh * p.Lq * DG, i0 + warp * 16, p.Lq, dq);
#endif
}

/* dq (a (B·Hq, Lq, DG) tensor) = the sums in acc (dq_acc's layout, n4
 * float4s) rounded to T: a block a tile of BWG_BR rows at a time, each
 * thread BWG_CONVERT_PER float4 places of it (their loads issued together;
 * each place two pairs of columns in rows g and g + 8 of a warp's 16),
 * staged in shared memory as T and stored in whole rows of 16-byte stores
 * (the places' 4-byte stores 8 rows apart wrote half of each sector: the
 * conversion took 65 us for 134 MB of sums at L = 1k, D = 128, H200 ncu).
 * Without mult, f32 sums, `copies` of them n4 float4s apart, summed in
 * order; with mult (FIXED), int32 sums in bwg_add_dq's FIXED order within
 * a warp's 512 bytes, each divided by its row's multiplier (a power of
 * two: exact). */
#define BWG_CONVERT_PER(DG) (BWG_BR * (DG) / 4 / 256)
template <typename T, int DG, bool FIXED>
__global__ void __launch_bounds__(256)
    bwg_dq_convert_kernel(const float *acc, const float *mult, T *dq, int64_t Lq, int64_t n4, int64_t copies,
                          int *nonfinite) {
  constexpr int TILE4 = BWG_BR * DG / 4, PER = BWG_CONVERT_PER(DG), RP = DG + 8; /* RP: a staged row's pitch */
  static_assert(TILE4 == PER * 256, "a tile's float4 places, a whole number a thread");
  __shared__ __align__(16) T st[BWG_BR * RP];
  const int64_t qtiles = (Lq + BWG_BR - 1) / BWG_BR, tiles = n4 / TILE4;
  const int lane = threadIdx.x & 31;
  uint32_t seen = 0; /* nonfinite (not FIXED): fold_nonfinite_words over what is stored */
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t bh = tile / qtiles, i0 = tile % qtiles * BWG_BR, f0 = tile * TILE4;
    float4 x[PER];
    float m0[FIXED ? PER : 1], m8[FIXED ? PER : 1]; /* FIXED: the rows' multipliers, loaded with the sums */
#pragma unroll
    for (int k = 0; k < PER; k++) {
      const int64_t f = f0 + threadIdx.x + k * 256;
      if constexpr (FIXED) {
        const int r = ((threadIdx.x + k * 256) >> 5 & 3) * 16 + (lane >> 2);
        const int *a = (const int *)acc + (f - lane) * 4 + lane;
        x[k] = make_float4((float)a[0], (float)a[32], (float)a[64], (float)a[96]);
        m0[k] = i0 + r < Lq ? mult[bh * Lq + i0 + r] : 1.f;
        m8[k] = i0 + r + 8 < Lq ? mult[bh * Lq + i0 + r + 8] : 1.f;
      } else {
        x[k] = *(const float4 *)(acc + f * 4);
      }
    }
    for (int64_t c = 1; c < copies; c++) /* (FIXED: copies is 1) */
#pragma unroll
      for (int k = 0; k < PER; k++) {
        const float4 y = *(const float4 *)(acc + (c * n4 + f0 + threadIdx.x + k * 256) * 4);
        x[k].x += y.x, x[k].y += y.y, x[k].z += y.z, x[k].w += y.w;
      }
#pragma unroll
    for (int k = 0; k < PER; k++) {
      const int in = threadIdx.x + k * 256, w = (in >> 5) & 3, chunk = in >> 7;
      const int r = w * 16 + (lane >> 2), col = chunk * 8 + (lane & 3) * 2;
      const float a0 = FIXED ? m0[k] : 1.f, a8 = FIXED ? m8[k] : 1.f;
      *(uint32_t *)(st + r * RP + col) = pack2<T>(x[k].x / a0, x[k].y / a0);
      *(uint32_t *)(st + (r + 8) * RP + col) = pack2<T>(x[k].z / a8, x[k].w / a8);
    }
    __syncthreads();
    constexpr int CPR = DG / 8; /* 16-byte chunks a row */
    for (int q = threadIdx.x; q < BWG_BR * CPR; q += 256) {
      const int r = q / CPR, c = q % CPR;
      if (i0 + r < Lq) {
        const uint4 w = *(const uint4 *)(st + r * RP + c * 8);
        *(uint4 *)(dq + (bh * Lq + i0 + r) * DG + c * 8) = w;
        if constexpr (!FIXED) fold_nonfinite_words<T>(seen, w);
      }
    }
    __syncthreads(); /* st free again */
  }
  if constexpr (!FIXED)
    if (nonfinite && __syncthreads_or(pairs_nonfinite(seen)) && threadIdx.x == 0) *nonfinite = 1;
}

#endif
