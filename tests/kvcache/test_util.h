#pragma once
// Helpers shared by the kvcache tests.
#include <cmath>
#include <random>
#include <vector>

namespace vq {

inline std::vector<float> randn(size_t n, std::mt19937& rng, float sigma = 1.0f) {
  std::normal_distribution<float> nd(0.0f, sigma);
  std::vector<float> x(n);
  for (auto& e : x) e = nd(rng);
  return x;
}

// Normalized MSE: sum (a-b)^2 / sum b^2.
inline double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += double(a[i] - b[i]) * double(a[i] - b[i]);
    den += double(b[i]) * double(b[i]);
  }
  return den > 0 ? num / den : num;
}

}  // namespace vq
