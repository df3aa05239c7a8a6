/* Internal structures of the engine, shared by src/, src/cpu/, kernels/
 * and lua/.  Only src/ checks arguments; backends trust what they get. */
#ifndef FA_INTERNAL_H
#define FA_INTERNAL_H

#include "flashattn.h"
#include "host_device.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
typedef int fa_atomic_int; /* kernels/ (C++) never touch the counts; same size and alignment */
#else
#include <stdatomic.h>
typedef atomic_int fa_atomic_int;
#endif

#define FA_ERRMSG_LEN 512

struct fa_context {
  fa_device device;
  void *stream;
  uint64_t seed_counter; /* for random fills without an explicit seed */
  double timer_start_ms;  /* CPU timer */
  int timer_started;      /* fa_timer_start ran: fa_timer_stop before it is an error */
  fa_device timer_device; /* the device it ran on: a stop on another is an error */
  void *events[2];        /* CUDA timer: start and stop events, made on first use */
  void *cublas;           /* cuBLAS handle, made on first use */
  void *side_stream;      /* CUDA: a stream for work beside the context's (fa_cuda_fork), made on first use */
  void *fork_events[2];   /* its fork and join events */
  int side_device;        /* the device they were made on */
  char error[FA_ERRMSG_LEN];
};

/* Storage: a block of memory on one device, shared by tensors and views. */
typedef struct fa_storage {
  fa_atomic_int refcount;
  fa_device device;
  void *data;
  size_t nbytes;
  int accounted;                           /* counted in fa_memory (engine-owned) */
  int reusable;                            /* CUDA: allocated for a call on the legacy stream */
  void (*release)(void *data, void *user); /* host-owned memory (wrap) */
  void *user;
} fa_storage;

struct fa_tensor {
  fa_atomic_int refcount;
  fa_storage *storage;
  fa_dtype dtype;
  int ndim;
  int64_t shape[FA_MAX_DIMS];
  int64_t strides[FA_MAX_DIMS]; /* elements */
  int64_t offset;               /* elements from storage->data */
};

/* ---- errors (context.c) ---- */
/* Formats "flashattn: ..." into ctx->error (when ctx is not NULL) and
 * returns status. */
