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
 * choice takes 176 where a query tile takes 8192 keys or more:
 * attention_wgmma_tma.cu), of 64 or 80 at D = 256 (80 where a query tile
 * takes 1024 keys or more, without masks), where the consumers take turns
 * at the tensor cores (PINGPONG), and of 128 at D = 64 (its default; or of
 * 64, where two blocks share an SM and have no producer: WT_FED).
 *
 * Two forms: a block a query tile (attn_wgmma_tma_kernel), and a
 * persistent one, a block an SM taking query tiles from a counter and
 * loading the next one's Q and keys while it finishes the last
 * (attn_wgmma_tma_persistent_kernel; wt_persistent says which a call
 * takes).  Both take the problem's type as a parameter: the built-in rules'
 * fa_attn_problem here, fa_variant_problem in the attention variants' run-time
 * compiled units (API §9: attention_variant.cu).  A query tile's key range
 * is narrowed by its rule (attn_keys: a bool mask's kept keys, mask_mod's
 * tiles).  Measured steps and what was tried:
 * docs/perf/README.md.  The host side: attention_wgmma_tma.cu.
 *
 * Trace marks (trace.cuh, a build with FLASHATTN_KERNEL_TRACE): consumers
 * 0 the query tile taken, 1 Q in, 2 the first S in, 3 the key loop done,
 * 4 the last P·V done, 6 O stored; in the persistent form 5 the NaN/inf
 * check of the outputs done and 7 O staged in its tile (the one-tile
 * form: 5 unused, the staging barrier until 2026-11-30); the producer 0 its loop's top, 1 the tile taken, 2 the slot
 * posted, 3 Q's copy issued, 4 every copy of the tile issued. */
#ifndef FA_KERNELS_ATTENTION_WGMMA_TMA_CUH
#define FA_KERNELS_ATTENTION_WGMMA_TMA_CUH

#include "attention_wgmma.cuh"
#include "tma.cuh"
#include "trace.cuh"

#define WT_BR 128

/* A block's threads, how many blocks share an SM, and the depth of its
 * key and value rings, for head dim D and key tiles of BC.  Two consumer
 * warpgroups, then the producer, a block an SM (the producer's warpgroup
 * gives its registers to the consumers: setmaxnreg), rings of two: also at
 * D = 64 with tiles of 128, its default (the persistent form, Q in
 * registers: 1.05-1.13 x the wgmma kernel's two blocks an SM of 64 keys on
 * the plain rule, bf16 and f16, H200,
 * docs/perf/2026-11-30-d64-producer-h200.json; the consumers taking turns
 * there, as cuDNN's do, cost 1-12 %; rings of three or four there took
 * 0.99-1.025 x the time, docs/perf/2026-12-06-forward-d64-rings-tried-h100.json,
 * and warpgroup 1 held one or two key tiles behind warpgroup 0, so that
 * one's query-tile boundary would run beside the other's key loop,
 * 1.06-1.22 x, as much at 8k keys as at 1k,
 * docs/perf/2026-12-06-forward-d64-lag-tried-h100.json; made to meet at a
 * named barrier, every D, 1.07-1.32 x at every key tile and 1.01-1.06 x at
 * a query tile's first, docs/perf/2026-12-06-forward-step-tried-h100.json:
 * left alone (out of phase, likely, by part of a key tile) the two run
 * fastest; the last three H100, 2026-12-06).  With key tiles of 64 at D = 64 the
 * products of a key tile take about as long as its exponentials, so two
 * blocks share an SM, one's softmax running while the other's products do; there a producer warp
 * would leave 96 registers a thread (18 warps: five on one of the SM's four
 * register files), too few for the products (ptxas serialised them), so
 * the block has no producer: two of its consumer threads feed it (WT_FED:
 * wt_consume), through rings of four, and the consumers keep 128.  That
 * form ran at 0.92-1.0 x the wgmma kernel on dense rows (thread 0 alone
 * feeding: 0.87-0.97; the copies issued behind the products made ptxas
 * serialise them, C7514), and above its strided copies: the registry gives
 * it D = 64's strided calls with tiles of 64 (attention_wgmma_tma.cu:
 * tma_declines). */
static __host__ __device__ constexpr int wt_sm_blocks(int D, int BC) { return D == 64 && BC == 64 ? 2 : 1; }
static __host__ __device__ constexpr int wt_threads(int D, int BC) { return wt_sm_blocks(D, BC) == 2 ? 256 : 384; }
static __host__ __device__ constexpr int wt_stages(int D, int BC) { return wt_sm_blocks(D, BC) == 2 ? 4 : 2; }
#define WT_FED(D, BC) (wt_sm_blocks(D, BC) == 2)
/* Whether the key loop keeps lazy row maxima and skips O's rescale where no
 * row of a warp raised its max (frag_rows_max<true>, frag_rescale_moved):
 * at D = 256, whose O is 128 floats a thread against 40 scores a key tile
 * of 80, it ran 1.05-1.08 x as fast (bf16, L 1k-16k, causal and not); at
 * D = 128 1.01-1.05 x (three rounds); at D = 64 0.96 x, where the vote and
 * branch cost more than the 32 multiplies a tile that ptxas had hidden in
 * the exponentials' latency (H200, 2026-12-03, in turns in one call,
 * docs/perf/2026-12-03-lazy-max-h200.json). */
#define WT_LAZY(D) ((D) >= 128)

/* The tensor maps of q, k and v (kernel parameters: __grid_constant__). */
struct wt_maps {
  CUtensorMap q, k, v;
  /* the persistent form's output, written from O's tile (wt_store_o) in boxes of 64 columns by 16 rows
   * (a warp's); o_mapped 0 where the copy engine refuses it or no tile of O is staged (wt_persistent_fits) */
  CUtensorMap o;
  int o_mapped;
};

