/* Attention variants on cuda (API §9): score_mod and mask_mod compiled at
 * run time into the fused kernels.
 *
 * A call's traced expressions become CUDA C (src/variant_codegen.c); with
 * the kernels' headers, held in the library (cmake/embed_sources.cmake),
 * NVRTC compiles them into the Hopper (wgmma_tma or wgmma), mma.sync or
 * SIMT kernel instantiated with the variant's problem type
 * (attention_variant.cuh), each instance found or compiled and cached by
 * variant_rtc.cu.  The captured tensors travel with each launch
 * (fa_variant_args), so new values or shapes never recompile. */
#include "attention_registry.h"
#include "attention_variant.cuh"
#include "variant_rtc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern "C" {
#include "variant_codegen.h"
int64_t fa_cuda_backward_wgmma_walk(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g);
fa_status fa_cuda_backward_wgmma_run(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g,
                                     const float *delta, void *prob, int64_t ctas, const void *dkdv, const void *dq,
                                     const void *maps);
}

/* ---- the call ---- */

/* The captured tensors of e into slots base.. of a. */
static void variant_tensors(const fa_expr *e, int base, fa_variant_args *a) {
  for (int t = 0; e && t < e->ntensors; t++) {
    const fa_tensor *x = e->tensors[t];
    a->ptr[base + t] = fa_tensor_ptr(x);
    for (int d = 0; d < 4; d++) {
      a->shape[base + t][d] = d < x->ndim ? x->shape[d] : 1;
      a->stride[base + t][d] = d < x->ndim ? x->strides[d] : 0;
    }
  }
}

/* *vp: p with its expressions' captured tensors (score_mod's first). */
static void variant_problem(const fa_attn_problem *p, fa_variant_problem *vp) {
  memset(vp, 0, sizeof *vp);
  (fa_attn_problem &)*vp = *p;
  variant_tensors(p->score_mod, 0, &vp->va);
  variant_tensors(p->mask_mod, p->score_mod ? p->score_mod->ntensors : 0, &vp->va);
}

