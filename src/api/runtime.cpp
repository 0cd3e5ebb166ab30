// Library-wide settings: version, thread pool, CUDA availability.
#include "api/impl.h"
#include "core/cpu_info.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "veloxquant/runtime.h"
#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace veloxquant {

std::string version() { return VELOXQUANT_VERSION; }

void set_num_threads(int n) {
  VQ_CHECK(n >= 1 && n <= 4096, "set_num_threads: {} must be in 1..4096", n);
  vq::set_num_threads(n);
}
int num_threads() { return vq::num_threads(); }

bool cuda_available() {
#ifdef VQ_HAVE_CUDA
  return vq::cuda::cuda_device_available();
#else
  return false;
#endif
}

std::string cuda_unavailable_reason() {
#ifdef VQ_HAVE_CUDA
  return vq::cuda::cuda_device_available() ? "" : vq::cuda::cuda_unavailable_reason();
#else
  return "this build has no CUDA backend";
#endif
}

std::string cuda_device_description() {
#ifdef VQ_HAVE_CUDA
  return vq::cuda::cuda_device_available() ? vq::cuda::cuda_device_description() : "";
#else
  return "";
#endif
}

std::string cpu_description() { return vq::cpu_model_name(); }

const char* device_name(Device d) { return d == Device::cuda ? "cuda" : "cpu"; }

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  VQ_CHECK(name == "cuda" || name == "auto", "device '{}': must be cpu, cuda or auto", name);
  const std::string why = cuda_unavailable_reason();
  if (name == "auto") return why.empty() ? Device::cuda : Device::cpu;
  VQ_CHECK(why.empty(), "device cuda: {}", why);
  return Device::cuda;
}

vq::KVDevice to_internal(Device d) {
  VQ_CHECK(d == Device::cpu || cuda_available(), "device cuda: {}", cuda_unavailable_reason());
  return d == Device::cuda ? vq::KVDevice::cuda : vq::KVDevice::cpu;
}

}  // namespace veloxquant
