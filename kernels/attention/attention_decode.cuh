/* Decoding (API §8): a few query rows against a long cache of keys, read
 * once at the memory bandwidth.  The seeds' merge formula is the schedule:
 *
 *  - the query heads that share a key/value head and all Lq query rows
 *    are packed into one tile of G·Lq rows (GQA packing: K and V are read
 *    once for all of them), 16 rows a warp's mma.sync A fragment; more
 *    than 64 such rows (Lq up to 16) take blocks of 64 (decode_row_blocks);
 *  - the keys that any row attends are cut into `splits` chunks of whole
 *    64-key tiles, one thread block a (batch, key head, chunk): enough
 *    blocks to fill the GPU even at batch 1;
 *  - a block's warps split its key tiles (the 4 warps each take 16, 32 or
 *    64 keys of every tile, as the row groups allow) and merge their
 *    states through shared memory at the end;
 *  - each chunk writes its normalised output and lse (f32), and a merge
 *    kernel combines the chunks with the rescale formula (one chunk: the
 *    block writes the output itself).
 * Key and value tiles arrive by cp.async, three tiles deep, straight from
 * the contiguous (any strides, API §6) or paged (a page table, the KV
 * cache) layout, under L2's evict-first policy where the stream is short
 * (decode_evict_first).  Tiles of 33-64 packed rows are multiplied by
 * warpgroup MMA on Hopper (dec_wgmma).  Every score rule of §2 applies through the tensor-core
 * kernels' fragment code (attention_frag.cuh).  D = 64 and 128; D = 256
 * (Gemma's) at up to 32 packed rows, Q's fragments read from shared memory
 * (dec_q_shared): 2.2x as fast as the prefill kernels at 32k keys, B = 4,
 * 16 query heads on 8, and through the paged cache 2.3-3.6x as fast as the
 * gather it took before (H200, docs/perf/2026-12-04-decode-d256-h200.json).
 *
 * NaN or inf in V: a masked key's weight is 0, and 0 · NaN = NaN on the
 * tensor cores would reach rows that never attend it.  A block whose O
 * holds NaN or inf at the end of its chunk (the only way such a V shows)
 * reads the chunk a second time with every P·V a scalar product that
 * skips zero weights: exact, and NaN or inf in q or k, or in V at an
 * attended key, come out as they did.  This replaced a check of every V
 * tile; with it gone and O's rescale skipped where no row's maximum rose,
 * the kernel executes 34 % fewer instructions (B = 8, Lk = 128k) and
 * calls from 32k keys take 0.4-1.8 % less time (H200,
 * docs/perf/2026-12-01-decode-v-check-late-h200.json). */
#ifndef FA_ATTENTION_DECODE_CUH
#define FA_ATTENTION_DECODE_CUH

#include "attention_frag.cuh"
#include "attention_registry.h"
#include "attention_wgmma.cuh"
#include "mma_sync.cuh"

#include <cstdio>
#include <cstring>

#define DEC_WARPS 4
#define DEC_THREADS (DEC_WARPS * 32)
#define DEC_BC 64    /* keys a tile */
#define DEC_STAGES 3 /* tiles in flight */
#define DEC_MAX_SPLITS 256
#define DEC_ROWS 64 /* packed rows a block: four row groups of 16 */
/* Where K and V come from (the kernel's PG): contiguous (any strides), a
 * page table read a row at a time (any page size), or a page-table entry a
 * run of DEC_RUN rows (pages a multiple of DEC_RUN: 16, 32, 256, ...), so
 * that a thread copies a run's rows from one offset.  Row by row, the paged
 * instance executed 1.41x the contiguous one's instructions where blocks are
 * issue-bound (splits = 1; H200, docs/perf/2026-12-04-decode-paged-ncu-h200.json) */
#define DEC_CONTIG 0
#define DEC_PAGED_ROWS 1
#define DEC_PAGED_RUNS 2
#define DEC_RUN 16

/* Four row groups (33-64 packed rows: Lq = 16 at G = 4, say) on Hopper: one
 * warpgroup MMA (wgmma) a product over the whole tile, K and V read from
 * shared memory once for the four warps' rows, where mma.sync has each
 * warp read them whole (4x the shared-memory traffic; Lq = 16 took 1.30 to
 * 1.43x the time of Lq = 1 at B = 8, H200).  The tiles are then in
 * wgmma's layout (sw128, 1024-byte aligned); the sm_80 PTX keeps mma.sync. */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DEC_WGMMA_BUILD 1
#else
#define DEC_WGMMA_BUILD 0
#endif
template <int RG> static __host__ __device__ constexpr bool dec_wgmma() { return RG == 4 && DEC_WGMMA_BUILD; }
/* D = 256: Q's fragments from shared memory (a tile of 16 rows a row
 * group after the K and V tiles), not held in registers: O's 128 floats a
 * thread beside Q's 64 registers spilled 200-1000 bytes a thread */
static __host__ __device__ constexpr bool dec_q_shared(int D) { return D > 128; }
/* shared memory of an instance: the tiles, plus the alignment wgmma needs
 * (the host reserves it for every four-group instance), plus Q's tile */
static inline size_t dec_smem_bytes(int D, int rg) {
  return (size_t)DEC_STAGES * 2 * DEC_BC * D * 2 + (rg == 4 ? 1024 : 0) + (dec_q_shared(D) ? (size_t)rg * 16 * D * 2 : 0);
}

/* Byte offset of 16-byte chunk `chunk` of key row `row` in a tile. */
template <int D, bool WG> static __device__ __forceinline__ int dec_at(int row, int chunk) {
  return WG ? sw128<DEC_BC>(row, chunk) : swz<D / 8>(row, chunk);
}

/* What a launch adds to the problem: the packing, the chunks, where the
 * chunks' states go, and the page table (paged: k and v are the pools). */
struct decode_args {
  int G, rows, splits;   /* query heads a key head; G·Lq packed rows; chunks */
  int row_blocks;        /* blocks of DEC_ROWS packed rows (more than DEC_ROWS: decode_row_blocks) */
  float *part_o, *part_lse; /* splits > 1: (splits, B, Hq, Lq, Dv) and (splits, B, Hq, Lq) */
  fa_attn_paging pg;
  int pg_shift;    /* log2 of a page size that is a power of two, else -1 */
  int evict_first; /* K and V under L2's evict-first policy (decode_evict_first) */
  /* the sequences' lengths (the call's kv_lens; paged: the cache's) from the host, where it has them and the
   * batch is at most FA_KV_LENS_INLINE, in place of a device copy: at B = 1, 4k keys a contiguous call with
   * kv_lens took 1.13x the time of one without (the copy's launch before it, then a read before any other in
   * each block), now 1.00x; the paged calls were no faster for it (H200, scripts/probe_paged_rows.lua) */
  int lens_inline;
  int64_t lens[FA_KV_LENS_INLINE];
};

/* Paged: the key of row `row` of tile u of a chunk that starts at key kb
 * (the row whose table entry thread ent < ENTRIES fetches: every RPE-th). */