#if !defined(__CUDACC_RTC__)
/* The maps of p's q, k and v for its tile (attention_wgmma_tma.cu); 0 when
 * the copy engine cannot take one of them (a stride it refuses).  O's map
 * too, where it takes O (m->o_mapped). */
int wt_encode_maps(const fa_attn_problem *p, wt_maps *m);
/* The map of an operand at base (strides st, L rows of D elements a head,
 * H heads, B batches) read in boxes of 64 columns by `rows` rows, swizzled
 * for wgmma; rows past L come in as zeros.  0 when the driver refuses it. */
int wt_encode_operand(CUtensorMap *m, fa_dtype dt, const void *base, const fa_attn_strides &st, int64_t L, int64_t H,
                      int64_t B, int D, int rows);
/* The persistent form's grid and tile counter (attention_wgmma_tma.cu), from the call's NaN/inf flag. */
fa_status wt_persistent_grid(fa_context *ctx, int64_t tiles, int *flag, unsigned *grid, int **next);
#endif

/* Whether the persistent form's producer warpgroup has a second warp that
 * takes the query tiles and reduces their key ranges (the scheduler), so
 * that the copying warp does not: at D = 64 with the score rules and with
 * a bool mask (its persistent form, measured with the scheduler only): with the rules it
 * ran at 1.06-1.09 x alibi and 0.98-1.04 x softcap (bf16 and f16, L 1k and
 * 4k, causal and not, two repetitions) against the copier taking them
 * itself between a tile's last copy and the next tile's Q; without a rule,
 * or at D = 128, it ran at 0.95-1.03 x (H200,
 * docs/perf/2026-11-30-scheduler-h200.json, …-tile-range-h200.json).  The scheduler takes
 * tile n + 1 once the copier is WT_LEAD key tiles from the end of tile n
 * (sooner, two slots ahead, the tiles taken long before they start
 * unbalanced the longest-first order: causal 16k D = 256 0.80 x). */
static __host__ __device__ constexpr bool wt_scheduler(int D, int EXTRAS) {
  return D == 64 && (EXTRAS == EXTRAS_SCORE || EXTRAS == EXTRAS_MASK);
}
enum { WT_LEAD = 2 };

/* A query tile the persistent form's producer posts to its consumers. */
struct wt_slot {
  int tile, ntiles;
  long long t_lo, all_lo, all_hi;
};

/* Whether the persistent form stages O in a tile of its own (key tiles of
 * 128, D = 128: 192 KB of tiles; D = 64: 96 KB): each warp its 16 rows, with no barrier
 * and the last value tile given back at once; elsewhere it writes O from
 * the fragments (no room for the tile beside rings of 176 at D = 128, or of
  * 64 or 80 at D = 256). */
static __host__ __device__ constexpr bool wt_o_tile(int D, int BC) { return (D == 128 || D == 64) && BC == WT_BR; }

#if !defined(__CUDACC_RTC__)
/* Whether a call takes the persistent form, for the built-in rules and the
 * variants alike (masked: a mask that keeps the block a tile, which the
 * built-in dispatch does not say of a bool mask at D = 64, wt_persistent;
 * BC: the key tile): at
 * D = 64 with a producer (tiles of 128) and at D = 128, and at D = 256
 * from 16384 keys on (there a block a tile with the consumers' turns is
 * faster on shorter rows, and turns in the persistent form cost 10-12 %);
 * not with a mask, whose instance spills more there (bool masks -9 % at
 * L = 4096; at D = 64 a float mask ran at 0.88-0.96 x the block a tile
 * from 2048 keys on).  H200, 2026-11-27,
 * docs/perf/2026-11-27-attention-h200-persistent.json: D = 128 +2-13 % at
 * L = 1024-8192, -2 to +3 % at 16384; D = 256 +3 % at 16384; D = 64:
 * docs/perf/2026-11-30-d64-producer-h200.json.  Where O leaves through a
 * tile of its own (wt_o_tile) the copy engine writes it (wt_store_o), so
 * O's map (m.o_mapped) must be there: the driver refusing it (it takes
 * every output whose rows lie on 16 bytes, as the kernel's operands must)
 * sends the call to the one-tile form. */
static inline bool wt_persistent_fits(const wt_maps &m, long long D, long long BC, long long Lk, bool masked) {
  return !masked && !WT_FED(D, BC) && (D == 64 || D == 128 || Lk >= 16384) &&
         (m.o_mapped || !wt_o_tile((int)D, (int)BC));
}
#endif

/* The mbarriers of a block, and its shared memory in bytes for head dim D,
 * key tiles of BC and a tile for O or not (wt_layout<D, BC, OT>'s): the
 * tiles, the barriers, two slots, and 1024 for the alignment. */
static __host__ __device__ constexpr int wt_nbar(int D, int BC) { return 1 + 4 * wt_stages(D, BC) + 6; }
static __host__ __device__ constexpr size_t wt_smem_bytes(int D, int BC, bool OT = false) {
  return (size_t)(OT ? 2 : 1) * WT_BR * D * 2 + (size_t)2 * wt_stages(D, BC) * BC * D * 2 + 8 * wt_nbar(D, BC) +
         2 * sizeof(wt_slot) + 1024;
}
/* The bytes a launch of either form asks for (the persistent form's tile
 * of O where wt_o_tile says so): the built-in launches and the variants'. */
