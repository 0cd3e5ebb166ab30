// q8_0 and q4_0: llama.cpp's block-32 scalar formats (codec/scalar_blocks.h), written per token
// (direct: no fp16 window). q4_0h (q4_0.h's rotated variant) wraps q4_0's format.
#include <algorithm>

#include "codec/scalar_blocks.h"
#include "core/error.h"
#include "kvcache/kv_format.h"
#include "kvcache/kv_method.h"
#include "ops/cpu/scalar_attention.h"

namespace vq {
namespace {

// Block: [2 (K, V)][n_kv_heads][block_tokens][head_dim/32 blocks of 34 or 18 bytes].
class ScalarBlockFormat final : public CodedFormat {
 public:
  ScalarBlockFormat(const KVGeometry& g, int B, bool q4) : CodedFormat(g, B), q4_(q4), qblock_(q4 ? 18 : 34) {
    VQ_CHECK(g.head_dim % 32 == 0, "{} cache: head_dim {} must be a multiple of the block size 32", name(), g.head_dim);
  }
  std::string name() const override { return q4_ ? "q4_0" : "q8_0"; }
  bool direct() const override { return true; }
  size_t row_bytes() const { return size_t(geo_.head_dim / 32) * qblock_; }
  size_t block_bytes() const override { return 2 * size_t(geo_.n_kv_heads) * B_ * row_bytes(); }
  bool block_finite(const uint8_t* block) const override {
    return f16_all_finite(block, block_bytes() / qblock_, qblock_);  // each 32-value block starts with its scale
  }
  uint8_t* row(uint8_t* block, int kind, int h, int slot) const {
    return block + ((size_t(kind) * geo_.n_kv_heads + size_t(h)) * B_ + size_t(slot)) * row_bytes();
  }

  void write_tokens(const float* k, const float* v, int n, int slot, uint8_t* block) const override {
    const int H = geo_.n_kv_heads, D = geo_.head_dim;
    for (int i = 0; i < n; ++i)
      for (int kind = 0; kind < 2; ++kind)
        for (int h = 0; h < H; ++h) {
          const float* x = (kind == 0 ? k : v) + (size_t(i) * H + size_t(h)) * D;
          uint8_t* dst = row(block, kind, h, slot + i);
          for (int b = 0; b < D / 32; ++b) {
            if (q4_) quantize_q4_0(x + b * 32, dst + size_t(b) * qblock_);
            else quantize_q8_0(x + b * 32, dst + size_t(b) * qblock_);
          }
        }
  }

  void attend(const QueryPrep& prep, int i, int h, const uint8_t* const* blocks, int first, int64_t n, float* m,
              float* d, float* o, int64_t) const override {
    cpu::BlockQuantAttnArgs a;
    a.group = geo_.n_heads / geo_.n_kv_heads;
    a.head_dim = geo_.head_dim;
    a.q4 = q4_;
    a.q = static_cast<const ScaledQueries&>(prep).at(i, h);
    a.row_stride = row_bytes();
    a.m = m;
    a.d = d;
    a.o = o;
    int slot = first;
    for (int64_t done = 0; done < n; ++blocks) {
      const int nt = int(std::min<int64_t>(B_ - slot, n - done));
      uint8_t* base = const_cast<uint8_t*>(*blocks);
      a.n_tokens = nt;
      a.k_rows = row(base, 0, h, slot);
      a.v_rows = row(base, 1, h, slot);
      a.next_tokens = int(std::min<int64_t>(B_, n - done - nt));
      if (a.next_tokens > 0) {
        uint8_t* next = const_cast<uint8_t*>(blocks[1]);
        a.next_k_rows = row(next, 0, h, 0);
        a.next_v_rows = row(next, 1, h, 0);
      }
      cpu::block_quant_attention(a);
      done += nt;
      slot = 0;
    }
  }

 private:
  bool q4_;
  size_t qblock_;
};

class ScalarMethod final : public KVMethodDef {
 public:
  explicit ScalarMethod(bool q4) : q4_(q4) {}
  KVMethod id() const override { return q4_ ? KVMethod::q4_0 : KVMethod::q8_0; }
  std::string name() const override { return q4_ ? "q4_0" : "q8_0"; }
  std::string help() const override {
    return q4_ ? "" : "  q8_0, q4_0           llama.cpp's 32-element blocks (8.5 / 4.5 bits); no options; head_dim % 32 == 0\n";
  }
  std::vector<std::string> examples() const override { return q4_ ? std::vector<std::string>{} : std::vector<std::string>{"q8_0"}; }
  double bits_per_element(const KVCacheConfig&) const override { return q4_ ? 4.5 : 8.5; }  // + one fp16 scale per 32
  bool direct() const override { return true; }
  bool has_device_format() const override { return true; }
  DeviceScalar device_scalar() const override { return {q4_ ? DeviceScalarBlocks::q4_0 : DeviceScalarBlocks::q8_0}; }
  void validate(const KVCacheConfig&, int hd) const override {
    if (hd > 0)
      VQ_CHECK(hd % 32 == 0, "kv_cache.method: {} needs head_dim divisible by its block of 32 (head_dim {})", name(), hd);
  }
  std::unique_ptr<CodedFormat> make_format(const KVCacheConfig&, const Calibration*, int, const KVGeometry& g,
                                           int block_tokens) const override {
    return std::make_unique<ScalarBlockFormat>(g, block_tokens, q4_);
  }

 private:
  bool q4_;
};

}  // namespace

const KVMethodDef& q8_0_method() {
  static const ScalarMethod m(false);
  return m;
}
const KVMethodDef& q4_0_method() {
  static const ScalarMethod m(true);
  return m;
}

}  // namespace vq
