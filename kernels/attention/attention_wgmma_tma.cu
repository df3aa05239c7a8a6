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
 * where the consumers take turns at the tensor cores (PINGPONG).
 *
 * Two forms: a block a query tile (attn_wgmma_tma_kernel), and a
 * persistent one, a block an SM taking query tiles from a counter and
 * loading the next one's Q and keys while it finishes the last
 * (attn_wgmma_tma_persistent_kernel; wt_persistent says which a call
 * takes).  Measured steps and what was tried: docs/perf/README.md. */
#include "attention_wgmma.cuh"
#include "tma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>

#define WT_BR 128
#define WT_THREADS 384 /* two consumer warpgroups, then the producer */
#define WT_KST 2
#define WT_VST 2 /* the persistent kernel's producer takes both as WT_KST */

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

/* The phases of a ring of N buffers whose tile t of a query tile sits in
 * buffer t % N: bit s is the parity of buffer s's next phase.  A query tile
 * starts at buffer 0, so that the buffer (and the address of the products'
 * operands) follows from the tile's index alone; ptxas then keeps that
 * arithmetic in uniform registers (ring positions running on across query
 * tiles came from shared memory, which put it in vector registers: 7 %
 * more instructions a key tile). */
template <int N> struct wt_ring {
  uint32_t bits = 0;
  __device__ __forceinline__ unsigned parity(int t) const { return ((bits >> (t % N)) ^ (unsigned)(t / N)) & 1u; }
  /* past a query tile of n tiles */
  __device__ __forceinline__ void advance(int n) {
#pragma unroll
    for (int s = 0; s < N; s++) bits ^= (uint32_t)(((n - s + N - 1) / N) & 1) << s;
  }
};

/* A consumer warpgroup's key loop over the query tile's ntiles key tiles
 * from t_lo, and the last tile's P·V, into o (rows r): tile t in buffer
 * t % 2 of the key and value rings (smem addresses ks, vs; the barriers'
 * phases kr, vr).  S(t+1) = Q·K(t+1)ᵀ is issued with O += P(t)·V(t) behind
 * it (the wgmma kernel's intra-warpgroup overlap).  q_empty (0: none) gets
 * this warp's arrival once its last S is in. */
struct wt_rings {
  uint32_t ks, vs, full_k, empty_k, full_v, empty_v;
};
template <typename T, int D, int BC, int EXTRAS, bool PINGPONG>
static __device__ __forceinline__ void wt_consume(const fa_attn_problem &p, int64_t b, int64_t h, int64_t t_lo,
                                                  int64_t all_lo, int64_t all_hi, int ntiles, const wt_rings &rg,
                                                  const wt_ring<WT_KST> &kr, const wt_ring<WT_VST> &vr, uint32_t q_base,
                                                  uint32_t q_empty, frag_rows &r, float (*o)[4]) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int KB = BC * D * 2;
  const int lane = threadIdx.x & 31, wg = threadIdx.x >> 7, c2 = (lane & 3) * 2;
  const bool scale_pos = p.scale > 0;
  float s[BC / 8][4];
  uint32_t pa[BC / 16][4]; /* P of the previous tile, as A fragments */
  if (PINGPONG && wg == 1 && ntiles > 0) wt_turn_pass(1); /* warpgroup 0 goes first */
  for (int t = 0; t < ntiles; t++) {
    const int64_t j0 = t_lo + (int64_t)t * BC;
    const int kb = t % WT_KST;
    mbar_wait(rg.full_k + 8 * kb, kr.parity(t));
    if (PINGPONG) wt_turn_wait(wg);
    qk_issue<T, D, WT_BR, BC>(s, q_base, rg.ks + kb * KB);
    if (t > 0) {
      const int vb = (t - 1) % WT_VST;
      mbar_wait(rg.full_v + 8 * vb, vr.parity(t - 1));
      pv_issue<T, D, BC>(o, pa, rg.vs + vb * KB);
    }
    if (t > 0) wgmma_wait<1>();
    else wgmma_wait<0>();
    /* the turn passes once S is in (a barrier between the products' issue
     * and this wait made ptxas serialise them); every turn warpgroup 0
     * takes is passed back, but for its last */
    if (PINGPONG) wt_turn_pass(wg, wg == 0 || t + 1 < ntiles);
    wgmma_hold<BC / 2>(&s[0][0]);
    if (lane == 0) mbar_arrive(rg.empty_k + 8 * kb); /* this warp's reads of K(t) are done */

    const bool full = scale_pos && j0 >= all_lo && j0 + BC <= all_hi;
    float alphaA = 1.f, alphaB = 1.f;
    frag_softmax_tile<BC / 8, EXTRAS>(p, b, h, j0, c2, full, r, s, &alphaA, &alphaB);

    wgmma_wait<0>();
    wgmma_hold<D / 2>(&o[0][0]);
    if (t > 0 && lane == 0) mbar_arrive(rg.empty_v + 8 * ((t - 1) % WT_VST));
    frag_rescale<D / 8>(o, alphaA, alphaB);
    p_pack<T, BC>(pa, s);
  }
  if (q_empty && lane == 0) mbar_arrive(q_empty); /* this warp's reads of Q are done */
  if (ntiles > 0) { /* the last tile's P·V */
    const int vb = (ntiles - 1) % WT_VST;
    mbar_wait(rg.full_v + 8 * vb, vr.parity(ntiles - 1));
    pv_issue<T, D, BC>(o, pa, rg.vs + vb * KB);
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&o[0][0]);
    if (lane == 0) mbar_arrive(rg.empty_v + 8 * vb);
  }
