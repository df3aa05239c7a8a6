/* Attention variants on cuda (API §9): the CUDA C of a traced score_mod and
 * mask_mod, compiled at run time into the fused kernels
 * (kernels/attention/attention_variant.cu).  Only this code reaches the
 * compiler: numbers, the node operators and the captured tensors' reads,
 * never text from a script.
 *
 * Each node becomes one constant of a type inferred from its operands:
 * bool for the comparisons and logic, long long for integers (positions,
 * integral constants, and + - * min max abs floor of integers: exact, as
 * the CPU's f64 is below 2^53), float for the rest (the kernels' score
 * type).  Reads check their indices as the CPU does: an index outside the
 * tensor or not an integer reads NaN, and when that value reaches the
 * result the kernel records the read (its node: the "fault" of expr.h). */
#include "variant_codegen.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A node's type: bool, long long, float, and TJ: an integer held in a
 * float, exactly (|x| <= 2^24), so that positions and their differences
 * cost what the built-in rules do (no 64-bit or conversion work a score) */
enum { TB, TI, TF, TJ };
#define EXACT_IN_FLOAT 16777216.0
#define EXACT_IN_DOUBLE 9007199254740992.0

typedef struct {
  char *s;
  size_t n, cap;
  int failed;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
  if (t->failed) return;
  va_list ap;
  for (;;) {
    va_start(ap, fmt);
    const int w = vsnprintf(t->s ? t->s + t->n : NULL, t->s ? t->cap - t->n : 0, fmt, ap);
    va_end(ap);
    if (w < 0) {
      t->failed = 1;
      return;
    }
    if (t->s && t->n + (size_t)w < t->cap) {
      t->n += (size_t)w;
      return;
    }
    size_t cap = t->cap ? t->cap : 4096;
    while (cap <= t->n + (size_t)w) cap *= 2;
    char *s = realloc(t->s, cap);
    if (!s) {
      t->failed = 1;
      return;
    }
    t->s = s, t->cap = cap;
  }
}

/* Node j as a value of type want, from its own type have. */
static void operand(text *t, int j, int have, int want) {
  if (have == want || (have == TJ && want == TF)) put(t, "v%d", j);
  else if (want == TF || want == TJ) put(t, have == TB ? "(v%d ? 1.f : 0.f)" : "(float)v%d", j);
  else if (want == TI) put(t, have == TB ? "(v%d ? 1LL : 0LL)" : "(long long)v%d", j);
  else put(t, have == TI ? "(v%d != 0)" : "(v%d != 0.f)", j); /* NaN != 0: true, as the CPU's */
}

/* The type two integer or float operands meet in: long long if either is
 * one, else float (TJ when both are exact integers). */
static int meet(int a, int b) {
  if (a == b) return a;
  if ((a == TI || a == TJ) && (b == TI || b == TJ)) return TI;
  return TF;
}

static const char *ctype(int ty) { return ty == TB ? "bool" : ty == TI ? "long long" : "float"; }

/* A number: from the arguments (slot >= 0: a.ci for long long, a.cf for
 * the floats), else a literal. */
static void constant(text *t, const fa_expr_node *x, int ty, int slot) {
  if (slot >= 0) put(t, ty == TI ? "a.ci[%d]" : "a.cf[%d]", slot);
  else if (ty == TB) put(t, "%s", x->c != 0 ? "true" : "false");
  else if (ty == TI) put(t, "%lldLL", (long long)x->c);
  else if (ty == TJ) put(t, "%lld.f", (long long)x->c);
  else if (x->c != x->c) put(t, "__int_as_float(0x7fffffff)");
  else if (isinf(x->c)) put(t, "%s__int_as_float(0x7f800000)", x->c < 0 ? "-" : "");
  else put(t, "(float)%.17g", x->c);
}

static int integral(double c) { return c == floor(c) && fabs(c) < EXACT_IN_DOUBLE; }

/* The range [lo, hi] of an integer node's values over a call's positions
 * (b in 1..B, h in 1..H, q in 1..Lq, k in 1..Lk): what shows a read in
 * range for every key, so that it needs no check a score (slopes[h],
 * doc[q]).  Unknown: -inf..inf. */
typedef struct {
  double lo, hi;
} range;

static range span(double a, double b, double c, double d) {
  range r = {fmin(fmin(a, b), fmin(c, d)), fmax(fmax(a, b), fmax(c, d))};
  if (r.lo != r.lo || r.hi != r.hi) r.lo = -INFINITY, r.hi = INFINITY; /* inf - inf */
  return r;
}

static range node_range(const fa_expr *e, int i, const range *rg, const int *ty, const int64_t *bounds) {
  const fa_expr_node *x = &e->nodes[i];
  const range all = {-INFINITY, INFINITY};
  const int na = fa_expr_operands(x);
  const range A = na > 0 ? rg[x->a[0]] : all, B = na > 1 ? rg[x->a[1]] : all, C = na > 2 ? rg[x->a[2]] : all;
  if (ty[i] != TI) return all;
  switch (x->op) {
  case FA_X_CONST: return (range){x->c, x->c};
  case FA_X_B: case FA_X_H: case FA_X_Q: case FA_X_K: return (range){1, (double)bounds[x->op - FA_X_B]};
  case FA_X_NEG: return (range){-A.hi, -A.lo};
  case FA_X_ABS: return A.lo >= 0 ? A : A.hi <= 0 ? (range){-A.hi, -A.lo} : (range){0, fmax(-A.lo, A.hi)};
  case FA_X_FLOOR: return A;
  case FA_X_ADD: return span(A.lo + B.lo, A.hi + B.hi, A.lo + B.lo, A.hi + B.hi);
  case FA_X_SUB: return span(A.lo - B.hi, A.hi - B.lo, A.lo - B.hi, A.hi - B.lo);
  case FA_X_MUL: return span(A.lo * B.lo, A.lo * B.hi, A.hi * B.lo, A.hi * B.hi);
  case FA_X_MIN: return (range){fmin(A.lo, B.lo), fmin(A.hi, B.hi)};
  case FA_X_MAX: return (range){fmax(A.lo, B.lo), fmax(A.hi, B.hi)};
  case FA_X_MOD: { /* by a constant d: 0..d-1, or d+1..0 (the divisor's sign) */
    const double d = e->nodes[x->a[1]].c;
    return d > 0 ? (range){0, d - 1} : (range){d + 1, 0};
  }
  case FA_X_WHERE: return (range){fmin(B.lo, C.lo), fmax(B.hi, C.hi)};
  case FA_X_LOAD: return (range){0, 1}; /* a bool tensor read as a number */
  default: return all;
  }
}

