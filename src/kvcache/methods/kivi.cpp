// KIVI (Liu et al. 2024): asymmetric 2- or 4-bit codes, keys per channel, values per token;
// windowed (recent tokens in fp16). Spec: kivi2, kivi4 or kivi,b=2|4; g=N group, r=N window.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include <fmt/format.h>

#include "core/bitpack.h"
#include "core/error.h"
#include "core/fp16.h"
#include "kvcache/kv_format.h"
#include "kvcache/kv_method.h"
#include "ops/cpu/scalar_attention.h"

namespace vq {
namespace {

void put_f16(uint8_t* p, float x) {
  const uint16_t h = f32_to_f16(x);
  std::memcpy(p, &h, 2);
}

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
      if (!f16_all_finite(block + g * kgroup_bytes(), size_t(2 * D))) return false;
    for (size_t t = 0; t < size_t(H) * size_t(B_); ++t)  // (scale, min) per channel group of each value
      if (!f16_all_finite(block + keys_bytes() + t * vtoken_bytes(), size_t(2 * (D / G_)))) return false;
    return true;
  }

  void encode_block(float* kf, float* vf, uint8_t* block, int64_t) const override {
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
              float* d, float* o, int64_t) const override {
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

class KiviMethod final : public KVMethodDef {
 public:
  KVMethod id() const override { return KVMethod::kivi; }
  std::string name() const override { return "kivi"; }
  std::string device_why_not() const override {
    return "no device kernel reads its per-channel key groups with zero points (the device kernels read fp16 "
           "blocks, llama.cpp's per-token scalar blocks and VecInfer codes)";
  }
  std::vector<std::string> heads() const override { return {"kivi", "kivi2", "kivi4"}; }
  void take_head(const std::string& head, KVCacheConfig& c) const override {
    c.method = KVMethod::kivi;
    c.kivi_bits = head == "kivi4" ? 4 : 2;  // kivi alone: kivi2
  }
  std::vector<KVSpecOption> options(const std::string& head) const override {
    std::vector<KVSpecOption> o{{"r", {"residual"}}, {"g", {"group"}}};
    if (head == "kivi") o.push_back({"b", {"bits"}});  // kivi2/kivi4 already say the bits
    return o;
  }
  void set_option(const std::string& key, const std::string& val, KVCacheConfig& c,
                  const std::string& spec) const override {
    if (key == "r") c.residual_length = parse_spec_int(val, spec, "residual length");
    else if (key == "g") c.kivi_group = parse_spec_int(val, spec, "group size");
    else if (key == "b") c.kivi_bits = parse_spec_int(val, spec, "bits");
  }
  std::string help() const override {
    return "  kivi2, kivi4         KIVI 2- or 4-bit (also kivi,b=2|4; kivi alone = kivi2); options:\n"
           "                         g=N  group size 1..4096 dividing head_dim (default 32)\n"
           "                         r=N  recent tokens kept in fp16, 0..1048576 (default 128)\n";
  }
  std::vector<std::string> presets() const override { return {"kivi4", "kivi2"}; }
  std::vector<std::string> examples() const override { return {"kivi2,r=64"}; }
  std::string canonical(const KVCacheConfig& c) const override { return fmt::format("kivi{}", c.kivi_bits); }
  void validate(const KVCacheConfig& c, int hd) const override {
    VQ_CHECK(c.kivi_bits == 2 || c.kivi_bits == 4, "kv_cache.kivi_bits: {} must be 2 or 4", c.kivi_bits);
    VQ_CHECK(c.kivi_group >= 1 && c.kivi_group <= 4096, "kv_cache.kivi_group: {} must be in 1..4096", c.kivi_group);
    if (hd > 0)
      VQ_CHECK(hd % c.kivi_group == 0,
               "kv_cache.kivi_group: {} must divide head_dim {} (values are grouped by channel)", c.kivi_group, hd);
  }
  double bits_per_element(const KVCacheConfig& c) const override {
    return c.kivi_bits + 32.0 / c.kivi_group;  // fp16 scale + min per group
  }
  bool windowed() const override { return true; }
  int default_block_tokens(const KVCacheConfig& c) const override {
    // Key groups must not straddle blocks; the dense kernel wants multiples of 16.
    int b = std::lcm(16, std::max(1, c.kivi_group));
    while (b < 32) b *= 2;
    return b;
  }
  std::unique_ptr<CodedFormat> make_format(const KVCacheConfig& c, const Calibration*, int, const KVGeometry& g,
                                           int block_tokens) const override {
    return std::make_unique<KiviFormat>(g, block_tokens, c);
  }
};

}  // namespace

const KVMethodDef& kivi_method() {
  static const KiviMethod m;
  return m;
}

}  // namespace vq
