// Sampler: greedy/top-k=1 equal argmax, seeded determinism, the top-p and min-p cuts, the
// repetition penalty (llama.cpp semantics), and temperature sampling frequencies against softmax.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "model/sampler.h"

namespace vq {
namespace {

std::vector<float> random_logits(int n, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> l(static_cast<size_t>(n));  // [n_vocab]
  for (auto& x : l) x = dist(g);
  return l;
}

SamplerParams plain(float temp) {  // no truncation
  SamplerParams p;
  p.temp = temp;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  return p;
}

TEST(Sampler, GreedyIsArgmax) {
  for (uint64_t s = 0; s < 5; ++s) {
    const auto l = random_logits(49152, s);
    const auto best = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    Sampler greedy(plain(0.0f));
    EXPECT_EQ(greedy.sample(l.data(), 49152), best);
    SamplerParams k1 = plain(1.0f);
    k1.top_k = 1;
    Sampler topk1(k1);
    EXPECT_EQ(topk1.sample(l.data(), 49152), best);
  }
  const float ties[] = {1.0f, 3.0f, 3.0f, -2.0f};
  Sampler greedy(plain(-1.0f));
  EXPECT_EQ(greedy.sample(ties, 4), 1);  // lowest id on ties
  const float with_nan[] = {NAN, 0.5f, 0.25f};
  EXPECT_EQ(greedy.sample(with_nan, 3), 1);
}

TEST(Sampler, SeededDeterminism) {
  const auto l = random_logits(49152, 7, 1.0f);
  SamplerParams p;  // defaults: temp 0.8, top-k 40, top-p 0.95, min-p 0.05
  p.seed = 1234;
  Sampler a(p), b(p);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 300; ++i) {
    sa.push_back(a.sample(l.data(), 49152));
    sb.push_back(b.sample(l.data(), 49152));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_GT(std::set<int32_t>(sa.begin(), sa.end()).size(), 3u);  // really sampling
  a.reset();
  std::vector<int32_t> again;
  for (int i = 0; i < 300; ++i) again.push_back(a.sample(l.data(), 49152));
  EXPECT_EQ(again, sa);
  p.seed = 1235;
  Sampler c(p);
  std::vector<int32_t> sc;
  for (int i = 0; i < 300; ++i) sc.push_back(c.sample(l.data(), 49152));
  EXPECT_NE(sc, sa);
}

// Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
const float kQuarter[] = {std::log(0.5f), std::log(0.3f), std::log(0.15f), std::log(0.05f)};

std::vector<int> counts(Sampler& s, const float* l, int n, int draws) {
  std::vector<int> c(static_cast<size_t>(n), 0);
  for (int i = 0; i < draws; ++i) ++c[static_cast<size_t>(s.sample(l, n))];
  return c;
}

TEST(Sampler, TopPKeepsTheSmallestPrefixReachingP) {
  SamplerParams p = plain(1.0f);
  p.top_p = 0.79f;  // 0.5 < 0.79 <= 0.8: tokens 0 and 1
  Sampler s(p);
  auto c = counts(s, kQuarter, 4, 20000);
  EXPECT_EQ(c[2] + c[3], 0);
  EXPECT_NEAR(c[0] / 20000.0, 0.5 / 0.8, 0.02);  // renormalised over the kept mass
  p.top_p = 0.81f;  // now token 2 is needed too
  Sampler s2(p);
  c = counts(s2, kQuarter, 4, 20000);
  EXPECT_GT(c[2], 0);
  EXPECT_EQ(c[3], 0);
}

TEST(Sampler, TopPOverALongPrefixMatchesAFullSort) {
  // Flat logits: the nucleus holds hundreds of tokens, past the first partial-sort prefix.
  const int n = 2000;
  const auto l = random_logits(n, 5, 0.3f);
  std::vector<int32_t> order(n);
  for (int i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)]; });
  double z = 0, cum = 0;
  for (float x : l) z += std::exp(x);
  std::set<int32_t> nucleus;
  for (int32_t id : order) {
    nucleus.insert(id);
    cum += std::exp(l[static_cast<size_t>(id)]) / z;
    if (cum >= 0.6) break;
  }
  ASSERT_GT(nucleus.size(), 300u);
  SamplerParams p = plain(1.0f);
  p.top_p = 0.6f;
  Sampler s(p);
  std::set<int32_t> seen;
  for (int i = 0; i < 5000; ++i) seen.insert(s.sample(l.data(), n));
  EXPECT_TRUE(std::includes(nucleus.begin(), nucleus.end(), seen.begin(), seen.end()));
  EXPECT_GT(seen.size(), nucleus.size() * 8 / 10);  // ~5000 draws over ~1000 near-uniform tokens
}

