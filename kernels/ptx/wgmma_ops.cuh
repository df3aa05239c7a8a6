/* Hopper warpgroup MMA (wgmma, sm_90a) for the attention kernel: D += A·B
 * over m64nNk16 with f32 accumulators, issued asynchronously by the
 * warpgroup's 128 threads.  Written out per shape and dtype (the operand
 * lists must be literal): wgmma_ss takes A and B from shared memory
 * (descriptors, both K-major); wgmma_ss_tt the same with both stored
 * M/N-major (transposed: a tile whose rows run along K); wgmma_rs_tb takes A from registers and B
 * from shared memory stored N-major (transposed, as V is), wgmma_rs the same
 * with B K-major (as K is: the decode kernel's Q in registers times Kᵀ).  scale_d = 0
 * ignores what the accumulators held (D = A·B), 1 adds to it. */
#ifndef FA_KERNELS_WGMMA_OPS_CUH
#define FA_KERNELS_WGMMA_OPS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

template <typename T, int N> static __device__ __forceinline__ void wgmma_ss(float *d, uint64_t a, uint64_t b, int scale_d);
template <typename T, int N> static __device__ __forceinline__ void wgmma_rs_tb(float *d, const uint32_t *a, uint64_t b, int scale_d);
template <typename T, int N> static __device__ __forceinline__ void wgmma_rs(float *d, const uint32_t *a, uint64_t b, int scale_d);
template <typename T, int N> static __device__ __forceinline__ void wgmma_ss_tt(float *d, uint64_t a, uint64_t b, int scale_d);

