#pragma once
// q8_0 / q4_0 caches: llama.cpp's block-32 KV cache formats (every token quantized on append, no
// fp16 window). q8_0 block: fp16 scale d + 32 int8 (x = d*q). q4_0 block: fp16 scale d + 16
// bytes; byte j holds element j (low nibble) and element j+16 (high nibble), x = d*(nibble-8).
// Attention reads the codes with their scales block by block; no dequantized K/V tensor exists.
#include <vector>

#include "codec/scalar_blocks.h"
#include "core/buffer.h"
#include "veloxquant/kv_cache.h"

namespace vq {

class BlockQuantCache final : public KVCache {
 public:
  static constexpr int kPageTokens = 256;
  BlockQuantCache(const KVGeometry& g, bool q4);

  void append(const float* k, const float* v, int n_tokens) override;
  void attend(const float* q, int n_q, float scale, float* out) const override;
  int64_t size() const override { return n_; }
  void clear() override;
  size_t bytes() const override;
  const KVGeometry& geometry() const override { return geo_; }
  std::string name() const override { return q4_ ? "q4_0" : "q8_0"; }

 private:
  size_t row_bytes() const { return size_t(geo_.head_dim / 32) * block_bytes_; }
  const uint8_t* row(int kind, int64_t t, int h) const;
  KVGeometry geo_;
  bool q4_;
  size_t block_bytes_;
  int64_t n_ = 0;
  // pages_[p]: [2 (K, V)][n_kv_heads][kPageTokens][head_dim/32 blocks]
  std::vector<AlignedBuffer<uint8_t>> pages_;
};

}  // namespace vq
