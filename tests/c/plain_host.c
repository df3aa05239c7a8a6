/* A host that does not use Lua: it includes flashattn.h and links
 * libflashattn alone (no liblua, no Lua headers), the way a C program
 * or a ctypes user does.  Causal attention over the host's own buffers
 * (zero copy through fa_tensor_wrap), checked against a plain C loop;
 * fa_version() against the header's FA_VERSION and, when given, argv[1].
 *   plain_host [expected-version]
 * Prints "plain_host: OK ..." and exits 0, or names the fault and exits 1.
 * Built by tests/CMakeLists.txt against the build tree and by
 * tests/install_test.cmake against an installed prefix (pkg-config and
 * find_package). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"

enum { LQ = 5, LK = 7, D = 4, DV = 3 };

static int fail(const char *what, fa_context *ctx) {
  fprintf(stderr, "plain_host: %s%s%s\n", what, ctx ? ": " : "", ctx ? fa_context_error(ctx) : "");
  return 1;
}

/* o[i] = softmax_j(q_i . k_j / sqrt(D), j <= i + LK - LQ) v_j, in double */
static void reference(const float *q, const float *k, const float *v, double *o) {
  for (int i = 0; i < LQ; i++) {
    double s[LK], m = -INFINITY, l = 0;
    int last = i + LK - LQ;
    for (int j = 0; j <= last; j++) {
      s[j] = 0;
      for (int d = 0; d < D; d++) s[j] += (double)q[i * D + d] * k[j * D + d];
      s[j] /= sqrt((double)D);
      if (s[j] > m) m = s[j];
    }
    for (int j = 0; j <= last; j++) l += s[j] = exp(s[j] - m);
    for (int e = 0; e < DV; e++) {
      double acc = 0;
      for (int j = 0; j <= last; j++) acc += s[j] * v[j * DV + e];
      o[i * DV + e] = acc / l;
    }
  }
}

int main(int argc, char **argv) {
  const char *version = fa_version();
  if (!version || strcmp(version, FA_VERSION) != 0) {
    fprintf(stderr, "plain_host: fa_version() is %s, the header says %s\n", version ? version : "NULL", FA_VERSION);
    return 1;
  }
  if (argc > 1 && strcmp(version, argv[1]) != 0) {
    fprintf(stderr, "plain_host: fa_version() is %s, expected %s\n", version, argv[1]);
    return 1;
  }

  float q[LQ * D], k[LK * D], v[LK * DV], o[LQ * DV];
  double ref[LQ * DV];
  for (int i = 0; i < LQ * D; i++) q[i] = (float)sin(0.7 * i + 0.1);
  for (int i = 0; i < LK * D; i++) k[i] = (float)cos(0.3 * i - 0.2);
  for (int i = 0; i < LK * DV; i++) v[i] = (float)(0.05 * i - 0.4);
  reference(q, k, v, ref);

  fa_context *ctx = NULL;
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) return fail("fa_context_create(FA_CPU)", NULL);
  const int64_t qs[2] = {LQ, D}, ks[2] = {LK, D}, vs[2] = {LK, DV}, os[2] = {LQ, DV};
  fa_tensor *tq = NULL, *tk = NULL, *tv = NULL, *to = NULL, *res = NULL;
  int rc = 1;
  if (fa_tensor_wrap(ctx, q, FA_CPU, FA_F32, 2, qs, NULL, NULL, NULL, &tq) ||
      fa_tensor_wrap(ctx, k, FA_CPU, FA_F32, 2, ks, NULL, NULL, NULL, &tk) ||
      fa_tensor_wrap(ctx, v, FA_CPU, FA_F32, 2, vs, NULL, NULL, NULL, &tv) ||
      fa_tensor_wrap(ctx, o, FA_CPU, FA_F32, 2, os, NULL, NULL, NULL, &to)) {
    rc = fail("fa_tensor_wrap", ctx);
    goto done;
  }
  fa_attention_opts opts;
  fa_attention_opts_init(&opts);
  opts.causal = FA_CAUSAL_BOTTOM_RIGHT;
  opts.out = to; /* written in place: the host's own buffer o */
  if (fa_attention(ctx, tq, tk, tv, &opts, &res, NULL) != FA_OK) {
    rc = fail("fa_attention", ctx);
    goto done;
  }
  if (fa_tensor_data(res) != (void *)o) {
    rc = fail("the output is not the host's buffer", NULL);
    goto done;
  }
  double worst = 0;
  for (int i = 0; i < LQ * DV; i++) {
    double e = fabs(o[i] - ref[i]);
    if (!(e <= worst)) worst = e; /* NaN counts as worst */
  }
  if (!(worst < 1e-5)) {
    fprintf(stderr, "plain_host: attention differs from the C reference by %g\n", worst);
    goto done;
  }
  printf("plain_host: OK: flashattn %s (FA_VERSION_MAJOR %d), causal attention %dx%d over %d keys, max error %.1e\n",
         version, FA_VERSION_MAJOR, LQ, DV, LK, worst);
  rc = 0;
done:
  fa_tensor_release(res);
  fa_tensor_release(to);
  fa_tensor_release(tv);
  fa_tensor_release(tk);
  fa_tensor_release(tq);
  fa_context_destroy(ctx);
  return rc;
}