fa_status fa_fail(fa_context *ctx, fa_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* NULL where the C API wants a context, a tensor, an array or a place for
 * a result: an argument error, not a crash (in a function whose context
 * is `ctx`; a NULL ctx gets the status alone). */
#define FA_NEED(p)                                                                                 \
  do {                                                                                             \
    if (!(p)) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: %s: %s is NULL", __func__, #p);     \
  } while (0)
/* Shape as "2x3x4" into buf. */
const char *fa_shape_str(const fa_tensor *t, char *buf, size_t n);

/* ---- memory (alloc.c): engine-owned bytes, counted per device ---- */
/* Host allocation counted against the CPU figures and limit (64-byte aligned). */
void *fa_host_alloc(fa_context *ctx, size_t nbytes, fa_status *st);
void fa_host_free(void *p, size_t nbytes);
/* Tensor and storage records (zeroed; freed by fa_host_free), counted on
 * the CPU like any other host memory: a script that holds millions of
 * empty tensors meets the limit. */
void *fa_handle_alloc(fa_context *ctx, size_t nbytes, fa_status *st);
/* Counting for other allocators (CUDA): returns 0 when over the limit. */
int fa_mem_acquire(fa_device device, size_t nbytes);
void fa_mem_release(fa_device device, size_t nbytes);

/* ---- tensors (tensor.c) ---- */
fa_status fa_tensor_new(fa_context *ctx, int ndim, const int64_t *shape, fa_dtype dtype, fa_device device,
                        fa_tensor **out);
/* Same shape as `like`, other dtype/device. */
fa_status fa_tensor_new_like(fa_context *ctx, const fa_tensor *like, fa_dtype dtype, fa_device device,
                             fa_tensor **out);
static inline void *fa_tensor_ptr(const fa_tensor *t) {
  return (char *)t->storage->data + t->offset * (int64_t)fa_dtype_size(t->dtype);
}
int64_t fa_numel_of(int ndim, const int64_t *shape);
/* The first dimension (0-based) of a shape of sizes >= 0 at which the
 * product of its sizes passes what a tensor may hold (fa_tensor_new's
 * "too many" error); -1 when the shape fits. */
int fa_shape_too_large(int ndim, const int64_t *shape);
/* Whether a and b may address the same bytes: one storage, or two whose
 * memory intersects on one device (a host buffer wrapped twice, two DLPack
 * imports of one array): the test for "shares memory with an input". */
int fa_tensor_same_memory(const fa_tensor *a, const fa_tensor *b);
/* Whether the byte ranges a and b span intersect (a strided view's range
 * runs from its first to its last element; empty tensors span nothing), in
 * one storage or two over the same memory. */
int fa_tensor_overlaps(const fa_tensor *a, const fa_tensor *b);
/* Whether no two elements of t share a place in memory (no zero strides
 * over dimensions of more than one element, no interleaved dimensions):
 * a view a kernel may write through. */
int fa_tensor_injective(const fa_tensor *t);
/* Contiguous tensor with dtype `dtype` on the CPU holding t's values
 * (t itself, retained, when it already is one). */
fa_status fa_tensor_cpu_contiguous(fa_context *ctx, fa_tensor *t, fa_dtype dtype, fa_tensor **out);
/* Release helper that tolerates NULL. */
static inline void fa_tensor_drop(fa_tensor **t) {
  if (*t) fa_tensor_release(*t);
  *t = 0;
}

/* ---- dtype conversion (dtype.c) ---- */
uint16_t fa_f32_to_f16(float f);
float fa_f16_to_f32(uint16_t h);
uint16_t fa_f32_to_bf16(float f);
float fa_bf16_to_f32(uint16_t b);
/* Round a double to dtype's precision and back (what storing would keep). */
double fa_dtype_round(fa_dtype d, double v);
/* Element load/store as double at a typed pointer. */
double fa_load_f64(fa_dtype d, const void *p, int64_t i);
void fa_store_f64(fa_dtype d, void *p, int64_t i, double v);
/* Converts n contiguous elements between dtypes (host memory). */
void fa_convert_n(fa_dtype dst_t, void *dst, fa_dtype src_t, const void *src, int64_t n);

/* ---- random (random.c): counter-based, device independent ---- */
double fa_random_uniform(uint64_t seed, uint64_t index); /* [0, 1) */
double fa_random_normal(uint64_t seed, uint64_t index);

/* ---- strided iteration helper ---- */
/* Calls fn(elem_offset, k) for every element of t in row-major order k. */
typedef struct {
  int ndim;
  int64_t shape[FA_MAX_DIMS], strides[FA_MAX_DIMS];
  int64_t idx[FA_MAX_DIMS];
  int64_t offset; /* current element offset relative to the tensor's first */
} fa_iter;
void fa_iter_init(fa_iter *it, const fa_tensor *t);
void fa_iter_next(fa_iter *it);

/* ---- resolved attention problem (built once in attention.c) ---- */
/* Element strides of the batch, head and sequence dimensions of an
 * attention operand (API §6): its last dimension is contiguous, so a row
 * of D elements starts at b·b_st + h·h_st + i·s_st.  0 where the operand
 * has no such dimension (3-D and 2-D calls). */
typedef struct {
  int64_t b, h, s;
} fa_attn_strides;
/* The CPU kernels' keys and values through a paged cache's table (API §8,
 * kv_cache attend): key j of batch b is row j % page_size of page
 * table[b·max_pages + j / page_size] (host), whose rows start page·k_page
 * (v_page) elements into the pool p->k (p->v), k_st.h (v_st.h) and .s the
 * head and row strides within a page.  Sequence b has lens[b] keys, and
 * the kernels run it as a call of its own over them (p->Lk: the longest),
 * so that every rule counts from its own end (bottom-right causal, the
 * window, alibi) or start (top_left). */
typedef struct fa_attn_pages {
  const int64_t *table, *lens;
  int64_t max_pages, page_size, k_page, v_page;
} fa_attn_pages;
typedef struct {
  int64_t B, Hq, Hkv, Lq, Lk, D, Dv;
  double scale;
  double softcap;   /* 0 = off */
  /* scale, softcap and 1 / softcap (0 when off) in f32, made once here for the kernels that compute in
   * f32: a conversion from f64 in a key loop runs on Hopper's FP64 pipe, which the tensor cores share,
   * and waits for their products (ptxas remakes such values from the parameters in the loop) */
  float scale_f, softcap_f, inv_softcap_f;
  fa_causal causal;
  /* The caller's index of key 0: 0, but on the CPU the start of an
   * opts.splits piece, whose keys are a view from there (src/splits.c), so
   * that top_left's diagonal and the variants' k count as the whole call's
   * (the bottom-right diagonal, the window and alibi count from the end). */
  int64_t key_base;
  int64_t win_left, win_right; /* -1 = unbounded on that side; used when has_window */
  int has_window;
  /* Float or bool mask: mask_f (of dtype mask_dtype: on the CPU the
   * compute dtype, or an f16/bf16 mask read where it lies by f32 kernels;
   * on cuda f32, whatever the compute dtype) or mask_b (bytes), indexed
   * with broadcast strides (0 where broadcast) over (B, Hq, Lq, Lk). */
  const void *mask_f;
  fa_dtype mask_dtype;
  const uint8_t *mask_b;
  int64_t mask_strides[4];
  /* CUDA, the kernels that score in fragments: mask_b as bits (bit k % 32 of word k / 32 is key k),
   * made by the dispatch for them (kernels/attention/attention_mask_bits.cu), its (B, Hq, Lq)
   * strides in words, 0 where broadcast; NULL elsewhere */
  const uint32_t *mask_bits;
  int64_t mask_bits_strides[3];
  const int64_t *kv_lens; /* B entries or NULL */
  /* The same lengths on the host (opts.kv_lens, a paged cache's), or NULL:
   * the decode kernel takes up to FA_KV_LENS_INLINE of them in its
   * parameters, so that a block's first read is not theirs, and such a call
   * needs no device copy (kv_lens is then NULL) */
  const int64_t *kv_lens_host;
  const double *alibi;    /* Hq entries or NULL */
  int64_t tile_q, tile_k; /* resolved: > 0 */
  /* opts.tile was given: a kernel chosen automatically runs it as it is, not a tile of its own
   * (wgmma's 64 keys at D = 64, wgmma_tma's 176 at D = 128); on the CPU, query tiles of one head
   * (no GQA packing) */
  int tile_given;
  /* CPU "flash" and "two_pass": opts.splits, the chunks the keys are cut
   * into within the call (src/cpu/attention_query_tile_impl.h): 0 ("auto")
   * chunks over the threads where a call's tiles are fewer, 1 none, s > 1
   * s chunks at Lk·c/s (never more than Lk) */
  int64_t key_chunks;
  fa_dtype compute;       /* FA_F32 or FA_F64 on the CPU; the storage dtype on CUDA */
  /* The CPU kernels (not the reference): the dtype q, k, v lie in
   * (storage) and o is written in (o_dtype: storage, or compute for an
   * opts.splits piece, so that the merge rounds once), compute's or
   * f16/bf16 computed in f32, whose tiles the kernels widen and narrow as
   * they go (src/cpu/stage.h); compute itself elsewhere */
  fa_dtype storage, o_dtype;
  /* Inputs and outputs, read and written through their strides (CPU: in
   * the compute dtype).  o: (B,Hq,Lq,Dv); lse (f32) or lse64 (f64: the
   * reference's, and an opts.splits piece's: every dtype on the CPU, f32
   * on cuda; so that their merge is not rounded to f32 at |lse|): (B,Hq,Lq) or NULL,
   * lse_st.s its row stride. */
  const void *q, *k, *v;
  void *o;
  float *lse;
  double *lse64;
  fa_attn_strides q_st, k_st, v_st, o_st, lse_st;
  /* CPU and the reference: the variants of API §9 (src/expr.h), or NULL */
  const fa_expr *score_mod, *mask_mod;
  /* CPU "flash" and "two_pass": the call's opts.block_mask (checked to fit
   * its sizes and tile), or NULL */
  const fa_block_mask *block_mask;
  /* CPU "flash", "two_pass" and "naive": k and v through a paged cache, or NULL */
  const fa_attn_pages *pages;
} fa_attn_problem;

/* Strides of contiguous (B, H, L, X) buffers for q, k, v, o (X = D or Dv)
 * and a contiguous (B, Hq, Lq) lse: the layout of the engine's own
 * buffers (fa_attn_resolve_options sets these; the callers replace those
 * of operands they hand over as they are). */
void fa_attn_strides_contiguous(fa_attn_problem *p);
static inline fa_attn_strides fa_attn_strides_dense(int64_t H, int64_t L, int64_t X) {
  fa_attn_strides s = {H * L * X, L * X, X};
  return s;
}

/* The key range [lo, hi) that causal, window and kv_lens leave to query
 * row i of batch b (hi <= lo when none).  Elementwise masks are not
 * included. */
void fa_attn_key_range(const fa_attn_problem *p, int64_t b, int64_t i, int64_t *lo, int64_t *hi);

/* ---- CPU backend (src/cpu/) ---- */
fa_status fa_cpu_attention(fa_context *ctx, fa_attention_algo algo, const fa_attn_problem *p);
fa_status fa_cpu_attention_reference(fa_context *ctx, const fa_attn_problem *p);
int64_t fa_cpu_softmax_fused_max_n(fa_dtype dt);
/* fa.matmul's operands as the backends take them (API §6: read where they
 * lie): row-major A (m x k) and B (k x n) with rows lda and ldb elements
 * apart (lda >= k, ldb >= n, within int: BLAS's leading dimensions; their
 * last dimension contiguous), C (m x n) contiguous. */
typedef struct fa_mm_operands {
  const void *a, *b;
  void *c;
  int64_t m, k, n, lda, ldb;
} fa_mm_operands;
/* Row-major C = A·B, f32 or f64. */
fa_status fa_cpu_matmul(fa_context *ctx, fa_matmul_algo algo, int64_t tile, fa_dtype dt, const fa_mm_operands *g);
/* Where the rows of a state lie (API §6: read in place): row r, counted
 * over its leading dimensions (those that follow each other in memory
 * merged, then padded in front to three: size 1, stride 0), starts at
 * element fa_state_row(&rows, r); its dv values are contiguous.  A state
 * whose rows are one run (a contiguous one) takes no division: cuda's
 * merge works this out for every element. */
typedef struct fa_state_rows {
  int64_t size[3], stride[3];
} fa_state_rows;
FA_HOST_DEVICE static inline int64_t fa_state_row(const fa_state_rows *s, int64_t r) {
  if (s->size[0] == 1 && s->size[1] == 1) return r * s->stride[2];
  return r / (s->size[1] * s->size[2]) * s->stride[0] + r / s->size[2] % s->size[1] * s->stride[1] +
         r % s->size[2] * s->stride[2];
}
/* The rows of t (ndim >= 1) over its leading dimensions, as
 * fa_state_row reads them: each dimension merged into the one after it
 * where it steps over that one whole. */
fa_state_rows fa_tensor_rows(const fa_tensor *t);
/* Softmax of rows (rows, n) of x at xr (API §6: where they lie, each row
 * contiguous) into y, contiguous (rows, n), in dtype f32 or f64 (y may be x
 * when x's rows are dense).  `storage` is the user's dtype: NAIVE holds its
 * e^x in it, so that f16 overflows past e^11.09 as the seeds say. */
fa_status fa_cpu_softmax(fa_context *ctx, fa_softmax_algo algo, int64_t block, fa_dtype dt, fa_dtype storage,
                         const void *x, const fa_state_rows *xr, void *y, int64_t rows, int64_t n);
/* merge_states' operands: states o1, o2 at their rows, of dtypes dt1, dt2
 * (the merge's dt; on the CPU an f16/bf16 state merged in f32 may be read
 * as it lies), lse1, lse2 in f64 (so that f64 states merge to f64
 * precision), into o contiguous rows x dv (dtype dt) and lse (rows entries,
 * also when dv = 0). */
typedef struct fa_merge_operands {
  const void *o1, *o2;
  fa_state_rows rows1, rows2;
  const double *lse1, *lse2;
  void *o;
  double *lse;
  int64_t rows, dv;
  fa_dtype dt1, dt2;
} fa_merge_operands;
void fa_cpu_merge_states(fa_dtype dt, const fa_merge_operands *g);
/* One row of it: o (dv entries, may be o1 or o2) and *lse from the states
 * (o1, l1) and (o2, l2); the CPU attention's key chunks fold theirs with it. */
void fa_cpu_merge_row_f32(const float *o1, double l1, const float *o2, double l2, float *o, double *lse, int64_t dv);
void fa_cpu_merge_row_f64(const double *o1, double l1, const double *o2, double l2, double *o, double *lse, int64_t dv);
int fa_cpu_threads(void);
/* The OpenMP threads for `items` independent work items of `flops`
 * operations in all (cpu.c): at most the items, and one for a small call. */
int fa_cpu_threads_for(int64_t items, double flops);
/* The operations of a forward call, 2·B·Hq·Lq·Lk·(D + Dv): what decides its threads. */
static inline double fa_attn_flops(const fa_attn_problem *p) {
  return 2.0 * (double)p->B * (double)p->Hq * (double)p->Lq * (double)p->Lk * (double)(p->D + p->Dv);
}
const char *fa_cpu_simd(void);
/* Set BLAS to one thread (the engine threads with OpenMP itself). */
void fa_cpu_blas_init(void);

/* ---- CUDA backend (kernels/), stubs when built without CUDA ---- */
int fa_cuda_available(void);
/* The index of the GPU the engine's CUDA calls run on (the current one),
 * or -1 when there is none or it cannot be told. */
int fa_cuda_current_index(void);
fa_status fa_cuda_device_info(fa_context *ctx, fa_device_info_t *out);
fa_status fa_cuda_malloc(fa_context *ctx, void **p, size_t nbytes);
void fa_cuda_free(void *p, size_t nbytes);
/* Whether ctx's work goes to the legacy default stream (never captured
 * into a CUDA graph), and fa_cuda_free for a block allocated for such a
 * call, which the engine may keep and give again (kernels/core/memory.cu):
 * a block allocated while a host's stream was captured belongs to the
 * graph and must go back through fa_cuda_free. */
int fa_cuda_legacy_stream(const fa_context *ctx);
void fa_cuda_free_reusable(void *p, size_t nbytes);
/* The same ordered on ctx's stream: a call's temporaries, which its
 * kernels on that stream may still read (the legacy stream does not wait
 * for a host's non-blocking stream). */
void fa_cuda_free_on(fa_context *ctx, void *p, size_t nbytes);
/* FA_COPY_H2D_PINNED: from pinned memory (fa_cuda_host_alloc), without
 * waiting: the source must stay as it is until the stream has passed the
 * copy (record an event after it and wait for that before writing it). */
typedef enum { FA_COPY_H2D, FA_COPY_D2H, FA_COPY_D2D, FA_COPY_H2D_PINNED } fa_copy_kind;
fa_status fa_cuda_memcpy(fa_context *ctx, void *dst, const void *src, size_t nbytes, fa_copy_kind kind);
/* Host bytes (a call's small arrays) to device memory, queued on the
 * context's stream without waiting for it: src may be reused at once. */
fa_status fa_cuda_upload(fa_context *ctx, void *dst, const void *src, size_t nbytes);
fa_status fa_cuda_sync(fa_context *ctx);
/* Pinned host memory (the source of FA_COPY_H2D_PINNED copies), and events
 * to know when such a copy has left it. */
fa_status fa_cuda_host_alloc(fa_context *ctx, void **p, size_t nbytes);
void fa_cuda_host_free(void *p, size_t nbytes);
fa_status fa_cuda_event_new(fa_context *ctx, void **ev);
void fa_cuda_event_free(void *ev);
fa_status fa_cuda_event_record(fa_context *ctx, void *ev);
fa_status fa_cuda_event_wait(fa_context *ctx, void *ev); /* the host waits */
fa_status fa_cuda_timer_start(fa_context *ctx);
fa_status fa_cuda_timer_stop(fa_context *ctx, double *ms);
void fa_cuda_context_release(fa_context *ctx); /* the context's events, side stream and cuBLAS handle */
/* The attention kernels of the registry (src/attn_kernels.h; API §6), in
 * its order, fastest first; FA_KERNEL_AUTO: none named, the automatic
 * choice. */
typedef enum {
  FA_KERNEL_AUTO = -1,
  FA_KERNEL_DECODE = 0, /* cuda: split-KV decoding, a few query rows a key head, f16/bf16 */
  FA_KERNEL_WGMMA_TMA,  /* cuda: Hopper, warp-specialised with TMA copies, f16/bf16, flash */
  FA_KERNEL_WGMMA,      /* cuda: Hopper tensor cores, f16/bf16 */
  FA_KERNEL_MMA,        /* cuda: mma.sync tensor cores, f16/bf16 */
  FA_KERNEL_F32,        /* cuda: the exact-f32 kernel (Hopper) */
  FA_KERNEL_SIMT,       /* cuda: the SIMT tiled kernel, every dtype */
  FA_KERNEL_NAIVE,      /* cuda: algo naive (cuBLAS) */
  FA_KERNEL_ROW,        /* cuda: algo flash_row */
  FA_KERNEL_WGMMA_FP8,  /* cuda: Hopper, e4m3 operands with per-tile scales, f16/bf16 calls at D = 128, flash; named only */
  FA_KERNEL_CPU_FLASH,
  FA_KERNEL_CPU_TWO_PASS,
  FA_KERNEL_CPU_NAIVE,
  FA_KERNEL_CPU_FLASH_ROW,
  FA_KERNEL_COUNT
} fa_attn_kernel;

/* "flash" with p->score_mod and / or p->mask_mod (API §9; their captured
 * tensors on the device), compiled at run time into the kernel named
 * (AUTO, WGMMA, MMA or SIMT; kernels/attention/attention_variant.cu);
 * "two_pass" and "flash_row" into their SIMT kernels, "naive" into its row
 * kernel between cuBLAS's products.  A read out of range is recorded in the
 * expression (fa_expr_fault). */
fa_status fa_cuda_attention_variant(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel,
                                    const fa_attn_problem *p);
/* The tests' check of the variants' generated CUDA C without a device:
 * score_mod and mask_mod's unit for dtype compiled by NVRTC for arch (e.g.
 * "sm_90a") with each of the n kernel instances named, those of bit i of
 * guards as a call compiles the SIMT guard behind a fast kernel. */
fa_status fa_cuda_variant_compile(fa_context *ctx, const fa_expr *score_mod, const fa_expr *mask_mod, fa_dtype dtype,
                                  const char *arch, const char *const *names, int n, unsigned guards);
/* fa_block_mask_new on the device: the state of every tile of Br x Bc of
 * mask_mod e (its tensors on the device) into state (host memory, B·H·nq·nk
 * bytes); a read out of range is recorded in e (fa_expr_fault). */
fa_status fa_cuda_block_mask(fa_context *ctx, const fa_expr *e, int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                             int64_t Br, int64_t Bc, uint8_t *state);
/* For the registry's "flash" kernels (WGMMA_TMA, WGMMA, MMA, F32, SIMT):
 * 1 when kernel takes calls of this dtype and these head dims on this
 * device, *br, *bc its default tile; else 0 and why not into why (n bytes). */
int fa_cuda_attention_kernel_fit(fa_attn_kernel kernel, fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc,
                                 char *why, size_t n);
/* Whether that kernel (fitting the call) takes tile {br, bc} at head dim D. */
int fa_cuda_attention_kernel_tile_ok(fa_attn_kernel kernel, int64_t D, int64_t br, int64_t bc);
/* Whether that kernel leaves call p (its key tile p->tile_k, 0: its
 * default; rows_dense: q, k and v rows D and Dv apart) to the next one when
 * the choice is automatic (it takes it when named): the next is faster
 * there. */
int fa_cuda_attention_kernel_declines(fa_attn_kernel kernel, const fa_attn_problem *p, int rows_dense);
/* Keys and values read through a page table (the paged KV cache, API §8):
 * key j of batch b is row j % page_size of page table[b·max_pages + j /
 * page_size] (device int32), whose rows start page·k_page (v_page)
 * elements into the pool p->k (p->v); p->k_st.h and .s are the head and
 * row strides within a page, p->kv_lens (device) the sequences' lengths,
 * and each sequence is aligned (causal, window, alibi) to its own length. */
typedef struct {
  const int32_t *table;
  int64_t max_pages, page_size, k_page, v_page;
} fa_attn_paging;
#define FA_KV_LENS_INLINE 64 /* kv_lens_host entries the decode kernel takes in its parameters */
/* The paged cache's append (kernels/tensor/kv_scatter.cu): segments of
 * rows, each within one page, copied from src (B, H, n, X; its dtype the
 * pool's, last dimension contiguous) into the pool (pages, H, page_size,
 * X), one launch for up to FA_KV_SEGMENTS of them (a kernel argument). */
typedef struct {
  int32_t b, from, page, off, count;
} fa_kv_segment;
#define FA_KV_SEGMENTS 192 /* 3.8 KB: within the 4 KB of kernel arguments every driver takes */
typedef struct {
  int n;
  fa_kv_segment seg[FA_KV_SEGMENTS];
} fa_kv_segments;
fa_status fa_cuda_kv_scatter(fa_context *ctx, const fa_kv_segments *s, fa_tensor *pool, const fa_tensor *src);
/* The paged cache's attend for the calls the decode kernel does not take
 * (kernels/tensor/kv_gather.cu): every sequence's rows of pool (pages, H,
 * page_size, X) gathered through table (device int32, B x max_pages) into
 * dst (B, H, L, X, contiguous, the pool's dtype), sequence b's lens[b]
 * (device) rows first, or (right) last, the other rows zeroed; mask (device
 * (B, L) bytes, or NULL) gets 1 where a sequence's key lies; one launch. */
fa_status fa_cuda_kv_gather(fa_context *ctx, const int32_t *table, int64_t max_pages, const int64_t *lens,
                            const fa_tensor *pool, fa_tensor *dst, int right, uint8_t *mask);
/* The decode kernel (kernels/attention/attention_decode.cu): 1 when it
 * takes calls of this dtype, these head dims and Hq / Hkv · Lq query rows
 * a key head, else 0 and why not into why (n bytes). */
int fa_cuda_attention_decode_fit(fa_dtype dt, int64_t D, int64_t Dv, int64_t Hq, int64_t Hkv, int64_t Lq, char *why,
                                 size_t n);
/* Attention on device buffers, through the registry of CUDA kernels
 * (kernels/attention/attention_registry.cu): p holds device pointers,
 * p->compute is the storage dtype (f32, f16, bf16) and the float mask is
 * f32.  kernel FA_KERNEL_AUTO: the first kernel that implements algo and
 * takes the call and its tile; else the kernel named (FA_ERR_UNSUPPORTED
 * when it declines); behind a fast "flash" / "two_pass" kernel the SIMT
 * kernel for NaN/inf in V.  FA_KERNEL_DECODE (taken only when named: a
 * call that fits, fa_attn_decode_takes; rows on 16 bytes) reads k and v
 * through pg, a page table, when not NULL, and cuts the keys into splits
 * chunks (0: chosen from the shape and the GPU). */
fa_status fa_cuda_attention_run(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel,
                                const fa_attn_paging *pg, int64_t splits, const fa_attn_problem *p);
/* The backward pass on device buffers (API §10): p as for the forward
 * (q, k, v, o and lse (f32) read through their strides; the forward's
 * options), dout (B, Hq, Lq, Dv) through dout_st; dq (B, Hq, Lq, D), dk
 * (B, Hkv, Lk, D) and dv (B, Hkv, Lk, Dv) dense in p->compute, every
 * element written (zeros where nothing flows).  The same bits from run to
 * run, except dq on the wgmma kernel when deterministic is 0 (atomics). */
typedef struct {
  const void *dout;
  fa_attn_strides dout_st;
  void *dq, *dk, *dv;
  int deterministic;
  /* NULL, or a device flag that the kernels set to 1 where a gradient they
   * write holds NaN or inf: the check of their outputs that the wgmma
   * kernel's fused instances make in place of passes over q and k
   * (bw_guarded) */
  int *nonfinite;
  /* NULL, or the dQ sums of the wgmma kernel's fused instances (f32, or
   * FIXED's int32; fa_cuda_backward_wgmma_acc_bytes), zeroed by the delta
   * kernel beside its reads in place of a memset of their own
   * (fa_cuda_backward_run) */
  float *dq_acc;
} fa_attn_grads;
/* kernel: FA_KERNEL_AUTO (the fastest that takes the call), or the
 * backward's FA_KERNEL_WGMMA, FA_KERNEL_MMA or FA_KERNEL_SIMT
 * (FA_ERR_UNSUPPORTED, saying why, when it does not take it).  D and Dv
 * up to 256 (the caller checks, src/backward.c). */
fa_status fa_cuda_attention_backward(fa_context *ctx, fa_attn_kernel kernel, const fa_attn_problem *p,
                                     const fa_attn_grads *g);
/* The same with p's score_mod / mask_mod (API §9, §10): the SIMT kernels
 * compiled with the variant (kernel: FA_KERNEL_AUTO or SIMT). */
fa_status fa_cuda_attention_backward_variant(fa_context *ctx, fa_attn_kernel kernel, const fa_attn_problem *p,
                                             const fa_attn_grads *g);
/* Row-major C = A·B on device buffers of dtype dt. */
fa_status fa_cuda_matmul(fa_context *ctx, fa_matmul_algo algo, int64_t tile, fa_dtype dt, const fa_mm_operands *g);
/* fa_cpu_merge_states on device buffers (f32, f64, f16 or bf16) */
fa_status fa_cuda_merge_states(fa_context *ctx, fa_dtype dt, const fa_merge_operands *g);
/* The default {Br, Bc} of "flash" on cuda for this dtype and head dims. */
void fa_cuda_attention_default_tile(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc);
/* FA_OK when {br, bc} is a tile the CUDA kernels take for these head dims. */
fa_status fa_cuda_attention_check_tile(fa_context *ctx, fa_dtype dt, int64_t D, int64_t Dv, int64_t br, int64_t bc);
/* Softmax of rows (rows, n) of x at xr (API §6: where they lie, each row
 * contiguous) into y, contiguous, device buffers of dtype dt (y may be x
 * when x's rows are dense). */
fa_status fa_cuda_softmax(fa_context *ctx, fa_softmax_algo algo, int64_t block, fa_dtype dt, const void *x,
                          const fa_state_rows *xr, void *y, int64_t rows, int64_t n);
int64_t fa_cuda_softmax_fused_max_n(fa_dtype dt);
/* Elementwise work on device tensors (any strides; dst/r contiguous for binary). */
fa_status fa_cuda_copy(fa_context *ctx, fa_tensor *dst, const fa_tensor *src);
fa_status fa_cuda_fill(fa_context *ctx, fa_tensor *t, int kind, uint64_t seed, double value); /* kind < 0: constant */
fa_status fa_cuda_binary(fa_context *ctx, fa_tensor *r, const fa_tensor *a, const fa_tensor *b, int op, double scalar);
/* out: sum, sum of squares, max, min, NaN count, non-finite count */
fa_status fa_cuda_reduce(fa_context *ctx, const fa_tensor *t, double out[6]);

#endif
