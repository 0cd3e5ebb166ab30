#pragma once
// KIVI cache: asymmetric min/max quantization with b in {2, 4} bits. Keys per channel over
// groups of G tokens (scale and min per channel per group); values per token over groups of G
// channels. The newest tokens stay in an fp16 residual window and leave it in whole groups of G.
// Attention reads the integer codes with their scales: score = q.min + sum_c (q_c s_c) code_c.
#include <vector>

#include "core/buffer.h"
#include "kvcache/residual_window.h"
#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"

namespace vq {

class KiviCache final : public KVCache {
 public:
  KiviCache(const KVGeometry& g, const KVCacheConfig& cfg);

  void append(const float* k, const float* v, int n_tokens) override;
  void attend(const float* q, int n_q, float scale, float* out) const override;
  int64_t size() const override { return n_coded_ + window_.size(); }
  void clear() override;
  size_t bytes() const override;
  const KVGeometry& geometry() const override { return geo_; }
  std::string name() const override { return cfg_.name(); }
  int64_t coded_tokens() const { return n_coded_; }

 private:
  void flush(int64_t n);
  // Key group layout (per head): scale [D] fp16, min [D] fp16, codes [G][krow] (b-bit, per token)
  size_t kgroup_bytes() const { return size_t(geo_.head_dim) * 4 + size_t(G_) * krow_; }
  // Value token layout (per head): (scale, min) fp16 per channel group [D/G][2], codes [krow]
  size_t vtoken_bytes() const { return size_t(geo_.head_dim / G_) * 4 + krow_; }
  const uint8_t* kgroup(int64_t group, int h) const;
  const uint8_t* vtoken(int64_t t, int h) const;

  KVGeometry geo_;
  KVCacheConfig cfg_;
  int G_, bits_, groups_per_page_;
  size_t krow_;  // packed bytes of head_dim codes
  int64_t n_coded_ = 0;
  // kpages_[p]: [n_kv_heads][groups_per_page_][kgroup_bytes]; vpages_[p]: [n_kv_heads][groups_per_page_*G][vtoken_bytes]
  std::vector<AlignedBuffer<uint8_t>> kpages_, vpages_;
  ResidualWindow window_;
};

}  // namespace vq
