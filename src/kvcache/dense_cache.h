#pragma once
// The uncompressed cache: fp16 (the baseline every method is measured against) or fp32 (the
// full-precision test reference). Storage grows in pages of kPageTokens tokens; within a page
// keys and values are head-major so one KV head's rows are contiguous for attention.
#include <memory>
#include <vector>

#include "core/buffer.h"
#include "ops/ref/attention.h"
#include "veloxquant/kv_cache.h"

namespace vq {

class DenseCache final : public KVCache {
 public:
  static constexpr int kPageTokens = 256;
  // fp32 = false: fp16 storage.
  DenseCache(const KVGeometry& g, bool fp32);

  void append(const float* k, const float* v, int n_tokens) override;
  void attend(const float* q, int n_q, float scale, float* out) const override;
  void attend_window(const float* q, int n_q, float scale, float* out, int64_t window) const override;
  int64_t size() const override { return n_; }
  void clear() override;
  size_t bytes() const override;
  const KVGeometry& geometry() const override { return geo_; }
  std::string name() const override { return fp32_ ? "fp32" : "fp16"; }

  // Copies token t of KV head h (keys and values) out as f32 (tests, calibration).
  void read(int64_t t, int h, float* k, float* v) const;

 private:
  size_t elem_bytes() const { return fp32_ ? 4 : 2; }
  size_t page_bytes() const;
  // Start of the rows of KV head h in page p: K when kind = 0, V when kind = 1.
  const uint8_t* rows(size_t page, int kind, int h) const;
  // Kernel arguments for the keys of KV head kvh in `page` from slot `first` on (the caller sets
  // n_q, q, n_keys, n_visible and the state).
  ref::DenseAttnArgs page_args(size_t page, int kvh, int64_t first, float scale) const;

  KVGeometry geo_;
  bool fp32_;
  int64_t n_ = 0;
  // pages_[p]: keys [n_kv_heads][head_dim][kPageTokens] (channel-major), then values
  // [n_kv_heads][kPageTokens][head_dim] (row-major); fp16 bits or f32.
  std::vector<AlignedBuffer<uint8_t>> pages_;
};

// Checks a geometry (throws naming the field).
void check_geometry(const KVGeometry& g, const char* who);

}  // namespace vq
