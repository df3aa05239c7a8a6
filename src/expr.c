/* Attention variants (API §9): expressions and their evaluator (expr.h). */
#include "expr.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

int fa_expr_operands(const fa_expr_node *x) {
  switch (x->op) {
  case FA_X_CONST: case FA_X_S: case FA_X_B: case FA_X_H: case FA_X_Q: case FA_X_K: return 0;
  case FA_X_NEG: case FA_X_ABS: case FA_X_EXP: case FA_X_LOG: case FA_X_TANH: case FA_X_SQRT: case FA_X_FLOOR:
  case FA_X_NOT: return 1;
  case FA_X_WHERE: return 3;
  case FA_X_LOAD: return x->ndim;
  default: return 2;
  }
}

void fa_expr_free(fa_expr *e) {
  if (!e) return;
  for (int i = 0; i < e->ntensors; i++) {
    fa_tensor_drop(&e->tensors[i]);
    fa_tensor_drop(&e->host[i]);
  }
  if (e->nodes) fa_host_free(e->nodes, e->bytes);
  fa_host_free(e, sizeof *e);
}

fa_status fa_expr_new(fa_context *ctx, const fa_expr_node *nodes, int n, fa_tensor *const *tensors,
                      const char *const *names, int ntensors, fa_expr **out) {
  FA_NEED(out);
  *out = NULL;
  FA_NEED(nodes);
  if (ntensors > 0) FA_NEED(tensors);
  for (int i = 0; i < ntensors && i < FA_EXPR_MAX_TENSORS; i++)
    if (!tensors[i]) return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: expression: tensor %d is NULL", i);
  if (n < 1 || n > FA_EXPR_MAX_NODES || ntensors < 0 || ntensors > FA_EXPR_MAX_TENSORS)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: expression: %d nodes and %d tensors (expected 1 to %d and 0 to %d)",
                   n, ntensors, FA_EXPR_MAX_NODES, FA_EXPR_MAX_TENSORS);
  for (int i = 0; i < n; i++) {
    const fa_expr_node *x = &nodes[i];
    int na = fa_expr_operands(x);
    if (x->op >= FA_X_COUNT || (x->op == FA_X_LOAD && (x->tensor >= ntensors || x->ndim < 1 || x->ndim > 4 ||
                                                        x->ndim != tensors[x->tensor]->ndim)))
      return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: expression: node %d is malformed", i);
    for (int j = 0; j < na; j++)
      if (x->a[j] < 0 || x->a[j] >= i)
        return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: expression: node %d's operand %d is not an earlier node", i, j);
  }
  fa_status st = FA_OK;
  fa_expr *e = fa_host_alloc(ctx, sizeof *e, &st);
  if (!e) return st;
  memset(e, 0, sizeof *e);
  e->bytes = sizeof *nodes * (size_t)n;
  if (!(e->nodes = fa_host_alloc(ctx, e->bytes, &st))) {
    fa_expr_free(e);
    return st;
  }
  memcpy(e->nodes, nodes, e->bytes);
  e->n = n;
  for (int i = 0; i < ntensors; i++) {
    fa_tensor *t = tensors[i];
    fa_tensor_retain(t);
    e->tensors[i] = t;
    e->ntensors = i + 1;
    if (t->storage->device == FA_CPU) { /* a device tensor's copy is made when the CPU evaluates (fa_expr_begin) */
      fa_tensor_retain(t);
      e->host[i] = t;
    }
    if (names && names[i]) snprintf(e->names[i], sizeof e->names[i], "%s", names[i]);
    else snprintf(e->names[i], sizeof e->names[i], "tensor #%d", i + 1);
  }
  *out = e;
  return FA_OK;
}

/* Lua's float modulo: a - floor(a/b)·b, the sign of b. */
static inline double lua_mod(double a, double b) {
  double m = fmod(a, b);
  if (m != 0 && (m > 0) != (b > 0)) m += b;
  return m;
}

/* A fault's index past int64's range (inf, 1e300), as its sign; INT64_MAX
 * and INT64_MIN are "not an integer" and NaN (the generated CUDA code's
 * FA_VARIANT_HUGE_INDEX, _FRACTION_INDEX and _NAN_INDEX are the same). */
#define FAULT_HUGE (INT64_MAX - 1)

/* Records the fault of read `bad` (its index values in ix) unless one is
 * recorded already. */
