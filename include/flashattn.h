/* flashattn: a C engine for exact attention built on online softmax.
 *
 * The public C API for host applications.  Every function that can fail
 * returns an fa_status; the message for the last failure on a context is
 * fa_context_error(ctx).  Tensors are reference counted: every fa_tensor *
 * handed out by a function here owns one reference that the caller drops
 * with fa_tensor_release().  Shapes are row-major, 1 to 4 dimensions,
 * strides are counted in elements.
 *
 * NULL is never a crash: a function that returns an fa_status gives
 * FA_ERR_ARGUMENT for a NULL context, tensor, array or result pointer
 * (the message is in the context, when there is one, and nothing is
 * written to the results); the accessors give the neutral values noted
 * beside them.  The Lua functions at the end need a valid lua_State, as
 * Lua's own API does. */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#include "flashattn_version.h" /* FA_VERSION, FA_VERSION_MAJOR/MINOR/PATCH */

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FA_API __declspec(dllexport)
#else
#define FA_API __attribute__((visibility("default")))
#endif

/* The version of the library linked at run time (FA_VERSION is the one
 * compiled against); both come from project(VERSION) in CMakeLists.txt. */
FA_API const char *fa_version(void);

#define FA_MAX_DIMS 4

typedef enum {
  FA_OK = 0,
  FA_ERR_ARGUMENT,      /* a bad argument or option value */
  FA_ERR_SHAPE,         /* shapes that do not fit together */
  FA_ERR_DTYPE,         /* an element type the call does not take */
  FA_ERR_DEVICE,        /* a device that is absent or does not match */
  FA_ERR_OUT_OF_MEMORY, /* host or device memory (or the engine's limit) */
  FA_ERR_UNSUPPORTED,   /* valid, but not provided by this backend/build */
  FA_ERR_BACKEND        /* the backend failed (a CUDA error, ...) */
} fa_status;

typedef enum { FA_F32 = 0, FA_F16, FA_BF16, FA_F64, FA_BOOL } fa_dtype;
typedef enum { FA_CPU = 0, FA_CUDA } fa_device;

typedef struct fa_context fa_context;
typedef struct fa_tensor fa_tensor;
/* An attention variant's traced expression (API §9): opaque, built by the
 * Lua binding (fa_expr_new below; its node format is internal). */
typedef struct fa_expr fa_expr;
typedef struct fa_expr_node fa_expr_node;
/* Which (query tile, key tile) pairs a mask_mod leaves empty, full or partial (API §9). */
typedef struct fa_block_mask fa_block_mask;

/* What the accessors give for a NULL context or tensor: no dtype, no
 * device (fa_dtype_name and fa_device_name show them as "?"). */
#define FA_DTYPE_NONE ((fa_dtype)-1)
#define FA_DEVICE_NONE ((fa_device)-1)

/* ---- context ---------------------------------------------------------- */

/* Creates a context whose default device is `device` (FA_CPU or FA_CUDA).
 * Fails with FA_ERR_DEVICE when that device is not usable. */
FA_API fa_status fa_context_create(fa_device device, fa_context **out);
/* The default device an engine picks: FLASHATTN_DEVICE's when it is set
 * (FA_DEVICE_NONE when it names no device: a typo then fails in
 * fa_context_create instead of falling back to another device), else CUDA
 * when a usable GPU is present, else CPU. */
FA_API fa_device fa_default_device(void);
FA_API void fa_context_destroy(fa_context *ctx);
FA_API const char *fa_context_error(const fa_context *ctx);
FA_API fa_device fa_context_device(const fa_context *ctx); /* NULL: FA_DEVICE_NONE */
FA_API fa_status fa_context_set_device(fa_context *ctx, fa_device device);
/* A cudaStream_t for the CUDA backend (NULL = the default stream). */
FA_API fa_status fa_context_set_stream(fa_context *ctx, void *stream);
FA_API void *fa_context_stream(const fa_context *ctx); /* NULL ctx: NULL */
/* Waits for all work queued on the context's stream. */
FA_API fa_status fa_sync(fa_context *ctx);

FA_API const char *fa_status_name(fa_status s);
FA_API const char *fa_dtype_name(fa_dtype d);
FA_API const char *fa_device_name(fa_device d);
FA_API size_t fa_dtype_size(fa_dtype d);
/* Parses "f32", "float", "f16", "half", "bf16", "bfloat16", "f64",
 * "double", "bool".  Returns 0 on success, -1 otherwise (NULLs too). */
FA_API int fa_dtype_parse(const char *name, fa_dtype *out);
/* Parses "cpu", "cuda" (the current GPU; "gpu" too) and "cuda:N" where N
 * is the current GPU's index (cuda:0 where there is no GPU, which then
 * fails as "cuda" does): one GPU an engine in this version.  0 or -1. */
FA_API int fa_device_parse(const char *name, fa_device *out);
/* N of a "cuda:N" name (decimal digits), else -1: whether a name that
 * fa_device_parse refused names a GPU, so that errors can say so. */
FA_API int fa_device_cuda_index(const char *name);
/* *index = the current GPU's index (the one "cuda" names), or -1 where
 * there is no usable GPU. */
FA_API void fa_device_cuda_current(int *index);
/* 1 when the backend can run on this machine. */
FA_API int fa_backend_available(fa_device device);

/* ---- tensors ---------------------------------------------------------- */

/* Uninitialised contiguous tensor. */
FA_API fa_status fa_tensor_empty(fa_context *ctx, int ndim, const int64_t *shape, fa_dtype dtype,
                                 fa_device device, fa_tensor **out);