/* The types of e's nodes, which reads may fall outside their tensor
 * (unsafe: not every index provably an integer within its dimension for
 * the bounds B, H, Lq, Lk), and which values depend on such a read (may
 * carry a fault). */
static void infer(const fa_expr *e, const int64_t *bounds, int *ty, uint8_t *fl, uint8_t *unsafe) {
  range *rg = malloc(sizeof *rg * (size_t)e->n); /* NULL: every read unsafe */
  for (int i = 0; i < e->n; i++) {
    const fa_expr_node *x = &e->nodes[i];
    const int a = x->a[0], b = x->a[1], c = x->a[2];
    int f = 0;
    unsafe[i] = 0;
    switch (x->op) {
    case FA_X_CONST: ty[i] = x->is_bool ? TB : integral(x->c) ? TI : TF; break;
    case FA_X_S: ty[i] = TF; break;
    case FA_X_B: case FA_X_H: case FA_X_Q: case FA_X_K: ty[i] = TI; break;
    case FA_X_NEG: case FA_X_ABS: case FA_X_FLOOR: ty[i] = ty[a] == TI ? TI : TF, f = fl[a]; break;
    case FA_X_EXP: case FA_X_LOG: case FA_X_TANH: case FA_X_SQRT: ty[i] = TF, f = fl[a]; break;
    case FA_X_NOT: ty[i] = TB, f = fl[a]; break;
    case FA_X_ADD: case FA_X_SUB: case FA_X_MUL: case FA_X_MIN: case FA_X_MAX:
      ty[i] = ty[a] == TI && ty[b] == TI ? TI : TF, f = fl[a] | fl[b];
      break;
    case FA_X_MOD: /* integers by a constant other than 0; else Lua's float modulo */
      ty[i] = ty[a] == TI && ty[b] == TI && e->nodes[b].op == FA_X_CONST && e->nodes[b].c != 0 ? TI : TF;
      f = fl[a] | fl[b];
      break;
    case FA_X_DIV: case FA_X_POW: ty[i] = TF, f = fl[a] | fl[b]; break;
    case FA_X_LT: case FA_X_LE: case FA_X_GT: case FA_X_GE: case FA_X_EQ: case FA_X_NE:
    case FA_X_AND: case FA_X_OR:
      ty[i] = TB, f = fl[a] | fl[b];
      break;
    case FA_X_WHERE:
      ty[i] = ty[b] == ty[c] ? ty[b] : TF, f = fl[a] | fl[b] | fl[c];
      break;
    case FA_X_LOAD: {
      const fa_tensor *src = e->tensors[x->tensor];
      ty[i] = x->is_bool ? TB : src->dtype == FA_BOOL ? TI : TF;
      for (int d = 0; d < x->ndim; d++) {
        f |= fl[x->a[d]];
        if (!rg || ty[x->a[d]] != TI || !(rg[x->a[d]].lo >= 1 && rg[x->a[d]].hi <= (double)src->shape[d]))
          unsafe[i] = 1;
      }
      f |= unsafe[i];
      break;
    }
    default: ty[i] = TF; break;
    }
    fl[i] = (uint8_t)f;
    if (rg) rg[i] = node_range(e, i, rg, ty, bounds);
    /* an integer that may pass int64's range is a float: a long long of
     * (q * 1e9 * 1e9) would wrap around where the CPU's f64 does not (below
     * that a long long stays exact, where a float would round) */
    if (rg && ty[i] == TI && !(rg[i].lo >= -FA_EXPR_INT64_SAFE && rg[i].hi <= FA_EXPR_INT64_SAFE)) {
      ty[i] = TF;
      rg[i] = node_range(e, i, rg, ty, bounds);
    }
  }
  /* integers that stay exact in a float, computed from such integers only */
  for (int i = 0; rg && i < e->n; i++) {
    const fa_expr_node *x = &e->nodes[i];
    if (ty[i] != TI || x->op == FA_X_LOAD || !(rg[i].lo >= -EXACT_IN_FLOAT && rg[i].hi <= EXACT_IN_FLOAT)) continue;
    int exact = 1;
    for (int j = 0; j < fa_expr_operands(x); j++) exact &= ty[x->a[j]] != TI;
    if (exact) ty[i] = TJ;
  }
  free(rg);
}

/* Index operand j of a read, 0-based: a position as the integer the
 * function takes (q, not (long long)(qf + 1.f) - 1: a float-to-integer
 * conversion a score, which ran on the pipe that the softmax's exp2 needs),
 * else the operand as an integer, less 1. */
static void index0(text *t, const fa_expr *e, int j, const int *ty) {
  const int op = e->nodes[j].op;
  if (op == FA_X_B || op == FA_X_H || op == FA_X_Q || op == FA_X_K) {
    put(t, "%c", "bhqk"[op - FA_X_B]);
    return;
  }
  put(t, "(");
  operand(t, j, ty[j], TI);
  put(t, " - 1)");
}

/* A checked read's offset o<i>: each index i<i>_<d> (0-based) and whether
 * it is inside its dimension (k<i>_<d>), k<i> for all of them; offset 0
 * where one is not. */
static void emit_checked_offset(text *t, const fa_expr *e, const fa_expr_node *x, int i, const int *ty, int slot) {
  for (int d = 0; d < x->ndim; d++) {
    const int a = x->a[d];
    if (ty[a] == TF) {
      put(t, "  const float x%d_%d = v%d;\n", i, d, a);
      put(t, "  const bool k%d_%d = x%d_%d >= 1.f && x%d_%d <= (float)a.shape[%d][%d] && x%d_%d == floorf(x%d_%d);\n", i,
          d, i, d, i, d, slot, d, i, d, i, d);
      put(t, "  const long long i%d_%d = k%d_%d ? (long long)x%d_%d - 1 : 0;\n", i, d, i, d, i, d);
    } else {
      put(t, "  const long long i%d_%d = ", i, d);
      index0(t, e, a, ty);
      put(t, ";\n");
      put(t, "  const bool k%d_%d = (unsigned long long)i%d_%d < (unsigned long long)a.shape[%d][%d];\n", i, d, i, d,
          slot, d);
    }
  }
  put(t, "  const bool k%d = ", i);
  for (int d = 0; d < x->ndim; d++) put(t, "%sk%d_%d", d ? " && " : "", i, d);
  put(t, ";\n  const long long o%d = k%d ? ", i, i);
  for (int d = 0; d < x->ndim; d++) put(t, "%si%d_%d * a.stride[%d][%d]", d ? " + " : "", i, d, slot, d);
  put(t, " : 0;\n");
}