static void record_fault(const fa_expr *e, int bad, const double *ix) {
  const fa_expr_node *l = &e->nodes[bad];
  const fa_tensor *t = e->tensors[l->tensor];
  for (int d = 0; d < l->ndim; d++) {
    const double x = ix[d];
    if (!(x >= 1 && x <= (double)t->shape[d]) || x != floor(x)) {
      fa_expr_set_fault(e, bad, d,
                        x != x                ? INT64_MIN
                        : x != floor(x)       ? INT64_MAX
                        : !(fabs(x) < FA_EXPR_INT64_SAFE) ? (x > 0 ? FAULT_HUGE : -FAULT_HUGE) /* inf, 1e300 */
                                              : (int64_t)x);
      return;
    }
  }
  fa_expr_set_fault(e, bad, 0, 0);
}

/* The value arrays of one evaluation: node i, lane j at [i·lanes + j]. */
#define FA_EXPR_SLOTS 8192
#define FA_EXPR_LANES 64

/* Lanes [0, m) of keys k0.., node by node: one dispatch per node and chunk. */
static void eval_chunk(const fa_expr *e, const double *s, int64_t b, int64_t h, int64_t q, int64_t k0, int m, int lanes,
                       const uint8_t *active, double *out, double *v, int16_t *f) {
  const int n = e->n;
  const fa_expr_node *x = e->nodes;
  for (int i = 0; i < n; i++, x++) {
    double *r = v + i * lanes;
    int16_t *fr = f + i * lanes;
    const double *p = v + x->a[0] * lanes, *o = v + x->a[1] * lanes;
    const int16_t *fp = f + x->a[0] * lanes, *fo = f + x->a[1] * lanes;
#define UNARY(EXPR)                                                                                                    \
  for (int j = 0; j < m; j++) r[j] = (EXPR), fr[j] = fp[j];                                                            \
  break
#define BINARY(EXPR)                                                                                                   \
  for (int j = 0; j < m; j++) r[j] = (EXPR), fr[j] = fp[j] >= 0 ? fp[j] : fo[j];                                       \
  break
#define LEAF(EXPR)                                                                                                     \
  for (int j = 0; j < m; j++) r[j] = (EXPR), fr[j] = -1;                                                               \
  break
    switch (x->op) {
    case FA_X_CONST: LEAF(x->c);
    case FA_X_S: LEAF(s ? s[j] : 0);
    case FA_X_B: LEAF((double)(b + 1));
    case FA_X_H: LEAF((double)(h + 1));
    case FA_X_Q: LEAF((double)(q + 1));
    case FA_X_K: LEAF((double)(k0 + j + 1));
    case FA_X_NEG: UNARY(-p[j]);
    case FA_X_ABS: UNARY(fabs(p[j]));
    case FA_X_EXP: UNARY(exp(p[j]));
    case FA_X_LOG: UNARY(log(p[j]));
    case FA_X_TANH: UNARY(tanh(p[j]));
    case FA_X_SQRT: UNARY(sqrt(p[j]));
    case FA_X_FLOOR: UNARY(floor(p[j]));
    case FA_X_NOT: UNARY(p[j] == 0);
    case FA_X_ADD: BINARY(p[j] + o[j]);
    case FA_X_SUB: BINARY(p[j] - o[j]);
    case FA_X_MUL: BINARY(p[j] * o[j]);
    case FA_X_DIV: BINARY(p[j] / o[j]);
    case FA_X_MOD: BINARY(lua_mod(p[j], o[j]));
    case FA_X_POW: BINARY(pow(p[j], o[j]));
    case FA_X_MIN: BINARY(o[j] < p[j] ? o[j] : p[j]); /* Lua's math.min order: NaN in p stays */
    case FA_X_MAX: BINARY(o[j] > p[j] ? o[j] : p[j]);
    case FA_X_LT: BINARY(p[j] < o[j]);
    case FA_X_LE: BINARY(p[j] <= o[j]);
    case FA_X_GT: BINARY(p[j] > o[j]);
    case FA_X_GE: BINARY(p[j] >= o[j]);
    case FA_X_EQ: BINARY(p[j] == o[j]);
    case FA_X_NE: BINARY(p[j] != o[j]);
    case FA_X_AND: BINARY(p[j] != 0 && o[j] != 0);
    case FA_X_OR: BINARY(p[j] != 0 || o[j] != 0);
    case FA_X_WHERE: {
      const double *c = v + x->a[2] * lanes;
      const int16_t *fc = f + x->a[2] * lanes;
      for (int j = 0; j < m; j++) {
        const int t = p[j] != 0;
        r[j] = t ? o[j] : c[j];
        fr[j] = fp[j] >= 0 ? fp[j] : t ? fo[j] : fc[j];
      }
      break;
    }
    case FA_X_LOAD: {
      const fa_tensor *t = e->host[x->tensor];
      if (!t) { /* no host copy (fa_expr_begin not called): no value, as a read out of range */
        for (int j = 0; j < m; j++) r[j] = NAN, fr[j] = -1;
        break;
      }
      const void *base = fa_tensor_ptr(t);
      for (int j = 0; j < m; j++) {
        int64_t off = 0;
        int16_t fi = -1, ok = 1;
        for (int d = 0; d < x->ndim; d++) {
          const double ix = v[x->a[d] * lanes + j];
          const int16_t fd = f[x->a[d] * lanes + j];
          if (fd >= 0 && fi < 0) fi = fd;
          if (!(ix >= 1 && ix <= (double)t->shape[d]) || ix != floor(ix)) ok = 0;
          else off += ((int64_t)ix - 1) * t->strides[d];
        }
        if (!ok && fi < 0) fi = (int16_t)i;
        r[j] = ok ? fa_load_f64(t->dtype, base, off) : NAN;
        fr[j] = fi;
      }
      break;
    }
    default: LEAF(NAN);
    }
#undef UNARY
#undef BINARY
#undef LEAF
  }
  const double *res = v + (n - 1) * lanes;
  const int16_t *fres = f + (n - 1) * lanes;
  for (int j = 0; j < m; j++) {
    out[j] = res[j];
    if (fres[j] < 0 || (active && !active[j])) continue;
    const fa_expr_node *l = &e->nodes[fres[j]];
    double ix[4];
    for (int d = 0; d < l->ndim; d++) ix[d] = v[l->a[d] * lanes + j];
    record_fault(e, fres[j], ix);
    out[j] = NAN;
  }
}

