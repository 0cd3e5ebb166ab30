#include "ops/ref/pq.h"

#include <algorithm>
#include <vector>

namespace vq::ref {

int64_t pq_encode_chunk(const PQShape& s) {
  const int64_t per = int64_t(s.n_centroids) * s.sub_dim;  // floats of diff per sub-vector
  const int64_t cap = (int64_t(64) << 20) / int64_t(sizeof(float));
  return std::max<int64_t>(1, std::min<int64_t>(4096, cap / per));
}

size_t pq_encode_scratch_bytes(const PQShape& s) {
  const int64_t total = s.n * s.n_sub;
  const int64_t chunk = std::min(pq_encode_chunk(s), std::max<int64_t>(total, 0));
  return size_t(chunk) * size_t(s.n_centroids) * (size_t(s.sub_dim) + 1) * sizeof(float);
}

void pq_encode(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes) {
  check_pq_shape(s, "ref::pq_encode");
  const int64_t total = s.n * s.n_sub;  // sub-vectors, row-major: index t = i*n_sub + j
  if (total == 0) return;
  const int k = s.n_centroids, d = s.sub_dim;
  const int64_t chunk = std::min(pq_encode_chunk(s), total);
  std::vector<float> diff(size_t(chunk) * k * d);  // diff: [chunk, k, d] f32, x_t - c
  std::vector<float> dist(size_t(chunk) * k);      // dist: [chunk, k] f32, sum of squares
  for (int64_t t0 = 0; t0 < total; t0 += chunk) {
    const int64_t m = std::min(chunk, total - t0);
    for (int64_t r = 0; r < m; ++r) {
      const int64_t t = t0 + r;
      const float* xv = x + t * d;
      const float* book = codebooks + (s.per_subspace ? int64_t(t % s.n_sub) * k * d : 0);
      for (int c = 0; c < k; ++c)
        for (int e = 0; e < d; ++e) diff[(size_t(r) * k + c) * d + e] = xv[e] - book[int64_t(c) * d + e];
    }
    for (int64_t rc = 0; rc < m * k; ++rc) {
      float acc = 0.0f;
      for (int e = 0; e < d; ++e) acc += diff[size_t(rc) * d + e] * diff[size_t(rc) * d + e];
      dist[size_t(rc)] = acc;
    }
    for (int64_t r = 0; r < m; ++r) {
      int best = 0;
      float best_d = dist[size_t(r) * k];
      for (int c = 1; c < k; ++c)
        if (dist[size_t(r) * k + c] < best_d) best_d = dist[size_t(r) * k + c], best = c;
      codes[t0 + r] = uint16_t(best);
    }
  }
}

void pq_decode(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out) {
  check_pq_shape(s, "ref::pq_decode");
  const int k = s.n_centroids, d = s.sub_dim;
  for (int64_t i = 0; i < s.n; ++i)
    for (int j = 0; j < s.n_sub; ++j) {
      const uint16_t c = codes[i * s.n_sub + j];
      VQ_CHECK(c < k, "ref::pq_decode: code {} at [{}, {}] >= n_centroids {}", c, i, j, k);
      const float* src = codebooks + ((s.per_subspace ? int64_t(j) * k : 0) + c) * d;
      std::copy(src, src + d, out + (i * s.n_sub + j) * d);
    }
}

}  // namespace vq::ref