static __host__ __device__ constexpr size_t wt_form_smem_bytes(int D, int BC, bool persistent) {
  return wt_smem_bytes(D, BC, persistent && wt_o_tile(D, BC));
}

/* A block's shared memory, 1024-byte aligned (the swizzle is computed on
 * address bits): Q's tile, the key and value rings, the mbarriers (Q's
 * full, the rings' full and empty; the persistent form's Q empty and its
 * slots' full and empty), then the persistent form's two slots.  Addresses
 * as the copies and products take them (q: Q's tile). */
template <int D, int BC, bool OT = false> struct wt_layout {
  static constexpr int NS = wt_stages(D, BC);                   /* buffers a ring */
  static constexpr int QB = WT_BR * D * 2, KB = BC * D * 2; /* bytes of the Q tile, of a K or V tile */
  static constexpr int BARS = QB + 2 * NS * KB + (OT ? QB : 0), NBAR = wt_nbar(D, BC);
  char *qs;
  uint32_t q;
  __device__ __forceinline__ explicit wt_layout(char *raw)
      : qs(raw + ((1024 - (smem_addr(raw) & 1023)) & 1023)), q(smem_addr(qs)) {}
  __device__ __forceinline__ uint32_t ks() const { return q + QB; }
  __device__ __forceinline__ uint32_t vs() const { return q + QB + NS * KB; }
  __device__ __forceinline__ char *o_tile() const { return qs + QB + 2 * NS * KB; }        /* OT: O's tile */
  __device__ __forceinline__ uint32_t q_full() const { return q + BARS; }
  __device__ __forceinline__ uint32_t full_k() const { return q + BARS + 8; }
  __device__ __forceinline__ uint32_t empty_k() const { return full_k() + 8 * NS; }
  __device__ __forceinline__ uint32_t full_v() const { return empty_k() + 8 * NS; }
  __device__ __forceinline__ uint32_t empty_v() const { return full_v() + 8 * NS; }
  __device__ __forceinline__ uint32_t q_empty() const { return empty_v() + 8 * NS; }
  __device__ __forceinline__ uint32_t slot_full() const { return q_empty() + 8; }
  __device__ __forceinline__ uint32_t slot_empty() const { return slot_full() + 16; }
  __device__ __forceinline__ uint32_t sched_go() const { return slot_empty() + 16; } /* wt_scheduler's */
  __device__ __forceinline__ wt_slot *slots() const { return (wt_slot *)(qs + BARS + 8 * NBAR); }
  /* The same layout z bytes on, for z = 0 read from memory (the NaN/inf
   * flag once the block has not left for the fallback): ptxas cannot
   * rebuild that address, so it keeps it in a register; from smem_addr it
   * rebuilt it from SR_CgaCtaId at the top of every key tile (an S2UR and
   * the ULEA waiting on it). */
  __device__ __forceinline__ wt_layout at(int z) const {
    wt_layout l = *this;
    l.qs += z, l.q += (uint32_t)z;
    return l;
  }
};

/* Whether the consumers take S = Q·Kᵀ's A operand from registers
 * (qk_issue_rs), Q read from its tile once a query tile: at D = 64 without
 * a rule (the block a tile of two blocks an SM: +0-4 % on strided views),
 * and with tiles of 128 with the score rules too (plain 0.98-1.04 x, softcap
 * 1.01-1.04 x, alibi 1.04-1.10 x the same kernel with Q from shared memory,
 * H200, docs/perf/2026-11-30-d64-producer-h200.json) and in the persistent
 * form with a mask (persistent: there only bool masks, wt_persistent_fits;
 * a float mask's instance on a block a tile ran at 0.86-0.96 x with Q in
 * registers, docs/perf/2026-12-03-mask-persistent-h200.json); not at D = 128
 * or 256 (no room). */
static constexpr __host__ __device__ bool wt_q_in_registers(int D, int BC, int EXTRAS, bool persistent) {
  return D == 64 &&
         (EXTRAS == EXTRAS_NONE || (BC == 128 && (EXTRAS == EXTRAS_SCORE || (EXTRAS == EXTRAS_MASK && persistent))));
}

/* Whether the persistent form's consumers hold the shared-memory base in a
 * register (wt_layout::at): not where the register it takes makes ptxas
 * spill (the score rules with key tiles of 176 and at D = 256: 200-216
 * bytes; D = 128's bool mask: 24 -> 60; ptxas -v, CUDA 13.0). */
static constexpr __host__ __device__ bool wt_base_held(int D, int BC, int EXTRAS) {
  return EXTRAS == EXTRAS_NONE || (D == 64 && EXTRAS != EXTRAS_VARIANT) || (EXTRAS == EXTRAS_SCORE && BC == 128 && D == 128);
}

/* The consumers' turns at the tensor cores (PINGPONG): warpgroup c waits
 * at named barrier WT_TURN + c before it issues a tile's products and lets
 * the other go once its S is in, so that the two issue in turn and one's
 * softmax runs while the other's products do. */
enum { WT_TURN = 3 }; /* barriers 1 and 2: frag_store_staged's */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* named barrier id for the two consumer warpgroups */
static __device__ __forceinline__ void wt_consumers_sync(int id) { asm volatile("bar.sync %0, 256;" ::"r"(id) : "memory"); }
static __device__ __forceinline__ void wt_turn_wait(int c) { wt_consumers_sync(WT_TURN + c); }
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

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The producer's copies, a 64-column block a copy.  Q's tile at rows
 * [row, row + 128) of head h, batch bi, completing on bar: */
