#pragma once
// All-reduce across the ranks of a tensor-parallel forward (model/tensor_parallel.h), on device
// buffers. One controller thread drives every rank, so one call sees all ranks' buffers and
// streams. No CUDA types here: a stream is a `void*` (cudaStream_t).
//
// Two implementations:
//   - local: every rank on one device (ranks simulated on one GPU: tests, the split path on a
//     single-GPU machine). Sums in rank order ((b0 + b1) + b2) + ... on rank 0's stream after
//     every rank's producers (events), then copies the sum back to the other ranks; each rank's
//     stream waits for it. Deterministic, and capturable into a CUDA graph.
//   - nccl: one rank per GPU, ncclAllReduce per rank inside ncclGroupStart / ncclGroupEnd (the
//     single-thread, multi-device form of NCCL's API). NCCL is loaded at run time (dlopen of
//     libnccl.so.2, or the file VQ_NCCL_LIBRARY names), so the library builds and runs without
//     it; only a multi-GPU split needs it. NVLink multicast (NVLS) is left off
//     (NCCL_NVLS_ENABLE=0 unless the environment sets it), as the H200 machines require.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace vq::cuda {

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "local" or "nccl"
  virtual int device(int rank) const = 0;
  // bufs[r]: rank r's n floats on its device; streams[r]: the stream rank r's producers of
  // bufs[r] ran on. When the work queued on streams[r] past this call runs, bufs[r] holds the
  // elementwise sum over the ranks. Asynchronous to the host.
  virtual void all_reduce_sum(float* const* bufs, int64_t n, void* const* streams) = 0;
};

// `size` ranks on device `device`. Throws vq::Error for size < 1 or > 16.
std::unique_ptr<DeviceCommunicator> make_local_communicator(int size, int device = 0);
// One rank per device of `devices` (distinct). Throws vq::Error naming why not: NCCL not found
// (with the file tried), a device repeated or absent, or NCCL's own error string.
std::unique_ptr<DeviceCommunicator> make_nccl_communicator(const std::vector<int>& devices);
// "" when NCCL can be loaded (its version then in nccl_version()), else why not.
std::string nccl_unavailable_reason();
std::string nccl_version();

// Number of CUDA devices (0 without a driver).
int device_count();
// The calling thread's current device for the scope's life (cudaSetDevice), restored after.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int prev_ = 0;
  bool changed_ = false;
};

}  // namespace vq::cuda
