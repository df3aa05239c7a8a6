/* Kernel instances compiled at run time by NVRTC (variant_rtc.h): the
 * attention variants' units (attention_variant.cu) with the kernels'
 * headers, held in the library (cmake/embed_sources.cmake).
 *
 * NVRTC is opened with dlopen on first use, so that the engine loads and
 * runs without it; its absence is an error of the variant calls alone.
 *
 * Compiled modules are cached by their whole key (the generated source,
 * the kernel instances, the GPU architecture, and a hash of the embedded
 * headers): in memory for the process, and on disk under
 * $FLASHATTN_CACHE_DIR (default $XDG_CACHE_HOME/flashattn, else
 * ~/.cache/flashattn; an empty value turns the disk cache off), a file a
 * key holding the key itself, so that a hash collision is a miss. */
#include "variant_rtc.h"

#include <dlfcn.h>
#include <errno.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

extern "C" {
extern const int fa_rtc_source_count;
extern const char *const fa_rtc_source_names[];
extern const char *const fa_rtc_source_texts[];
}

/* ---- NVRTC, opened on first use ---- */

typedef struct {
  int loaded; /* 0: not tried, 1: ready, -1: not found */
  nvrtcResult (*create)(nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *);
  nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
  nvrtcResult (*add_name)(nvrtcProgram, const char *);
  nvrtcResult (*lowered)(nvrtcProgram, const char *, const char **);
  nvrtcResult (*cubin_size)(nvrtcProgram, size_t *);
  nvrtcResult (*cubin)(nvrtcProgram, char *);
  nvrtcResult (*log_size)(nvrtcProgram, size_t *);
  nvrtcResult (*log)(nvrtcProgram, char *);
  nvrtcResult (*destroy)(nvrtcProgram *);
  const char *(*error)(nvrtcResult);
  nvrtcResult (*version)(int *, int *);
} nvrtc_api;

static nvrtc_api nvrtc;
static pthread_mutex_t rtc_lock = PTHREAD_MUTEX_INITIALIZER; /* NVRTC's loading and the module cache */

#define NVRTC_SYM(field, name)                                                                                         \
  if (!(*(void **)&nvrtc.field = dlsym(lib, name))) ok = 0

static fa_status nvrtc_open(fa_context *ctx) {
  if (nvrtc.loaded == 0) {
    const char *env = getenv("FLASHATTN_NVRTC");
    void *lib = dlopen(env && *env ? env : FA_NVRTC_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!lib && !(env && *env)) lib = dlopen("libnvrtc.so", RTLD_NOW | RTLD_LOCAL);
    int ok = lib != NULL;
    if (ok) {
      NVRTC_SYM(create, "nvrtcCreateProgram");
      NVRTC_SYM(compile, "nvrtcCompileProgram");
      NVRTC_SYM(add_name, "nvrtcAddNameExpression");
      NVRTC_SYM(lowered, "nvrtcGetLoweredName");
      NVRTC_SYM(cubin_size, "nvrtcGetCUBINSize");
      NVRTC_SYM(cubin, "nvrtcGetCUBIN");
      NVRTC_SYM(log_size, "nvrtcGetProgramLogSize");
      NVRTC_SYM(log, "nvrtcGetProgramLog");
      NVRTC_SYM(destroy, "nvrtcDestroyProgram");
      NVRTC_SYM(error, "nvrtcGetErrorString");
      NVRTC_SYM(version, "nvrtcVersion");
    }
    nvrtc.loaded = ok ? 1 : -1;
  }
  if (nvrtc.loaded == 1) return FA_OK;
  return fa_fail(ctx, FA_ERR_UNSUPPORTED,
                 "flashattn: opts.score_mod / opts.mask_mod on cuda: NVRTC (%s, part of the CUDA toolkit) could not be "
                 "loaded; put it on the library path or name it in FLASHATTN_NVRTC",
                 FA_NVRTC_LIBRARY);
}

/* ---- the module cache ---- */