static __device__ __forceinline__ int64_t dec_tile_key(int64_t kb, int u, int row) {
  return kb + (int64_t)u * DEC_BC + row;
}
/* Paged: key j's page-table slot, j / page_size (a shift for pages of a
 * power of two, else a 32-bit division: keys and page sizes are under 2^31
 * where the decode kernel reads a cache, fa_kv_cache_attend; a 64-bit one
 * is a long subroutine). */
static __device__ __forceinline__ int64_t dec_page_slot(const decode_args &a, int64_t j) {
  return a.pg_shift >= 0 ? j >> a.pg_shift : (int64_t)((uint32_t)j / (uint32_t)a.pg.page_size);
}
/* The element offset of key j in the pools (the same in K's and V's:
 * D = Dv): page `page` (the table's entry at dec_page_slot), row
 * j % page_size. */
static __device__ __forceinline__ int64_t dec_page_offset(const fa_attn_problem &p, const decode_args &a, int32_t page,
                                                          int64_t j) {
  return (int64_t)page * a.pg.k_page + (j - dec_page_slot(a, j) * a.pg.page_size) * p.k_st.s;
}

/* Row r's 16 bytes at `chunk` of K and of V into the tiles (in: the row is
 * before the end; else zeros, nothing read from ks or vs, a valid address). */
template <int D, bool WG, bool EVICT>
static __device__ __forceinline__ void dec_copy_row(char *kt, char *vt, int r, int chunk, const void *ks, const void *vs,
                                                    bool in, uint64_t policy) {
  if (EVICT) {
    cp_async16_policy(kt + dec_at<D, WG>(r, chunk), ks, in ? 16 : 0, policy);
    cp_async16_policy(vt + dec_at<D, WG>(r, chunk), vs, in ? 16 : 0, policy);
  } else {
    cp_async16(kt + dec_at<D, WG>(r, chunk), ks, in ? 16 : 0);
    cp_async16(vt + dec_at<D, WG>(r, chunk), vs, in ? 16 : 0);
  }
}
/* Keys [j0, j0 + DEC_BC) of one key head into the K and V tiles (swizzled
 * rows of D elements), rows at or past `end` zero-filled.  Contiguous: row
 * j at kb + j·ld, a thread's rows STEP apart (one multiply a tile, then
 * steps); paged: at kb + rowoff[j - j0] (dec_page_offset, made a tile
 * ahead so that the table's latency is not the copies').  EVICT: under
 * L2's evict-first policy (a template argument, so that the choice is one
 * branch a tile, not one a copy: the Lq = 16 kernel is bound by its
 * instruction count).  FULL: every row of the tile is before `end` (all
 * but a chunk's last tile), so no row's test, pointer choice or byte count
 * is made: a third of a tile's instructions were the copies'.  Taken by
 * the contiguous LEAN instances (attn_decode_kernel): Lq = 16 took
 * 0.98-0.995x the time with it, Lq = 1 and 4 the same, and the paged
 * instances of a row an entry 1.04-1.05x at 4k keys (H200,
 * docs/perf/2026-12-02-decode-full-tiles-h200.json); and by the paged
 * instances of a run an entry (DEC_PAGED_RUNS). */
template <typename T, int D, int PG, bool WG, bool EVICT, bool FULL>
static __device__ __forceinline__ void dec_copy(char *kt, char *vt, const fa_attn_problem &p, const T *kb, const T *vb,
                                                const int64_t *rowoff, int64_t j0, int64_t end) {
  constexpr bool PAGED = PG != DEC_CONTIG;
  const int CH = D / 8, STEP = DEC_THREADS / CH;
  const int chunk = threadIdx.x % CH, row0 = threadIdx.x / CH;
  /* (a policy of evict_normal made by createpolicy was an illegal
   * instruction on an H100: the default is the copy without a hint) */
  const uint64_t policy = EVICT ? l2_evict_first_policy() : 0;
  kb += chunk * 8, vb += chunk * 8;
  if constexpr (PG == DEC_PAGED_RUNS) {
    /* a thread's rows of run g: row0 + m·STEP (STEP divides DEC_RUN), from one offset.  The runs' offsets are
     * read before the first copy: cp.async writes shared memory, so each read between copies was made again
     * (and fenced by ptxas) for each row */
    constexpr int NR = DEC_BC / DEC_RUN, PER = DEC_RUN / STEP;
    static_assert(DEC_RUN % STEP == 0, "a thread's rows of a run: one page entry a run");
    int64_t ro[NR];
#pragma unroll
    for (int g = 0; g < NR; g++) ro[g] = rowoff[g];
    const int64_t s = p.k_st.s, in0 = row0 * s;
#pragma unroll
    for (int g = 0; g < NR; g++) {
      const T *kg = kb + (ro[g] + in0), *vg = vb + (ro[g] + in0);
#pragma unroll
      for (int m = 0; m < PER; m++) {
        const int r = g * DEC_RUN + row0 + m * STEP;
        const bool in = FULL || j0 + r < end;
        dec_copy_row<D, WG, EVICT>(kt, vt, r, chunk, in ? kg + m * STEP * s : kb, in ? vg + m * STEP * s : vb, in,
                                   policy);
      }
    }
    return;
  }
  const T *kr = PAGED ? kb : kb + (j0 + row0) * p.k_st.s, *vr = PAGED ? vb : vb + (j0 + row0) * p.v_st.s;
  const int64_t kstep = PAGED ? 0 : STEP * p.k_st.s, vstep = PAGED ? 0 : STEP * p.v_st.s;
#pragma unroll
  for (int it = 0; it < DEC_BC / STEP; it++) {
    const int r = row0 + it * STEP;
    const bool in = FULL || j0 + r < end;
    const T *ks = kb, *vs = vb; /* rows past the end: a valid address, nothing read */
    if (in) {
      if (PAGED) ks += rowoff[r], vs += rowoff[r];
      else ks = kr, vs = vr;
    }
    dec_copy_row<D, WG, EVICT>(kt, vt, r, chunk, ks, vs, in, policy);
    if (!PAGED) kr += kstep, vr += vstep;
  }
}
template <typename T, int D, int PG, bool WG, bool LEAN>
static __device__ __forceinline__ void dec_load(char *kt, char *vt, const fa_attn_problem &p, const decode_args &a,
                                                const T *kb, const T *vb, const int64_t *rowoff, int64_t j0, int64_t end) {
  const bool full = (PG == DEC_PAGED_RUNS || (LEAN && PG == DEC_CONTIG)) && j0 + DEC_BC <= end;
  /* the wgmma instances at D = 128 that copy a row a page entry copy without the evict-first hint: in them
   * ptxas (CUDA 13.0) read the hint's cache policy, and the tile's shared address, from uniform registers
   * that nothing set (an illegal instruction on the device, for every call that reached those copies: pages
   * not a multiple of 16 positions with 33 or more packed rows; scripts/sass_uniform_check.py finds it) */
  constexpr bool EVICT_OK = !(PG == DEC_PAGED_ROWS && D == 128 && WG);
  if (EVICT_OK && a.evict_first) {
    if (full) dec_copy<T, D, PG, WG, true, true>(kt, vt, p, kb, vb, rowoff, j0, end);
    else dec_copy<T, D, PG, WG, true, false>(kt, vt, p, kb, vb, rowoff, j0, end);
  } else if (full) {
    dec_copy<T, D, PG, WG, false, true>(kt, vt, p, kb, vb, rowoff, j0, end);
  } else {
    dec_copy<T, D, PG, WG, false, false>(kt, vt, p, kb, vb, rowoff, j0, end);
  }
}

