/* fa_device_info: what the backends report about their device. */
#include "internal.h"

#include <stdio.h>
#include <string.h>

static void cpu_name(char *buf, size_t n) {
  snprintf(buf, n, "cpu");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[256];
  while (fgets(line, sizeof line, f)) {
    char *colon = strchr(line, ':');
    if (strncmp(line, "model name", 10) == 0 && colon) {
      colon += 1 + (colon[1] == ' ');
      colon[strcspn(colon, "\n")] = 0;
      snprintf(buf, n, "%s", colon);
      break;
    }
  }
  fclose(f);
}

fa_status fa_device_info(fa_context *ctx, fa_device device, fa_device_info_t *out) {
  FA_NEED(ctx);
  FA_NEED(out);
  memset(out, 0, sizeof *out);
  if (device != FA_CPU && device != FA_CUDA)
    return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: device_info: device: expected cpu or cuda, got %d", (int)device);
  if (device == FA_CUDA) {
    if (!fa_cuda_available())
      return fa_fail(ctx, FA_ERR_DEVICE, "flashattn: device 'cuda' is not available (no usable GPU or no CUDA backend in this build)");
    snprintf(out->backend, sizeof out->backend, "cuda");
    return fa_cuda_device_info(ctx, out);
  }
  snprintf(out->backend, sizeof out->backend, "cpu");
  cpu_name(out->name, sizeof out->name);
  out->threads = fa_cpu_threads();
  snprintf(out->simd, sizeof out->simd, "%s", fa_cpu_simd());
  return FA_OK;
}