/* A checked read's bad access for the message (which dimension, which
 * index, in expr.c's codes), noted by the first bad access of read `reads`. */
static void emit_fault_note(text *t, const fa_expr_node *x, int i, const int *ty, int reads) {
  put(t, "  if (!k%d) {\n    int d = 0;\n    long long ix = 0;\n", i);
  for (int d = x->ndim - 1; d >= 0; d--) {
    if (ty[x->a[d]] == TF)
      put(t, "    if (!k%d_%d) d = %d, ix = x%d_%d != x%d_%d ? FA_VARIANT_NAN_INDEX : x%d_%d != floorf(x%d_%d) ? "
             "FA_VARIANT_FRACTION_INDEX : fabsf(x%d_%d) < %.1ef ? (long long)x%d_%d : x%d_%d > 0 ? "
             "FA_VARIANT_HUGE_INDEX : -FA_VARIANT_HUGE_INDEX;\n",
          i, d, d, i, d, i, d, i, d, i, d, i, d, FA_EXPR_INT64_SAFE, i, d, i, d);
    else put(t, "    if (!k%d_%d) d = %d, ix = i%d_%d + 1;\n", i, d, d, i, d);
  }
  put(t, "    fa_variant_note(fault, %d, d, ix);\n  }\n", reads);
}

/* The format of a read of dtype at slot %d, offset o%d, as a float (or a
 * long long 0/1 for a bool tensor): what the pairs evaluate. */
static const char *load_format(int dtype) {
  switch (dtype) {
  case FA_F16: return "__half2float(((const __half *)a.ptr[%d])[o%d])";
  case FA_BF16: return "__bfloat162float(((const __nv_bfloat16 *)a.ptr[%d])[o%d])";
  case FA_F64: return "(float)((const double *)a.ptr[%d])[o%d]";
  case FA_BOOL: return "(long long)(((const unsigned char *)a.ptr[%d])[o%d] != 0)";
  default: return "((const float *)a.ptr[%d])[o%d]";
  }
}

/* The read of node i of captured tensor slot `slot` of the kernel's
 * arguments: checked when unsafe (reads: its ordinal among the checked
 * reads), else at an offset with no check. */
static void emit_load(text *t, const fa_expr *e, int i, const int *ty, const uint8_t *fl, int unsafe, int slot,
                      int reads) {
  const fa_expr_node *x = &e->nodes[i];
  if (unsafe) {
    emit_checked_offset(t, e, x, i, ty, slot);
  } else { /* in range at every position of the call */
    put(t, "  const long long o%d = ", i);
    for (int d = 0; d < x->ndim; d++) {
      put(t, "%s", d ? " + " : "");
      index0(t, e, x->a[d], ty);
      put(t, " * a.stride[%d][%d]", slot, d);
    }
    put(t, ";\n  const bool k%d = true;\n", i);
  }
  const char *load = load_format(e->tensors[x->tensor]->dtype);
  put(t, "  const %s v%d = k%d ? ", ctype(ty[i]), i, i);
  if (ty[i] == TB) put(t, "(");
  put(t, load, slot, i);
  if (ty[i] == TB) put(t, " != 0)");
  put(t, " : %s;\n", ty[i] == TB ? "true" : ty[i] == TI ? "0LL" : "__int_as_float(0x7fffffff)");
  if (!fl[i]) return;
  /* the fault: an index's own first, else this read's */
  put(t, "  const int f%d = ", i);
  for (int d = 0; d < x->ndim; d++)
    if (fl[x->a[d]]) put(t, "f%d >= 0 ? f%d : ", x->a[d], x->a[d]);
  put(t, "k%d ? -1 : %d;\n", i, i);
  if (unsafe) emit_fault_note(t, x, i, ty, reads);
}

/* How much an absolute error of each node can grow on its way to the
 * score (its "gain"): 1 at the root, through sums, negation and where's
 * chosen operand unchanged, times |c| through a product with (or a division
 * by) a constant c, unbounded through anything else (score_mod's only: in
 * mask_mod everything reaches a comparison).  A node used twice takes the
 * larger.  tanh is fa_variant_tanh_fast where its gain is at most 128
 * (c·tanh(s / c), softcap, with c <= 128): the unit makes that common.cuh's
 * one-SFU tanh_as in f16/bf16 calls (within 3e-7 of tanh absolutely, so
 * the score within 4e-5), tanhf in f32 ones (variant_unit); elsewhere
 * tanhf, whose relative precision a larger factor may need. */
#define FAST_TANH_GAIN 128.
static double *gains(const fa_expr *e, const uint8_t *live) {
  double *g = calloc((size_t)e->n, sizeof *g);
  if (!g) return NULL;
  g[e->n - 1] = 1.;
  for (int i = e->n - 1; i >= 0; i--) {
    const fa_expr_node *x = &e->nodes[i];
    if (!live[i]) continue;
    const int a = x->a[0], b = x->a[1], n = fa_expr_operands(x);
    double to[4] = {INFINITY, INFINITY, INFINITY, INFINITY}; /* a read's indices: unbounded */
    const fa_expr_node *xa = n > 0 ? &e->nodes[a] : NULL, *xb = n > 1 ? &e->nodes[b] : NULL;
    switch (x->op) {
    case FA_X_ADD: case FA_X_SUB: to[0] = to[1] = g[i]; break;
    case FA_X_NEG: to[0] = g[i]; break;
    case FA_X_WHERE: to[1] = to[2] = g[i]; break;
    case FA_X_MUL:
      if (xb->op == FA_X_CONST && !xb->is_bool) to[0] = g[i] * fabs(xb->c);
      if (xa->op == FA_X_CONST && !xa->is_bool) to[1] = g[i] * fabs(xa->c);
      break;
    case FA_X_DIV:
      if (xb->op == FA_X_CONST && xb->c != 0) to[0] = g[i] / fabs(xb->c);
      break;
    default: break;
    }
    for (int j = 0; j < n; j++) {
      const double v = to[j] != to[j] ? INFINITY : to[j]; /* inf · 0 */
      if (v > g[x->a[j]]) g[x->a[j]] = v;
    }
  }
  return g;
}