/* O += P·V for 16 keys (rows kr..kr+15 of the V tile) one key at a time,
 * skipping zero weights: the exact product of the rare second pass over a
 * chunk whose O came out NaN or inf (NaN or inf in V).  s holds P (f32) in the accumulator layout, keys n·8 + c2 (+1)
 * of chunks 2kk and 2kk + 1. */
template <typename T, int D, bool WG>
static __device__ __forceinline__ void dec_pv_exact(float (*o)[4], const float (*s)[4], int kk, const char *vt, int kr,
                                                    int lane) {
  const int c2 = (lane & 3) * 2;
#pragma unroll
  for (int jj = 0; jj < 16; jj++) {
    const int src = (lane & ~3) | ((jj & 7) >> 1), n = 2 * kk + (jj >> 3), e = jj & 1;
    const float pA = __shfl_sync(0xffffffffu, s[n][e], src), pB = __shfl_sync(0xffffffffu, s[n][2 + e], src);
#pragma unroll
    for (int d = 0; d < D / 8; d++) {
      const T *v2 = (const T *)(vt + dec_at<D, WG>(kr + jj, d)) + c2;
      const float v0 = to_float(v2[0]), v1 = to_float(v2[1]);
      if (pA != 0.f) o[d][0] = fmaf(pA, v0, o[d][0]), o[d][1] = fmaf(pA, v1, o[d][1]);
      if (pB != 0.f) o[d][2] = fmaf(pB, v0, o[d][2]), o[d][3] = fmaf(pB, v1, o[d][3]);
    }
  }
}

#if DEC_WGMMA_BUILD
/* wgmma: a tile's shared address, warp-uniform (warp_uniform: from
 * t % DEC_STAGES in a per-thread register, each of a tile's 12 descriptors
 * at D = 128 came back by two R2UR). */
static __device__ __forceinline__ uint32_t dec_tile_addr(const char *tile) { return warp_uniform(smem_addr(tile)); }
/* wgmma: the P·V in flight done, O's registers free to read. */
template <int D> static __device__ __forceinline__ void dec_pv_done(float (*o)[4]) {
  wgmma_wait<0>();
  wgmma_hold<D / 2>(&o[0][0]);
}
#endif

/* One (batch, key head, row block, chunk) a block.  RG row groups of 16
 * packed rows (G·Lq <= 16·RG, or the row block's DEC_ROWS: RG = 4); warp
 * w takes row group w % RG and the keys
 * [w / RG · 8NC, ...) of every tile. */
