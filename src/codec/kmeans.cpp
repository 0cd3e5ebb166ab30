#include "codec/kmeans.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "codec/rng.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/pq.h"

namespace vq {

namespace {

constexpr int64_t kBlock = 1024;  // points per block of a fixed-order double sum

inline float sq_dist(const float* a, const float* b, int d) {
  float acc = 0.0f;
  for (int e = 0; e < d; ++e) {
    const float t = a[e] - b[e];
    acc += t * t;
  }
  return acc;
}

// Selection sampling (Knuth, Algorithm S): m of [0, n) indices, ascending, uniform.
std::vector<int64_t> sample_indices(int64_t n, int64_t m, SplitMix64& rng) {
  std::vector<int64_t> out;
  out.reserve(size_t(m));
  for (int64_t i = 0; i < n && int64_t(out.size()) < m; ++i)
    if (double(n - i) * rng.uniform() < double(m - int64_t(out.size()))) out.push_back(i);
  return out;
}

// Nearest centroid of every point (codes: [m]), its squared distance (dist: [m]); returns the sum.
double assign(const float* x, int64_t m, int d, const float* cents, int k, uint16_t* codes, float* dist) {
  const PQShape s{m, 1, d, k, false};
  cpu::pq_encode(s, x, cents, codes);
  const int64_t nb = (m + kBlock - 1) / kBlock;
  std::vector<double> block_sum(size_t(nb), 0.0);  // block_sum: [nb] f64
  parallel_for(size_t(nb), [&](size_t b0, size_t b1, int) {
    for (size_t b = b0; b < b1; ++b) {
      double acc = 0;
      const int64_t e = std::min(m, int64_t(b + 1) * kBlock);
      for (int64_t i = int64_t(b) * kBlock; i < e; ++i) {
        dist[i] = sq_dist(x + i * d, cents + int64_t(codes[i]) * d, d);
        acc += dist[i];
      }
      block_sum[b] = acc;
    }
  });
  return std::accumulate(block_sum.begin(), block_sum.end(), 0.0);
}

// k-means++ seeding (D^2 sampling) over pts: [m, d].
void kmeanspp(const float* pts, int64_t m, int d, int k, SplitMix64& rng, float* cents) {
  std::vector<float> d2(static_cast<size_t>(m));  // d2: [m] squared distance to the nearest chosen centroid
  const int64_t nb = (m + kBlock - 1) / kBlock;
  std::vector<double> block_sum(static_cast<size_t>(nb));  // block_sum: [nb] f64 sums of d2
  auto update = [&](const float* c, bool first) {
    parallel_for(size_t(nb), [&](size_t b0, size_t b1, int) {
      for (size_t b = b0; b < b1; ++b) {
        double acc = 0;
        const int64_t e = std::min(m, int64_t(b + 1) * kBlock);
        for (int64_t i = int64_t(b) * kBlock; i < e; ++i) {
          const float v = sq_dist(pts + i * d, c, d);
          d2[i] = first ? v : std::min(d2[i], v);
          acc += d2[i];
        }
        block_sum[b] = acc;
      }
    });
  };
  int64_t idx = int64_t(rng.below(uint64_t(m)));
  std::copy(pts + idx * d, pts + (idx + 1) * d, cents);
  update(cents, true);
  for (int c = 1; c < k; ++c) {
    const double total = std::accumulate(block_sum.begin(), block_sum.end(), 0.0);
    if (!(total > 0)) {
      idx = int64_t(rng.below(uint64_t(m)));  // every point sits on a centroid: any point will do
    } else {
      double r = rng.uniform() * total;
      int64_t b = 0;
      while (b + 1 < nb && r >= block_sum[size_t(b)]) r -= block_sum[size_t(b++)];
      const int64_t e = std::min(m, (b + 1) * kBlock);
      idx = -1;
      for (int64_t i = b * kBlock; i < e; ++i) {
        if (d2[i] > 0) idx = i;  // last positive one is the fallback against rounding
        if (r < d2[i]) break;
        r -= d2[i];
      }
      if (idx < 0) idx = int64_t(rng.below(uint64_t(m)));
    }
    float* dst = cents + int64_t(c) * d;
    std::copy(pts + idx * d, pts + (idx + 1) * d, dst);
    update(dst, false);
  }
}

void check_args(const float* x, int64_t n, int d, const KMeansParams& p) {
  VQ_CHECK(p.k >= 1 && p.k <= 65536, "kmeans: k = {} must be in 1..65536", p.k);
  VQ_CHECK(d >= 1 && d <= 256, "kmeans: d = {} must be in 1..256", d);
  VQ_CHECK(n >= p.k, "kmeans: n = {} points is fewer than k = {} centroids", n, p.k);
  VQ_CHECK(p.max_iters >= 0, "kmeans: max_iters = {} must be >= 0", p.max_iters);
  VQ_CHECK(p.tol >= 0, "kmeans: tol = {} must be >= 0", p.tol);
  VQ_CHECK(p.max_points_per_centroid >= 0 && p.kpp_points_per_centroid >= 0,
           "kmeans: points per centroid ({}, {}) must be >= 0", p.max_points_per_centroid,
           p.kpp_points_per_centroid);
  for (int64_t i = 0; i < n * d; ++i)
    VQ_CHECK(std::isfinite(x[i]), "kmeans: point {} element {} is {} (data must be finite)", i / d, i % d, x[i]);
}

}  // namespace

double kmeans_inertia(const float* x, int64_t n, int d, const float* centroids, int k) {
  std::vector<uint16_t> codes(static_cast<size_t>(n));  // codes: [n]
  std::vector<float> dist(static_cast<size_t>(n));      // dist: [n]
  return assign(x, n, d, centroids, k, codes.data(), dist.data());
}

KMeansResult kmeans(const float* x, int64_t n, int d, const KMeansParams& p) {
  check_args(x, n, d, p);
  const int k = p.k;
  SplitMix64 rng(p.seed);
  KMeansResult res;

  // Subsample to at most k * max_points_per_centroid points (ascending order keeps locality).
  std::vector<float> sub;  // sub: [m, d] f32, the points k-means runs on (when subsampled)
  const float* data = x;
  int64_t m = n;
  if (p.max_points_per_centroid > 0 && n > int64_t(k) * p.max_points_per_centroid) {
    m = int64_t(k) * p.max_points_per_centroid;
    const std::vector<int64_t> idx = sample_indices(n, m, rng);
    sub.resize(size_t(m) * d);
    for (int64_t i = 0; i < m; ++i) std::copy(x + idx[i] * d, x + (idx[i] + 1) * d, sub.data() + i * d);
    data = sub.data();
  }
  res.n_used = m;

  res.centroids.assign(size_t(k) * d, 0.0f);
  float* cents = res.centroids.data();
  if (p.init == KMeansInit::random) {
    const std::vector<int64_t> idx = sample_indices(m, k, rng);
    for (int c = 0; c < k; ++c) std::copy(data + idx[c] * d, data + (idx[c] + 1) * d, cents + int64_t(c) * d);
  } else {
    int64_t mp = m;
    std::vector<float> pp;  // pp: [mp, d] f32, the k-means++ seeding subsample
    const float* pts = data;
    if (p.kpp_points_per_centroid > 0 && m > int64_t(k) * p.kpp_points_per_centroid) {
      mp = int64_t(k) * p.kpp_points_per_centroid;
      const std::vector<int64_t> idx = sample_indices(m, mp, rng);
      pp.resize(size_t(mp) * d);
      for (int64_t i = 0; i < mp; ++i) std::copy(data + idx[i] * d, data + (idx[i] + 1) * d, pp.data() + i * d);
      pts = pp.data();
    }
    kmeanspp(pts, mp, d, k, rng, cents);
  }

  std::vector<uint16_t> codes(static_cast<size_t>(m));     // codes: [m] nearest centroid per point
  std::vector<float> dist(static_cast<size_t>(m));         // dist: [m] squared distance to it
  std::vector<double> sums(size_t(k) * d);    // sums: [k, d] f64
  std::vector<int64_t> counts(static_cast<size_t>(k));     // counts: [k]
  for (int it = 0;; ++it) {
    const double inertia = assign(data, m, d, cents, k, codes.data(), dist.data());
    const double prev = res.inertia_history.empty() ? 0.0 : res.inertia_history.back();
    res.inertia_history.push_back(inertia);
    res.inertia = inertia;
    if (it == p.max_iters) break;
    if (it > 0 && prev > 0 && (prev - inertia) < p.tol * prev) break;
    if (!(inertia > 0)) break;  // every point sits on a centroid

    // Update: each thread owns a range of centroids and scans all points in order (fixed order).
    parallel_for(size_t(k), [&](size_t c0, size_t c1, int) {
      std::fill(sums.begin() + int64_t(c0) * d, sums.begin() + int64_t(c1) * d, 0.0);
      std::fill(counts.begin() + int64_t(c0), counts.begin() + int64_t(c1), 0);
      for (int64_t i = 0; i < m; ++i) {
        const size_t c = codes[i];
        if (c < c0 || c >= c1) continue;
        ++counts[c];
        for (int e = 0; e < d; ++e) sums[c * d + e] += data[i * d + e];
      }
      for (size_t c = c0; c < c1; ++c)
        if (counts[c] > 0)
          for (int e = 0; e < d; ++e) cents[c * d + e] = float(sums[c * d + e] / double(counts[c]));
    });
    // Empty clusters take the points farthest from their centroids.
    std::vector<int> empty;
    for (int c = 0; c < k; ++c)
      if (counts[size_t(c)] == 0) empty.push_back(c);
    if (!empty.empty()) {
      std::vector<int64_t> order(static_cast<size_t>(m));
      std::iota(order.begin(), order.end(), 0);
      const size_t take = std::min(empty.size(), order.size());
      std::partial_sort(order.begin(), order.begin() + int64_t(take), order.end(), [&](int64_t a, int64_t b) {
        return dist[a] != dist[b] ? dist[a] > dist[b] : a < b;
      });
      for (size_t e = 0; e < take; ++e) {
        const int64_t i = order[e];
        if (!(dist[i] > 0)) break;
        std::copy(data + i * d, data + (i + 1) * d, cents + int64_t(empty[e]) * d);
        ++res.empty_reseeds;
      }
    }
    ++res.iterations;
  }
  return res;
}

}  // namespace vq
