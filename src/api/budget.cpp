// KV budgets: the default share of the memory (host or device) and the least that runs at all.
#include <fstream>
#include <string>

#include "api/impl.h"
#include "core/error.h"
#include "model/session.h"
#include "model/weight_formats.h"
#include "veloxquant/session.h"
#ifdef VQ_HAVE_CUDA
#include "ops/cuda/stream_cuda.h"
#endif

namespace veloxquant {
namespace {

// Shares of the memory free at start that the KV pool takes when the caller gives no budget: the
// host keeps room for the OS and other programs; the device holds little else beside the weights.
constexpr double kDefaultHostKVShare = 0.5;
constexpr double kDefaultDeviceKVShare = 0.85;

// Bytes of MemAvailable in /proc/meminfo (0 when unreadable).
size_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key, unit;
  size_t kb = 0;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

#ifdef VQ_HAVE_CUDA
// Device bytes the forward's weights will take (fp16 copies + native quantized forms + the raw
// embedding table), for sizing the KV pool before the upload.
size_t device_weight_bytes_estimate(const vq::Model& m) {
  auto mat = [](const vq::WeightMatrix& w) {
    return size_t(w.rows) * size_t(w.cols) * 2 + vq::ggml_row_bytes(w.type, w.cols) * size_t(w.rows);
  };
  const vq::WeightMatrix& e = m.token_embd();
  size_t b = mat(m.output()) + vq::ggml_row_bytes(e.type, e.cols) * size_t(e.rows);
  for (const auto& L : m.layers())
    b += mat(L.wq) + mat(L.wk) + mat(L.wv) + mat(L.wo) + mat(L.w_gate) + mat(L.w_up) + mat(L.w_down);
  return b + (size_t(256) << 20);  // + activations, cuBLAS workspace
}
#endif

}  // namespace

int default_max_chunk(Device device) { return device == Device::cpu ? 512 : 2048; }

size_t default_kv_budget_bytes(const Model& model, Device device) {
  if (device == Device::cpu) {
    const size_t avail = mem_available_bytes();
    return avail ? size_t(double(avail) * kDefaultHostKVShare) : (size_t(1) << 30);
  }
  (void)to_internal(device);  // throws naming why when there is no usable device
#ifdef VQ_HAVE_CUDA
  const size_t free_b = vq::cuda::device_free_bytes();
  const size_t weights = device_weight_bytes_estimate(ApiAccess::model(model));
  return size_t(double(free_b > weights ? free_b - weights : 0) * kDefaultDeviceKVShare);
#else
  (void)model;
  return 0;  // unreachable: to_internal refused the device
#endif
}

size_t min_budget_bytes(const vq::KVStore& kv) {
  size_t one = 0;
  for (int l = 0; l < kv.n_layers(); ++l) one += kv.dense_block_bytes() + kv.coded_block_bytes(l);
  return one;
}

size_t min_kv_budget_bytes(const Model& model, const KVSpec& spec) {
  check_spec_fits(spec, model);
  return min_budget_bytes(*vq::make_kv_store(ApiAccess::model(model), ApiAccess::spec(spec), 0));
}

}  // namespace veloxquant