template <typename T, int D, int RG, int EXTRAS, int PG>
__global__ void __launch_bounds__(DEC_THREADS)
    attn_decode_kernel(fa_attn_problem call, const __grid_constant__ decode_args a) {
  const int KS = DEC_WARPS / RG, NC = DEC_BC / KS / 8, TILE = DEC_BC * D * 2;
  constexpr bool PAGED = PG != DEC_CONTIG, RUNS = PG == DEC_PAGED_RUNS;
  constexpr int RPE = RUNS ? DEC_RUN : 1, ENTRIES = DEC_BC / RPE; /* a tile's rows a page-table entry; its entries */
  constexpr bool WG = dec_wgmma<RG>();
  /* the plain wgmma instances (Lq = 16 and the like): S issued before the next tile's copies, P·V waited for at
   * the next tile's top, full tiles copied without a row's test (dec_load).  In turns against the code before
   * (H200, docs/perf/2026-12-02-decode-lean-h200.json): Lq = 16 0.97-0.99x the time, the rest the same;
   * not the masked ones (window, alibi, softcap, a mask), where ptxas then spilled (120 bytes a thread paged at
   * D = 128, 32 at D = 64; the plain ones spill less than before: 8 bytes at D = 128 against 48) */
  constexpr bool LEAN = WG && EXTRAS == EXTRAS_NONE;
  extern __shared__ __align__(128) char dec_smem_raw[];
  /* wgmma's swizzle is computed on address bits: 1024-byte aligned tiles */
  char *const dec_smem = WG ? dec_smem_raw + ((1024 - (smem_addr(dec_smem_raw) & 1023)) & 1023) : dec_smem_raw;
  __shared__ int64_t sh_keys[4]; /* the union and the intersection of the rows' key ranges */
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, rg = warp % RG, ks = warp / RG;
  /* the row blocks of a chunk adjacent (rblk the fastest index), so that they run together and all but the
   * first read the chunk's K and V from L2 */
  /* (the indices here in 32 bits: a grid is under 2^31 blocks, and a 64-bit division is a long subroutine in
   * code that runs once a block, fetched into a cold instruction cache) */
  const unsigned blk = blockIdx.x, nrb = (unsigned)a.row_blocks, nsp = (unsigned)a.splits, bku = blk / nrb / nsp;
  const int64_t rblk = blk % nrb, split = blk / nrb % nsp, b = bku / (unsigned)call.Hkv, hk = bku % (unsigned)call.Hkv;
  /* a cache's sequence is a call of its own length: causal, window and
   * alibi count from its end (API §8) */
  fa_attn_problem p = call;
  const int64_t *lens = a.lens_inline ? a.lens : call.kv_lens; /* (a __grid_constant__ parameter: read in place) */
  if (PAGED) p.Lk = lens[b], p.kv_lens = NULL;
  else p.kv_lens = lens;

  if (tid == 0) { /* every packed row's query index appears: the ranges of rows 0..Lq-1 */
    int64_t ulo = INT64_MAX, uhi = 0, ilo = 0, ihi = INT64_MAX;
    for (int64_t i = 0; i < p.Lq; i++) {
      int64_t lo, hi;
      fa_attn_range_of(&p, b, i, &lo, &hi);
      if (lo < hi) ulo = min(ulo, lo), uhi = max(uhi, hi);
      ilo = max(ilo, lo), ihi = min(ihi, hi);
    }
    if (ulo >= uhi) ulo = uhi = 0;
    if (RUNS) ulo -= ulo % DEC_RUN; /* runs start on a page's run (the keys before lo are masked by the rows' ranges) */
    sh_keys[0] = ulo, sh_keys[1] = uhi, sh_keys[2] = ilo, sh_keys[3] = ihi;
  }
  __syncthreads();
  /* this chunk's keys [kb, ke): whole tiles of the union, split evenly */
  const int64_t ulo = sh_keys[0], uhi = sh_keys[1];
  const int64_t tiles = (uhi - ulo + DEC_BC - 1) / DEC_BC, per = ((unsigned)tiles + nsp - 1) / nsp; /* tiles < 2^26 */
  const int64_t kb = ulo + split * per * DEC_BC, ke = min(uhi, kb + per * DEC_BC);
  const int ntiles = ke > kb ? (int)((ke - kb + DEC_BC - 1) / DEC_BC) : 0;
  const int64_t all_lo = max(sh_keys[2], kb), all_hi = min(sh_keys[3], ke); /* keys every row attends */

  const T *kbase = (const T *)p.k + (PAGED ? hk * p.k_st.h : attn_at(p.k_st, b, hk, 0));
  const T *vbase = (const T *)p.v + (PAGED ? hk * p.v_st.h : attn_at(p.v_st, b, hk, 0));
  /* paged: the offset of tile u's row e·RPE (RUNS: the start of run e) in
   * rowoff[u % 4][e], made by thread ent = e at the end of the iteration
   * before the one that copies the tile (the first three here), from the
   * table's entry that thread fetched into page[u % 4][e] by cp.async with
   * the tiles two iterations earlier: no thread waits for a read of the table.  Read within the
   * iteration, it held pages of 16 at 1.09-1.17 x the contiguous call's
   * time (now 1.02-1.04; H200, docs/perf/2026-12-01-decode-paged-table-ahead-h200.json) */
  __shared__ int64_t rowoff[PAGED ? 4 : 1][DEC_BC];
  __shared__ int32_t page[PAGED ? 4 : 1][DEC_BC];
  const int32_t *table = PAGED ? a.pg.table + b * a.pg.max_pages : NULL;
  /* RUNS: a tile's four entries one a warp (entry ent < ENTRIES: lane ent / DEC_WARPS of warp ent % DEC_WARPS),
   * since every warp waits at the next barrier for the slowest: with them in the first warp, barrier stalls were
   * 0.69 an issued instruction against 0.09 contiguous (H200, splits = 1; now 0.08).  A row an entry: the first
   * two warps (spread over four, the calls took 1.04x the time) */
  const int ent = RUNS ? lane * DEC_WARPS + warp : tid;
  /* thread ent < ENTRIES: tile u's entry of row ent · RPE into page[u % 4] */
  auto fetch_page = [&](int u) {
    const int64_t j = dec_tile_key(kb, u, ent * RPE);
    cp_async4(&page[u % 4][ent], j < ke ? table + dec_page_slot(a, j) : table, j < ke ? 4 : 0);
  };
  /* the warp's two packed rows (of the block's DEC_ROWS from rblk's on):
   * query row i of head h (a row past G·Lq has i = Lq: no keys, never stored) */
  const int g = lane >> 2, c2 = (lane & 3) * 2;
  const int rA = (int)rblk * DEC_ROWS + rg * 16 + g, rB = rA + 8;
  const bool okA = rA < a.rows, okB = rB < a.rows;
  const unsigned Lq = (unsigned)p.Lq; /* at most 64 (fa_cuda_attention_decode_fit) */
  const int64_t hA = hk * a.G + (okA ? (unsigned)rA / Lq : 0), hB = hk * a.G + (okB ? (unsigned)rB / Lq : 0);
  frag_rows r = {okA ? (unsigned)rA % Lq : Lq, okB ? (unsigned)rB % Lq : Lq, 0, 0, 0, 0, -INFINITY, -INFINITY, 0.f,
                 0.f};
  if (okA) fa_attn_range_of(&p, b, r.iA, &r.loA, &r.hiA);
  if (okB) fa_attn_range_of(&p, b, r.iB, &r.loB, &r.hiB);
  /* clipped to the chunk, never below lo: an empty range past the chunk (kv_lens with a window's
   * left side) made hi < lo, and frag_cols_of's count negative, which the unsigned range test took
   * for every key */
  r.loA = max(r.loA, kb), r.hiA = max(min(r.hiA, ke), r.loA);
  r.loB = max(r.loB, kb), r.hiB = max(min(r.hiB, ke), r.loB);
  constexpr bool QSM = dec_q_shared(D);
  uint32_t qf[QSM ? 1 : D / 16][4]; /* Q as mma A fragments, straight from memory (a few rows) */
  char *const qs = dec_smem + DEC_STAGES * 2 * TILE + rg * 16 * D * 2; /* QSM: the row group's Q tile */
  float o[D / 8][4];
  uint32_t pv_a[WG ? NC / 2 : 1][4]; /* wgmma: P as A fragments (LEAN: read by a P·V in flight past its tile) */
  (void)pv_a;
  const bool scale_pos = frag_scale_positive(p);
  const int kw = ks * NC * 8; /* the warp's first key in a tile */

  /* pass 0 multiplies every tile on the tensor cores; a second pass, only
   * where pass 0 left NaN or inf in O, reads the chunk again with every
   * P·V the exact product (the header's NaN or inf in V) */
  for (int pass = 0;; pass++) {
    if (PAGED && ent < ENTRIES) {
      /* the first tiles' entries all read before any offset is stored: a store to shared memory between them
       * (the compiler cannot tell it from the table) kept each read waiting for the one before */
      int32_t first[DEC_STAGES];
      int64_t js[DEC_STAGES];
#pragma unroll
      for (int u = 0; u < DEC_STAGES; u++) {
        js[u] = dec_tile_key(kb, u, ent * RPE);
        first[u] = u < ntiles && js[u] < ke ? __ldg(table + dec_page_slot(a, js[u])) : 0;
      }
#pragma unroll
      for (int u = 0; u < DEC_STAGES; u++)
        if (u < ntiles) rowoff[u][ent] = js[u] < ke ? dec_page_offset(p, a, first[u], js[u]) : 0;
      for (int u = DEC_STAGES; u < DEC_STAGES + 2 && u < ntiles; u++) fetch_page(u); /* with tile 0's copies */
    }
    if (PAGED) __syncthreads();
#pragma unroll /* (as a loop, ptxas left the evict-first copies' cache policy in an unset uniform register: an
                * illegal instruction, as in docs/perf/2026-12-01-decode-stream-tried-h200.json) */
    for (int st = 0; st < DEC_STAGES - 1; st++) {
      if (st < ntiles)
        dec_load<T, D, PG, WG, LEAN>(dec_smem + st * 2 * TILE, dec_smem + st * 2 * TILE + TILE, p, a, kbase,
                                        vbase, rowoff[PAGED ? st : 0], kb + st * DEC_BC, ke);
      cp_async_commit();
    }
    if (pass == 0) { /* Q once, while the first tiles arrive */
      const T *qA = (const T *)p.q + attn_at(p.q_st, b, hA, okA ? r.iA : 0) + c2;
      const T *qB = (const T *)p.q + attn_at(p.q_st, b, hB, okB ? r.iB : 0) + c2;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk++) {
        uint32_t *f = qf[QSM ? 0 : kk];
        f[0] = okA ? *(const uint32_t *)(qA + kk * 16) : 0u;
        f[1] = okB ? *(const uint32_t *)(qB + kk * 16) : 0u;
        f[2] = okA ? *(const uint32_t *)(qA + kk * 16 + 8) : 0u;
        f[3] = okB ? *(const uint32_t *)(qB + kk * 16 + 8) : 0u;
        if (QSM && ks == 0) { /* rows g and g + 8, chunks 2kk and 2kk + 1: read back by ldmatrix (tile 0's barrier) */
          *(uint32_t *)(qs + swz<D / 8>(g, 2 * kk) + c2 * 2) = f[0];
          *(uint32_t *)(qs + swz<D / 8>(g + 8, 2 * kk) + c2 * 2) = f[1];
          *(uint32_t *)(qs + swz<D / 8>(g, 2 * kk + 1) + c2 * 2) = f[2];
          *(uint32_t *)(qs + swz<D / 8>(g + 8, 2 * kk + 1) + c2 * 2) = f[3];
        }
      }
    }
