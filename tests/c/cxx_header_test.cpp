// flashattn.h as C++ (tests/header_test.cmake compiles this with
// -std=c++11 -Wall -Wextra -pedantic -Werror, links libflashattn and runs
// it): the declarations have C linkage, the types and macros are valid C++.
#include "flashattn.h"
#include "flashattn.h" // the include guard

#include <cstdio>
#include <cstring>

static_assert(FA_OK == 0, "FA_OK is 0");
static_assert(FA_VERSION_MAJOR >= 0 && FA_VERSION_MINOR >= 0 && FA_VERSION_PATCH >= 0, "version numbers");

int main() {
  if (std::strcmp(fa_version(), FA_VERSION) != 0) {
    std::fprintf(stderr, "cxx_header_test: fa_version() %s, FA_VERSION %s\n", fa_version(), FA_VERSION);
    return 1;
  }
  fa_context *ctx = nullptr;
  if (fa_context_create(FA_CPU, &ctx) != FA_OK) return 1;
  const int64_t shape[2] = {2, 3};
  fa_tensor *t = nullptr;
  fa_status st = fa_tensor_empty(ctx, 2, shape, FA_F32, FA_CPU, &t);
  if (st == FA_OK) st = fa_tensor_fill(ctx, t, 1.5);
  double sum = 0;
  if (st == FA_OK) st = fa_tensor_reduce(ctx, t, FA_REDUCE_SUM, &sum);
  fa_attention_opts ao;
  fa_attention_opts_init(&ao);
  fa_softmax_opts so;
  fa_softmax_opts_init(&so);
  fa_matmul_opts mo;
  fa_matmul_opts_init(&mo);
  fa_device_info_t info;
  std::memset(&info, 0, sizeof info);
  fa_tensor_release(t);
  fa_context_destroy(ctx);
  if (st != FA_OK || sum != 9.0 || ao.algo != FA_ATTN_AUTO || so.algo != FA_SOFTMAX_AUTO ||
      mo.algo != FA_MATMUL_AUTO || fa_dtype_size(FA_BF16) != 2 || fa_tensor_ndim(nullptr) != 0 ||
      fa_tensor_dtype(nullptr) != FA_DTYPE_NONE || std::strcmp(fa_dtype_name(FA_F16), "f16") != 0) {
    std::fprintf(stderr, "cxx_header_test: unexpected results (status %s, sum %g)\n", fa_status_name(st), sum);
    return 1;
  }
  std::printf("cxx_header_test: OK: flashattn %s from C++ (%ld)\n", fa_version(), static_cast<long>(__cplusplus));
  return 0;
}
