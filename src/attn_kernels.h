/* The registry of attention kernels (API §6): every kernel fa_attention
 * can run, its device, the algos it implements and what calls it takes.
 * opts.kernel names one; fa_attention_kernels lists those that accept a
 * call, fastest first (the registry's order), the first being the one the
 * automatic choice takes. */
#ifndef FA_ATTN_KERNELS_H
#define FA_ATTN_KERNELS_H

#include "check.h"

typedef struct {
  const char *name;
  fa_device device;
  unsigned algos;         /* bit 1u << a for each fa_attention_algo a it implements */
  fa_attention_algo algo; /* the one it runs with algo auto */
  int listed_when_named;  /* listed only when opts.kernel names it: results not of the call's dtype (wgmma_fp8) */
} fa_attn_kernel_info;

extern const fa_attn_kernel_info fa_attn_kernel_table[FA_KERNEL_COUNT];

/* The kernel of this name, or FA_KERNEL_AUTO when there is none. */
fa_attn_kernel fa_attn_kernel_find(const char *name);

/* NULL when kernel k accepts a call of dims d (device, dtype, head dims)
 * with algo (FA_ATTN_AUTO: its own) and the checked opts tile {tq, tk}
 * (0: its default); then *br, *bc are the tile it runs with (0 for the
 * kernels without tiles).  Else why not, formatted into buf (n bytes). */
const char *fa_attn_kernel_refuses(fa_attn_kernel k, const fa_attn_dims *d, fa_attention_algo algo, int64_t tq,
                                   int64_t tk, int64_t *br, int64_t *bc, char *buf, size_t n);

/* The names of the kernels that accept the call, in the registry's order
 * (fastest first; given the call's problem, a kernel that declines it when
 * choosing comes after the next: fa_cuda_attention_kernel_declines, with
 * rows_dense: the kernels read q, k and v with rows D and Dv apart; call
 * NULL: that order unchanged), up to cap into names (may be NULL when cap is
 * 0); returns how many. */
int fa_attn_kernels_accepting(const fa_attn_dims *d, fa_attention_algo algo, int64_t tq, int64_t tk,
                              const fa_attn_problem *call, int rows_dense, const char **names, int cap);

/* Whether fa_attention runs a call of dims d (checked, opts.kernel
 * resolved) and opts o on the decode kernel: named, or chosen
 * automatically (cuda, algo flash, no tile given, a call it takes).  Its
 * opts.splits are then its own chunks of keys, not separate calls. */
int fa_attn_decode_takes(const fa_attn_dims *d, const fa_attention_opts *o);

#endif