void fa_expr_grad_deps(const fa_expr *e, uint8_t *dep) {
  for (int i = 0; i < e->n; i++) {
    const fa_expr_node *x = &e->nodes[i];
    dep[i] = 0;
    if (x->op == FA_X_S) dep[i] = 1;
    else if (x->op == FA_X_FLOOR || x->op == FA_X_LOAD || (x->op >= FA_X_LT && x->op <= FA_X_NOT)) dep[i] = 0;
    else if (x->op == FA_X_WHERE) dep[i] = dep[x->a[1]] || dep[x->a[2]];
    else
      for (int j = 0; j < fa_expr_operands(x); j++) dep[i] |= dep[x->a[j]];
  }
}

/* The derivatives by s of the nodes whose values eval_chunk left in v
 * (forward mode: one pass in node order), lanes [0, m), for the nodes that
 * depend on s (dep; the others 0), each product term only where its
 * operand depends on s.  Where the value picks one operand (min, max,
 * where, abs) the derivative is that operand's (0 at abs's kink). */
static void grad_chunk(const fa_expr *e, const uint8_t *dep, int m, int lanes, const double *v, double *dv) {
  const fa_expr_node *x = e->nodes;
  for (int i = 0; i < e->n; i++, x++) {
    double *r = dv + i * lanes;
    const double *val = v + i * lanes, *p = v + x->a[0] * lanes, *o = v + x->a[1] * lanes;
    const double *dp = dv + x->a[0] * lanes, *dq = dv + x->a[1] * lanes;
    const int da = dep[x->a[0]], db = fa_expr_operands(x) > 1 && dep[x->a[1]];
#define D_(EXPR)                                                                                                       \
  for (int j = 0; j < m; j++) r[j] = (EXPR);                                                                           \
  break
    if (!dep[i]) {
      for (int j = 0; j < m; j++) r[j] = 0.0;
      continue;
    }
    switch (x->op) {
    case FA_X_S: D_(1.0);
    case FA_X_NEG: D_(-dp[j]);
    case FA_X_ABS: D_(p[j] > 0 ? dp[j] : p[j] < 0 ? -dp[j] : 0.0);
    case FA_X_EXP: D_(val[j] * dp[j]);
    case FA_X_LOG: D_(dp[j] / p[j]);
    case FA_X_TANH: D_((1 - val[j] * val[j]) * dp[j]);
    case FA_X_SQRT: D_(dp[j] / (2 * val[j]));
    case FA_X_ADD: D_(dp[j] + dq[j]);
    case FA_X_SUB: D_(dp[j] - dq[j]);
    case FA_X_MUL: D_((da ? dp[j] * o[j] : 0.0) + (db ? p[j] * dq[j] : 0.0));
    case FA_X_DIV: D_(((da ? dp[j] : 0.0) - (db ? val[j] * dq[j] : 0.0)) / o[j]);
    case FA_X_MOD: D_(dp[j] - (db ? floor(p[j] / o[j]) * dq[j] : 0.0));
    case FA_X_POW:
      D_((da && dp[j] != 0 ? o[j] * pow(p[j], o[j] - 1) * dp[j] : 0.0) +
         (db && dq[j] != 0 ? val[j] * log(p[j]) * dq[j] : 0.0));
    case FA_X_MIN: D_(o[j] < p[j] ? dq[j] : dp[j]);
    case FA_X_MAX: D_(o[j] > p[j] ? dq[j] : dp[j]);
    case FA_X_WHERE: {
      const double *dc = dv + x->a[2] * lanes;
      D_(p[j] != 0 ? dq[j] : dc[j]);
    }
    default: D_(0.0);
    }
#undef D_
  }
}

