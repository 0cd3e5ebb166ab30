#pragma once
// Internal to src/ops/cuda: error checks that turn CUDA failures into vq::Error.
#include <cuda_runtime.h>

#include "core/error.h"

#define VQ_CUDA_CHECK(expr)                                                                   \
  do {                                                                                        \
    const cudaError_t vq_cuda_err_ = (expr);                                                  \
    if (vq_cuda_err_ != cudaSuccess)                                                          \
      VQ_FAIL("CUDA: {} failed: {} ({})", #expr, cudaGetErrorString(vq_cuda_err_),           \
              cudaGetErrorName(vq_cuda_err_));                                                \
  } while (0)

// After a kernel launch: reports launch-configuration errors naming the kernel.
#define VQ_CUDA_LAUNCHED(name)                                                                \
  do {                                                                                        \
    const cudaError_t vq_cuda_err_ = cudaGetLastError();                                      \
    if (vq_cuda_err_ != cudaSuccess)                                                          \
      VQ_FAIL("CUDA: kernel {} failed to launch: {}", name, cudaGetErrorString(vq_cuda_err_)); \
  } while (0)

namespace vq::cuda {
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }
}  // namespace vq::cuda