#endif
}

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

  const int rA = warp * 16 + (lane >> 2), rB = rA + 8;
  frag_rows r = frag_rows_start(p, b, i0, rA, rB);
  float o[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  mbar_wait(bar_q, 0);
  const wt_rings rg = {smem_addr(Ks), smem_addr(Vs), full_k, empty_k, full_v, empty_v};
  wt_consume<T, D, BC, EXTRAS, PINGPONG>(p, b, h, t_lo, all_lo, all_hi, ntiles, rg, wt_ring<WT_KST>(), wt_ring<WT_VST>(),
                                         smem_addr(Qs) + wg * 64 * 128, 0, r, o);
  /* O leaves through this warpgroup's rows of Q's tile (its products are done) */
  frag_store_staged<T, D, false, true, WT_BR, 128>(p, bh, qt.out(p), qt.lse(p), i0, lane, r, o, Qs);
#endif
}

/* The persistent form: a block an SM, walking query tiles.  The
 * producer warp takes tiles from a counter (the longest first, in
 * frag_qtile's order: whichever block is free takes the next), reduces the
 * tile's key range with its 32 lanes, and posts {tile, range} in a ring of
 * two slots (wt_slot, full/empty mbarriers) ahead of the consumers; it
 * loads tile n + 1's first key tile while the consumers finish tile n, and
 * its Q once they are past their last S = Q·Kᵀ (q_empty), so that a
 * tile's start waits for no copy.  Each query tile's keys and values start
 * at the rings' first buffers (wt_ring).  O leaves from the fragments
 * (frag_store): Q's buffer, through which the one-tile form stages it, is
 * the next tile's by then. */
struct wt_slot {
  int tile, ntiles;
  long long t_lo, all_lo, all_hi;
};

static __host__ __device__ constexpr size_t wt_persistent_smem_bytes(int D, int BC) {
  return wt_smem_bytes(D, BC) + 8 * 6 + 2 * sizeof(wt_slot);
}


