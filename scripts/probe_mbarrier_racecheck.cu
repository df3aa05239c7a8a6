// Whether compute-sanitizer's racecheck takes mbarrier arrive/wait as ordering: the protocol of the
// warp-specialised attention kernel's slot ring (attention_wgmma_tma.cuh: wt_post_slot and the
// consumers' reads), reduced to two warps.  Lane 0 of warp 0 writes a shared slot and arrives on `full`
// (count 1); every lane of warp 1 waits on it and reads the slot, then (after __syncwarp) lane 0
// arrives on `empty`, which warp 0 waits on before it writes the slot again; four rounds.  Correct
// under the PTX memory model (it prints 1 8 15 22).  racecheck 2025.3.1 on an H200 reports the reads
// against the next round's writes (3 hazards): it does not see mbarrier ordering, so that the
// kernel's 48 hazards of the same pair of lines are the same report
// (docs/perf/2026-11-30-racecheck-mbarrier-h200.json).
// Usage (GPU machine): nvcc -arch=sm_90a -lineinfo scripts/probe_mbarrier_racecheck.cu -o /tmp/mbr &&
//   compute-sanitizer --tool racecheck /tmp/mbr
#include <cstdio>
#include <cstdint>
__device__ __forceinline__ uint32_t sa(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void init(uint64_t *b, int n) { asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(sa(b)), "r"(n)); }
__device__ __forceinline__ void arrive(uint64_t *b) { asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" :: "r"(sa(b)) : "memory"); }
__device__ __forceinline__ void wait(uint64_t *b, int parity) {
  asm volatile("{ .reg .pred p; W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1; @!p bra W; }" :: "r"(sa(b)), "r"(parity) : "memory");
}
__global__ void k(int *out, int mode) {
  __shared__ uint64_t full, empty;
  __shared__ int slot;
  if (threadIdx.x == 0) { init(&full, 1); init(&empty, 1); asm volatile("fence.mbarrier_init.release.cluster;"); }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int n = 0; n < 4; n++) {
    if (warp == 0 && lane == 0) {
      if (n > 0) wait(&empty, (n - 1) & 1);
      slot = n * 7 + 1;
      arrive(&full);
    } else if (warp == 1) {
      if (mode == 1 || lane == 0) wait(&full, n & 1);
      const int v = slot;
      __syncwarp();
      if (lane == 0) { out[n] = v; arrive(&empty); }
    }
  }
}
int main() {
  int *d; cudaMalloc(&d, 16);
  k<<<1, 64>>>(d, 1);
  int h[4]; cudaMemcpy(h, d, 16, cudaMemcpyDeviceToHost);
  printf("%d %d %d %d %s\n", h[0], h[1], h[2], h[3], cudaGetErrorString(cudaGetLastError()));
  return 0;
}
