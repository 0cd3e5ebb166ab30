// q5_0: llama.cpp's 5-bit block format (GGML type Q5_0) as a KV method, added only through the
// registry (docs/HOWTO-add-a-kv-method.md uses it as the worked example). Direct: every token is
// coded on append, no fp16 window. 5.5 bits per element.
//
// One block of 32 elements, 22 bytes: d (fp16 scale) | qh (uint32, bit j = the 5th bit of element
// j) | qs[16] (element j's low nibble in byte j & 15, elements 0..15 in the low halves, 16..31 in
// the high halves). Element = (q - 16) * d with q in 0..31; d = m / -16 where m is the element
// of largest magnitude (its sign kept), so m itself maps to q = 0 exactly.
// Cache block: [2 (K, V)][n_kv_heads][block_tokens][head_dim/32 blocks of 22 bytes].
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kvcache/kv_format.h"
#include "kvcache/kv_method.h"

namespace vq {
namespace {

constexpr int kQK = 32;          // elements per block
constexpr size_t kBlock = 22;    // bytes per block

void quantize_block(const float* x, uint8_t* out) {
  float m = 0, amax = 0;
  for (int j = 0; j < kQK; ++j)
    if (std::fabs(x[j]) > amax) amax = std::fabs(x[j]), m = x[j];
  const float d = m / -16.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  uint32_t qh = 0;
  uint8_t qs[16];
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(31, int(x[j] * id + 16.5f));
    const int hi = std::min(31, int(x[j + 16] * id + 16.5f));
    qs[j] = uint8_t((lo & 15) | ((hi & 15) << 4));
    qh |= uint32_t((lo >> 4) & 1) << j;
    qh |= uint32_t((hi >> 4) & 1) << (j + 16);
  }
  std::memcpy(out, &dh, 2);
  std::memcpy(out + 2, &qh, 4);
  std::memcpy(out + 6, qs, 16);
}

void dequantize_block(const uint8_t* in, float* y) {
  uint16_t dh;
  uint32_t qh;
  std::memcpy(&dh, in, 2);
  std::memcpy(&qh, in + 2, 4);
  const float d = f16_to_f32(dh);
  const uint8_t* qs = in + 6;
  for (int j = 0; j < 16; ++j) {
    const int lo = (qs[j] & 15) | int(((qh >> j) & 1) << 4);
    const int hi = (qs[j] >> 4) | int(((qh >> (j + 16)) & 1) << 4);
    y[j] = float(lo - 16) * d;
    y[j + 16] = float(hi - 16) * d;
  }
}

class Q50Format final : public CodedFormat {
 public:
  Q50Format(const KVGeometry& g, int B) : CodedFormat(g, B) {
    VQ_CHECK(g.head_dim % kQK == 0, "q5_0 cache: head_dim {} must be a multiple of the block size 32", g.head_dim);
  }
  std::string name() const override { return "q5_0"; }
  bool direct() const override { return true; }
  size_t row_bytes() const { return size_t(geo_.head_dim / kQK) * kBlock; }
  size_t block_bytes() const override { return 2 * size_t(geo_.n_kv_heads) * B_ * row_bytes(); }
  bool block_finite(const uint8_t* block) const override {
    return f16_all_finite(block, block_bytes() / kBlock, kBlock);  // each 32-value block starts with its scale
  }
  const uint8_t* row(const uint8_t* block, int kind, int h, int slot) const {
    return block + ((size_t(kind) * geo_.n_kv_heads + size_t(h)) * B_ + size_t(slot)) * row_bytes();
  }

  void write_tokens(const float* k, const float* v, int n, int slot, uint8_t* block) const override {
    const int H = geo_.n_kv_heads, D = geo_.head_dim;
    for (int i = 0; i < n; ++i)
      for (int kind = 0; kind < 2; ++kind)
        for (int h = 0; h < H; ++h) {
          const float* x = (kind == 0 ? k : v) + (size_t(i) * H + size_t(h)) * D;
          uint8_t* dst = const_cast<uint8_t*>(row(block, kind, h, slot + i));
          for (int b = 0; b < D / kQK; ++b) quantize_block(x + b * kQK, dst + size_t(b) * kBlock);
        }
  }

  // Decodes each token's K and V rows and folds them into the online softmax (a plain scalar
  // kernel: the method's point is the format, not the speed).
  void attend(const QueryPrep& prep, int i, int h, const uint8_t* const* blocks, int first, int64_t n, float* m,
              float* d, float* o, int64_t) const override {
    const int G = geo_.n_heads / geo_.n_kv_heads, D = geo_.head_dim;
    const float* q = static_cast<const ScaledQueries&>(prep).at(i, h);  // [G, D], already scaled
    std::vector<float> kr(static_cast<size_t>(D)), vr(static_cast<size_t>(D));
    for (int64_t t = 0; t < n; ++t) {
      const int64_t u = first + t;
      const uint8_t* blk = blocks[u / B_];
      const int slot = int(u % B_);
      for (int b = 0; b < D / kQK; ++b) {
        dequantize_block(row(blk, 0, h, slot) + size_t(b) * kBlock, kr.data() + b * kQK);
        dequantize_block(row(blk, 1, h, slot) + size_t(b) * kBlock, vr.data() + b * kQK);
      }
      for (int g = 0; g < G; ++g) {
        float s = 0;
        for (int e = 0; e < D; ++e) s += q[size_t(g) * D + e] * kr[size_t(e)];
        const float m_new = std::max(m[g], s);
        const float keep = std::exp(m[g] - m_new), w = std::exp(s - m_new);
        m[g] = m_new;
        d[g] = d[g] * keep + w;
        for (int e = 0; e < D; ++e) o[size_t(g) * D + e] = o[size_t(g) * D + e] * keep + w * vr[size_t(e)];
      }
    }
  }
};

class Q50Method final : public KVMethodDef {
 public:
  KVMethod id() const override { return KVMethod::q5_0; }
  std::string name() const override { return "q5_0"; }
  std::string help() const override {
    return "  q5_0                 llama.cpp's 5-bit 32-element blocks (5.5 bits); no options; head_dim % 32 == 0\n";
  }
  double bits_per_element(const KVCacheConfig&) const override { return 5.5; }  // 5 bits + fp16 scale per 32
  bool direct() const override { return true; }
  void validate(const KVCacheConfig&, int hd) const override {
    if (hd > 0)
      VQ_CHECK(hd % kQK == 0, "kv_cache.method: q5_0 needs head_dim divisible by its block of 32 (head_dim {})", hd);
  }
  std::unique_ptr<CodedFormat> make_format(const KVCacheConfig&, const Calibration*, int, const KVGeometry& g,
                                           int block_tokens) const override {
    return std::make_unique<Q50Format>(g, block_tokens);
  }
  // The device reads and writes these blocks (ops/cuda/scalar_blocks.cuh knows the q5_0 type).
  bool has_device_format() const override { return true; }
  DeviceScalar device_scalar() const override { return {DeviceScalarBlocks::q5_0}; }
};

}  // namespace

const KVMethodDef& q5_0_method() {
  static const Q50Method m;
  return m;
}

}  // namespace vq
