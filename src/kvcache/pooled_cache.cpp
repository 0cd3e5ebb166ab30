#include "kvcache/pooled_cache.h"

#include "kvcache/kv_method.h"

#include "core/error.h"

namespace vq {

PooledCache::PooledCache(const KVGeometry& g, const KVSpec& spec, int layer) {
  KVStoreOptions opt;
  opt.calib_layer_offset = layer;
  opt.whole_model = false;
  store_ = std::make_unique<KVStore>(g, 1, spec, opt);
  seq_ = store_->new_sequence();
}

void PooledCache::append(const float* k, const float* v, int n_tokens) {
  VQ_CHECK(n_tokens >= 0, "{} cache append: n_tokens = {} must be >= 0", name(), n_tokens);
  store_->append(seq_, 0, k, v, n_tokens);
}

void PooledCache::attend(const float* q, int n_q, float scale, float* out) const {
  VQ_CHECK(n_q >= 0 && n_q <= seq_.size(), "{} attend: n_q = {} must be in 0..size() = {}", name(), n_q, seq_.size());
  if (n_q == 0) return;
  const AttnEntry e{&seq_, seq_.size() - n_q, n_q, q, out};
  store_->attend(0, &e, 1, scale);
}

int64_t PooledCache::coded_tokens() const {
  if (kv_method(store_->spec().config.method).direct()) return size();  // direct: every token coded
  return store_->blocks_held(seq_, 0, true) * store_->block_tokens();
}

void PooledCache::attend_dequantized(const float* q, int n_q, float scale, float* out) {
  store_->set_reference_kernels(true);
  try {
    attend(q, n_q, scale, out);
  } catch (...) {
    store_->set_reference_kernels(false);
    throw;
  }
  store_->set_reference_kernels(false);
}

void PooledCache::clear() {
  store_->release(seq_);
  seq_ = store_->new_sequence();
}

}  // namespace vq
