/* mask_mod over a whole tile on the CPU (fa_expr_tile, expr.h): interval
 * arithmetic in f64 over the expression's nodes, the CPU's evaluation
 * type.  Rounding is monotone, so an interval whose ends are evaluated as
 * the pairs are holds every pair's value: + - * neg abs floor min max of
 * any numbers, % by a nonzero integral constant of integers (exact),
 * comparisons, logic and fa.where.  A read takes the least and the
 * greatest value over the box of its indices (integers, at most
 * TILE_READ_MAX elements, all inside the tensor: else the pairs decide,
 * and record the read).  A NaN anywhere a value may be makes the
 * comparisons it reaches undecided; s, / ^ exp log tanh sqrt make the
 * whole tile undecided.  The kernels' generated code (variant_codegen.c)
 * decides the same tiles in the same way. */
#include "expr.h"
#include "internal.h"

#include <math.h>
#include <stdlib.h>

#define TILE_READ_MAX 512

typedef struct {
  double lo, hi;
  uint8_t nan;      /* a value may be NaN, or is unknown */
  uint8_t bits;     /* a boolean: 1 may be true, 2 may be false */
  uint8_t integral; /* every value an integer (indices, % operands) */
} tile_val;

static int is_cmp(int op) { return op >= FA_X_LT && op <= FA_X_NE; }

/* A boolean's values as the numbers 0 and 1. */
static tile_val as_number(tile_val v, int is_bool) {
  if (!is_bool) return v;
  v.lo = v.bits & 2 ? 0 : 1, v.hi = v.bits & 1 ? 1 : 0, v.nan = 0, v.integral = 1;
  return v;
}

/* lt, le, eq and their mirrors: 1 all true, 2 all false, 3 either. */
static uint8_t cmp_bits(int op, tile_val a, tile_val b) {
  if (a.nan || b.nan) return 3;
  switch (op) {
  case FA_X_LT: return a.hi < b.lo ? 1 : a.lo >= b.hi ? 2 : 3;
  case FA_X_LE: return a.hi <= b.lo ? 1 : a.lo > b.hi ? 2 : 3;
  case FA_X_GT: return b.hi < a.lo ? 1 : b.lo >= a.hi ? 2 : 3;
  case FA_X_GE: return b.hi <= a.lo ? 1 : b.lo > a.hi ? 2 : 3;
  default: {
    const uint8_t eq = a.lo == a.hi && b.lo == b.hi && a.lo == b.lo ? 1 : a.hi < b.lo || b.hi < a.lo ? 2 : 3;
    return op == FA_X_EQ || eq == 3 ? eq : (uint8_t)(3 - eq);
  }
  }
}

/* The least and greatest of four ends, unknown when one is NaN (inf - inf). */
static tile_val span4(double a, double b, double c, double d, int nan, int integral) {
  tile_val r = {fmin(fmin(a, b), fmin(c, d)), fmax(fmax(a, b), fmax(c, d)), (uint8_t)nan, 0, (uint8_t)integral};
  if (a != a || b != b || c != c || d != d) r.nan = 1;
  return r;
}

/* A read's values over its index box; -1 when an index may leave its
 * dimension or not be an integer. */
static int tile_read(const fa_expr *e, const fa_expr_node *x, const tile_val *v, tile_val *out) {
  const fa_tensor *t = e->host[x->tensor];
  out->lo = INFINITY, out->hi = -INFINITY, out->nan = 0, out->bits = 0;
  out->integral = t && t->dtype == FA_BOOL;
  if (!t) return -1;
  double count = 1;
  int64_t lo[4], hi[4];
  for (int d = 0; d < x->ndim; d++) {
    const tile_val ix = v[x->a[d]];
    if (ix.nan || !ix.integral || !(ix.lo >= 1 && ix.hi <= (double)t->shape[d])) return -1;
    lo[d] = (int64_t)ix.lo - 1, hi[d] = (int64_t)ix.hi - 1;
    count *= (double)(hi[d] - lo[d] + 1);
  }
  if (count > TILE_READ_MAX) {
    out->nan = 1, out->bits = 3;
    return 0;
  }
  const void *base = fa_tensor_ptr(t);
  int64_t at[4] = {0, 0, 0, 0};
  for (int d = 0; d < x->ndim; d++) at[d] = lo[d];
  for (;;) {
    int64_t off = 0;
    for (int d = 0; d < x->ndim; d++) off += at[d] * t->strides[d];
    const double y = fa_load_f64(t->dtype, base, off);
    if (x->is_bool) out->bits |= y != 0 ? 1 : 2;
    else if (y != y) out->nan = 1;
    else out->lo = fmin(out->lo, y), out->hi = fmax(out->hi, y);
    int d = x->ndim - 1;
    while (d >= 0 && at[d] == hi[d]) at[d] = lo[d], d--;
    if (d < 0) break;
    at[d]++;
  }
  return 0;
}

