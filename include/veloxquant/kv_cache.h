#pragma once
// The KV-cache interface: the model appends keys/values and attends through it, never
// seeing how K and V are stored. No CUDA types here.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "veloxquant/status.h"

namespace vq {

struct KVGeometry {
  int n_heads = 0;     // query heads
  int n_kv_heads = 0;  // key/value heads (GQA: n_heads % n_kv_heads == 0)
  int head_dim = 0;
};

class KVCache {
 public:
  virtual ~KVCache() = default;

  // Appends n_tokens tokens.
  // k, v: [n_tokens, n_kv_heads, head_dim] float32, row-major; keys after RoPE.
  virtual void append(const float* k, const float* v, int n_tokens) = 0;

  // Causal attention for the last n_q tokens appended: query i sits at position
  // size() - n_q + i and attends to cached tokens [0, size() - n_q + i].
  // q:   [n_q, n_heads, head_dim] float32, row-major (after RoPE).
  // out: [n_q, n_heads, head_dim] float32, row-major.
  // Query head h reads KV head h / (n_heads / n_kv_heads). scores = scale * q.k.
  virtual void attend(const float* q, int n_q, float scale, float* out) const = 0;

  virtual int64_t size() const = 0;  // tokens held
  virtual void clear() = 0;          // drops all tokens, keeps configuration

  // Bytes allocated for the stored K and V (codes, scales, fp16 residual window), excluding
  // shared read-only codebooks, which codebook_bytes() reports.
  virtual size_t bytes() const = 0;
  virtual size_t codebook_bytes() const { return 0; }
  // What the same tokens take in an fp16 cache: size() * n_kv_heads * head_dim * 2 (K,V) * 2.
  size_t fp16_bytes() const {
    return size_t(size()) * size_t(geometry().n_kv_heads) * size_t(geometry().head_dim) * 4u;
  }
  double bits_per_element() const {
    const size_t e = size_t(size()) * size_t(geometry().n_kv_heads) * size_t(geometry().head_dim) * 2u;
    return e ? 8.0 * double(bytes()) / double(e) : 0.0;
  }
  virtual const KVGeometry& geometry() const = 0;
  virtual std::string name() const = 0;  // e.g. "fp16", "vecinfer:d4b8"
};

// Makes the cache of one layer. The model calls it once per layer.
using KVCacheFactory = std::function<std::unique_ptr<KVCache>(int layer, const KVGeometry&)>;

}  // namespace vq

namespace veloxquant {
using vq::KVCache;
using vq::KVCacheFactory;
using vq::KVGeometry;
}  // namespace veloxquant
