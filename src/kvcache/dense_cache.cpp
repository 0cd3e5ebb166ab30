#include "kvcache/dense_cache.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "kvcache/attend_driver.h"
#include "ops/cpu/attention.h"

namespace vq {

void check_geometry(const KVGeometry& g, const char* who) {
  VQ_CHECK(g.n_kv_heads >= 1, "{}: n_kv_heads = {} must be >= 1", who, g.n_kv_heads);
  VQ_CHECK(g.n_heads >= 1 && g.n_heads % g.n_kv_heads == 0, "{}: n_heads = {} must be a positive multiple of n_kv_heads = {}",
           who, g.n_heads, g.n_kv_heads);
  VQ_CHECK(g.head_dim >= 1 && g.head_dim <= 1024, "{}: head_dim = {} must be in 1..1024", who, g.head_dim);
}

DenseCache::DenseCache(const KVGeometry& g, bool fp32) : geo_(g), fp32_(fp32) {
  check_geometry(g, fp32 ? "fp32 cache" : "fp16 cache");
}

size_t DenseCache::page_bytes() const {
  const size_t b = 2 * size_t(geo_.n_kv_heads) * kPageTokens * size_t(geo_.head_dim) * elem_bytes();
  return (b + 63) / 64 * 64;
}

const uint8_t* DenseCache::rows(size_t page, int kind, int h) const {
  return pages_[page].data() +
         ((size_t(kind) * geo_.n_kv_heads + size_t(h)) * kPageTokens) * size_t(geo_.head_dim) * elem_bytes();
}

void DenseCache::append(const float* k, const float* v, int n_tokens) {
  VQ_CHECK(n_tokens >= 0, "{} cache append: n_tokens = {} must be >= 0", name(), n_tokens);
  const int H = geo_.n_kv_heads, D = geo_.head_dim;
  for (int i = 0; i < n_tokens; ++i) {
    const int64_t t = n_ + i;
    const size_t page = size_t(t / kPageTokens);
    const int slot = int(t % kPageTokens);
    if (page >= pages_.size()) pages_.emplace_back(page_bytes());
    for (int kind = 0; kind < 2; ++kind) {
      const float* src = (kind == 0 ? k : v) + (int64_t(i) * H) * D;
      for (int h = 0; h < H; ++h) {
        uint8_t* base = const_cast<uint8_t*>(rows(page, kind, h));
        const float* x = src + int64_t(h) * D;
        if (kind == 0) {  // keys channel-major: [D][kPageTokens]
          if (fp32_) {
            float* dst = reinterpret_cast<float*>(base) + slot;
            for (int c = 0; c < D; ++c) dst[size_t(c) * kPageTokens] = x[c];
          } else {
            uint16_t* dst = reinterpret_cast<uint16_t*>(base) + slot;
            for (int c = 0; c < D; ++c) dst[size_t(c) * kPageTokens] = f32_to_f16(x[c]);
          }
        } else {  // values row-major: [kPageTokens][D]
          uint8_t* dst = base + size_t(slot) * D * elem_bytes();
          if (fp32_) std::memcpy(dst, x, size_t(D) * 4);
          else f32_to_f16(x, reinterpret_cast<uint16_t*>(dst), size_t(D));
        }
      }
    }
  }
  n_ += n_tokens;
}

ref::DenseAttnArgs DenseCache::page_args(size_t page, int kvh, int64_t first, float scale) const {
  ref::DenseAttnArgs a;
  a.group = geo_.n_heads / geo_.n_kv_heads;
  a.head_dim = geo_.head_dim;
  a.q_stride = int64_t(geo_.n_heads) * geo_.head_dim;
  a.scale = scale;
  // Starting at an unaligned key: the SIMD kernel's whole-vector reads past the last key stay in
  // the page (the next channel's keys, then the values), and their lanes are masked.
  if (fp32_) {
    a.k32 = reinterpret_cast<const float*>(rows(page, 0, kvh)) + first;
    a.v32 = reinterpret_cast<const float*>(rows(page, 1, kvh)) + first * geo_.head_dim;
  } else {
    a.k16 = reinterpret_cast<const uint16_t*>(rows(page, 0, kvh)) + first;
    a.v16 = reinterpret_cast<const uint16_t*>(rows(page, 1, kvh)) + first * geo_.head_dim;
  }
  a.k_stride = kPageTokens;
  return a;
}

void DenseCache::attend(const float* q, int n_q, float scale, float* out) const {
  AttnProblem p{n_q, geo_.n_heads, geo_.n_kv_heads, geo_.head_dim, n_, kPageTokens};
  const int G = geo_.n_heads / geo_.n_kv_heads, D = geo_.head_dim;
  run_attention(p, [&](int kvh, int q0, int q1, int64_t t0, int64_t t1, float* m, float* d, float* o) {
    std::vector<int64_t> vis(size_t(q1 - q0));
    for (int64_t t = t0; t < t1; t += kPageTokens) {
      const size_t page = size_t(t / kPageTokens);
      const int64_t nk = std::min<int64_t>(kPageTokens, t1 - t);
      for (int i = q0; i < q1; ++i) vis[size_t(i - q0)] = (n_ - n_q + i + 1) - t;
      ref::DenseAttnArgs a = page_args(page, kvh, 0, scale);
      a.n_q = q1 - q0;
      a.q = q + (int64_t(q0) * geo_.n_heads + int64_t(kvh) * G) * D;
      a.n_keys = nk;
      a.n_visible = vis.data();
      a.m = m;
      a.d = d;
      a.o = o;
      cpu::dense_attention(a);
    }
  }, out);
}

// TEMPORARY (gemma3 branch, see KVCache::attend_window): each query's window [lo, hi) is cut at
// page boundaries and each piece runs through the kernel as a prefix of keys starting at lo.
void DenseCache::attend_window(const float* q, int n_q, float scale, float* out, int64_t window) const {
  VQ_CHECK(window >= 1, "{} cache attend_window: window {} must be >= 1", name(), window);
  AttnProblem p{n_q, geo_.n_heads, geo_.n_kv_heads, geo_.head_dim, n_, kPageTokens};
  const int G = geo_.n_heads / geo_.n_kv_heads, D = geo_.head_dim;
  run_attention(p, [&](int kvh, int q0, int q1, int64_t t0, int64_t t1, float* m, float* d, float* o) {
    for (int i = q0; i < q1; ++i) {
      const int64_t pos = n_ - n_q + i;
      const int64_t hi = std::min(t1, pos + 1);
      for (int64_t t = std::max(t0, pos - window + 1); t < hi;) {
        const int64_t first = t % kPageTokens;
        const int64_t nk = std::min<int64_t>(kPageTokens - first, hi - t);
        ref::DenseAttnArgs a = page_args(size_t(t / kPageTokens), kvh, first, scale);
        a.n_q = 1;
        a.q = q + (int64_t(i) * geo_.n_heads + int64_t(kvh) * G) * D;
        a.n_keys = nk;
        a.n_visible = &nk;
        a.m = m + int64_t(i - q0) * G;
        a.d = d + int64_t(i - q0) * G;
        a.o = o + int64_t(i - q0) * G * D;
        cpu::dense_attention(a);
        t += nk;
      }
    }
  }, out);
}

void DenseCache::clear() {
  pages_.clear();
  n_ = 0;
}

size_t DenseCache::bytes() const { return pages_.size() * page_bytes(); }

void DenseCache::read(int64_t t, int h, float* k, float* v) const {
  VQ_CHECK(t >= 0 && t < n_ && h >= 0 && h < geo_.n_kv_heads, "{} cache read: token {} head {} out of range", name(), t, h);
  const size_t page = size_t(t / kPageTokens);
  const int slot = int(t % kPageTokens);
  const int D = geo_.head_dim;
  for (int c = 0; c < D; ++c) {
    const size_t idx = size_t(c) * kPageTokens + size_t(slot);
    k[c] = fp32_ ? reinterpret_cast<const float*>(rows(page, 0, h))[idx]
                 : f16_to_f32(reinterpret_cast<const uint16_t*>(rows(page, 0, h))[idx]);
  }
  const uint8_t* src = rows(page, 1, h) + size_t(slot) * D * elem_bytes();
  if (fp32_) std::memcpy(v, src, size_t(D) * 4);
  else f16_to_f32(reinterpret_cast<const uint16_t*>(src), v, size_t(D));
}

}  // namespace vq