/* Zero-copy tensor over memory the host owns.  `data` is aligned to the
 * element size (else FA_ERR_ARGUMENT).  `strides` may be NULL for
 * row-major contiguous; given, each is >= 0 and the elements they address
 * (also through size-1 and size-0 dimensions) lie within 2^59 elements of
 * the first, so that no offset computation can overflow.  When the last
 * reference goes, `release(data, user)` is called if not NULL.  On failure
 * `release` is not called. */
FA_API fa_status fa_tensor_wrap(fa_context *ctx, void *data, fa_device device, fa_dtype dtype, int ndim,
                                const int64_t *shape, const int64_t *strides,
                                void (*release)(void *data, void *user), void *user, fa_tensor **out);
FA_API void fa_tensor_retain(fa_tensor *t);
FA_API void fa_tensor_release(fa_tensor *t);

/* Accessors.  A NULL t gives ndim 0, size, stride and numel -1, dtype
 * FA_DTYPE_NONE, device FA_DEVICE_NONE, data NULL, is_contiguous 0; a dim
 * out of range gives size and stride -1. */
FA_API int fa_tensor_ndim(const fa_tensor *t);
FA_API int64_t fa_tensor_size(const fa_tensor *t, int dim);   /* 0-based dim */
FA_API int64_t fa_tensor_stride(const fa_tensor *t, int dim); /* elements */
FA_API int64_t fa_tensor_numel(const fa_tensor *t);
FA_API fa_dtype fa_tensor_dtype(const fa_tensor *t);
FA_API fa_device fa_tensor_device(const fa_tensor *t);
FA_API void *fa_tensor_data(const fa_tensor *t); /* address of the first element */
FA_API int fa_tensor_is_contiguous(const fa_tensor *t);

/* Views share storage with `t` (0-based dims and indices).  fa_tensor_view
 * takes one -1 size (inferred) and any strides that can hold the shape
 * (PyTorch's rule), else FA_ERR_SHAPE; fa_tensor_reshape is that view when
 * it exists, else a view of a contiguous copy. */
FA_API fa_status fa_tensor_view(fa_context *ctx, fa_tensor *t, int ndim, const int64_t *shape, fa_tensor **out);
FA_API fa_status fa_tensor_reshape(fa_context *ctx, fa_tensor *t, int ndim, const int64_t *shape, fa_tensor **out);
FA_API fa_status fa_tensor_select(fa_context *ctx, fa_tensor *t, int dim, int64_t index, fa_tensor **out);
FA_API fa_status fa_tensor_narrow(fa_context *ctx, fa_tensor *t, int dim, int64_t start, int64_t len,
                                  fa_tensor **out);
FA_API fa_status fa_tensor_transpose(fa_context *ctx, fa_tensor *t, int d1, int d2, fa_tensor **out);
/* `t` itself (retained) when already contiguous, else a contiguous copy. */
FA_API fa_status fa_tensor_contiguous(fa_context *ctx, fa_tensor *t, fa_tensor **out);
/* A copy converted to dtype and device (`t` retained when nothing changes). */
FA_API fa_status fa_tensor_to(fa_context *ctx, fa_tensor *t, fa_dtype dtype, fa_device device, fa_tensor **out);
FA_API fa_status fa_tensor_clone(fa_context *ctx, fa_tensor *t, fa_tensor **out);
/* dst <- src, same shape, any dtypes and devices. */
FA_API fa_status fa_tensor_copy(fa_context *ctx, fa_tensor *dst, fa_tensor *src);
FA_API fa_status fa_tensor_fill(fa_context *ctx, fa_tensor *t, double value);
FA_API fa_status fa_tensor_get(fa_context *ctx, fa_tensor *t, const int64_t *index, double *value);
FA_API fa_status fa_tensor_set(fa_context *ctx, fa_tensor *t, const int64_t *index, double value);
/* Contiguous copy of the elements as doubles into `out` (numel entries). */
FA_API fa_status fa_tensor_read_f64(fa_context *ctx, fa_tensor *t, double *out);
/* Element values from doubles (numel entries, row-major order). */
FA_API fa_status fa_tensor_write_f64(fa_context *ctx, fa_tensor *t, const double *values);

typedef enum { FA_FILL_UNIFORM = 0, FA_FILL_NORMAL, FA_FILL_ARANGE } fa_fill_kind;
/* Uniform [0,1) or standard normal values that depend only on (seed,
 * element index): the same on every device and dtype up to rounding. */
FA_API fa_status fa_tensor_fill_random(fa_context *ctx, fa_tensor *t, fa_fill_kind kind, uint64_t seed);
/* The n-th seed of the sequence the Lua binding draws from for random
 * fills without opts.seed (splitmix64 of n): distinct, well mixed, and the
 * same on every run. */
FA_API uint64_t fa_seed_at(uint64_t n);

typedef enum { FA_REDUCE_SUM = 0, FA_REDUCE_MAX, FA_REDUCE_MIN, FA_REDUCE_NORM } fa_reduce_op;
/* Reductions accumulate in f64.  An empty tensor gives 0 (sum, norm) or
 * FA_ERR_ARGUMENT (max, min). */
FA_API fa_status fa_tensor_reduce(fa_context *ctx, fa_tensor *t, fa_reduce_op op, double *out);
FA_API fa_status fa_tensor_isfinite(fa_context *ctx, fa_tensor *t, int *out);