/* One compiled kernel instance (a module of its own, so that the instances
 * of a call compile side by side and the SIMT one is shared by calls on
 * different fast kernels). */
typedef struct rtc_kernel {
  char *key;
  size_t keylen;
  cudaLibrary_t lib;
  cudaKernel_t kernel;
  struct rtc_kernel *next;
} rtc_kernel;

static rtc_kernel *compiled; /* the process's, never unloaded: queued launches may use them */

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
  const unsigned char *b = (const unsigned char *)p;
  for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
  return h;
}

/* A hash of the embedded headers: a build with other kernels has other keys. */
static uint64_t sources_hash(void) {
  uint64_t h = 14695981039346656037ull;
  for (int i = 0; i < fa_rtc_source_count; i++) {
    h = fnv1a(h, fa_rtc_source_names[i], strlen(fa_rtc_source_names[i]) + 1);
    h = fnv1a(h, fa_rtc_source_texts[i], strlen(fa_rtc_source_texts[i]) + 1);
  }
  return h;
}

/* The disk cache's folder (malloc'd), or NULL when it is off. */
static char *cache_dir(void) {
  const char *dir = getenv("FLASHATTN_CACHE_DIR");
  char *path = NULL;
  if (dir) {
    if (!*dir) return NULL;
    path = strdup(dir);
  } else {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    const char *base = xdg && *xdg ? xdg : home && *home ? home : NULL;
    if (!base) return NULL;
    const size_t n = strlen(base) + 32;
    if ((path = (char *)malloc(n))) snprintf(path, n, "%s%s/flashattn", base, xdg && *xdg ? "" : "/.cache");
  }
  return path;
}

/* mkdir -p, quietly: a cache that cannot be written is only a slower call. */
static void make_dirs(char *path) {
  for (char *c = path + 1; *c; c++)
    if (*c == '/') {
      *c = 0;
      (void)mkdir(path, 0755);
      *c = '/';
    }
  (void)mkdir(path, 0755);
}

static char *cache_file(const char *dir, uint64_t h) {
  const size_t n = strlen(dir) + 40;
  char *f = (char *)malloc(n);
  if (f) snprintf(f, n, "%s/%016llx.cubin", dir, (unsigned long long)h);
  return f;
}

static const char CACHE_MAGIC[8] = {'F', 'A', 'V', 'A', 'R', '0', '0', '2'};

/* A disk entry: the magic, the key (length, bytes), the lowered kernel
 * name (length, bytes), the cubin (length, bytes). */
static int read_blob(FILE *f, char **out, uint64_t *len, uint64_t max) {
  *out = NULL;
  if (fread(len, 8, 1, f) != 1 || *len > max || !(*out = (char *)malloc(*len + 1))) return 0;
  if (fread(*out, 1, *len, f) != *len) return 0;
  (*out)[*len] = 0;
  return 1;
}
static int write_blob(FILE *f, const void *p, uint64_t len) {
  return fwrite(&len, 8, 1, f) == 1 && fwrite(p, 1, len, f) == len;
}

/* The cached cubin of key (malloc'd, *size bytes) and its kernel's lowered
 * name (malloc'd) from the disk, or NULL. */
static char *disk_load(const char *key, size_t keylen, uint64_t h, char **lowered, size_t *size) {
  char *dir = cache_dir(), *file = dir ? cache_file(dir, h) : NULL, *stored = NULL, *cubin = NULL;
  FILE *f = file ? fopen(file, "rb") : NULL;
  char magic[8];
  uint64_t len = 0;
  int ok = f && fread(magic, 1, 8, f) == 8 && !memcmp(magic, CACHE_MAGIC, 8) && read_blob(f, &stored, &len, keylen) &&
           len == keylen && !memcmp(stored, key, keylen);
  ok = ok && read_blob(f, lowered, &len, 4096);
  ok = ok && read_blob(f, &cubin, &len, (uint64_t)1 << 32) && len > 0;
  if (f) fclose(f);
  free(stored), free(file), free(dir);
  if (ok) {
    *size = len;
    return cubin;
  }
  free(cubin);
  free(*lowered);
  *lowered = NULL;
  return NULL;
}

