#include "kvcache/kivi_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bitpack.h"
#include "core/error.h"
#include "core/fp16.h"
#include "kvcache/attend_driver.h"
#include "kvcache/dense_cache.h"
#include "ops/cpu/scalar_attention.h"

namespace vq {

namespace {
void put_f16(uint8_t* p, float x) {
  const uint16_t h = f32_to_f16(x);
  std::memcpy(p, &h, 2);
}
float get_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
// Asymmetric quantization parameters of values in [lo, hi] with b bits; the fp16-rounded scale and
// min are what decoding uses, so codes are computed against them.
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
}  // namespace

KiviCache::KiviCache(const KVGeometry& g, const KVCacheConfig& cfg)
    : geo_(g), cfg_(cfg), G_(cfg.kivi_group), bits_(cfg.kivi_bits), window_(g.n_kv_heads, g.head_dim) {
  check_geometry(g, "kivi cache");
  cfg_.validate(g.head_dim);
  krow_ = packed_row_bytes(g.head_dim, bits_);
  groups_per_page_ = std::max(1, 256 / G_);
}

const uint8_t* KiviCache::kgroup(int64_t group, int h) const {
  const size_t page = size_t(group / groups_per_page_), slot = size_t(group % groups_per_page_);
  return kpages_[page].data() + (size_t(h) * groups_per_page_ + slot) * kgroup_bytes();
}
const uint8_t* KiviCache::vtoken(int64_t t, int h) const {
  const int64_t per_page = int64_t(groups_per_page_) * G_;
  const size_t page = size_t(t / per_page), slot = size_t(t % per_page);
  return vpages_[page].data() + (size_t(h) * per_page + slot) * vtoken_bytes();
}

void KiviCache::append(const float* k, const float* v, int n_tokens) {
  VQ_CHECK(n_tokens >= 0, "{} append: n_tokens = {} must be >= 0", name(), n_tokens);
  const int64_t excess = window_.size() - cfg_.residual_length;
  if (excess >= G_) flush(excess / G_ * G_);
  window_.push(k, v, n_tokens);
}

void KiviCache::flush(int64_t n) {
  const int H = geo_.n_kv_heads, D = geo_.head_dim;
  std::vector<float> kf(size_t(H) * n * D), vf(size_t(H) * n * D);  // [H, n, D] f32
  window_.pop_front(int(n), kf.data(), vf.data());
  std::vector<uint16_t> codes(static_cast<size_t>(D));
  const int64_t per_page = int64_t(groups_per_page_) * G_;
  for (int64_t g0 = 0; g0 < n; g0 += G_) {
    const int64_t group = (n_coded_ + g0) / G_;
    if (size_t(group / groups_per_page_) >= kpages_.size()) {
      kpages_.emplace_back(size_t(H) * groups_per_page_ * kgroup_bytes());
      vpages_.emplace_back(size_t(H) * per_page * vtoken_bytes());
    }
    for (int h = 0; h < H; ++h) {
      const float* kh = kf.data() + (size_t(h) * n + g0) * D;  // [G, D]
      uint8_t* kg = const_cast<uint8_t*>(kgroup(group, h));
      std::vector<float> sc(static_cast<size_t>(D)), mn(static_cast<size_t>(D));
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
      for (int t = 0; t < G_; ++t) {
        const float* x = vf.data() + (size_t(h) * n + g0 + t) * D;
        uint8_t* vt = const_cast<uint8_t*>(vtoken(n_coded_ + g0 + t, h));
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
  n_coded_ += n;
}

void KiviCache::attend(const float* q, int n_q, float scale, float* out) const {
  const int HQ = geo_.n_heads, H = geo_.n_kv_heads, D = geo_.head_dim, GQ = HQ / H;
  const int64_t n = size(), per_page = int64_t(groups_per_page_) * G_;
  AttnProblem p{n_q, HQ, H, D, n, per_page};
  run_attention(p, [&](int h, int q0, int q1, int64_t t0, int64_t t1, float* m, float* d, float* o) {
    std::vector<float> qs(size_t(GQ) * D);  // qs: [GQ, D] the group's queries * scale
    for (int i = q0; i < q1; ++i) {
      const int64_t lim = std::min(t1, n - n_q + i + 1);
      const int64_t c1 = std::min(lim, n_coded_);
      float* mi = m + size_t(i - q0) * GQ;
      float* di = d + size_t(i - q0) * GQ;
      float* oi = o + size_t(i - q0) * GQ * D;
      if (c1 > t0) {
        const float* qi = q + (int64_t(i) * HQ + int64_t(h) * GQ) * D;
        for (size_t c = 0; c < qs.size(); ++c) qs[c] = qi[c] * scale;
        cpu::KiviAttnArgs a;
        a.group = GQ;
        a.head_dim = D;
        a.bits = bits_;
        a.kivi_group = G_;
        a.q = qs.data();
        a.k_group_stride = kgroup_bytes();
        a.v_stride = vtoken_bytes();
        a.m = mi;
        a.d = di;
        a.o = oi;
        // page by page (t0 is a multiple of the page's tokens, so every range starts a key group)
        for (int64_t t = t0; t < c1;) {
          const int64_t nt = std::min<int64_t>(per_page - t % per_page, c1 - t);
          a.n_tokens = int(nt);
          a.k_groups = kgroup(t / G_, h);
          a.v_rows = vtoken(t, h);
          cpu::kivi_attention(a);
          t += nt;
        }
      }
      const int64_t r0 = std::max(t0, n_coded_);
      if (lim > r0) {
        const int64_t vis = lim - n_coded_;
        window_.attend(h, q + (size_t(i) * HQ + size_t(h) * GQ) * D, 0, 1, GQ, scale, &vis, r0 - n_coded_,
                       lim - n_coded_, mi, di, oi);
      }
    }
  }, out);
}

void KiviCache::clear() {
  kpages_.clear();
  vpages_.clear();
  window_.clear();
  n_coded_ = 0;
}

size_t KiviCache::bytes() const {
  size_t b = window_.bytes();
  for (auto& p : kpages_) b += p.bytes();
  for (auto& p : vpages_) b += p.bytes();
  return b;
}

}  // namespace vq
