#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "codec/kmeans.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace vq {
namespace {

// n points in d dims drawn around `clusters` well-separated centres; returns [n, d].
std::vector<float> clustered(int64_t n, int d, int clusters, uint32_t seed, float spread = 0.05f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> centres(size_t(clusters) * d);
  for (auto& c : centres) c = 10.f * nd(rng);
  std::vector<float> x(size_t(n) * d);
  for (int64_t i = 0; i < n; ++i) {
    // Unequal cluster sizes make random initialisation miss small clusters.
    const int c = int(std::min<int64_t>(clusters - 1, int64_t(std::pow(double(rng() % 1000) / 1000.0, 3) * clusters)));
    for (int e = 0; e < d; ++e) x[size_t(i) * d + e] = centres[size_t(c) * d + e] + spread * nd(rng);
  }
  return x;
}

std::vector<float> gaussian(int64_t n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> x(size_t(n) * d);
  for (auto& v : x) v = nd(rng);
  return x;
}

TEST(KMeans, InertiaNeverRises) {
  for (int d : {2, 4, 8, 16}) {
    const auto x = gaussian(6000, d, 11 + d);
    KMeansParams p;
    p.k = 64;
    p.max_iters = 30;
    p.tol = 0;
    for (KMeansInit init : {KMeansInit::kmeanspp, KMeansInit::random}) {
      p.init = init;
      const KMeansResult r = kmeans(x.data(), 6000, d, p);
      ASSERT_GE(r.inertia_history.size(), 5u);
      for (size_t i = 1; i < r.inertia_history.size(); ++i)
        EXPECT_LE(r.inertia_history[i], r.inertia_history[i - 1] * (1 + 1e-6)) << "d " << d << " iter " << i;
      // The reported inertia is that of the returned centroids.
      EXPECT_NEAR(kmeans_inertia(x.data(), 6000, d, r.centroids.data(), p.k), r.inertia, 1e-6 * r.inertia);
      EXPECT_LT(r.inertia_history.back(), 0.9 * r.inertia_history.front());
    }
  }
}

TEST(KMeans, PlusPlusBeatsRandomOnClusteredData) {
  const int d = 4, clusters = 32;
  const auto x = clustered(8000, d, clusters, 5);
  double pp = 0, rnd = 0;
  for (uint64_t seed = 0; seed < 5; ++seed) {
    KMeansParams p;
    p.k = clusters;
    p.max_iters = 0;  // compare the initialisations themselves
    p.seed = seed;
    p.init = KMeansInit::kmeanspp;
    pp += kmeans(x.data(), 8000, d, p).inertia;
    p.init = KMeansInit::random;
    rnd += kmeans(x.data(), 8000, d, p).inertia;
  }
  EXPECT_LT(pp, 0.5 * rnd) << "k-means++ " << pp << " random " << rnd;
}

TEST(KMeans, DeterministicWithSeedAndAnyThreadCount) {
  const auto x = gaussian(20000, 8, 3);
  KMeansParams p;
  p.k = 128;
  p.max_iters = 8;
  p.max_points_per_centroid = 100;  // exercises subsampling (12800 of 20000)
  p.seed = 42;
  set_num_threads(1);
  const KMeansResult a = kmeans(x.data(), 20000, 8, p);
  set_num_threads(2);
  const KMeansResult b = kmeans(x.data(), 20000, 8, p);
  set_num_threads(3);
  const KMeansResult c = kmeans(x.data(), 20000, 8, p);
  EXPECT_EQ(a.n_used, 12800);
  EXPECT_EQ(a.centroids, b.centroids);
  EXPECT_EQ(a.centroids, c.centroids);
  EXPECT_EQ(a.inertia_history, b.inertia_history);
  p.seed = 43;
  const KMeansResult other = kmeans(x.data(), 20000, 8, p);
  EXPECT_NE(a.centroids, other.centroids);
  set_num_threads(2);
}

TEST(KMeans, EmptyClustersAreReseeded) {
  // Random init on data with a far outlier group: place every initial centroid in the big
  // group by making 8 points far away and k large; Lloyd leaves clusters empty, which must be
  // re-seeded onto the farthest points, ending with every point near some centroid.
  const int d = 2, k = 16;
  std::vector<float> x;
  for (int i = 0; i < 4000; ++i) {  // many duplicates of 4 points: k=16 centroids, many empties
    const int c = i % 4;
    x.push_back(float(c));
    x.push_back(0.f);
  }
  for (int i = 0; i < 8; ++i) {
    x.push_back(1000.f + float(i) * 50.f);
    x.push_back(1000.f);
  }
  const int64_t n = int64_t(x.size()) / d;
  KMeansParams p;
  p.k = k;
  p.init = KMeansInit::random;
  p.max_iters = 20;
  p.tol = 0;
  p.seed = 1;
  const KMeansResult r = kmeans(x.data(), n, d, p);
  EXPECT_GT(r.empty_reseeds, 0);
  EXPECT_NEAR(r.inertia, 0.0, 1e-3);  // 12 distinct points, 16 centroids: all covered
  for (float v : r.centroids) EXPECT_TRUE(std::isfinite(v));
  for (size_t i = 1; i < r.inertia_history.size(); ++i)
    EXPECT_LE(r.inertia_history[i], r.inertia_history[i - 1] * (1 + 1e-6));
}

TEST(KMeans, FewerDistinctPointsThanK) {
  std::vector<float> x(200 * 4, 1.5f);  // one distinct point
  KMeansParams p;
  p.k = 16;
  const KMeansResult r = kmeans(x.data(), 200, 4, p);
  EXPECT_EQ(r.inertia, 0.0);
  for (float v : r.centroids) EXPECT_EQ(v, 1.5f);
}

TEST(KMeans, BadInput) {
  auto x = gaussian(100, 4, 1);
  KMeansParams p;
  p.k = 256;
  EXPECT_THROW(kmeans(x.data(), 100, 4, p), Error);  // n < k
  p.k = 0;
  EXPECT_THROW(kmeans(x.data(), 100, 4, p), Error);
  p.k = 8;
  EXPECT_THROW(kmeans(x.data(), 0, 4, p), Error);  // empty input
  EXPECT_THROW(kmeans(x.data(), 100, 0, p), Error);
  x[37] = std::numeric_limits<float>::quiet_NaN();
  try {
    kmeans(x.data(), 100, 4, p);
    FAIL() << "NaN accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("point 9"), std::string::npos) << e.what();
  }
  x[37] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(kmeans(x.data(), 100, 4, p), Error);
}

}  // namespace
}  // namespace vq