TEST(Sampler, MinPCutsRelativeToTheTop) {
  SamplerParams p = plain(1.0f);
  p.min_p = 0.2f;  // p >= 0.1 survive: tokens 0, 1, 2
  Sampler s(p);
  auto c = counts(s, kQuarter, 4, 20000);
  EXPECT_GT(c[2], 0);
  EXPECT_EQ(c[3], 0);
  p.min_p = 0.5f;  // p >= 0.25: tokens 0, 1
  Sampler s2(p);
  c = counts(s2, kQuarter, 4, 20000);
  EXPECT_EQ(c[2] + c[3], 0);
  EXPECT_GT(c[1], 0);
}

TEST(Sampler, TopKRestrictsToTheKBest) {
  const auto l = random_logits(1000, 3, 0.5f);
  std::vector<int32_t> order(1000);
  for (int i = 0; i < 1000; ++i) order[static_cast<size_t>(i)] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[static_cast<size_t>(a)] > l[static_cast<size_t>(b)]; });
  const std::set<int32_t> best5(order.begin(), order.begin() + 5);
  SamplerParams p = plain(2.0f);
  p.top_k = 5;
  Sampler s(p);
  std::set<int32_t> seen;
  for (int i = 0; i < 2000; ++i) seen.insert(s.sample(l.data(), 1000));
  EXPECT_EQ(seen, best5);
}

TEST(Sampler, RepetitionPenaltyDividesPositiveMultipliesNegative) {
  SamplerParams p = plain(0.0f);
  p.repeat_penalty = 1.2f;
  p.repeat_last_n = 2;
  Sampler s(p);
  const float pos[] = {2.0f, 1.9f, 0.0f};
  EXPECT_EQ(s.sample(pos, 3), 0);
  s.accept(0);
  EXPECT_EQ(s.sample(pos, 3), 1);  // 2.0 / 1.2 = 1.67 < 1.9
  const float neg[] = {-1.0f, -1.1f, -5.0f};
  EXPECT_EQ(s.sample(neg, 3), 1);  // -1.0 * 1.2 = -1.2 < -1.1
  s.accept(0);  // history {0, 0}: penalised once (2.0/1.2 = 1.67 > 1.5), not twice (1.39 < 1.5)
  const float pos2[] = {2.0f, 1.5f, 0.0f};
  EXPECT_EQ(s.sample(pos2, 3), 0);
  EXPECT_EQ(s.sample(pos, 3), 1);
  s.accept(2);
  s.accept(2);  // token 0 has left the window of the last 2
  EXPECT_EQ(s.sample(pos, 3), 0);
  s.reset();
  EXPECT_EQ(s.sample(pos, 3), 0);
  SamplerParams off = p;
  off.repeat_penalty = 1.0f;
  Sampler none(off);
  none.accept(0);
  EXPECT_EQ(none.sample(pos, 3), 0);
}

TEST(Sampler, TemperatureFrequenciesFollowSoftmax) {
  const int n = 8, draws = 200000;
  const auto l = random_logits(n, 11, 1.0f);
  for (float temp : {0.5f, 1.0f, 1.7f}) {
    Sampler s([&] { SamplerParams p = plain(temp); p.seed = 99; return p; }());
    const auto c = counts(s, l.data(), n, draws);
    double z = 0;
    for (float x : l) z += std::exp(x / temp);
    for (int i = 0; i < n; ++i) {
      const double q = std::exp(l[static_cast<size_t>(i)] / temp) / z;
      const double f = c[static_cast<size_t>(i)] / static_cast<double>(draws);
      const double sigma = std::sqrt(q * (1 - q) / draws);
      EXPECT_NEAR(f, q, 5 * sigma + 1e-4) << "temp " << temp << " token " << i;  // 5 sigma: flake rate ~1e-6
    }
  }
}

TEST(Sampler, BadParameters) {
  SamplerParams p;
  p.top_p = 1.5f;
  EXPECT_THROW(Sampler{p}, Error);
  p = SamplerParams{};
  p.repeat_penalty = 0.0f;
  EXPECT_THROW(Sampler{p}, Error);
  p = SamplerParams{};
  p.min_p = -0.1f;
  EXPECT_THROW(Sampler{p}, Error);
  Sampler ok{SamplerParams{}};
  EXPECT_THROW(ok.sample(nullptr, 10), Error);
}

}  // namespace
}  // namespace vq
