/* Attention variants (API §9): the expression a traced score_mod or
 * mask_mod built, as the engine holds and evaluates it.
 *
 * An expression is a list of nodes in dependency order (every operand is
 * an earlier node), so that evaluating the nodes in order, each into its
 * own slot of a small value array, evaluates the whole: one flat loop, no
 * recursion, no allocation per call.  The last node is the result.
 *
 * Positions b, h, q, k are the 1-based numbering the script saw (the
 * evaluator takes the kernels' 0-based ones and adds 1); s is the score
 * after the scale (score_mod) and 0 in a mask_mod.  Values are f64;
 * booleans are 0 and 1.
 *
 * A tensor element whose index falls outside the tensor is NaN, and when
 * that value reaches the result the expression records a fault (the first
 * one: which read, which index); the call that evaluated it then fails
 * with a message naming the read (fa_expr_fault).  A value that an
 * fa.where discards does not fault. */
#ifndef FA_EXPR_H
#define FA_EXPR_H

#include "internal.h"

#include <string.h>

#define FA_EXPR_MAX_NODES 4096
#define FA_EXPR_MAX_TENSORS 16
/* Below 2^63 (9.22e18): the magnitude up to which a traced integer, or a
 * read's index, is taken as an int64 (the CPU's evaluator, the generated
 * CUDA code and its type inference alike). */
#define FA_EXPR_INT64_SAFE 9.0e18

typedef enum {
  FA_X_CONST = 0, /* c */
  FA_X_S, FA_X_B, FA_X_H, FA_X_Q, FA_X_K,
  FA_X_ADD, FA_X_SUB, FA_X_MUL, FA_X_DIV, FA_X_MOD, FA_X_POW, /* a op b, as Lua's float operators */
  FA_X_NEG, FA_X_ABS, FA_X_EXP, FA_X_LOG, FA_X_TANH, FA_X_SQRT, FA_X_FLOOR,
  FA_X_MIN, FA_X_MAX,
  FA_X_LT, FA_X_LE, FA_X_GT, FA_X_GE, FA_X_EQ, FA_X_NE, /* booleans */
  FA_X_AND, FA_X_OR, FA_X_NOT,
  FA_X_WHERE, /* a ? b : c */
  FA_X_LOAD,  /* tensors[tensor][a[0]]...[a[ndim-1]] (1-based indices, rounded down) */
  FA_X_COUNT
} fa_expr_op;

/* The kinds an operation takes and gives, checked alike by the Lua tracer
 * (lua/ltrace.c) and the C builder (src/expr_builder.c): arity 1 or 2 for
 * the operations a script or host applies (0 for the others); want: the
 * operands are numbers (0), booleans (1), or either, both of one kind (2);
 * result: a number (0) or a boolean (1).  name: the builder's. */
typedef struct {
  const char *name;
  int8_t arity, want, result;
} fa_expr_rule;
static inline const fa_expr_rule *fa_expr_rule_of(int op) {
  static const fa_expr_rule rules[FA_X_COUNT] = { /* in fa_expr_op's order (C++ includes this too) */
      {NULL, 0, 0, 0},    {NULL, 0, 0, 0},      {NULL, 0, 0, 0},     {NULL, 0, 0, 0},    {NULL, 0, 0, 0},
      {NULL, 0, 0, 0},    /* CONST S B H Q K */ {"+", 2, 0, 0},      {"-", 2, 0, 0},     {"*", 2, 0, 0},
      {"/", 2, 0, 0},     {"%", 2, 0, 0},       {"^", 2, 0, 0},      {"neg", 1, 0, 0},   {"abs", 1, 0, 0},
      {"exp", 1, 0, 0},   {"log", 1, 0, 0},     {"tanh", 1, 0, 0},   {"sqrt", 1, 0, 0},  {"floor", 1, 0, 0},
      {"min", 2, 0, 0},   {"max", 2, 0, 0},     {"lt", 2, 0, 1},     {"le", 2, 0, 1},    {"gt", 2, 0, 1},
      {"ge", 2, 0, 1},    {"eq", 2, 2, 1},      {"ne", 2, 2, 1},     {"and", 2, 1, 1},   {"or", 2, 1, 1},
      {"not", 1, 1, 1},   {NULL, 0, 0, 0},      {NULL, 0, 0, 0} /* WHERE LOAD */};
  return op >= 0 && op < FA_X_COUNT ? &rules[op] : NULL;
}