/* Writes an entry to the disk cache: a temporary file renamed into place. */
static void disk_store(const char *key, size_t keylen, uint64_t h, const char *lowered, const char *cubin,
                       size_t size) {
  char *dir = cache_dir(), *file = dir ? cache_file(dir, h) : NULL, *tmp = NULL;
  if (file) {
    make_dirs(dir);
    const size_t tn = strlen(file) + 32;
    if ((tmp = (char *)malloc(tn))) snprintf(tmp, tn, "%s.%ld.tmp", file, (long)getpid());
  }
  FILE *f = tmp ? fopen(tmp, "wb") : NULL;
  if (f) {
    int ok = fwrite(CACHE_MAGIC, 1, 8, f) == 8 && write_blob(f, key, keylen);
    ok = ok && write_blob(f, lowered, strlen(lowered));
    ok = ok && write_blob(f, cubin, size);
    if (fclose(f) == 0 && ok) (void)rename(tmp, file);
    else (void)unlink(tmp);
  }
  free(tmp), free(file), free(dir);
}

/* NVRTC's option for an instance that only guards the call (the SIMT
 * kernels behind fast ones, run only when V holds NaN or inf): a quicker
 * compile, so that the first call of a new expression waits for the fast
 * kernel alone (NVRTC 13.0, bf16, D = 128: the SIMT forward 1.25 s ->
 * 0.74 s here, 0.7-1.0 s on an H200 node beside the fast kernel's
 * 1.4-2.4 s).  Not -Ofc=mid or max (0.35-0.42 s): their code keeps a stack
 * (352 B, 3.8 KB a thread), and with max's every call of a variant took
 * 0.13-0.19 ms more on an H200, the guard returning at once.  An NVRTC
 * without -Ofc compiles the guard as the others. */
static const char RTC_GUARD_OPTION[] = "-Ofc=min";

/* A program of src with the instance name, compiled with opts[0..n). */
static nvrtcResult rtc_program(nvrtcProgram *prog, const char *src, const char *name, int n, const char *const *opts) {
  nvrtcResult r = nvrtc.create(prog, src, "flashattn_variant.cu", fa_rtc_source_count, fa_rtc_source_texts,
                               fa_rtc_source_names);
  if (r != NVRTC_SUCCESS) return r;
  r = nvrtc.add_name(*prog, name);
  return r == NVRTC_SUCCESS ? nvrtc.compile(*prog, n, opts) : r;
}

/* NVRTC: the cubin (malloc'd) of src for arch with the kernel instance
 * name (guard: RTC_GUARD_OPTION's), and its lowered name (malloc'd). */
