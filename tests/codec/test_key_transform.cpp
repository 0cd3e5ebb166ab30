#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "codec/key_transform.h"
#include "core/error.h"

namespace vq {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, scale);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

TEST(Hadamard, OrthonormalAndSelfInverse) {
  for (int n : {8, 16, 64, 128, 256, 96, 80}) {
    // Columns of H: transform of unit vectors. Check H H^T = I.
    std::vector<float> h(size_t(n) * n, 0.f);
    for (int i = 0; i < n; ++i) {
      h[size_t(i) * n + i] = 1.f;
      fwht_inplace(h.data() + size_t(i) * n, n);
    }
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        double dot = 0;
        for (int t = 0; t < n; ++t) dot += double(h[size_t(i) * n + t]) * h[size_t(j) * n + t];
        ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5) << n << " " << i << " " << j;
      }
    auto v = gaussian(size_t(n), uint32_t(n));
    const auto orig = v;
    fwht_inplace(v.data(), n);
    EXPECT_NE(v, orig);
    fwht_inplace(v.data(), n);
    for (int i = 0; i < n; ++i) EXPECT_NEAR(v[size_t(i)], orig[size_t(i)], 1e-5f);
  }
}

TEST(Hadamard, KnownValuesAndBlocks) {
  float v[4] = {1, 0, 0, 0};
  EXPECT_THROW(fwht_inplace(v, 4 * 3), Error);  // 12: power-of-two divisor 4 < 8
  float w[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  fwht_inplace(w, 8);
  EXPECT_NEAR(w[0], 36.f / std::sqrt(8.f), 1e-5f);
  EXPECT_NEAR(w[1], -4.f / std::sqrt(8.f), 1e-5f);  // (1-2+3-4+5-6+7-8)
  EXPECT_EQ(hadamard_block(128), 128);
  EXPECT_EQ(hadamard_block(96), 32);
  EXPECT_EQ(hadamard_block(80), 16);
  EXPECT_THROW(hadamard_block(36), Error);
  EXPECT_THROW(hadamard_block(0), Error);
}

TEST(KeyTransform, PreservesQDotK) {
  const int T = 50, n_kv = 2, n_q = 6, D = 64;
  auto k = gaussian(size_t(T) * n_kv * D, 1);
  for (int t = 0; t < T; ++t) k[(size_t(t) * n_kv + 1) * D + 5] *= 40.f;  // an outlier channel
  auto q = gaussian(size_t(n_q) * D, 2);
  const auto lambda = smoothing_factors(k.data(), T, n_kv, D);
  ASSERT_EQ(lambda.size(), size_t(n_kv) * D);
  for (float l : lambda) EXPECT_GE(l, kMinLambda);
  auto kt = k, qt = q;
  transform_keys(kt.data(), T, n_kv, D, lambda.data());
  transform_queries(qt.data(), 1, n_q, n_kv, D, lambda.data());
  const int group = n_q / n_kv;
  double max_rel = 0;
  for (int h = 0; h < n_q; ++h)
    for (int t = 0; t < T; ++t) {
      double a = 0, b = 0, scale = 0;
      for (int c = 0; c < D; ++c) {
        const float kv = k[(size_t(t) * n_kv + h / group) * D + c], qv = q[size_t(h) * D + c];
        a += double(qv) * kv;
        b += double(qt[size_t(h) * D + c]) * kt[(size_t(t) * n_kv + h / group) * D + c];
        scale += std::fabs(double(qv) * kv);
      }
      max_rel = std::max(max_rel, std::fabs(a - b) / scale);
    }
  EXPECT_LT(max_rel, 1e-5);
  // Smoothing + rotation shrinks the outlier: the max |k~| is far below the max |k|.
  float mk = 0, mkt = 0;
  for (size_t i = 0; i < k.size(); ++i) mk = std::max(mk, std::fabs(k[i])), mkt = std::max(mkt, std::fabs(kt[i]));
  EXPECT_LT(mkt * 4, mk);
}

TEST(KeyTransform, SmoothingFloorAndBadInput) {
  std::vector<float> zeros(2 * 8, 0.f);
  const auto l = smoothing_factors(zeros.data(), 2, 1, 8);
  for (float v : l) EXPECT_EQ(v, kMinLambda);
  zeros[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(smoothing_factors(zeros.data(), 2, 1, 8), Error);
  std::vector<float> q(12, 1.f), lam(8, 1.f);
  EXPECT_THROW(transform_queries(q.data(), 1, 3, 2, 8, lam.data()), Error);  // 3 q heads, 2 kv heads
}

}  // namespace
}  // namespace vq