struct fa_expr_node {
  uint8_t op;
  uint8_t is_bool; /* the value is a boolean (0/1) */
  uint8_t tensor;  /* FA_X_LOAD: which captured tensor */
  uint8_t ndim;    /* FA_X_LOAD: indices in a[] */
  int32_t a[4];    /* operands: indices of earlier nodes */
  double c;        /* FA_X_CONST */
};

/* Fills node x (its other fields zero): the tracer's and the builder's one way to make a node. */
static inline void fa_expr_node_set(fa_expr_node *x, int op, int is_bool, int a0, int a1, int a2, double c) {
  memset(x, 0, sizeof *x);
  x->op = (uint8_t)op, x->is_bool = (uint8_t)is_bool;
  x->a[0] = a0, x->a[1] = a1, x->a[2] = a2;
  x->c = c;
}

struct fa_expr {
  int n;                 /* nodes; the last is the result */
  fa_expr_node *nodes;
  int ntensors;
  fa_tensor *tensors[FA_EXPR_MAX_TENSORS]; /* as captured (retained): their devices are checked */
  fa_tensor *host[FA_EXPR_MAX_TENSORS];    /* what the CPU evaluator reads: the same, or a host copy made on demand (fa_expr_begin) */
  char names[FA_EXPR_MAX_TENSORS][32];     /* for messages: the upvalue's name, or "tensor #i" */
  /* the first fault (see above): set once per evaluation run */
  fa_atomic_int fault;
  int32_t fault_node, fault_dim;
  int64_t fault_index;
  size_t bytes; /* of nodes, for fa_host_free */
};

/* fa_expr_new, fa_expr_free and fa_expr_eval are declared in flashattn.h
 * (exported for the Lua binding, which includes this header for the node
 * layout).  fa_expr_new copies the n nodes and retains the captured
 * tensors; those not on the CPU are copied there for the evaluator when a
 * call first evaluates on the CPU (fa_expr_begin; fa_expr_eval itself).
 * names may be NULL.  The nodes must be in
 * dependency order (checked). */

/* fa_block_mask (flashattn.h): state[((b·H + h)·nq + qi)·nk + ki]. */
struct fa_block_mask {
  int64_t B, H, Lq, Lk, Br, Bc, nq, nk;
  uint64_t expr; /* fa_expr_fingerprint of the mask_mod it was made from */
  int64_t counts[3];
  uint8_t *state;
  size_t bytes;
  /* cuda: the tiles as the kernels of one tile {dev_br, dev_bc} read them
   * (kernels/attention/attention_variant.cu: made from state on first use,
   * on device dev_device; freed with the mask) */
  void *dev_spans;
  size_t dev_bytes;
  int dev_br, dev_bc, dev_device;
};

/* The block mask's verdict on keys [j0, j0 + n) (n <= Bc) of query tile qi:
 * FA_BLOCK_EMPTY or FA_BLOCK_FULL when every key tile they touch is, else
 * FA_BLOCK_PARTIAL. */
static inline int fa_block_mask_span(const fa_block_mask *m, int64_t b, int64_t h, int64_t qi, int64_t j0,
                                     int64_t n) {
  const uint8_t *row = m->state + ((b * m->H + h) * m->nq + qi) * m->nk;
  const int first = row[j0 / m->Bc], last = row[(j0 + n - 1) / m->Bc];
  return first == last ? first : FA_BLOCK_PARTIAL;
}

/* out[j] = the value at key k0 + j (0-based) for s[j] (s NULL: 0), j < n,
 * evaluated a chunk of keys at a time.  A fault is recorded only for keys
 * whose active[j] is nonzero (active NULL: all); the others may hold
 * anything.  fa_expr_eval is this with n = 1. */
void fa_expr_eval_row(const fa_expr *e, const double *s, int64_t b, int64_t h, int64_t q, int64_t k0, int64_t n,
                      const uint8_t *active, double *out);

/* fa_expr_eval_row, and in dout[j] the derivative of the value by s at
 * key k0 + j (the backward's chain rule through a score_mod). */
void fa_expr_eval_row_grad(const fa_expr *e, const double *s, int64_t b, int64_t h, int64_t q, int64_t k0, int64_t n,
                           const uint8_t *active, double *out, double *dout);

