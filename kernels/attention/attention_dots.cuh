/* Dot products in interleaved chains of FMAs, for the SIMT kernels
 * (attention_tiled.cuh's forward, attention_backward_simt.cuh's P and dS):
 * the dot products of R rows (qs, D floats apart) with one row krow (0
 * where !live), each in C chains summed at the end.  One chain of D rounds
 * every partial sum at up to the score's magnitude, four of D / 4 at about
 * half of it (f32, D = 256, scale 1: the outside oracle's seed 8401 case
 * 632 was 1.01e-5 of max|out| off with one chain, torch's f32 0.35e-5), and
 * C independent FMAs are in flight. */
#ifndef FA_KERNELS_ATTENTION_DOTS_CUH
#define FA_KERNELS_ATTENTION_DOTS_CUH

template <int R, int C>
static __device__ __forceinline__ void chained_dots(float *acc, const float *qs, int D, const float *krow, bool live) {
  float a[R][C];
#pragma unroll
  for (int r = 0; r < R; r++)
#pragma unroll
    for (int c = 0; c < C; c++) a[r][c] = 0.f;
  if (live && C == 1) { /* the loop as it was before the chains: the general one below with C = 1 unrolls
                         * differently (R = 16's SASS changes; the oracle ran this one) */
    for (int d = 0; d < D; d++) {
      const float k = krow[d];
#pragma unroll
      for (int r = 0; r < R; r++) a[r][0] = fmaf(qs[r * D + d], k, a[r][0]);
    }
  } else if (live) {
    int d = 0;
    for (; d + C <= D; d += C) {
      float k[C];
#pragma unroll
      for (int c = 0; c < C; c++) k[c] = krow[d + c];
#pragma unroll
      for (int r = 0; r < R; r++)
#pragma unroll
        for (int c = 0; c < C; c++) a[r][c] = fmaf(qs[r * D + d + c], k[c], a[r][c]);
    }
    for (; d < D; d++) /* D % C */
#pragma unroll
      for (int r = 0; r < R; r++) a[r][0] = fmaf(qs[r * D + d], krow[d], a[r][0]);
  }
#pragma unroll
  for (int r = 0; r < R; r++) {
    float t = a[r][0];
#pragma unroll
    for (int c = 1; c < C; c++) t += a[r][c]; /* (C = 4: ((a0 + a1) + a2) + a3) */
    acc[r] = t;
  }
}

#endif