/* Keys k0.., n of them, a chunk of lanes at a time; with dout (and dv,
 * FA_EXPR_SLOTS of scratch) the derivatives by s as well. */
static void eval_rows(const fa_expr *e, const double *s, int64_t b, int64_t h, int64_t q, int64_t k0, int64_t n,
                      const uint8_t *active, double *out, double *dout, double *dv) {
  double v[FA_EXPR_SLOTS];
  int16_t f[FA_EXPR_SLOTS];
  uint8_t dep[FA_EXPR_SLOTS]; /* e->n <= FA_EXPR_SLOTS: a lane at least */
  int lanes = FA_EXPR_SLOTS / e->n;
  if (lanes > FA_EXPR_LANES) lanes = FA_EXPR_LANES;
  if (dout) fa_expr_grad_deps(e, dep);
  for (int64_t j0 = 0; j0 < n; j0 += lanes) {
    const int m = n - j0 < lanes ? (int)(n - j0) : lanes;
    eval_chunk(e, s ? s + j0 : NULL, b, h, q, k0 + j0, m, lanes, active ? active + j0 : NULL, out + j0, v, f);
    if (!dout) continue;
    grad_chunk(e, dep, m, lanes, v, dv);
    for (int j = 0; j < m; j++) dout[j0 + j] = dv[(e->n - 1) * lanes + j];
  }
}

void fa_expr_eval_row_grad(const fa_expr *e, const double *s, int64_t b, int64_t h, int64_t q, int64_t k0, int64_t n,
                           const uint8_t *active, double *out, double *dout) {
  double dv[FA_EXPR_SLOTS];
  eval_rows(e, s, b, h, q, k0, n, active, out, dout, dv);
}

void fa_expr_eval_row(const fa_expr *e, const double *s, int64_t b, int64_t h, int64_t q, int64_t k0, int64_t n,
                      const uint8_t *active, double *out) {
  eval_rows(e, s, b, h, q, k0, n, active, out, NULL, NULL);
}

/* The host copies of e's device tensors, made once: racing callers each
 * make one, and the first stored is kept. */