/* Whether division node i is a product with its divisor's reciprocal: by
 * a constant, where that is the same number (a power of two), or where the
 * dividend is a float (the score: tanh(s / 30)), whose last bit decides no
 * floor.  An integer's quotient is divided: times (float)(1 / 41), 41 gave
 * 0.99999994, whose floor split `(q / 41):floor()` chunks where the CPU's
 * f64 does not (124 divisors in 2..300 do so somewhere below 2^24; f32
 * division never does). */
static int div_by_reciprocal(const fa_expr *e, const int *ty, int i) {
  const fa_expr_node *x = &e->nodes[i], *xb = &e->nodes[x->a[1]];
  int ex;
  const int by_const = xb->op == FA_X_CONST && isfinite(xb->c) && xb->c != 0 && fabs(xb->c) < 1e30 &&
                       fabs(xb->c) > 1e-30;
  const int exact = by_const && fabs(frexp(xb->c, &ex)) == 0.5;
  return by_const && (exact || (ty[x->a[0]] != TI && ty[x->a[0]] != TJ));
}

static void emit_node(text *t, const fa_expr *e, int i, const int *ty, const uint8_t *fl, const double *gain,
                      const int *slot) {
  const fa_expr_node *x = &e->nodes[i];
  const int a = x->a[0], b = x->a[1], c = x->a[2], T = ty[i];
  static const char *const cmp[] = {"<", "<=", ">", ">=", "==", "!="};
  put(t, "  const %s v%d = ", ctype(T), i);
  switch (x->op) {
  case FA_X_CONST: constant(t, x, T, slot[i]); break;
  case FA_X_S: put(t, "s"); break;
  case FA_X_B: case FA_X_H: case FA_X_Q: case FA_X_K: /* bf + 1.f, or b + 1 past 2^24 */
    put(t, T == TJ ? "(%cf + 1.f)" : "(%c + 1)", "bhqk"[x->op - FA_X_B]);
    break;
  case FA_X_NEG: put(t, "-"), operand(t, a, ty[a], T); break;
  case FA_X_ABS:
    if (T == TI) put(t, "(v%d < 0 ? -v%d : v%d)", a, a, a);
    else if (T == TJ) put(t, "fabsf(v%d)", a);
    else put(t, "fabsf("), operand(t, a, ty[a], TF), put(t, ")");
    break;
  case FA_X_FLOOR:
    if (T == TI || T == TJ) put(t, "v%d", a);
    else put(t, "floorf("), operand(t, a, ty[a], TF), put(t, ")");
    break;
  case FA_X_EXP: case FA_X_LOG: case FA_X_TANH: case FA_X_SQRT: {
    static const char *const fn[] = {"expf", "logf", "tanhf", "sqrtf"};
    const int fast = x->op == FA_X_TANH && gain && gain[i] <= FAST_TANH_GAIN;
    put(t, "%s(", fast ? "fa_variant_tanh_fast" : fn[x->op - FA_X_EXP]), operand(t, a, ty[a], TF), put(t, ")");
    break;
  }
  case FA_X_NOT: put(t, "!"), operand(t, a, ty[a], TB); break;
  case FA_X_DIV: /* its slot: the reciprocal's */
    operand(t, a, ty[a], TF);
    if (!div_by_reciprocal(e, ty, i)) put(t, " / "), operand(t, b, ty[b], TF);
    else if (slot[i] >= 0) put(t, " * a.cf[%d]", slot[i]);
    else put(t, " * (float)%.17g", 1.0 / e->nodes[b].c);
    break;
  case FA_X_ADD: case FA_X_SUB: case FA_X_MUL:
    operand(t, a, ty[a], T), put(t, " %c ", "+-*"[x->op - FA_X_ADD]), operand(t, b, ty[b], T);
    break;
  case FA_X_MOD:
    put(t, "%s(", T == TI ? "fa_variant_imod" : "fa_variant_fmod"), operand(t, a, ty[a], T), put(t, ", "),
        operand(t, b, ty[b], T), put(t, ")");
    break;
  case FA_X_POW: put(t, "powf("), operand(t, a, ty[a], TF), put(t, ", "), operand(t, b, ty[b], TF), put(t, ")"); break;
  case FA_X_MIN: case FA_X_MAX: /* Lua's order: o < p ? o : p keeps a NaN in p */
    put(t, "("), operand(t, b, ty[b], T), put(t, x->op == FA_X_MIN ? " < " : " > "), operand(t, a, ty[a], T);
    put(t, " ? "), operand(t, b, ty[b], T), put(t, " : "), operand(t, a, ty[a], T), put(t, ")");
    break;
  case FA_X_LT: case FA_X_LE: case FA_X_GT: case FA_X_GE: case FA_X_EQ: case FA_X_NE: {
    const int w = meet(ty[a], ty[b]);
    operand(t, a, ty[a], w), put(t, " %s ", cmp[x->op - FA_X_LT]), operand(t, b, ty[b], w);
    break;
  }
  case FA_X_AND: case FA_X_OR:
    operand(t, a, ty[a], TB), put(t, x->op == FA_X_AND ? " && " : " || "), operand(t, b, ty[b], TB);
    break;
  case FA_X_WHERE:
    operand(t, a, ty[a], TB), put(t, " ? "), operand(t, b, ty[b], T), put(t, " : "), operand(t, c, ty[c], T);
    break;
  default: put(t, "__int_as_float(0x7fffffff)"); break;
  }
  put(t, ";\n");
  if (!fl[i]) return;
  /* the fault this value carries: its operands' in order; where: the taken branch's */
  const int na = fa_expr_operands(x);
  put(t, "  const int f%d = ", i);
  if (x->op == FA_X_WHERE) {
    if (fl[a]) put(t, "f%d >= 0 ? f%d : ", a, a);
    operand(t, a, ty[a], TB);
    if (fl[b]) put(t, " ? f%d", b);
    else put(t, " ? -1");
    if (fl[c]) put(t, " : f%d;\n", c);
    else put(t, " : -1;\n");
    return;
  }
  for (int j = 0; j < na; j++)
    if (fl[x->a[j]]) put(t, "f%d >= 0 ? f%d : ", x->a[j], x->a[j]);
  put(t, "-1;\n");
}