int fa_expr_tile(const fa_expr *e, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t k0, int64_t k1) {
  if (!e || e->n < 1 || !e->nodes[e->n - 1].is_bool) return 2;
  for (int i = 0; i < e->n; i++) {
    const int op = e->nodes[i].op;
    if (op == FA_X_S || op == FA_X_DIV || op == FA_X_POW || op == FA_X_EXP || op == FA_X_LOG || op == FA_X_TANH ||
        op == FA_X_SQRT)
      return 2;
  }
  tile_val stack[64], *v = e->n <= 64 ? stack : malloc(sizeof *v * (size_t)e->n);
  if (!v) return 2;
  int verdict = 2;
  for (int i = 0; i < e->n; i++) {
    const fa_expr_node *x = &e->nodes[i];
    /* operands; a boolean taken as a number (arithmetic on it) as 0 and 1 */
    const int arith = x->op >= FA_X_ADD && x->op <= FA_X_MAX;
    const int na = x->op == FA_X_LOAD ? 0 : fa_expr_operands(x);
    const tile_val A = na > 0 ? (arith ? as_number(v[x->a[0]], e->nodes[x->a[0]].is_bool) : v[x->a[0]]) : (tile_val){0};
    const tile_val B = na > 1 ? (arith ? as_number(v[x->a[1]], e->nodes[x->a[1]].is_bool) : v[x->a[1]]) : (tile_val){0};
    tile_val *r = &v[i];
    *r = (tile_val){0, 0, 0, 0, 0};
    switch (x->op) {
    case FA_X_CONST:
      if (x->is_bool) r->bits = x->c != 0 ? 1 : 2;
      else r->lo = r->hi = x->c, r->nan = x->c != x->c, r->integral = x->c == floor(x->c);
      break;
    case FA_X_B: case FA_X_H: case FA_X_Q: case FA_X_K: {
      const int64_t lo[4] = {b, h, q0, k0}, hi[4] = {b, h, q1, k1};
      r->lo = (double)(lo[x->op - FA_X_B] + 1), r->hi = (double)(hi[x->op - FA_X_B] + 1), r->integral = 1;
      break;
    }
    case FA_X_NEG: *r = A, r->lo = -A.hi, r->hi = -A.lo; break;
    case FA_X_ABS:
      *r = A, r->lo = A.lo >= 0 ? A.lo : A.hi <= 0 ? -A.hi : 0, r->hi = fmax(fabs(A.lo), fabs(A.hi));
      break;
    case FA_X_FLOOR: *r = A, r->lo = floor(A.lo), r->hi = floor(A.hi), r->integral = 1; break;
    case FA_X_ADD: *r = span4(A.lo + B.lo, A.hi + B.hi, A.lo + B.lo, A.hi + B.hi, A.nan | B.nan, A.integral & B.integral); break;
    case FA_X_SUB: *r = span4(A.lo - B.hi, A.hi - B.lo, A.lo - B.hi, A.hi - B.lo, A.nan | B.nan, A.integral & B.integral); break;
    case FA_X_MUL:
      *r = span4(A.lo * B.lo, A.lo * B.hi, A.hi * B.lo, A.hi * B.hi, A.nan | B.nan, A.integral & B.integral);
      break;
    case FA_X_MIN: case FA_X_MAX: { /* a NaN may be kept (Lua's order): unknown */
      const int mn = x->op == FA_X_MIN;
      *r = (tile_val){mn ? fmin(A.lo, B.lo) : fmax(A.lo, B.lo), mn ? fmin(A.hi, B.hi) : fmax(A.hi, B.hi),
                      (uint8_t)(A.nan | B.nan), 0, (uint8_t)(A.integral & B.integral)};
      break;
    }
    case FA_X_MOD: { /* integers by a nonzero integral constant: exact when the span does not wrap */
      const fa_expr_node *dn = &e->nodes[x->a[1]];
      const double d = dn->c;
      /* exact for finite values below 2^53 only (the pairs take fmod, as Lua: (1 + 2^60) % 3 is 1) */
      if (dn->op != FA_X_CONST || !A.integral || d == 0 || d != floor(d) || A.nan || !(fabs(A.lo) < 0x1p53) ||
          !(fabs(A.hi) < 0x1p53) || !(fabs(d) < 0x1p53))
        goto undecided;
      *r = (tile_val){d > 0 ? 0 : d + 1, d > 0 ? d - 1 : 0, 0, 0, 1};
      if (A.hi - A.lo < fabs(d)) {
        const double m0 = A.lo - floor(A.lo / d) * d, m1 = A.hi - floor(A.hi / d) * d;
        if (m0 <= m1) r->lo = m0, r->hi = m1;
      }
      break;
    }
    case FA_X_LT: case FA_X_LE: case FA_X_GT: case FA_X_GE: case FA_X_EQ: case FA_X_NE: {
      const int ab = e->nodes[x->a[0]].is_bool, bb = e->nodes[x->a[1]].is_bool;
      if (ab && bb && (x->op == FA_X_EQ || x->op == FA_X_NE)) {
        const uint8_t eq = A.bits == 3 || B.bits == 3 ? 3 : A.bits == B.bits ? 1 : 2;
        r->bits = x->op == FA_X_EQ || eq == 3 ? eq : (uint8_t)(3 - eq);
      } else {
        r->bits = cmp_bits(x->op, as_number(A, ab), as_number(B, bb));
      }
      break;
    }
    case FA_X_AND: r->bits = (uint8_t)(((A.bits & B.bits) & 1) | ((A.bits | B.bits) & 2)); break;
    case FA_X_OR: r->bits = (uint8_t)(((A.bits | B.bits) & 1) | ((A.bits & B.bits) & 2)); break;
    case FA_X_NOT: r->bits = (uint8_t)(((A.bits & 1) << 1) | ((A.bits & 2) >> 1)); break;
    case FA_X_WHERE: {
      const tile_val C = v[x->a[2]];
      const int t = A.bits & 1, f = (A.bits & 2) != 0;
      if (x->is_bool) {
        r->bits = (uint8_t)((t ? B.bits : 0) | (f ? C.bits : 0));
      } else {
        r->lo = t && f ? fmin(B.lo, C.lo) : t ? B.lo : C.lo, r->hi = t && f ? fmax(B.hi, C.hi) : t ? B.hi : C.hi;
        r->nan = (uint8_t)((t && B.nan) || (f && C.nan)), r->integral = (uint8_t)((!t || B.integral) && (!f || C.integral));
      }
      break;
    }
    case FA_X_LOAD:
      if (tile_read(e, x, v, r)) goto undecided;
      break;
    default: goto undecided;
    }
    if (!x->is_bool && !is_cmp(x->op) && (r->lo != r->lo || r->hi != r->hi)) r->nan = 1; /* inf - inf */
    /* an infinite end of an operand of + - *: some pair inside may make inf - inf or 0 · inf, NaN,
     * which the ends alone do not show (((q - k) · inf):ge(-inf) is false on the diagonal) */
    if ((x->op == FA_X_ADD || x->op == FA_X_SUB || x->op == FA_X_MUL) &&
        (isinf(A.lo) || isinf(A.hi) || isinf(B.lo) || isinf(B.hi)))
      r->nan = 1;
  }
  {
    const uint8_t bits = v[e->n - 1].bits;
    verdict = bits == 1 ? FA_BLOCK_FULL : bits == 2 ? FA_BLOCK_EMPTY : 2;
  }
undecided:
  if (v != stack) free(v);
  return verdict;
}
