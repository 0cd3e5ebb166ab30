// q4_0h: llama.cpp's q4_0 blocks of 32 written after an orthonormal Walsh-Hadamard rotation of
// every key and value row (as llama.cpp now does for quantized KV caches). The rotation spreads
// the few large channels of real keys over the whole head, so one fp16 scale per 32 elements no
// longer has to cover an outlier; q.k is unchanged (q is rotated too) and the values' rotation is
// undone on the attention output (H is symmetric and its own inverse). Direct format: each token
// is coded on append, no fp16 window (as q4_0). 4.5 bits per element.
// The block and the attention kernel are q4_0's (methods/scalar.cpp): this format wraps that one and
// rotates what goes in (keys, values, queries) and what comes out (the output).
#include <vector>

#include "codec/key_transform.h"
#include "core/error.h"
#include "kvcache/kv_format.h"
#include "kvcache/kv_method.h"

namespace vq {
namespace {

class HadamardFormat final : public CodedFormat {
 public:
  HadamardFormat(const KVGeometry& g, int B, std::unique_ptr<CodedFormat> inner, std::string name)
      : CodedFormat(g, B), inner_(std::move(inner)), name_(std::move(name)) {
    (void)hadamard_block(g.head_dim);  // throws for a head_dim the rotation cannot mix
  }
  std::string name() const override { return name_; }
  bool direct() const override { return inner_->direct(); }
  size_t block_bytes() const override { return inner_->block_bytes(); }
  bool block_finite(const uint8_t* block) const override { return inner_->block_finite(block); }

  void write_tokens(const float* k, const float* v, int n, int slot, uint8_t* block) const override {
    // kr, vr: [n, n_kv_heads, head_dim] the rotated rows
    std::vector<float> kr(k, k + rows(n) * size_t(geo_.head_dim)), vr(v, v + rows(n) * size_t(geo_.head_dim));
    rotate(kr.data(), rows(n));
    rotate(vr.data(), rows(n));
    inner_->write_tokens(kr.data(), vr.data(), n, slot, block);
  }

  // The inner format's query state, made from the rotated queries H q: scores against the
  // rotated keys are the scores against the keys.
  std::unique_ptr<QueryPrep> prepare(const float* q, int n_q, float scale) const override {
    std::vector<float> qr(q, q + size_t(n_q) * geo_.n_heads * geo_.head_dim);  // [n_q, n_heads, head_dim]
    rotate(qr.data(), size_t(n_q) * geo_.n_heads);
    return inner_->prepare(qr.data(), n_q, scale);
  }

  void attend(const QueryPrep& prep, int i, int h, const uint8_t* const* blocks, int first, int64_t n, float* m,
              float* d, float* o, int64_t pos0) const override {
    // The kernel accumulates rotated values: carry the running output into the rotated space
    // (H o) and back (H H o~ = o) around it; m and d are scores-only and need nothing.
    const size_t group = size_t(geo_.n_heads / geo_.n_kv_heads);
    rotate(o, group);
    inner_->attend(prep, i, h, blocks, first, n, m, d, o, pos0);
    rotate(o, group);
  }

 private:
  size_t rows(int n) const { return size_t(n) * size_t(geo_.n_kv_heads); }
  void rotate(float* x, size_t n_rows) const {
    for (size_t r = 0; r < n_rows; ++r) fwht_inplace(x + r * size_t(geo_.head_dim), geo_.head_dim);
  }

  std::unique_ptr<CodedFormat> inner_;
  std::string name_;
};

}  // namespace

std::unique_ptr<CodedFormat> make_hadamard_q4_format(const KVGeometry& g, int block_tokens) {
  KVCacheConfig q4;
  q4.method = KVMethod::q4_0;
  return std::make_unique<HadamardFormat>(g, block_tokens, make_coded_format(q4, nullptr, 0, g, block_tokens),
                                          "q4_0h");
}

namespace {
class Q40hMethod final : public KVMethodDef {
 public:
  KVMethod id() const override { return KVMethod::q4_0h; }
  std::string name() const override { return "q4_0h"; }
  std::string help() const override {
    return "  q4_0h                q4_0 after a Walsh-Hadamard rotation of every key and value row (4.5 bits); no options\n";
  }
  double bits_per_element(const KVCacheConfig&) const override { return 4.5; }  // q4_0 blocks of the rotated rows
  bool direct() const override { return true; }
  bool has_device_format() const override { return true; }
  DeviceScalar device_scalar() const override { return {DeviceScalarBlocks::q4_0, true}; }
  void validate(const KVCacheConfig&, int hd) const override {
    if (hd > 0)
      VQ_CHECK(hd % 32 == 0, "kv_cache.method: {} needs head_dim divisible by its block of 32 (head_dim {})", name(), hd);
  }
  std::unique_ptr<CodedFormat> make_format(const KVCacheConfig&, const Calibration*, int, const KVGeometry& g,
                                           int block_tokens) const override {
    return make_hadamard_q4_format(g, block_tokens);
  }
};
}  // namespace

const KVMethodDef& q4_0h_method() {
  static const Q40hMethod m;
  return m;
}

}  // namespace vq