template <int D>
static __device__ __forceinline__ void wt_load_q(const CUtensorMap *m, uint32_t q, uint32_t bar, int row, int h, int bi) {
  mbar_expect(bar, WT_BR * D * 2);
  tma_load_tile<D, WT_BR>(q, m, row, h, bi, bar);
}
/* key or value tile t of a query tile (rows [row, row + BC) of key head
 * hk) into buffer t % N of the ring at `ring`, once its empty barrier says
 * it is free (the phase before the first passes at once). */
template <int D, int BC, int N>
static __device__ __forceinline__ void wt_load_kv(const CUtensorMap *m, uint32_t ring, uint32_t full, uint32_t empty,
                                                  const wt_ring<N> &ph, int t, int row, int hk, int bi) {
  const int sb = t % N;
  mbar_wait(empty + 8 * sb, ph.parity(t) ^ 1);
  mbar_expect(full + 8 * sb, BC * D * 2);
  tma_load_tile<D, BC>(ring + sb * BC * D * 2, m, row, hk, bi, full + 8 * sb);
}
/* The mbarriers of both forms (the persistent form's four more with slots). */
template <int D, int BC, bool OT>
static __device__ __forceinline__ void wt_init_barriers(const wt_layout<D, BC, OT> &L, bool slots, bool sched = false) {
  mbar_init(L.q_full(), 1);
  for (int s = 0; s < L.NS; s++) mbar_init(L.full_k() + 8 * s, 1), mbar_init(L.empty_k() + 8 * s, 8); /* 8 consumer warps */
  for (int s = 0; s < L.NS; s++) mbar_init(L.full_v() + 8 * s, 1), mbar_init(L.empty_v() + 8 * s, 8);
  if (slots) {
    mbar_init(L.q_empty(), 8);
    /* a slot is read by the 8 consumer warps, and with a scheduler warp by the copier too */
    for (int s = 0; s < 2; s++) mbar_init(L.slot_full() + 8 * s, 1), mbar_init(L.slot_empty() + 8 * s, sched ? 9 : 8);
    mbar_init(L.sched_go(), 1);
  }
  mbar_init_fence();
}
#endif

/* Where a block without a producer (WT_FED) copies its tiles from: the
 * maps, the first key tile's row, the key head and the batch. */
struct wt_feed {
  const wt_maps *m;
  int j_lo, hk, bi;
};

/* A consumer warpgroup's key loop over the query tile's ntiles key tiles
 * from t_lo, and the last tile's P·V, into o (rows r): tile t in buffer
 * t % NS of the key and value rings of L (the barriers' phases kr, vr).
 * WT_FED(D, BC): at tile t's top, thread 0 (warpgroup 0) copies K(t + 2) and
 * thread 128 (warpgroup 1) V(t + 1), into the buffers of tiles t - 2 and
 * t - 3, which both warpgroups are past unless one is two tiles behind
 * (one feeder for both cost its warpgroup 3-8 %); the caller copied Q, K(0),
 * K(1) and V(0).  S(t+1) = Q·K(t+1)ᵀ is issued with O += P(t)·V(t) behind
 * it (the wgmma kernel's intra-warpgroup overlap); Q from registers where
 * wg_q_in_registers says so (D = 64).  q_empty (0: none) gets
 * this warp's arrival once its last S is in. */
