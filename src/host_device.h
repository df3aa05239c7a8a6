/* FA_HOST_DEVICE: a function in a header shared by the C core and the CUDA
 * kernels, compiled for the host and, under nvcc, for the device too (the
 * key range of attn_range.h, the generator of random_counter.h). */
#ifndef FA_HOST_DEVICE_H
#define FA_HOST_DEVICE_H

#ifdef __CUDACC__
#define FA_HOST_DEVICE __host__ __device__
#else
#define FA_HOST_DEVICE
#endif

#endif