#pragma unroll
    for (int d = 0; d < D / 8; d++) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    r.mA = r.mB = -INFINITY, r.lA = r.lB = 0.f;
    for (int t = 0; t < ntiles; t++) {
      cp_async_wait<DEC_STAGES - 2>();
#if DEC_WGMMA_BUILD
      if (LEAN) dec_pv_done<D>(o); /* tile t - 1's P·V, issued at its end, ran while tile t's copies came */
      if (WG) fence_proxy_async();   /* the copies, visible to wgmma's reads */
#endif
      __syncthreads(); /* tile t is in; the buffer of tile t - 1 is free */
      const bool exact = pass > 0; /* the second pass: every P·V by the exact product */
      const int tn = t + DEC_STAGES - 1;
      float s[NC][4];
#if DEC_WGMMA_BUILD /* LEAN: S issued before the next tile's copies, whose instructions then run beside it */
      if constexpr (LEAN) qk_issue_rs<T, D, DEC_BC>(s, qf, dec_tile_addr(dec_smem + (t % DEC_STAGES) * 2 * TILE));
#endif
      {
        char *kn = dec_smem + (tn % DEC_STAGES) * 2 * TILE;
        if (tn < ntiles)
          dec_load<T, D, PG, WG, LEAN>(kn, kn + TILE, p, a, kbase, vbase, rowoff[PAGED ? tn % 4 : 0],
                                          kb + (int64_t)tn * DEC_BC, ke);
        if (PAGED && ent < ENTRIES && tn + 3 < ntiles) fetch_page(tn + 3); /* tile tn's group: read at tn's end */
        cp_async_commit();
      }
      const char *kt = dec_smem + (t % DEC_STAGES) * 2 * TILE, *vt = kt + TILE;
      const int64_t j0 = kb + (int64_t)t * DEC_BC + kw;
      if constexpr (WG) {
#if DEC_WGMMA_BUILD /* S = Q·Kᵀ for the 64 rows, K-major from the tile's column blocks */
        if constexpr (!LEAN) qk_issue_rs<T, D, DEC_BC>(s, qf, dec_tile_addr(kt));
        wgmma_wait<0>();
        wgmma_hold<NC * 4>(&s[0][0]);
#endif
      } else {
#pragma unroll
        for (int n = 0; n < NC; n++) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
          if constexpr (QSM) ldmatrix_x4(qf[0], smem_addr(qs + swz<D / 8>(lane & 15, kk * 2 + (lane >> 4))));
          const uint32_t *qa = qf[QSM ? 0 : kk];
#pragma unroll
          for (int n = 0; n < NC; n += 2) {
            uint32_t bf[4];
            const int key = kw + n * 8 + (lane & 7) + ((lane >> 4) << 3);
            ldmatrix_x4(bf, smem_addr(kt + swz<D / 8>(key, kk * 2 + ((lane >> 3) & 1))));
            mma16816<T>(s[n], qa, bf[0], bf[1]);
            mma16816<T>(s[n + 1], qa, bf[2], bf[3]);
          }
        }
      }
      const bool full = scale_pos && j0 >= all_lo && j0 + NC * 8 <= all_hi;
      float alphaA, alphaB;
      frag_softmax_tile<NC, EXTRAS>(p, b, hA, j0, c2, full, r, s, &alphaA, &alphaB, hB);
      frag_rescale_moved<D / 8>(o, alphaA, alphaB); /* 64 multiplies a tile that the long streams mostly skip */

      if constexpr (WG) {
#if DEC_WGMMA_BUILD /* O += P·V, V read N-major (transposed) from the tile */
        if (exact) {
#pragma unroll
          for (int kk = 0; kk < NC / 2; kk++) dec_pv_exact<T, D, WG>(o, s, kk, vt, kk * 16, lane);
        } else {
          p_pack<T, DEC_BC>(pv_a, s);
          pv_issue<T, D, DEC_BC>(o, pv_a, dec_tile_addr(vt));
          if (!LEAN) dec_pv_done<D>(o); /* LEAN: at the next tile's top */
        }
#endif
      } else
#pragma unroll
      for (int kk = 0; kk < NC / 2; kk++) {
        uint32_t pa[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                          pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
        if (exact) { /* the second pass (NaN or inf in this chunk's O) */
          dec_pv_exact<T, D, WG>(o, s, kk, vt, kw + kk * 16, lane);
          continue;
        }
        /* the value columns in parts of 64 or fewer, so that a part's
         * fragments are held at once (registers: the 64-row instances were at
         * the cap) */
        constexpr int PARTS = D > 128 ? 4 : 2, PER_PART = D / 16 / PARTS;
#pragma unroll
        for (int half = 0; half < PARTS; half++) {
          uint32_t vf[PER_PART][4];
#pragma unroll
          for (int d = 0; d < PER_PART; d++) {
            const int chunk = 2 * (half * PER_PART + d) + (lane >> 4);
            ldmatrix_x4_trans(vf[d], smem_addr(vt + swz<D / 8>(kw + kk * 16 + (lane & 15), chunk)));
          }
#pragma unroll
          for (int d = 0; d < PER_PART; d++) {
            const int dd = half * PER_PART + d;
            mma16816<T>(o[2 * dd], pa, vf[d][0], vf[d][1]);
            mma16816<T>(o[2 * dd + 1], pa, vf[d][2], vf[d][3]);
          }
        }
      }
      if (PAGED && ent < ENTRIES && tn + 1 < ntiles) { /* the entry came with tile t's group; read after the barrier */
        const int64_t j = dec_tile_key(kb, tn + 1, ent * RPE);
        rowoff[(tn + 1) % 4][ent] = j < ke ? dec_page_offset(p, a, page[(tn + 1) % 4][ent], j) : 0;
      }
    }
    cp_async_wait<0>();
#if DEC_WGMMA_BUILD
    if (LEAN) dec_pv_done<D>(o); /* the last tile's P·V */
#endif
    if (pass > 0) break;
    /* NaN or inf anywhere in this O (a sum overflowing to inf counts too): the chunk again, exactly */
    bool bad = false;