template <typename T, int D, int BC, int EXTRAS, bool PINGPONG, bool OT>
static __device__ __forceinline__ void wt_consume(const fa_attn_problem &p, int64_t b, int64_t h, int64_t t_lo,
                                                  int64_t all_lo, int64_t all_hi, int ntiles, const wt_layout<D, BC, OT> &L,
                                                  const wt_ring<wt_stages(D, BC)> &kr, const wt_ring<wt_stages(D, BC)> &vr,
                                                  uint32_t q_base, uint32_t q_empty, frag_rows &r, float (*o)[4],
                                                  wt_feed feed = {}) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int KB = BC * D * 2, NS = wt_stages(D, BC);
  const uint32_t full_k = L.full_k(), empty_k = L.empty_k(), full_v = L.full_v(), empty_v = L.empty_v();
  const int lane = threadIdx.x & 31, wg = threadIdx.x >> 7, c2 = (lane & 3) * 2;
  const bool scale_pos = frag_scale_positive(p);
  float s[BC / 8][4];
  uint32_t pa[BC / 16][4]; /* P of the previous tile, as A fragments */
  constexpr bool Q_REGS = wt_q_in_registers(D, BC, EXTRAS, OT); /* at D = 64 the persistent form stages O (wt_o_tile) */
  uint32_t qa[Q_REGS ? D / 16 : 1][4];
  if constexpr (Q_REGS) sw128_a_frags<D, WT_BR>(qa, L.qs, (threadIdx.x >> 5) * 16, lane);
  if (PINGPONG && wg == 1 && ntiles > 0) wt_turn_pass(1); /* warpgroup 0 goes first */
  for (int t = 0; t < ntiles; t++) {
    const int64_t j0 = t_lo + (int64_t)t * BC;
    const int kb = t % NS;
    if (WT_FED(D, BC) && threadIdx.x == 0 && t + 2 < ntiles)
      wt_load_kv<D, BC>(&feed.m->k, L.ks(), full_k, empty_k, kr, t + 2, feed.j_lo + (t + 2) * BC, feed.hk, feed.bi);
    if (WT_FED(D, BC) && threadIdx.x == 128 && t + 1 < ntiles)
      wt_load_kv<D, BC>(&feed.m->v, L.vs(), full_v, empty_v, vr, t + 1, feed.j_lo + (t + 1) * BC, feed.hk, feed.bi);
    mbar_wait(full_k + 8 * kb, kr.parity(t));
    if (PINGPONG) wt_turn_wait(wg);
    if constexpr (Q_REGS) qk_issue_rs<T, D, BC>(s, qa, L.ks() + kb * KB);
    else qk_issue<T, D, WT_BR, BC>(s, q_base, L.ks() + kb * KB);
    if (t > 0) {
      const int vb = (t - 1) % NS;
      mbar_wait(full_v + 8 * vb, vr.parity(t - 1));
      pv_issue<T, D, BC>(o, pa, L.vs() + vb * KB);
    }
    if (t > 0) wgmma_wait<1>();
    else {
      wgmma_wait<0>();
      FA_TRACE_MARK(2);
    }
    /* the turn passes once S is in (a barrier between the products' issue
     * and this wait made ptxas serialise them); every turn warpgroup 0
     * takes is passed back, but for its last */
    if (PINGPONG) wt_turn_pass(wg, wg == 0 || t + 1 < ntiles);
    wgmma_hold<BC / 2>(&s[0][0]);
    if (lane == 0) mbar_arrive(empty_k + 8 * kb); /* this warp's reads of K(t) are done */

    const bool full = scale_pos && j0 >= all_lo && j0 + BC <= all_hi;
    float alphaA = 1.f, alphaB = 1.f;
    frag_softmax_tile<BC / 8, EXTRAS, false, D == 128, WT_LAZY(D)>(p, b, h, j0, c2, full, r, s, &alphaA, &alphaB);

    wgmma_wait<0>();
    wgmma_hold<D / 2>(&o[0][0]);
    if (t > 0 && lane == 0) mbar_arrive(empty_v + 8 * ((t - 1) % NS));
    if constexpr (WT_LAZY(D)) frag_rescale_moved<D / 8>(o, alphaA, alphaB);
    else frag_rescale<D / 8>(o, alphaA, alphaB);
    p_pack<T, BC>(pa, s);
  }
  FA_TRACE_MARK(3);
  if (q_empty && lane == 0) mbar_arrive(q_empty); /* this warp's reads of Q are done */
  if (ntiles > 0) { /* the last tile's P·V */
    const int vb = (ntiles - 1) % NS;
    mbar_wait(full_v + 8 * vb, vr.parity(ntiles - 1));
    pv_issue<T, D, BC>(o, pa, L.vs() + vb * KB);
    wgmma_wait<0>();
    wgmma_hold<D / 2>(&o[0][0]);
    if (lane == 0) mbar_arrive(empty_v + 8 * vb);
  }
#endif
}

template <typename T, int D, int BC, int EXTRAS, bool PINGPONG, typename PROB = attn_params>
__global__ void __launch_bounds__(wt_threads(D, BC), wt_sm_blocks(D, BC)) attn_wgmma_tma_kernel(const PROB p, const __grid_constant__ wt_maps tm) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  const int v_bad = *p.v_nonfinite; /* see leave_for_fallback */
  extern __shared__ __align__(128) char wt_smem_raw[];
  const wt_layout<D, BC> L(wt_smem_raw);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  asm volatile("griddepcontrol.launch_dependents;"); /* the SIMT guard: as in the persistent form */
  const frag_qtile<T, D, WT_BR> qt(p, blockIdx.x);
  const int64_t bh = qt.bh, b = qt.b, h = qt.h, i0 = qt.i0;
  const attn_keys<PROB, WT_BR, EXTRAS> kept(p, b, h, i0); /* loaded here, used behind the barrier below */
  FA_TRACE_TILE(0);
  FA_TRACE_MARK(0);
  if (tid == 0) wt_init_barriers(L, false);
  int64_t t_lo, t_hi, all_lo, all_hi;
  tile_key_range<WT_BR>(p, b, i0, &t_lo, &t_hi, &all_lo, &all_hi); /* its barrier also publishes the mbarriers */
  kept.narrow(p, &t_lo, &t_hi);
  const int ntiles = (int)((t_hi - t_lo + BC - 1) / BC);
  if (leave_for_fallback(v_bad)) return;

  const wt_feed feed = {&tm, (int)t_lo, (int)(h / (p.Hq / p.Hkv)), (int)b}; /* the copy engine's coordinates: 32-bit */
  if constexpr (WT_FED(D, BC)) { /* no producer: Q and the first tiles here, the rest from the key loop (wt_consume) */
    if (tid == 0) {
      const wt_ring<wt_stages(D, BC)> ring;
      wt_load_q<D>(&tm.q, L.q, L.q_full(), (int)i0, (int)h, feed.bi);
      for (int t = 0; t < 2 && t < ntiles; t++)
        wt_load_kv<D, BC>(&tm.k, L.ks(), L.full_k(), L.empty_k(), ring, t, feed.j_lo + t * BC, feed.hk, feed.bi);
      if (ntiles > 0) wt_load_kv<D, BC>(&tm.v, L.vs(), L.full_v(), L.empty_v(), ring, 0, feed.j_lo, feed.hk, feed.bi);
    }
  } else if (wg == 2) { /* the producer */
    warpgroup_regs_dec<24>();
    if (tid == 2 * 128) {
      const int hk = feed.hk, bi = feed.bi;
      const wt_ring<wt_stages(D, BC)> kr, vr;
      wt_load_q<D>(&tm.q, L.q, L.q_full(), (int)i0, (int)h, bi);
      FA_TRACE_MARK(3);
      if (ntiles > 0) wt_load_kv<D, BC>(&tm.k, L.ks(), L.full_k(), L.empty_k(), kr, 0, (int)t_lo, hk, bi);
      for (int t = 0; t < ntiles; t++) {
        const int j = (int)(t_lo + (int64_t)t * BC);
        if (t + 1 < ntiles) wt_load_kv<D, BC>(&tm.k, L.ks(), L.full_k(), L.empty_k(), kr, t + 1, j + BC, hk, bi);
        wt_load_kv<D, BC>(&tm.v, L.vs(), L.full_v(), L.empty_v(), vr, t, j, hk, bi);
      }
      FA_TRACE_MARK(4);
      FA_TRACE_DUMP();
    }
    return;
  }
  if constexpr (!WT_FED(D, BC)) warpgroup_regs_inc<240>();

  const int rA = warp * 16 + (lane >> 2), rB = rA + 8;
  frag_rows r = frag_rows_start(p, b, i0, rA, rB);
  float o[D / 8][4];
