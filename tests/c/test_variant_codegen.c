/* The CUDA C that src/variant_codegen.c makes from traced expressions (API
 * §9), checked without a GPU: each case's code is compiled by the host's
 * C++ compiler (the code is plain C++ once __device__ and the few CUDA
 * intrinsics it names are defined, below) with the captured tensors'
 * values written into the program, run over a grid of positions, and its
 * values and faults compared with the CPU's evaluator (fa_expr_eval, f64).
 * Also: which reads the range analysis leaves unchecked, and the 64-bit
 * positions past 2^24.
 *
 * Usage: test_variant_codegen CXX INCLUDE_DIR WORK_DIR (CTest passes them). */
#include "expr.h"
#include "testutil.h"
#include "variant_codegen.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *cxx, *include_dir, *work;
static fa_variant_consts scratch; /* the numbers of the cases that look at the text alone */

/* ---- building expressions ---- */
typedef struct {
  fa_expr_node n[64];
  int count;
} nodes;
static int node(nodes *x, int op, int a0, int a1, int a2, int is_bool) {
  fa_expr_node *e = &x->n[x->count];
  memset(e, 0, sizeof *e);
  e->op = (uint8_t)op, e->a[0] = a0, e->a[1] = a1, e->a[2] = a2, e->is_bool = (uint8_t)is_bool;
  return x->count++;
}
static int cst(nodes *x, double c) {
  const int i = node(x, FA_X_CONST, 0, 0, 0, 0);
  x->n[i].c = c;
  return i;
}
static int load(nodes *x, int tensor, int ndim, int i0, int i1, int is_bool) {
  const int i = node(x, FA_X_LOAD, i0, i1, 0, is_bool);
  x->n[i].tensor = (uint8_t)tensor, x->n[i].ndim = (uint8_t)ndim;
  return i;
}
#define N2(x, op, a, b) node(x, op, a, b, 0, 0)
#define B2(x, op, a, b) node(x, op, a, b, 0, 1)
#define N1(x, op, a) node(x, op, a, 0, 0, 0)

/* ---- the host program ---- */
static void write_tensor(FILE *f, int slot, const fa_tensor *t) {
  const int64_t n = fa_tensor_numel(t);
  const int es = (int)fa_dtype_size(t->dtype);
  const unsigned char *p = (const unsigned char *)fa_tensor_ptr(t);
  fprintf(f, "static const unsigned char tensor%d[] = {", slot);
  for (int64_t i = 0; i < n * es; i++) fprintf(f, "%d,", p[i]);
  fprintf(f, "0};\n");
}

/* Runs the generated code of score (is_mask 0) or mask e at every point of
 * the grid; values[i] and faults[i] per point (b, h, q, k, s outer to
 * inner, as check() walks them). */
#define MAX_TILES 100000
typedef struct {
  int verdict, has;
} tile_verdict;
static tile_verdict tiles[MAX_TILES];

