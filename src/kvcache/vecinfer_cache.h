#pragma once
// VecInfer cache: keys smoothed + Hadamard-rotated then product-quantized, values
// product-quantized, codes bit-packed and head-major; the first cfg.sink_tokens tokens (attention
// sinks) stay in fp16 for good, the newest tokens stay in an fp16 residual window and move into
// codes in whole blocks of kBlock tokens. Token positions: [0, sinks) fp16 sinks, then
// [sinks, sinks + coded) codes, then the window. Attention runs on the codes (LUT scores, values
// decoded in registers) and merges with the fp16 parts by log-sum-exp.
#include <memory>
#include <vector>

#include "codec/calibration_file.h"
#include "codec/product_quantizer.h"
#include "core/buffer.h"
#include "kvcache/residual_window.h"
#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"

namespace vq {

class VecInferCache final : public KVCache {
 public:
  static constexpr int kBlock = 32;        // tokens encoded per flush block
  static constexpr int kPageTokens = 512;  // tokens per code page (a multiple of kBlock)

  // calib: the whole model's calibration (shared by all layers); layer: this cache's layer.
  VecInferCache(const KVGeometry& g, const KVCacheConfig& cfg, std::shared_ptr<const Calibration> calib, int layer);

  void append(const float* k, const float* v, int n_tokens) override;
  void attend(const float* q, int n_q, float scale, float* out) const override;
  int64_t size() const override { return sink_.size() + n_coded_ + window_.size(); }
  void clear() override;
  size_t bytes() const override;
  size_t codebook_bytes() const override;
  const KVGeometry& geometry() const override { return geo_; }
  std::string name() const override { return cfg_.name(); }

  int64_t coded_tokens() const { return n_coded_; }
  int64_t window_tokens() const { return window_.size(); }
  int64_t sink_tokens() const { return sink_.size(); }
  // Test hook: attention by decoding the codes to f32 K/V and attending (no LUT).
  void attend_dequantized(const float* q, int n_q, float scale, float* out) const;

 private:
  void flush(int64_t n_tokens);
  void attend_impl(const float* q, int n_q, float scale, float* out, bool dequantized) const;
  const uint8_t* k_codes(int64_t page, int h) const;
  const uint8_t* v_codes(int64_t page, int h) const;

  KVGeometry geo_;
  KVCacheConfig cfg_;
  std::shared_ptr<const Calibration> calib_;
  int layer_;
  const float* lambda_;  // [n_kv_heads, head_dim] smoothing factors (inside calib_)
  std::vector<ProductQuantizer> kpq_, vpq_;     // [n_kv_heads]
  std::vector<std::vector<float>> kbook_t_;     // [n_kv_heads] channel-major key codebooks
  size_t krow_ = 0, vrow_ = 0;                  // packed bytes per token and head
  int64_t n_coded_ = 0;
  // kpages_[p]: [n_kv_heads][kPageTokens][krow_] bytes; vpages_[p]: [n_kv_heads][kPageTokens][vrow_]
  std::vector<AlignedBuffer<uint8_t>> kpages_, vpages_;
  ResidualWindow sink_;    // the first cfg_.sink_tokens tokens, fp16, never encoded
  ResidualWindow window_;  // the newest tokens, fp16
};

}  // namespace vq