#pragma unroll
  for (int d = 0; d < D / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
  mbar_wait(L.q_full(), 0);
  FA_TRACE_MARK(1);
  wt_consume<T, D, BC, EXTRAS, PINGPONG>(p, b, h, t_lo, all_lo, all_hi, ntiles, L, wt_ring<wt_stages(D, BC)>(),
                                         wt_ring<wt_stages(D, BC)>(), L.q + warpgroup_uniform() * 64 * 128, 0, r, o, feed);
  FA_TRACE_MARK(4);
  note_nonfinite_rows<D / 8>(p, o, r.lA, r.lB);
  /* O leaves through this warpgroup's rows of Q's tile (its products are done) */
  frag_store_staged<T, D, false, true, WT_BR, 128>(p, bh, qt.out(p), qt.lse(p), i0, lane, r, o, L.qs);
  FA_TRACE_MARK(6);
  FA_TRACE_DUMP();
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* The persistent form's n-th query tile of this block, taken by a warp:
 * the block's own first, then from the counter (lane 0 waiting first, for
 * n > 0, on mbarrier go's phase of tile n - 1 where go is not 0), with its
 * key range (tile_range::of_tile, narrowed by the rule), as a slot posts
 * it; tile >= total (and nothing else set) when none is left. */
template <typename T, int D, int BC, int EXTRAS, typename PROB>
static __device__ __forceinline__ wt_slot wt_take_tile(const PROB &p, int *next_tile, int n, int total, int lane,
                                                       uint32_t go) {
  int tile = blockIdx.x;
  if (n > 0 && lane == 0) {
    if (go) mbar_wait(go, (n - 1) & 1);
    tile = (int)gridDim.x + atomicAdd(next_tile, 1);
  }
  tile = __shfl_sync(0xffffffffu, tile, 0);
  if (tile >= total) return wt_slot{tile, 0, 0, 0, 0};
  const frag_qtile<T, D, WT_BR> qt(p, tile);
  const attn_keys<PROB, WT_BR, EXTRAS> kept(p, qt.b, qt.h, qt.i0);
  const tile_range r = tile_range::of_tile<WT_BR>(p, qt.b, qt.i0, lane);
  int64_t t_lo = 0, t_hi = 0;
  r.keys(&t_lo, &t_hi);
  kept.narrow(p, &t_lo, &t_hi);
  return wt_slot{tile, (int)((t_hi - t_lo + BC - 1) / BC), (long long)t_lo, (long long)r.alo, (long long)r.ahi};
}

/* Slot n % 2 of the ring at slots (full and empty: its mbarriers) given
 * sl, once its readers of slot n - 2 are done (the posting thread). */
static __device__ __forceinline__ void wt_post_slot(wt_slot *slots, uint32_t full, uint32_t empty, int n,
                                                    const wt_slot &sl) {
  mbar_wait(empty + 8 * (n & 1), ((n >> 1) & 1) ^ 1);
  slots[n & 1] = sl;
  mbar_arrive(full + 8 * (n & 1));
}

/* Slot n % 2 as its reader gets it (the whole warp: a consumer warp, or
 * the copier under a scheduler), its empty mbarrier told once every lane
 * has read it (one arrival a warp). */
static __device__ __forceinline__ wt_slot wt_read_slot(const wt_slot *slots, uint32_t full, uint32_t empty, int n,
                                                      int lane) {
  mbar_wait(full + 8 * (n & 1), (n >> 1) & 1);
  const wt_slot sl = slots[n & 1];
  __syncwarp();
  if (lane == 0) mbar_arrive(empty + 8 * (n & 1));
  return sl;
}

/* The persistent form's copies of query tile `tile` (its ntiles key tiles
 * from j_lo; the block's n-th), by the copying thread: the first key tile
 * while the consumers finish the last query tile, then Q once they are done
 * with theirs, then the rest.  SCHED: the scheduler warp is told it may take
 * the next tile WT_LEAD key tiles from the end. */
template <typename T, int D, int BC, bool SCHED, typename PROB, bool OT>
static __device__ __forceinline__ void wt_copy_tile(const PROB &p, const wt_maps &tm, const wt_layout<D, BC, OT> &L,
                                                    const wt_ring<wt_stages(D, BC)> &kr, const wt_ring<wt_stages(D, BC)> &vr,
                                                    int tile, int ntiles, int j_lo, int n) {
  const frag_qtile<T, D, WT_BR> qt(p, tile);
  /* 32-bit from here (the copy engine's coordinates are) */
  const int hk = (int)(qt.h / (p.Hq / p.Hkv)), bi = (int)qt.b, go_at = ntiles > WT_LEAD ? ntiles - WT_LEAD : 0;
  if (SCHED && ntiles == 0) mbar_arrive(L.sched_go());
  if (ntiles > 0) wt_load_kv<D, BC>(&tm.k, L.ks(), L.full_k(), L.empty_k(), kr, 0, j_lo, hk, bi);
  mbar_wait(L.q_empty(), (n & 1) ^ 1);
  wt_load_q<D>(&tm.q, L.q, L.q_full(), (int)qt.i0, (int)qt.h, bi);
  FA_TRACE_MARK(3);
  for (int t = 0; t < ntiles; t++) {
    if (SCHED && t == go_at) mbar_arrive(L.sched_go()); /* the scheduler may take the next tile */
    if (t + 1 < ntiles) wt_load_kv<D, BC>(&tm.k, L.ks(), L.full_k(), L.empty_k(), kr, t + 1, j_lo + (t + 1) * BC, hk, bi);
    wt_load_kv<D, BC>(&tm.v, L.vs(), L.full_v(), L.empty_v(), vr, t, j_lo + t * BC, hk, bi);
  }
  FA_TRACE_MARK(4);
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
/* A warp's 16 rows of O / l (rows row0.. of query tile qt) and their lse,
 * through its rows of O's tile (sw128, as frag_store_staged stages them) and
 * out by the copy engine: lane 0 issues a bulk tensor store a 64-column box,
 * and the warp goes on to its next query tile without waiting for the
 * writes.  Before it writes the tile's rows again, lane 0 waits for its last
 * stores to have read them (long done by then: a query tile later).  With
 * the threads' 16-byte stores instead (frag_store_staged), a query tile's
 * epilogue was 2.5k cycles at D = 128 (docs/perf/README.md, session 39). */
template <typename T, int D>
static __device__ __forceinline__ void wt_store_o(const attn_params &p, const wt_maps &tm, const frag_qtile<T, D, WT_BR> &qt,
                                                  int lane, frag_rows &r, float (*o)[4], char *tile) {
  const uint32_t tile_addr = smem_addr(tile);
  const int row0 = (threadIdx.x >> 5) * 16; /* the warp's rows of the tile */
  float invA, invB;
  frag_finish<false>(r, &invA, &invB);
  if (lane == 0) tma_store_wait<true>();
  __syncwarp();
  frag_stage<T, D, true, WT_BR>(tile, row0 + (lane >> 2), (lane & 3) * 2, o, invA, invB);
  tma_store_fence();
  __syncwarp();
  FA_TRACE_MARK(7);
  if (lane == 0) {
#pragma unroll
    for (int c = 0; c < D / 64; c++)
      tma_store_4d(&tm.o, tile_addr + c * WT_BR * 128 + row0 * 128, c * 64, (int)qt.i0 + row0, (int)qt.h, (int)qt.b);
    tma_store_commit();
  }
  frag_lse_store<false>(p, qt.bh, qt.lse(p), lane, r);
}
#endif

/* The persistent form: a block an SM, walking query tiles.  The
 * producer warp takes tiles from a counter (the longest first, in
 * frag_qtile's order: whichever block is free takes the next), finds the
 * tile's key range (tile_range::of_tile: its first and last rows, or all
 * of them), and posts {tile, range} in a ring of two slots (wt_slot,
 * full/empty mbarriers) ahead of the consumers (with wt_scheduler, a second
 * warp of the producer's warpgroup does this, and the first reads the
 * slots too); it
 * loads tile n + 1's first key tile while the consumers finish tile n, and
 * its Q once they are past their last S = Q·Kᵀ (q_empty), so that a
 * tile's start waits for no copy.  Each query tile's keys and values start
 * at the rings' first buffers (wt_ring).  With key tiles of 128 at
 * D = 128, O leaves through a tile of its own (wt_o_tile; Q's, through
 * which the one-tile form stages it, is the next tile's by then), each
 * warp staging its 16 rows and the copy engine writing them (wt_store_o):
 * no barrier between the consumers, and the last value tile goes back at
 * once.  Written by the threads from the tile (16 bytes a thread), the
 * document variant at L = 4096 ran 3 % slower, the built-in rules 0.98-1.02 x
 * (H200, 2026-12-01, docs/perf/2026-12-01-o-tma-store-h200.json).  Through that value tile's buffer
 * instead (both warpgroups past their last P·V at a barrier, then the
 * buffer given back) it ran 2-7 % slower at L = 512 and 2-4 % at 1024
 * (H200, 2026-11-30,
 * docs/perf/2026-11-30-forward-o-tile-h200.json).  Written from the
 * fragments (32 4-byte stores a thread, 8 rows an instruction), the
 * epilogue took 6.8k of the 37.5k cycles of a query tile at L = 1024;
 * staged, 2.5k (H200, clock64 marks of block 0, D = 128, in a build that
 * printed them from the kernel and so serialised its products): +3-12 % at
 * L = 1024, +2-5 % at 2048-4096 with tiles of 128.  With tiles of 176 the
 * same was 2-3 % slower over the grid at 2048-4096 (though block 0's
 * query tiles took 3 % less time): they keep the fragments' stores (no
 * room for a tile of O beside rings of 176). */

template <typename T, int D, int BC, int EXTRAS, typename PROB = attn_params>
__global__ void __launch_bounds__(wt_threads(128, 128), 1)
    attn_wgmma_tma_persistent_kernel(const PROB p, const __grid_constant__ wt_maps tm, int *next_tile) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!WT_FED(D, BC), "the persistent form has a producer warpgroup");
  constexpr bool OT = wt_o_tile(D, BC), SCHED = wt_scheduler(D, EXTRAS);
  const int v_bad = *p.v_nonfinite; /* see leave_for_fallback */
  extern __shared__ __align__(128) char wt_smem_raw[];
  const wt_layout<D, BC, OT> L(wt_smem_raw);
  wt_slot *slots = L.slots();
  const uint32_t slot_full = L.slot_full(), slot_empty = L.slot_empty();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, wg = warp >> 2;
  const int qtiles = (int)((p.Lq + WT_BR - 1) / WT_BR), total = (int)(p.B * p.Hq) * qtiles;
  /* the SIMT guard behind it (a programmatic dependent launch: launch_tiled)
   * may be placed now; its blocks take an SM as this kernel's blocks leave
   * it, and wait there for this grid's end and memory */
  asm volatile("griddepcontrol.launch_dependents;");
  if (tid == 0) wt_init_barriers(L, true, SCHED);
  if (leave_for_fallback(v_bad)) return; /* its barrier also publishes the mbarriers */

  if (wg == 2) { /* the producer: its first warp copies; with SCHED its second takes the tiles */
    warpgroup_regs_dec<40>(); /* its tile loop spilled with 24 */
    if (SCHED && warp == 9) { /* tile n + 1 taken once the copier is WT_LEAD key tiles from the end of tile n */
      for (int n = 0;; n++) {
        const wt_slot sl = wt_take_tile<T, D, BC, EXTRAS>(p, next_tile, n, total, lane, L.sched_go());
        if (lane == 0) wt_post_slot(slots, slot_full, slot_empty, n, sl);
        if (sl.tile >= total) return; /* the copier and the consumers stop too */
        __syncwarp();
      }
    }
    if (warp != 8) return;
    wt_ring<wt_stages(D, BC)> kr, vr;
    for (int n = 0;; n++) {
      FA_TRACE_TILE(n);
      FA_TRACE_MARK(0);
      int ntiles;
      if constexpr (SCHED) { /* the scheduler's slot */
        const wt_slot sl = wt_read_slot(slots, slot_full, slot_empty, n, lane);
        FA_TRACE_MARK(1);
        if (sl.tile >= total) break;
        ntiles = sl.ntiles;
        if (lane == 0) wt_copy_tile<T, D, BC, true>(p, tm, L, kr, vr, sl.tile, ntiles, (int)sl.t_lo, n);
      } else {
        const wt_slot sl = wt_take_tile<T, D, BC, EXTRAS>(p, next_tile, n, total, lane, 0);
        FA_TRACE_MARK(1);
        if (sl.tile >= total) { /* no tile left: the consumers stop too */
          if (lane == 0) wt_post_slot(slots, slot_full, slot_empty, n, sl);
          break;
        }
        ntiles = sl.ntiles;
        if (lane == 0) {
          wt_post_slot(slots, slot_full, slot_empty, n, sl);
          FA_TRACE_MARK(2);
          wt_copy_tile<T, D, BC, false>(p, tm, L, kr, vr, sl.tile, ntiles, (int)sl.t_lo, n);
        }
      }
      kr.advance(ntiles), vr.advance(ntiles);
      __syncwarp();
    }
    FA_TRACE_DUMP();
    return;
  }
  warpgroup_regs_inc<232>(); /* 128 · 40 + 256 · 232: the 168 a thread of the launch */
  const wt_layout<D, BC, OT> LC = L.at(wt_base_held(D, BC, EXTRAS) ? v_bad : 0); /* v_bad is 0 here */
  wt_slot *const cslots = LC.slots();
  const uint32_t cslot_full = LC.slot_full(), cslot_empty = LC.slot_empty();

  const int rA = warp * 16 + (lane >> 2), rB = rA + 8;
  const uint32_t q_base = LC.q + warpgroup_uniform() * 64 * 128; /* this warpgroup's 64 rows */
  wt_ring<wt_stages(D, BC)> kr, vr;
  for (int n = 0;; n++) {
    const wt_slot slot = wt_read_slot(cslots, cslot_full, cslot_empty, n, lane);
    FA_TRACE_TILE(n);
    FA_TRACE_MARK(0);
    if (slot.tile >= total) {
      if (OT && lane == 0) tma_store_wait<false>(); /* the last tile's stores done */
      FA_TRACE_DUMP();
      return;
    }
    const frag_qtile<T, D, WT_BR> qt(p, slot.tile);
    const int ntiles = slot.ntiles;
    frag_rows r = frag_rows_start(p, qt.b, qt.i0, rA, rB);
    float o[D / 8][4];
#pragma unroll
    for (int d = 0; d < D / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    mbar_wait(LC.q_full(), n & 1);
    FA_TRACE_MARK(1);
    /* no turns at the tensor cores: at D = 64 they took 1.08-1.13 x the time (H100, 2026-12-07,
     * docs/perf/2026-12-07-forward-d64-turns-tried-h100.json): two warps' softmaxes side by side on a
     * sub-partition hide each other's latencies, one alone does not */
    wt_consume<T, D, BC, EXTRAS, false>(p, qt.b, qt.h, slot.t_lo, slot.all_lo, slot.all_hi, ntiles, LC, kr, vr, q_base,
                                        LC.q_empty(), r, o);
    kr.advance(ntiles), vr.advance(ntiles);
    FA_TRACE_MARK(4);
    note_nonfinite_rows<D / 8>(p, o, r.lA, r.lB);
    FA_TRACE_MARK(5);
    if constexpr (OT) /* each warp its own rows of O's tile: no barrier, and no buffer to give back */
      wt_store_o<T, D>(p, tm, qt, lane, r, o, LC.o_tile());
    else
      frag_store<T, D, false>(p, qt.bh, qt.out(p), qt.lse(p), lane, r, o);
    FA_TRACE_MARK(6);
  }
#endif
}

#endif
