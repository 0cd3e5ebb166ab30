#pragma once
// CUDA device access for the rest of the library, with no CUDA types in this header, so that
// callers (caches, CLI, tests) compile without the CUDA toolkit's headers.
// Every function is safe to call on a machine with no GPU or no driver: cuda_device_available()
// then returns false, and the others throw vq::Error saying why.
#include <cstddef>
#include <cstdint>
#include <string>

namespace vq::cuda {

// True when the CUDA runtime finds at least one usable device (driver present, compatible,
// and the device can run this build's sm_90 code or its PTX). Never throws; cached after the
// first call.
bool cuda_device_available();
// Why cuda_device_available() is false ("" when it is true), e.g. "no CUDA driver".
std::string cuda_unavailable_reason();
// Name and compute capability of device 0, e.g. "NVIDIA H200 (sm_90, 132 SMs)". Throws if none.
std::string cuda_device_description();
// Waits for all work on the device; throws vq::Error naming the first asynchronous error.
void device_synchronize();
// Marks the region a profiler started with "profile from start off" (ncu --profile-from-start off)
// records: cudaProfilerStart / cudaProfilerStop. Harmless without a profiler.
void profiler_range(bool start);

// Owning device allocation (cudaMalloc), move-only. size() in bytes.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  template <class T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t size() const { return bytes_; }
  // Host -> device / device -> host copies of `bytes` at byte `offset`, complete when they return
  // (also from pageable memory, where a plain cudaMemcpy returns before its DMA has landed), so a
  // kernel on any stream may read them next.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  // Sets every byte to `value` (e.g. 0xFF poisons float outputs with NaN); complete when it returns.
  void fill_bytes(int value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Allocates `bytes` on the device and copies `src` there.
DeviceBuffer to_device(const void* src, size_t bytes);

// Device-to-device copies on the default stream (asynchronous to the host, ordered with the
// kernels launched on the default stream). copy_device_2d copies `height` rows of `width` bytes.
void copy_device(void* dst, const void* src, size_t bytes);
void copy_device_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width, size_t height);

}  // namespace vq::cuda
