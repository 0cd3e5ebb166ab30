#include "ops/ref/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"

namespace vq::ref {

void attention(const float* q, int n_q, const float* k, const float* v, int64_t n_keys, int n_heads,
               int n_kv_heads, int head_dim, float scale, float* out) {
  VQ_CHECK(n_heads > 0 && n_kv_heads > 0 && n_heads % n_kv_heads == 0,
           "ref::attention: n_heads {} must be a multiple of n_kv_heads {}", n_heads, n_kv_heads);
  VQ_CHECK(n_q >= 0 && n_q <= n_keys, "ref::attention: n_q {} must be in 0..n_keys {}", n_q, n_keys);
  const int group = n_heads / n_kv_heads;
  std::vector<double> s(static_cast<size_t>(n_keys));
  std::vector<double> acc(static_cast<size_t>(head_dim));
  for (int i = 0; i < n_q; ++i) {
    const int64_t n_vis = n_keys - n_q + i + 1;
    for (int h = 0; h < n_heads; ++h) {
      const int kvh = h / group;
      const float* qh = q + (int64_t(i) * n_heads + h) * head_dim;
      double mx = -INFINITY;
      for (int64_t t = 0; t < n_vis; ++t) {
        const float* kt = k + (t * n_kv_heads + kvh) * head_dim;
        double dot = 0;
        for (int c = 0; c < head_dim; ++c) dot += double(qh[c]) * double(kt[c]);
        s[size_t(t)] = dot * scale;
        mx = std::max(mx, s[size_t(t)]);
      }
      double den = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t t = 0; t < n_vis; ++t) {
        const double p = std::exp(s[size_t(t)] - mx);
        den += p;
        const float* vt = v + (t * n_kv_heads + kvh) * head_dim;
        for (int c = 0; c < head_dim; ++c) acc[size_t(c)] += p * vt[c];
      }
      float* oh = out + (int64_t(i) * n_heads + h) * head_dim;
      for (int c = 0; c < head_dim; ++c) oh[c] = float(acc[size_t(c)] / den);
    }
  }
}

void dense_attention(const DenseAttnArgs& a) {
  const int D = a.head_dim;
  std::vector<float> krow(static_cast<size_t>(D)), vrow(static_cast<size_t>(D));
  for (int i = 0; i < a.n_q; ++i) {
    const int64_t nv = std::clamp<int64_t>(a.n_visible[i], 0, a.n_keys);
    for (int g = 0; g < a.group; ++g) {
      const float* qv = a.q + i * a.q_stride + int64_t(g) * D;
      float& m = a.m[i * a.group + g];
      float& d = a.d[i * a.group + g];
      float* o = a.o + (int64_t(i) * a.group + g) * D;
      for (int64_t t = 0; t < nv; ++t) {
        if (a.block_tokens > 0) {
          const int64_t u = a.first + t, B = a.block_tokens;
          const uint8_t* blk = a.blocks[u / B];
          const int64_t slot = u % B;
          for (int c = 0; c < D; ++c) {
            const int64_t ki = c * B + slot, vi = slot * D + c;
            if (a.paged_f32) {
              krow[size_t(c)] = reinterpret_cast<const float*>(blk + a.k_offset)[ki];
              vrow[size_t(c)] = reinterpret_cast<const float*>(blk + a.v_offset)[vi];
            } else {
              krow[size_t(c)] = f16_to_f32(reinterpret_cast<const uint16_t*>(blk + a.k_offset)[ki]);
              vrow[size_t(c)] = f16_to_f32(reinterpret_cast<const uint16_t*>(blk + a.v_offset)[vi]);
            }
          }
        } else {
          for (int c = 0; c < D; ++c) {
            krow[size_t(c)] = a.k16 ? f16_to_f32(a.k16[c * a.k_stride + t]) : a.k32[c * a.k_stride + t];
            vrow[size_t(c)] = a.v16 ? f16_to_f32(a.v16[t * D + c]) : a.v32[t * D + c];
          }
        }
        double dot = 0;
        for (int c = 0; c < D; ++c) dot += double(qv[c]) * krow[size_t(c)];
        const float s = float(dot) * a.scale;
        const float m_new = std::max(m, s);
        const float alpha = m == -INFINITY ? 0.0f : std::exp(m - m_new);
        const float p = std::exp(s - m_new);
        d = d * alpha + p;
        for (int c = 0; c < D; ++c) o[c] = o[c] * alpha + p * vrow[size_t(c)];
        m = m_new;
      }
    }
  }
}

}  // namespace vq::ref
