/* Kernel instances compiled at run time by NVRTC (variant_rtc.cu), for
 * the attention variants (attention_variant.cu): NVRTC opened on first use,
 * each instance a module of its own, found in memory, else on disk, else
 * compiled. */
#ifndef FA_KERNELS_ATTENTION_VARIANT_RTC_H
#define FA_KERNELS_ATTENTION_VARIANT_RTC_H

#include "common.cuh" /* fa_context, fa_status, fa_cuda_error, fa_cuda_device_props */

/* a call's instances: the forward's SIMT kernel, fast kernel and mask_mod's spans (if any); the backward's two
 * SIMT kernels, two tensor-core ones and the spans */
#define RTC_KERNELS 5

/* The kernels names[0..n) (n <= RTC_KERNELS) of the unit src for this
 * device into out: from memory, else from the disk, else compiled, the
 * missing ones side by side (NVRTC takes about a second an instance), and
 * stored on both.  Bit i of guards: names[i] is a guard (compiled for a
 * quick compile rather than speed: variant_rtc.cu's RTC_GUARD_OPTION). */
fa_status fa_rtc_kernels(fa_context *ctx, const char *src, const char *const *names, int n, unsigned guards,
                         cudaKernel_t *out);

/* Whether NVRTC compiles name of src for arch (guard: as fa_rtc_kernels
 * compiles a guard), the code dropped: the tests' check without a device. */
fa_status fa_rtc_compile_only(fa_context *ctx, const char *src, const char *arch, const char *name, bool guard);

#endif
