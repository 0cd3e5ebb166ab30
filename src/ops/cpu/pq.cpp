// Temporary simple fused encoder (replaced by the Highway register-blocked version).
#include "ops/cpu/pq.h"

#include <algorithm>
#include <limits>

#include "core/thread_pool.h"

namespace vq::cpu {

void pq_encode(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes) {
  check_pq_shape(s, "cpu::pq_encode");
  const int k = s.n_centroids, d = s.sub_dim;
  parallel_for(size_t(s.n), [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i)
      for (int j = 0; j < s.n_sub; ++j) {
        const float* xv = x + (int64_t(i) * s.n_sub + j) * d;
        const float* book = codebooks + (s.per_subspace ? int64_t(j) * k * d : 0);
        int best = 0;
        float best_d = std::numeric_limits<float>::infinity();
        for (int c = 0; c < k; ++c) {
          float acc = 0.0f;
          for (int t = 0; t < d; ++t) {
            const float df = xv[t] - book[int64_t(c) * d + t];
            acc += df * df;
          }
          if (acc < best_d) best_d = acc, best = c;
        }
        codes[int64_t(i) * s.n_sub + j] = uint16_t(best);
      }
  }, 64);
}

void pq_decode(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out) {
  check_pq_shape(s, "cpu::pq_decode");
  const int k = s.n_centroids, d = s.sub_dim;
  for (int64_t i = 0; i < s.n * s.n_sub; ++i) {
    const int j = int(i % s.n_sub);
    VQ_CHECK(codes[i] < k, "cpu::pq_decode: code {} at [{}, {}] >= n_centroids {}", codes[i], i / s.n_sub, j, k);
    const float* src = codebooks + ((s.per_subspace ? int64_t(j) * k : 0) + codes[i]) * d;
    std::copy(src, src + d, out + i * d);
  }
}

}  // namespace vq::cpu
