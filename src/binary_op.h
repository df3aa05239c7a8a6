/* The element operation of fa_tensor_binary, written once for the CPU
 * (src/tensor_data.c) and cuda (kernels/tensor/tensor_ops.cu): in f64, the
 * result rounded to the output's dtype by the caller. */
#ifndef FA_BINARY_OP_H
#define FA_BINARY_OP_H

#include <math.h>

#include "flashattn.h"
#include "host_device.h"

FA_HOST_DEVICE static inline double fa_binary_apply(int op, double x, double y) {
  switch (op) {
  case FA_BIN_ADD: return x + y;
  case FA_BIN_SUB: return x - y;
  case FA_BIN_MUL: return x * y;
  case FA_BIN_DIV: return x / y;
  case FA_BIN_RSUB: return y - x; /* a number on the left: s - t */
  case FA_BIN_RDIV: return y / x; /* s / t */
  }
  return NAN;
}

#endif