/* mask_mod over a whole tile at once, where that is exact: an expression
 * of integers (positions, integral constants, + - * min max abs floor, %
 * by a constant), comparisons, logic, fa.where, and reads at integer
 * indices whose float values only meet comparisons (doc[q] == doc[k]);
 * no other float.  tile(a, b, h, q0, q1, k0, k1[, lane, lanes]) (0-based,
 * inclusive; lanes: 32 when a warp calls it together, its reads split
 * among the lanes, else 1) gives 0 when no pair of the tile attends, 1
 * when every pair does, 2 when it cannot tell (then the pairs are
 * evaluated): interval arithmetic in
 * doubles (exact below 2^53) for the integers, for a read the least and
 * the greatest value over the box of its indices (at most TILE_READ_MAX
 * elements, every one inside the tensor, else it cannot tell), and for
 * each boolean the values it can take (bit 1: true, bit 2: false).  Each
 * position appears once in an expression such as q - k <= W, so the common
 * rules (causal, windows, prefixes, documents) come out exact. */
#define TILE_READ_MAX 512

static int is_comparison(int op) { return op >= FA_X_LT && op <= FA_X_NE; }

static int tile_exact(const fa_expr *e, const int *ty, const uint8_t *live) {
  for (int i = 0; i < e->n; i++) {
    if (!live[i]) continue;
    const fa_expr_node *x = &e->nodes[i];
    const int op = x->op;
    if (op == FA_X_S || op == FA_X_DIV || op == FA_X_POW || op == FA_X_EXP || op == FA_X_LOG || op == FA_X_TANH ||
        op == FA_X_SQRT)
      return 0;
    if (op == FA_X_LOAD) {
      for (int d = 0; d < x->ndim; d++)
        if (ty[x->a[d]] != TI && ty[x->a[d]] != TJ) return 0;
    } else if (ty[i] == TF && op != FA_X_CONST) {
      return 0;
    }
    /* a float (a read, a constant) meets nothing but a comparison: its
     * bounds then stay the values themselves, as the pairs compare them */
    for (int j = 0; !is_comparison(op) && j < fa_expr_operands(x); j++)
      if (ty[x->a[j]] == TF && op != FA_X_LOAD) return 0;
  }
  return 1;
}

/* A read over a tile: l<i>, h<i> (and n<i>: a NaN among them, or too many
 * to look at) for a number, t<i> for a boolean; 2 returned when an index
 * may leave the tensor (the pairs then evaluate it, and record the read). */
static void emit_tile_read(text *t, const fa_expr *e, int i, const int *ty, int slot) {
  const fa_expr_node *x = &e->nodes[i];
  if (ty[i] == TB) put(t, "  int t%d = 0;\n", i);
  else put(t, "  double l%d = INFINITY, h%d = -INFINITY;\n  bool n%d = false;\n", i, i, i);
  put(t, "  {\n    double count = 1.;\n");
  for (int d = 0; d < x->ndim; d++) {
    const int A = x->a[d];
    put(t, "    if (!(l%d >= 1. && h%d <= (double)a.shape[%d][%d])) return 2;\n", A, A, slot, d);
    put(t, "    count *= h%d - l%d + 1.;\n", A, A);
  }
  put(t, "    if (count > %d.) {\n", TILE_READ_MAX);
  if (ty[i] == TB) put(t, "      t%d = 3;\n    } else {\n", i);
  else put(t, "      n%d = true;\n    } else {\n", i);
  /* the box's elements in one loop, lane by lane (lanes: the threads of a
   * warp that share the tile, or 1), the last index fastest; each extent
   * is at most TILE_READ_MAX here; the offset o<i> as the pairs' */
  for (int d = 1; d < x->ndim; d++)
    put(t, "    const int e%d_%d = (int)(h%d - l%d) + 1;\n", i, d, x->a[d], x->a[d]);
  put(t, "    for (int u = lane; u < (int)count; u += lanes) {\n      int r = u;\n");
  for (int d = x->ndim - 1; d >= 0; d--) {
    put(t, "      const long long x%d_%d = (long long)l%d - 1 + ", i, d, x->a[d]);
    put(t, d ? "r %% e%d_%d;\n      r /= e%d_%d;\n" : "r;\n", i, d, i, d);
  }
  put(t, "      const long long o%d = ", i);
  for (int d = 0; d < x->ndim; d++) put(t, "%sx%d_%d * a.stride[%d][%d]", d ? " + " : "", i, d, slot, d);
  put(t, ";\n      const double v = (double)(");
  put(t, load_format(e->tensors[x->tensor]->dtype), slot, i);
  put(t, ");\n");
  if (ty[i] == TB) put(t, "      t%d |= v != 0. ? 1 : 2;\n    }\n    fa_tile_lanes_or(t%d, lanes);\n", i, i);
  else
    /* without a branch (fmin and fmax pass NaN over), so that the
     * unrolled loop's reads are issued together */
    put(t, "      n%d |= v != v;\n      l%d = fmin(l%d, v), h%d = fmax(h%d, v);\n    }\n"
           "    fa_tile_lanes_range(l%d, h%d, n%d, lanes);\n", i, i, i, i, i, i, i, i);
  put(t, "    }\n  }\n");
}

/* A bound of operand j of a comparison meeting in type w (hi: the upper
 * one): a boolean's 0/1, an integer rounded to a float where the pairs
 * compare in floats. */
static void cmp_bound(text *t, int j, int have, int w, int hi) {
  if (have == TB) put(t, hi ? "(t%d & 1 ? 1. : 0.)" : "(t%d & 2 ? 0. : 1.)", j);
  else if (w == TF && have == TI) put(t, "(double)(float)%c%d", hi ? 'h' : 'l', j);
  else put(t, "%c%d", hi ? 'h' : 'l', j);
}

/* Whether operand j of a comparison may be NaN over the tile (floats only). */
static void nan_flag(text *t, int j, int have) {
  if (have == TF) put(t, "n%d", j);
  else put(t, "false");
}

