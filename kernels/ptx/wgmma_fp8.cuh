/* Hopper warpgroup MMA on e4m3 (FP8) operands, f32 accumulators: the
 * m64n128k32 shape the FP8 attention kernel takes (attention_fp8.cuh).
 * 8-bit operands must be K-major in shared memory (no transposed form), so
 * V comes in as Vᵀ.  wgmma_e4m3_ss: A and B from shared memory
 * (descriptors); wgmma_e4m3_rs: A from registers (four .b32 a thread, four
 * e4m3 each: rows g and g + 8 of the warp's 16, k 4t..4t+3 and 16+4t..;
 * the lowest k in the lowest byte).  scale_d = 0 overwrites the
 * accumulators, 1 adds to them.  e4m3x4: four f32 rounded to nearest
 * (even) e4m3, saturated to ±448 (NaN stays NaN), a in the lowest byte. */
#ifndef FA_KERNELS_WGMMA_FP8_CUH
#define FA_KERNELS_WGMMA_FP8_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

#define FA_WGMMA_E4M3_D64                                                                                              \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, "   \
  "%24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, " \
  "%47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FA_WGMMA_E4M3_OUT                                                                                              \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),          \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),           \
      "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),          \
      "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]),          \
      "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]),          \
      "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),          \
      "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),          \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

static __device__ __forceinline__ void wgmma_e4m3_ss(float *d, uint64_t a, uint64_t b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FA_WGMMA_E4M3_D64 ", %64, %65, p, 1, 1;\n}\n"
               : FA_WGMMA_E4M3_OUT
               : "l"(a), "l"(b), "r"(scale_d));
}

static __device__ __forceinline__ void wgmma_e4m3_rs(float *d, const uint32_t *a, uint64_t b, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " FA_WGMMA_E4M3_D64
               ", {%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
               : FA_WGMMA_E4M3_OUT
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));
}

#undef FA_WGMMA_E4M3_D64
#undef FA_WGMMA_E4M3_OUT

#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
static __device__ __forceinline__ uint32_t e4m3x4(float a, float b, float c, float d) {
  uint32_t r; /* cvt's first source goes to the high byte of its pair */
  asm("{\n.reg .b16 lo, hi;\ncvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\ncvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
      "mov.b32 %0, {lo, hi};\n}" : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
  return r;
}
#endif

#endif
