#pragma once
// --device cpu|cuda|auto for the commands that run the model: which device runs the forward and
// holds the KV pool. auto takes cuda when a usable GPU is present (and this build has the CUDA
// backend), else cpu, and says which on stderr.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "core/error.h"
#include "kvcache/kv_pool.h"
#include "model/model.h"
#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#include "ops/cuda/stream_cuda.h"
#endif

namespace vq::cli {

inline void add_device_option(CLI::App* c, std::string& device) {
  c->add_option("--device", device, "Where the model runs and the KV pool lives: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))
      ->capture_default_str();
}

inline std::string cuda_reason() {
#ifdef VQ_HAVE_CUDA
  return vq::cuda::cuda_device_available() ? "" : vq::cuda::cuda_unavailable_reason();
#else
  return "this build has no CUDA backend";
#endif
}

// Resolves the flag; cuda without a usable GPU is one clear error.
inline KVDevice resolve_device(const std::string& flag) {
  if (flag == "cpu") return KVDevice::cpu;
  const std::string why = cuda_reason();
  if (flag == "cuda") {
    VQ_CHECK(why.empty(), "--device cuda: {}", why);
    return KVDevice::cuda;
  }
  VQ_CHECK(flag == "auto", "--device: '{}' is not cpu, cuda or auto", flag);
  if (why.empty()) {
#ifdef VQ_HAVE_CUDA
    std::fprintf(stderr, "device: cuda (%s)\n", vq::cuda::cuda_device_description().c_str());
#endif
    return KVDevice::cuda;
  }
  std::fprintf(stderr, "device: cpu (no usable GPU: %s)\n", why.c_str());
  return KVDevice::cpu;
}

// Device bytes the forward's weights will take (fp16 copies + native quantized forms + the raw
// embedding table), for sizing the KV pool before the upload.
inline size_t device_weight_bytes_estimate(const Model& m) {
  auto mat = [](const WeightMatrix& w) {
    return size_t(w.rows) * size_t(w.cols) * 2 + ggml_row_bytes(w.type, w.cols) * size_t(w.rows);
  };
  const WeightMatrix& e = m.token_embd();
  size_t b = mat(m.output()) + ggml_row_bytes(e.type, e.cols) * size_t(e.rows);
  for (const auto& L : m.layers())
    b += mat(L.wq) + mat(L.wk) + mat(L.wv) + mat(L.wo) + mat(L.w_gate) + mat(L.w_up) + mat(L.w_down);
  return b + (size_t(256) << 20);  // + activations, cuBLAS workspace
}

// Default KV budget on the device: this share of the device memory free now (after the weights).
inline constexpr double kDefaultDeviceKVShare = 0.85;

inline size_t device_kv_budget_bytes(double mib, size_t weight_bytes) {
  VQ_CHECK(mib >= 0, "--kv-budget: {} MiB must be >= 0", mib);
  if (mib > 0) return size_t(mib * 1048576.0);
#ifdef VQ_HAVE_CUDA
  const size_t free_b = vq::cuda::device_free_bytes();
  const size_t avail = free_b > weight_bytes ? free_b - weight_bytes : 0;
  return size_t(double(avail) * kDefaultDeviceKVShare);
#else
  (void)weight_bytes;
  return size_t(1) << 30;
#endif
}

}  // namespace vq::cli
