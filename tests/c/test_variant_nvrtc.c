/* The variants' generated CUDA C compiled by NVRTC for sm_90a with the
 * kernel instances a call names (attention_variant.cu's formats), without
 * a GPU: CI has the toolkit but no device, and a unit that does not compile
 * would fail every variant call on one.  Built where the CUDA backend is;
 * the cubins are dropped. */
#include "expr.h"
#include "internal.h"
#include "testutil.h"

#include <string.h>

typedef struct {
  fa_expr_node n[32];
  int count;
} nodes;
static int node(nodes *x, int op, int a0, int a1, int is_bool) {
  fa_expr_node *e = &x->n[x->count];
  memset(e, 0, sizeof *e);
  e->op = (uint8_t)op, e->a[0] = a0, e->a[1] = a1, e->is_bool = (uint8_t)is_bool;
  return x->count++;
}
static int cst(nodes *x, double c) {
  const int i = node(x, FA_X_CONST, 0, 0, 0);
  x->n[i].c = c;
  return i;
}
static fa_expr *make(fa_context *ctx, nodes *x) {
  fa_expr *e = NULL;
  CHECK(fa_expr_new(ctx, x->n, x->count, NULL, NULL, 0, &e) == FA_OK, "%s", fa_context_error(ctx));
  return e;
}

static void compile(fa_context *ctx, const char *what, const fa_expr *sm, const fa_expr *mm, fa_dtype dtype,
                    const char *const *names, int n, unsigned guards) {
  const fa_status st = fa_cuda_variant_compile(ctx, sm, mm, dtype, "sm_90a", names, n, guards);
  CHECK(st == FA_OK, "%s: %s", what, fa_context_error(ctx));
}

int main(void) {
  fa_context *ctx = NULL;
  CHECK(fa_context_create(FA_CPU, &ctx) == FA_OK, "%s", "context");
  /* softcap 30 * tanh(s / 30) (the one-SFU tanh in f16/bf16) with an ALiBi-like term */
  nodes a = {0};
  const int s = node(&a, FA_X_S, 0, 0, 0), q = node(&a, FA_X_Q, 0, 0, 0), k = node(&a, FA_X_K, 0, 0, 0);
  const int t = node(&a, FA_X_TANH, node(&a, FA_X_DIV, s, cst(&a, 30), 0), 0, 0);
  node(&a, FA_X_SUB, node(&a, FA_X_MUL, t, cst(&a, 30), 0),
       node(&a, FA_X_MUL, cst(&a, 0.25), node(&a, FA_X_ABS, node(&a, FA_X_SUB, q, k, 0), 0, 0), 0), 0);
  fa_expr *score = make(ctx, &a);
  /* a causal window of 48 keys: q >= k and q - k <= 48 */
  nodes b = {0};
  const int bq = node(&b, FA_X_Q, 0, 0, 0), bk = node(&b, FA_X_K, 0, 0, 0);
  node(&b, FA_X_AND, node(&b, FA_X_GE, bq, bk, 1), node(&b, FA_X_LE, node(&b, FA_X_SUB, bq, bk, 0), cst(&b, 48), 1), 1);
  fa_expr *mask = make(ctx, &b);
  if (score && mask) {
    const char *bf16[] = {"attn_wgmma_tma_persistent_kernel<__nv_bfloat16, 128, 128, EXTRAS_VARIANT, fa_variant_problem>",
                          "bwg_dkdv_kernel<__nv_bfloat16, 128, EXTRAS_VARIANT, true, fa_variant_problem>",
                          "bwg_dq_kernel<__nv_bfloat16, 128, EXTRAS_VARIANT, fa_variant_problem>",
                          "fa_variant_spans_kernel<128, 128>",
                          /* the SIMT guards behind them, compiled as a call compiles them (RTC_GUARD_OPTION) */
                          "attn_tiled_kernel<__nv_bfloat16, 64, MODE_FLASH, fa_variant_problem>",
                          "bw_dkdv_kernel<__nv_bfloat16, 128, fa_variant_problem>",
                          "bw_dq_kernel<__nv_bfloat16, 128, fa_variant_problem>"};
    compile(ctx, "bf16, D = 128", score, mask, FA_BF16, bf16, 7, 0x70u);
    const char *f16[] = {"attn_wgmma_kernel<__half, 64, 64, EXTRAS_VARIANT, PASS_FLASH, false, fa_variant_problem>"};
    compile(ctx, "f16, D = 64", score, NULL, FA_F16, f16, 1, 0u);
    const char *f32[] = {"attn_tiled_kernel<float, 32, MODE_FLASH, fa_variant_problem>",
                         "bw_dkdv_kernel<float, 64, fa_variant_problem>", "bw_dq_kernel<float, 64, fa_variant_problem>"};
    compile(ctx, "f32, SIMT", score, mask, FA_F32, f32, 3, 0u);
    /* "two_pass", "flash_row" and "naive" (attention_variant.cu's variant_simt_algo, variant_naive) */
    const char *algos[] = {"attn_tiled_kernel<__nv_bfloat16, 64, MODE_STATS, fa_variant_problem>",
                           "attn_tiled_kernel<__nv_bfloat16, 64, MODE_OUTPUT, fa_variant_problem>",
                           "attn_row_kernel<__nv_bfloat16, fa_variant_problem>",
                           "naive_softmax_kernel<__nv_bfloat16, true, 1, fa_variant_problem>",
                           "naive_softmax_kernel<__nv_bfloat16, true, 8, fa_variant_problem>"};
    compile(ctx, "bf16, two_pass, flash_row and naive", score, mask, FA_BF16, algos, 5, 0u);
    /* a name the unit does not define is the error, with NVRTC's word for it */
    const char *bad[] = {"attn_no_such_kernel<float>"};
    CHECK(fa_cuda_variant_compile(ctx, score, NULL, FA_F32, "sm_90a", bad, 1, 0u) != FA_OK &&
              strstr(fa_context_error(ctx), "flashattn: ") != NULL,
          "%s", "an unknown instance is an error");
  }
  fa_expr_free(score), fa_expr_free(mask);
  fa_context_destroy(ctx);
  return tu_summary("test_variant_nvrtc");
}