#pragma unroll
    for (int d = 0; d < D / 8; d++) bad |= !isfinite(o[d][0] + o[d][1] + o[d][2] + o[d][3]);
    if (!__syncthreads_or(bad)) break;
  }
  __syncthreads(); /* the tiles are free: the warps' states meet there */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* the merge launch may start now (its blocks wait for this grid's
   * memory): its launch overlaps the chunks' last tiles */
  asm volatile("griddepcontrol.launch_dependents;");
#endif

  /* the key streams of a row group merged, each of its KS warps taking D / 8 / KS of the column groups: every
   * warp writes its state, then weighs the KS states' columns it stores by e^(m_k - max), in a fixed order.
   * This runs once a block, from a cold instruction cache: with the first warp merging the others' whole
   * states, it ran 1032 instructions alone (unrolled; 372, and 300 three times, as a loop) and mostly stalled
   * for instructions (B = 1, 4k keys, 4 tiles a block; H200, ncu) */
  constexpr int PER = D / 8 / KS; /* the column groups a warp stores, from d0 */
  float oc[PER][4];
  int d0 = 0;
  if constexpr (KS > 1) {
    const int W = D / 2 + 4; /* floats a lane: O, then mA, mB, lA, lB */
    float *sc = (float *)dec_smem;
    float *mine = sc + warp * W * 32 + lane;
#pragma unroll
    for (int d = 0; d < D / 8; d++)
#pragma unroll
      for (int q = 0; q < 4; q++) mine[(d * 4 + q) * 32] = o[d][q];
    mine[(D / 2) * 32] = r.mA, mine[(D / 2 + 1) * 32] = r.mB, mine[(D / 2 + 2) * 32] = r.lA,
                    mine[(D / 2 + 3) * 32] = r.lB;
    __syncthreads();
    const float *th[KS]; /* the row group's KS states */
    float MA = -INFINITY, MB = -INFINITY, fA[KS], fB[KS];
#pragma unroll
    for (int k = 0; k < KS; k++) {
      th[k] = sc + (k * RG + rg) * W * 32 + lane;
      MA = fmaxf(MA, th[k][(D / 2) * 32]), MB = fmaxf(MB, th[k][(D / 2 + 1) * 32]);
    }
    r.lA = r.lB = 0.f;
#pragma unroll
    for (int k = 0; k < KS; k++) {
      fA[k] = MA == -INFINITY ? 1.f : exp2_approx((th[k][(D / 2) * 32] - MA) * FA_LOG2E);
      fB[k] = MB == -INFINITY ? 1.f : exp2_approx((th[k][(D / 2 + 1) * 32] - MB) * FA_LOG2E);
      r.lA += fA[k] * th[k][(D / 2 + 2) * 32], r.lB += fB[k] * th[k][(D / 2 + 3) * 32];
    }
    r.mA = MA, r.mB = MB;
    d0 = ks * PER;
#pragma unroll
    for (int j = 0; j < PER; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) {
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < KS; k++) v += (q < 2 ? fA[k] : fB[k]) * th[k][((d0 + j) * 4 + q) * 32];
        oc[j][q] = v;
      }
  } else {
#pragma unroll
    for (int j = 0; j < PER; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) oc[j][q] = o[j][q];
  }

  frag_sum_quad(r);
  const float invA = row_inv(r.lA), invB = row_inv(r.lB);
  const float lseA = row_lse(r.mA, r.lA), lseB = row_lse(r.mB, r.lB);
  const bool lse_lane = (lane & 3) == 0 && ks == 0; /* a row's lse: one thread of the row group's first warp */
  if (a.splits == 1) { /* the output itself */
    T *oA = (T *)p.o + attn_at(p.o_st, b, hA, r.iA) + c2 + d0 * 8;
    T *oB = (T *)p.o + attn_at(p.o_st, b, hB, r.iB) + c2 + d0 * 8;
#pragma unroll
    for (int j = 0; j < PER; j++) {
      if (okA) *(uint32_t *)(oA + j * 8) = pack2<T>(oc[j][0] * invA, oc[j][1] * invA);
      if (okB) *(uint32_t *)(oB + j * 8) = pack2<T>(oc[j][2] * invB, oc[j][3] * invB);
    }
    if (p.lse && lse_lane) {
      if (okA) attn_lse_at(p, b, hA, r.iA) = lseA;
      if (okB) attn_lse_at(p, b, hB, r.iB) = lseB;
    }
    return;
  }
  /* the chunk's state: (split, b, h, i) rows of Dv floats, and its lse */
  const int64_t rowA = ((split * p.B + b) * p.Hq + hA) * Lq + r.iA, rowB = ((split * p.B + b) * p.Hq + hB) * Lq + r.iB;
#pragma unroll
  for (int j = 0; j < PER; j++) {
    const int col = (d0 + j) * 8 + c2;
    if (okA) *(float2 *)(a.part_o + rowA * D + col) = make_float2(oc[j][0] * invA, oc[j][1] * invA);
    if (okB) *(float2 *)(a.part_o + rowB * D + col) = make_float2(oc[j][2] * invB, oc[j][3] * invB);
  }
  if (lse_lane) {
    if (okA) a.part_lse[rowA] = lseA;
    if (okB) a.part_lse[rowB] = lseB;
  }
}

/* The chunks' states combined, WPR warps a row (4 / WPR rows a block of
 * 128 threads): weights e^(lse_s - max), an empty chunk (lse = -inf)
 * weighing nothing, NaN in any chunk's lse making the row NaN; the row's
 * output through o's strides and its lse.  Warp w of a row takes chunks
 * w, w + WPR, ... (at most 64): their lse (a lane each) and outputs (a
 * vector a lane) are read together, weighed against the warp's own
 * maximum, and with WPR = 4 the four warps' sums meet rescaled in a fixed
 * order (deterministic): one round trip to memory instead of lse first,
 * then the outputs (the merge took 2.7-4.2 µs at batch 1, H200).  WPR = 1
 * (decode_merge_warps: many rows, few chunks) a warp a row: a block a row
 * of four warps each reading one chunk (Lq = 16, 4096 rows) spent more on
 * its blocks than on its reads.  Launched as a programmatic dependent of
 * the chunks' kernel on Hopper (decode_typed): its blocks wait here for
 * that grid's memory. */
