#include "kvcache/vecinfer_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/bitpack.h"
#include "codec/key_transform.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kvcache/attend_driver.h"
#include "kvcache/dense_cache.h"
#include "kvcache/factory.h"
#include "ops/online_softmax.h"
#include "ops/cpu/pq_attention.h"
#include "ops/ref/pq_attention.h"

namespace vq {

VecInferCache::VecInferCache(const KVGeometry& g, const KVCacheConfig& cfg, std::shared_ptr<const Calibration> calib,
                             int layer)
    : geo_(g),
      cfg_(cfg),
      calib_(std::move(calib)),
      layer_(layer),
      sink_(g.n_kv_heads, g.head_dim),
      window_(g.n_kv_heads, g.head_dim) {
  check_geometry(g, "vecinfer cache");
  cfg_.validate(g.head_dim);
  VQ_CHECK(calib_, "{}", calibration_howto(cfg_));
  const Calibration& c = *calib_;
  VQ_CHECK(layer >= 0 && layer < c.n_layers, "vecinfer cache: layer {} but the calibration has {} layers", layer,
           c.n_layers);
  VQ_CHECK(c.n_kv_heads == g.n_kv_heads && c.head_dim == g.head_dim,
           "vecinfer cache: calibration is for n_kv_heads {} head_dim {}, the model has n_kv_heads {} head_dim {}",
           c.n_kv_heads, c.head_dim, g.n_kv_heads, g.head_dim);
  VQ_CHECK(c.key.sub_dim == cfg.key.sub_dim && c.key.bits == cfg.key.bits,
           "vecinfer cache: kv_cache.key is {} but the calibration's key codebooks are d{}b{} (calibrate with "
           "--kv-cache {})",
           cfg.key.name(), c.key.sub_dim, c.key.bits, cfg.name());
  VQ_CHECK(c.value.sub_dim == cfg.value.sub_dim && c.value.bits == cfg.value.bits,
           "vecinfer cache: kv_cache.value is {} but the calibration's value codebooks are d{}b{} (calibrate with "
           "--kv-cache {})",
           cfg.value.name(), c.value.sub_dim, c.value.bits, cfg.name());
  const CalibrationLayer& L = c.layers[size_t(layer)];
  lambda_ = L.smoothing.data();
  const int H = g.n_kv_heads, D = g.head_dim;
  const size_t kf = c.key_codebook_floats() / size_t(H), vf = c.value_codebook_floats() / size_t(H);
  for (int h = 0; h < H; ++h) {
    kpq_.emplace_back(D, c.key, c.granularity,
                      std::vector<float>(L.key_codebooks.begin() + h * kf, L.key_codebooks.begin() + (h + 1) * kf));
    vpq_.emplace_back(D, c.value, c.granularity,
                      std::vector<float>(L.value_codebooks.begin() + h * vf, L.value_codebooks.begin() + (h + 1) * vf));
    kbook_t_.push_back(cpu::transpose_codebook(kpq_.back().codebooks().data(), kpq_.back().n_books(), c.key.bits,
                                               c.key.sub_dim));
  }
  krow_ = kpq_[0].code_size();
  vrow_ = vpq_[0].code_size();
}

const uint8_t* VecInferCache::k_codes(int64_t page, int h) const {
  return kpages_[size_t(page)].data() + size_t(h) * kPageTokens * krow_;
}
const uint8_t* VecInferCache::v_codes(int64_t page, int h) const {
  return vpages_[size_t(page)].data() + size_t(h) * kPageTokens * vrow_;
}

void VecInferCache::append(const float* k, const float* v, int n_tokens) {
  VQ_CHECK(n_tokens >= 0, "{} append: n_tokens = {} must be >= 0", name(), n_tokens);
  // The sequence's first tokens fill the fp16 sink store (only ever at the start: the sink fills
  // before anything reaches the window).
  const int to_sink = int(std::min<int64_t>(n_tokens, cfg_.sink_tokens - sink_.size()));
  if (to_sink > 0) {
    sink_.push(k, v, to_sink);
    const size_t row = size_t(geo_.n_kv_heads) * geo_.head_dim;
    k += size_t(to_sink) * row;
    v += size_t(to_sink) * row;
    n_tokens -= to_sink;
    if (n_tokens == 0) return;
  }
  // Before the new tokens arrive, move whole blocks out of the window while at least
  // residual_length tokens stay; so the tokens being appended (and attended next) are fp16.
  const int64_t R = cfg_.residual_length;
  const int64_t excess = window_.size() - R;
  if (excess >= kBlock) flush(excess / kBlock * kBlock);
  window_.push(k, v, n_tokens);
}

void VecInferCache::flush(int64_t n) {
  const int H = geo_.n_kv_heads, D = geo_.head_dim;
  // kf, vf: [H, n, D] f32, the tokens leaving the window (head-major)
  std::vector<float> kf(size_t(H) * n * D), vf(size_t(H) * n * D);
  window_.pop_front(int(n), kf.data(), vf.data());
  for (int h = 0; h < H; ++h) transform_keys(kf.data() + size_t(h) * n * D, n, 1, D, lambda_ + size_t(h) * D);
  // packed codes: kc [H, n, krow_], vc [H, n, vrow_]
  std::vector<uint8_t> kc(size_t(H) * n * krow_), vc(size_t(H) * n * vrow_);
  parallel_for(size_t(2 * H), [&](size_t b, size_t e, int) {
    for (size_t it = b; it < e; ++it) {
      const int h = int(it / 2);
      if (it % 2 == 0) kpq_[size_t(h)].encode(kf.data() + size_t(h) * n * D, n, kc.data() + size_t(h) * n * krow_);
      else vpq_[size_t(h)].encode(vf.data() + size_t(h) * n * D, n, vc.data() + size_t(h) * n * vrow_);
    }
  });
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = n_coded_ + i;
    const size_t page = size_t(t / kPageTokens), slot = size_t(t % kPageTokens);
    if (page >= kpages_.size()) {
      kpages_.emplace_back(size_t(H) * kPageTokens * krow_);
      vpages_.emplace_back(size_t(H) * kPageTokens * vrow_);
    }
    for (int h = 0; h < H; ++h) {
      std::memcpy(kpages_[page].data() + (size_t(h) * kPageTokens + slot) * krow_, kc.data() + (size_t(h) * n + i) * krow_, krow_);
      std::memcpy(vpages_[page].data() + (size_t(h) * kPageTokens + slot) * vrow_, vc.data() + (size_t(h) * n + i) * vrow_, vrow_);
    }
  }
  n_coded_ += n;
}

