/* The registry's CUDA attention kernels (API §6): each kernel's file
 * defines its entry (the algos it implements, what calls it takes, how it
 * is queued), and attention_registry.cu holds the table, in the registry's
 * order (src/attn_kernels.c: fastest first), and the one dispatch that
 * walks it (fa_cuda_attention_run).  "flash" and "two_pass" go to the
 * first tiled kernel that takes the call (or the one named), "naive" and
 * "flash_row" to their kernels, and decode's kernel is taken when named:
 * src/ names it where it fits (fa_attn_decode_takes), since its split of
 * the keys replaces src/'s.  A new kernel is a file with its entry, a line
 * in the table, and its name in src/attn_kernels.c. */
#ifndef FA_KERNELS_ATTENTION_REGISTRY_H
#define FA_KERNELS_ATTENTION_REGISTRY_H

#include "attention_common.cuh"

#define ATTN_ALGO(a) (1u << (a))
#define ATTN_FLASH_OR_TWO_PASS (ATTN_ALGO(FA_ATTN_FLASH) | ATTN_ALGO(FA_ATTN_TWO_PASS))

struct attn_entry {
  fa_attn_kernel id;
  /* The algos it implements (ATTN_ALGO bits). */
  unsigned algos;
  /* Taken only when named (decode, wgmma_fp8).  Whether fa.kernels lists
   * it when not named is the kernel table's listed_when_named
   * (src/attn_kernels.c): decode is listed, wgmma_fp8 is not. */
  bool named_only;
  /* The tiled kernels' (opts.tile a knob; NULL for decode, naive and
   * flash_row, which have none).  fit: the call's dtype and head dims on
   * this device and build: 1 and the kernel's default tile {*br, *bc};
   * else 0 and why not into why (n bytes).  tile_ok: whether {br, bc} is
   * one of its tiles at head dim D. */
  int (*fit)(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc, char *why, size_t n);
  bool (*tile_ok)(int64_t D, int64_t br, int64_t bc);
  /* The resolved call (its tile one of the kernel's, fit checked): what
   * is left to ask, e.g. the operands' alignment, sizes, the algo.
   * automatic as for queue (the tile it will then run with). */
  bool (*takes)(const fa_attn_problem *p, fa_attention_algo algo, bool automatic);
  /* Queues algo (one of its algos; "two_pass" with p->row_stats set).  A fast
   * kernel guards itself against NaN/inf in V (launch_fast_passes) and
   * hands back the flag in *v_flag, behind which the dispatch queues the
   * SIMT kernel; the SIMT kernel leaves it NULL.  automatic: chosen, not
   * named, and no opts.tile given (a kernel may then take a tile of its own
   * that suits the call). */
  fa_status (*queue)(fa_context *ctx, const attn_params *p, fa_attention_algo algo, bool automatic, int **v_flag);
  /* The run-time compiled variants (API §9; attention_variant.cu) have an
   * instance of it. */
  bool variant_hook;
  /* Calls it takes when named but leaves to the next kernel when the
   * choice is automatic (NULL: none), by the call (its key tile p->tile_k,
   * 0: its default), whether q, k and v have rows D and Dv apart
   * (attn_rows_dense): the next is faster there.  fa.kernels lists such a
   * kernel after the next. */
  bool (*declines)(const fa_attn_problem *p, bool rows_dense);
  /* How it reads a bool mask (attn_mask_read): as bytes, or as bits
   * (p->mask_bits: the kernels that score in fragments, frag_rule), which
   * the dispatch makes for it, with the rows' kept ranges where it narrows
   * a query tile's keys by them (attn_keys). */
  int mask_read;
};

/* attn_entry.mask_read */
enum attn_mask_read { ATTN_MASK_BYTES = 0, ATTN_MASK_BITS, ATTN_MASK_BITS_RANGES };

/* The entries, defined beside their kernels. */
extern const attn_entry attn_entry_wgmma_tma; /* attention_wgmma_tma.cu */
extern const attn_entry attn_entry_wgmma_fp8; /* attention_fp8.cu: e4m3, named only */
extern const attn_entry attn_entry_wgmma;     /* attention_wgmma.cu */
extern const attn_entry attn_entry_mma;       /* attention_mma.cu */
extern const attn_entry attn_entry_f32;       /* attention_f32.cu */
extern const attn_entry attn_entry_simt;      /* attention.cu */
extern const attn_entry attn_entry_decode;    /* attention_decode.cu */
extern const attn_entry attn_entry_naive;     /* attention_naive.cu */
extern const attn_entry attn_entry_row;       /* attention.cu */

/* The kernel that runs a resolved call of algo: the one named (NULL when
 * it does not take the call), or with FA_KERNEL_AUTO the first in the
 * table that does and is not taken only by name (the SIMT kernel takes
 * every "flash" and "two_pass" call).  variant: only those with a variant
 * hook. */
const attn_entry *attn_entry_pick(fa_attn_kernel named, const fa_attn_problem *p, fa_attention_algo algo, bool variant);

/* Whether a kernel other than SIMT that fits calls of dtype dt and head
 * dims D, Dv has {br, bc} among its tiles (a user's tile the SIMT kernel
 * need not hold: fa_cuda_attention_check_tile). */
bool attn_fast_tile(fa_dtype dt, int64_t D, int64_t Dv, int64_t br, int64_t bc);

/* The wgmma kernel's default key tile at head dim D: 64 at D = 64 (two
 * blocks an SM) and at D = 256 (the shared memory of one), else 128
 * (wgmma_tma's: tma_fit). */
static inline int64_t wgmma_key_tile(int64_t D) { return D == 64 || D == 256 ? 64 : 128; }

/* The part of the tensor-core kernels' fit they share: f16 or bf16 and
 * D = Dv with dims (whether D is one of theirs, dims_text their list): 1,
 * or 0 with why. */
int attn_fit_16bit(fa_dtype dt, int64_t D, int64_t Dv, bool dims, const char *dims_text, char *why, size_t n);

/* Kernel launchers the entries share with the variants and the fallback. */
extern "C" int fa_cuda_wgmma_usable(void);
/* The SIMT kernel for algo: alone (only_if NULL), or behind a fast kernel,
 * running only when its flag only_if is set (two_pass: the output pass). */
fa_status attn_simt_queue(fa_context *ctx, const attn_params *p, fa_attention_algo algo, int *only_if);
/* p's bool mask as bits (attention_mask_bits.cu) at p->mask_bits, with its
 * strides: *bytes of device memory, which the caller frees behind the
 * kernels (p->mask_bits stays NULL on failure). */
fa_status attn_mask_bits_queue(fa_context *ctx, attn_params *p, bool ranges, size_t *bytes);

#endif