typedef enum { FA_BIN_ADD = 0, FA_BIN_SUB, FA_BIN_MUL, FA_BIN_DIV, FA_BIN_RSUB, FA_BIN_RDIV } fa_binary_op;
/* out = a op b (b a same-shape tensor) or a op scalar (b NULL), in a's
 * dtype, each element computed in f64 and rounded once; RSUB and RDIV
 * reverse the operands (b - a, scalar / a). */
FA_API fa_status fa_tensor_binary(fa_context *ctx, fa_tensor *a, fa_binary_op op, fa_tensor *b, double scalar,
                                  fa_tensor **out);

/* ‖a−ref‖₂/‖ref‖₂ and max|a−b| in f64 (same shape). */
FA_API fa_status fa_rel_error(fa_context *ctx, fa_tensor *a, fa_tensor *ref, double *out);
FA_API fa_status fa_max_abs_diff(fa_context *ctx, fa_tensor *a, fa_tensor *b, double *out);

/* ---- kernels ---------------------------------------------------------- */

typedef enum {
  FA_SOFTMAX_AUTO = 0,
  FA_SOFTMAX_NAIVE,  /* e^x / Σe^x, no max subtracted */
  FA_SOFTMAX_SAFE,   /* three passes */
  FA_SOFTMAX_ONLINE, /* two passes, running (m, d), block size `block` */
  FA_SOFTMAX_FUSED   /* the row held on chip, read once */
} fa_softmax_algo;

typedef struct {
  fa_softmax_algo algo;
  int64_t block; /* for ONLINE; 0 = default */
  fa_tensor *out; /* optional preallocated output */
} fa_softmax_opts;

FA_API void fa_softmax_opts_init(fa_softmax_opts *o);
/* Softmax over the last dimension.  *y gets a new reference (opts->out
 * retained when given). */
FA_API fa_status fa_softmax(fa_context *ctx, fa_tensor *x, const fa_softmax_opts *opts, fa_tensor **y);
/* The largest row length the FUSED algo accepts for dtype on device
 * (ctx is not used and may be NULL). */
FA_API int64_t fa_softmax_fused_max_n(fa_context *ctx, fa_dtype dtype, fa_device device);

typedef enum {
  FA_ATTN_AUTO = 0,
  FA_ATTN_NAIVE,     /* S and P materialised, then P·V */
  FA_ATTN_TWO_PASS,  /* online statistics, then the output pass */
  FA_ATTN_FLASH_ROW, /* the one-pass recurrence, one query row at a time */
  FA_ATTN_FLASH      /* tiled and fused */
} fa_attention_algo;

typedef enum {
  FA_CAUSAL_NONE = 0,
  FA_CAUSAL_BOTTOM_RIGHT, /* query i sees keys j <= i + Lk - Lq */
  FA_CAUSAL_TOP_LEFT      /* query i sees keys j <= i */
} fa_causal;

typedef struct {
  fa_attention_algo algo;
  int has_scale;          /* 0: scale = 1/sqrt(D) */
  double scale;           /* finite; |scale| <= FLT_MAX where the call computes in f32 (not f64 inputs, not the reference) */
  fa_causal causal;
  int has_window;         /* window = {left, right}, -1 = unbounded */
  int64_t window_left, window_right;
  fa_tensor *mask;        /* bool (true = attend) or float added to scores; broadcastable to (B,Hq,Lq,Lk) */
  const int64_t *kv_lens; /* B entries or NULL */
  int64_t n_kv_lens;
  const double *alibi;    /* Hq slopes or NULL */
  int64_t n_alibi;
  double softcap;         /* > 0: s -> c·tanh(s/c); 0 = off */
  int64_t tile_q, tile_k; /* both 0 = backend default (one 0 beside a size is out of range); FA_TILE_ZERO: see below */
  int return_lse;
  fa_tensor *out, *lse_out; /* optional preallocated outputs; they must not overlap each other */
  /* Split-KV (API §8): 0 = auto, s >= 1 cuts the keys into s contiguous
   * pieces whose partial states are merged: the same result within
   * rounding.  On cuda's decode kernel (f16/bf16, D = Dv = 64 or 128,
   * Hq / Hkv * Lq <= 64 or Lq <= 16; D = Dv = 256, Hq / Hkv * Lq <= 32;
   * no tile) they are chunks of one launch and auto
   * chooses their number; elsewhere they are separate calls merged by
   * fa_merge_states_n, and auto is 1, but for cuda's f32 kernel ("flash",
   * D = Dv = 64 or 128), which cuts the keys into chunks of one launch
   * where its query tiles leave the GPU idle (s = 1: none).  Every rule
   * applies on both backends (the pieces count keys as the whole call
   * does).  fa_attention_reference ignores it. */
  int64_t splits;
  const char *kernel; /* NULL or "": the fastest kernel that accepts the call (API §6); a name that
                         fa_attention_kernels lists picks that kernel.  The references (forward and
                         backward) run none, so they take any kernel's name; the backward on cuda runs
                         its own kernel of that name ("wgmma", "mma", "simt"; FA_ERR_UNSUPPORTED when it
                         does not take the call) and makes its own choice for the forward's other names;
                         a name no kernel has is FA_ERR_ARGUMENT (fa_attention_kernels too). */
  /* Attention variants (API §9; docs/variants.md): expressions traced
   * from a Lua score_mod(s, b, h, q, k) and mask_mod(b, h, q, k), or built
   * by a C host with the fa_expr builder (docs/c-api.md), or NULL.
   * Both backends and fa_attention_reference; on cuda compiled into the
   * "flash" kernels at run time (NVRTC; other algos FA_ERR_UNSUPPORTED),
   * refused there with splits > 1; the backward and its reference take them
   * too, differentiating score_mod's expression (on cuda compiled into
   * the "wgmma" backward kernels where they take the call, else the
   * "simt" ones). */
  const fa_expr *score_mod, *mask_mod;
  /* fa_block_mask_new's result for this call's mask_mod, B, Hq, Lq, Lk and
   * tile (checked; on cuda its sizes, and it is used where its tile divides
   * the kernel's), or NULL: "flash" and "two_pass" skip its empty tiles and
   * evaluate mask_mod only on its partial ones (on cuda: skip the key tiles
   * outside its nonempty ones, unmasked in its run of full ones).  It needs
   * mask_mod, the expression it was made from (checked); the reference
   * does not use its tiles. */
  const fa_block_mask *block_mask;
  /* fa_attention_backward only (API §10): nonzero asks for bit-identical
   * gradients from run to run.  The CPU backend and cuda's "mma" and
   * "simt" kernels always give them; cuda's "wgmma" kernel otherwise sums
   * dq with atomic adds (faster, its rounding varies from run to run). */
  int deterministic;
} fa_attention_opts;