static fa_status rtc_compile(fa_context *ctx, const char *src, const char *arch, const char *name, bool guard,
                             char **cubin, size_t *size, char **lowered) {
  const char *inc_env = getenv("FLASHATTN_CUDA_INCLUDE");
  char arch_opt[32], inc_opt[4096];
  snprintf(arch_opt, sizeof arch_opt, "-arch=%s", arch);
  snprintf(inc_opt, sizeof inc_opt, "-I%s", inc_env && *inc_env ? inc_env : FA_CUDA_INCLUDE_DIR);
  const char *opts[] = {arch_opt, "-std=c++17", "-default-device", "-w", inc_opt, RTC_GUARD_OPTION};
  const int nopts = (int)(sizeof opts / sizeof *opts) - (guard ? 0 : 1);
  nvrtcProgram prog = NULL;
  nvrtcResult r = rtc_program(&prog, src, name, nopts, opts);
  if (r == NVRTC_ERROR_INVALID_OPTION && guard) { /* an NVRTC before -Ofc: the guard as the others */
    nvrtc.destroy(&prog);
    prog = NULL;
    r = rtc_program(&prog, src, name, nopts - 1, opts);
  }
  if (!prog)
    return fa_fail(ctx, FA_ERR_BACKEND, "flashattn: opts.score_mod / opts.mask_mod: NVRTC: %s", nvrtc.error(r));
  fa_status st = FA_OK;
  if (r != NVRTC_SUCCESS) {
    size_t ln = 0;
    char *log = NULL;
    if (nvrtc.log_size(prog, &ln) == NVRTC_SUCCESS && (log = (char *)malloc(ln + 1)) &&
        nvrtc.log(prog, log) == NVRTC_SUCCESS)
      log[ln] = 0;
    else if (log)
      log[0] = 0;
    /* the log's first error: generated code that does not compile is the engine's bug */
    const char *first = log ? strstr(log, "error") : NULL;
    st = fa_fail(ctx, FA_ERR_BACKEND, "flashattn: opts.score_mod / opts.mask_mod: NVRTC could not compile the variant "
                                      "for %s (%s): %.300s",
                 arch, nvrtc.error(r), first ? first : log ? log : "no log");
    free(log);
  }
  const char *ln = NULL;
  if (!st && (nvrtc.lowered(prog, name, &ln) != NVRTC_SUCCESS || !ln || !(*lowered = strdup(ln))))
    st = fa_fail(ctx, FA_ERR_BACKEND, "flashattn: opts.score_mod: NVRTC lost the kernel %s", name);
  if (!st && (nvrtc.cubin_size(prog, size) != NVRTC_SUCCESS || !(*cubin = (char *)malloc(*size)) ||
              nvrtc.cubin(prog, *cubin) != NVRTC_SUCCESS))
    st = fa_fail(ctx, FA_ERR_BACKEND, "flashattn: opts.score_mod / opts.mask_mod: NVRTC gave no code for %s", arch);
  nvrtc.destroy(&prog);
  return st;
}

/* The cache key: the source, the instance, the arch, NVRTC's version, the
 * embedded headers' hash and whether it is a guard's compile (malloc'd). */
static char *kernel_key(const char *src, const char *arch, const char *name, bool guard, uint64_t headers,
                        size_t *len) {
  int major = 0, minor = 0;
  nvrtc.version(&major, &minor);
  const size_t cap = strlen(src) + strlen(name) + 256;
  char *key = (char *)malloc(cap);
  if (!key) return NULL;
  const int w = snprintf(key, cap, "%s\n// %s nvrtc %d.%d headers %016llx%s\n// %s", src, arch, major, minor,
                         (unsigned long long)headers, guard ? " guard" : "", name);
  *len = (size_t)w;
  return key;
}

/* One instance to find or compile (a thread of its own when compiled). */
typedef struct {
  const char *src, *name;
  const char *arch;
  bool guard;
  char *key, *cubin, *lowered;
  size_t keylen, size;
  uint64_t hash;
  fa_status st;
  fa_context err; /* the compile's error, copied to the caller's context */
} rtc_job;

static void *rtc_job_compile(void *arg) {
  rtc_job *j = (rtc_job *)arg;
  j->st = rtc_compile(&j->err, j->src, j->arch, j->name, j->guard, &j->cubin, &j->size, &j->lowered);
  if (!j->st) disk_store(j->key, j->keylen, j->hash, j->lowered, j->cubin, j->size);
  return NULL;
}

/* The job's cubin loaded into k. */
static cudaError_t rtc_load(const rtc_job *j, rtc_kernel *k) {
  cudaError_t err = cudaLibraryLoadData(&k->lib, j->cubin, NULL, NULL, 0, NULL, NULL, 0);
  return err == cudaSuccess ? cudaLibraryGetKernel(&k->kernel, k->lib, j->lowered) : err;
}

/* The kernels names[0..n) of src for this device: from memory, else from
 * the disk, else compiled, the missing ones side by side (NVRTC takes
 * about a second an instance), and stored on both.  Bit i of guards: the
 * instance names[i] is a guard (RTC_GUARD_OPTION). */
