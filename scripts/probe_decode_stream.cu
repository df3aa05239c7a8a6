/* Probe (issue 24): how fast a decode-shaped stream of K and V reads, and what moves it.  Blocks of
 * 128 threads, as attn_decode_kernel's, read (head, chunk) items of 64-row tiles (16 KB of K and 16 KB of
 * V, D = 128, bf16) by cp.async three tiles deep, one barrier a tile, the copy of tile t + 2 issued after
 * it; no attention, a sum of a few words a tile so that the reads are used.  Timed with events behind a
 * 256 MiB memset (the benchmark's flush), the median of 15; each block's start and end from %globaltimer.
 * Configurations, per shape (heads x keys):
 *   static      one chunk a block, the decode kernel's count (two blocks an SM)
 *   static1sm   one block an SM
 *   dyn xN      N times as many chunks, taken from a counter by resident blocks (an even finish)
 *   spinC       static, each warp held C cycles a tile after its reads (a tile's compute)
 * What it showed (H200, session 61, docs/perf/README.md): the dynamic chunks finish no sooner (the stream
 * is bound by DRAM, not by the blocks' spread), while 1000 / 2000 / 3000 cycles a tile cost 1.5 / 4 / 6 %
 * at 537 MB: the time between a tile's barrier and the next is what the decode kernel has over a plain
 * stream.
 * Build and run on the GPU machine:  nvcc -O3 -arch=sm_90a -std=c++17 -w scripts/probe_decode_stream.cu -o ps && ./ps */
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("err %s line %d\n", cudaGetErrorString(e), __LINE__); exit(1); } } while (0)
static __device__ __forceinline__ void cp16(void *s, const void *g) {
  unsigned a = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g));
}
static __device__ __forceinline__ uint64_t gt() { uint64_t t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
#define TILE_ROWS 64
#define D 128
#define TB (TILE_ROWS * D * 2)
// head h's keys: rows [0, L); a chunk: tiles [c*per, min((c+1)*per, tiles))
__global__ void __launch_bounds__(128) stream_kernel(const uint16_t *k, const uint16_t *v, int heads, int L, int chunks_per_head,
                                                     int dynamic, int *counter, float *sink, uint64_t *times, int spin, int stages) {
  extern __shared__ __align__(128) char sm[];
  __shared__ int item_sh;
  const int tid = threadIdx.x, tiles = L / TILE_ROWS, per = (tiles + chunks_per_head - 1) / chunks_per_head;
  const int total = heads * chunks_per_head;
  float acc = 0.f;
  uint64_t t0 = gt();
  int item = dynamic ? -1 : (int)blockIdx.x;
  for (;;) {
    if (dynamic) {
      if (tid == 0) item_sh = atomicAdd(counter, 1);
      __syncthreads();
      item = item_sh;
      __syncthreads();
    }
    if (item >= total) break;
    const int h = item / chunks_per_head, c = item % chunks_per_head;
    const int t_begin = c * per, t_end = min(tiles, t_begin + per), n = t_end - t_begin;
    const uint16_t *kb = k + ((size_t)h * L + (size_t)t_begin * TILE_ROWS) * D, *vb = v + ((size_t)h * L + (size_t)t_begin * TILE_ROWS) * D;
    auto load = [&](int t, int st) {
      char *kt = sm + st * 2 * TB, *vt = kt + TB;
      const uint16_t *ks = kb + (size_t)t * TILE_ROWS * D, *vs = vb + (size_t)t * TILE_ROWS * D;
#pragma unroll
      for (int i = 0; i < TB / 16 / 128; i++) {
        const int off = (i * 128 + tid) * 8;
        cp16(kt + off * 2, ks + off), cp16(vt + off * 2, vs + off);
      }
    };
    for (int s = 0; s < 2; s++) { if (s < n) load(s, s); asm volatile("cp.async.commit_group;"); }
    for (int t = 0; t < n; t++) {
      asm volatile("cp.async.wait_group 1;");
      __syncthreads();
      if (t + 2 < n) load(t + 2, (t + 2) % 3);
      asm volatile("cp.async.commit_group;");
      const float *x = (const float *)(sm + (t % 3) * 2 * TB);
#pragma unroll 4
      for (int i = 0; i < 2 * TB / 4 / 128; i += 8) acc += x[i * 128 + tid];
      if (spin) { long long c0 = clock64(); while (clock64() - c0 < spin) acc += 1e-30f; }
    }
    asm volatile("cp.async.wait_group 0;");
    __syncthreads();
    if (!dynamic) break;
  }
  if (acc == 12345.f) sink[blockIdx.x] = acc;
  if (tid == 0) { times[2 * blockIdx.x] = t0; times[2 * blockIdx.x + 1] = gt(); }
}
int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const size_t smem = 3 * 2 * TB;
  CK(cudaFuncSetAttribute(stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
  int per_sm; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream_kernel, 128, smem));
  printf("sms %d blocks/sm %d\n", sms, per_sm);
  struct shape { int heads, L; } shapes[] = {{8, 131072}, {32, 32768}, {64, 4096}, {64, 131072}};
  char *flush; CK(cudaMalloc(&flush, 256 << 20));
  int *counter; CK(cudaMalloc(&counter, 4));
  float *sink; CK(cudaMalloc(&sink, 1 << 20));
  uint64_t *times; CK(cudaMalloc(&times, 1 << 20));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (auto s : shapes) {
    size_t bytes = (size_t)s.heads * s.L * D * 2;
    uint16_t *k, *v; CK(cudaMalloc(&k, bytes)); CK(cudaMalloc(&v, bytes));
    CK(cudaMemset(k, 0, bytes)); CK(cudaMemset(v, 0, bytes));
    const int slots = sms * per_sm;
    int stat_chunks = std::max(1, slots / s.heads);
    if (stat_chunks > s.L / TILE_ROWS) stat_chunks = s.L / TILE_ROWS;
    struct cfg { const char *name; int chunks, dyn, grid, spin; } cfgs[] = {
      {"static", stat_chunks, 0, s.heads * stat_chunks, 0},
      {"static1sm", std::max(1, sms / s.heads), 0, s.heads * std::max(1, sms / s.heads), 0},
      {"dyn x4", stat_chunks * 4, 1, slots, 0},
      {"spin500", stat_chunks, 0, s.heads * stat_chunks, 500},
      {"spin1000", stat_chunks, 0, s.heads * stat_chunks, 1000},
      {"spin2000", stat_chunks, 0, s.heads * stat_chunks, 2000},
      {"spin3000", stat_chunks, 0, s.heads * stat_chunks, 3000},
    };
    for (auto c : cfgs) {
      if (c.chunks > s.L / TILE_ROWS) continue;
      std::vector<float> ms;
      std::vector<uint64_t> h(2 * c.grid);
      for (int rep = 0; rep < 15; rep++) {
        CK(cudaMemsetAsync(flush, rep, 256 << 20));
        CK(cudaMemsetAsync(counter, 0, 4));
        cudaEventRecord(e0);
        stream_kernel<<<c.grid, 128, smem>>>(k, v, s.heads, s.L, c.chunks, c.dyn, counter, sink, times, c.spin, 3);
        cudaEventRecord(e1);
        CK(cudaEventSynchronize(e1));
        float t; cudaEventElapsedTime(&t, e0, e1); ms.push_back(t);
      }
      CK(cudaMemcpy(h.data(), times, 16 * c.grid, cudaMemcpyDeviceToHost));
      uint64_t st = UINT64_MAX; for (int i = 0; i < c.grid; i++) st = std::min(st, h[2 * i]);
      std::vector<double> ends; for (int i = 0; i < c.grid; i++) ends.push_back((h[2 * i + 1] - st) * 1e-3);
      std::vector<double> starts; for (int i = 0; i < c.grid; i++) starts.push_back((h[2 * i] - st) * 1e-3);
      std::sort(ends.begin(), ends.end()); std::sort(starts.begin(), starts.end()); std::sort(ms.begin(), ms.end());
      double med = ms[ms.size() / 2] * 1e3;
      printf("heads %3d L %6d %4.0f MB %-10s chunks/head %4d grid %4d: %7.1f us %5.0f GB/s | block start max %.1f; ends min %.1f p10 %.1f p50 %.1f p90 %.1f max %.1f us\n",
             s.heads, s.L, 2.0 * bytes / 1e6, c.name, c.chunks, c.grid, med, 2.0 * bytes / med / 1e3, starts.back(), ends[0], ends[ends.size() / 10],
             ends[ends.size() / 2], ends[ends.size() * 9 / 10], ends.back());
    }
    cudaFree(k); cudaFree(v);
  }
  return 0;
}