/* Attention variants (API §9).  fa_expr_new makes an expression from n
 * nodes in the engine's internal format (src/expr.h: not a stable C API;
 * the Lua binding's tracer uses it, hosts the builder below), retaining the
 * captured tensors; fa_expr_free releases it (NULL is ignored).
 * fa_expr_eval gives its value at 0-based batch, head, query and key
 * positions for a scaled score s (NaN where a captured tensor is read out
 * of its range, and for a NULL expression). */
FA_API fa_status fa_expr_new(fa_context *ctx, const fa_expr_node *nodes, int n, fa_tensor *const *tensors,
                             const char *const *names, int ntensors, fa_expr **out);
FA_API void fa_expr_free(fa_expr *e);
FA_API double fa_expr_eval(const fa_expr *e, double s, int64_t b, int64_t h, int64_t q, int64_t k);

/* Expressions built from C, the stable way (docs/c-api.md): what a traced
 * score_mod / mask_mod records, one call a node, with the tracer's rules.
 * Each call returns the new node (>= 0), or -1 once the builder has met a
 * misuse (a node that is not one of its own, an operand of the wrong kind,
 * an unknown name, more than 4096 nodes or 16 tensors): the first misuse is
 * kept, every later call returns -1, and fa_expr_build reports it as an
 * FA_ERR_ARGUMENT error.  Values are numbers or booleans, as in Lua:
 *  - fa_expr_number / fa_expr_boolean: constants;
 *  - fa_expr_arg: "s" (the scaled score; 0 in a mask_mod), "b", "h", "q",
 *    "k" (1-based batch, head, query and key positions, as in Lua);
 *  - fa_expr_apply(op, a, b): on numbers "+", "-", "*", "/", "%", "^",
 *    "min", "max" (numbers) and "lt", "le", "gt", "ge" (booleans); "eq",
 *    "ne" on two of one kind; "and", "or" on booleans; unary (b is
 *    ignored) "neg", "abs", "exp", "log", "tanh", "sqrt", "floor" on a
 *    number and "not" on a boolean;
 *  - fa_expr_where(c, a, b): c ? a : b, c a boolean, a and b of one kind;
 *  - fa_expr_load(t, name, n, idx): t[idx[0]]...[idx[n-1]] (1-based number
 *    indices, one a dimension of the 1-D to 4-D tensor t, read on the
 *    call's device; name, or NULL, for messages); the builder holds a
 *    reference to t until it is freed.
 * fa_expr_build makes the expression whose value is node `result` (for
 * opts.score_mod a number, for opts.mask_mod a boolean; fa_attention checks
 * which); the builder stays usable and builds more. */
typedef struct fa_expr_builder fa_expr_builder;
FA_API fa_status fa_expr_builder_new(fa_context *ctx, fa_expr_builder **out);
FA_API void fa_expr_builder_free(fa_expr_builder *x);
FA_API int fa_expr_number(fa_expr_builder *x, double c);
FA_API int fa_expr_boolean(fa_expr_builder *x, int c);
FA_API int fa_expr_arg(fa_expr_builder *x, const char *name);
FA_API int fa_expr_apply(fa_expr_builder *x, const char *op, int a, int b);
FA_API int fa_expr_where(fa_expr_builder *x, int c, int a, int b);
FA_API int fa_expr_load(fa_expr_builder *x, fa_tensor *t, const char *name, int nidx, const int *idx);
FA_API fa_status fa_expr_build(fa_expr_builder *x, int result, fa_expr **out);

/* fa_block_mask_new evaluates mask_mod (an expression of booleans) over
 * every (b, h, q, k) of a (B, H, Lq, Lk) call, on the GPU when ctx's device
 * is cuda and every captured tensor is there (compiled with NVRTC), else on
 * the CPU (captured tensors of any device read from host copies), and
 * keeps one state per (b, h, query tile of Br rows, key tile of Bc keys),
 * O(tiles) memory: FA_BLOCK_EMPTY (no pair attends), FA_BLOCK_FULL (every
 * pair does) or FA_BLOCK_PARTIAL.  fa_block_mask_tile gives one (0-based
 * tile indices; -1 out of range), fa_block_mask_counts the three totals.
 * Br = Bc = 0: the CPU's default tile. */
