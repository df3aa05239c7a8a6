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

/* Integers no larger than lim: with positions below 2^31 and
 * coefficients within 2^20 every value the expression computes in f64 is
 * an exact integer, so its comparisons are the ones reasoned about here
 * (a fraction or an overflow to inf would round where this would not). */
static int small_integer(double c, double lim) { return c == floor(c) && fabs(c) <= lim; }

/* l itself while its coefficients stay small integers, else not a form */
static linear bounded(linear l) {
  const linear none = {0, 0, 0, 0};
  return small_integer(l.cq, 0x1p20) && small_integer(l.ck, 0x1p20) && small_integer(l.c0, 0x1p40) ? l : none;
}

static linear linear_of(const fa_expr *e, int i, int *work) {
  const linear none = {0, 0, 0, 0};
  const fa_expr_node *x = &e->nodes[i];
  if (--*work < 0 || x->is_bool) return none;
  linear a, b;
  switch (x->op) {
  case FA_X_Q: return (linear){1, 0, 0, 1};
  case FA_X_K: return (linear){0, 1, 0, 1};
  case FA_X_CONST: return small_integer(x->c, 0x1p40) ? (linear){0, 0, x->c, 1} : none;
  case FA_X_NEG:
    a = linear_of(e, x->a[0], work);
    return a.ok ? (linear){-a.cq, -a.ck, -a.c0, 1} : none;
  case FA_X_ADD:
  case FA_X_SUB: {
    const double sg = x->op == FA_X_ADD ? 1 : -1;
    a = linear_of(e, x->a[0], work), b = linear_of(e, x->a[1], work);
    return a.ok && b.ok ? bounded((linear){a.cq + sg * b.cq, a.ck + sg * b.ck, a.c0 + sg * b.c0, 1}) : none;
  }
  case FA_X_MUL: /* by a constant */
    a = linear_of(e, x->a[0], work), b = linear_of(e, x->a[1], work);
    if (!a.ok || !b.ok) return none;
    if (b.cq == 0 && b.ck == 0) return bounded((linear){a.cq * b.c0, a.ck * b.c0, a.c0 * b.c0, 1});
    if (a.cq == 0 && a.ck == 0) return bounded((linear){b.cq * a.c0, b.ck * a.c0, b.c0 * a.c0, 1});
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

/* The band of "cq·q + ck·k + c op 0". */
static band band_cmp(int op, double cq, double ck, double c) {
  const band none = {0, 0, 0};
  if (!small_integer(cq, 0x1p20) || !small_integer(ck, 0x1p20) || !small_integer(c, 0x1p40)) return none;
  if (cq == 0 || cq != -ck) return none; /* a constant comparison, or a bound on q or k alone: not a window */
  return bound(cq > 0 ? op : flip(op), -c / cq);
}

static band intersect(band a, band b) {
  const band none = {0, 0, 0};
  return a.ok && b.ok ? (band){fmax(a.lo, b.lo), fmin(a.hi, b.hi), 1} : none;
}

/* |x| op t for x = the linear form l and t a constant, op <= or <: -t op' x op t */
static band band_abs(int op, linear l, double t) {
  const int le = op == FA_X_LE;
  return intersect(band_cmp(op, l.cq, l.ck, l.c0 - t), band_cmp(le ? FA_X_GE : FA_X_GT, l.cq, l.ck, l.c0 + t));
}

static band band_of(const fa_expr *e, int i, int *work) {
  const band none = {0, 0, 0}, all = {-INFINITY, INFINITY, 1};
  const fa_expr_node *x = &e->nodes[i];
  if (--*work < 0) return none;
  if (x->op == FA_X_CONST) return x->is_bool && x->c != 0 ? all : none; /* true: no bound */
  if (x->op == FA_X_AND) return intersect(band_of(e, x->a[0], work), band_of(e, x->a[1], work));
  if (x->op != FA_X_LT && x->op != FA_X_LE && x->op != FA_X_GT && x->op != FA_X_GE && x->op != FA_X_EQ) return none;
  const fa_expr_node *xa = &e->nodes[x->a[0]], *xb = &e->nodes[x->a[1]];
  const linear a = linear_of(e, x->a[0], work), b = linear_of(e, x->a[1], work);
  /* a symmetric window: |q - k + c| <= t (or t >= |...|) */
  if (xa->op == FA_X_ABS && b.ok && b.cq == 0 && b.ck == 0 && (x->op == FA_X_LE || x->op == FA_X_LT)) {
    const linear l = linear_of(e, xa->a[0], work);
    return l.ok ? band_abs(x->op, l, b.c0) : none;
  }
  if (xb->op == FA_X_ABS && a.ok && a.cq == 0 && a.ck == 0 && (x->op == FA_X_GE || x->op == FA_X_GT)) {
    const linear l = linear_of(e, xb->a[0], work);
    return l.ok ? band_abs(flip(x->op), l, a.c0) : none;
  }
  if (!a.ok || !b.ok) return none;
  return band_cmp(x->op, a.cq - b.cq, a.ck - b.ck, a.c0 - b.c0); /* (a − b) op 0 */
}

/* The tighter of two window sides, -1 being unbounded. */
static int64_t tighter(int64_t a, int64_t b) { return a < 0 ? b : b < 0 || a < b ? a : b; }

int fa_expr_mask_as_range(const fa_expr *mask_mod, int64_t Lq, int64_t Lk, const fa_attention_opts *in,
                          fa_attention_opts *out) {
  /* with a block mask the call believes it (its empty tiles skipped, its full ones not masked: API §9) */
  if (!mask_mod || mask_mod->n < 1 || mask_mod->ntensors > 0 || in->block_mask) return 0;
  if (Lq >= 0x80000000LL || Lk >= 0x80000000LL) return 0; /* beyond what small_integer's bounds hold for */
  int work = 512; /* node visits: a node reused many times over (a DAG) is not walked exponentially */
  const band d = band_of(mask_mod, mask_mod->n - 1, &work);
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
  if (in->has_window) /* both rules apply: the tighter bound of each side */
    left = tighter(left, in->window_left), right = tighter(right, in->window_right);
  o.mask_mod = NULL;
  o.causal = causal;
  o.has_window = left >= 0 || right >= 0;
  o.window_left = left, o.window_right = right;
  *out = o;
  return 1;
}
