/* FLOP and memory-traffic models, so scripts can report TFLOP/s and GB/s.
 * The byte counts follow each algorithm's schedule in the seeds' terms:
 * what it must read and write in device memory, caches ignored. */
#include "check.h"

fa_status fa_cost_attention(fa_context *ctx, fa_tensor *q, fa_tensor *k, fa_tensor *v, const fa_attention_opts *opts,
                            fa_cost *out) {
  FA_NEED(ctx);
  FA_NEED(out);
  fa_attention_opts defaults;
  fa_attn_dims d;
  fa_status st = fa_check_attention_or_defaults(ctx, q, k, v, &opts, &defaults, &d);
  if (!st) st = fa_check_attention_kernel(ctx, opts, &d); /* a named kernel: its algo's model, its errors */
  if (st) return st;
  double es = (double)fa_dtype_size(d.dtype);
  double Q = (double)(d.B * d.Hq * d.Lq * d.D), K = (double)(d.B * d.Hkv * d.Lk * d.D);
  double V = (double)(d.B * d.Hkv * d.Lk * d.Dv), O = (double)(d.B * d.Hq * d.Lq * d.Dv);
  double S = (double)(d.B * d.Hq) * (double)d.Lq * (double)d.Lk, rows = (double)(d.B * d.Hq * d.Lq);
  double frac = opts->causal != FA_CAUSAL_NONE ? 0.5 : 1.0;
  out->flops = 2.0 * S * (double)(d.D + d.Dv) * frac;
  double lse = opts->return_lse || opts->lse_out ? 4.0 * rows : 0.0; /* lse_out alone asks for it too */
  double mask = opts->mask ? (double)fa_tensor_numel(opts->mask) * (double)fa_dtype_size(opts->mask->dtype) : 0.0;
  switch (d.algo) {
  case FA_ATTN_NAIVE: { /* S written and read back, P written and read back */
    /* S is held in f32 (f64 for f64 inputs); P in the inputs' dtype on CUDA
     * (cuBLAS reads it for P·V), in S's on the CPU */
    double ss = es > 4.0 ? es : 4.0, ps = d.device == FA_CUDA ? es : ss;
    out->bytes = es * (Q + K + V + O) + 2.0 * (ss + ps) * S;
    break;
  }
  case FA_ATTN_TWO_PASS: /* Q and K read twice, (m, l) per row written then read */
    out->bytes = es * (2.0 * Q + 2.0 * K + V + O) + 16.0 * rows;
    break;
  case FA_ATTN_FLASH_ROW: /* every query row streams all of K and V */
    out->bytes = es * (Q + O + S * (double)(d.D + d.Dv) * frac);
    break;
  default: /* flash: each input read once, the output written once */
    out->bytes = es * (Q + K + V + O);
    break;
  }
  out->bytes += lse + mask;
  return FA_OK;
}

fa_status fa_cost_softmax(fa_context *ctx, fa_tensor *x, const fa_softmax_opts *opts, fa_cost *out) {
  FA_NEED(ctx);
  FA_NEED(out);
  fa_softmax_opts defaults;
  if (!opts) {
    fa_softmax_opts_init(&defaults);
    opts = &defaults;
  }
  fa_status st = fa_check_softmax(ctx, x, opts);
  if (st) return st;
  double mn = (double)fa_tensor_numel(x), es = (double)fa_dtype_size(x->dtype);
  int64_t n = x->shape[x->ndim - 1];
  fa_softmax_algo algo = opts->algo;
  if (algo == FA_SOFTMAX_AUTO)
    algo = n <= fa_softmax_fused_max_n(ctx, x->dtype, x->storage->device) ? FA_SOFTMAX_FUSED : FA_SOFTMAX_ONLINE;
  double reads = algo == FA_SOFTMAX_SAFE ? 3 : algo == FA_SOFTMAX_FUSED ? 1 : 2; /* naive: sum, normalise */
  out->bytes = es * mn * (reads + 1.0);
  out->flops = 3.0 * mn; /* exp, add, divide per element (max for the safe forms) */
  return FA_OK;
}
