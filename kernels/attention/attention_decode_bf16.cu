/* The decode kernel's bf16 instances (attention_decode.cuh): a file a dtype,
 * so that the two compile side by side. */
#include "attention_decode.cuh"

template fa_status decode_launch<__nv_bfloat16>(fa_context *, const fa_attn_problem *, decode_args &, int64_t);
