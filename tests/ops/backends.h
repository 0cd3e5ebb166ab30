#pragma once
// Registry of op backends for the one backend-parity harness (tests/ops/test_parity_pq.cpp).
// A backend registers itself from its own .cpp with a static VQ_REGISTER_OPS_BACKEND; the
// harness runs every case against every registered backend and compares with vq::ref.
// The CUDA helper adds tests/ops/backend_cuda.cpp wrapped in `#if defined(VQ_HAVE_CUDA)`
// (vq_ops_cuda exports that definition to test_ops); no test code changes are needed.
#include <functional>
#include <string>
#include <vector>

#include "ops/pq_shape.h"

namespace vq::test {

struct OpsBackend {
  std::string name;  // gtest-safe: letters, digits, underscore
  // Empty string: usable now; otherwise the reason it is not (e.g. "no CUDA device"): the
  // harness GTEST_SKIPs with that message.
  std::function<std::string()> unavailable = [] { return std::string(); };
  // Same contracts as vq::ref::pq_encode / pq_decode (host pointers in and out; a device
  // backend copies to and from the device inside these).
  std::function<void(const PQShape&, const float* x, const float* codebooks, uint16_t* codes)> pq_encode;
  std::function<void(const PQShape&, const uint16_t* codes, const float* codebooks, float* out)> pq_decode;
};

inline std::vector<OpsBackend>& ops_backends() {
  static std::vector<OpsBackend> registry;
  return registry;
}

struct OpsBackendRegistrar {
  explicit OpsBackendRegistrar(OpsBackend b) { ops_backends().push_back(std::move(b)); }
};

}  // namespace vq::test

#define VQ_OPS_CONCAT2(a, b) a##b
#define VQ_OPS_CONCAT(a, b) VQ_OPS_CONCAT2(a, b)
// Usage at namespace scope: VQ_REGISTER_OPS_BACKEND(make_my_backend());
#define VQ_REGISTER_OPS_BACKEND(expr) \
  static const ::vq::test::OpsBackendRegistrar VQ_OPS_CONCAT(vq_ops_backend_, __LINE__){expr}
