/* The registry of attention kernels (API §6): see attn_kernels.h.  The
 * CUDA entries ask kernels/ what their kernels take
 * (fa_cuda_attention_kernel_fit); the CPU entries take every call of
 * their algo. */
#include "attn_kernels.h"

#include <stdio.h>
#include <string.h>

#define ALGO(a) (1u << (a))
#define FLASH_OR_TWO_PASS (ALGO(FA_ATTN_FLASH) | ALGO(FA_ATTN_TWO_PASS))

const fa_attn_kernel_info fa_attn_kernel_table[FA_KERNEL_COUNT] = {
    [FA_KERNEL_DECODE] = {"decode", FA_CUDA, ALGO(FA_ATTN_FLASH), FA_ATTN_FLASH},
    [FA_KERNEL_WGMMA_TMA] = {"wgmma_tma", FA_CUDA, ALGO(FA_ATTN_FLASH), FA_ATTN_FLASH},
    [FA_KERNEL_WGMMA] = {"wgmma", FA_CUDA, FLASH_OR_TWO_PASS, FA_ATTN_FLASH},
    [FA_KERNEL_MMA] = {"mma", FA_CUDA, FLASH_OR_TWO_PASS, FA_ATTN_FLASH},
    [FA_KERNEL_F32] = {"f32", FA_CUDA, FLASH_OR_TWO_PASS, FA_ATTN_FLASH},
    [FA_KERNEL_SIMT] = {"simt", FA_CUDA, FLASH_OR_TWO_PASS, FA_ATTN_FLASH},
    [FA_KERNEL_NAIVE] = {"naive", FA_CUDA, ALGO(FA_ATTN_NAIVE), FA_ATTN_NAIVE},
    [FA_KERNEL_ROW] = {"row", FA_CUDA, ALGO(FA_ATTN_FLASH_ROW), FA_ATTN_FLASH_ROW},
    [FA_KERNEL_WGMMA_FP8] = {"wgmma_fp8", FA_CUDA, ALGO(FA_ATTN_FLASH), FA_ATTN_FLASH, 1},
    [FA_KERNEL_CPU_FLASH] = {"cpu_flash", FA_CPU, ALGO(FA_ATTN_FLASH), FA_ATTN_FLASH},
    [FA_KERNEL_CPU_TWO_PASS] = {"cpu_two_pass", FA_CPU, ALGO(FA_ATTN_TWO_PASS), FA_ATTN_TWO_PASS},
    [FA_KERNEL_CPU_NAIVE] = {"cpu_naive", FA_CPU, ALGO(FA_ATTN_NAIVE), FA_ATTN_NAIVE},
    [FA_KERNEL_CPU_FLASH_ROW] = {"cpu_flash_row", FA_CPU, ALGO(FA_ATTN_FLASH_ROW), FA_ATTN_FLASH_ROW},
};

static const char *const algo_names[] = {"auto", "naive", "two_pass", "flash_row", "flash"};

fa_attn_kernel fa_attn_kernel_find(const char *name) {
  for (int k = 0; name && k < FA_KERNEL_COUNT; k++)
    if (strcmp(name, fa_attn_kernel_table[k].name) == 0) return (fa_attn_kernel)k;
  return FA_KERNEL_AUTO;
}

/* The CUDA kernels' rules past device and algo. */
static const char *cuda_refuses(fa_attn_kernel k, const fa_attn_dims *d, int64_t tq, int64_t tk, int64_t *br,
                                int64_t *bc, char *buf, size_t n) {
  if (d->dtype == FA_F64) return "f64 inputs; kernels on cuda take f32, f16 or bf16";
  if (d->variant && k != FA_KERNEL_WGMMA_TMA && k != FA_KERNEL_WGMMA && k != FA_KERNEL_MMA && k != FA_KERNEL_SIMT)
    return "opts.score_mod / opts.mask_mod: it has no variant hook (wgmma_tma, wgmma, mma and simt have)";
  if (k == FA_KERNEL_NAIVE) return NULL;
  if (k == FA_KERNEL_ROW && d->Dv > 256) {
    snprintf(buf, n, "Dv = %lld, above 256", (long long)d->Dv);
    return buf;
  }
  if (k == FA_KERNEL_ROW) return NULL;
  if (k == FA_KERNEL_DECODE) {
    if (!fa_cuda_attention_decode_fit(d->dtype, d->D, d->Dv, d->Hq, d->Hkv, d->Lq, buf, n)) return buf;
    if (tq) return "opts.tile: it has no tile option (its key tiles are 64 keys; opts.splits cuts the keys)";
    return NULL;
  }
  /* the flash kernels' entries (kernels/attention/attention_registry.cu) */
  int64_t def_br = 0, def_bc = 0;
  if (!fa_cuda_attention_kernel_fit(k, d->dtype, d->D, d->Dv, &def_br, &def_bc, buf, n)) return buf;
  if (tq && !fa_cuda_attention_kernel_tile_ok(k, d->D, tq, tk)) {
    snprintf(buf, n, "opts.tile {%lld, %lld} is not one of its tiles; its default is {%lld, %lld}", (long long)tq,
             (long long)tk, (long long)def_br, (long long)def_bc);
    return buf;
  }
  *br = tq ? tq : def_br, *bc = tq ? tk : def_bc;
  return NULL;
}

