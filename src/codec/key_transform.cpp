#include "codec/key_transform.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace vq {

int hadamard_block(int head_dim) {
  VQ_CHECK(head_dim >= 1, "Hadamard: head_dim = {} must be >= 1", head_dim);
  const int b = head_dim & -head_dim;  // largest power of two dividing head_dim
  VQ_CHECK(b >= 8 || b == head_dim,
           "Hadamard: head_dim = {} is not a power of two and its largest power-of-two divisor {} is < 8; "
           "block-Hadamard would not mix channels",
           head_dim, b);
  return b;
}

void fwht_inplace(float* v, int n) {
  const int block = hadamard_block(n);
  const float scale = 1.0f / std::sqrt(float(block));
  for (int base = 0; base < n; base += block) {
    float* x = v + base;
    for (int h = 1; h < block; h <<= 1)
      for (int i = 0; i < block; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const float a = x[j], b = x[j + h];
          x[j] = a + b;
          x[j + h] = a - b;
        }
    for (int i = 0; i < block; ++i) x[i] *= scale;
  }
}

void update_abs_max(const float* k, int64_t n_tokens, int n_heads, int head_dim, float* absmax) {
  VQ_CHECK(n_tokens >= 0 && n_heads >= 1 && head_dim >= 1, "smoothing: bad shape [{}, {}, {}]", n_tokens, n_heads,
           head_dim);
  const int64_t row = int64_t(n_heads) * head_dim;
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int64_t i = 0; i < row; ++i) {
      const float a = std::fabs(k[t * row + i]);
      VQ_CHECK(std::isfinite(a), "smoothing: key [token {}, head {}, channel {}] is {}", t, i / head_dim,
               i % head_dim, k[t * row + i]);
      if (a > absmax[i]) absmax[i] = a;
    }
}

std::vector<float> smoothing_from_abs_max(const std::vector<float>& absmax) {
  std::vector<float> lambda(absmax.size());
  for (size_t i = 0; i < absmax.size(); ++i) lambda[i] = std::max(std::sqrt(absmax[i]), kMinLambda);
  return lambda;
}

std::vector<float> smoothing_from_energy(const std::vector<double>& key_var, const std::vector<double>& query_energy,
                                         int n_heads, int head_dim) {
  const size_t n = size_t(n_heads) * size_t(head_dim);
  VQ_CHECK(key_var.size() == n && query_energy.size() == n,
           "smoothing: {} key variances and {} query energies for {} heads x {} channels", key_var.size(),
           query_energy.size(), n_heads, head_dim);
  std::vector<float> lambda(n);
  for (int h = 0; h < n_heads; ++h) {
    const size_t o = size_t(h) * head_dim;
    double vmean = 0, qmean = 0;
    for (int c = 0; c < head_dim; ++c) {
      VQ_CHECK(std::isfinite(key_var[o + c]) && key_var[o + c] >= 0 && std::isfinite(query_energy[o + c]) &&
                   query_energy[o + c] >= 0,
               "smoothing: head {} channel {}: key variance {} / query energy {} is not a finite value >= 0", h, c,
               key_var[o + c], query_energy[o + c]);
      vmean += key_var[o + c] / head_dim;
      qmean += query_energy[o + c] / head_dim;
    }
    // Floors relative to the head's means keep a silent channel from driving lambda to 0 or infinity.
    const double vf = std::max(vmean * 1e-6, 1e-30), qf = std::max(qmean * 1e-6, 1e-30);
    std::vector<double> l(static_cast<size_t>(head_dim));
    double log_sum = 0;
    for (int c = 0; c < head_dim; ++c) {
      l[size_t(c)] = std::pow((key_var[o + c] + vf) / (query_energy[o + c] + qf), 0.25);
      log_sum += std::log(l[size_t(c)]);
    }
    const double g = std::exp(log_sum / head_dim);
    for (int c = 0; c < head_dim; ++c)
      lambda[o + c] = float(std::clamp(l[size_t(c)] / g, double(kMinLambda), 65504.0));
  }
  return lambda;
}

std::vector<float> smoothing_factors(const float* k, int64_t n_tokens, int n_heads, int head_dim) {
  std::vector<float> absmax(size_t(n_heads) * head_dim, 0.0f);
  update_abs_max(k, n_tokens, n_heads, head_dim, absmax.data());
  return smoothing_from_abs_max(absmax);
}

void transform_keys(float* k, int64_t n_tokens, int n_heads, int head_dim, const float* lambda) {
  (void)hadamard_block(head_dim);
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int h = 0; h < n_heads; ++h) {
      float* v = k + (t * n_heads + h) * head_dim;
      const float* l = lambda + int64_t(h) * head_dim;
      for (int c = 0; c < head_dim; ++c) v[c] /= l[c];
      fwht_inplace(v, head_dim);
    }
}

void transform_queries(float* q, int64_t n_tokens, int n_q_heads, int n_kv_heads, int head_dim,
                       const float* lambda) {
  (void)hadamard_block(head_dim);
  VQ_CHECK(n_kv_heads >= 1 && n_q_heads % n_kv_heads == 0,
           "transform_queries: n_q_heads = {} is not a multiple of n_kv_heads = {}", n_q_heads, n_kv_heads);
  const int group = n_q_heads / n_kv_heads;
  for (int64_t t = 0; t < n_tokens; ++t)
    for (int h = 0; h < n_q_heads; ++h) {
      float* v = q + (t * n_q_heads + h) * head_dim;
      const float* l = lambda + int64_t(h / group) * head_dim;
      for (int c = 0; c < head_dim; ++c) v[c] *= l[c];
      fwht_inplace(v, head_dim);
    }
}

}  // namespace vq
