#include "kvcache/scalar_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "kvcache/attend_driver.h"
#include "kvcache/dense_cache.h"
#include "kvcache/softmax_tile.h"

namespace vq {

void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d > 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b, &dh, 2);
  for (int i = 0; i < 32; ++i) b[2 + i] = uint8_t(int8_t(std::lround(x[i] * id)));
}

void quantize_q4_0(const float* x, uint8_t* b) {
  // scale from the signed value of largest magnitude, mapped to -8 (the full 4-bit range)
  float amax = 0, mx = 0;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      mx = x[i];
    }
  const float d = mx / -8.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b, &dh, 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, int(x[j] * id + 8.5f));
    const int hi = std::min(15, int(x[j + 16] * id + 8.5f));
    b[2 + j] = uint8_t(std::max(0, lo) | (std::max(0, hi) << 4));
  }
}

void dequantize_q8_0(const uint8_t* b, float* x) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  const float d = f16_to_f32(dh);
  for (int i = 0; i < 32; ++i) x[i] = d * float(int8_t(b[2 + i]));
}

void dequantize_q4_0(const uint8_t* b, float* x) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  const float d = f16_to_f32(dh);
  for (int j = 0; j < 16; ++j) {
    x[j] = d * float(int(b[2 + j] & 15) - 8);
    x[j + 16] = d * float(int(b[2 + j] >> 4) - 8);
  }
}

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

namespace {
// Scores of nt tokens' rows against q (f32) and value accumulation, per block format.
template <bool Q4>
inline float block_dot(const uint8_t* blk, const float* q) {
  uint16_t dh;
  std::memcpy(&dh, blk, 2);
  float acc = 0;
  if (Q4) {
    float lo = 0, hi = 0;
    for (int j = 0; j < 16; ++j) {
      lo += q[j] * float(int(blk[2 + j] & 15) - 8);
      hi += q[j + 16] * float(int(blk[2 + j] >> 4) - 8);
    }
    acc = lo + hi;
  } else {
    for (int i = 0; i < 32; ++i) acc += q[i] * float(int8_t(blk[2 + i]));
  }
  return acc * f16_to_f32(dh);
}
template <bool Q4>
inline void block_axpy(const uint8_t* blk, float p, float* o) {
  uint16_t dh;
  std::memcpy(&dh, blk, 2);
  const float w = p * f16_to_f32(dh);
  if (Q4) {
    for (int j = 0; j < 16; ++j) {
      o[j] += w * float(int(blk[2 + j] & 15) - 8);
      o[j + 16] += w * float(int(blk[2 + j] >> 4) - 8);
    }
  } else {
    for (int i = 0; i < 32; ++i) o[i] += w * float(int8_t(blk[2 + i]));
  }
}
}  // namespace

void BlockQuantCache::attend(const float* q, int n_q, float scale, float* out) const {
  const int HQ = geo_.n_heads, H = geo_.n_kv_heads, D = geo_.head_dim, G = HQ / H, nb = D / 32;
  AttnProblem p{n_q, HQ, H, D, n_, kPageTokens};
  run_attention(p, [&](int h, int q0, int q1, int64_t t0, int64_t t1, float* m, float* d, float* o) {
    constexpr int kT = 64;
    float s[kT];
    std::vector<float> qs(static_cast<size_t>(D));
    for (int i = q0; i < q1; ++i) {
      const int64_t lim = std::min(t1, n_ - n_q + i + 1);
      for (int g = 0; g < G; ++g) {
        const float* qg = q + (int64_t(i) * HQ + h * G + g) * D;
        for (int c = 0; c < D; ++c) qs[size_t(c)] = qg[c] * scale;
        float& mm = m[size_t(i - q0) * G + g];
        float& dd = d[size_t(i - q0) * G + g];
        float* oo = o + (size_t(i - q0) * G + g) * D;
        for (int64_t a = t0; a < lim; a += kT) {
          const int nt = int(std::min<int64_t>(kT, lim - a));
          for (int t = 0; t < nt; ++t) {
            const uint8_t* r = row(0, a + t, h);
            float acc = 0;
            for (int b = 0; b < nb; ++b)
              acc += q4_ ? block_dot<true>(r + size_t(b) * block_bytes_, qs.data() + b * 32)
                         : block_dot<false>(r + size_t(b) * block_bytes_, qs.data() + b * 32);
            s[t] = acc;
          }
          const float alpha = softmax_tile(mm, dd, s, nt);
          for (int c = 0; c < D; ++c) oo[c] *= alpha;
          for (int t = 0; t < nt; ++t) {
            const uint8_t* r = row(1, a + t, h);
            for (int b = 0; b < nb; ++b) {
              if (q4_) block_axpy<true>(r + size_t(b) * block_bytes_, s[t], oo + b * 32);
              else block_axpy<false>(r + size_t(b) * block_bytes_, s[t], oo + b * 32);
            }
          }
        }
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
