// The element-wise layers (model/layers.h) against plain double-precision formulas, on every
// Highway target this machine runs (not only the best one), with lengths that leave vector tails.
#include <gtest/gtest.h>

#include <hwy/targets.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "model/layers.h"

namespace {

// Runs fn once per compiled-and-supported target (dispatch re-chooses after each mock change).
void for_each_target(const std::function<void(const char*)>& fn) {
  for (const int64_t t : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(t);
    fn(hwy::TargetName(t));
  }
  hwy::SetSupportedTargetsForTest(0);
}

std::vector<float> randn(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

double gelu_tanh_ref(double g) {
  return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

TEST(Layers, GeluTanhMulMatchesFormula) {
  for_each_target([](const char* target) {
    for (int n : {1, 7, 16, 33, 67, 300}) {
      auto g = randn(size_t(n), uint64_t(n), 3.0f);
      const auto u = randn(size_t(n), uint64_t(n) + 100, 1.0f);
      // limits (the cubic term overflows exp from |g| ~ 10), zero, the dip near -0.75
      if (n >= 6) g[0] = -60.0f, g[1] = 60.0f, g[2] = 0.0f, g[3] = -0.75f, g[4] = -12.0f, g[5] = -1e30f;
      std::vector<float> out(static_cast<size_t>(n));
      vq::gelu_tanh_mul(g.data(), u.data(), out.data(), n);
      for (int i = 0; i < n; ++i) {
        const double want = gelu_tanh_ref(g[size_t(i)]) * u[size_t(i)];
        ASSERT_TRUE(std::isfinite(out[size_t(i)])) << target << " n=" << n << " i=" << i;
        // float32 formula with a vector exp: a few ulp of the inputs' magnitude
        EXPECT_NEAR(out[size_t(i)], want, 2e-6 * (std::fabs(g[size_t(i)] * u[size_t(i)]) + 1e-6))
            << target << " n=" << n << " g=" << g[size_t(i)];
      }
      // in place on the gate, as the forward pass calls it
      std::vector<float> g2 = g;
      vq::gelu_tanh_mul(g2.data(), u.data(), g2.data(), n);
      EXPECT_EQ(g2, out) << target;
    }
  });
}

TEST(Layers, SiluMulRmsNormScaleAdd) {
  for_each_target([](const char* target) {
    for (int n : {5, 16, 64, 101}) {
      auto x = randn(size_t(n), 7 + uint64_t(n), 2.0f);
      const auto w = randn(size_t(n), 8 + uint64_t(n), 1.0f);
      x[1] = -30.0f;  // exp(30) is still finite: silu -> ~0
      std::vector<float> y(static_cast<size_t>(n));
      vq::silu_mul(x.data(), w.data(), y.data(), n);
      for (int i = 0; i < n; ++i) {
        const double a = x[size_t(i)];
        EXPECT_NEAR(y[size_t(i)], a / (1.0 + std::exp(-a)) * w[size_t(i)], 2e-6 * (std::fabs(a * w[size_t(i)]) + 1e-6))
            << target;
      }
      const float eps = 1e-6f;
      vq::rms_norm(x.data(), w.data(), y.data(), n, eps);
      double ss = 0;
      for (float v : x) ss += double(v) * v;
      const double inv = 1.0 / std::sqrt(ss / n + eps);
      for (int i = 0; i < n; ++i) EXPECT_NEAR(y[size_t(i)], x[size_t(i)] * inv * w[size_t(i)], 1e-5) << target;
      y = x;
      vq::scale_inplace(y.data(), 25.5f, n);
      for (int i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[size_t(i)], x[size_t(i)] * 25.5f) << target;
      vq::add_inplace(y.data(), w.data(), n);
      for (int i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[size_t(i)], x[size_t(i)] * 25.5f + w[size_t(i)]) << target;
    }
  });
}

}  // namespace
