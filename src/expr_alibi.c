/* A score_mod that is the built-in ALiBi rule in disguise (API §9): the score
 * plus a multiple of slopes[h] · |q − k|, e.g. `s - slopes[h] * (q - k):abs()`.
 * Compiled, it costs the kernels the expression's work a score and keeps
 * them off the built-in rule's fastest instances; as opts.alibi (slopes
 * −c·slopes[h]) it is the rule of §2, whose distance |i + Lk − Lq − j| is
 * |q − k| when Lq = Lk.  The slopes are made on the call's device from the
 * captured tensor, on its stream, so the call stays asynchronous and new
 * values in the tensor are read as the expression would read them.  The
 * reference never converts. */
#include "check.h"
#include "expr.h"

#include <math.h>

#define MAX_TERMS 8

typedef struct {
  int node;
  double sign;
} term;

/* The terms of node i's sum (+, -, unary minus), at most MAX_TERMS. */
static int terms_of(const fa_expr *e, int i, double sign, term *t, int n, int *work) {
  const fa_expr_node *x = &e->nodes[i];
  if (n < 0 || --*work < 0) return -1;
  if (x->op == FA_X_ADD || x->op == FA_X_SUB) {
    n = terms_of(e, x->a[0], sign, t, n, work);
    return terms_of(e, x->a[1], x->op == FA_X_SUB ? -sign : sign, t, n, work);
  }
  if (x->op == FA_X_NEG) return terms_of(e, x->a[0], -sign, t, n, work);
  if (n >= MAX_TERMS) return -1;
  t[n].node = i, t[n].sign = sign;
  return n + 1;
}

/* A product of constants (coef), one read slopes[h] (load: its node) and
 * one |q − k| (dist: its node). */
typedef struct {
  double coef;
  int load, dist;
} alibi_term;

/* q − k or k − q */
static int is_distance(const fa_expr *e, int i) {
  const fa_expr_node *x = &e->nodes[i];
  if (x->op != FA_X_SUB) return 0;
  const int a = e->nodes[x->a[0]].op, b = e->nodes[x->a[1]].op;
  return (a == FA_X_Q && b == FA_X_K) || (a == FA_X_K && b == FA_X_Q);
}

static int product_of(const fa_expr *e, int i, alibi_term *a, int *work) {
  const fa_expr_node *x = &e->nodes[i];
  if (--*work < 0) return 0;
  switch (x->op) {
  case FA_X_MUL: return product_of(e, x->a[0], a, work) && product_of(e, x->a[1], a, work);
  case FA_X_NEG: a->coef = -a->coef; return product_of(e, x->a[0], a, work);
  case FA_X_CONST:
    if (x->is_bool || !isfinite(x->c)) return 0;
    a->coef *= x->c;
    return 1;
  case FA_X_LOAD:
    if (a->load >= 0 || x->ndim != 1 || x->is_bool || e->nodes[x->a[0]].op != FA_X_H) return 0;
    a->load = i;
    return 1;
  case FA_X_ABS:
    if (a->dist >= 0 || !is_distance(e, x->a[0])) return 0;
    a->dist = i;
    return 1;
  default: return 0;
  }
}

fa_status fa_expr_score_as_alibi(fa_context *ctx, const fa_expr *score_mod, int64_t Hq, int64_t Lq, int64_t Lk,
                                 fa_device device, const fa_attention_opts *in, fa_attention_opts *out,
                                 fa_tensor **slopes, int *converted) {
  *converted = 0, *slopes = NULL;
  if (!score_mod || score_mod->n < 1 || Lq != Lk || in->alibi || in->softcap > 0) return FA_OK;
  term t[MAX_TERMS];
  int work = 512; /* node visits: a node reused many times over (a DAG) is not walked exponentially */
  const int n = terms_of(score_mod, score_mod->n - 1, 1, t, 0, &work);
  if (n != 2) return FA_OK;
  double s_coef = 0;
  alibi_term a = {1, -1, -1};
  int found = 0;
  for (int j = 0; j < n; j++) {
    const fa_expr_node *x = &score_mod->nodes[t[j].node];
    if (x->op == FA_X_S) {
      s_coef += t[j].sign;
    } else if (!found && product_of(score_mod, t[j].node, &a, &work) && a.load >= 0 && a.dist >= 0) {
      a.coef *= t[j].sign;
      found = 1;
    } else {
      return FA_OK;
    }
  }
  if (!found || s_coef != 1 || !isfinite(a.coef) || a.coef == 0) return FA_OK;
  fa_tensor *src = score_mod->tensors[score_mod->nodes[a.load].tensor];
  /* reads past the tensor fault (an error the call must give): those stay expressions */
  if (!fa_is_float_dtype(src->dtype) || src->ndim != 1 || src->shape[0] < Hq || src->storage->device != device) return FA_OK;
  /* the bias c·slopes[h]·|d| is opts.alibi's −slope·|d|: slope = −c·slopes[h], dense f64 (the
   * tensor itself where it is one and c = −1, the usual form) */
  fa_tensor *f64 = NULL, *dense = NULL;
  fa_status st = fa_tensor_to(ctx, src, FA_F64, device, &f64);
  if (!st) st = fa_tensor_contiguous(ctx, f64, &dense);
  fa_tensor_release(f64);
  if (!st && a.coef == -1) *slopes = dense, dense = NULL;
  else if (!st) st = fa_tensor_binary(ctx, dense, FA_BIN_MUL, NULL, -a.coef, slopes);
  fa_tensor_release(dense);
  if (st) return st;
  *out = *in;
  out->score_mod = NULL;
  out->alibi = (const double *)fa_tensor_data(*slopes);
  out->n_alibi = Hq;
  *converted = 1;
  return FA_OK;
}
