/* The CUDA backend's entry points for a build without nvcc: CUDA is never
 * available and every call says so. */
#include "internal.h"

#include <stdio.h>

#define FA_NO_CUDA_MSG "flashattn: this build has no CUDA backend"

int fa_cuda_available(void) { return 0; }

fa_status fa_cuda_device_info(fa_context *ctx, fa_device_info_t *out) {
  (void)out;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_malloc(fa_context *ctx, void **p, size_t nbytes) {
  (void)nbytes;
  *p = NULL;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

/* Nothing can have been allocated, so there is nothing to free. */
void fa_cuda_free(void *p, size_t nbytes) {
  (void)p;
  (void)nbytes;
}

int fa_cuda_legacy_stream(const fa_context *ctx) {
  (void)ctx;
  return 0;
}

void fa_cuda_free_reusable(void *p, size_t nbytes) { fa_cuda_free(p, nbytes); }

void fa_cuda_free_on(fa_context *ctx, void *p, size_t nbytes) {
  (void)ctx;
  fa_cuda_free(p, nbytes);
}

fa_status fa_cuda_memcpy(fa_context *ctx, void *dst, const void *src, size_t nbytes, fa_copy_kind kind) {
  (void)dst;
  (void)src;
  (void)nbytes;
  (void)kind;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_upload(fa_context *ctx, void *dst, const void *src, size_t nbytes) {
  (void)dst;
  (void)src;
  (void)nbytes;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_sync(fa_context *ctx) { return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG); }

fa_status fa_cuda_host_alloc(fa_context *ctx, void **p, size_t nbytes) {
  (void)nbytes;
  *p = NULL;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}
void fa_cuda_host_free(void *p, size_t nbytes) { (void)p, (void)nbytes; }
fa_status fa_cuda_event_new(fa_context *ctx, void **ev) {
  *ev = NULL;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}
void fa_cuda_event_free(void *ev) { (void)ev; }
fa_status fa_cuda_event_record(fa_context *ctx, void *ev) {
  (void)ev;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}
fa_status fa_cuda_event_wait(fa_context *ctx, void *ev) {
  (void)ev;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_softmax(fa_context *ctx, fa_softmax_algo algo, int64_t block, fa_dtype dt, const void *x,
                          const fa_state_rows *xr, void *y, int64_t rows, int64_t n) {
  (void)algo, (void)block, (void)dt, (void)x, (void)xr, (void)y, (void)rows, (void)n;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

int64_t fa_cuda_softmax_fused_max_n(fa_dtype dt) {
  (void)dt;
  return 0;
}

fa_status fa_cuda_copy(fa_context *ctx, fa_tensor *dst, const fa_tensor *src) {
  (void)dst, (void)src;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_fill(fa_context *ctx, fa_tensor *t, int kind, uint64_t seed, double value) {
  (void)t, (void)kind, (void)seed, (void)value;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_binary(fa_context *ctx, fa_tensor *r, const fa_tensor *a, const fa_tensor *b, int op, double scalar) {
  (void)r, (void)a, (void)b, (void)op, (void)scalar;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_reduce(fa_context *ctx, const fa_tensor *t, double out[6]) {
  (void)t, (void)out;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_timer_start(fa_context *ctx) { return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG); }

fa_status fa_cuda_timer_stop(fa_context *ctx, double *ms) {
  *ms = 0;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

void fa_cuda_context_release(fa_context *ctx) { (void)ctx; }

fa_status fa_cuda_attention_run(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel,
                                const fa_attn_paging *pg, int64_t splits, const fa_attn_problem *p) {
  (void)algo, (void)kernel, (void)pg, (void)splits, (void)p;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_attention_variant(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel,
                                    const fa_attn_problem *p) {
  (void)algo, (void)kernel, (void)p;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_variant_compile(fa_context *ctx, const fa_expr *score_mod, const fa_expr *mask_mod, fa_dtype dtype,
                                  const char *arch, const char *const *names, int n, unsigned guards) {
  (void)score_mod, (void)mask_mod, (void)dtype, (void)arch, (void)names, (void)n, (void)guards;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_block_mask(fa_context *ctx, const fa_expr *e, int64_t B, int64_t H, int64_t Lq, int64_t Lk,
                             int64_t Br, int64_t Bc, uint8_t *state) {
  (void)e, (void)B, (void)H, (void)Lq, (void)Lk, (void)Br, (void)Bc, (void)state;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

int fa_cuda_attention_kernel_fit(fa_attn_kernel kernel, fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc,
                                 char *why, size_t n) {
  (void)kernel, (void)dt, (void)D, (void)Dv, (void)br, (void)bc;
  snprintf(why, n, "this build has no CUDA");
  return 0;
}

int fa_cuda_attention_kernel_tile_ok(fa_attn_kernel kernel, int64_t D, int64_t br, int64_t bc) {
  (void)kernel, (void)D, (void)br, (void)bc;
  return 0;
}

int fa_cuda_attention_kernel_declines(fa_attn_kernel kernel, const fa_attn_problem *p, int rows_dense) {
  (void)kernel, (void)p, (void)rows_dense;
  return 0;
}

int fa_cuda_attention_decode_fit(fa_dtype dt, int64_t D, int64_t Dv, int64_t Hq, int64_t Hkv, int64_t Lq, char *why,
                                 size_t n) {
  (void)dt, (void)D, (void)Dv, (void)Hq, (void)Hkv, (void)Lq;
  snprintf(why, n, "this build has no CUDA");
  return 0;
}



fa_status fa_cuda_attention_backward(fa_context *ctx, fa_attn_kernel kernel, const fa_attn_problem *p,
                                     const fa_attn_grads *g) {
  (void)kernel, (void)p, (void)g;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_attention_backward_variant(fa_context *ctx, fa_attn_kernel kernel, const fa_attn_problem *p,
                                             const fa_attn_grads *g) {
  (void)kernel, (void)p, (void)g;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

void fa_cuda_attention_default_tile(fa_dtype dt, int64_t D, int64_t Dv, int64_t *br, int64_t *bc) {
  (void)dt, (void)D, (void)Dv;
  *br = *bc = 64;
}

fa_status fa_cuda_attention_check_tile(fa_context *ctx, fa_dtype dt, int64_t D, int64_t Dv, int64_t br, int64_t bc) {
  (void)dt, (void)D, (void)Dv, (void)br, (void)bc;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_matmul(fa_context *ctx, fa_matmul_algo algo, int64_t tile, fa_dtype dt, const fa_mm_operands *g) {
  (void)algo, (void)tile, (void)dt, (void)g;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_merge_states(fa_context *ctx, fa_dtype dt, const fa_merge_operands *g) {
  (void)dt, (void)g;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_kv_scatter(fa_context *ctx, const fa_kv_segments *s, fa_tensor *pool, const fa_tensor *src) {
  (void)s, (void)pool, (void)src;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}

fa_status fa_cuda_kv_gather(fa_context *ctx, const int32_t *table, int64_t max_pages, const int64_t *lens,
                            const fa_tensor *pool, fa_tensor *dst, int right, uint8_t *mask) {
  (void)table, (void)max_pages, (void)lens, (void)pool, (void)dst, (void)right, (void)mask;
  return fa_fail(ctx, FA_ERR_DEVICE, FA_NO_CUDA_MSG);
}
