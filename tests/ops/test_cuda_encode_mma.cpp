// GPU-only: the tensor-core nearest-centroid encoder (cuda::pq_encode_mma, pq_encode_mma.cu)
// against distances computed here in double. Skips without a device.
//
// Parity rule (this encoder is not exact; see pq.h): the distance d(x, c) = |x - c|^2 it
// computes for a candidate c is off by at most e(c) = 2^-11 (|x|^2 + |c|^2) from fp16 centroids
// plus 2^-15 |d - |x|^2| <= 2^-14 (|x|^2 + |c|^2) from the index spliced into the mantissa,
// i.e. e(c) <= 5.5e-4 (|x|^2 + |c|^2). So for every sub-vector the chosen centroid's true
// distance must be within e(chosen) + e(best) of the true minimum (checked with 6e-4), and the
// reconstruction error summed over all sub-vectors must be within 1e-3 relative of the exact
// encoder's (the sum of the minima). Outputs are poisoned (0xFFFF, never a valid code here).
#if defined(VQ_HAVE_CUDA)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "cuda_test_util.h"
#include "ops/cuda/pq.h"

namespace vq::test {
namespace {

struct MmaCase {
  const char* name;
  int64_t n;
  int n_sub, sub_dim, K;
  float x_scale, book_scale;
  bool near_centroids;  // x = a centroid + small noise (near-ties between close centroids)
};

const MmaCase kMma[] = {
    {"d8_k256_ragged", 1001, 3, 8, 256, 1.0f, 1.0f, false},
    {"d4_k256_ragged", 777, 5, 4, 256, 1.0f, 1.0f, false},
    {"d8_k16", 500, 16, 8, 16, 1.0f, 1.0f, false},
    {"d4_k8_one_row", 1, 7, 4, 8, 1.0f, 1.0f, false},
    {"d8_k256_scaled_near", 2048, 4, 8, 256, 30.0f, 30.0f, true},
    {"d4_k128_small_near", 900, 8, 4, 128, 0.01f, 0.01f, true},
    {"d8_k64_offset_books", 3000, 2, 8, 64, 1.0f, 3.0f, false},
};

class CudaEncodeMma : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaEncodeMma, ChosenDistanceWithinBoundOfMinimum) {
  VQ_SKIP_WITHOUT_CUDA();
  const MmaCase& c = kMma[GetParam()];
  std::mt19937 rng(1234 + unsigned(GetParam()) * 77);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int D = c.sub_dim;
  const PQShape s{c.n, c.n_sub, D, c.K, false};
  const int64_t N = c.n * c.n_sub;
  // book: [K, D] f32; x: [n, n_sub*D] f32 (N sub-vectors of D)
  std::vector<float> book(size_t(c.K) * D), x(size_t(N) * D);
  for (auto& v : book) v = c.book_scale * nd(rng);
  for (int64_t i = 0; i < N; ++i) {
    const size_t src = size_t(rng() % unsigned(c.K));  // near_centroids: all dims near one centroid
    for (int e = 0; e < D; ++e)
      x[size_t(i) * D + e] = c.near_centroids ? book[src * D + e] + 0.05f * c.x_scale * nd(rng) : c.x_scale * nd(rng);
  }
  std::vector<uint16_t> codes(size_t(N), 0xFFFF);
  cuda::pq_encode_mma(s, x.data(), book.data(), codes.data());

  std::vector<double> cn(size_t(c.K));
  for (int k = 0; k < c.K; ++k) {
    double n = 0;
    for (int e = 0; e < D; ++e) n += double(book[size_t(k) * D + e]) * book[size_t(k) * D + e];
    cn[size_t(k)] = n;
  }
  double sum_min = 0, sum_chosen = 0;
  int64_t bad = 0, differ = 0;
  for (int64_t i = 0; i < N; ++i) {
    const float* xi = x.data() + size_t(i) * D;
    ASSERT_LT(codes[size_t(i)], c.K) << c.name << " sub-vector " << i << " unwritten or out of range";
    double xx = 0;
    for (int e = 0; e < D; ++e) xx += double(xi[e]) * xi[e];
    auto dist = [&](int k) {
      double d = 0;
      for (int e = 0; e < D; ++e) {
        const double t = double(xi[e]) - book[size_t(k) * D + e];
        d += t * t;
      }
      return d;
    };
    int best = 0;
    double dmin = dist(0);
    for (int k = 1; k < c.K; ++k) {
      const double d = dist(k);
      if (d < dmin) dmin = d, best = k;
    }
    const int ch = codes[size_t(i)];
    const double dch = dist(ch);
    const double tol = 6e-4 * (2 * xx + cn[size_t(ch)] + cn[size_t(best)]) + 1e-12;
    if (dch - dmin > tol && bad++ < 5)
      ADD_FAILURE() << c.name << " sub-vector " << i << ": chose " << ch << " (d " << dch << "), min " << best
                    << " (d " << dmin << "), tolerance " << tol;
    differ += dch > dmin;
    sum_min += dmin;
    sum_chosen += dch;
  }
  EXPECT_EQ(bad, 0) << c.name;
  EXPECT_LE(sum_chosen - sum_min, 1e-3 * sum_min) << c.name << ": reconstruction error vs the exact encoder";
  RecordProperty("differing_codes", int(differ));
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaEncodeMma, ::testing::Range<size_t>(0, std::size(kMma)),
                         [](const auto& i) { return std::string(kMma[i.param].name); });

TEST(CudaEncodeMma, RejectsUnsupportedShapesWithNamedErrors) {
  VQ_SKIP_WITHOUT_CUDA();
  std::vector<float> x(64 * 16, 0.5f), book(512 * 16, 0.25f);
  std::vector<uint16_t> codes(64 * 4);
  EXPECT_FALSE(cuda::pq_encode_mma_supported(PQShape{16, 4, 8, 256, true}));
  EXPECT_FALSE(cuda::pq_encode_mma_supported(PQShape{16, 4, 16, 256, false}));
  EXPECT_FALSE(cuda::pq_encode_mma_supported(PQShape{16, 4, 8, 512, false}));
  EXPECT_FALSE(cuda::pq_encode_mma_supported(PQShape{16, 4, 8, 100, false}));
  EXPECT_TRUE(cuda::pq_encode_mma_supported(PQShape{16, 4, 8, 256, false}));
  try {
    cuda::pq_encode_mma(PQShape{16, 4, 8, 512, false}, x.data(), book.data(), codes.data());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_centroids 512"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vq::test
#endif