static fa_status make_host_copies(fa_context *ctx, const fa_expr *e) {
  fa_expr *m = (fa_expr *)e; /* the copies are made on demand (allocated non-const) */
  for (int i = 0; e && i < e->ntensors; i++) {
    if (__atomic_load_n(&m->host[i], __ATOMIC_ACQUIRE)) continue;
    fa_tensor *copy = NULL, *none = NULL;
    fa_status st = fa_tensor_cpu_contiguous(ctx, e->tensors[i], e->tensors[i]->dtype, &copy);
    if (st) return st;
    if (!__atomic_compare_exchange_n(&m->host[i], &none, copy, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
      fa_tensor_drop(&copy);
  }
  return FA_OK;
}

double fa_expr_value(const fa_expr *e, double s, int64_t b, int64_t h, int64_t q, int64_t k) {
  double r;
  fa_expr_eval_row(e, &s, b, h, q, k, 1, NULL, &r);
  return r;
}

double fa_expr_eval(const fa_expr *e, double s, int64_t b, int64_t h, int64_t q, int64_t k) {
  if (!e) return NAN; /* NULL is never a crash (docs/c-api.md) */
  if (make_host_copies(NULL, e)) return NAN; /* a host copy of a device tensor could not be made */
  return fa_expr_value(e, s, b, h, q, k);
}

fa_status fa_expr_begin(fa_context *ctx, const fa_expr *score_mod, const fa_expr *mask_mod, int host) {
  fa_expr_clear_fault(score_mod);
  fa_expr_clear_fault(mask_mod);
  fa_status st = host ? make_host_copies(ctx, score_mod) : FA_OK;
  return st ? st : host ? make_host_copies(ctx, mask_mod) : FA_OK;
}

fa_status fa_expr_end(fa_context *ctx, const fa_expr *score_mod, const fa_expr *mask_mod) {
  fa_status st = fa_expr_fault(ctx, mask_mod, "opts.mask_mod");
  return st ? st : fa_expr_fault(ctx, score_mod, "opts.score_mod");
}

void fa_expr_set_fault(const fa_expr *e, int node, int dim, int64_t index) {
  fa_expr *m = (fa_expr *)e; /* the fault record is the one mutable part */
  int expected = 0;
  if (!e || node < 0 || node >= e->n || e->nodes[node].op != FA_X_LOAD) return;
  if (!atomic_compare_exchange_strong(&m->fault, &expected, 1)) return;
  m->fault_node = node;
  m->fault_dim = dim < e->nodes[node].ndim ? dim : 0;
  m->fault_index = index;
}

void fa_expr_clear_fault(const fa_expr *e) {
  if (e) atomic_store(&((fa_expr *)e)->fault, 0);
}

static const char *const op_text[FA_X_COUNT] = {
    [FA_X_ADD] = " + ", [FA_X_SUB] = " - ", [FA_X_MUL] = " * ", [FA_X_DIV] = " / ", [FA_X_MOD] = " % ",
    [FA_X_POW] = " ^ ", [FA_X_NEG] = "-", [FA_X_ABS] = "abs", [FA_X_EXP] = "exp", [FA_X_LOG] = "log",
    [FA_X_TANH] = "tanh", [FA_X_SQRT] = "sqrt", [FA_X_FLOOR] = "floor", [FA_X_MIN] = "min", [FA_X_MAX] = "max",
    [FA_X_LT] = "lt", [FA_X_LE] = "le", [FA_X_GT] = "gt", [FA_X_GE] = "ge", [FA_X_EQ] = "eq", [FA_X_NE] = "ne",
    [FA_X_AND] = " & ", [FA_X_OR] = " | ", [FA_X_NOT] = "~"};

typedef struct {
  char *buf;
  size_t n, u;
  int cut;
} text;

static void put(text *t, const char *s) {
  size_t len = strlen(s);
  if (t->u + len + 4 > t->n) {
    t->cut = 1;
    return;
  }
  memcpy(t->buf + t->u, s, len + 1);
  t->u += len;
}

/* Depth-bounded: deep or wide expressions end in "...". */
static void describe(const fa_expr *e, int i, text *t, int depth) {
  if (t->cut || depth > 12) {
    t->cut = 1;
    return;
  }
  const fa_expr_node *x = &e->nodes[i];
  char num[40];
  switch (x->op) {
  case FA_X_CONST:
    if (x->is_bool) put(t, x->c != 0 ? "true" : "false");
    else {
      snprintf(num, sizeof num, "%.14g", x->c);
      put(t, num);
    }
    return;
  case FA_X_S: put(t, "s"); return;
  case FA_X_B: put(t, "b"); return;
  case FA_X_H: put(t, "h"); return;
  case FA_X_Q: put(t, "q"); return;
  case FA_X_K: put(t, "k"); return;
  case FA_X_LOAD:
    put(t, e->names[x->tensor]);
    for (int d = 0; d < x->ndim; d++) {
      put(t, "[");
      describe(e, x->a[d], t, depth + 1);
      put(t, "]");
    }
    return;
  case FA_X_NEG: case FA_X_NOT:
    put(t, op_text[x->op]);
    put(t, "(");
    describe(e, x->a[0], t, depth + 1);
    put(t, ")");
    return;
  case FA_X_WHERE:
    put(t, "where(");
    for (int j = 0; j < 3; j++) {
      if (j) put(t, ", ");
      describe(e, x->a[j], t, depth + 1);
    }
    put(t, ")");
    return;
  default:
    break;
  }
  const int na = fa_expr_operands(x);
  if (op_text[x->op][0] == ' ') { /* infix */
    put(t, "(");
    describe(e, x->a[0], t, depth + 1);
    put(t, op_text[x->op]);
    describe(e, x->a[1], t, depth + 1);
    put(t, ")");
    return;
  }
  put(t, "(");
  describe(e, x->a[0], t, depth + 1);
  put(t, "):");
  put(t, op_text[x->op]);
  put(t, "(");
  if (na == 2) describe(e, x->a[1], t, depth + 1);
  put(t, ")");
}

const char *fa_expr_describe(const fa_expr *e, int i, char *buf, size_t n) {
  text t = {buf, n, 0, 0};
  buf[0] = 0;
  if (n < 8) return buf;
  describe(e, i, &t, 0);
  if (t.cut) memcpy(buf + (t.u < n - 4 ? t.u : n - 4), "...", 4);
  return buf;
}

fa_status fa_expr_fault(fa_context *ctx, const fa_expr *e, const char *what) {
  if (!e || !atomic_load(&((fa_expr *)e)->fault)) return FA_OK;
  char desc[160];
  const fa_expr_node *l = &e->nodes[e->fault_node];
  const fa_tensor *t = e->tensors[l->tensor];
  fa_expr_describe(e, e->fault_node, desc, sizeof desc);
  const long long size = (long long)t->shape[e->fault_dim];
  if (e->fault_index == INT64_MAX || e->fault_index == INT64_MIN)
    return fa_fail(ctx, FA_ERR_ARGUMENT,
                   "flashattn: %s: %s: the index in dimension %d is %s, expected an integer in 1..%lld", what, desc,
                   e->fault_dim + 1, e->fault_index == INT64_MAX ? "not an integer" : "NaN", size);
  if (e->fault_index == FAULT_HUGE || e->fault_index == -FAULT_HUGE)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: %s: %s: index %s out of range 1..%lld (dimension %d)", what, desc,
                   e->fault_index > 0 ? "+inf or past 9e18" : "-inf or below -9e18", size, e->fault_dim + 1);
  return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: %s: %s: index %lld out of range 1..%lld (dimension %d)", what, desc,
                 (long long)e->fault_index, size, e->fault_dim + 1);
}