/* One body per shape, the dtype (T, and TY its PTX name) a macro argument. */
#define WGMMA_SS_N128(T, TY, FN, TR) \
template <> __device__ __forceinline__ void FN<T, 128>(float *d, uint64_t a, uint64_t b, int scale_d) { \
  asm volatile("{\n" \
               ".reg .pred p;\n" \
               "setp.ne.b32 p, %66, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, " TR ";\n" \
               "}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
               : "l"(a), "l"(b), "r"(scale_d)); \
}
#define WGMMA_SS_N176(T, TY, FN, TR) \
template <> __device__ __forceinline__ void FN<T, 176>(float *d, uint64_t a, uint64_t b, int scale_d) { \
  asm volatile("{\n" \
               ".reg .pred p;\n" \
               "setp.ne.b32 p, %90, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n176k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, " TR ";\n" \
               "}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]) \
               : "l"(a), "l"(b), "r"(scale_d)); \
}
#define WGMMA_SS_N80(T, TY, FN, TR) \
template <> __device__ __forceinline__ void FN<T, 80>(float *d, uint64_t a, uint64_t b, int scale_d) { \
  asm volatile("{\n" \
               ".reg .pred p;\n" \
               "setp.ne.b32 p, %42, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n80k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39}, %40, %41, p, 1, 1, " TR ";\n" \
               "}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]) \
               : "l"(a), "l"(b), "r"(scale_d)); \
}
#define WGMMA_SS_N64(T, TY, FN, TR) \
template <> __device__ __forceinline__ void FN<T, 64>(float *d, uint64_t a, uint64_t b, int scale_d) { \
  asm volatile("{\n" \
               ".reg .pred p;\n" \
               "setp.ne.b32 p, %34, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, " TR ";\n" \
               "}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
               : "l"(a), "l"(b), "r"(scale_d)); \
}
#define WGMMA_SS_N32(T, TY, FN, TR) \
template <> __device__ __forceinline__ void FN<T, 32>(float *d, uint64_t a, uint64_t b, int scale_d) { \
  asm volatile("{\n" \
               ".reg .pred p;\n" \
               "setp.ne.b32 p, %18, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, " TR ";\n" \
               "}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]) \
               : "l"(a), "l"(b), "r"(scale_d)); \
}
#define WGMMA_RS_N64(T, TY, FN, TB) \
template <> __device__ __forceinline__ void FN<T, 64>(float *d, const uint32_t *a, uint64_t b, int scale_d) { \
  asm volatile("{\n" \
               ".reg .pred p;\n" \
               "setp.ne.b32 p, %37, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, " TB ";\n" \
               "}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d)); \
}
#define WGMMA_RS_N128(T, TY, FN, TB) \
template <> __device__ __forceinline__ void FN<T, 128>(float *d, const uint32_t *a, uint64_t b, int scale_d) { \
  asm volatile("{\n" \
               ".reg .pred p;\n" \
               "setp.ne.b32 p, %69, 0;\n" \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " " \
               "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, " TB ";\n" \
               "}\n" \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]) \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d)); \
}
WGMMA_SS_N128(__half, "f16", wgmma_ss, "0, 0")
WGMMA_SS_N128(__nv_bfloat16, "bf16", wgmma_ss, "0, 0")
WGMMA_SS_N128(__half, "f16", wgmma_ss_tt, "1, 1")
WGMMA_SS_N128(__nv_bfloat16, "bf16", wgmma_ss_tt, "1, 1")
WGMMA_SS_N176(__half, "f16", wgmma_ss, "0, 0")
WGMMA_SS_N176(__nv_bfloat16, "bf16", wgmma_ss, "0, 0")
WGMMA_SS_N80(__half, "f16", wgmma_ss, "0, 0")
WGMMA_SS_N80(__nv_bfloat16, "bf16", wgmma_ss, "0, 0")
WGMMA_SS_N64(__half, "f16", wgmma_ss, "0, 0")
WGMMA_SS_N64(__nv_bfloat16, "bf16", wgmma_ss, "0, 0")
WGMMA_SS_N64(__half, "f16", wgmma_ss_tt, "1, 1")
WGMMA_SS_N64(__nv_bfloat16, "bf16", wgmma_ss_tt, "1, 1")
WGMMA_SS_N32(__half, "f16", wgmma_ss_tt, "1, 1")
WGMMA_SS_N32(__nv_bfloat16, "bf16", wgmma_ss_tt, "1, 1")
WGMMA_RS_N64(__half, "f16", wgmma_rs_tb, "1")
WGMMA_RS_N64(__nv_bfloat16, "bf16", wgmma_rs_tb, "1")
WGMMA_RS_N64(__half, "f16", wgmma_rs, "0")
WGMMA_RS_N64(__nv_bfloat16, "bf16", wgmma_rs, "0")
WGMMA_RS_N128(__half, "f16", wgmma_rs_tb, "1")
WGMMA_RS_N128(__nv_bfloat16, "bf16", wgmma_rs_tb, "1")
WGMMA_RS_N128(__half, "f16", wgmma_rs, "0")
WGMMA_RS_N128(__nv_bfloat16, "bf16", wgmma_rs, "0")
#undef WGMMA_SS_N128
#undef WGMMA_SS_N176
#undef WGMMA_SS_N64
#undef WGMMA_SS_N32
#undef WGMMA_RS_N64
#undef WGMMA_RS_N128
static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N> static __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Keeps the compiler from moving accesses to accumulator registers across
 * the asynchronous MMA's issue and wait. */
template <int N> static __device__ __forceinline__ void wgmma_hold(float *d) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* cp.async writes shared memory through the generic proxy; wgmma reads it
 * through the async proxy. */
static __device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* v, which every lane of the warp holds, as ptxas can see it is: read
 * through a shuffle from lane 0.  A wgmma descriptor made from a base that
 * ptxas keeps in a per-thread register (threadIdx, a stage index) came
 * back to the uniform datapath by R2UR at every use (16 a key tile in the
 * D = 128 forward, 24 in the decode kernel; scripts/cubin_loops.py); made
 * from this, it is made there. */
static __device__ __forceinline__ uint32_t warp_uniform(uint32_t v) { return __shfl_sync(0xffffffffu, v, 0); }
/* This thread's warpgroup, warp-uniform (warp_uniform). */
static __device__ __forceinline__ int warpgroup_uniform() { return (int)warp_uniform(threadIdx.x >> 7); }

/* A shared memory matrix descriptor for the 128-byte swizzle: rows of
 * 128 bytes, XOR-swizzled in 16-byte chunks by (row % 8), 8-row groups
 * 1024 bytes apart (sbo); lbo is the stride between 64-element column
 * blocks (N-major operands only). */
static __device__ __forceinline__ uint64_t wgmma_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFF) >> 4) | (uint64_t)((lbo >> 4) & 0x3FFF) << 16 |
         (uint64_t)((sbo >> 4) & 0x3FFF) << 32 | (uint64_t)1 << 62;
}
/* The descriptor of the operand `bytes` (a multiple of 16) past desc's:
 * one 32-bit add in the start-address field (bits 0-13, the address / 16),
 * which cannot carry out of it (shared addresses stay below 2^18).  A
 * product's k-steps take their descriptors this way from one made once:
 * made afresh, each took an add, a mask, a shift and an or (the D = 64
 * forward spent ~40 instructions a key tile there, H200 ncu). */
static __device__ __forceinline__ uint64_t wgmma_desc_add(uint64_t desc, uint32_t bytes) {
  return (desc >> 32) << 32 | (uint32_t)((uint32_t)desc + (bytes >> 4));
}

/* acc = A·Bᵀ over K (K / 16 k-steps): A in registers (a[ks]: the warp's 16
 * rows as the A fragments of k-step ks), B the N rows of a K-major tile at
 * b_base in that swizzle (k-step ks reads 32 bytes into the 128-byte rows
 * of column block ks / 4, blocks N rows long).  Issued, not fenced or
 * committed: the tensor cores read only B from shared memory. */
template <typename T, int K, int N>
static __device__ __forceinline__ void wgmma_rs_kmajor(float *acc, const uint32_t (*a)[4], uint32_t b_base) {
  const uint64_t b = wgmma_desc(b_base, 16, 1024);
#pragma unroll
  for (int ks = 0; ks < K / 16; ks++) wgmma_rs<T, N>(acc, a[ks], wgmma_desc_add(b, (ks >> 2) * N * 128 + (ks & 3) * 32), ks > 0);
}

#endif
#endif