void VecInferCache::attend(const float* q, int n_q, float scale, float* out) const {
  attend_impl(q, n_q, scale, out, false);
}
void VecInferCache::attend_dequantized(const float* q, int n_q, float scale, float* out) const {
  attend_impl(q, n_q, scale, out, true);
}

void VecInferCache::attend_impl(const float* q, int n_q, float scale, float* out, bool dequantized) const {
  const int HQ = geo_.n_heads, H = geo_.n_kv_heads, D = geo_.head_dim, G = HQ / H;
  const int64_t n = size(), ns = sink_.size();
  VQ_CHECK(n_q >= 0 && n_q <= n, "{} attend: n_q = {} must be in 0..size() = {}", name(), n_q, n);
  // qt: [n_q, HQ, D] transformed queries q~ = H(q * lambda) * scale, for the coded part
  std::vector<float> qt;
  if (n_coded_ > 0) {
    qt.assign(q, q + size_t(n_q) * HQ * D);
    transform_queries(qt.data(), n_q, HQ, H, D, lambda_);
    for (auto& x : qt) x *= scale;
  }
  const Calibration& c = *calib_;
  PQAttnArgs base;
  base.group = G;
  base.head_dim = D;
  base.k_sub_dim = c.key.sub_dim;
  base.k_bits = c.key.bits;
  base.k_books = kpq_[0].n_books();
  base.v_sub_dim = c.value.sub_dim;
  base.v_bits = c.value.bits;
  base.v_books = vpq_[0].n_books();
  const size_t lut_n = n_coded_ > 0 ? cpu::pq_lut_floats(base) : 0;
  // Decode: one LUT per (query, KV head) built up front, shared by every key range.
  // luts: [n_q, H, lut_n] f32
  const bool prebuild = !dequantized && n_coded_ > 0 && n_q <= 4;
  std::vector<float> luts(prebuild ? size_t(n_q) * H * lut_n : 0);
  if (prebuild) {
    parallel_for(size_t(n_q) * H, [&](size_t b, size_t e, int) {
      for (size_t it = b; it < e; ++it) {
        const int i = int(it / H), h = int(it % H);
        PQAttnArgs a = base;
        a.q = qt.data() + (size_t(i) * HQ + size_t(h) * G) * D;
        a.k_codebook = kpq_[size_t(h)].codebooks().data();
        cpu::pq_build_lut(a, kbook_t_[size_t(h)].data(), luts.data() + it * lut_n);
      }
    });
  }
  AttnProblem p{n_q, HQ, H, D, n, kPageTokens};
  run_attention(p, [&](int h, int q0, int q1, int64_t t0, int64_t t1, float* m, float* d, float* o) {
    std::vector<float> lut(prebuild ? 0 : lut_n);
    std::vector<float> pm(static_cast<size_t>(G)), pd(static_cast<size_t>(G)), po(size_t(G) * D);
    for (int i = q0; i < q1; ++i) {
      const int64_t lim = std::min(t1, n - n_q + i + 1);  // keys this query sees in [t0, lim)
      float* mi = m + size_t(i - q0) * G;
      float* di = d + size_t(i - q0) * G;
      float* oi = o + size_t(i - q0) * G * D;
      const float* qi = q + (size_t(i) * HQ + size_t(h) * G) * D;
      // fp16 sinks: positions [0, ns)
      if (std::min(lim, ns) > t0) sink_.attend(h, qi, 0, 1, G, scale, &lim, t0, std::min(lim, ns), mi, di, oi);
      // coded part: positions [ns, ns + n_coded_), coded index = position - ns
      const int64_t c0 = std::max<int64_t>(t0, ns) - ns;
      const int64_t c1 = std::min(lim, ns + n_coded_) - ns;
      if (c1 > c0) {
        PQAttnArgs a = base;
        a.q = qt.data() + (size_t(i) * HQ + size_t(h) * G) * D;
        a.k_codebook = kpq_[size_t(h)].codebooks().data();
        a.v_codebook = vpq_[size_t(h)].codebooks().data();
        const float* L = nullptr;
        if (!dequantized) {
          if (prebuild) {
            L = luts.data() + (size_t(i) * H + size_t(h)) * lut_n;
          } else {
            cpu::pq_build_lut(a, kbook_t_[size_t(h)].data(), lut.data());
            L = lut.data();
          }
        }
        for (int64_t t = c0; t < c1;) {
          const int64_t page = t / kPageTokens, slot = t % kPageTokens;
          const int64_t nt = std::min<int64_t>(kPageTokens - slot, c1 - t);
          a.n_tokens = int(nt);
          a.k_codes = k_codes(page, h) + size_t(slot) * krow_;
          a.v_codes = v_codes(page, h) + size_t(slot) * vrow_;
          if (dequantized) {
            a.m = pm.data();
            a.d = pd.data();
            a.o = po.data();
            ref::pq_attention_dequantized(a);
            for (int g = 0; g < G; ++g) {
              SoftmaxState st{mi[g], di[g]};
              float wa, wb;
              softmax_merge(st, SoftmaxState{pm[size_t(g)], pd[size_t(g)]}, wa, wb);
              mi[g] = st.m;
              di[g] = st.d;
              for (int e = 0; e < D; ++e) oi[g * D + e] = oi[g * D + e] * wa + po[size_t(g) * D + e] * wb;
            }
          } else {
            a.m = mi;
            a.d = di;
            a.o = oi;
            cpu::pq_attention_accumulate(a, L);
          }
          t += nt;
        }
      }
      // residual window part (window positions = position - ns - n_coded_)
      const int64_t w_base = ns + n_coded_;
      const int64_t r0 = std::max(t0, w_base);
      if (lim > r0) {
        const int64_t vis = lim - w_base;
        window_.attend(h, qi, 0, 1, G, scale, &vis, r0 - w_base, lim - w_base, mi, di, oi);
      }
    }
  }, out);
}

void VecInferCache::clear() {
  kpages_.clear();
  vpages_.clear();
  sink_.clear();
  window_.clear();
  n_coded_ = 0;
}

size_t VecInferCache::bytes() const {
  size_t b = sink_.bytes() + window_.bytes();
  for (auto& p : kpages_) b += p.bytes();
  for (auto& p : vpages_) b += p.bytes();
  return b;
}

size_t VecInferCache::codebook_bytes() const {
  size_t b = size_t(geo_.n_kv_heads) * geo_.head_dim * 4;  // smoothing
  for (size_t h = 0; h < kpq_.size(); ++h)
    b += (kpq_[h].codebooks().size() + vpq_[h].codebooks().size() + kbook_t_[h].size()) * 4;
  return b;
}

}  // namespace vq
