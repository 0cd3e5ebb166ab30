// All-reduce across tensor-parallel ranks (collective_cuda.h): the one-device communicator and
// NCCL loaded at run time.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <set>

#include "core/env.h"
#include "ops/cuda/collective_cuda.h"
#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"

namespace vq::cuda {

int device_count() {
  if (!cuda_device_available()) return 0;
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

DeviceScope::DeviceScope(int device) {
  VQ_CUDA_CHECK(cudaGetDevice(&prev_));
  if (device != prev_) {
    VQ_CUDA_CHECK(cudaSetDevice(device));
    changed_ = true;
  }
}
DeviceScope::~DeviceScope() {
  if (changed_) (void)cudaSetDevice(prev_);
}

namespace {

// ---- one device

constexpr int kMaxLocalRanks = 16;
struct SumArgs {
  const float* src[kMaxLocalRanks];
};

// out[i] = ((b0[i] + b1[i]) + b2[i]) + ...: rank order, so the result does not depend on the
// launch shape. float4 where n allows (cudaMalloc'd buffers at offsets of whole rows).
__global__ void sum_ranks_kernel(SumArgs a, int ranks, float* out, int64_t n, bool vec4) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  if (vec4) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n / 4; i += stride) {
      float4 s = reinterpret_cast<const float4*>(a.src[0])[i];
      for (int r = 1; r < ranks; ++r) {
        const float4 v = reinterpret_cast<const float4*>(a.src[r])[i];
        s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
      }
      reinterpret_cast<float4*>(out)[i] = s;
    }
    return;
  }
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float s = a.src[0][i];
    for (int r = 1; r < ranks; ++r) s += a.src[r][i];
    out[i] = s;
  }
}

class LocalCommunicator final : public DeviceCommunicator {
 public:
  LocalCommunicator(int size, int device) : size_(size), device_(device) {
    VQ_CHECK(size >= 1 && size <= kMaxLocalRanks, "tp: a one-device communicator takes 1..{} ranks, not {}",
             kMaxLocalRanks, size);
    DeviceScope on(device_);
    events_.resize(size_t(size) + 1);
    for (auto& e : events_) VQ_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  ~LocalCommunicator() override {
    for (auto& e : events_)
      if (e) cudaEventDestroy(e);
  }
  int size() const override { return size_; }
  std::string name() const override { return "local"; }
  int device(int) const override { return device_; }

  void all_reduce_sum(float* const* bufs, int64_t n, void* const* streams) override {
    if (size_ == 1 || n == 0) return;
    DeviceScope on(device_);
    cudaStream_t s0 = as_stream(streams[0]);
    for (int r = 1; r < size_; ++r) {
      if (streams[r] == streams[0]) continue;
      VQ_CUDA_CHECK(cudaEventRecord(events_[size_t(r)], as_stream(streams[r])));
      VQ_CUDA_CHECK(cudaStreamWaitEvent(s0, events_[size_t(r)], 0));
    }
    SumArgs a{};
    bool vec4 = n % 4 == 0;
    for (int r = 0; r < size_; ++r) {
      a.src[r] = bufs[r];
      vec4 = vec4 && reinterpret_cast<uintptr_t>(bufs[r]) % 16 == 0;
    }
    const int64_t items = vec4 ? n / 4 : n;
    const int blocks = int(std::clamp<int64_t>((items + 255) / 256, 1, 1024));
    sum_ranks_kernel<<<blocks, 256, 0, s0>>>(a, size_, bufs[0], n, vec4);
    VQ_CUDA_LAUNCHED("sum_ranks_kernel");
    for (int r = 1; r < size_; ++r)
      VQ_CUDA_CHECK(cudaMemcpyAsync(bufs[r], bufs[0], size_t(n) * sizeof(float), cudaMemcpyDeviceToDevice, s0));
    cudaEvent_t done = events_[0];
    VQ_CUDA_CHECK(cudaEventRecord(done, s0));
    for (int r = 1; r < size_; ++r)
      if (streams[r] != streams[0]) VQ_CUDA_CHECK(cudaStreamWaitEvent(as_stream(streams[r]), done, 0));
  }

 private:
  int size_, device_;
  std::vector<cudaEvent_t> events_;  // [0]: the sum is done; [r]: rank r's producers are done
};

// ---- NCCL, loaded at run time. The few entry points used, declared from NCCL's documented C API
// (nccl.h of NCCL 2.x: the types below are its ABI: an opaque communicator handle, int enums).
using ncclComm_t = struct ncclComm*;
using ncclResult_t = int;
constexpr int kNcclFloat32 = 7, kNcclSum = 0;

struct Nccl {
  void* lib = nullptr;
  std::string why_not, file, version;
  ncclResult_t (*get_version)(int*) = nullptr;
  const char* (*error_string)(ncclResult_t) = nullptr;
  ncclResult_t (*comm_init_all)(ncclComm_t*, int, const int*) = nullptr;
  ncclResult_t (*comm_destroy)(ncclComm_t) = nullptr;
  ncclResult_t (*all_reduce)(const void*, void*, size_t, int, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*group_start)() = nullptr;
  ncclResult_t (*group_end)() = nullptr;

