#pragma once
// A cache that records every appended key/value (f32, as the model produced them: keys after
// RoPE) and attends through an fp16 dense cache, so the model runs exactly as with fp16.
// Used to collect calibration activations.
#include <memory>
#include <vector>

#include "kvcache/dense_cache.h"

namespace vq {

class RecordingCache final : public KVCache {
 public:
  explicit RecordingCache(const KVGeometry& g) : inner_(g, false) {}
  void append(const float* k, const float* v, int n) override {
    inner_.append(k, v, n);
    const size_t e = size_t(n) * geometry().n_kv_heads * geometry().head_dim;
    keys_.insert(keys_.end(), k, k + e);
    values_.insert(values_.end(), v, v + e);
  }
  void attend(const float* q, int n_q, float scale, float* out) const override { inner_.attend(q, n_q, scale, out); }
  void attend_window(const float* q, int n_q, float scale, float* out, int64_t window) const override {
    inner_.attend_window(q, n_q, scale, out, window);  // TEMPORARY (gemma3 branch), see KVCache
  }
  int64_t size() const override { return inner_.size(); }
  void clear() override {
    inner_.clear();
    keys_.clear();
    values_.clear();
  }
  size_t bytes() const override { return inner_.bytes(); }
  const KVGeometry& geometry() const override { return inner_.geometry(); }
  std::string name() const override { return "recording(fp16)"; }
  // [size(), n_kv_heads, head_dim] f32
  const std::vector<float>& keys() const { return keys_; }
  const std::vector<float>& values() const { return values_; }

 private:
  DenseCache inner_;
  std::vector<float> keys_, values_;
};

}  // namespace vq