static void emit_tile(text *t, const fa_expr *e, const int *ty, const uint8_t *live, const int *slot, int base) {
  static const char *const cmp[] = {"lt", "le", "gt", "ge", "eq", "ne"};
  put(t, "  static const bool has_tile = true;\n");
  put(t, "  static __device__ int tile(const fa_variant_args &a, long long b, long long h, long long q0, long long q1,"
         " long long k0, long long k1, int lane = 0, int lanes = 1) {\n  (void)a, (void)lane, (void)lanes;\n");
  for (int i = 0; i < e->n; i++) {
    if (!live[i]) continue;
    const fa_expr_node *x = &e->nodes[i];
    const int A = x->a[0], B = x->a[1], C = x->a[2];
    if (x->op == FA_X_LOAD) {
      emit_tile_read(t, e, i, ty, base + x->tensor);
      continue;
    }
    if (ty[i] == TF) { /* a float constant, as the pairs round it */
      if (slot[i] >= 0) put(t, "  const double l%d = (double)a.cf[%d], h%d = l%d;\n  const bool n%d = false;\n", i, slot[i], i, i, i);
      else if (x->c != x->c) put(t, "  const double l%d = 0., h%d = 0.;\n  const bool n%d = true;\n", i, i, i);
      else if (isinf(x->c)) put(t, "  const double l%d = %sINFINITY, h%d = l%d;\n  const bool n%d = false;\n", i,
                                x->c < 0 ? "-" : "", i, i, i);
      else put(t, "  const double l%d = (double)(float)%.17g, h%d = l%d;\n  const bool n%d = false;\n", i, x->c, i, i, i);
      continue;
    }
    if (ty[i] == TB) {
      switch (x->op) {
      case FA_X_CONST: put(t, "  const int t%d = %d;\n", i, x->c != 0 ? 1 : 2); break;
      case FA_X_NOT: put(t, "  const int t%d = ((t%d & 1) << 1) | ((t%d & 2) >> 1);\n", i, A, A); break;
      case FA_X_AND: put(t, "  const int t%d = ((t%d & t%d) & 1) | ((t%d | t%d) & 2);\n", i, A, B, A, B); break;
      case FA_X_OR: put(t, "  const int t%d = ((t%d | t%d) & 1) | ((t%d & t%d) & 2);\n", i, A, B, A, B); break;
      case FA_X_WHERE: put(t, "  const int t%d = (t%d & 1 ? t%d : 0) | (t%d & 2 ? t%d : 0);\n", i, A, B, A, C); break;
      default:
        if (ty[A] == TB && ty[B] == TB) /* eq / ne of two booleans: sure only when both are known */
          put(t, "  const int t%d = (t%d == 3 || t%d == 3) ? 3 : (t%d == t%d ? %d : %d);\n", i, A, B, A, B,
              x->op == FA_X_EQ ? 1 : 2, x->op == FA_X_EQ ? 2 : 1);
        else { /* comparisons of numbers: none sure where a NaN may be */
          const int w = meet(ty[A], ty[B]);
          put(t, "  const int t%d = (", i);
          nan_flag(t, A, ty[A]), put(t, " || "), nan_flag(t, B, ty[B]);
          put(t, ") ? 3 : fa_tile_%s(", cmp[x->op - FA_X_LT]);
          cmp_bound(t, A, ty[A], w, 0), put(t, ", "), cmp_bound(t, A, ty[A], w, 1), put(t, ", ");
          cmp_bound(t, B, ty[B], w, 0), put(t, ", "), cmp_bound(t, B, ty[B], w, 1), put(t, ");\n");
        }
        break;
      }
      continue;
    }
    switch (x->op) { /* integers: [l, h] */
    case FA_X_CONST:
      if (slot[i] >= 0) put(t, "  const double l%d = (double)a.c%c[%d], h%d = l%d;\n", i, ty[i] == TI ? 'i' : 'f', slot[i], i, i);
      else put(t, "  const double l%d = %.17g, h%d = %.17g;\n", i, x->c, i, x->c);
      break;
    case FA_X_B: put(t, "  const double l%d = (double)(b + 1), h%d = l%d;\n", i, i, i); break;
    case FA_X_H: put(t, "  const double l%d = (double)(h + 1), h%d = l%d;\n", i, i, i); break;
    case FA_X_Q: put(t, "  const double l%d = (double)(q0 + 1), h%d = (double)(q1 + 1);\n", i, i); break;
    case FA_X_K: put(t, "  const double l%d = (double)(k0 + 1), h%d = (double)(k1 + 1);\n", i, i); break;
    case FA_X_NEG: put(t, "  const double l%d = -h%d, h%d = -l%d;\n", i, A, i, A); break;
    case FA_X_ABS:
      put(t, "  const double l%d = l%d >= 0 ? l%d : h%d <= 0 ? -h%d : 0., h%d = fmax(fabs(l%d), fabs(h%d));\n", i, A, A,
          A, A, i, A, A);
      break;
    case FA_X_FLOOR: put(t, "  const double l%d = l%d, h%d = h%d;\n", i, A, i, A); break;
    case FA_X_ADD: put(t, "  const double l%d = l%d + l%d, h%d = h%d + h%d;\n", i, A, B, i, A, B); break;
    case FA_X_SUB: put(t, "  const double l%d = l%d - h%d, h%d = h%d - l%d;\n", i, A, B, i, A, B); break;
    case FA_X_MUL:
      put(t, "  const double l%d = fmin(fmin(l%d * l%d, l%d * h%d), fmin(h%d * l%d, h%d * h%d)),", i, A, B, A, B, A, B,
          A, B);
      put(t, " h%d = fmax(fmax(l%d * l%d, l%d * h%d), fmax(h%d * l%d, h%d * h%d));\n", i, A, B, A, B, A, B, A, B);
      break;
    case FA_X_MIN: put(t, "  const double l%d = fmin(l%d, l%d), h%d = fmin(h%d, h%d);\n", i, A, B, i, A, B); break;
    case FA_X_MAX: put(t, "  const double l%d = fmax(l%d, l%d), h%d = fmax(h%d, h%d);\n", i, A, B, i, A, B); break;
    case FA_X_MOD: { /* by a constant d (the types say so): exact when the span does not wrap */
      const double d = e->nodes[B].c;
      put(t, "  double l%d = %.17g, h%d = %.17g;\n", i, d > 0 ? 0.0 : d + 1, i, d > 0 ? d - 1 : 0.0);
      put(t, "  if (h%d - l%d < %.17g) { const double m0 = l%d - floor(l%d / %.17g) * %.17g, m1 = h%d - floor(h%d / "
             "%.17g) * %.17g; if (m0 <= m1) l%d = m0, h%d = m1; }\n",
          A, A, fabs(d), A, A, d, d, A, A, d, d, i, i);
      break;
    }
    case FA_X_WHERE:
      put(t, "  const double l%d = t%d == 1 ? l%d : t%d == 2 ? l%d : fmin(l%d, l%d),", i, A, B, A, C, B, C);
      put(t, " h%d = t%d == 1 ? h%d : t%d == 2 ? h%d : fmax(h%d, h%d);\n", i, A, B, A, C, B, C);
      break;
    default: put(t, "  const double l%d = -INFINITY, h%d = INFINITY;\n", i, i); break;
    }
  }
  put(t, "  const int r = t%d;\n  return r == 1 ? 1 : r == 2 ? 0 : 2;\n  }\n", e->n - 1);
}

