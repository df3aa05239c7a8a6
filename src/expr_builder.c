/* Attention variants built from C (API §9 for hosts; docs/c-api.md): the
 * operations a traced score_mod / mask_mod records, one call a node, with
 * the tracer's kind rules (fa_expr_rule_of: numbers and booleans), into the
 * nodes fa_expr_new takes.  The first misuse is kept and every later call
 * returns -1, so that a host checks once, at fa_expr_build. */
#include "expr.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

struct fa_expr_builder {
  fa_context *ctx;
  int n, ntensors;
  fa_expr_node nodes[FA_EXPR_MAX_NODES];
  fa_tensor *tensors[FA_EXPR_MAX_TENSORS]; /* retained until fa_expr_builder_free */
  char names[FA_EXPR_MAX_TENSORS][32];
  char error[256]; /* the first misuse ("" none) */
};

fa_status fa_expr_builder_new(fa_context *ctx, fa_expr_builder **out) {
  FA_NEED(out);
  *out = NULL;
  fa_status st = FA_OK;
  fa_expr_builder *x = fa_host_alloc(ctx, sizeof *x, &st);
  if (!x) return st;
  memset(x, 0, sizeof *x);
  x->ctx = ctx;
  *out = x;
  return FA_OK;
}

void fa_expr_builder_free(fa_expr_builder *x) {
  if (!x) return;
  for (int i = 0; i < x->ntensors; i++) fa_tensor_release(x->tensors[i]);
  fa_host_free(x, sizeof *x);
}

/* Keeps the first misuse; -1. */
static int misuse(fa_expr_builder *x, const char *fn, const char *fmt, ...) {
  if (!x->error[0]) {
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(x->error, sizeof x->error, "flashattn: %s: %s", fn, msg);
  }
  return -1;
}

static int add(fa_expr_builder *x, const char *fn, int op, int is_bool, int a0, int a1, int a2, double c) {
  if (x->error[0]) return -1;
  if (x->n >= FA_EXPR_MAX_NODES)
    return misuse(x, fn, "the expression is too large (more than %d nodes)", FA_EXPR_MAX_NODES);
  fa_expr_node_set(&x->nodes[x->n], op, is_bool, a0, a1, a2, c);
  return x->n++;
}

/* Whether node i exists (an earlier call's result); a misuse if not. */
static int node_ok(fa_expr_builder *x, const char *fn, int i, const char *what) {
  if (x->error[0]) return 0;
  if (i >= 0 && i < x->n) return 1;
  misuse(x, fn, "%s is %d, not a node of this builder (0 to %d)", what, i, x->n - 1);
  return 0;
}

static const char *kind(int is_bool) { return is_bool ? "a boolean" : "a number"; }

int fa_expr_number(fa_expr_builder *x, double c) { return x ? add(x, "fa_expr_number", FA_X_CONST, 0, 0, 0, 0, c) : -1; }

int fa_expr_boolean(fa_expr_builder *x, int c) {
  return x ? add(x, "fa_expr_boolean", FA_X_CONST, 1, 0, 0, 0, c != 0) : -1;
}

int fa_expr_arg(fa_expr_builder *x, const char *name) {
  static const char *const args[] = {"s", "b", "h", "q", "k"};
  if (!x) return -1;
  for (int i = 0; name && i < 5; i++)
    if (strcmp(name, args[i]) == 0) return add(x, "fa_expr_arg", FA_X_S + i, 0, 0, 0, 0, 0);
  return misuse(x, "fa_expr_arg", "unknown argument %s%s%s (expected \"s\", \"b\", \"h\", \"q\" or \"k\")",
                name ? "\"" : "", name ? name : "NULL", name ? "\"" : "");
}

