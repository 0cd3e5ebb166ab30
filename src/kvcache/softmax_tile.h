#pragma once
// One online-softmax step over a tile of scores, shared by the scalar-code caches:
// updates (m, d), turns s[0..n) into weights p = exp(s - m_new), returns the rescale factor of
// the existing output accumulator.
#include <algorithm>
#include <cmath>

namespace vq {

inline float softmax_tile(float& m, float& d, float* s, int n) {
  float mx = m;
  for (int t = 0; t < n; ++t) mx = std::max(mx, s[t]);
  const float alpha = m == -INFINITY ? 0.0f : std::exp(m - mx);
  float sum = 0;
  for (int t = 0; t < n; ++t) {
    s[t] = std::exp(s[t] - mx);
    sum += s[t];
  }
  d = d * alpha + sum;
  m = mx;
  return alpha;
}

}  // namespace vq