enum { FA_BLOCK_EMPTY = 0, FA_BLOCK_FULL = 1, FA_BLOCK_PARTIAL = 2 };
FA_API fa_status fa_block_mask_new(fa_context *ctx, const fa_expr *mask_mod, int64_t B, int64_t H, int64_t Lq,
                                   int64_t Lk, int64_t Br, int64_t Bc, fa_block_mask **out);
FA_API void fa_block_mask_free(fa_block_mask *m);
FA_API int fa_block_mask_tile(const fa_block_mask *m, int64_t b, int64_t h, int64_t qi, int64_t ki);
FA_API void fa_block_mask_counts(const fa_block_mask *m, int64_t counts[3]);
/* Its sizes: B, H, Lq, Lk, Br, Bc (zeros for a NULL m; a NULL array is not written, as for counts). */
FA_API void fa_block_mask_sizes(const fa_block_mask *m, int64_t sizes[6]);

/* A tile size of 0 that a user wrote (a binding's tile = {0, 0}): unlike
 * 0, which asks for the backend's default, it is rejected like any size
 * out of range, with the message naming the valid range and the 0. */
#define FA_TILE_ZERO INT64_MIN

/* The init functions leave a NULL o alone. */
FA_API void fa_attention_opts_init(fa_attention_opts *o);
/* q (B,Hq,Lq,D), k (B,Hkv,Lk,D), v (B,Hkv,Lk,Dv); 3-D (H,L,D) and 2-D (L,D)
 * too.  *o gets a (…,Lq,Dv) tensor in q's dtype.  The lse, a (…,Lq) f32
 * tensor, is computed when `lse` is not NULL (then *lse holds it) or when
 * return_lse / lse_out ask for it; `lse` may be NULL in any case. */
FA_API fa_status fa_attention(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                              const fa_attention_opts *opts, fa_tensor **o, fa_tensor **lse);
/* The same function in f64 on the CPU by the plainest code (outputs f64 on the CPU). */
FA_API fa_status fa_attention_reference(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                                        const fa_attention_opts *opts, fa_tensor **o, fa_tensor **lse);
/* The names of the kernels that accept this call of fa_attention (API §6),
 * fastest first, for the call's device, with its algo and tile (opts may be
 * NULL; opts->kernel is not read): up to cap of them into names (static
 * strings; names may be NULL when cap is 0), and *n = how many accept (may
 * exceed cap).  The first is the one fa_attention takes without
 * opts->kernel. */
FA_API fa_status fa_attention_kernels(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                                      const fa_attention_opts *opts, const char **names, int cap, int *n);
/* Combines two partial attentions over disjoint key sets. */
FA_API fa_status fa_merge_states(fa_context *ctx, fa_tensor *o1, fa_tensor *lse1, fa_tensor *o2, fa_tensor *lse2,
                                 fa_tensor **o, fa_tensor **lse);
/* Combines n >= 1 partial attentions over disjoint key sets, os[i] with
 * lses[i] (one shape, dtype and device for all): merged in f32 (f64 for
 * f64) on both backends, exact with empty states (lse = -inf); fresh
 * outputs in os[0]'s and lses[0]'s dtypes. */
FA_API fa_status fa_merge_states_n(fa_context *ctx, int64_t n, fa_tensor *const *os, fa_tensor *const *lses,
                                   fa_tensor **o, fa_tensor **lse);

typedef enum { FA_MATMUL_AUTO = 0, FA_MATMUL_NAIVE, FA_MATMUL_TILED, FA_MATMUL_BLAS } fa_matmul_algo;
typedef struct {
  fa_matmul_algo algo;
  int64_t tile; /* for TILED; 0 = default */
  fa_tensor *out;
} fa_matmul_opts;
FA_API void fa_matmul_opts_init(fa_matmul_opts *o);
FA_API fa_status fa_matmul(fa_context *ctx, fa_tensor *a, fa_tensor *b, const fa_matmul_opts *opts, fa_tensor **c);

/* ---- measuring -------------------------------------------------------- */

typedef struct {
  double flops;
  double bytes;
} fa_cost;
FA_API fa_status fa_cost_attention(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                                   const fa_attention_opts *opts, fa_cost *out);
FA_API fa_status fa_cost_softmax(fa_context *ctx, fa_tensor *x, const fa_softmax_opts *opts, fa_cost *out);

/* Times the work queued between start and stop on the context's default
 * device: CUDA events on its stream, the monotonic clock on the CPU.
 * fa_timer_stop waits for the work and gives milliseconds. */
FA_API fa_status fa_timer_start(fa_context *ctx);
FA_API fa_status fa_timer_stop(fa_context *ctx, double *ms);

/* Bytes held by the engine on a device: tensors' storage and workspaces;
 * the handles (every tensor's and storage's record, wrapped tensors' too)
 * are host memory, counted on FA_CPU.  current or peak may be NULL.
 * These four calls return no status: a device other than FA_CPU or
 * FA_CUDA holds 0 bytes, has no limit, and setting its limit does nothing. */
FA_API void fa_memory(fa_device device, size_t *current, size_t *peak);
FA_API void fa_reset_peak(fa_device device);
/* Engine-wide cap on bytes held on a device (0 = none).  A request past it
 * fails with FA_ERR_OUT_OF_MEMORY. */
FA_API void fa_set_memory_limit(fa_device device, size_t bytes);
FA_API size_t fa_memory_limit(fa_device device);

typedef struct {
  char backend[16];
  char name[128];
  int threads;        /* CPU: OpenMP threads */
  char simd[32];      /* CPU: "avx512", "avx2", "sse2", ... */
  int sms;            /* CUDA */
  size_t smem_per_block, smem_per_sm, mem_total, l2_bytes;
  int cc_major, cc_minor;
} fa_device_info_t;
FA_API fa_status fa_device_info(fa_context *ctx, fa_device device, fa_device_info_t *out);

