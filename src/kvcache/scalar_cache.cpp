#include "kvcache/scalar_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "codec/scalar_blocks.h"
#include "core/fp16.h"
#include "kvcache/attend_driver.h"
#include "kvcache/dense_cache.h"
#include "ops/cpu/scalar_attention.h"

namespace vq {

BlockQuantCache::BlockQuantCache(const KVGeometry& g, bool q4) : geo_(g), q4_(q4), block_bytes_(q4 ? 18 : 34) {
  check_geometry(g, q4 ? "q4_0 cache" : "q8_0 cache");
  VQ_CHECK(g.head_dim % 32 == 0, "{} cache: head_dim {} must be a multiple of the block size 32", name(), g.head_dim);
}

const uint8_t* BlockQuantCache::row(int kind, int64_t t, int h) const {
  const size_t page = size_t(t / kPageTokens), slot = size_t(t % kPageTokens);
  return pages_[page].data() + ((size_t(kind) * geo_.n_kv_heads + size_t(h)) * kPageTokens + slot) * row_bytes();
}

void BlockQuantCache::append(const float* k, const float* v, int n_tokens) {
  VQ_CHECK(n_tokens >= 0, "{} append: n_tokens = {} must be >= 0", name(), n_tokens);
  const int H = geo_.n_kv_heads, D = geo_.head_dim;
  const size_t page_bytes = 2 * size_t(H) * kPageTokens * row_bytes();
  for (int i = 0; i < n_tokens; ++i) {
    const int64_t t = n_ + i;
    if (size_t(t / kPageTokens) >= pages_.size()) pages_.emplace_back(page_bytes);
    for (int kind = 0; kind < 2; ++kind)
      for (int h = 0; h < H; ++h) {
        const float* x = (kind == 0 ? k : v) + (int64_t(i) * H + h) * D;
        uint8_t* dst = const_cast<uint8_t*>(row(kind, t, h));
        for (int b = 0; b < D / 32; ++b) {
          if (q4_) quantize_q4_0(x + b * 32, dst + size_t(b) * block_bytes_);
          else quantize_q8_0(x + b * 32, dst + size_t(b) * block_bytes_);
        }
      }
  }
  n_ += n_tokens;
}

void BlockQuantCache::attend(const float* q, int n_q, float scale, float* out) const {
  const int HQ = geo_.n_heads, H = geo_.n_kv_heads, D = geo_.head_dim, G = HQ / H;
  AttnProblem p{n_q, HQ, H, D, n_, kPageTokens};
  run_attention(p, [&](int h, int q0, int q1, int64_t t0, int64_t t1, float* m, float* d, float* o) {
    std::vector<float> qs(size_t(G) * D);  // qs: [G, D] the group's queries * scale
    for (int i = q0; i < q1; ++i) {
      const int64_t lim = std::min(t1, n_ - n_q + i + 1);
      const float* qi = q + (int64_t(i) * HQ + int64_t(h) * G) * D;
      for (size_t c = 0; c < qs.size(); ++c) qs[c] = qi[c] * scale;
      cpu::BlockQuantAttnArgs a;
      a.group = G;
      a.head_dim = D;
      a.q4 = q4_;
      a.q = qs.data();
      a.row_stride = row_bytes();
      a.m = m + size_t(i - q0) * G;
      a.d = d + size_t(i - q0) * G;
      a.o = o + size_t(i - q0) * G * D;
      for (int64_t t = t0; t < lim;) {  // page by page (rows of a page are contiguous)
        const int64_t nt = std::min<int64_t>(kPageTokens - t % kPageTokens, lim - t);
        a.n_tokens = int(nt);
        a.k_rows = row(0, t, h);
        a.v_rows = row(1, t, h);
        cpu::block_quant_attention(a);
        t += nt;
      }
    }
  }, out);
}

void BlockQuantCache::clear() {
  pages_.clear();
  n_ = 0;
}

size_t BlockQuantCache::bytes() const {
  size_t b = 0;
  for (auto& p : pages_) b += p.bytes();
  return b;
}

}  // namespace vq