template <typename T, int D, int BC, int EXTRAS>
__global__ void __launch_bounds__(WT_THREADS, 1)
    attn_wgmma_tma_persistent_kernel(const fa_attn_problem p, const __grid_constant__ wt_maps tm, int *next_tile) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int QB = WT_BR * D * 2, KB = BC * D * 2;
  const int v_bad = *p.v_nonfinite; /* see leave_for_fallback */
  extern __shared__ __align__(128) char wt_smem_raw[];
  char *Qs = wt_smem_raw + ((1024 - (smem_addr(wt_smem_raw) & 1023)) & 1023);
  char *Ks = Qs + QB, *Vs = Ks + WT_KST * KB;
  const uint32_t q_full = smem_addr(Vs + WT_VST * KB), full_k = q_full + 8, empty_k = full_k + 8 * WT_KST;
  const uint32_t full_v = empty_k + 8 * WT_KST, empty_v = full_v + 8 * WT_VST, q_empty = empty_v + 8 * WT_VST;
  const uint32_t slot_full = q_empty + 8, slot_empty = slot_full + 16;
  wt_slot *slots = (wt_slot *)(Vs + WT_VST * KB + 8 * (6 + 2 * WT_KST + 2 * WT_VST));

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int qtiles = (int)((p.Lq + WT_BR - 1) / WT_BR), total = (int)(p.B * p.Hq) * qtiles;
  if (tid == 0) {
    mbar_init(q_full, 1), mbar_init(q_empty, 8);
    for (int s = 0; s < WT_KST; s++) mbar_init(full_k + 8 * s, 1), mbar_init(empty_k + 8 * s, 8); /* 8 consumer warps */
    for (int s = 0; s < WT_VST; s++) mbar_init(full_v + 8 * s, 1), mbar_init(empty_v + 8 * s, 8);
    for (int s = 0; s < 2; s++) mbar_init(slot_full + 8 * s, 1), mbar_init(slot_empty + 8 * s, 8);
    mbar_init_fence();
  }
  if (leave_for_fallback(v_bad)) return; /* its barrier also publishes the mbarriers */

  if (wg == 2) { /* the producer: its first warp */
    warpgroup_regs_dec<40>(); /* its tile loop spilled with 24 */
    if (warp != 8) return;
    wt_ring<WT_KST> kr;
    wt_ring<WT_VST> vr;
    for (int n = 0;; n++) {
      int tile = blockIdx.x;
      if (n > 0 && lane == 0) tile = (int)gridDim.x + atomicAdd(next_tile, 1);
      tile = __shfl_sync(0xffffffffu, tile, 0);
      const int s = n & 1;
      int64_t t_lo = 0, t_hi = 0;
      tile_range r = tile_range::none();
      int ntiles = 0;
      if (tile < total) {
        const frag_qtile<T, D, WT_BR> qt(p, tile);
#pragma unroll
        for (int k = 0; k < WT_BR / 32; k++) r.fold(p, qt.b, qt.i0 + k * 32 + lane);
        r.fold_warp();
        r.keys(&t_lo, &t_hi);
        ntiles = (int)((t_hi - t_lo + BC - 1) / BC);
        if (lane == 0) {
          mbar_wait(slot_empty + 8 * s, ((n >> 1) & 1) ^ 1);
          slots[s] = wt_slot{tile, ntiles, (long long)t_lo, (long long)r.alo, (long long)r.ahi};
          mbar_arrive(slot_full + 8 * s);
          /* 32-bit from here (the copy engine's coordinates are): this thread has 24 registers */
          const int hk = (int)(qt.h / (p.Hq / p.Hkv)), bi = (int)qt.b, j_lo = (int)t_lo;
          const uint32_t sq = smem_addr(Qs); /* every buffer and barrier at a constant offset */
          /* tile t of the keys (V = 0) or values (V = 1) into buffer t % 2 (the phase before the first passes at once) */
          auto load = [&](int V, unsigned parity, int t) {
            const int sb = t % WT_KST;
            const uint32_t full = (V ? full_v : full_k) + 8 * sb, buf = sq + QB + (V * WT_KST + sb) * KB;
            mbar_wait((V ? empty_v : empty_k) + 8 * sb, parity ^ 1);
            mbar_expect(full, KB);
#pragma unroll
            for (int c = 0; c < D / 64; c++) tma_load_4d(buf + c * BC * 128, V ? &tm.v : &tm.k, c * 64, j_lo + t * BC, hk, bi, full);
          };
          /* the first key tile while the consumers finish the last tile, then Q once they are done with theirs */
          if (ntiles > 0) load(0, kr.parity(0), 0);
          mbar_wait(q_empty, (n & 1) ^ 1);
          mbar_expect(q_full, QB);
#pragma unroll
          for (int c = 0; c < D / 64; c++) tma_load_4d(sq + c * WT_BR * 128, &tm.q, c * 64, (int)qt.i0, (int)qt.h, bi, q_full);
          for (int t = 0; t < ntiles; t++) {
            if (t + 1 < ntiles) load(0, kr.parity(t + 1), t + 1);
            load(1, vr.parity(t), t);
          }
        }
        kr.advance(ntiles), vr.advance(ntiles);
        __syncwarp();
        continue;
      }
      if (lane == 0) { /* no tile left: the consumers stop too */
        mbar_wait(slot_empty + 8 * s, ((n >> 1) & 1) ^ 1);
        slots[s].tile = tile;
        mbar_arrive(slot_full + 8 * s);
      }
      return;
    }
  }
  warpgroup_regs_inc<232>(); /* 128 · 40 + 256 · 232: the 168 a thread of the launch */

  const int rA = warp * 16 + (lane >> 2), rB = rA + 8;
  const uint32_t q_base = smem_addr(Qs) + wg * 64 * 128; /* this warpgroup's 64 rows */
  const wt_rings rg = {smem_addr(Ks), smem_addr(Vs), full_k, empty_k, full_v, empty_v};
  wt_ring<WT_KST> kr;
  wt_ring<WT_VST> vr;
  for (int n = 0;; n++) {
    const int sl = n & 1;
    mbar_wait(slot_full + 8 * sl, (n >> 1) & 1);
    const wt_slot slot = slots[sl];
    __syncwarp();
    if (lane == 0) mbar_arrive(slot_empty + 8 * sl);
    if (slot.tile >= total) return;
    const frag_qtile<T, D, WT_BR> qt(p, slot.tile);
    const int ntiles = slot.ntiles;
    frag_rows r = frag_rows_start(p, qt.b, qt.i0, rA, rB);
    float o[D / 8][4];
#pragma unroll
    for (int d = 0; d < D / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    mbar_wait(q_full, n & 1);
    wt_consume<T, D, BC, EXTRAS, false>(p, qt.b, qt.h, slot.t_lo, slot.all_lo, slot.all_hi, ntiles, rg, kr, vr, q_base,
                                        q_empty, r, o);
    kr.advance(ntiles), vr.advance(ntiles);
    frag_store<T, D, false>(p, qt.bh, qt.out(p), qt.lse(p), lane, r, o);
  }
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

/* The persistent form (see its kernel): a block an SM, the tile counter a
 * fresh device int from the pool, zeroed on the stream. */
template <typename T, int D, int BC, int EXTRAS>
static fa_status launch_persistent(fa_context *ctx, const fa_attn_problem *p, const wt_maps &m) {
  const size_t smem = wt_persistent_smem_bytes(D, BC);
  void (*kernel)(const fa_attn_problem, const wt_maps, int *) = attn_wgmma_tma_persistent_kernel<T, D, BC, EXTRAS>;
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  const int64_t tiles = p->B * p->Hq * ((p->Lq + WT_BR - 1) / WT_BR);
  if (fa_status st = attn_grid_fits(ctx, tiles)) return st;
  if (tiles <= 0) return FA_OK;
  int dev = 0, sms = 0;
  FA_CUDA_CHECK(ctx, cudaGetDevice(&dev));
  FA_CUDA_CHECK(ctx, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  void *next = NULL;
  if (fa_status st = fa_cuda_malloc(ctx, &next, sizeof(int))) return st;
  cudaError_t err = cudaMemsetAsync(next, 0, sizeof(int), fa_cuda_stream(ctx));
  if (err == cudaSuccess) {
    kernel<<<(unsigned)std::min(tiles, (int64_t)sms), WT_THREADS, smem, fa_cuda_stream(ctx)>>>(*p, m, (int *)next);
    err = cudaGetLastError();
  }
  fa_cuda_free_on(ctx, next, sizeof(int)); /* stream-ordered: after the kernel */
  return fa_cuda_error(ctx, err, "attn_wgmma_tma_persistent_kernel");
}

/* Whether the call takes the persistent form: at D = 128, and at D = 256
 * from 16384 keys on (there a block a tile with the consumers' turns is
 * faster on shorter rows, and turns in the persistent form cost 10-12 %);
 * not with a mask, whose instance spills more there (bool masks -9 % at
 * L = 4096).  H200, 2026-11-27, docs/perf/2026-11-27-attention-h200-persistent.json:
 * D = 128 +2-13 % at L = 1024-8192, -2 to +3 % at 16384; D = 256 +3 % at 16384. */
static bool wt_persistent(const fa_attn_problem *p) {
  if (attn_extras_kind(p) == EXTRAS_MASK) return false;
  return p->D == 128 || p->Lk >= 16384;
}

/* The call's score rule on the persistent form, or on a block a query tile
 * (the masks, and the consumers taking turns at D = 256). */
template <typename T, int D, int BC> static fa_status launch_extras(fa_context *ctx, const fa_attn_problem *p, const wt_maps &m) {
  const int x = attn_extras_kind(p);
  if (wt_persistent(p)) {
    if (x == EXTRAS_SCORE) return launch_persistent<T, D, BC, EXTRAS_SCORE>(ctx, p, m);
    return launch_persistent<T, D, BC, EXTRAS_NONE>(ctx, p, m);
  }
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