/* ---- DLPack (API §7) ---------------------------------------------------- */

/* Zero-copy exchange with PyTorch, JAX, CuPy and NumPy through DLPack's
 * DLManagedTensor (<dlpack/dlpack.h>; this header does not need it).  A
 * build without dlpack.h gives FA_ERR_UNSUPPORTED from both.  See
 * docs/dlpack.md.
 *
 * fa_tensor_from_dlpack: a tensor over managed->dl_tensor's memory (data
 * + byte_offset, the strides in elements, NULL = row-major).  Devices:
 * kDLCPU and kDLCUDAHost (cpu), kDLCUDA and kDLCUDAManaged on the current
 * CUDA device (cuda).  Dtypes: float32/16/64, bfloat16, bool (kDLBool)
 * and uint8 (taken as bool, nonzero = true); lanes 1; 1 to 4 dimensions;
 * strides >= 0 (a size-1 dimension's stride is ignored); the first
 * element aligned to its size.  On FA_OK the engine owns `managed` and
 * calls its deleter once, when the last reference to *out and to every
 * view of it is released; on failure the caller still owns `managed`.
 *
 * fa_tensor_to_dlpack: a DLManagedTensor over t's memory that holds a
 * reference to t (t may be released at once).  data is t's first element
 * (byte_offset 0), strides are t's, device kDLCPU or kDLCUDA with the
 * current device's id, bool as kDLBool (DLPack >= 0.8) or uint8.  The
 * consumer calls its deleter once, which drops the reference.  CUDA work
 * queued on ctx's stream is not waited for: fa_sync(ctx) before another
 * stream reads it. */
struct DLManagedTensor;
FA_API fa_status fa_tensor_from_dlpack(fa_context *ctx, struct DLManagedTensor *managed, fa_tensor **out);
FA_API fa_status fa_tensor_to_dlpack(fa_context *ctx, fa_tensor *t, struct DLManagedTensor **out);

/* ---- files: .npy and .safetensors (API §7) ------------------------------ */

/* See docs/io.md.  Readers: .npy versions 1.0 to 3.0, dtypes f4/f2/f8/b1,
 * little- or big-endian (byte-swapped), C order, 1 to 4 dimensions;
 * .safetensors with F32, F16, BF16, F64, BOOL tensors of 1 to 4 dimensions
 * (__metadata__ is skipped).  A malformed, truncated or hostile file is an
 * error ("flashattn: load '<path>': <fault>") and nothing is read past its
 * end: npy headers up to 64 KiB, safetensors headers up to 100 MB, every
 * data offset checked (in range, the buffer covered without holes or
 * overlaps, each the size its shape and dtype say).  Tensors come from the
 * engine's allocator (the memory limit applies) on the CPU, then move to
 * `device`.  The *_buffer forms read the same bytes from host memory. */
FA_API fa_status fa_load_npy(fa_context *ctx, const char *path, fa_device device, fa_tensor **out);
FA_API fa_status fa_load_npy_buffer(fa_context *ctx, const void *data, size_t size, fa_device device,
                                    fa_tensor **out);
/* Writes t (any device, any strides) as a C-order little-endian .npy,
 * version 1.0; bf16, which numpy lacks, is widened to f32 ('<f4').  A path
 * ending in ".safetensors" (any case) is FA_ERR_ARGUMENT, as is an ".npy"
 * one for fa_save_safetensors: loading follows the extension. */
FA_API fa_status fa_save_npy(fa_context *ctx, const char *path, fa_tensor *t);

/* *names and *tensors get *count entries sorted by name (bytewise), the
 * names NUL-terminated UTF-8; the caller frees them together with
 * fa_safetensors_free (which releases each tensor still there and accepts
 * NULL entries, so a host may take tensors out).  On failure nothing is
 * returned (*names, *tensors NULL, *count 0). */
FA_API fa_status fa_load_safetensors(fa_context *ctx, const char *path, fa_device device, char ***names,
                                     fa_tensor ***tensors, size_t *count);
FA_API fa_status fa_load_safetensors_buffer(fa_context *ctx, const void *data, size_t size, fa_device device,
                                            char ***names, fa_tensor ***tensors, size_t *count);
FA_API void fa_safetensors_free(char **names, fa_tensor **tensors, size_t count);
/* Writes count named tensors (names: distinct valid UTF-8, not
 * "__metadata__"), in name order, contiguous, the header padded with
 * spaces to a multiple of 8 bytes. */
FA_API fa_status fa_save_safetensors(fa_context *ctx, const char *path, size_t count, const char *const *names,
                                     fa_tensor *const *tensors);

typedef enum { FA_FILE_NPY = 1, FA_FILE_SAFETENSORS = 2 } fa_file_format;
/* The format of path: by its extension (.npy, .safetensors, any case),
 * else by its first bytes (the npy magic; an 8-byte length then '{'). */
FA_API fa_status fa_file_format_of(fa_context *ctx, const char *path, fa_file_format *out);

/* fa.load and fa.save touch files only where a script could anyway: in a
 * lua_State with the io library loaded, unless the host decides with this
 * call (1 = allowed, 0 = refused; a sandbox without io refuses by default). */
struct lua_State;
FA_API void fa_lua_set_file_access(struct lua_State *L, int allowed);

/* ---- backward (API §10) -------------------------------------------------- */