static int run_host(const char *code, const fa_variant_consts *consts, const fa_expr *e, int is_mask,
                    const int64_t *bounds, const int64_t *ks, int nk, double *values, int *faults, double *again,
                    double *grads, int npoints, int *tiles_read) {
  char src[512], exe[512], cmd[2048];
  snprintf(src, sizeof src, "%s/variant_host.cpp", work);
  snprintf(exe, sizeof exe, "%s/variant_host", work);
  FILE *f = fopen(src, "w");
  if (!f) return 0;
  fprintf(f, "#include <math.h>\n#include <stdio.h>\n#include <string.h>\n"
             "#define __device__\n#define __host__\n#define __forceinline__ inline\n"
             "static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }\n"
             /* the unit's one-SFU tanh (common.cuh's tanh_as, PTX): tanhf stands for it here */
             "static inline float fa_variant_tanh_fast(float x) { return tanhf(x); }\n"
             "static inline unsigned long long atomicCAS(unsigned long long *p, unsigned long long c, unsigned long long v)"
             " { unsigned long long o = *p; if (o == c) *p = v; return o; }\n"
             "struct __half { unsigned short x; };\nstruct __nv_bfloat16 { unsigned short x; };\n"
             "static inline float __bfloat162float(__nv_bfloat16 h) { return __int_as_float((int)h.x << 16); }\n"
             "static inline float __half2float(__half h) {\n"
             "  const int s = (h.x >> 15) & 1, ex = (h.x >> 10) & 31, m = h.x & 1023;\n"
             "  const float v = ex == 0 ? ldexpf((float)m, -24) : ex == 31 ? (m ? NAN : INFINITY)"
             " : ldexpf((float)(m | 1024), ex - 25);\n  return s ? -v : v;\n}\n"
             "#include \"attention_variant_args.cuh\"\n%s", code);
  for (int t = 0; t < e->ntensors; t++) write_tensor(f, t, e->tensors[t]);
  fprintf(f, "int main(void) {\n  static fa_variant_args a;\n  static long long rec[2][64];\n"
             "  memset(rec, 0xff, sizeof rec);\n  a.fault[0] = rec[0], a.fault[1] = rec[1];\n");
  /* the numbers the code reads from the arguments, as the launch passes them (exactly: hex floats) */
  for (int i = 0; i < consts->ni; i++) fprintf(f, "  a.ci[%d] = %lldLL;\n", i, consts->i[i]);
  for (int i = 0; i < consts->nf; i++) fprintf(f, "  a.cf[%d] = %af;\n", i, (double)consts->f[i]);
  /* one expression a program: its tensors take the slots from 0, as the
   * first (or only) expression of a unit does */
  for (int t = 0; t < e->ntensors; t++) {
    const fa_tensor *x = e->tensors[t];
    fprintf(f, "  a.ptr[%d] = tensor%d;\n", t, t);
    for (int d = 0; d < 4; d++)
      fprintf(f, "  a.shape[%d][%d] = %lld, a.stride[%d][%d] = %lld;\n", t, d,
              (long long)(d < x->ndim ? x->shape[d] : 1), t, d, (long long)(d < x->ndim ? x->strides[d] : 0));
  }
  fprintf(f, "  const long long ks[] = {");
  for (int i = 0; i < nk; i++) fprintf(f, "%lldLL,", (long long)ks[i]);
  fprintf(f, "};\n  const float ss[] = {-1.5f, 0.25f, 3.f};\n");
  fprintf(f, "  for (long long b = 0; b < %lld; b++) for (long long h = 0; h < %lld; h++)\n"
             "  for (long long q = 0; q < %lld; q++) for (int ki = 0; ki < %d; ki++) for (int si = 0; si < 3; si++) {\n"
             "    const long long k = ks[ki];\n    int fault = -1;\n",
          (long long)bounds[0], (long long)bounds[1], (long long)bounds[2], nk);
  fprintf(f, "    const double v = %s(a, ss[si], b, h, q, k, (float)b, (float)h, (float)q, (float)k, fault);\n",
          is_mask ? "(double)fa_variant::mask" : "(double)fa_variant::score");
  /* score_grad: the same value, and the derivative by s */
  if (is_mask) fprintf(f, "    const double g = 0, w = v;\n");
  else
    fprintf(f, "    int fault2 = -1;\n    float ds = 0.f;\n"
               "    const double w = fa_variant::score_grad(a, ss[si], b, h, q, k, (float)b, (float)h, (float)q, (float)k,"
               " fault2, ds), g = ds;\n    (void)fault2;\n");
  fprintf(f, "    printf(\"%%.9g %%d %%.9g %%.9g\\n\", v, fault, w, g);\n  }\n");
  if (is_mask) /* tile verdicts: every (q0, k0) with spans of 1, 2, 5 and all, b = h = 0 */
    fprintf(f, "  const long long sp[] = {1, 2, 5, 1LL << 40};\n"
               "  for (long long q0 = 0; q0 < %lld; q0++) for (int a1 = 0; a1 < 4; a1++)\n"
               "  for (long long k0 = 0; k0 < %lld; k0++) for (int a2 = 0; a2 < 4; a2++) {\n"
               "    const long long q1 = q0 + sp[a1] < %lld ? q0 + sp[a1] - 1 : %lld - 1;\n"
               "    const long long k1 = k0 + sp[a2] < %lld ? k0 + sp[a2] - 1 : %lld - 1;\n"
               "    printf(\"%%d %%d\\n\", fa_variant::tile(a, 0, 0, q0, q1, k0, k1), (int)fa_variant::has_tile);\n  }\n",
            (long long)bounds[2], (long long)ks[nk - 1] + 1, (long long)bounds[2], (long long)bounds[2],
            (long long)ks[nk - 1] + 1, (long long)ks[nk - 1] + 1);
  fprintf(f, "  return 0;\n}\n");
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s -std=c++17 -O1 -w -I%s %s -o %s -lm", cxx, include_dir, src, exe);
  if (system(cmd) != 0) {
    fprintf(stderr, "the generated code did not compile on the host:\n%s\n", code);
    return 0;
  }
  FILE *p = popen(exe, "r");
  if (!p) return 0;
  int i = 0;
  while (i < npoints && fscanf(p, "%lf %d %lf %lf", &values[i], &faults[i], &again[i], &grads[i]) == 4) i++;
  int ntiles = 0; /* a mask's tile verdicts after its points, checked against its own points' values */
  while (is_mask && fscanf(p, "%d %d", &tiles[ntiles].verdict, &tiles[ntiles].has) == 2 && ntiles < MAX_TILES) ntiles++;
  pclose(p);
  *tiles_read = ntiles;
  return i == npoints;
}

/* One case: e as score_mod (is_mask 0) or mask_mod over bounds {B, H, Lq,
 * Lk}, its keys ks; the host program's values against the CPU's, within
 * rel of them (booleans and integers exactly), and the same points faulting. */
