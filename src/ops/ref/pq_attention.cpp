#include "ops/ref/pq_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bitpack.h"
#include "core/error.h"

namespace vq {

void check_pq_attn_args(const PQAttnArgs& a, const char* who) {
  VQ_CHECK(a.n_tokens >= 0, "{}: n_tokens = {} must be >= 0", who, a.n_tokens);
  VQ_CHECK(a.group >= 1, "{}: group = {} must be >= 1", who, a.group);
  VQ_CHECK(a.head_dim >= 1, "{}: head_dim = {} must be >= 1", who, a.head_dim);
  VQ_CHECK(a.k_sub_dim >= 1 && a.head_dim % a.k_sub_dim == 0, "{}: k_sub_dim = {} must divide head_dim {}", who,
           a.k_sub_dim, a.head_dim);
  VQ_CHECK(a.v_sub_dim >= 1 && a.head_dim % a.v_sub_dim == 0, "{}: v_sub_dim = {} must divide head_dim {}", who,
           a.v_sub_dim, a.head_dim);
  VQ_CHECK(a.k_bits >= 1 && a.k_bits <= 16, "{}: k_bits = {} must be in 1..16", who, a.k_bits);
  VQ_CHECK(a.v_bits >= 1 && a.v_bits <= 16, "{}: v_bits = {} must be in 1..16", who, a.v_bits);
  VQ_CHECK(a.k_books == 1 || a.k_books == a.head_dim / a.k_sub_dim, "{}: k_books = {} must be 1 or {}", who,
           a.k_books, a.head_dim / a.k_sub_dim);
  VQ_CHECK(a.v_books == 1 || a.v_books == a.head_dim / a.v_sub_dim, "{}: v_books = {} must be 1 or {}", who,
           a.v_books, a.head_dim / a.v_sub_dim);
  VQ_CHECK(a.q && a.m && a.d && a.o, "{}: q, m, d and o must be set", who);
  VQ_CHECK(a.n_tokens == 0 || (a.k_codes && a.v_codes && a.k_codebook && a.v_codebook),
           "{}: codes and codebooks must be set when n_tokens = {}", who, a.n_tokens);
  VQ_CHECK(!a.seg_bias || (a.seg_tokens >= 1 && a.seg_first >= 0 && a.seg_first < a.seg_tokens),
           "{}: seg_tokens = {} / seg_first = {} do not describe segments", who, a.seg_tokens, a.seg_first);
}

float seg_bias_at(const PQAttnArgs& a, int t, int g) {
  return a.seg_bias ? a.seg_bias[size_t((a.seg_first + t) / a.seg_tokens) * a.group + g] : 0.0f;
}

namespace ref {

void pq_attention(const PQAttnArgs& a) {
  check_pq_attn_args(a, "ref::pq_attention");
  const int D = a.head_dim;
  const int nks = D / a.k_sub_dim, nvs = D / a.v_sub_dim;
  const int kc = 1 << a.k_bits, vc = 1 << a.v_bits;
  const size_t krow = packed_row_bytes(nks, a.k_bits), vrow = packed_row_bytes(nvs, a.v_bits);
  std::vector<float> lut(size_t(nks) * kc);  // lut: [nks, 2^k_bits] f32, q~_j . centroid
  std::vector<float> s(size_t(a.n_tokens));  // s: [n_tokens] scores
  for (int g = 0; g < a.group; ++g) {
    const float* q = a.q + int64_t(g) * D;
    for (int j = 0; j < nks; ++j) {
      const float* book = a.k_codebook + int64_t(a.k_books == 1 ? 0 : j) * kc * a.k_sub_dim;
      for (int c = 0; c < kc; ++c) {
        double dot = 0;
        for (int e = 0; e < a.k_sub_dim; ++e) dot += double(q[j * a.k_sub_dim + e]) * book[c * a.k_sub_dim + e];
        lut[size_t(j) * kc + c] = float(dot);
      }
    }
    float mx = -INFINITY;
    for (int t = 0; t < a.n_tokens; ++t) {
      const uint8_t* row = a.k_codes + size_t(t) * krow;
      double sc = 0;
      for (int j = 0; j < nks; ++j) sc += lut[size_t(j) * kc + read_code(row, j, a.k_bits)];
      s[size_t(t)] = float(sc) + seg_bias_at(a, t, g);
      mx = std::max(mx, s[size_t(t)]);
    }
    double den = 0;
    std::vector<double> acc(size_t(D), 0.0);
    for (int t = 0; t < a.n_tokens; ++t) {
      const double p = std::exp(double(s[size_t(t)]) - mx);
      den += p;
      const uint8_t* row = a.v_codes + size_t(t) * vrow;
      for (int j = 0; j < nvs; ++j) {
        const float* cent = a.v_codebook + (int64_t(a.v_books == 1 ? 0 : j) * vc + read_code(row, j, a.v_bits)) * a.v_sub_dim;
        for (int e = 0; e < a.v_sub_dim; ++e) acc[size_t(j * a.v_sub_dim + e)] += p * cent[e];
      }
    }
    a.m[g] = mx;
    a.d[g] = float(den);
    for (int c = 0; c < D; ++c) a.o[int64_t(g) * D + c] = float(acc[size_t(c)]);
  }
}

void pq_attention_dequantized(const PQAttnArgs& a) {
  check_pq_attn_args(a, "ref::pq_attention_dequantized");
  const int D = a.head_dim;
  const int nks = D / a.k_sub_dim, nvs = D / a.v_sub_dim;
  const int kc = 1 << a.k_bits, vc = 1 << a.v_bits;
  const size_t krow = packed_row_bytes(nks, a.k_bits), vrow = packed_row_bytes(nvs, a.v_bits);
  // K, V: [n_tokens, head_dim] f32, the decoded rows
  std::vector<float> K(size_t(a.n_tokens) * D), V(size_t(a.n_tokens) * D);
  for (int t = 0; t < a.n_tokens; ++t) {
    for (int j = 0; j < nks; ++j) {
      const float* cent = a.k_codebook +
          (int64_t(a.k_books == 1 ? 0 : j) * kc + read_code(a.k_codes + size_t(t) * krow, j, a.k_bits)) * a.k_sub_dim;
      std::copy(cent, cent + a.k_sub_dim, K.begin() + int64_t(t) * D + j * a.k_sub_dim);
    }
    for (int j = 0; j < nvs; ++j) {
      const float* cent = a.v_codebook +
          (int64_t(a.v_books == 1 ? 0 : j) * vc + read_code(a.v_codes + size_t(t) * vrow, j, a.v_bits)) * a.v_sub_dim;
      std::copy(cent, cent + a.v_sub_dim, V.begin() + int64_t(t) * D + j * a.v_sub_dim);
    }
  }
  for (int g = 0; g < a.group; ++g) {
    const float* q = a.q + int64_t(g) * D;
    std::vector<double> s(size_t(a.n_tokens));
    double mx = -INFINITY;
    for (int t = 0; t < a.n_tokens; ++t) {
      double dot = 0;
      for (int c = 0; c < D; ++c) dot += double(q[c]) * K[size_t(t) * D + c];
      s[size_t(t)] = dot + seg_bias_at(a, t, g);
      mx = std::max(mx, s[size_t(t)]);
    }
    double den = 0;
    std::vector<double> acc(size_t(D), 0.0);
    for (int t = 0; t < a.n_tokens; ++t) {
      const double p = std::exp(s[size_t(t)] - mx);
      den += p;
      for (int c = 0; c < D; ++c) acc[size_t(c)] += p * V[size_t(t) * D + c];
    }
    a.m[g] = float(mx);
    a.d[g] = float(den);
    for (int c = 0; c < D; ++c) a.o[int64_t(g) * D + c] = float(acc[size_t(c)]);
  }
}

}  // namespace ref
}  // namespace vq