/* The gradients dq, dk, dv of fa_attention(q, k, v, opts) for the upstream
 * gradient dout, from the forward's o (…, Lq, Dv) and lse (…, Lq): the same
 * opts (every option of the forward; tile_q, tile_k are the backward's
 * query and key tiles, 0 = the backend's (128 each on the CPU); algo,
 * return_lse, out and lse_out are not used), FlashAttention's recomputation of P from
 * q, k and lse (nothing of size Lq·Lk stored), dk and dv summed over the
 * query heads sharing a KV head (GQA/MQA).  dq, dk, dv get new tensors of
 * q's, k's and v's shapes in q's dtype.  o and dout in q's dtype, lse any
 * float dtype, all on q's device.  CPU backend: f32/f16/bf16 computed in
 * f32, f64 in f64, bit-identical from run to run (deterministic by
 * construction).  CUDA: f32/f16/bf16 with D, Dv <= 256 (FA_ERR_DTYPE for
 * f64, FA_ERR_UNSUPPORTED past 256, and with score_mod / mask_mod for
 * any kernel named but "simt", which alone takes them), inputs
 * read through their strides, dq, dk, dv new tensors on the device; dk and
 * dv have one owner an element (bit-identical from run to run), dq too
 * except on the "wgmma" kernel without opts->deterministic, which adds it
 * up with atomics (with it, into one copy a block, summed in a fixed order,
 * or by a kernel of its own); tile_q / tile_k are ignored (the kernels' own tiles); opts.kernel
 * names one of its kernels: "wgmma" (Hopper; f16/bf16, D = Dv = 64, 96 or
 * 128), "mma" (f16/bf16, D = Dv = 64 or 128), "simt" (any call on cuda). */
FA_API fa_status fa_attention_backward(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, fa_tensor *o,
                                       fa_tensor *lse, fa_tensor *dout, const fa_attention_opts *opts, fa_tensor **dq,
                                       fa_tensor **dk, fa_tensor **dv);
/* The same in f64 on the CPU by the plainest code (S, P and dP materialised
 * per head); o, lse, dout any float dtype; outputs f64 on the CPU. */
FA_API fa_status fa_attention_backward_reference(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v,
                                                 fa_tensor *o, fa_tensor *lse, fa_tensor *dout,
                                                 const fa_attention_opts *opts, fa_tensor **dq, fa_tensor **dk,
                                                 fa_tensor **dv);

/* ---- paged KV cache (API §8) ------------------------------------------ */

/* A pool of fixed-size pages (K pages (P, H, page_size, D) and V pages
 * (P, H, page_size, Dv), tensors of dtype on device), a page table per
 * sequence and the sequences' lengths: sequences grow without copying.
 * See docs/c-api.md.  A cache is used by one thread at a time. */
typedef struct fa_kv_cache fa_kv_cache;
typedef struct {
  int64_t batch, heads, dim; /* B, Hkv, D: >= 1 */
  int64_t dim_v;             /* Dv; 0 = dim */
  int64_t capacity;          /* positions per sequence, >= 1 */
  int64_t page_size;         /* positions per page; 0 = 16 */
  int64_t pages;             /* pages in the pool; 0 = batch * ceil(capacity / page_size) */
  fa_dtype dtype;            /* a float dtype; init: FA_F32 */
  fa_device device;          /* init: FA_DEVICE_NONE = the context's device */
} fa_kv_cache_opts;
FA_API void fa_kv_cache_opts_init(fa_kv_cache_opts *o);
/* The pool is allocated here, whole. */
FA_API fa_status fa_kv_cache_create(fa_context *ctx, const fa_kv_cache_opts *opts, fa_kv_cache **out);
/* k (B, Hkv, n, D), v (B, Hkv, n, Dv), any float dtype, the cache's device;
 * sequence b takes its first lens[b] positions (0 <= lens[b] <= n; lens
 * NULL = n for all, else n_lens == B).  Past capacity or past the free
 * pages is an error that writes nothing; a failure during the copies
 * leaves the lengths and the pool as they were. */
FA_API fa_status fa_kv_cache_append(fa_context *ctx, fa_kv_cache *cache, fa_tensor *k, fa_tensor *v,
                                    const int64_t *lens, int64_t n_lens);
/* q (B, Hq, Lq, D), the cache's dtype and device, Hq % Hkv == 0, against
 * each sequence's keys so far (o: (B, Hq, Lq, Dv) in q's dtype; lse as in
 * fa_attention).  Options: scale, causal (aligned to each sequence's own
 * length, as window and alibi), window, alibi, softcap, return_lse, out,
 * lse_out, splits; algo, tile, mask and kv_lens are FA_ERR_ARGUMENT.  A
 * sequence of length 0 gives zeros and lse = -inf.  On cuda the decode
 * kernel reads the pages where they lie when it takes the call (see
 * splits); else every sequence's pages are gathered into contiguous K/V
 * (one launch a pool on cuda) and fa_attention runs once over the batch,
 * the lengths as kv_lens, or, where they differ and a rule is aligned to
 * them (causal with Lq > 1, window, alibi), each sequence's keys at the
 * end and a (B, 1, 1, L) bool mask of them (with top_left causal, a call
 * a sequence). */
FA_API fa_status fa_kv_cache_attend(fa_context *ctx, fa_kv_cache *cache, fa_tensor *q, const fa_attention_opts *opts,
                                    fa_tensor **o, fa_tensor **lse);
