// The coded block formats of q8_0 / q4_0 (direct) and KIVI (windowed); VecInfer's is in
// vecinfer_format.cpp.
#include "kvcache/kv_format.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec/scalar_blocks.h"
#include "core/bitpack.h"
#include "core/error.h"
#include "core/fp16.h"
#include "kvcache/factory.h"
#include "ops/cpu/scalar_attention.h"

namespace vq {

std::unique_ptr<CodedFormat> make_vecinfer_format(const KVCacheConfig& cfg, const Calibration* calib, int layer,
                                                  const KVGeometry& g, int block_tokens);  // vecinfer_format.cpp
std::unique_ptr<CodedFormat> make_hadamard_q4_format(const KVGeometry& g, int block_tokens);  // hadamard_format.cpp (eval helper)

void CodedFormat::encode_block(float*, float*, uint8_t*) const {
  VQ_FAIL("{} cache: encode_block is not defined for this format", name());
}
void CodedFormat::write_tokens(const float*, const float*, int, int, uint8_t*) const {
  VQ_FAIL("{} cache: write_tokens is not defined for this format", name());
}

ScaledQueries::ScaledQueries(const float* q, int n_q, const KVGeometry& g, float scale)
    : n_heads_(g.n_heads), group_(g.n_heads / g.n_kv_heads), head_dim_(g.head_dim) {
  const size_t n = size_t(n_q) * g.n_heads * g.head_dim;
  q_ = std::make_unique<float[]>(n);
  for (size_t i = 0; i < n; ++i) q_[i] = q[i] * scale;
}

std::unique_ptr<QueryPrep> CodedFormat::prepare(const float* q, int n_q, float scale) const {
  return std::make_unique<ScaledQueries>(q, n_q, geo_, scale);
}

namespace {

// Whether the fp16 value at p is finite (its exponent is not all ones).
bool f16_finite_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return (h & 0x7c00u) != 0x7c00u;
}

void put_f16(uint8_t* p, float x) {
  const uint16_t h = f32_to_f16(x);
  std::memcpy(p, &h, 2);
}

// q8_0 / q4_0 (llama.cpp's block-32 formats, codec/scalar_blocks.h), written per token.
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
    // Every 32-value block starts with its fp16 scale d.
    const size_t n = block_bytes() / qblock_;
    for (size_t i = 0; i < n; ++i)
      if (!f16_finite_at(block + i * qblock_)) return false;
    return true;
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
              float* d, float* o) const override {
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
      cpu::block_quant_attention(a);
      done += nt;
      slot = 0;
    }
  }

 private:
  bool q4_;
  size_t qblock_;
};

// Asymmetric min/max quantization parameters of values in [lo, hi] with b bits; the fp16-rounded
// scale and min are what decoding uses, so codes are computed against them.
void minmax_params(float lo, float hi, int bits, float& scale, float& mn) {
  mn = f16_to_f32(f32_to_f16(lo));
  const float s = (hi - mn) / float((1 << bits) - 1);
  scale = f16_to_f32(f32_to_f16(s));
}
uint16_t quant(float x, float scale, float mn, int bits) {
  if (scale <= 0) return 0;
  const int q = int(std::lround((x - mn) / scale));
  return uint16_t(std::clamp(q, 0, (1 << bits) - 1));
}

// KIVI: keys per channel over groups of G tokens (fp16 scale and min per channel per group),
// values per token over groups of G channels; b in {2, 4}. Block (G divides block_tokens):
//   keys:   [n_kv_heads][block_tokens / G groups][scale D fp16 | min D fp16 | G rows of codes]
//   values: [n_kv_heads][block_tokens][(scale, min) fp16 per channel group | codes]
class KiviFormat final : public CodedFormat {
 public:
  KiviFormat(const KVGeometry& g, int B, const KVCacheConfig& cfg)
      : CodedFormat(g, B), G_(cfg.kivi_group), bits_(cfg.kivi_bits), name_(cfg.name()) {
    VQ_CHECK(B % G_ == 0, "kivi cache: block of {} tokens is not a multiple of the group {}", B, G_);
    krow_ = packed_row_bytes(g.head_dim, bits_);
  }
  std::string name() const override { return name_; }
  size_t kgroup_bytes() const { return size_t(geo_.head_dim) * 4 + size_t(G_) * krow_; }
  size_t vtoken_bytes() const { return size_t(geo_.head_dim / G_) * 4 + krow_; }
  size_t keys_bytes() const { return size_t(geo_.n_kv_heads) * (B_ / G_) * kgroup_bytes(); }
  size_t block_bytes() const override { return keys_bytes() + size_t(geo_.n_kv_heads) * B_ * vtoken_bytes(); }

  bool block_finite(const uint8_t* block) const override {
    const int H = geo_.n_kv_heads, D = geo_.head_dim;
    for (size_t g = 0; g < size_t(H) * size_t(B_ / G_); ++g)  // scale D | min D of each key group
      for (int c = 0; c < 2 * D; ++c)
        if (!f16_finite_at(block + g * kgroup_bytes() + size_t(c) * 2)) return false;
    for (size_t t = 0; t < size_t(H) * size_t(B_); ++t)  // (scale, min) per channel group of each value
      for (int c = 0; c < 2 * (D / G_); ++c)
        if (!f16_finite_at(block + keys_bytes() + t * vtoken_bytes() + size_t(c) * 2)) return false;
    return true;
  }

