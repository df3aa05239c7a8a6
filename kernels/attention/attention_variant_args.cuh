/* Attention variants on cuda: what the traced expressions' code
 * (src/variant_codegen.c) uses, and nothing of the kernels, so that it
 * compiles on the host too (tests/c/test_variant_codegen.c runs the
 * generated code there against the CPU's evaluator, with __device__,
 * __forceinline__ and atomicCAS defined by the test). */
#ifndef FA_KERNELS_ATTENTION_VARIANT_ARGS_CUH
#define FA_KERNELS_ATTENTION_VARIANT_ARGS_CUH

/* score_mod's captured tensors, then mask_mod's (expr.h's 16 each) */
#define FA_VARIANT_SLOTS 32

struct fa_variant_args {
  const void *ptr[FA_VARIANT_SLOTS];
  long long shape[FA_VARIANT_SLOTS][4], stride[FA_VARIANT_SLOTS][4]; /* elements */
  /* the fault records of score_mod [0] and mask_mod [1] (NULL when it has
   * no read), all -1 before the call: [0] the node of the first read whose
   * out-of-range NaN reached a result; [1 + 2r], [2 + 2r] the dimension
   * (0-based) and the index of read r's first bad access */
  long long *fault[2];
  /* mask_mod's tiles (fa_variant_spans_kernel), or NULL: per (b, h, query
   * tile of spans_br rows), int4 {first, end} of the key tiles of spans_bc
   * keys it leaves nonempty, then {first, end} of a run of full ones; at
   * (b·spans_sb + h·spans_sh)·spans_nq + query tile (a stride 0: the same
   * for every batch or head) */
  const int *spans;
  long long spans_sb, spans_sh, spans_nq;
  int spans_br, spans_bc;
  /* the backward's: mask_mod's tiles of 64 x 64 (FA_BLOCK_* a byte; the
   * spans kernel's states), or NULL: of (b, h, query tile, key tile) at
   * ((b·spans_sb + h·spans_sh)·spans_nq + query tile)·tiles_nk + key tile */
  const unsigned char *tiles;
  long long tiles_nk;
  /* the expressions' numbers that their code reads here, not as literals
   * (src/variant_codegen.h: FA_VARIANT_INTS and FA_VARIANT_FLOATS), so that
   * new values of them compile nothing */
  long long ci[16];
  float cf[24];
};

/* The index of a bad read that is NaN or not an integer (expr.c's codes). */
#define FA_VARIANT_NAN_INDEX (-9223372036854775807LL - 1)
#define FA_VARIANT_FRACTION_INDEX 9223372036854775807LL
/* an index past int64's range (inf, 1e300), by its sign: src/expr.c's FAULT_HUGE */
#define FA_VARIANT_HUGE_INDEX 9223372036854775806LL

/* Lua's modulo, the sign of the divisor: of integers (d a constant other
 * than 0) and of floats. */
static __device__ __forceinline__ long long fa_variant_imod(long long a, long long d) {
  const long long m = a % d;
  return m != 0 && (m < 0) != (d < 0) ? m + d : m;
}
static __device__ __forceinline__ float fa_variant_fmod(float a, float d) {
  float m = fmodf(a, d);
  return m != 0.f && (m > 0.f) != (d > 0.f) ? m + d : m;
}

/* A query tile's span record (fa_variant_args.spans), built from its key
 * tiles' verdicts in order (any pair attends, every pair does): the first
 * and the end of the nonempty tiles, and the longest run of full ones (run:
 * the current run's first tile, -1 none).  Made on the host from a block
 * mask and on the device by the spans kernel. */
struct fa_span_builder {
  int first, end, f_first, f_end, run;
};
static __host__ __device__ __forceinline__ fa_span_builder fa_span_start(void) {
  fa_span_builder s = {-1, 0, 0, 0, -1};
  return s;
}
static __host__ __device__ __forceinline__ void fa_span_add(fa_span_builder &s, int kt, bool any, bool all) {
  if (any) s.first = s.first < 0 ? kt : s.first, s.end = kt + 1;
  if (!all) {
    s.run = -1;
    return;
  }
  if (s.run < 0) s.run = kt;
  if (kt + 1 - s.run > s.f_end - s.f_first) s.f_first = s.run, s.f_end = kt + 1;
}
static __host__ __device__ __forceinline__ void fa_span_store(const fa_span_builder &s, int *sp) {
  sp[0] = s.first < 0 ? 0 : s.first, sp[1] = s.first < 0 ? 0 : s.end, sp[2] = s.f_first, sp[3] = s.f_end;
}

/* A comparison of a in [al, ah] and b in [bl, bh] over a tile (fa_variant's
 * tile: src/variant_codegen.c): 1 when it holds for every pair, 2 when for
 * none, 3 when it cannot tell. */
static __device__ __forceinline__ int fa_tile_lt(double al, double ah, double bl, double bh) {
  return ah < bl ? 1 : al >= bh ? 2 : 3;
}
static __device__ __forceinline__ int fa_tile_le(double al, double ah, double bl, double bh) {
  return ah <= bl ? 1 : al > bh ? 2 : 3;
}
static __device__ __forceinline__ int fa_tile_gt(double al, double ah, double bl, double bh) {
  return fa_tile_lt(bl, bh, al, ah);
}
static __device__ __forceinline__ int fa_tile_ge(double al, double ah, double bl, double bh) {
  return fa_tile_le(bl, bh, al, ah);
}
static __device__ __forceinline__ int fa_tile_eq(double al, double ah, double bl, double bh) {
  return al == ah && bl == bh && al == bl ? 1 : ah < bl || bh < al ? 2 : 3;
}
static __device__ __forceinline__ int fa_tile_ne(double al, double ah, double bl, double bh) {
  const int r = fa_tile_eq(al, ah, bl, bh);
  return r == 3 ? 3 : 3 - r;
}

/* A tile read's range (least l, greatest h, a NaN seen n) or a boolean
 * read's values (bits t) over the lanes that shared its elements: a whole
 * warp (lanes 32, every lane calling), or one thread (lanes 1: nothing to
 * do; the host build of the test has no warps). */
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
static __device__ __forceinline__ void fa_tile_lanes_range(double &l, double &h, bool &n, int lanes) {
  if (lanes < 32) return;
  for (int m = 16; m; m >>= 1) l = fmin(l, __shfl_xor_sync(~0u, l, m)), h = fmax(h, __shfl_xor_sync(~0u, h, m));
  n = __any_sync(~0u, n);
}
static __device__ __forceinline__ void fa_tile_lanes_or(int &t, int lanes) {
  if (lanes < 32) return;
  for (int m = 16; m; m >>= 1) t |= __shfl_xor_sync(~0u, t, m);
}
#else
static inline void fa_tile_lanes_range(double &, double &, bool &, int) {}
static inline void fa_tile_lanes_or(int &, int) {}
#endif

/* Read r's bad access (dimension d, index ix), kept from the first. */
static __device__ __forceinline__ void fa_variant_note(long long *rec, int r, int d, long long ix) {
  if (atomicCAS((unsigned long long *)&rec[1 + 2 * r], ~0ull, (unsigned long long)d) == ~0ull) rec[2 + 2 * r] = ix;
}

#endif