/* lens gets B entries. */
FA_API fa_status fa_kv_cache_lengths(fa_context *ctx, const fa_kv_cache *cache, int64_t *lens);
/* Sequence b (0-based) back to length 0, its pages back to the pool; b = -1: all. */
FA_API fa_status fa_kv_cache_reset(fa_context *ctx, fa_kv_cache *cache, int64_t b);
/* Sizes of a cache (NULL cache: -1): B, Hkv, D, Dv, capacity, page_size, pages, free pages. */
typedef struct {
  int64_t batch, heads, dim, dim_v, capacity, page_size, pages, free_pages;
  fa_dtype dtype;
  fa_device device;
} fa_kv_cache_info;
FA_API fa_status fa_kv_cache_get_info(fa_context *ctx, const fa_kv_cache *cache, fa_kv_cache_info *out);
/* NULL is a no-op. */
FA_API void fa_kv_cache_destroy(fa_kv_cache *cache);

/* ---- sequence shards and ring attention (API §11; docs/ring.md) ------------ */

/* How fa_shard cuts a sequence of L positions into n shards: CONTIGUOUS, n
 * consecutive pieces (sizes differing by at most one, the larger first);
 * ZIGZAG, 2n such chunks, shard i holding chunks i and 2n-1-i in that order
 * (causal work balanced over the shards). */
typedef enum { FA_SHARD_CONTIGUOUS = 0, FA_SHARD_ZIGZAG = 1 } fa_shard_layout;
/* t cut along dim (0-based; negative counts from the end, -2 = the
 * sequence of (..., L, D)) into shards[0..n-1]: views of t (contiguous) or
 * new tensors (zigzag).  1 <= n <= L (contiguous), 2n <= L (zigzag).  On
 * failure nothing is written to shards. */
FA_API fa_status fa_shard(fa_context *ctx, fa_tensor *t, int n, int dim, fa_shard_layout layout, fa_tensor **shards);
/* The full tensor back from n shards (one dtype, device and shape but for
 * dim; zigzag: the lengths fa_shard makes): a new contiguous tensor. */
FA_API fa_status fa_unshard(fa_context *ctx, int n, fa_tensor *const *shards, int dim, fa_shard_layout layout,
                            fa_tensor **out);
/* Ring attention over n shards of one sequence (fa_shard's with `layout`,
 * an fa_shard_layout): qs[i] (B, Hq, L_i, D), ks[i] (B, Hkv, L_i, D),
 * vs[i] (B, Hkv, L_i, Dv), ranks 2 to 4 as fa_attention, every tensor of
 * one dtype on one device (the ring runs on one device in this version).
 * At step r = 0..n-1 shard i attends K/V shard (i - r) mod n, pair by pair
 * of chunks (above the causal diagonal skipped, on it causal, below it
 * full), and the partial states are merged in f32 (f64 for f64, whose
 * pieces run through fa_attention_reference) by fa_merge_states_n.
 * outs[i] gets (..., L_i, Dv) in q's dtype; lses, when not NULL, gets lse
 * shards (..., L_i) f32.  opts (NULL = defaults): algo, scale, causal (any
 * of its values: Lq = Lk), softcap, tile, window, alibi, kv_lens (B counts
 * of 0..L), mask (broadcastable to (B, Hq, L, L)), score_mod and mask_mod
 * (their q and k the whole sequence's positions; pairs mask_mod leaves
 * empty skipped) and block_mask (made for (B, Hq, L, L)) apply at the
 * whole sequence's positions (docs/ring.md); splits > 1, kernel, out and
 * lse_out are FA_ERR_UNSUPPORTED.  On failure every outs[i] (and lses[i])
 * is NULL. */
FA_API fa_status fa_ring_attention(fa_context *ctx, int n, fa_tensor *const *qs, fa_tensor *const *ks,
                                   fa_tensor *const *vs, const fa_attention_opts *opts, int layout, fa_tensor **outs,
                                   fa_tensor **lses);

/* ---- Lua -------------------------------------------------------------- */

struct lua_State;
/* The module's loader (what require "flashattn" calls). */
FA_API int luaopen_flashattn(struct lua_State *L);
/* Pushes a Lua tensor that holds a new reference to t (nil for NULL).
 * Like lua_newuserdata it can raise a Lua error (out of memory, or from a
 * call hook the host set: the box is made by a protected Lua call, so that
 * the reference is released on failure): call it in protected mode. */
FA_API void fa_lua_push_tensor(struct lua_State *L, fa_tensor *t);
/* The tensor at idx (raises a Lua error if it is not a live tensor);
 * borrowed: retain it to keep it. */
FA_API fa_tensor *fa_lua_check_tensor(struct lua_State *L, int idx);
/* Scripts in L run on ctx (owned by the host, which must outlive L's use
 * of it).  NULL returns to the module's own context.  fa_lua_push_tensor
 * pushes nil for a NULL t. */
FA_API void fa_lua_set_context(struct lua_State *L, fa_context *ctx);
/* The context scripts in L run on; NULL once L is closing (lua_close has
 * run the module's own finalizer). */
FA_API fa_context *fa_lua_get_context(struct lua_State *L);
/* A callback the module's long loops call with the script's state (fa.bench
 * before each repetition, fa.tensor every 65536 elements of a nested
 * table): they run no Lua instruction, so a count hook never sees them.  It
 * may raise a Lua error (luaL_error) to stop the call, as a hook does; the
 * module keeps nothing when it does.  NULL removes it. */
typedef void (*fa_lua_poll_fn)(struct lua_State *L, void *ud);
FA_API void fa_lua_set_poll(struct lua_State *L, fa_lua_poll_fn fn, void *ud);

#ifdef __cplusplus
}
#endif
#endif