int fa_expr_apply(fa_expr_builder *x, const char *op, int a, int b) {
  const char *fn = "fa_expr_apply";
  if (!x || x->error[0]) return -1;
  int code = -1;
  for (int i = 0; op && i < FA_X_COUNT && code < 0; i++) {
    const fa_expr_rule *r = fa_expr_rule_of(i);
    if (r->arity && strcmp(op, r->name) == 0) code = i;
  }
  if (code < 0)
    return misuse(x, fn, "unknown operation %s (expected + - * / %% ^ min max lt le gt ge eq ne and or, or "
                         "neg abs exp log tanh sqrt floor not)", op ? op : "NULL");
  const fa_expr_rule *r = fa_expr_rule_of(code);
  if (!node_ok(x, fn, a, "its first operand") || (r->arity == 2 && !node_ok(x, fn, b, "its second operand")))
    return -1;
  const int ka = x->nodes[a].is_bool, kb = r->arity == 2 ? x->nodes[b].is_bool : ka;
  if (r->want == 2 && ka != kb) return misuse(x, fn, "%s compares %s with %s", op, kind(ka), kind(kb));
  if (r->want != 2 && (ka != r->want || kb != r->want))
    return misuse(x, fn, "%s needs %s, got %s", op, r->want ? "booleans" : "numbers", kind(ka != r->want ? ka : kb));
  return add(x, fn, code, r->result, a, r->arity == 2 ? b : 0, 0, 0);
}

int fa_expr_where(fa_expr_builder *x, int c, int a, int b) {
  const char *fn = "fa_expr_where";
  if (!x || !node_ok(x, fn, c, "its condition") || !node_ok(x, fn, a, "its second argument") ||
      !node_ok(x, fn, b, "its third argument"))
    return -1;
  if (!x->nodes[c].is_bool) return misuse(x, fn, "the condition is a number, expected a boolean");
  if (x->nodes[a].is_bool != x->nodes[b].is_bool)
    return misuse(x, fn, "it chooses between %s and %s (expected two of one kind)", kind(x->nodes[a].is_bool),
                  kind(x->nodes[b].is_bool));
  return add(x, fn, FA_X_WHERE, x->nodes[a].is_bool, c, a, b, 0);
}

int fa_expr_load(fa_expr_builder *x, fa_tensor *t, const char *name, int nidx, const int *idx) {
  const char *fn = "fa_expr_load";
  if (!x || x->error[0]) return -1;
  if (!t) return misuse(x, fn, "the tensor is NULL");
  if (t->ndim < 1 || t->ndim > 4) return misuse(x, fn, "a %d-D tensor (expected 1-D to 4-D)", (int)t->ndim);
  if (nidx != t->ndim || !idx)
    return misuse(x, fn, "%d indices for a %d-D tensor (index every dimension)", idx ? nidx : 0, (int)t->ndim);
  for (int d = 0; d < nidx; d++) {
    if (!node_ok(x, fn, idx[d], "an index")) return -1;
    if (x->nodes[idx[d]].is_bool) return misuse(x, fn, "index %d is a boolean, expected a number", d + 1);
  }
  int slot = 0;
  while (slot < x->ntensors && x->tensors[slot] != t) slot++;
  if (slot == x->ntensors) {
    if (slot >= FA_EXPR_MAX_TENSORS) return misuse(x, fn, "more than %d tensors", FA_EXPR_MAX_TENSORS);
    fa_tensor_retain(t);
    x->tensors[slot] = t;
    snprintf(x->names[slot], sizeof x->names[slot], "%s", name ? name : "");
    x->ntensors++;
  }
  const int i = add(x, fn, FA_X_LOAD, t->dtype == FA_BOOL, idx[0], nidx > 1 ? idx[1] : 0, nidx > 2 ? idx[2] : 0, 0);
  if (i < 0) return -1;
  x->nodes[i].a[3] = nidx > 3 ? idx[3] : 0;
  x->nodes[i].tensor = (uint8_t)slot, x->nodes[i].ndim = (uint8_t)nidx;
  return i;
}

fa_status fa_expr_build(fa_expr_builder *x, int result, fa_expr **out) {
  fa_context *ctx = x ? x->ctx : NULL;
  FA_NEED(out);
  *out = NULL;
  FA_NEED(x);
  if (x->error[0]) return fa_fail(ctx, FA_ERR_ARGUMENT, "%s", x->error);
  if (result < 0 || result >= x->n)
    return fa_fail(ctx, FA_ERR_ARGUMENT, "flashattn: fa_expr_build: the result is %d, not a node of this builder%s",
                   result, x->n ? "" : " (it has none)");
  const char *names[FA_EXPR_MAX_TENSORS];
  for (int i = 0; i < x->ntensors; i++) names[i] = x->names[i][0] ? x->names[i] : NULL;
  /* the nodes up to the result: the later ones are not its operands */
  return fa_expr_new(ctx, x->nodes, result + 1, x->tensors, names, x->ntensors, out);
}