/* What emitting an expression needs to know of its nodes: their types,
 * which carry a fault, which reads are checked (infer) and which nodes the
 * result depends on. */
typedef struct {
  int *ty;
  uint8_t *fl, *unsafe, *live;
  int *slot; /* numbers: -1 a literal, else the slot of a.cf (a.ci for a long long) the code reads */
} analysis;

static void analysis_free(analysis *an) { free(an->ty), free(an->fl), free(an->unsafe), free(an->live), free(an->slot); }

/* The numbers of e that its code reads from the arguments, in consts
 * (NULL: none) from its counts on, while slots last: every live finite
 * number but the booleans and those a modulo or a power takes (their
 * literals let the compiler make q % 64 and x ^ 2 a mask and a product),
 * and the reciprocal a division by a constant multiplies by.  Whatever
 * the values, equal text means equal types, ranges' verdicts and code. */
static void assign_numbers(const fa_expr *e, analysis *an, fa_variant_consts *c) {
  for (int i = 0; i < e->n; i++) an->slot[i] = -1;
  if (!c) return;
  for (int j = 0; j < e->n; j++) /* a modulo's or a power's operands: marked -2, literals */
    if ((e->nodes[j].op == FA_X_MOD || e->nodes[j].op == FA_X_POW) && an->live[j])
      an->slot[e->nodes[j].a[0]] = an->slot[e->nodes[j].a[1]] = -2;
  for (int i = 0; i < e->n; i++) {
    const fa_expr_node *x = &e->nodes[i];
    const int keep = an->live[i] && an->slot[i] != -2 && x->op == FA_X_CONST && !x->is_bool && isfinite(x->c);
    an->slot[i] = -1;
    if (!an->live[i]) continue;
    if (keep && an->ty[i] == TI && c->ni < FA_VARIANT_INTS)
      an->slot[i] = c->ni, c->i[c->ni++] = (long long)x->c;
    else if (keep && an->ty[i] != TI && c->nf < FA_VARIANT_FLOATS)
      an->slot[i] = c->nf, c->f[c->nf++] = (float)x->c;
    else if (x->op == FA_X_DIV && div_by_reciprocal(e, an->ty, i) && c->nf < FA_VARIANT_FLOATS)
      an->slot[i] = c->nf, c->f[c->nf++] = (float)(1.0 / e->nodes[x->a[1]].c);
  }
}

/* 0, or -1 when out of memory (an freed); consts as assign_numbers'. */
static int analyse(const fa_expr *e, const int64_t *bounds, analysis *an, fa_variant_consts *consts) {
  an->ty = calloc((size_t)e->n, sizeof *an->ty);
  an->fl = calloc((size_t)e->n, 1), an->unsafe = calloc((size_t)e->n, 1), an->live = calloc((size_t)e->n, 1);
  an->slot = calloc((size_t)e->n, sizeof *an->slot);
  if (!an->ty || !an->fl || !an->unsafe || !an->live || !an->slot) {
    analysis_free(an);
    return -1;
  }
  infer(e, bounds, an->ty, an->fl, an->unsafe);
  an->live[e->n - 1] = 1;
  for (int i = e->n - 1; i >= 0; i--)
    for (int j = 0; an->live[i] && j < fa_expr_operands(&e->nodes[i]); j++) an->live[e->nodes[i].a[j]] = 1;
  assign_numbers(e, an, consts);
  return 0;
}

/* The derivative by s of node i (g<i>, a float), for the nodes that depend
 * on s (dep), forward mode as the CPU's (expr.c's grad_chunk): where the
 * value picks one operand (min, max, where, abs) that operand's, 0 at
 * abs's kink; floor, reads, positions and constants have none.  Only the
 * terms of operands that depend on s are written (0 · inf would be NaN). */
static void emit_grad(text *t, const fa_expr *e, int i, const int *ty, const uint8_t *dep) {
  const fa_expr_node *x = &e->nodes[i];
  const int a = x->a[0], b = x->a[1], c = x->a[2];
  const int da = dep[a], db = fa_expr_operands(x) > 1 && dep[b];
  put(t, "  const float g%d = ", i);
  switch (x->op) {
  case FA_X_S: put(t, "1.f"); break;
  case FA_X_NEG: put(t, "-g%d", a); break;
  case FA_X_ABS: put(t, "v%d > 0.f ? g%d : v%d < 0.f ? -g%d : 0.f", a, a, a, a); break;
  case FA_X_EXP: put(t, "v%d * g%d", i, a); break;
  case FA_X_LOG: put(t, "g%d / v%d", a, a); break;
  case FA_X_TANH: put(t, "(1.f - v%d * v%d) * g%d", i, i, a); break;
  case FA_X_SQRT: put(t, "g%d / (2.f * v%d)", a, i); break;
  case FA_X_ADD: case FA_X_SUB:
    if (da) put(t, "g%d", a);
    if (db) put(t, "%sg%d", x->op == FA_X_SUB ? " - " : da ? " + " : "", b);
    break;
  case FA_X_MUL:
    if (da) put(t, "g%d * ", a), operand(t, b, ty[b], TF);
    if (db) put(t, "%s", da ? " + " : ""), operand(t, a, ty[a], TF), put(t, " * g%d", b);
    break;
  case FA_X_DIV:
    if (da) put(t, "(g%d", a);
    else put(t, "(0.f");
    if (db) put(t, " - v%d * g%d", i, b);
    put(t, ") / "), operand(t, b, ty[b], TF);
    break;
  case FA_X_MOD:
    if (da) put(t, "g%d", a);
    if (db) put(t, " - floorf("), operand(t, a, ty[a], TF), put(t, " / "), operand(t, b, ty[b], TF), put(t, ") * g%d", b);
    break;
  case FA_X_POW:
    if (da) put(t, "(g%d != 0.f ? ", a), operand(t, b, ty[b], TF), put(t, " * powf("), operand(t, a, ty[a], TF),
        put(t, ", "), operand(t, b, ty[b], TF), put(t, " - 1.f) * g%d : 0.f)", a);
    if (db) put(t, "%s(g%d != 0.f ? v%d * logf(", da ? " + " : "", b, i), operand(t, a, ty[a], TF),
        put(t, ") * g%d : 0.f)", b);
    break;
  case FA_X_MIN: case FA_X_MAX: /* the operand the value took (emit_node's order) */
    operand(t, b, ty[b], TF), put(t, x->op == FA_X_MIN ? " < " : " > "), operand(t, a, ty[a], TF);
    put(t, db ? " ? g%d" : " ? 0.f", b), put(t, da ? " : g%d" : " : 0.f", a);
    break;
  case FA_X_WHERE:
    operand(t, a, ty[a], TB), put(t, dep[b] ? " ? g%d" : " ? 0.f", b), put(t, dep[c] ? " : g%d" : " : 0.f", c);
    break;
  default: put(t, "0.f"); break;
  }
  put(t, ";\n");
}

