/* A mask_mod that is the built-in key range in disguise (API §9): an AND of
 * bounds on q − k, e.g. the sliding window `q >= k & q - k <= W` or a
 * causal mask `q >= k`.  Evaluated pair by pair it costs the kernels a pass
 * over the scores of every tile the band crosses; as the window / causal
 * options of §2 the same keys drop out of each row's range (a compare a
 * row), and the call runs on the built-in rule: the same result, exactly,
 * for the rule is the same set of keys.  The reference never converts, nor
 * does a call with a block mask, which the kernels believe as it is. */
#include "expr.h"

#include <math.h>

/* A node's value as cq·q + ck·k + c0 (q, k 1-based positions), when it is one. */
typedef struct {
  double cq, ck, c0;
  int ok;
} linear;

/* The bounds an AND of constraints leaves on d = q − k: lo <= d <= hi. */
typedef struct {
  double lo, hi;
  int ok;
} band;

static linear linear_of(const fa_expr *e, int i, int depth) {
  const linear none = {0, 0, 0, 0};
  const fa_expr_node *x = &e->nodes[i];
  if (depth > 64 || x->is_bool) return none;
  linear a, b;
  switch (x->op) {
  case FA_X_Q: return (linear){1, 0, 0, 1};
  case FA_X_K: return (linear){0, 1, 0, 1};
  case FA_X_CONST: return isfinite(x->c) ? (linear){0, 0, x->c, 1} : none;
  case FA_X_NEG:
    a = linear_of(e, x->a[0], depth + 1);
    return a.ok ? (linear){-a.cq, -a.ck, -a.c0, 1} : none;
  case FA_X_ADD:
  case FA_X_SUB: {
    const double sg = x->op == FA_X_ADD ? 1 : -1;
    a = linear_of(e, x->a[0], depth + 1), b = linear_of(e, x->a[1], depth + 1);
    return a.ok && b.ok ? (linear){a.cq + sg * b.cq, a.ck + sg * b.ck, a.c0 + sg * b.c0, 1} : none;
  }
  case FA_X_MUL: /* by a constant */
    a = linear_of(e, x->a[0], depth + 1), b = linear_of(e, x->a[1], depth + 1);
    if (!a.ok || !b.ok) return none;
    if (b.cq == 0 && b.ck == 0) return (linear){a.cq * b.c0, a.ck * b.c0, a.c0 * b.c0, 1};
    if (a.cq == 0 && a.ck == 0) return (linear){b.cq * a.c0, b.ck * a.c0, b.c0 * a.c0, 1};
    return none;
  default: return none;
  }
}

/* Bound of an integer d from "d op t" (op one of < <= > >= ==, t real). */
static band bound(int op, double t) {
  const band none = {0, 0, 0};
  switch (op) {
  case FA_X_LE: return (band){-INFINITY, floor(t), 1};
  case FA_X_LT: return (band){-INFINITY, ceil(t) - 1, 1};
  case FA_X_GE: return (band){ceil(t), INFINITY, 1};
  case FA_X_GT: return (band){floor(t) + 1, INFINITY, 1};
  case FA_X_EQ: return t == floor(t) ? (band){t, t, 1} : none;
  default: return none;
  }
}

static int flip(int op) {
  return op == FA_X_LT ? FA_X_GT : op == FA_X_LE ? FA_X_GE : op == FA_X_GT ? FA_X_LT : op == FA_X_GE ? FA_X_LE : op;
}

static band band_of(const fa_expr *e, int i, int depth) {
  const band none = {0, 0, 0}, all = {-INFINITY, INFINITY, 1};
  const fa_expr_node *x = &e->nodes[i];
  if (depth > 64) return none;
  if (x->op == FA_X_CONST) return x->is_bool && x->c != 0 ? all : none; /* true: no bound */
  if (x->op == FA_X_AND) {
    const band a = band_of(e, x->a[0], depth + 1), b = band_of(e, x->a[1], depth + 1);
    return a.ok && b.ok ? (band){fmax(a.lo, b.lo), fmin(a.hi, b.hi), 1} : none;
  }
  if (x->op != FA_X_LT && x->op != FA_X_LE && x->op != FA_X_GT && x->op != FA_X_GE && x->op != FA_X_EQ) return none;
  const linear a = linear_of(e, x->a[0], depth + 1), b = linear_of(e, x->a[1], depth + 1);
  if (!a.ok || !b.ok) return none;
  /* (a − b) op 0 as s·(q − k) + c op 0 */
  const double cq = a.cq - b.cq, ck = a.ck - b.ck, c = a.c0 - b.c0;
  if (cq == 0 || cq != -ck) return none; /* a constant comparison, or a bound on q or k alone: not a window */
  const double t = -c / cq;
  const band r = bound(cq > 0 ? x->op : flip(x->op), t);
  return isfinite(t) ? r : none;
}

int fa_expr_mask_as_range(const fa_expr *mask_mod, int64_t Lq, int64_t Lk, const fa_attention_opts *in,
                          fa_attention_opts *out) {
  /* with a block mask the call believes it (its empty tiles skipped, its full ones not masked: API §9) */
  if (!mask_mod || mask_mod->n < 1 || mask_mod->ntensors > 0 || in->block_mask) return 0;
  const band d = band_of(mask_mod, mask_mod->n - 1, 0);
  if (!d.ok || d.lo > d.hi) return 0; /* an empty band masks every key: left to the kernels */
  /* keys j of row i (0-based, the same offsets): i − hi <= j <= i − lo; the
   * options' window is relative to the bottom-right diagonal i + off */
  const double off = (double)(Lk - Lq), cap = (double)(Lk + Lq);
  fa_attention_opts o = *in;
  int64_t left = -1, right = -1;
  fa_causal causal = in->causal;
  if (isfinite(d.hi)) {
    if (d.hi + off < 0) return 0; /* the band's top lies above the diagonal's alignment */
    left = (int64_t)fmin(d.hi + off, cap);
  }
  if (isfinite(d.lo)) {
    const double r = -d.lo - off;
    if (r >= 0) right = (int64_t)fmin(r, cap);
    else if (d.lo == 0) /* j <= i with off > 0: top-left causal, tighter than a bottom-right one the call may set */
      causal = FA_CAUSAL_TOP_LEFT;
    else
      return 0;
  }
  if (in->has_window) { /* both rules apply: the tighter bound of each side (-1: unbounded) */
    if (in->window_left >= 0) left = left < 0 ? in->window_left : (left < in->window_left ? left : in->window_left);
    if (in->window_right >= 0)
      right = right < 0 ? in->window_right : (right < in->window_right ? right : in->window_right);
  }
  o.mask_mod = NULL;
  o.causal = causal;
  o.has_window = left >= 0 || right >= 0;
  o.window_left = left, o.window_right = right;
  *out = o;
  return 1;
}