static void check(const char *name, const fa_expr *e, int is_mask, const int64_t *bounds, const int64_t *ks, int nk,
                  double rel) {
  int reads[2];
  fa_variant_consts consts;
  char *code = fa_variant_source(is_mask ? NULL : e, is_mask ? e : NULL, bounds, reads, &consts);
  CHECK(code != NULL, "%s: no source", name);
  CHECK(reads[is_mask] == fa_variant_unsafe_reads(e, bounds, -1) && reads[!is_mask] == 0, "%s: checked reads %d",
        name, reads[is_mask]);
  if (!code) return;
  const int npoints = (int)(bounds[0] * bounds[1] * bounds[2] * nk * 3);
  double *values = calloc((size_t)npoints, sizeof *values);
  int *faults = calloc((size_t)npoints, sizeof *faults);
  double *again = calloc((size_t)npoints, sizeof *again), *grads = calloc((size_t)npoints, sizeof *grads);
  int ntiles = 0;
  const int ran = values && faults && again && grads &&
                  run_host(code, &consts, e, is_mask, bounds, ks, nk, values, faults, again, grads, npoints, &ntiles);
  CHECK(ran, "%s: the host program did not run", name);
  const double ss[] = {-1.5, 0.25, 3.0};
  int i = 0, bad = 0;
  CHECK(fa_expr_begin(NULL, NULL, e, 1) == FA_OK, "%s: host copies", name);
  for (int64_t b = 0; ran && b < bounds[0]; b++)
    for (int64_t h = 0; h < bounds[1]; h++)
      for (int64_t q = 0; q < bounds[2]; q++)
        for (int ki = 0; ki < nk; ki++)
          for (int si = 0; si < 3; si++, i++) {
            fa_expr_clear_fault(e);
            const double want = fa_expr_eval(e, is_mask ? 0 : ss[si], b, h, q, ks[ki]);
            const int want_fault = atomic_load(&((fa_expr *)e)->fault) ? e->fault_node : -1;
            const double got = values[i];
            double wv = 0, wg = 0; /* score_grad's value (the same as score's) and derivative, against the CPU's */
            const double sv = is_mask ? 0 : ss[si];
            if (!is_mask) fa_expr_eval_row_grad(e, &sv, b, h, q, ks[ki], 1, NULL, &wv, &wg);
            const int same_grad = is_mask || ((again[i] == got || (again[i] != again[i] && got != got)) &&
                                              ((wg != wg && grads[i] != grads[i]) || fabs(grads[i] - wg) <= fmax(rel, 1e-6) * fmax(1.0, fabs(wg)) ||
                                               want_fault >= 0 || want != want));
            if (!same_grad && bad++ < 5)
              fprintf(stderr, "%s at b=%lld h=%lld q=%lld k=%lld s=%g: score_grad %.9g, d/ds %.9g; CPU d/ds %.9g\n", name,
                      (long long)b, (long long)h, (long long)q, (long long)ks[ki], ss[si], again[i], grads[i], wg);
            const int same = (want != want && got != got) || got == want || (is_mask && want_fault >= 0) ||
                             fabs(got - want) <= rel * fmax(1.0, fabs(want));
            if ((!same || want_fault != faults[i]) && bad++ < 5)
              fprintf(stderr, "%s at b=%lld h=%lld q=%lld k=%lld s=%g: host code %.9g (fault %d), CPU %.9g (fault %d)\n",
                      name, (long long)b, (long long)h, (long long)q, (long long)ks[ki], ss[si], got, faults[i], want,
                      want_fault);
          }
  CHECK(bad == 0, "%s: %d points differ", name, bad);
  /* the tile verdicts: 1 (every pair attends) or 0 (none) only where the
   * CPU says so for every pair of the tile; 2 (cannot tell) anywhere */
  const long long Lq = bounds[2], Lk = ks[nk - 1] + 1, sp[4] = {1, 2, 5, 1LL << 40};
  int t = 0, decided = 0, wrong = 0, cpu_decided = 0, cpu_wrong = 0;
  for (long long q0 = 0; is_mask && ran && q0 < Lq; q0++)
    for (int a1 = 0; a1 < 4; a1++)
      for (long long k0 = 0; k0 < Lk; k0++)
        for (int a2 = 0; a2 < 4 && t < ntiles; a2++, t++) {
          const long long q1 = q0 + sp[a1] < Lq ? q0 + sp[a1] - 1 : Lq - 1, k1 = k0 + sp[a2] < Lk ? k0 + sp[a2] - 1 : Lk - 1;
          int any = 0, all = 1;
          for (long long q = q0; q <= q1; q++)
            for (long long k = k0; k <= k1; k++) {
              const int m = fa_expr_eval(e, 0, 0, 0, q, k) != 0;
              any |= m, all &= m;
            }
          const int v = tiles[t].verdict;
          decided += v != 2;
          if ((v == 1 && !all) || (v == 0 && any) || v < 0 || v > 2) wrong++;
          /* the CPU's own verdict (expr_tile.c), as sound */
          const int cv = fa_expr_tile(e, 0, 0, q0, q1, k0, k1);
          cpu_decided += cv != 2;
          if ((cv == FA_BLOCK_FULL && !all) || (cv == FA_BLOCK_EMPTY && any) || cv < 0 || cv > 2) cpu_wrong++;
        }
  CHECK(wrong == 0, "%s: %d tile verdicts wrong", name, wrong);
  CHECK(cpu_wrong == 0, "%s: %d of the CPU's tile verdicts wrong", name, cpu_wrong);
  if (is_mask && ntiles && tiles[0].has) CHECK(cpu_decided > ntiles / 4, "%s: the CPU decided only %d of %d tiles", name, cpu_decided, ntiles);
  if (is_mask && ntiles && tiles[0].has) CHECK(decided > ntiles / 4, "%s: only %d of %d tiles decided", name, decided, ntiles);
  free(values), free(faults), free(again), free(grads), free(code);
}

