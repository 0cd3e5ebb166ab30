#include "ops/cuda/device.h"

#include <cuda_profiler_api.h>

#include <mutex>

#include "ops/cuda/cuda_check.cuh"

namespace vq::cuda {
namespace {

struct Probe {
  bool ok = false;
  std::string reason;
};

__global__ void probe_kernel(int* out) { *out = 42; }

Probe run_probe() {
  Probe p;
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    p.reason = std::string("no usable CUDA driver/device: ") + cudaGetErrorString(e);
    cudaGetLastError();
    return p;
  }
  if (n == 0) {
    p.reason = "no CUDA device";
    return p;
  }
  // Launch a tiny kernel: proves the driver can load this build's sm_90 code or PTX.
  int* d = nullptr;
  if ((e = cudaMalloc(&d, sizeof(int))) != cudaSuccess) {
    p.reason = std::string("cudaMalloc failed: ") + cudaGetErrorString(e);
    cudaGetLastError();
    return p;
  }
  probe_kernel<<<1, 1>>>(d);
  int h = 0;
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  if (e != cudaSuccess || h != 42) {
    p.reason = std::string("CUDA device cannot run this build's kernels: ") + cudaGetErrorString(e);
    cudaGetLastError();
    return p;
  }
  p.ok = true;
  return p;
}

const Probe& probe() {
  static Probe p;
  static std::once_flag once;
  std::call_once(once, [] { p = run_probe(); });
  return p;
}

}  // namespace

bool cuda_device_available() { return probe().ok; }
std::string cuda_unavailable_reason() { return probe().ok ? std::string() : probe().reason; }

std::string cuda_device_description() {
  VQ_CHECK(cuda_device_available(), "CUDA: {}", cuda_unavailable_reason());
  cudaDeviceProp prop{};
  VQ_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return fmt::format("{} (sm_{}{}, {} SMs, {} MiB, L2 {} MiB)", prop.name, prop.major, prop.minor,
                     prop.multiProcessorCount, prop.totalGlobalMem >> 20, prop.l2CacheSize >> 20);
}

void device_synchronize() { VQ_CUDA_CHECK(cudaDeviceSynchronize()); }

void profiler_range(bool start) { VQ_CUDA_CHECK(start ? cudaProfilerStart() : cudaProfilerStop()); }

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  VQ_CHECK(cuda_device_available(), "CUDA: cannot allocate {} bytes: {}", bytes, cuda_unavailable_reason());
  if (bytes) VQ_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_, bytes_ = o.bytes_;
    o.ptr_ = nullptr, o.bytes_ = 0;
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  VQ_CHECK(offset + bytes <= bytes_, "DeviceBuffer::upload: {} bytes at offset {} exceed size {}", bytes, offset,
           bytes_);
  if (!bytes) return;
  // cudaMemcpy from pageable memory returns once the data is staged, before its DMA has landed;
  // kernels on our non-blocking streams are not ordered after it. Wait for the copy itself.
  VQ_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice, cudaStreamLegacy));
  VQ_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  VQ_CHECK(offset + bytes <= bytes_, "DeviceBuffer::download: {} bytes at offset {} exceed size {}", bytes, offset,
           bytes_);
  if (!bytes) return;
  VQ_CUDA_CHECK(cudaMemcpyAsync(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost, cudaStreamLegacy));
  VQ_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

void DeviceBuffer::fill_bytes(int value) {
  if (!bytes_) return;
  VQ_CUDA_CHECK(cudaMemsetAsync(ptr_, value, bytes_, cudaStreamLegacy));  // cudaMemset may return before it is done
  VQ_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

DeviceBuffer to_device(const void* src, size_t bytes) {
  DeviceBuffer b(bytes);
  b.upload(src, bytes);
  return b;
}

void copy_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  VQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, nullptr));
}

void copy_device_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height) {
  if (width == 0 || height == 0) return;
  VQ_CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, cudaMemcpyDeviceToDevice, nullptr));
}

}  // namespace vq::cuda
