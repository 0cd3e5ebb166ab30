#pragma once
// Shared by the CUDA benchmarks (bench_cuda_ops, bench_llm_ops): error check, device-side random
// fills, median CUDA-event timing, free memory, and the device-to-device copy ceiling.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ops/cuda/device.h"

namespace vq::bench {

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #x); \
      std::exit(2);                                                                             \
    }                                                                                           \
  } while (0)

static __global__ void fill_bytes_hash(uint8_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = uint8_t(h >> 7);
  }
}

static __global__ void fill_normal_f32(float* p, size_t n, uint32_t seed, float scale) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t a = uint32_t(i) * 2654435761u ^ seed, b = uint32_t(i) * 2246822519u + seed * 3266489917u;
    a ^= a >> 15, a *= 2246822519u, a ^= a >> 13;
    b ^= b >> 16, b *= 3266489917u, b ^= b >> 13;
    const float u1 = (float(a >> 8) + 1.0f) / 16777217.0f, u2 = float(b >> 8) / 16777216.0f;
    p[i] = scale * sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
  }
}

template <class F>
double median_ms(F&& launch, int batch, int reps = 15, int warm = 3) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i)
    for (int j = 0; j < batch; ++j) launch(j);
  CK(cudaDeviceSynchronize());
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a));
    for (int j = 0; j < batch; ++j) launch(r * batch + j);
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(double(ms) / batch);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

inline size_t free_mem() {
  size_t f = 0, tot = 0;
  CK(cudaMemGetInfo(&f, &tot));
  return f;
}

inline double copy_gbps() {
  const size_t bytes = size_t(2) << 30;
  vq::cuda::DeviceBuffer a(bytes), b(bytes);
  CK(cudaMemset(a.data(), 1, bytes));
  const double ms = median_ms([&](int) { CK(cudaMemcpyAsync(b.data(), a.data(), bytes, cudaMemcpyDeviceToDevice)); }, 1, 9);
  const double gbps = 2.0 * bytes / (ms * 1e-3) / 1e9;
  std::printf("copy bytes=%zu ms=%.4f GBps_rw=%.0f\n", bytes, ms, gbps);
  return gbps;
}


}  // namespace vq::bench