template <typename T, int D, int WPR>
__global__ void __launch_bounds__(128) attn_decode_merge_kernel(fa_attn_problem p, decode_args a) {
  const int PER = D / 32; /* floats a lane, read as VN vectors V */
  typedef typename std::conditional<PER >= 4, float4, float2>::type V;
  const int VN = PER * 4 / (int)sizeof(V);
  __shared__ __align__(16) float red[WPR][D];
  __shared__ float wmax[WPR], wden[WPR];
  const int64_t R = p.B * p.Hq * p.Lq, row = (int64_t)blockIdx.x * (4 / WPR) + (threadIdx.x >> 5) / WPR;
  const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) % WPR;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (row >= R) return; /* the last block's rows past the end (WPR = 1: no barrier below) */
  const int nw = a.splits > w ? (a.splits - w + WPR - 1) / WPR : 0; /* this warp's chunks */
  const float l0 = lane < nw ? a.part_lse[(int64_t)(w + WPR * lane) * R + row] : -INFINITY;
  const float l1 = lane + 32 < nw ? a.part_lse[(int64_t)(w + WPR * (lane + 32)) * R + row] : -INFINITY;
  /* a chunk whose state is NaN (NaN or inf in the row's q or k) makes the row NaN, as in one chunk
   * and the reference: fmaxf would pass over it, and the warp's weight would drop it */
  const bool nan_state = __any_sync(0xffffffffu, l0 != l0 || l1 != l1);
  const float M = nan_state ? __int_as_float(0x7fc00000) : warp_max(fmaxf(l0, l1));
  float acc[PER], den = 0.f;
#pragma unroll
  for (int c = 0; c < PER; c++) acc[c] = 0.f;
  const float *src = a.part_o + row * D + lane * PER;
#pragma unroll 8
  for (int j = 0; j < nw; j++) {
    const float l = __shfl_sync(0xffffffffu, j < 32 ? l0 : l1, j & 31);
    V x[VN];
#pragma unroll
    for (int u = 0; u < VN; u++) x[u] = *(const V *)(src + (int64_t)(w + WPR * j) * R * D + u * (int)(sizeof(V) / 4));
    const float *xs = (const float *)x;
    const float wt = l == -INFINITY ? 0.f : expf(l - M); /* NaN stays NaN */
    den += wt;
#pragma unroll
    for (int c = 0; c < PER; c++) acc[c] += wt == 0.f ? 0.f : wt * xs[c]; /* nothing of an empty chunk, not even 0 · inf */
  }
  float Mall = M, dall = den;
  if constexpr (WPR > 1) {
#pragma unroll
    for (int c = 0; c < PER; c++) red[w][lane * PER + c] = acc[c];
    if (lane == 0) wmax[w] = M, wden[w] = den;
    __syncthreads();
    if (w != 0) return;
    float f[WPR];
    Mall = wmax[0], dall = 0.f;
#pragma unroll
    for (int k = 1; k < WPR; k++) Mall = fmaxf(Mall, wmax[k]);
#pragma unroll
    for (int k = 0; k < WPR; k++) {
      f[k] = wmax[k] == -INFINITY ? 0.f : expf(wmax[k] - Mall); /* a warp of empty chunks (or none) weighs nothing */
      dall += f[k] == 0.f ? 0.f : f[k] * wden[k];
    }
#pragma unroll
    for (int c = 0; c < PER; c++) {
      const int col = lane * PER + c;
      float v = 0.f;
#pragma unroll
      for (int k = 0; k < WPR; k++) v += f[k] == 0.f ? 0.f : f[k] * red[k][col];
      acc[c] = v;
    }
  }
  const int64_t i = row % p.Lq, bh = row / p.Lq, b = bh / p.Hq, h = bh % p.Hq;
  const float inv = row_inv(dall);
  T *out = (T *)p.o + attn_at(p.o_st, b, h, i) + lane * PER;
#pragma unroll
  for (int c = 0; c < PER; c++) out[c] = from_float<T>(acc[c] * inv);
  if (p.lse && lane == 0) attn_lse_at(p, b, h, i) = dall == 0.f ? -INFINITY : Mall + logf(dall);
}

/* The merge's warps a row: one where the rows fill the GPU many times
 * over (eight a SM and more) and a warp's chunks stay few (64 at most, 16
 * in practice), else four. */
static inline int decode_merge_warps(int64_t rows, int splits, int sms) { return rows >= 8LL * sms && splits <= 16 ? 1 : 4; }

/* ---- launchers ---- */

/* The row groups of a block: 16 packed rows each, 1, 2 or 4. */
static inline int decode_row_groups(int64_t rows) { return rows <= 16 ? 1 : rows <= 32 ? 2 : 4; }

/* More than DEC_ROWS packed rows a key head (eight query heads a key head
 * at Lq = 16, say) take blocks of DEC_ROWS each, every one reading the
 * chunk's K and V: ⌈G·Lq / 64⌉ reads of them, where the kernels for longer
 * queries, which pack no heads, read them once a query head (G times).
 * Taken up to Lq = 16 (API §8's decoding; past it the prefill kernels). */
static inline int64_t decode_row_blocks(int64_t rows) { return (rows + DEC_ROWS - 1) / DEC_ROWS; }
#define DEC_MAX_LQ_BLOCKS 16 /* Lq of calls with more than DEC_ROWS packed rows */
/* D = 256: two row groups at most (16 query heads on 8 at Lq = 16: Gemma's
 * shapes); four would hold 64 rows × 256 columns of O a warpgroup beside
 * Q's fragments, past the registers */
#define DEC_ROWS_D256 32
#define DEC_STATIC_SMEM 4096 /* the kernel's static shared memory (sh_keys, rowoff, page), rounded up */
#define DEC_MAX_ROWS (1 << 24) /* packed rows a key head */

typedef void (*decode_kernel_fn)(fa_attn_problem, decode_args);

/* What a launch needs to know of an instance on a device, found once (per
 * instance, per device): the shared memory set (cudaFuncSetAttribute costs
 * a few µs a call, and a decode step is a few µs of work) and its blocks
 * resident on the whole GPU (the device's own facts: fa_cuda_props).  A
 * race between two threads sets the same values twice. */
#define DEC_DEVICES 16
typedef struct {
  int ready, slots; /* slots: blocks resident on the GPU */
} decode_instance;

/* An instance and its record of each device (zero-initialised statics:
 * no guard, C-style CUDA as common.cuh asks). */
struct decode_entry {
  decode_kernel_fn fn;
  decode_instance *per_device;
};
template <typename T, int D, int RG, int EXTRAS, int PG> static decode_entry decode_entry_of() {
  static decode_instance per_device[DEC_DEVICES];
  return {attn_decode_kernel<T, D, RG, EXTRAS, PG>, per_device};
}
template <typename T, int D, int RG, int EXTRAS> static decode_entry decode_pick_pg(int pg) {
  return pg == DEC_PAGED_RUNS   ? decode_entry_of<T, D, RG, EXTRAS, DEC_PAGED_RUNS>()
         : pg == DEC_PAGED_ROWS ? decode_entry_of<T, D, RG, EXTRAS, DEC_PAGED_ROWS>()
                                : decode_entry_of<T, D, RG, EXTRAS, DEC_CONTIG>();
}
template <typename T, int D, int RG> static decode_entry decode_pick(int extras, int pg) {
  return extras ? decode_pick_pg<T, D, RG, EXTRAS_MASK>(pg) : decode_pick_pg<T, D, RG, EXTRAS_NONE>(pg);
}