const char *fa_attn_kernel_refuses(fa_attn_kernel k, const fa_attn_dims *d, fa_attention_algo algo, int64_t tq,
                                   int64_t tk, int64_t *br, int64_t *bc, char *buf, size_t n) {
  const fa_attn_kernel_info *e = &fa_attn_kernel_table[k];
  *br = *bc = 0;
  if (d->device != e->device) {
    snprintf(buf, n, "%s tensors; it runs on %s", fa_device_name(d->device), fa_device_name(e->device));
    return buf;
  }
  if (algo != FA_ATTN_AUTO && !(e->algos & ALGO(algo))) {
    snprintf(buf, n, "algo %s; it implements %s%s", algo_names[algo], algo_names[e->algo],
             e->algos & ALGO(FA_ATTN_TWO_PASS) && e->algo != FA_ATTN_TWO_PASS ? " and two_pass" : "");
    return buf;
  }
  if (e->device == FA_CUDA) return cuda_refuses(k, d, tq, tk, br, bc, buf, n);
  if (k == FA_KERNEL_CPU_FLASH || k == FA_KERNEL_CPU_TWO_PASS) *br = tq, *bc = tk; /* 0: the backend's default */
  return NULL;
}

int fa_attn_kernels_accepting(const fa_attn_dims *d, fa_attention_algo algo, int64_t tq, int64_t tk,
                              const fa_attn_problem *call, int rows_dense, const char **names, int cap) {
  int count = 0, ids[FA_KERNEL_COUNT];
  char buf[160];
  int64_t br, bc;
  for (int k = 0; k < FA_KERNEL_COUNT; k++)
    if (!fa_attn_kernel_refuses((fa_attn_kernel)k, d, algo, tq, tk, &br, &bc, buf, sizeof buf) &&
        (!fa_attn_kernel_table[k].listed_when_named || d->kernel == k))
      ids[count++] = k;
  /* a kernel that leaves the call to the next when choosing (registry
   * order, fastest first, but for that) comes after it */
  for (int i = 0; call && i + 1 < count; i++)
    if (fa_attn_kernel_table[ids[i]].device == FA_CUDA &&
        fa_cuda_attention_kernel_declines((fa_attn_kernel)ids[i], call, rows_dense)) {
      const int t = ids[i];
      ids[i] = ids[i + 1], ids[i + 1] = t, i++;
    }
  /* the CPU's naive (S materialised, products by BLAS) runs ahead of two_pass (Q·Kᵀ twice) while a
   * head's scores stay near the caches: on 2 cores, Lq·Lk = 1M 13 against 26 ms, 4M about even, 16M 83
   * against 37 ms (D = 64-128, 2026-11-30) */
  for (int i = 0; i + 1 < count; i++)
    if (ids[i] == FA_KERNEL_CPU_TWO_PASS && ids[i + 1] == FA_KERNEL_CPU_NAIVE && d->Lq * d->Lk <= ((int64_t)4 << 20)) {
      ids[i] = FA_KERNEL_CPU_NAIVE, ids[i + 1] = FA_KERNEL_CPU_TWO_PASS;
      break;
    }
  for (int i = 0; i < count && i < cap; i++) names[i] = fa_attn_kernel_table[ids[i]].name;
  return count;
}

int fa_attn_decode_takes(const fa_attn_dims *d, const fa_attention_opts *o) {
  char buf[160];
  int64_t br, bc;
  if (d->device != FA_CUDA || d->algo != FA_ATTN_FLASH || d->variant) return 0;
  if (d->kernel == FA_KERNEL_DECODE) return 1;
  if (d->kernel != FA_KERNEL_AUTO || o->tile_q || o->tile_k) return 0;
  return !fa_attn_kernel_refuses(FA_KERNEL_DECODE, d, FA_ATTN_FLASH, 0, 0, &br, &bc, buf, sizeof buf);
}