/* A launch of a compiled kernel; a failure names it (what). */
static fa_status launch(fa_context *ctx, cudaKernel_t k, unsigned grid, unsigned threads, size_t smem, void **args,
                        const char *what) {
  cudaError_t err = cudaFuncSetAttribute((const void *)k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if (err == cudaSuccess) err = cudaLaunchKernel((const void *)k, dim3(grid), dim3(threads), args, smem, fa_cuda_stream(ctx));
  return fa_cuda_error(ctx, err, what);
}

/* The device's fault records of a call (fa_variant_args.fault) whose
 * score_mod and mask_mod have reads[0] and reads[1] checked reads: none
 * allocated without any. */
typedef struct {
  long long *dev;
  size_t bytes;
  int reads[2];
} fault_records;

/* Allocates the records, all -1, and points vp's args at them. */
static fa_status faults_open(fa_context *ctx, const int *reads, fa_variant_problem *vp, fault_records *fr) {
  fr->dev = NULL, fr->reads[0] = reads[0], fr->reads[1] = reads[1];
  fr->bytes = sizeof(long long) * (size_t)(2 + 2 * (reads[0] + reads[1]));
  if (!reads[0] && !reads[1]) return FA_OK;
  fa_status st = fa_cuda_malloc(ctx, (void **)&fr->dev, fr->bytes);
  if (st) return st;
  if (reads[0]) vp->va.fault[0] = fr->dev;
  if (reads[1]) vp->va.fault[1] = fr->dev + 1 + 2 * reads[0];
  return fa_cuda_error(ctx, cudaMemsetAsync(fr->dev, 0xff, fr->bytes, fa_cuda_stream(ctx)), "the variant's fault record");
}

/* After the kernels (st their status): the faults back from the device into
 * the expressions (the caller reports them, as for the CPU:
 * fa_expr_fault), and the records freed. */
static fa_status faults_close(fa_context *ctx, const fa_attn_problem *p, const int64_t *bounds, fault_records *fr,
                              fa_status st) {
  if (!fr->dev) return st;
  long long *host = st ? NULL : (long long *)malloc(fr->bytes);
  if (!st && !host) st = fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: opts.score_mod: out of host memory");
  if (!st) st = fa_cuda_memcpy(ctx, host, fr->dev, fr->bytes, FA_COPY_D2H);
  const long long *rec[2] = {host, host ? host + 1 + 2 * fr->reads[0] : NULL};
  const fa_expr *ex[2] = {p->score_mod, p->mask_mod};
  for (int w = 0; !st && w < 2; w++) {
    const fa_expr *e = ex[w];
    if (!e || rec[w][0] < 0 || rec[w][0] >= e->n) continue;
    const int node = (int)rec[w][0];
    const int read = fa_variant_unsafe_reads(e, bounds, node); /* the node's slot */
    if (read < 0 || read >= fr->reads[w]) continue;
    const long long dim = rec[w][1 + 2 * read], index = rec[w][2 + 2 * read];
    fa_expr_set_fault(e, node, dim >= 0 && dim < 4 ? (int)dim : 0, index);
  }
  free(host);
  fa_cuda_free_on(ctx, fr->dev, fr->bytes);
  fr->dev = NULL;
  return st;
}

static bool expr_uses(const fa_expr *e, int op) {
  for (int i = 0; e && i < e->n; i++)
    if (e->nodes[i].op == op) return true;
  return false;
}

/* The element type of p's operands as the kernels' templates name it. */
static const char *rtc_type(const fa_attn_problem *p) {
  return p->compute == FA_F16 ? "__half" : p->compute == FA_BF16 ? "__nv_bfloat16" : "float";
}

/* What a variant call runs: the kernels (names[0] the SIMT kernel, [1] the
 * fast one, [2] mask_mod's spans), the fast kernel's tile, the SIMT
 * kernel's problem (its own tile) and the spans' layout. */
enum { FAST_NONE, FAST_MMA, FAST_WGMMA, FAST_TMA }; /* variant_plan.fast */

typedef struct {
  int fast, n;
  int br, bc;          /* the fast kernel's tile */
  bool persistent;     /* FAST_TMA: its persistent form */
  wt_maps maps;        /* FAST_TMA: the tensor maps of q, k and v */
  attn_params simt; /* tile fitted to the SIMT kernel */
  long long nb, nh, nq; /* spans: batches and heads told apart (1: mask_mod does not use b / h), query tiles */
  char names[RTC_KERNELS][160];
} variant_plan;

static fa_status plan_variant(fa_context *ctx, fa_attn_kernel kernel, const fa_attn_problem *p, variant_plan *v) {
  memset(v, 0, sizeof *v);
  /* the first kernel of the registry with a variant hook that takes the call (wgmma_tma, wgmma, mma), else
   * SIMT; wgmma_tma's key tiles of 176 only when asked for (opts.tile): an alibi score_mod's instance spills
   * 460 bytes there (96 at 128), where the built-in rules take them automatically */
  const attn_entry *e = attn_entry_pick(kernel, p, FA_ATTN_FLASH, true);
  if (!e) return fa_fail(ctx, FA_ERR_UNSUPPORTED, "flashattn: opts.kernel: the kernel named declined the call on cuda");
  v->fast = e == &attn_entry_wgmma_tma ? FAST_TMA : e == &attn_entry_wgmma ? FAST_WGMMA : e == &attn_entry_mma ? FAST_MMA
                                                                                                          : FAST_NONE;
  /* the tensor-core hook works a key out in 32 bits (variant_rows): 2^31 keys or more (keys and values of
   * 2^31 * D * 4 bytes, 512 GiB at the least D those kernels take, 64) go to the SIMT kernel */
  if (p->key_base + p->Lk > INT32_MAX - 512) v->fast = FAST_NONE;
  if (v->fast == FAST_TMA && !wt_encode_maps(p, &v->maps))
    return fa_fail(ctx, FA_ERR_BACKEND, "flashattn: attention on cuda: the driver refused the operands' tensor maps");
  const char *T = rtc_type(p);
  const char *dense = attn_rows_dense(p) ? "true" : "false";
  /* the SIMT kernel: behind the fast one (a tile it holds), or alone with the call's tile */
  v->simt = attn_params_of(*p);
  if (v->fast) v->simt.tile_q = 64, v->simt.tile_k = 64;
  fa_status st = simt_fit_tile(ctx, &v->simt);
  if (st) return st;
  snprintf(v->names[0], sizeof v->names[0], "attn_tiled_kernel<%s, %d, MODE_FLASH, fa_variant_problem>", T,
           block_rows((int)v->simt.tile_q));
  v->n = 1;
  if (!v->fast) return FA_OK;
  if (v->fast == FAST_TMA) {
    v->br = WT_BR, v->bc = (int)p->tile_k;
    /* mask_mod too: its tiles narrow the producer's key range.  A/B on one H200 (2026-11-27, two rounds,
     * bench_variants): the persistent form 3-13 % faster for alibi, the windows, prefix_lm and documents
     * at 16k, 2-4 % slower for softcap */
    v->persistent = wt_persistent_fits(v->maps, p->D, v->bc, p->Lk, p->mask_b || p->mask_f);
    if (v->persistent)
      snprintf(v->names[1], sizeof v->names[1],
               "attn_wgmma_tma_persistent_kernel<%s, %lld, %d, EXTRAS_VARIANT, fa_variant_problem>", T,
               (long long)p->D, v->bc);
    else
      snprintf(v->names[1], sizeof v->names[1],
               "attn_wgmma_tma_kernel<%s, %lld, %d, EXTRAS_VARIANT, %s, fa_variant_problem>", T, (long long)p->D,
               v->bc, p->D == 256 ? "true" : "false");
  } else if (v->fast == FAST_WGMMA) {
    v->br = WG_BR, v->bc = (int)p->tile_k;
    snprintf(v->names[1], sizeof v->names[1],
             "attn_wgmma_kernel<%s, %lld, %d, EXTRAS_VARIANT, PASS_FLASH, %s, fa_variant_problem>", T, (long long)p->D,
             v->bc, dense);
  } else {
    v->br = 16 * MMA_WARPS(p->D), v->bc = MMA_BC;
    snprintf(v->names[1], sizeof v->names[1], "attn_mma_kernel<%s, %lld, EXTRAS_VARIANT, PASS_FLASH, %s, fa_variant_problem>",
             T, (long long)p->D, dense);
  }
  v->n = 2;
  if (p->mask_mod) { /* the key tiles mask_mod leaves empty are skipped, its full ones not masked */
    v->nb = expr_uses(p->mask_mod, FA_X_B) ? p->B : 1;
    v->nh = expr_uses(p->mask_mod, FA_X_H) ? p->Hq : 1;
    v->nq = (p->Lq + v->br - 1) / v->br;
    snprintf(v->names[2], sizeof v->names[2], "fa_variant_spans_kernel<%d, %d>", v->br, v->bc);
    v->n = 3;
  }
  return FA_OK;
}

/* The CUDA C of the call's variant, in its translation unit (malloc'd):
 * the expressions, and which of §2's rules the call sets; reads: their
 * checked reads, and va's numbers (fa_variant_source). */
static_assert(sizeof(((fa_variant_args *)0)->ci) == sizeof(((fa_variant_consts *)0)->i) &&
                  sizeof(((fa_variant_args *)0)->cf) == sizeof(((fa_variant_consts *)0)->f),
              "fa_variant_args' numbers: as many as variant_codegen.h's");
static char *variant_unit(const fa_attn_problem *p, const int64_t *bounds, int *reads, fa_variant_args *va) {
  fa_variant_consts consts;
  char *code = fa_variant_source(p->score_mod, p->mask_mod, bounds, reads, &consts), *src = NULL;
  if (code) {
    memcpy(va->ci, consts.i, sizeof va->ci), memcpy(va->cf, consts.f, sizeof va->cf);
    const size_t n = strlen(code) + 640;
    if ((src = (char *)malloc(n)))
      snprintf(src, n,
               "#include \"attention_variant.cuh\"\n"
               "/* score_mod's tanh where its error reaches the score times at most 128 (variant_codegen.c) */\n"
               "static __device__ __forceinline__ float fa_variant_tanh_fast(float x) { return %s(x); }\n%s"
               "struct fa_variant_rules {\n  static const bool bool_mask = %s, float_mask = %s, softcap = %s, alibi = %s;\n};\n"
               "#include \"attention_variant_rules.cuh\"\n",
               p->compute == FA_F16 || p->compute == FA_BF16 ? "tanh_as<TANH_SFU1>" : "tanhf", code, p->mask_b ? "true" : "false",
               p->mask_f ? "true" : "false", p->softcap > 0 ? "true" : "false", p->alibi ? "true" : "false");
  }
  free(code);
  return src;
}

/* The tests' check without a device (CI has the toolkit, not a GPU): the
 * unit of score_mod and mask_mod for a call of dtype compiled by NVRTC for
 * arch with each of the n kernel instances named (bit i of guards: as a
 * guard), their code dropped; the first that does not compile is the
 * error. */
extern "C" fa_status fa_cuda_variant_compile(fa_context *ctx, const fa_expr *score_mod, const fa_expr *mask_mod,
                                             fa_dtype dtype, const char *arch, const char *const *names, int n,
                                             unsigned guards) {
  fa_status st = FA_OK;
  fa_attn_problem p;
  memset(&p, 0, sizeof p);
  p.B = 2, p.Hq = p.Hkv = 4, p.Lq = p.Lk = 256, p.compute = dtype, p.score_mod = score_mod, p.mask_mod = mask_mod;
  const int64_t bounds[4] = {p.B, p.Hq, p.Lq, p.Lk};
  int reads[2];
  fa_variant_args numbers; /* the unit as a call compiles it; the values go nowhere */
  char *src = variant_unit(&p, bounds, reads, &numbers);
  if (!src) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: opts.score_mod: out of host memory");
  for (int i = 0; i < n && !st; i++) st = fa_rtc_compile_only(ctx, src, arch, names[i], (guards >> i) & 1);
  free(src);
  return st;
}

/* ---- mask_mod's tiles (fa_variant_args.spans) ---- */

/* The spans of a block mask (fa.block_mask: per tile of Br x Bc, empty,
 * full or partial) for the kernels' tiles of br x bc, multiples of them:
 * a kernel tile is empty (full) when every tile of the mask inside it is.
 * Made on the host once, kept on the device in the mask. */
static fa_status block_mask_spans(fa_context *ctx, const fa_block_mask *cm, int br, int bc, const int **out) {
  fa_block_mask *m = (fa_block_mask *)cm; /* its device copy is made on demand (allocated non-const) */
  int dev = 0;
  *out = NULL;
  FA_CUDA_CHECK(ctx, cudaGetDevice(&dev));
  if (br % m->Br || bc % m->Bc) return FA_OK; /* tiles that do not line up: the call makes its own */
  if (m->dev_spans) {
    if (m->dev_br == br && m->dev_bc == bc && m->dev_device == dev) *out = (const int *)m->dev_spans;
    return FA_OK; /* made for other tiles or another device: the call makes its own */
  }
  const long long rq = br / m->Br, rk = bc / m->Bc, nq = (m->Lq + br - 1) / br, nk = (m->Lk + bc - 1) / bc;
  const size_t bytes = sizeof(int) * 4 * (size_t)(m->B * m->H * nq);
  int *host = (int *)malloc(bytes);
  if (!host) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: opts.block_mask: out of host memory");
  for (long long bh = 0; bh < m->B * m->H; bh++)
    for (long long qt = 0; qt < nq; qt++) {
      fa_span_builder span = fa_span_start();
      for (long long kt = 0; kt < nk; kt++) {
        bool any = false, all = true;
        for (long long qi = qt * rq; qi < (qt + 1) * rq && qi < m->nq; qi++)
          for (long long ki = kt * rk; ki < (kt + 1) * rk && ki < m->nk; ki++) {
            const int st = m->state[(bh * m->nq + qi) * m->nk + ki];
            any |= st != FA_BLOCK_EMPTY, all &= st == FA_BLOCK_FULL;
          }
        fa_span_add(span, (int)kt, any, all);
      }
      fa_span_store(span, host + 4 * (bh * nq + qt));
    }
  void *d = NULL;
  fa_status st = fa_cuda_malloc(ctx, &d, bytes);
  if (!st) st = fa_cuda_memcpy(ctx, d, host, bytes, FA_COPY_H2D);
  free(host);
  if (st) {
    fa_cuda_free_on(ctx, d, bytes);
    return st;
  }
  m->dev_spans = d, m->dev_bytes = bytes, m->dev_br = br, m->dev_bc = bc, m->dev_device = dev;
  *out = (const int *)d;
  return FA_OK;
}

/* Spans of mask_mods that read no tensor depend on the unit's source, the
 * numbers its code reads from the arguments (va.ci, va.cf: one source
 * serves every prefix length) and the call's sizes alone: kept for the
 * process (at most SPANS_KEPT of them; the rest are made a call at a time). */
#define SPANS_KEPT 64
typedef struct spans_entry {
  char *key;
  size_t keylen;
  int *spans;
  struct spans_entry *next;
} spans_entry;
static spans_entry *kept_spans;
static int kept_count;
static pthread_mutex_t spans_lock = PTHREAD_MUTEX_INITIALIZER; /* kept_spans, and the block masks' device spans */

static char *spans_key(const char *src, const fa_attn_problem *p, const variant_plan *v, const fa_variant_args *va,
                       size_t *len) {
  /* the header below is at most 190 characters, then two a byte of the numbers */
  const size_t numbers = sizeof va->ci + sizeof va->cf, cap = strlen(src) + 256 + 2 * numbers + 1;
  char *key = (char *)malloc(cap);
  int dev = 0;
  if (!key || cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    free(key);
    return NULL;
  }
  size_t n = (size_t)snprintf(key, cap, "%s\n// spans %d x %d of %lld %lld %lld %lld %lld %lld on %d, numbers ", src,
                              v->br, v->bc, (long long)p->B, (long long)p->Hq, (long long)p->Lq, (long long)p->Lk, v->nb,
                              v->nh, dev);
  /* the numbers' bytes in hex, by a table (a snprintf a byte was 224 calls a call) */
  static const char hex[] = "0123456789abcdef";
  const unsigned char *bytes[2] = {(const unsigned char *)va->ci, (const unsigned char *)va->cf};
  const size_t sizes[2] = {sizeof va->ci, sizeof va->cf};
  for (int a = 0; a < 2; a++)
    for (size_t i = 0; i < sizes[a]; i++) key[n++] = hex[bytes[a][i] >> 4], key[n++] = hex[bytes[a][i] & 15];
  key[n] = '\0';
  *len = n;
  return key;
}

/* vp->va.spans and its layout for the call: from opts.block_mask, or kept,
 * or made by the spans kernel (into *temp, which the caller frees, unless
 * it is kept). */
static fa_status variant_spans(fa_context *ctx, const fa_attn_problem *p, const variant_plan *v, const char *src,
                               cudaKernel_t spans_kernel, fa_variant_problem *vp, void **temp, size_t *temp_bytes) {
  fa_variant_args &va = vp->va;
  va.spans_br = v->br, va.spans_bc = v->bc, va.spans_nq = v->nq;
  *temp = NULL, *temp_bytes = 0;
  fa_status st = FA_OK;
  pthread_mutex_lock(&spans_lock);
  if (p->block_mask && !(st = block_mask_spans(ctx, p->block_mask, v->br, v->bc, &va.spans)) && va.spans) {
    va.spans_sb = p->block_mask->H, va.spans_sh = 1;
    pthread_mutex_unlock(&spans_lock);
    return FA_OK;
  }
  va.spans_sb = v->nb > 1 ? v->nh : 0, va.spans_sh = v->nh > 1 ? 1 : 0;
  size_t keylen = 0;
  char *key = !st && p->mask_mod->ntensors == 0 ? spans_key(src, p, v, &va, &keylen) : NULL;
  for (spans_entry *e = kept_spans; key && e; e = e->next)
    if (e->keylen == keylen && !memcmp(e->key, key, keylen)) va.spans = e->spans;
  pthread_mutex_unlock(&spans_lock);
  if (st || va.spans) {
    free(key);
    return st;
  }
  const long long grid = v->nb * v->nh * v->nq;
  const size_t bytes = sizeof(int) * 4 * (size_t)grid;
  void *spans = NULL;
  if ((st = fa_cuda_malloc(ctx, &spans, bytes)) || (st = attn_grid_fits(ctx, grid))) {
    free(key);
    if (spans) fa_cuda_free_on(ctx, spans, bytes);
    return st;
  }
  void *states = NULL;
  void *args[] = {vp, &spans, &states, (void *)&v->nh};
  st = launch(ctx, spans_kernel, (unsigned)grid, FA_SPANS_THREADS, 0, args, "mask_mod's tiles");
  va.spans = (const int *)spans;
  spans_entry *e = NULL;
  pthread_mutex_lock(&spans_lock);
  if (!st && key && kept_count < SPANS_KEPT && (e = (spans_entry *)calloc(1, sizeof *e))) {
    e->key = key, e->keylen = keylen, e->spans = (int *)spans, key = NULL;
    e->next = kept_spans, kept_spans = e, kept_count++;
  }
  pthread_mutex_unlock(&spans_lock);
  free(key);
  if (!e) *temp = spans, *temp_bytes = bytes; /* a call's own: freed after its kernels */
  return st;
}

/* vp with the SIMT kernel's problem simt (its tile), its captured tensors kept. */
static void simt_problem(fa_variant_problem *vp, const attn_params *simt) {
  const fa_variant_args va = vp->va;
  (attn_params &)*vp = *simt;
  vp->va = va;
}

/* The SIMT tiled kernel k on vp's tile (a guard behind a fast kernel when
 * vp->v_nonfinite is set: a few blocks an SM). */
static fa_status launch_simt(fa_context *ctx, cudaKernel_t k, fa_variant_problem *vp, const char *what) {
  int bc = (int)vp->tile_k, tq = (int)vp->tile_q;
  int64_t nblk = vp->B * vp->Hq * ((vp->Lq + tq - 1) / tq), grid = 0;
  void *args[] = {vp, &tq, &bc, &nblk};
  fa_status st = tiled_grid(ctx, nblk, vp->v_nonfinite != NULL, &grid);
  if (!st) st = attn_grid_fits(ctx, grid);
  if (!st && grid > 0)
    st = tiled_launch(ctx, (const void *)k, grid, tiled_smem(block_rows(tq), bc, vp->D, vp->Dv), args,
                      vp->v_nonfinite != NULL, what);
  return st;
}

/* The start every variant call shares: the call's unit (*src, malloc'd:
 * the caller frees it) compiled with the instances list[0..n) (bit i of
 * guards: a guard), *vp the problem with its captured tensors and the
 * fault records open (fr: closed by faults_close, also after a failure). */
static fa_status variant_open(fa_context *ctx, const fa_attn_problem *p, const int64_t *bounds, const char *const *list,
                              int n, unsigned guards, cudaKernel_t *kern, fa_variant_problem *vp, fault_records *fr,
                              char **src) {
  int reads[2];
  *fr = fault_records{NULL, 0, {0, 0}};
  variant_problem(p, vp);
  if (!(*src = variant_unit(p, bounds, reads, &vp->va)))
    return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: opts.score_mod: out of host memory");
  fa_status st = fa_rtc_kernels(ctx, *src, list, n, guards, kern);
  return st ? st : faults_open(ctx, reads, vp, fr);
}

/* The warp-specialised kernel of the call (FAST_TMA): a block a query
 * tile, or its persistent form with the NaN/inf flag's tile counter. */
static fa_status queue_variant_tma(fa_context *ctx, const fa_attn_problem *p, const variant_plan *v, cudaKernel_t kern,
                                   fa_variant_problem *vp) {
  const size_t smem = wt_form_smem_bytes((int)p->D, v->bc, v->persistent);
  const int64_t tiles = p->B * p->Hq * ((p->Lq + WT_BR - 1) / WT_BR);
  fa_status st = attn_grid_fits(ctx, tiles);
  if (st || tiles <= 0) return st;
  wt_maps maps = v->maps; /* a copy the launch reads: the arguments are copied at the launch */
  if (!v->persistent) {
    void *args[] = {vp, &maps};
    return launch(ctx, kern, (unsigned)tiles, wt_threads((int)p->D, v->bc), smem, args, "the variant's fast kernel");
  }
  unsigned grid = 0;
  int *next = NULL;
  if ((st = wt_persistent_grid(ctx, tiles, vp->v_nonfinite, &grid, &next))) return st;
  void *args[] = {vp, &maps, &next};
  return launch(ctx, kern, grid, wt_threads((int)p->D, v->bc), smem, args, "the variant's fast kernel");
}

/* Queues the call's kernels: mask_mod's spans, the fast kernel guarded by
 * v_flag (NaN or inf in V, as launch_guarded_by_v_flag does for the
 * built-in rules: the warp-specialised kernel sets it from its outputs,
 * V_CHECK_OUTPUT; for the others a scan of V from the side stream, beside
 * the kernels), and the SIMT kernel, behind it when there is one (it runs
 * only when v_flag is set), else alone.  A scan beside the warp-specialised
 * kernel, which holds every SM, ran after it: 19 us of a 300 us document
 * call at L = 4096 (H200). */
static fa_status queue_variant(fa_context *ctx, const fa_attn_problem *p, const variant_plan *v, const char *src,
                               cudaKernel_t *kern, fa_variant_problem *vp, int *v_flag) {
  fa_status st = FA_OK;
  void *spans = NULL;
  size_t spans_bytes = 0;
  cudaStream_t side = 0;
  const bool scan = v_flag && v->fast != FAST_TMA;
  if (scan && (st = fa_cuda_fork(ctx, &side))) return st;
  if (v->n == 3) st = variant_spans(ctx, p, v, src, kern[2], vp, &spans, &spans_bytes);
  if (!st && v->fast == FAST_TMA) {
    vp->v_nonfinite = v_flag, vp->v_self_check = V_CHECK_OUTPUT;
    st = queue_variant_tma(ctx, p, v, kern[1], vp);
  } else if (!st && v->fast) {
    vp->v_nonfinite = v_flag, vp->v_self_check = V_CHECK_SCAN;
    void *args[] = {vp};
    const int64_t blocks = p->B * p->Hq * ((p->Lq + v->br - 1) / v->br);
    const bool wg = v->fast == FAST_WGMMA;
    const size_t smem = wg ? wgmma_smem_bytes((int)p->D, v->bc) : (size_t)(v->br + 4 * MMA_BC) * p->D * 2;
    if (!(st = attn_grid_fits(ctx, blocks)))
      st = launch(ctx, kern[1], (unsigned)blocks, wg ? WG_THREADS : MMA_WARPS(p->D) * 32, smem, args,
                  "the variant's fast kernel");
  }
  if (scan) st = join_nonfinite_scan(ctx, p, v_flag, side, st);
  if (!st) {
    simt_problem(vp, &v->simt);
    vp->v_nonfinite = v_flag;
    st = launch_simt(ctx, kern[0], vp, "the variant's SIMT kernel");
  }
  if (spans) fa_cuda_free_on(ctx, spans, spans_bytes); /* stream-ordered: after the kernels */
  return st;
}

/* "two_pass" and "flash_row" with a variant: the SIMT kernels of those
 * algorithms (attn_tiled_kernel's statistics and output passes, with row
 * statistics in between; attn_row_kernel), compiled with the expressions
 * as "flash"'s SIMT kernel is. */
static fa_status variant_simt_algo(fa_context *ctx, fa_attention_algo algo, const fa_attn_problem *p,
                                   const int64_t *bounds) {
  attn_params simt = attn_params_of(*p);
  const char *T = rtc_type(p);
  char names[2][160];
  int n = 1;
  fa_status st = FA_OK;
  if (algo == FA_ATTN_FLASH_ROW) {
    snprintf(names[0], sizeof names[0], "attn_row_kernel<%s, fa_variant_problem>", T);
  } else {
    if ((st = simt_fit_tile(ctx, &simt))) return st;
    const int br = block_rows((int)simt.tile_q);
    snprintf(names[0], sizeof names[0], "attn_tiled_kernel<%s, %d, MODE_STATS, fa_variant_problem>", T, br);
    snprintf(names[1], sizeof names[1], "attn_tiled_kernel<%s, %d, MODE_OUTPUT, fa_variant_problem>", T, br);
    n = 2;
  }
  const char *list[RTC_KERNELS] = {names[0], names[1]};
  cudaKernel_t kern[RTC_KERNELS] = {NULL, NULL, NULL};
  fa_variant_problem vp;
  fault_records fr;
  char *src = NULL;
  st = variant_open(ctx, p, bounds, list, n, 0u, kern, &vp, &fr, &src);
  free(src);
  if (!st && algo == FA_ATTN_FLASH_ROW) { /* a thread a query row, as attention.cu's row_typed */
    const int64_t blocks = (p->B * p->Hq * p->Lq + 127) / 128;
    void *args[] = {&vp};
    if (!(st = attn_grid_fits(ctx, blocks)) && blocks > 0)
      st = launch(ctx, kern[0], (unsigned)blocks, 128, 0, args, "the variant's flash_row kernel");
  } else if (!st) { /* the statistics pass, then the output pass */
    const size_t stats_bytes = sizeof(float) * 2 * (size_t)(p->B * p->Hq * p->Lq);
    float *stats = NULL;
    if (!(st = fa_cuda_malloc(ctx, (void **)&stats, stats_bytes))) {
      simt_problem(&vp, &simt);
      vp.row_stats = stats;
      st = launch_simt(ctx, kern[0], &vp, "the variant's two_pass statistics kernel");
      if (!st) st = launch_simt(ctx, kern[1], &vp, "the variant's two_pass output kernel");
      fa_cuda_free_on(ctx, stats, stats_bytes); /* stream-ordered: after both passes */
    }
  }
  return faults_close(ctx, p, bounds, &fr, st);
}

/* "naive" with a variant: attention_naive.cu's method (S and P in memory,
 * cuBLAS's products) around the row kernel compiled with the expressions. */
typedef struct {
  cudaKernel_t kern;
  fa_variant_problem *vp;
  int wpr;
} variant_naive_rows;
static fa_status variant_naive_launch(fa_context *ctx, const fa_attn_problem *p, const float *S, void *P, int64_t rows,
                                      void *user) {
  const variant_naive_rows *u = (const variant_naive_rows *)user;
  int64_t grid = 0;
  fa_status st = naive_softmax_grid(ctx, p, u->wpr, rows, &grid);
  void *args[] = {u->vp, &S, &P, &rows};
  if (!st && grid > 0) st = launch(ctx, u->kern, (unsigned)grid, NAIVE_THREADS, 0, args, "the variant's naive row kernel");
  return st;
}
static fa_status variant_naive(fa_context *ctx, const fa_attn_problem *p, const int64_t *bounds) {
  variant_naive_rows u = {NULL, NULL, naive_softmax_wpr(p)};
  char name[160];
  snprintf(name, sizeof name, "naive_softmax_kernel<%s, true, %d, fa_variant_problem>", rtc_type(p), u.wpr);
  const char *list[RTC_KERNELS] = {name};
  cudaKernel_t kern[RTC_KERNELS] = {NULL, NULL, NULL};
  fa_variant_problem vp;
  fault_records fr;
  char *src = NULL;
  fa_status st = variant_open(ctx, p, bounds, list, 1, 0u, kern, &vp, &fr, &src);
  free(src);
  u.kern = kern[0], u.vp = &vp;
  if (!st) st = fa_cuda_attention_naive_with(ctx, p, variant_naive_launch, &u);
  return faults_close(ctx, p, bounds, &fr, st);
}

extern "C" fa_status fa_cuda_attention_variant(fa_context *ctx, fa_attention_algo algo, fa_attn_kernel kernel,
                                               const fa_attn_problem *p) {
  /* an opts.splits piece (key_base > 0): k counts the whole call's keys, up to its end */
  const int64_t call_bounds[4] = {p->B, p->Hq, p->Lq, p->key_base + p->Lk};
  if (algo == FA_ATTN_TWO_PASS || algo == FA_ATTN_FLASH_ROW) return variant_simt_algo(ctx, algo, p, call_bounds);
  if (algo == FA_ATTN_NAIVE) return variant_naive(ctx, p, call_bounds);
  variant_plan v;
  fa_status st = plan_variant(ctx, kernel, p, &v);
  if (st) return st;
  const char *names[RTC_KERNELS] = {v.names[0], v.names[1], v.names[2]};
  cudaKernel_t kern[RTC_KERNELS] = {NULL, NULL, NULL};
  fa_variant_problem vp;
  fault_records fr;
  char *src = NULL;
  int *v_flag = NULL;
  /* the SIMT kernel: a guard behind a fast one */
  st = variant_open(ctx, p, call_bounds, names, v.n, v.fast ? 1u : 0u, kern, &vp, &fr, &src);
  if (!st && v.fast) st = values_nonfinite_flag(ctx, p, &v_flag, false); /* NaN or inf in V: the SIMT kernel redoes the call */
  if (!st) st = queue_variant(ctx, p, &v, src, kern, &vp, v_flag);
  free(src);
  if (v_flag) fa_cuda_free_on(ctx, v_flag, FA_FLAG_BYTES); /* stream-ordered */
  return faults_close(ctx, p, call_bounds, &fr, st);
}

/* The backward of a variant call (API §10: the chain rule through
 * score_mod's traced expression, mask_mod's keys passing nothing back),
 * on fa_cuda_backward_run's schedule (delta, the kernels, the NaN/inf
 * guard) with the kernels compiled with the variant's rule: Hopper's
 * tensor-core kernels (attention_backward_wgmma.cuh, bwm_variant_probs)
 * where they take the call, the SIMT ones (attention_backward_simt.cuh,
 * attn_rule's score_chain) behind them and for the rest.  mask_mod's tiles
 * of 64 x 64 are found first (the spans kernel: their states and spans),
 * so that the tensor-core kernels skip the empty ones and do not evaluate
 * mask_mod on the full ones.  Head dims up to 256 (checked by the caller). */
typedef struct {
  cudaKernel_t dkdv, dq, simt_dkdv, simt_dq;
  fa_variant_problem *vp;
  int64_t ctas; /* fa_cuda_backward_wgmma_walk's, which chose dkdv's instance */
} variant_backward;

static fa_status variant_bw_fast(fa_context *ctx, fa_attn_kernel, const fa_attn_problem *p, const fa_attn_grads *g,
                                 const float *delta, void *user) {
  variant_backward *vb = (variant_backward *)user;
  return fa_cuda_backward_wgmma_run(ctx, p, g, delta, vb->vp, vb->ctas, (const void *)vb->dkdv, (const void *)vb->dq,
                                    NULL);
}

static fa_status variant_bw_simt(fa_context *ctx, const fa_attn_problem *p, const fa_attn_grads *g, const float *delta,
                                 const int *only_if, void *user) {
  variant_backward *vb = (variant_backward *)user;
  const bw_simt_plan pl = bw_simt_plan_of(p);
  unsigned kgrid = 0, qgrid = 0;
  fa_status st = bw_simt_grids(ctx, only_if, pl, &kgrid, &qgrid);
  if (st) return st;
  fa_attn_grads gv = *g;
  void *args[] = {vb->vp, &gv, &delta, &only_if};
  if (pl.kblocks > 0 &&
      (st = launch(ctx, vb->simt_dkdv, kgrid, BW_THREADS, pl.smem_kv, args, "the variant's backward (dK, dV)")))
    return st;
  if (pl.qblocks > 0)
    st = launch(ctx, vb->simt_dq, qgrid, BW_THREADS, pl.smem_q, args, "the variant's backward (dQ)");
  return st;
}

/* mask_mod's tiles of 64 x 64 for the tensor-core backward: the spans
 * kernel's states and spans (in *temp, *temp_bytes, freed by the caller)
 * into vp's args. */
static fa_status variant_bw_tiles(fa_context *ctx, const fa_attn_problem *p, cudaKernel_t spans_kernel,
                                  fa_variant_problem *vp, void **temp, size_t *temp_bytes) {
  const long long nb = expr_uses(p->mask_mod, FA_X_B) ? p->B : 1, nh = expr_uses(p->mask_mod, FA_X_H) ? p->Hq : 1;
  const long long nq = (p->Lq + 63) / 64, nk = (p->Lk + 63) / 64, grid = nb * nh * nq;
  const size_t span_bytes = (size_t)(4 * grid) * sizeof(int), bytes = span_bytes + (size_t)(grid * nk);
  fa_status st = attn_grid_fits(ctx, grid);
  if (st || grid == 0 || (st = fa_cuda_malloc(ctx, temp, bytes))) return st;
  *temp_bytes = bytes;
  fa_variant_args &va = vp->va;
  int *spans = (int *)*temp;
  unsigned char *states = (unsigned char *)*temp + span_bytes;
  va.spans_br = va.spans_bc = 64, va.spans_nq = nq, va.tiles_nk = nk;
  va.spans_sb = nb > 1 ? nh : 0, va.spans_sh = nh > 1 ? 1 : 0;
  void *args[] = {vp, &spans, &states, (void *)&nh};
  st = launch(ctx, spans_kernel, (unsigned)grid, FA_SPANS_THREADS, 0, args, "mask_mod's tiles");
  va.spans = spans, va.tiles = states;
  return st;
}

extern "C" fa_status fa_cuda_attention_backward_variant(fa_context *ctx, fa_attn_kernel kernel, const fa_attn_problem *p,
                                                        const fa_attn_grads *g) {
  fa_status st = fa_cuda_backward_choose(ctx, p, g, FA_KERNEL_WGMMA, &kernel);
  if (st) return st;
  const bool fast = kernel == FA_KERNEL_WGMMA, tiles = fast && p->mask_mod;
  const char *T = rtc_type(p);
  const int64_t ctas = fa_cuda_backward_wgmma_walk(ctx, p, g); /* above 0: the schedule without a dQ kernel */
  const bool adds_dq = ctas > 0;
  char names[RTC_KERNELS][160];
  const bw_simt_plan pl = bw_simt_plan_of(p);
  snprintf(names[0], sizeof names[0], "bw_dkdv_kernel<%s, %d, fa_variant_problem>", T, pl.dmax);
  snprintf(names[1], sizeof names[1], "bw_dq_kernel<%s, %d, fa_variant_problem>", T, pl.dmax);
  snprintf(names[2], sizeof names[2], "bwg_dkdv_kernel<%s, %lld, EXTRAS_VARIANT, %s, fa_variant_problem%s>", T,
           (long long)p->D, adds_dq ? "true" : "false", adds_dq && g->deterministic ? ", true" : "");
  snprintf(names[3], sizeof names[3], "bwg_dq_kernel<%s, %lld, EXTRAS_VARIANT, fa_variant_problem>", T, (long long)p->D);
  snprintf(names[4], sizeof names[4], "fa_variant_spans_kernel<64, 64>");
  const char *list[RTC_KERNELS] = {names[0], names[1]};
  int n = 2, at_dkdv = 0, at_dq = 0, at_spans = 0;
  if (fast) list[at_dkdv = n++] = names[2];
  if (fast && !adds_dq) list[at_dq = n++] = names[3];
  if (tiles) list[at_spans = n++] = names[4];
  const int64_t bounds[4] = {p->B, p->Hq, p->Lq, p->Lk};
  cudaKernel_t kern[RTC_KERNELS] = {NULL};
  fa_variant_problem vp;
  fault_records fr;
  char *src = NULL;
  st = variant_open(ctx, p, bounds, list, n, fast ? 3u : 0u, kern, &vp, &fr, &src); /* the SIMT ones: guards */
  free(src);
  variant_backward vb = {kern[at_dkdv], at_dq ? kern[at_dq] : NULL, kern[0], kern[1], &vp, ctas};
  void *temp = NULL;
  size_t temp_bytes = 0;
  if (!st && tiles) st = variant_bw_tiles(ctx, p, kern[at_spans], &vp, &temp, &temp_bytes);
  const fa_bw_kernels ks = {variant_bw_fast, variant_bw_simt, &vb};
  if (!st) st = fa_cuda_backward_run(ctx, kernel, p, g, &ks);
  if (temp) fa_cuda_free_on(ctx, temp, temp_bytes); /* stream-ordered: after the kernels */
  return faults_close(ctx, p, bounds, &fr, st);
}

/* fa.block_mask on the device (API §9): mask_mod over every pair of each
 * tile of Br x Bc, the spans kernel writing a state a tile into state
 * (host, B·H·nq·nk bytes); b and h are told apart only where the
 * expression uses them, the rest copied.  A read out of range is recorded
 * in e, for the caller's fa_expr_fault. */
extern "C" fa_status fa_cuda_block_mask(fa_context *ctx, const fa_expr *e, int64_t B, int64_t H, int64_t Lq,
                                        int64_t Lk, int64_t Br, int64_t Bc, uint8_t *state) {
  fa_attn_problem p;
  memset(&p, 0, sizeof p);
  p.B = B, p.Hq = p.Hkv = H, p.Lq = Lq, p.Lk = Lk, p.mask_mod = e;
  const int64_t bounds[4] = {B, H, Lq, Lk};
  int reads[2];
  fa_variant_problem vp;
  variant_problem(&p, &vp);
  char *src = variant_unit(&p, bounds, reads, &vp.va);
  if (!src) return fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: block_mask: out of host memory");
  char name[96];
  snprintf(name, sizeof name, "fa_variant_spans_kernel<%lld, %lld>", (long long)Br, (long long)Bc);
  const char *names[1] = {name};
  cudaKernel_t kern = NULL;
  fa_status st = fa_rtc_kernels(ctx, src, names, 1, 0u, &kern);
  free(src);
  if (st) return st;
  const long long nb = expr_uses(e, FA_X_B) ? B : 1, nh = expr_uses(e, FA_X_H) ? H : 1;
  const long long nq = (Lq + Br - 1) / Br, nk = (Lk + Bc - 1) / Bc, grid = nb * nh * nq;
  const size_t bytes = (size_t)(grid * nk);
  vp.va.spans_nq = nq;
  fault_records fr = {NULL, 0, {0, 0}};
  void *dev = NULL, *spans = NULL;
  const bool shared = nb < B || nh < H; /* some (b, h) share their tiles: copied on the host */
  uint8_t *host = shared ? (uint8_t *)malloc(bytes) : state;
  if (!host) st = fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: block_mask: out of host memory");
  if (!st) st = faults_open(ctx, reads, &vp, &fr);
  if (!st) st = fa_cuda_malloc(ctx, &dev, bytes);
  if (!st) st = attn_grid_fits(ctx, grid);
  if (!st) {
    void *args[] = {&vp, &spans, &dev, (void *)&nh};
    st = launch(ctx, kern, (unsigned)grid, FA_SPANS_THREADS, 0, args, "fa.block_mask");
  }
  if (!st) st = fa_cuda_memcpy(ctx, host, dev, bytes, FA_COPY_D2H);
  st = faults_close(ctx, &p, bounds, &fr, st);
  if (!st && shared)
    for (long long b = 0; b < B; b++)
      for (long long h = 0; h < H; h++)
        memcpy(state + (b * H + h) * nq * nk, host + ((nb > 1 ? b : 0) * nh + (nh > 1 ? h : 0)) * nq * nk,
               (size_t)(nq * nk));
  if (shared) free(host);
  if (dev) fa_cuda_free_on(ctx, dev, bytes);
  return st;
}
