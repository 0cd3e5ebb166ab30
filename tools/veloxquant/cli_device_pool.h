#pragma once
// For the commands still on the internal engine (generate, serve; issue 19 item 4 moves them onto
// the public API): the device as the pool's KVDevice, and the default KV budget on the device.
#include <cstddef>

#include "core/error.h"
#include "kvcache/kv_pool.h"
#include "model/model.h"
#include "veloxquant/runtime.h"
#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#include "ops/cuda/stream_cuda.h"
#endif

namespace vq::cli {

inline KVDevice kv_device(veloxquant::Device d) { return d == veloxquant::Device::cuda ? KVDevice::cuda : KVDevice::cpu; }

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