/* The operands of node x (earlier nodes: x->a[0..]). */
int fa_expr_operands(const fa_expr_node *x);
/* fa_expr_eval without making host copies: for the CPU evaluators, after
 * fa_expr_begin made them. */
double fa_expr_value(const fa_expr *e, double s, int64_t b, int64_t h, int64_t q, int64_t k);
/* Records a fault found elsewhere (the run-time compiled kernels on cuda:
 * read node `node`, its dimension dim, the index as record_fault codes
 * it), unless one is recorded already. */
void fa_expr_set_fault(const fa_expr *e, int node, int dim, int64_t index);
/* Before a call evaluates score_mod and mask_mod (either may be NULL):
 * their fault records cleared and, where the CPU evaluates them (host),
 * the host copies of their device tensors made (once an expression). */
fa_status fa_expr_begin(fa_context *ctx, const fa_expr *score_mod, const fa_expr *mask_mod, int host);
/* After it: FA_OK, or the first fault as fa_expr_fault gives it (mask_mod's first). */
fa_status fa_expr_end(fa_context *ctx, const fa_expr *score_mod, const fa_expr *mask_mod);
/* Clears the fault record (before a call evaluates e). */
void fa_expr_clear_fault(const fa_expr *e);
/* FA_OK, or the fault as an FA_ERR_ARGUMENT error naming `what`
 * ("opts.score_mod"), the read and the index. */
fa_status fa_expr_fault(fa_context *ctx, const fa_expr *e, const char *what);

/* dep[i] (e->n entries): whether node i depends on s through a number
 * (booleans, floor and reads carry no derivative).  The others'
 * derivatives are 0 exactly, so that a term such as d(sqrt(x))·... of an
 * x free of s is 0 and not 0/0: the CPU's forward mode (expr.c) and the
 * kernels' generated score_grad (variant_codegen.c) both follow it. */
void fa_expr_grad_deps(const fa_expr *e, uint8_t *dep);

/* mask_mod (an expression of booleans) over the tile of rows q0..q1 and
 * keys k0..k1 (0-based, inclusive) of (b, h) as a whole, where interval
 * arithmetic can tell (expr_tile.c): FA_BLOCK_EMPTY (no pair attends),
 * FA_BLOCK_FULL (every pair does), or 2 (it cannot tell: the pairs
 * decide, and record any read out of range).  After fa_expr_begin(host). */
int fa_expr_tile(const fa_expr *e, int64_t b, int64_t h, int64_t q0, int64_t q1, int64_t k0, int64_t k1);

/* Whether mask_mod (no captured tensors, no block mask in *in) is an AND of bounds on q − k
 * that the options' window and causal rule express for Lq query and Lk key
 * positions (expr_window.c): then 1 and *out = *in without mask_mod, its
 * window (and causal) narrowed to the same keys; else 0. */
int fa_expr_mask_as_range(const fa_expr *mask_mod, int64_t Lq, int64_t Lk, const fa_attention_opts *in,
                          fa_attention_opts *out);

/* Whether score_mod is s plus a multiple c of slopes[h]·|q − k| (slopes a
 * 1-D float tensor captured on `device`, at least Hq long), with Lq = Lk
 * and no opts.alibi or softcap in *in (expr_alibi.c): then *converted = 1,
 * *out = *in without score_mod and with opts.alibi = −c·slopes, Hq of
 * them, in *slopes (a new f64 tensor on `device`, which the caller
 * releases after the call: out->alibi points into it).  Else *converted =
 * 0.  FA_OK unless making the slopes failed. */
fa_status fa_expr_score_as_alibi(fa_context *ctx, const fa_expr *score_mod, int64_t Hq, int64_t Lq, int64_t Lk,
                                 fa_device device, const fa_attention_opts *in, fa_attention_opts *out,
                                 fa_tensor **slopes, int *converted);

/* Writes a readable form of node i (at most n bytes, cut with "...") into buf. */
const char *fa_expr_describe(const fa_expr *e, int i, char *buf, size_t n);

/* A 64-bit fingerprint of e's nodes (operations, operands, constants' bits,
 * which captured tensor each load reads) and of the captured tensors'
 * identities (memory, dtype, shape, strides), not of their values: equal
 * for two traces of one function. */
uint64_t fa_expr_fingerprint(const fa_expr *e);

#endif
