#pragma once
// Internal to src/ops/cuda: a kernel's dynamic shared-memory limit
// (cudaFuncAttributeMaxDynamicSharedMemorySize) raised once per (kernel, device). The attribute
// belongs to the device current at the call, so a process that drives several GPUs (the
// tensor-parallel forward, model/forward_device.h) raises it on each; and cudaFuncSetAttribute
// costs microseconds of host time, so a launch calls it only when the size grows.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <utility>

#include "ops/cuda/cuda_check.cuh"

namespace vq::cuda::detail {

inline void ensure_smem_attr(const void* kernel, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<int, const void*>, size_t> set;
  int dev = 0;
  VQ_CUDA_CHECK(cudaGetDevice(&dev));
  std::lock_guard<std::mutex> lock(mu);
  size_t& cur = set[{dev, kernel}];
  if (bytes > cur) {
    VQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
    cur = bytes;
  }
}

template <class F>
void ensure_smem_attr(F* kernel, size_t bytes) {
  ensure_smem_attr(reinterpret_cast<const void*>(kernel), bytes);
}

}  // namespace vq::cuda::detail