fa_status fa_rtc_kernels(fa_context *ctx, const char *src, const char *const *names, int n, unsigned guards,
                         cudaKernel_t *out) {
  fa_cuda_props dp;
  if (fa_status pst = fa_cuda_device_props(ctx, &dp)) return pst;
  char arch[16];
  snprintf(arch, sizeof arch, "sm_%d%d%s", dp.cc_major, dp.cc_minor, dp.cc_major == 9 ? "a" : ""); /* wgmma: sm_90a */
  rtc_job jobs[RTC_KERNELS];
  memset(jobs, 0, sizeof jobs);
  pthread_t threads[RTC_KERNELS];
  int started[RTC_KERNELS] = {0};
  pthread_mutex_lock(&rtc_lock); /* held throughout: one caller compiles a key, the others then find it */
  fa_status st = nvrtc_open(ctx);
  static uint64_t headers = 0; /* constant-initialised; set under the lock */
  if (!st && !headers) headers = sources_hash();
  for (int i = 0; !st && i < n; i++) {
    rtc_job *j = &jobs[i];
    j->src = src, j->name = names[i], j->arch = arch, j->guard = (guards >> i) & 1;
    if (!(j->key = kernel_key(src, arch, names[i], j->guard, headers, &j->keylen))) {
      st = fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: opts.score_mod: out of host memory");
      break;
    }
    out[i] = NULL;
    for (rtc_kernel *k = compiled; k; k = k->next)
      if (k->keylen == j->keylen && !memcmp(k->key, j->key, j->keylen)) out[i] = k->kernel;
    if (out[i]) continue;
    j->hash = fnv1a(14695981039346656037ull, j->key, j->keylen);
    j->cubin = disk_load(j->key, j->keylen, j->hash, &j->lowered, &j->size);
    if (!j->cubin) started[i] = pthread_create(&threads[i], NULL, rtc_job_compile, j) == 0;
    if (!j->cubin && !started[i]) rtc_job_compile(j); /* no thread to be had: here */
  }
  for (int i = 0; i < n; i++)
    if (started[i]) pthread_join(threads[i], NULL);
  for (int i = 0; !st && i < n; i++) {
    rtc_job *j = &jobs[i];
    if (out[i]) continue;
    if (j->st) {
      st = fa_fail(ctx, j->st, "%s", j->err.error);
      break;
    }
    rtc_kernel *k = (rtc_kernel *)calloc(1, sizeof *k);
    if (!k) {
      st = fa_fail(ctx, FA_ERR_OUT_OF_MEMORY, "flashattn: opts.score_mod: out of host memory");
      break;
    }
    cudaError_t err = rtc_load(j, k);
    if (err != cudaSuccess && !started[i]) { /* a disk entry that does not load (damaged): compiled again */
      (void)cudaGetLastError();
      free(j->cubin), free(j->lowered);
      j->cubin = j->lowered = NULL;
      rtc_job_compile(j);
      err = j->st ? cudaErrorInvalidSource : rtc_load(j, k);
    }
    if (j->st) {
      st = fa_fail(ctx, j->st, "%s", j->err.error);
      free(k);
      break;
    }
    if (err != cudaSuccess) {
      st = fa_cuda_error(ctx, err, "loading a compiled variant");
      free(k);
      break;
    }
    k->key = j->key, k->keylen = j->keylen, j->key = NULL;
    k->next = compiled, compiled = k;
    out[i] = k->kernel;
  }
  pthread_mutex_unlock(&rtc_lock);
  for (int i = 0; i < RTC_KERNELS; i++) free(jobs[i].key), free(jobs[i].cubin), free(jobs[i].lowered);
  return st;
}

fa_status fa_rtc_compile_only(fa_context *ctx, const char *src, const char *arch, const char *name, bool guard) {
  pthread_mutex_lock(&rtc_lock);
  fa_status st = nvrtc_open(ctx);
  pthread_mutex_unlock(&rtc_lock);
  char *cubin = NULL, *lowered = NULL;
  size_t size = 0;
  if (!st) st = rtc_compile(ctx, src, arch, name, guard, &cubin, &size, &lowered);
  free(cubin), free(lowered);
  return st;
}