  void check(ncclResult_t r, const char* what) const {
    if (r != 0) VQ_FAIL("NCCL: {} failed: {} (code {})", what, error_string ? error_string(r) : "?", r);
  }
};

const Nccl& nccl() {
  static Nccl n;
  static std::once_flag once;
  std::call_once(once, [] {
    const std::string env = env_or_empty("VQ_NCCL_LIBRARY");
    n.file = env.empty() ? "libnccl.so.2" : env;
    n.lib = dlopen(n.file.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!n.lib) {
      const char* e = dlerror();
      n.why_not = fmt::format("NCCL could not be loaded from '{}' ({}); install NCCL (e.g. the nvidia-nccl-cu13 "
                              "package) and put its lib folder on LD_LIBRARY_PATH, or name the file in VQ_NCCL_LIBRARY",
                              n.file, e ? e : "not found");
      return;
    }
    auto sym = [&](const char* name) {
      void* p = dlsym(n.lib, name);
      if (!p && n.why_not.empty()) n.why_not = fmt::format("NCCL library '{}' lacks {}", n.file, name);
      return p;
    };
    n.get_version = reinterpret_cast<decltype(n.get_version)>(sym("ncclGetVersion"));
    n.error_string = reinterpret_cast<decltype(n.error_string)>(sym("ncclGetErrorString"));
    n.comm_init_all = reinterpret_cast<decltype(n.comm_init_all)>(sym("ncclCommInitAll"));
    n.comm_destroy = reinterpret_cast<decltype(n.comm_destroy)>(sym("ncclCommDestroy"));
    n.all_reduce = reinterpret_cast<decltype(n.all_reduce)>(sym("ncclAllReduce"));
    n.group_start = reinterpret_cast<decltype(n.group_start)>(sym("ncclGroupStart"));
    n.group_end = reinterpret_cast<decltype(n.group_end)>(sym("ncclGroupEnd"));
    if (!n.why_not.empty()) return;
    int v = 0;
    if (n.get_version(&v) == 0)  // NCCL >= 2.9 encodes major * 10000 + minor * 100 + patch
      n.version = fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
  });
  return n;
}

class NcclCommunicator final : public DeviceCommunicator {
 public:
  explicit NcclCommunicator(const std::vector<int>& devices) : devices_(devices) {
    const Nccl& n = nccl();
    VQ_CHECK(n.why_not.empty(), "tp: {}", n.why_not);
    VQ_CHECK(!devices.empty(), "tp: an NCCL communicator of no devices");
    const int have = device_count();
    std::set<int> seen;
    for (int d : devices) {
      VQ_CHECK(d >= 0 && d < have, "tp: device {} does not exist ({} CUDA device{} here)", d, have, have == 1 ? "" : "s");
      VQ_CHECK(seen.insert(d).second,
               "tp: device {} is named twice; NCCL takes one rank per GPU (ranks on one GPU use the local communicator)",
               d);
    }
    setenv("NCCL_NVLS_ENABLE", "0", 0);  // NVLink multicast off unless the environment says otherwise
    comms_.resize(devices.size());
    n.check(n.comm_init_all(comms_.data(), int(devices.size()), devices.data()), "ncclCommInitAll");
  }
  ~NcclCommunicator() override {
    const Nccl& n = nccl();
    for (ncclComm_t c : comms_)
      if (c) n.comm_destroy(c);
  }
  int size() const override { return int(devices_.size()); }
  std::string name() const override { return "nccl"; }
  int device(int rank) const override { return devices_[size_t(rank)]; }

  void all_reduce_sum(float* const* bufs, int64_t n, void* const* streams) override {
    if (n == 0) return;
    const Nccl& lib = nccl();
    lib.check(lib.group_start(), "ncclGroupStart");
    for (size_t r = 0; r < comms_.size(); ++r) {
      const ncclResult_t e =
          lib.all_reduce(bufs[r], bufs[r], size_t(n), kNcclFloat32, kNcclSum, comms_[r], as_stream(streams[r]));
      if (e != 0) {
        lib.group_end();
        lib.check(e, "ncclAllReduce");
      }
    }
    lib.check(lib.group_end(), "ncclGroupEnd");
  }

 private:
  std::vector<int> devices_;
  std::vector<ncclComm_t> comms_;
};

}  // namespace

std::unique_ptr<DeviceCommunicator> make_local_communicator(int size, int device) {
  return std::make_unique<LocalCommunicator>(size, device);
}
std::unique_ptr<DeviceCommunicator> make_nccl_communicator(const std::vector<int>& devices) {
  return std::make_unique<NcclCommunicator>(devices);
}
std::string nccl_unavailable_reason() { return nccl().why_not; }
std::string nccl_version() { return nccl().version; }

}  // namespace vq::cuda
