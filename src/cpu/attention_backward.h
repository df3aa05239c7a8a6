/* The CPU backward pass of attention (API §10): the gradients dq, dk, dv of
 * fa_attention with respect to q, k, v, from the forward's o and lse. */
#ifndef FA_CPU_ATTENTION_BACKWARD_H
#define FA_CPU_ATTENTION_BACKWARD_H

#include "internal.h"

/* p holds the forward's options and q, k, v in dtype p->storage (the
 * compute dtype, f32 or f64, or f16/bf16 that the fast path widens a tile
 * at a time; the reference's: f64) at p's strides (API §6: rows
 * contiguous, anywhere); o (p->o_st) and dout (dout_st) are (B,Hq,Lq,Dv)
 * at their strides in p->storage too, lse (B,Hq,Lq) dense in the compute
 * dtype.  dq (B,Hq,Lq,D), dk (B,Hkv,Lk,D), dv
 * (B,Hkv,Lk,Dv), dense, are written whole (zeros where nothing flows).  The
 * reference takes every operand dense. */
typedef struct {
  const fa_attn_problem *p;
  const void *o, *dout, *lse;
  void *dq, *dk, *dv;
  fa_attn_strides dout_st;
} fa_attn_backward;

/* FlashAttention's recomputation scheme, no Lq·Lk storage: one task per
 * (batch, KV head) owns its dk, dv and the dq rows of its query heads (or,
 * with fewer tasks than threads, a key tile's dk, dv, then a query tile's
 * dq, summed in the same order), so that the result is the same from run
 * to run whatever the threads. */
fa_status fa_cpu_attention_backward(fa_context *ctx, const fa_attn_backward *g);
/* The plainest code in f64: S, P, dP materialised per (batch, head). */
fa_status fa_cpu_attention_backward_reference(fa_context *ctx, const fa_attn_backward *g);

#endif