static inline fa_status decode_slots(fa_context *ctx, const decode_entry &k, size_t smem, const fa_cuda_props &dp, int *slots) {
  decode_instance *in = dp.device < DEC_DEVICES ? &k.per_device[dp.device] : NULL;
  if (in && __atomic_load_n(&in->ready, __ATOMIC_ACQUIRE)) {
    *slots = in->slots;
    return FA_OK;
  }
  int per_sm = 0;
  FA_CUDA_CHECK(ctx, cudaFuncSetAttribute(k.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  FA_CUDA_CHECK(ctx, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k.fn, DEC_THREADS, smem));
  *slots = max(1, dp.sms * per_sm);
  if (in) {
    in->slots = *slots;
    __atomic_store_n(&in->ready, 1, __ATOMIC_RELEASE);
  }
  return FA_OK;
}

/* The chunks of a call: the user's (at most one a tile, and 256), else at
 * most one wave of blocks (a second, part-filled wave costs as much as the
 * first), of a quarter of the key tiles down to one tile while that still
 * puts a block on every SM: the merge's cost grows with the chunks, so
 * short caches gain from fewer (B = 1, 8 key heads, H200: Lk = 4k 18.0 µs
 * in 16 chunks against 18.9 in 32), while long ones keep the full wave (a
 * block an SM lost 3-7 % at Lk = 32k and 128k;
 * docs/perf/2026-11-27-decode-splits-h200.json).  One chunk for 256 keys
 * or fewer, where the merge launch costs more than it saves (at 512 keys
 * and batch 1, 8 chunks took 11.8 µs against 15.6 for one). */
static inline int decode_splits(const fa_attn_problem *p, int64_t want, int row_blocks, int slots, const fa_cuda_props &dp) {
  const int64_t tiles = (p->Lk + DEC_BC - 1) / DEC_BC, heads = p->B * p->Hkv * row_blocks;
  int64_t s = want;
  if (s <= 0) s = p->Lk <= 4 * DEC_BC ? 1 : min(slots / heads, max(dp.sms / heads, tiles / 4));
  return (int)max((int64_t)1, min(s, min(tiles, (int64_t)DEC_MAX_SPLITS)));
}

/* Whether a call's K and V are read under L2's evict-first policy: when
 * they come to at most four L2s.  Behind a kernel that left L2 full of
 * dirty lines (a layer's outputs; a benchmark's cache flush), reading
 * with the default policy first writes those lines back; evict-first
 * lines replace each other instead.  Over a long stream evict-first read
 * slower, though: the gain is fixed, the loss grows with the bytes (H200,
 * cache flushed: 128 MB of K + V in 47-48 µs against 50-51, 64 MB in 29.5
 * against 32.3; 512 MB in 145-148 against 140-143, 1 GB in 273 against
 * 260; docs/perf/2026-11-28-decode-evict-first-ab-h200.json). */
static inline int decode_evict_first(const fa_attn_problem *p, const fa_cuda_props &dp) {
  const double kv_bytes = (double)p->B * (double)p->Hkv * (double)p->Lk * (double)(p->D + p->Dv) * 2;
  return kv_bytes <= 4.0 * (double)dp.l2_bytes;
}

template <typename T, int D>
static fa_status decode_typed(fa_context *ctx, const fa_attn_problem *p, decode_args &a, int64_t want) {
  const int rg = decode_row_groups(min((int64_t)a.rows, (int64_t)DEC_ROWS));
  const int extras = attn_has_extras(p);
  const int pg = a.pg.table == NULL ? DEC_CONTIG : a.pg.page_size % DEC_RUN == 0 ? DEC_PAGED_RUNS : DEC_PAGED_ROWS;
  decode_entry k;
  if constexpr (D == 256) /* two row groups at most (DEC_ROWS_D256) */
    k = rg == 1 ? decode_pick<T, D, 1>(extras, pg) : decode_pick<T, D, 2>(extras, pg);
  else
    k = rg == 1 ? decode_pick<T, D, 1>(extras, pg)
        : rg == 2 ? decode_pick<T, D, 2>(extras, pg)
                  : decode_pick<T, D, 4>(extras, pg);
  const size_t smem = dec_smem_bytes(D, rg);
  fa_cuda_props dp;
  int slots = 0;
  fa_status st = fa_cuda_device_props(ctx, &dp);
  if (st || (st = decode_slots(ctx, k, smem, dp, &slots))) return st;
  a.splits = decode_splits(p, want, a.row_blocks, slots, dp);
  a.evict_first = decode_evict_first(p, dp);
  const int64_t blocks = p->B * p->Hkv * a.row_blocks * a.splits, rows = p->B * p->Hq * p->Lq;
  if ((st = attn_grid_fits(ctx, blocks)) || (a.splits > 1 && (st = attn_grid_fits(ctx, rows)))) return st;
  size_t part_bytes = 0;
  void *part = NULL;
  if (a.splits > 1) {
    part_bytes = sizeof(float) * (size_t)(a.splits * rows) * (size_t)(D + 1);
    if ((st = fa_cuda_malloc(ctx, &part, part_bytes))) return st;
    a.part_o = (float *)part, a.part_lse = (float *)part + (size_t)(a.splits * rows) * D;
  }
  cudaStream_t s = fa_cuda_stream(ctx);
  k.fn<<<(unsigned)blocks, DEC_THREADS, smem, s>>>(*p, a);
  cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess && a.splits > 1) {
    /* Hopper: a programmatic dependent launch (the merge's blocks are
     * placed while the chunks end, then wait for their memory).  Only
     * where code of the build for sm_90 or later runs, which holds that
     * wait (griddepcontrol): sm_80 code has none */
    const int wpr = decode_merge_warps(rows, a.splits, dp.sms), rpb = 4 / wpr;
    void *args[] = {(void *)p, &a};
    const void *merge = wpr == 1 ? (const void *)attn_decode_merge_kernel<T, D, 1>
                                 : (const void *)attn_decode_merge_kernel<T, D, 4>;
    err = attn_launch(merge, dim3((unsigned)((rows + rpb - 1) / rpb)), dim3(128), 0, s, args, dp.sm90_code);
  }
  fa_cuda_free_on(ctx, part, part_bytes); /* after the kernels, on their stream (capturable) */
  return fa_cuda_error(ctx, err, "launch of attn_decode_kernel");
}

/* A decode call's launches in dtype T, for the head dims of the fit (64,
 * 128, 256).  Instantiated once a dtype, in a file of its own
 * (attention_decode_bf16.cu, attention_decode_f16.cu), so that the two
 * halves of the kernel's instances compile side by side. */
template <typename T> fa_status decode_launch(fa_context *ctx, const fa_attn_problem *p, decode_args &a, int64_t want) {
  return p->D == 64    ? decode_typed<T, 64>(ctx, p, a, want)
         : p->D == 128 ? decode_typed<T, 128>(ctx, p, a, want)
                       : decode_typed<T, 256>(ctx, p, a, want);
}
extern template fa_status decode_launch<__nv_bfloat16>(fa_context *, const fa_attn_problem *, decode_args &, int64_t);
extern template fa_status decode_launch<__half>(fa_context *, const fa_attn_problem *, decode_args &, int64_t);

#endif
