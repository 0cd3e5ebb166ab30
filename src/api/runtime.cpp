// Library-wide settings: version, thread pool, CUDA availability.
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

}  // namespace veloxquant
