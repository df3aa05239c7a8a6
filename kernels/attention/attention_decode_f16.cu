/* The decode kernel's f16 instances (attention_decode.cuh): a file a dtype,
 * so that the two compile side by side. */
#include "attention_decode.cuh"

template fa_status decode_launch<__half>(fa_context *, const fa_attn_problem *, decode_args &, int64_t);
