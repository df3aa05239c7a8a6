/* The one template-like device of the CPU attention code: includes the
 * file named by FA_IMPL twice, for f32 and for f64, with
 *   REAL         float / double (the compute and accumulation type)
 *   FA_R(name)   name_f32 / name_f64
 *   FA_EXP, FA_TANH, FA_LOG   the matching math (FA_EXP vectorises for f32)
 *   FA_GEMM      fa_gemm_f32 / fa_gemm_f64 (attention_algos.h)
 * and undefines them afterwards. */
#ifndef FA_IMPL
#error "define FA_IMPL before including attention_instantiate.h"
#endif

#include "cpu/fast_exp.h"

#include <math.h>
#include <string.h>

#define REAL float
#define FA_R(name) name##_f32
#define FA_EXP fa_expf_fast
#define FA_TANH tanhf
#define FA_LOG logf
#define FA_GEMM fa_gemm_f32
#include FA_IMPL
#undef REAL
#undef FA_R
#undef FA_EXP
#undef FA_TANH
#undef FA_LOG
#undef FA_GEMM

#define REAL double
#define FA_R(name) name##_f64
#define FA_EXP exp
#define FA_TANH tanh
#define FA_LOG log
#define FA_GEMM fa_gemm_f64
#include FA_IMPL
#undef REAL
#undef FA_R
#undef FA_EXP
#undef FA_TANH
#undef FA_LOG
#undef FA_GEMM

#undef FA_IMPL