static fa_tensor *host_tensor(fa_context *ctx, fa_dtype dt, int ndim, const int64_t *shape, const double *v) {
  fa_tensor *t = NULL;
  if (fa_tensor_empty(ctx, ndim, shape, dt, FA_CPU, &t) != FA_OK) return NULL;
  int64_t n = 1;
  for (int d = 0; d < ndim; d++) n *= shape[d];
  for (int64_t i = 0; i < n; i++) fa_store_f64(dt, fa_tensor_ptr(t), i, v[i]);
  return t;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: test_variant_codegen CXX INCLUDE_DIR WORK_DIR\n");
    return 2;
  }
  cxx = argv[1], include_dir = argv[2], work = argv[3];
  fa_context *ctx = NULL;
  CHECK(fa_context_create(FA_CPU, &ctx) == FA_OK, "%s", "context");
  const double slope_v[4] = {0.5, 0.25, 0.125, 0.0625}, doc_v[6] = {1, 1, 2, 2, 2, 3};
  const double bias_v[12] = {0.5, -1, 2, 0.25, 3, -0.5, 1, 1.5, -2, 0.75, 0, 4};
  const int64_t s4[1] = {4}, s6[1] = {6}, s2x6[2] = {2, 6};
  fa_tensor *slopes = host_tensor(ctx, FA_F32, 1, s4, slope_v), *doc = host_tensor(ctx, FA_F16, 1, s6, doc_v);
  fa_tensor *bias = host_tensor(ctx, FA_BF16, 2, s2x6, bias_v), *flags = host_tensor(ctx, FA_BOOL, 1, s6, doc_v);
  CHECK(slopes && doc && bias && flags, "%s", "the captured tensors");
  const int64_t ks[6] = {0, 1, 2, 3, 4, 5};
  const int64_t bounds[4] = {2, 4, 6, 6};

  /* score_mod: every numeric operator, ALiBi's read, a 2-D bf16 read, fa.where */
  {
    nodes x = {0};
    const int s = node(&x, FA_X_S, 0, 0, 0, 0), b = node(&x, FA_X_B, 0, 0, 0, 0), h = node(&x, FA_X_H, 0, 0, 0, 0);
    const int q = node(&x, FA_X_Q, 0, 0, 0, 0), k = node(&x, FA_X_K, 0, 0, 0, 0);
    const int al = N2(&x, FA_X_MUL, load(&x, 0, 1, h, 0, 0), N1(&x, FA_X_ABS, N2(&x, FA_X_SUB, q, k)));
    int r = N2(&x, FA_X_SUB, s, al);
    r = N2(&x, FA_X_ADD, r, N2(&x, FA_X_MOD, N2(&x, FA_X_MUL, q, k), cst(&x, 4)));      /* integer % */
    r = N2(&x, FA_X_ADD, r, N2(&x, FA_X_MOD, N1(&x, FA_X_NEG, k), cst(&x, 3)));        /* sign of the divisor */
    r = N2(&x, FA_X_ADD, r, N2(&x, FA_X_POW, cst(&x, 2), N2(&x, FA_X_MOD, q, cst(&x, 3))));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_FLOOR, N2(&x, FA_X_DIV, k, cst(&x, 4))));
    r = N2(&x, FA_X_ADD, r, N2(&x, FA_X_MIN, q, cst(&x, 4)));
    r = N2(&x, FA_X_SUB, r, N2(&x, FA_X_MAX, s, cst(&x, 0.5)));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_TANH, N2(&x, FA_X_DIV, q, cst(&x, 5))));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_EXP, N2(&x, FA_X_DIV, N1(&x, FA_X_NEG, k), cst(&x, 10))));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_LOG, k));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_SQRT, N2(&x, FA_X_ADD, k, b)));
    r = N2(&x, FA_X_ADD, r, load(&x, 1, 2, b, q, 0)); /* bias[b][q]: bf16, 2-D */
    const int c = B2(&x, FA_X_GT, k, q);
    r = node(&x, FA_X_WHERE, c, N2(&x, FA_X_MUL, r, cst(&x, 0.5)), r, 0);
    fa_tensor *ts[2] = {slopes, bias};
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, ts, NULL, 2, &e) == FA_OK, "%s", fa_context_error(ctx));
    check("score_mod operators", e, 0, bounds, ks, 6, 2e-5);
    int64_t narrow[4] = {2, 4, 6, 6};
    CHECK(fa_variant_unsafe_reads(e, narrow, -1) == 0, "%s", "every read in range"); /* slopes[h]: h <= 4; bias[b][q]: b <= 2, q <= 6 */
    narrow[1] = 5;
    CHECK(fa_variant_unsafe_reads(e, narrow, -1) == 1, "%s", "slopes[h] checked"); /* h up to 5: slopes[h] checked */
    fa_expr_free(e);
  }
  /* score_mod's derivative by s (score_grad, the backward's chain rule) through every operator */
  {
    nodes x = {0};
    const int s = node(&x, FA_X_S, 0, 0, 0, 0), q = node(&x, FA_X_Q, 0, 0, 0, 0), k = node(&x, FA_X_K, 0, 0, 0, 0);
    const int s2 = N2(&x, FA_X_ADD, N2(&x, FA_X_MUL, s, s), cst(&x, 1)); /* s^2 + 1 */
    int r = N2(&x, FA_X_MUL, N1(&x, FA_X_TANH, N2(&x, FA_X_DIV, s, cst(&x, 3))), cst(&x, 3));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_EXP, N2(&x, FA_X_DIV, s, cst(&x, 10))));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_LOG, s2));
    r = N2(&x, FA_X_SUB, r, N1(&x, FA_X_SQRT, N2(&x, FA_X_ADD, s2, k)));
    r = N2(&x, FA_X_ADD, r, N2(&x, FA_X_POW, s2, cst(&x, 0.5)));
    r = N2(&x, FA_X_ADD, r, N2(&x, FA_X_POW, cst(&x, 2), N2(&x, FA_X_DIV, s, cst(&x, 4))));
    r = N2(&x, FA_X_ADD, r, N2(&x, FA_X_DIV, q, s2));                /* s in a denominator */
    r = N2(&x, FA_X_ADD, r, N2(&x, FA_X_MOD, s, cst(&x, 2)));
    r = N2(&x, FA_X_SUB, r, N2(&x, FA_X_MIN, s, N2(&x, FA_X_SUB, q, cst(&x, 2))));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_ABS, N2(&x, FA_X_SUB, s, cst(&x, 0.5))));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_NEG, N2(&x, FA_X_MUL, k, s)));
    r = N2(&x, FA_X_ADD, r, N1(&x, FA_X_FLOOR, s)); /* no derivative */
    r = node(&x, FA_X_WHERE, B2(&x, FA_X_GT, s, cst(&x, 0)), r, N2(&x, FA_X_MUL, r, cst(&x, 0.5)), 0);
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, NULL, NULL, 0, &e) == FA_OK, "%s", fa_context_error(ctx));
    check("score_mod derivatives", e, 0, bounds, ks, 6, 2e-5);
    fa_expr_free(e);
  }
  /* mask_mod: document (f16 ids), logic, a bool tensor, comparisons of mixed types */
  {
    nodes x = {0};
    const int q = node(&x, FA_X_Q, 0, 0, 0, 0), k = node(&x, FA_X_K, 0, 0, 0, 0);
    const int same = B2(&x, FA_X_EQ, load(&x, 0, 1, q, 0, 0), load(&x, 0, 1, k, 0, 0));
    const int causal = B2(&x, FA_X_GE, q, k);
    const int prefix = B2(&x, FA_X_LE, k, cst(&x, 2));
    const int flag = load(&x, 1, 1, k, 0, 1); /* flags[k], read as a boolean */
    const int half = B2(&x, FA_X_LT, N2(&x, FA_X_DIV, q, cst(&x, 2)), cst(&x, 2.5));
    int r = B2(&x, FA_X_OR, B2(&x, FA_X_AND, same, causal), prefix);
    r = B2(&x, FA_X_AND, r, node(&x, FA_X_NOT, B2(&x, FA_X_AND, flag, half), 0, 0, 1));
    r = B2(&x, FA_X_NE, r, B2(&x, FA_X_EQ, k, cst(&x, 5)));
    fa_tensor *ts[2] = {doc, flags};
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, ts, NULL, 2, &e) == FA_OK, "%s", fa_context_error(ctx));
    check("mask_mod document", e, 1, bounds, ks, 6, 0);
    fa_expr_free(e);
  }
  /* a mask_mod of positions alone: decided a tile at a time (fa_variant::tile) */
  {
    nodes x = {0};
    const int q = node(&x, FA_X_Q, 0, 0, 0, 0), k = node(&x, FA_X_K, 0, 0, 0, 0);
    const int d = N2(&x, FA_X_SUB, q, k);
    const int r1 = B2(&x, FA_X_AND, B2(&x, FA_X_GE, q, k), B2(&x, FA_X_LE, d, cst(&x, 2)));
    const int r2 = B2(&x, FA_X_LE, k, cst(&x, 1));
    const int r3 = node(&x, FA_X_WHERE, B2(&x, FA_X_GT, q, cst(&x, 6)), B2(&x, FA_X_LE, N1(&x, FA_X_ABS, d), cst(&x, 3)),
                        B2(&x, FA_X_LE, k, N2(&x, FA_X_MIN, q, cst(&x, 4))), 1);
    const int r4 = node(&x, FA_X_NOT, B2(&x, FA_X_EQ, N2(&x, FA_X_MOD, N2(&x, FA_X_MUL, k, cst(&x, 2)), cst(&x, 5)),
                                         cst(&x, 0)), 0, 0, 1);
    B2(&x, FA_X_AND, B2(&x, FA_X_OR, B2(&x, FA_X_OR, r1, r2), r3), r4);
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, NULL, NULL, 0, &e) == FA_OK, "%s", fa_context_error(ctx));
    const int64_t pb[4] = {1, 2, 12, 12}, pk[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    int reads[2];
    char *code = fa_variant_source(NULL, e, pb, reads, &scratch);
    CHECK(code && strstr(code, "has_tile = true") != NULL, "%s", "a tile function for positions alone");
    free(code);
    check("mask_mod of positions", e, 1, pb, pk, 12, 0);
    fa_expr_free(e);
  }
  /* a mask_mod with reads decided a tile at a time: documents (f16 ids), a
   * bool tensor as a boolean and as a number, a 2-D bf16 read against a
   * float constant, ids against positions (a float against integers), a
   * NaN among the values, a read that leaves its tensor at the last rows
   * (ids[q + 1]: the pairs decide, and record it), -inf; a mask's value
   * where a read faults is the fault's (the call fails), not compared */
  {
    const double ids[12] = {1, 1, 1, 2, 2, 2, 2, 3, 3, 3, NAN, 4};
    const double grid_v[24] = {0.5, 2, 2, 2, 0.5, 0.5, 1, 1, 1, 1, 0.5, 0.5, 3, 3, 3, 3, -1, -1, 0.5, 0.5, 2, 2, 2, 2};
    const double flag_v[12] = {1, 1, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1};
    const int64_t s12[1] = {12}, s2x12[2] = {2, 12};
    fa_tensor *ids_t = host_tensor(ctx, FA_F16, 1, s12, ids), *grid_t = host_tensor(ctx, FA_BF16, 2, s2x12, grid_v);
    fa_tensor *fl8 = host_tensor(ctx, FA_BOOL, 1, s12, flag_v);
    CHECK(ids_t && grid_t && fl8, "%s", "the captured tensors");
    nodes x = {0};
    const int b = node(&x, FA_X_B, 0, 0, 0, 0), q = node(&x, FA_X_Q, 0, 0, 0, 0), k = node(&x, FA_X_K, 0, 0, 0, 0);
    const int same = B2(&x, FA_X_EQ, load(&x, 0, 1, q, 0, 0), load(&x, 0, 1, k, 0, 0));
    const int in_doc = B2(&x, FA_X_AND, same, B2(&x, FA_X_GE, q, k));
    const int flagged = B2(&x, FA_X_AND, load(&x, 2, 1, k, 0, 1), B2(&x, FA_X_GT, load(&x, 1, 2, b, q, 0), cst(&x, 0.75)));
    const int counted = B2(&x, FA_X_EQ, N2(&x, FA_X_ADD, load(&x, 2, 1, q, 0, 0), k), cst(&x, 4)); /* flags[q] + k == 4 */
    const int never = B2(&x, FA_X_LE, load(&x, 0, 1, k, 0, 0), cst(&x, -INFINITY));
    B2(&x, FA_X_OR, B2(&x, FA_X_OR, in_doc, B2(&x, FA_X_AND, flagged, counted)), never);
    fa_tensor *ts[3] = {ids_t, grid_t, fl8};
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, ts, NULL, 3, &e) == FA_OK, "%s", fa_context_error(ctx));
    const int64_t rb[4] = {2, 1, 12, 12}, rk[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
    int reads[2];
    char *code = fa_variant_source(NULL, e, rb, reads, &scratch);
    CHECK(code && strstr(code, "has_tile = true") != NULL, "%s", "a tile function for reads compared");
    free(code);
    check("mask_mod of reads compared", e, 1, rb, rk, 12, 0);
    fa_expr_free(e);
    nodes y = {0};
    const int q2 = node(&y, FA_X_Q, 0, 0, 0, 0), k2 = node(&y, FA_X_K, 0, 0, 0, 0);
    const int ahead = B2(&y, FA_X_LT, load(&y, 0, 1, N2(&y, FA_X_ADD, q2, cst(&y, 1)), 0, 0), k2); /* ids[q + 1] < k */
    B2(&y, FA_X_AND, ahead, B2(&y, FA_X_GT, q2, cst(&y, 7)));
    CHECK(fa_expr_new(ctx, y.n, y.count, ts, NULL, 1, &e) == FA_OK, "%s", fa_context_error(ctx));
    check("mask_mod of a read past its tensor", e, 1, rb, rk, 12, 0);
    fa_expr_free(e);
    fa_tensor_drop(&ids_t), fa_tensor_drop(&grid_t), fa_tensor_drop(&fl8);
  }
  /* reads out of range and at fractions: NaN and a fault where the value
   * reaches the result, none where fa.where discards it */
  {
    nodes x = {0};
    const int s = node(&x, FA_X_S, 0, 0, 0, 0), h = node(&x, FA_X_H, 0, 0, 0, 0), q = node(&x, FA_X_Q, 0, 0, 0, 0);
    const int up = load(&x, 0, 1, N2(&x, FA_X_ADD, h, cst(&x, 1)), 0, 0);                    /* slopes[h + 1] */
    const int frac = load(&x, 0, 1, N2(&x, FA_X_DIV, q, cst(&x, 2)), 0, 0);                 /* slopes[q / 2] */
    const int guarded = node(&x, FA_X_WHERE, B2(&x, FA_X_LT, h, cst(&x, 3)), up, s, 0);   /* read only for h < 3 */
    int r = N2(&x, FA_X_ADD, s, guarded);
    r = node(&x, FA_X_WHERE, B2(&x, FA_X_EQ, q, cst(&x, 3)), N2(&x, FA_X_ADD, r, frac), r, 0);
    r = N2(&x, FA_X_ADD, r, up);
    fa_tensor *ts[1] = {slopes};
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, ts, NULL, 1, &e) == FA_OK, "%s", fa_context_error(ctx));
    check("reads out of range", e, 0, bounds, ks, 6, 2e-5);
    CHECK(fa_variant_unsafe_reads(e, bounds, -1) == 2, "%s", "slopes[h + 1] and slopes[q / 2] checked");
    fa_expr_free(e);
  }
  /* positions past 2^24: 64-bit integers, exact where a float is not */
  {
    nodes x = {0};
    const int s = node(&x, FA_X_S, 0, 0, 0, 0), q = node(&x, FA_X_Q, 0, 0, 0, 0), k = node(&x, FA_X_K, 0, 0, 0, 0);
    const int far = B2(&x, FA_X_EQ, N2(&x, FA_X_SUB, k, q), cst(&x, 33554431)); /* k - q == 2^25 - 1 */
    node(&x, FA_X_WHERE, far, N2(&x, FA_X_ADD, s, cst(&x, 1)), s, 0);
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, NULL, NULL, 0, &e) == FA_OK, "%s", fa_context_error(ctx));
    const int64_t big[4] = {1, 1, 2, (int64_t)1 << 26};
    const int64_t bks[4] = {33554430, 33554431, 33554432, 33554433};
    int reads[2];
    char *code = fa_variant_source(e, NULL, big, reads, &scratch);
    CHECK(code && strstr(code, "(k + 1)") != NULL, "%s", "k as a 64-bit integer"); /* past 2^24 */
    free(code);
    check("positions past 2^24", e, 0, big, bks, 4, 0);
    fa_expr_free(e);
  }
  /* integers that may pass 2^53 are floats: (q * 1e9 * 1e9) > 0 holds for every q, as in f64 (a long long of it
   * wrapped around to negative values) */
  {
    nodes x = {0};
    const int q = node(&x, FA_X_Q, 0, 0, 0, 0);
    const int big = N2(&x, FA_X_MUL, N2(&x, FA_X_MUL, q, cst(&x, 1e9)), cst(&x, 1e9));
    B2(&x, FA_X_GT, big, cst(&x, 0));
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, NULL, NULL, 0, &e) == FA_OK, "%s", fa_context_error(ctx));
    const int64_t qb[4] = {1, 1, 40, 3};
    const int64_t qks[3] = {0, 1, 2};
    int reads[2];
    char *code = fa_variant_source(NULL, e, qb, reads, &scratch);
    CHECK(code && strstr(code, "long long v4") == NULL, "%s", "q * 1e9 * 1e9 is no long long");
    free(code);
    check("products past 2^53", e, 1, qb, qks, 3, 0);
    fa_expr_free(e);
  }
  /* tanh's form: the one-SFU tanh where its error reaches the score times at most 128 (softcap
   * c·tanh(s / c), c <= 128, plus other terms), tanhf where a larger factor or a comparison follows */
  {
    const struct { const char *name; double c, mul; int fast; } cases[] = {
      {"softcap 30", 30, 30, 1}, {"softcap 128", 128, 128, 1}, {"softcap 129", 129, 129, 0},
      {"tanh(s) * 1000", 1, 1000, 0}, {"tanh(s / 30) * 30 * 5", 30, 150, 0}};
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
      nodes x = {0};
      const int s = node(&x, FA_X_S, 0, 0, 0, 0), q = node(&x, FA_X_Q, 0, 0, 0, 0);
      const int t = N1(&x, FA_X_TANH, N2(&x, FA_X_DIV, s, cst(&x, cases[c].c)));
      const int capped = cases[c].mul == 150 ? N2(&x, FA_X_MUL, N2(&x, FA_X_MUL, t, cst(&x, 30)), cst(&x, 5))
                                             : N2(&x, FA_X_MUL, cst(&x, cases[c].mul), t);
      N2(&x, FA_X_SUB, capped, N2(&x, FA_X_MUL, q, cst(&x, 0.5)));
      fa_expr *e = NULL;
      CHECK(fa_expr_new(ctx, x.n, x.count, NULL, NULL, 0, &e) == FA_OK, "%s", fa_context_error(ctx));
      const int64_t tb[4] = {1, 1, 8, 8};
      int reads[2];
      char *code = fa_variant_source(e, NULL, tb, reads, &scratch);
      const int fast = code && strstr(code, "fa_variant_tanh_fast(") != NULL, libm = code && strstr(code, "tanhf(") != NULL;
      CHECK(code && fast == cases[c].fast && libm == !cases[c].fast, "%s: tanh's form (one-SFU in f16/bf16 %d, tanhf %d)",
            cases[c].name, fast, libm);
      free(code);
      fa_expr_free(e);
    }
    /* in a mask_mod (a comparison follows): tanhf */
    nodes x = {0};
    const int q = node(&x, FA_X_Q, 0, 0, 0, 0);
    B2(&x, FA_X_LT, N1(&x, FA_X_TANH, N2(&x, FA_X_DIV, q, cst(&x, 5))), cst(&x, 0.5));
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, NULL, NULL, 0, &e) == FA_OK, "%s", fa_context_error(ctx));
    const int64_t tb[4] = {1, 1, 8, 8};
    int reads[2];
    char *code = fa_variant_source(NULL, e, tb, reads, &scratch);
    CHECK(code && strstr(code, "tanhf(") && !strstr(code, "fa_variant_tanh_fast"), "%s", "mask_mod's tanh: tanhf");
    free(code);
    fa_expr_free(e);
  }
  /* numbers from the arguments: a new window width or softcap leaves the text (the compiled kernels'
   * cache key) as it was, with the value in a slot; a modulo's operand, a value that types otherwise
   * (a fraction, an integer past 2^24, a softcap past the one-SFU tanh's 128) changes the text */
  {
    const struct { const char *name; int form; double c1, c2; int same; } cases[] = {
        {"window widths", 0, 1024, 64, 1},      {"a width past 2^24", 0, 1024, 33554432.0, 0},
        {"a fractional width", 0, 1024, 2.5, 0}, {"softcaps 30 and 50", 1, 30, 50, 1},
        {"softcaps 30 and 200", 1, 30, 200, 0},  {"modulo divisors", 2, 4, 5, 0}};
    const int64_t tb[4] = {1, 1, 8, 8}, tks[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    for (int c = 0; c < (int)(sizeof cases / sizeof cases[0]); c++) {
      char *text[2] = {NULL, NULL};
      fa_variant_consts got[2];
      for (int v = 0; v < 2; v++) {
        const double w = v ? cases[c].c2 : cases[c].c1;
        nodes x = {0};
        const int sn = cases[c].form ? node(&x, FA_X_S, 0, 0, 0, 0) : -1; /* (a mask_mod has no s) */
        const int q = node(&x, FA_X_Q, 0, 0, 0, 0), k = node(&x, FA_X_K, 0, 0, 0, 0);
        if (cases[c].form == 0) /* q >= k & q - k <= w */
          B2(&x, FA_X_AND, B2(&x, FA_X_GE, q, k), B2(&x, FA_X_LE, N2(&x, FA_X_SUB, q, k), cst(&x, w)));
        else if (cases[c].form == 1) /* (s / w):tanh() * w */
          N2(&x, FA_X_MUL, N1(&x, FA_X_TANH, N2(&x, FA_X_DIV, sn, cst(&x, w))), cst(&x, w));
        else /* s + q % w */
          N2(&x, FA_X_ADD, sn, N2(&x, FA_X_MOD, q, cst(&x, w)));
        fa_expr *e = NULL;
        CHECK(fa_expr_new(ctx, x.n, x.count, NULL, NULL, 0, &e) == FA_OK, "%s", fa_context_error(ctx));
        const int is_mask = cases[c].form == 0;
        int reads[2];
        text[v] = fa_variant_source(is_mask ? NULL : e, is_mask ? e : NULL, tb, reads, &got[v]);
        check(cases[c].name, e, is_mask, tb, tks, 8, 2e-6); /* each value's code against the CPU */
        fa_expr_free(e);
      }
      const int same = text[0] && text[1] && !strcmp(text[0], text[1]);
      CHECK(same == cases[c].same, "%s: the texts are %s", cases[c].name, same ? "the same" : "different");
      if (same && cases[c].form == 0) /* an integer a float holds exactly: a.cf */
        CHECK(got[0].nf == 1 && got[0].ni == 0 && got[0].f[0] == cases[c].c1 && got[1].f[0] == cases[c].c2,
              "%s: the width in a.cf[0]", cases[c].name);
      free(text[0]), free(text[1]);
    }
    /* without consts, every number a literal */
    nodes x = {0};
    const int q = node(&x, FA_X_Q, 0, 0, 0, 0), k = node(&x, FA_X_K, 0, 0, 0, 0);
    B2(&x, FA_X_LE, N2(&x, FA_X_SUB, q, k), cst(&x, 1234));
    fa_expr *e = NULL;
    CHECK(fa_expr_new(ctx, x.n, x.count, NULL, NULL, 0, &e) == FA_OK, "%s", fa_context_error(ctx));
    int reads[2];
    char *code = fa_variant_source(NULL, e, tb, reads, NULL);
    CHECK(code && strstr(code, "1234") && !strstr(code, "a.ci["), "%s", "no consts: literals");
    free(code);
    fa_expr_free(e);
  }
  fa_tensor_drop(&slopes), fa_tensor_drop(&doc), fa_tensor_drop(&bias), fa_tensor_drop(&flags);
  fa_context_destroy(ctx);
  return tu_summary("test_variant_codegen");
}