  void encode_block(float* kf, float* vf, uint8_t* block) const override {
    const int H = geo_.n_kv_heads, D = geo_.head_dim;
    std::vector<uint16_t> codes(static_cast<size_t>(D));
    std::vector<float> sc(static_cast<size_t>(D)), mn(static_cast<size_t>(D));
    for (int h = 0; h < H; ++h) {
      for (int g0 = 0; g0 < B_; g0 += G_) {
        const float* kh = kf + (size_t(h) * B_ + size_t(g0)) * D;  // [G, D]
        uint8_t* kg = block + (size_t(h) * (B_ / G_) + size_t(g0 / G_)) * kgroup_bytes();
        for (int c = 0; c < D; ++c) {
          float lo = INFINITY, hi = -INFINITY;
          for (int t = 0; t < G_; ++t) {
            lo = std::min(lo, kh[t * D + c]);
            hi = std::max(hi, kh[t * D + c]);
          }
          minmax_params(lo, hi, bits_, sc[size_t(c)], mn[size_t(c)]);
          put_f16(kg + size_t(c) * 2, sc[size_t(c)]);
          put_f16(kg + size_t(D) * 2 + size_t(c) * 2, mn[size_t(c)]);
        }
        for (int t = 0; t < G_; ++t) {
          for (int c = 0; c < D; ++c) codes[size_t(c)] = quant(kh[t * D + c], sc[size_t(c)], mn[size_t(c)], bits_);
          pack_codes(codes.data(), D, bits_, kg + size_t(D) * 4 + size_t(t) * krow_);
        }
      }
      for (int t = 0; t < B_; ++t) {
        const float* x = vf + (size_t(h) * B_ + size_t(t)) * D;
        uint8_t* vt = block + keys_bytes() + (size_t(h) * B_ + size_t(t)) * vtoken_bytes();
        for (int cg = 0; cg < D / G_; ++cg) {
          float lo = INFINITY, hi = -INFINITY;
          for (int c = cg * G_; c < (cg + 1) * G_; ++c) {
            lo = std::min(lo, x[c]);
            hi = std::max(hi, x[c]);
          }
          float s, m;
          minmax_params(lo, hi, bits_, s, m);
          put_f16(vt + size_t(cg) * 4, s);
          put_f16(vt + size_t(cg) * 4 + 2, m);
          for (int c = cg * G_; c < (cg + 1) * G_; ++c) codes[size_t(c)] = quant(x[c], s, m, bits_);
        }
        pack_codes(codes.data(), D, bits_, vt + size_t(D / G_) * 4);
      }
    }
  }

  void attend(const QueryPrep& prep, int i, int h, const uint8_t* const* blocks, int first, int64_t n, float* m,
              float* d, float* o) const override {
    cpu::KiviAttnArgs a;
    a.group = geo_.n_heads / geo_.n_kv_heads;
    a.head_dim = geo_.head_dim;
    a.bits = bits_;
    a.kivi_group = G_;
    a.q = static_cast<const ScaledQueries&>(prep).at(i, h);
    a.k_group_stride = kgroup_bytes();
    a.v_stride = vtoken_bytes();
    a.m = m;
    a.d = d;
    a.o = o;
    int slot = first;
    for (int64_t done = 0; done < n; ++blocks) {
      const int nt = int(std::min<int64_t>(B_ - slot, n - done));
      const uint8_t* base = *blocks;
      a.k_groups = base + size_t(h) * (B_ / G_) * kgroup_bytes();
      a.v_rows = base + keys_bytes() + size_t(h) * B_ * vtoken_bytes();
      a.first = slot;
      a.n_tokens = nt;
      cpu::kivi_attention(a);
      done += nt;
      slot = 0;
    }
  }

 private:
  int G_, bits_;
  std::string name_;
  size_t krow_;
};

}  // namespace

std::unique_ptr<CodedFormat> make_coded_format(const KVCacheConfig& cfg, const Calibration* calib, int layer,
                                               const KVGeometry& g, int block_tokens) {
  switch (cfg.method) {
    case KVMethod::fp16:
    case KVMethod::fp32: return nullptr;
    case KVMethod::q8_0: return std::make_unique<ScalarBlockFormat>(g, block_tokens, false);
    case KVMethod::q4_0: return std::make_unique<ScalarBlockFormat>(g, block_tokens, true);
    case KVMethod::kivi: return std::make_unique<KiviFormat>(g, block_tokens, cfg);
    case KVMethod::vecinfer: return make_vecinfer_format(cfg, calib, layer, g, block_tokens);
    case KVMethod::q4_0h: return make_hadamard_q4_format(g, block_tokens);
  }
  VQ_FAIL("kv cache {}: no coded format", cfg.name());
}

}  // namespace vq
