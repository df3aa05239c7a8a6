/* The CPU attention algorithms (one file each) and what they share besides
 * the score steps of attention_scores.h: BLAS calls and per-thread
 * workspaces.  fa_cpu_attention (attention.c) dispatches to them. */
#ifndef FA_CPU_ATTENTION_ALGOS_H
#define FA_CPU_ATTENTION_ALGOS_H

#include "cpu/stage.h"
#include "internal.h"

#include <cblas.h>
#include <stddef.h>

fa_status fa_cpu_attention_naive(fa_context *ctx, const fa_attn_problem *p);
fa_status fa_cpu_attention_two_pass(fa_context *ctx, const fa_attn_problem *p);
fa_status fa_cpu_attention_flash_row(fa_context *ctx, const fa_attn_problem *p);
fa_status fa_cpu_attention_flash(fa_context *ctx, const fa_attn_problem *p);

/* Row-major C(m,n) = A(m,k) · op(B) + beta·C, op(B) = Bᵀ (B stored n x k)
 * when b_trans, else B (k x n).  Callers keep every size below INT_MAX. */
static inline void fa_gemm_f32(int b_trans, int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
                               const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, b_trans ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a,
              (int)lda, b, (int)ldb, beta, c, (int)ldc);
}
static inline void fa_gemm_f64(int b_trans, int64_t m, int64_t n, int64_t k, const double *a, int64_t lda,
                               const double *b, int64_t ldb, double beta, double *c, int64_t ldc) {
  cblas_dgemm(CblasRowMajor, CblasNoTrans, b_trans ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, 1.0, a,
              (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* One workspace slice per OpenMP thread, taken from fa_host_alloc so that
 * it counts in the engine's memory figures.  `threads` is at most the
 * number of work items (and at least 1). */
typedef struct {
  char *base;
  size_t slice, total;
  int threads;
} fa_attn_workspace;

/* Reserves a slice of slice_bytes for each of the threads that
 * work_items of flops operations in all take (fa_cpu_threads_for); on
 * failure the context holds the message and nothing is held. */
fa_status fa_attn_workspace_init(fa_context *ctx, fa_attn_workspace *w, int64_t work_items, double flops,
                                 size_t slice_bytes);
void fa_attn_workspace_free(fa_attn_workspace *w);
static inline void *fa_attn_workspace_slice(const fa_attn_workspace *w, int thread) {
  return w->base + (size_t)thread * w->slice;
}

/* Bytes of n elements of `size` rounded up to a cache line (so that the
 * arrays carved from one slice stay 64-byte aligned); 0 on overflow. */
size_t fa_attn_bytes(size_t n, size_t size);

/* The key/value head query head h reads (GQA/MQA share kv heads). */
static inline int64_t fa_attn_kv_head(const fa_attn_problem *p, int64_t h) { return h / (p->Hq / p->Hkv); }

/* Element offset of row i of head h of batch b of an operand laid out by
 * st (the operands may be views of the caller's tensors, API §6). */
static inline int64_t fa_attn_row_at(fa_attn_strides st, int64_t b, int64_t h, int64_t i) {
  return b * st.b + h * st.h + i * st.s;
}

#endif