/* One function of the variant: score_mod (returns the score; with grad,
 * score_grad: also its derivative by s in ds) or mask_mod (returns whether
 * the key stays), its reads from argument slot base on; an: e's analysis. */
static int emit_function(text *t, const fa_expr *e, const analysis *an, int is_mask, int grad, int base) {
  const int *ty = an->ty, *slot = an->slot;
  const uint8_t *fl = an->fl, *unsafe = an->unsafe, *live = an->live;
  uint8_t *dep = grad ? calloc((size_t)e->n, 1) : NULL;
  if (grad && !dep) {
    t->failed = 1;
    return 0;
  }
  if (dep) fa_expr_grad_deps(e, dep);
  double *gain = is_mask ? NULL : gains(e, live); /* NULL (a mask, or out of memory): tanhf everywhere */
  put(t,
      "  static __device__ __forceinline__ %s %s(const fa_variant_args &a, float s, long long b, long long h, "
      "long long q, long long k, float bf, float hf, float qf, float kf, int &fault_node%s) {\n",
      is_mask ? "bool" : "float", is_mask ? "mask" : grad ? "score_grad" : "score", grad ? ", float &ds" : "");
  put(t, "  (void)a, (void)s, (void)b, (void)h, (void)q, (void)k, (void)bf, (void)hf, (void)qf, (void)kf;\n");
  put(t, "  long long *fault = a.fault[%d];\n  (void)fault;\n", is_mask);
  int reads = 0;
  for (int i = 0; i < e->n; i++) {
    const fa_expr_node *x = &e->nodes[i];
    if (x->op == FA_X_LOAD) {
      if (live[i]) emit_load(t, e, i, ty, fl, unsafe[i], base + x->tensor, reads);
      reads += unsafe[i];
    } else if (live[i]) {
      emit_node(t, e, i, ty, fl, gain, slot);
      if (dep && dep[i]) emit_grad(t, e, i, ty, dep);
    }
  }
  const int r = e->n - 1;
  if (dep) put(t, dep[r] ? "  ds = g%d;\n" : "  ds = 0.f;\n", r);
  free(dep), free(gain);
  if (fl[r]) put(t, "  if (f%d >= 0) fault_node = f%d;\n", r, r);
  put(t, "  return ");
  operand(t, r, ty[r], is_mask ? TB : TF);
  put(t, ";\n  }\n");
  if (grad) return reads;
  if (is_mask && tile_exact(e, ty, live)) emit_tile(t, e, ty, live, slot, base);
  else if (is_mask) put(t, "  static const bool has_tile = false;\n"
                           "  static __device__ int tile(const fa_variant_args &, long long, long long, long long, long long,"
                           " long long, long long, int = 0, int = 1) { return 2; }\n");
  return reads;
}

/* score_mod's functions (score, score_grad) or mask_mod's, as emit_function;
 * its numbers into consts. */
static int emit_expression(text *t, const fa_expr *e, const int64_t *bounds, int is_mask, int base,
                           fa_variant_consts *consts) {
  analysis an;
  if (analyse(e, bounds, &an, consts)) {
    t->failed = 1;
    return 0;
  }
  const int reads = emit_function(t, e, &an, is_mask, 0, base);
  if (!is_mask) emit_function(t, e, &an, 0, 1, base);
  analysis_free(&an);
  return reads;
}

int fa_variant_unsafe_reads(const fa_expr *e, const int64_t *bounds, int node) {
  analysis an;
  if (!e) return 0;
  if (analyse(e, bounds, &an, NULL)) return -1;
  int n = 0;
  for (int i = 0; i < e->n && i != node; i++) n += e->nodes[i].op == FA_X_LOAD && an.unsafe[i];
  analysis_free(&an);
  return n;
}

char *fa_variant_source(const fa_expr *score_mod, const fa_expr *mask_mod, const int64_t *bounds, int *reads,
                        fa_variant_consts *consts) {
  text t = {0};
  if (consts) memset(consts, 0, sizeof *consts);
  put(&t, "struct fa_variant {\n");
  put(&t, "  static const bool has_score = %s, has_mask = %s;\n", score_mod ? "true" : "false",
      mask_mod ? "true" : "false");
  reads[0] = reads[1] = 0;
  if (score_mod) reads[0] = emit_expression(&t, score_mod, bounds, 0, 0, consts);
  else
    put(&t, "  static __device__ __forceinline__ float score(const fa_variant_args &, float s, long long, long long, "
            "long long, long long, float, float, float, float, int &) { return s; }\n"
            "  static __device__ __forceinline__ float score_grad(const fa_variant_args &, float s, long long, long long, "
            "long long, long long, float, float, float, float, int &, float &ds) { ds = 1.f; return s; }\n");
  if (mask_mod) reads[1] = emit_expression(&t, mask_mod, bounds, 1, score_mod ? score_mod->ntensors : 0, consts);
  else
    put(&t, "  static __device__ __forceinline__ bool mask(const fa_variant_args &, float, long long, long long, "
            "long long, long long, float, float, float, float, int &) { return true; }\n"
            "  static const bool has_tile = false;\n  static __device__ int tile(const fa_variant_args &, long long, "
            "long long, long long, long long, long long, long long, int = 0, int = 1) { return 1; }\n");
  put(&t, "};\n");
  if (t.failed) {
    free(t.s);
    return NULL;
  }
  return t.s;
}