/* FNV-1a over the 8 bytes of v (fields one at a time: no padding bytes) */
static uint64_t fp_mix(uint64_t h, uint64_t v) {
  for (int b = 0; b < 8; b++, v >>= 8) h = (h ^ (v & 0xff)) * 0x100000001b3ULL;
  return h;
}

uint64_t fa_expr_fingerprint(const fa_expr *e) {
  if (!e) return 0;
  uint64_t h = fp_mix(0xcbf29ce484222325ULL, (uint64_t)e->n);
  for (int i = 0; i < e->n; i++) {
    const fa_expr_node *x = &e->nodes[i];
    uint64_t cbits;
    memcpy(&cbits, &x->c, sizeof cbits);
    h = fp_mix(h, x->op), h = fp_mix(h, x->is_bool), h = fp_mix(h, x->tensor), h = fp_mix(h, x->ndim);
    for (int j = 0; j < 4; j++) h = fp_mix(h, (uint32_t)x->a[j]);
    h = fp_mix(h, cbits);
  }
  /* which tensors the loads read: two traces of one text that captured
   * different tensors (a document mask over another batch's ids) are two
   * masks, and a block mask made from one must not skip the other's tiles.
   * Their identity (memory, dtype, shape, strides), not their values: the
   * same closure traced again gives the same fingerprint. */
  h = fp_mix(h, (uint64_t)e->ntensors);
  for (int t = 0; t < e->ntensors; t++) {
    const fa_tensor *x = e->tensors[t];
    h = fp_mix(h, (uint64_t)(uintptr_t)x->storage->data), h = fp_mix(h, (uint64_t)x->offset);
    h = fp_mix(h, (uint64_t)x->dtype), h = fp_mix(h, (uint64_t)x->ndim);
    for (int d = 0; d < x->ndim; d++) h = fp_mix(h, (uint64_t)x->shape[d]), h = fp_mix(h, (uint64_t)x->strides[d]);
  }
  return h;
}
