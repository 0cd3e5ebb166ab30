// The CUDA backend in the parity harness (backends.h): vq::cuda::pq_encode / pq_decode through
// host memory. Without a usable device the harness skips it, naming the reason.
#if defined(VQ_HAVE_CUDA)
#include "backends.h"
#include "ops/cuda/device.h"
#include "ops/cuda/pq.h"

namespace vq::test {
namespace {

OpsBackend cuda_backend() {
  OpsBackend b;
  b.name = "cuda";
  b.unavailable = [] { return cuda::cuda_device_available() ? std::string() : cuda::cuda_unavailable_reason(); };
  b.pq_encode = [](const PQShape& s, const float* x, const float* books, uint16_t* codes) {
    cuda::pq_encode(s, x, books, codes);
  };
  b.pq_decode = [](const PQShape& s, const uint16_t* codes, const float* books, float* out) {
    cuda::pq_decode(s, codes, books, out);
  };
  return b;
}

}  // namespace

VQ_REGISTER_OPS_BACKEND(cuda_backend());

}  // namespace vq::test
#endif
