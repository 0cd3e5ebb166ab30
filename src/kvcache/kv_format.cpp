// CodedFormat's defaults and make_coded_format(), which asks the KV method registry
// (kv_method.h); each method's format lives in kvcache/methods/.
#include "kvcache/kv_format.h"

#include "core/error.h"
#include "kvcache/kv_method.h"

namespace vq {

void CodedFormat::encode_block(float*, float*, uint8_t*, int64_t) const {
  VQ_FAIL("{} cache: encode_block is not defined for this format", name());
}
void CodedFormat::write_tokens(const float*, const float*, int, int, uint8_t*) const {
  VQ_FAIL("{} cache: write_tokens is not defined for this format", name());
}

ScaledQueries::ScaledQueries(const float* q, int n_q, const KVGeometry& g, float scale)
    : n_heads_(g.n_heads), group_(g.n_heads / g.n_kv_heads), head_dim_(g.head_dim) {
  const size_t n = size_t(n_q) * g.n_heads * g.head_dim;
  q_ = std::make_unique<float[]>(n);
  for (size_t i = 0; i < n; ++i) q_[i] = q[i] * scale;
}

std::unique_ptr<QueryPrep> CodedFormat::prepare(const float* q, int n_q, float scale) const {
  return std::make_unique<ScaledQueries>(q, n_q, geo_, scale);
}

std::unique_ptr<CodedFormat> make_coded_format(const KVCacheConfig& cfg, const Calibration* calib, int layer,
                                               const KVGeometry& g, int block_tokens) {
  return kv_method(cfg.method).make_format(cfg, calib, layer, g, block_tokens);
}

}  // namespace vq
