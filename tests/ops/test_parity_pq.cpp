// The one backend-parity harness for product-quantization ops: every case in kCases runs
// against every backend registered in backends.h and is compared with vq::ref.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backends.h"
#include "core/error.h"
#include "ops/ref/pq.h"

namespace vq::test {
namespace {

struct PQCase {
  const char* name;
  int64_t n;
  int n_sub, sub_dim, n_centroids;
  bool per_subspace;
  float scale = 1.0f, offset = 0.0f;  // data = offset + scale * N(0, 1); codebook likewise
  bool duplicate_centroids = false;   // every centroid appears twice (ties)
};

// Widths: b = 4..12 (and odd centroid counts for padding); sub_dim 2, 4, 8, 16 (+ generic 3, 5);
// both granularities. Sub-vector counts kept small for the 4096-centroid cases (ref is slow).
const PQCase kCases[] = {
    {"d2_b4_shared", 300, 8, 2, 16, false},
    {"d2_b8_per", 200, 8, 2, 256, true},
    {"d2_b12_shared", 40, 8, 2, 4096, false},
    {"d4_b4_per", 250, 8, 4, 16, true},
    {"d4_b5_shared", 300, 4, 4, 32, false},
    {"d4_b6_shared", 300, 4, 4, 64, false},
    {"d4_b8_shared", 500, 32, 4, 256, false},
    {"d4_b8_per", 100, 32, 4, 256, true},
    {"d4_b10_shared", 100, 8, 4, 1024, false},
    {"d4_b12_per", 20, 4, 4, 4096, true},
    {"d8_b4_shared", 300, 16, 8, 16, false},
    {"d8_b7_per", 200, 4, 8, 128, true},
    {"d8_b8_shared", 400, 16, 8, 256, false},
    {"d8_b8_per", 200, 16, 8, 256, true},
    {"d8_b9_shared", 300, 2, 8, 512, false},
    {"d8_b10_per", 50, 4, 8, 1024, true},
    {"d8_b11_shared", 80, 2, 8, 2048, false},
    {"d8_b12_shared", 25, 16, 8, 4096, false},
    {"d16_b4_per", 300, 4, 16, 16, true},
    {"d16_b8_shared", 200, 8, 16, 256, false},
    {"d16_b12_per", 30, 4, 16, 4096, true},
    {"k1", 50, 3, 4, 1, false},
    {"k100_unpadded", 123, 5, 8, 100, false},
    {"k1000_per", 40, 3, 4, 1000, true},
    {"d3_generic", 97, 6, 3, 64, false},
    {"d5_generic_per", 61, 3, 5, 200, true},
    {"n1", 1, 1, 8, 256, false},
    {"large_offset", 200, 16, 8, 256, false, 3.0f, 100.0f},
    {"large_scale_b12", 30, 8, 8, 4096, false, 1000.0f, 0.0f},
    {"tiny_scale", 200, 8, 4, 256, true, 1e-3f, 0.0f},
    {"duplicates", 300, 8, 4, 256, false, 1.0f, 0.0f, true},
    {"huge_values_k100", 50, 4, 8, 100, false, 1e18f, 0.0f},  // padding lanes must never win
};

struct Data {
  PQShape s;
  std::vector<float> x;      // [n, n_sub * sub_dim] f32
  std::vector<float> books;  // [n_books, k, sub_dim] f32
};

Data make_data(const PQCase& c, uint32_t seed) {
  Data D;
  D.s = PQShape{c.n, c.n_sub, c.sub_dim, c.n_centroids, c.per_subspace};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  D.x.resize(size_t(c.n) * c.n_sub * c.sub_dim);
  for (auto& v : D.x) v = c.offset + c.scale * nd(rng);
  D.books.resize(size_t(pq_n_books(D.s)) * c.n_centroids * c.sub_dim);
  for (auto& v : D.books) v = c.offset + c.scale * nd(rng);
  if (c.duplicate_centroids)
    for (int64_t b = 0; b < pq_n_books(D.s); ++b)
      for (int i = 1; i < c.n_centroids; i += 2)
        for (int e = 0; e < c.sub_dim; ++e) {
          float* book = D.books.data() + b * c.n_centroids * c.sub_dim;
          book[i * c.sub_dim + e] = book[(i - 1) * c.sub_dim + e];
        }
  return D;
}

double sqdist(const float* a, const float* b, int d) {
  double s = 0;
  for (int e = 0; e < d; ++e) s += (double(a[e]) - b[e]) * (double(a[e]) - b[e]);
  return s;
}
double sqnorm(const float* a, int d) {
  double s = 0;
  for (int e = 0; e < d; ++e) s += double(a[e]) * a[e];
  return s;
}

double recon_mse(const Data& D, const std::vector<uint16_t>& codes) {
  std::vector<float> y(D.x.size());
  ref::pq_decode(D.s, codes.data(), D.books.data(), y.data());
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += (double(y[i]) - D.x[i]) * (double(y[i]) - D.x[i]);
  return s / double(y.size());
}

struct Param {
  size_t backend, case_index;
};

class PQParity : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    const OpsBackend& b = ops_backends()[GetParam().backend];
    const std::string why = b.unavailable();
    if (!why.empty()) GTEST_SKIP() << "backend " << b.name << " unavailable: " << why;
  }
  const OpsBackend& backend() const { return ops_backends()[GetParam().backend]; }
  const PQCase& pq_case() const { return kCases[GetParam().case_index]; }
};

TEST_P(PQParity, EncodeChoosesNearestAndMatchesReference) {
  const PQCase& c = pq_case();
  const Data D = make_data(c, 1000 + uint32_t(GetParam().case_index));
  const int64_t total = c.n * c.n_sub;
  std::vector<uint16_t> got(size_t(total), 0xFFFF), want(size_t(total), 0xFFFF);
  backend().pq_encode(D.s, D.x.data(), D.books.data(), got.data());
  ref::pq_encode(D.s, D.x.data(), D.books.data(), want.data());
  const int d = c.sub_dim, k = c.n_centroids;
  int64_t agree = 0, bad = 0;
  for (int64_t t = 0; t < total; ++t) {
    ASSERT_LT(got[t], k) << "sub-vector " << t;
    const float* xv = D.x.data() + t * d;
    const float* book = D.books.data() + (c.per_subspace ? (t % c.n_sub) * k * d : 0);
    double best = std::numeric_limits<double>::infinity();
    int best_c = 0;
    for (int j = 0; j < k; ++j) {
      const double v = sqdist(xv, book + int64_t(j) * d, d);
      if (v < best) best = v, best_c = j;
    }
    const double chosen = sqdist(xv, book + int64_t(got[t]) * d, d);
    // fp32 rounding of either distance form: a few eps per element of |x|^2 + |c|^2.
    const double tol = 4.0 * (d + 2) * FLT_EPSILON *
                       (sqnorm(xv, d) + sqnorm(book + int64_t(got[t]) * d, d) + sqnorm(book + int64_t(best_c) * d, d));
    if (chosen - best > tol && ++bad <= 5)
      ADD_FAILURE() << "sub-vector " << t << ": chose " << got[t] << " at " << chosen << ", nearest " << best_c
                    << " at " << best << " (tol " << tol << ")";
    agree += got[t] == want[t];
  }
  EXPECT_EQ(bad, 0);
  EXPECT_GE(double(agree), 0.99 * double(total)) << "codes agree with ref on " << agree << " of " << total;
  const double mse_got = recon_mse(D, got), mse_ref = recon_mse(D, want);
  EXPECT_LE(std::fabs(mse_got - mse_ref), 1e-6 * mse_ref + 1e-30) << "MSE " << mse_got << " vs ref " << mse_ref;
}

TEST_P(PQParity, DecodeMatchesReferenceExactly) {
  const PQCase& c = pq_case();
  const Data D = make_data(c, 2000 + uint32_t(GetParam().case_index));
  const int64_t total = c.n * c.n_sub;
  std::mt19937 rng(5);
  std::vector<uint16_t> codes(static_cast<size_t>(total));
  for (auto& v : codes) v = uint16_t(rng() % uint32_t(c.n_centroids));
  std::vector<float> got(D.x.size(), -7.f), want(D.x.size(), 7.f);
  backend().pq_decode(D.s, codes.data(), D.books.data(), got.data());
  ref::pq_decode(D.s, codes.data(), D.books.data(), want.data());
  EXPECT_EQ(got, want);
}

std::vector<Param> all_params() {
  std::vector<Param> out;
  for (size_t b = 0; b < ops_backends().size(); ++b)
    for (size_t i = 0; i < std::size(kCases); ++i) out.push_back({b, i});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, PQParity, ::testing::ValuesIn(all_params()),
                         [](const ::testing::TestParamInfo<Param>& p) {
                           return ops_backends()[p.param.backend].name + "_" + kCases[p.param.case_index].name;
                         });

// Contract cases that hold for every backend.
class PQContract : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override {
    const std::string why = ops_backends()[GetParam()].unavailable();
    if (!why.empty()) GTEST_SKIP() << "backend " << ops_backends()[GetParam()].name << " unavailable: " << why;
  }
  const OpsBackend& backend() const { return ops_backends()[GetParam()]; }
};

TEST_P(PQContract, NonFiniteSubVectorsGetCodeZero) {
  // Documented behaviour: a sub-vector with NaN, or whose distances are all infinite, gets code 0;
  // the other sub-vectors of the row are unaffected.
  const PQCase c{"nan", 3, 4, 4, 64, false};
  Data D = make_data(c, 77);
  std::vector<uint16_t> clean(12), got(12, 0xFFFF);
  ref::pq_encode(D.s, D.x.data(), D.books.data(), clean.data());
  D.x[1 * 4 + 2] = std::numeric_limits<float>::quiet_NaN();  // sub-vector 1
  D.x[6 * 4 + 0] = std::numeric_limits<float>::infinity();   // sub-vector 6
  backend().pq_encode(D.s, D.x.data(), D.books.data(), got.data());
  for (int t = 0; t < 12; ++t) EXPECT_EQ(got[t], (t == 1 || t == 6) ? 0 : clean[t]) << "sub-vector " << t;
}

TEST_P(PQContract, EmptyInputAndBadShapes) {
  std::vector<float> books(64 * 4, 0.f), x(8, 0.f), out(8, 0.f);
  uint16_t code = 0xABCD;
  backend().pq_encode(PQShape{0, 2, 4, 64, false}, x.data(), books.data(), &code);
  EXPECT_EQ(code, 0xABCD);  // n = 0 writes nothing
  EXPECT_THROW(backend().pq_encode(PQShape{1, 0, 4, 64, false}, x.data(), books.data(), &code), Error);
  EXPECT_THROW(backend().pq_encode(PQShape{1, 2, 0, 64, false}, x.data(), books.data(), &code), Error);
  EXPECT_THROW(backend().pq_encode(PQShape{1, 2, 4, 0, false}, x.data(), books.data(), &code), Error);
  EXPECT_THROW(backend().pq_encode(PQShape{-1, 2, 4, 64, false}, x.data(), books.data(), &code), Error);
  const uint16_t codes[2] = {3, 64};  // 64 is out of range for 64 centroids
  try {
    backend().pq_decode(PQShape{1, 2, 4, 64, false}, codes, books.data(), out.data());
    FAIL() << "out-of-range code accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  }
}

std::vector<size_t> backend_indices() {
  std::vector<size_t> out;
  for (size_t b = 0; b < ops_backends().size(); ++b) out.push_back(b);
  return out;
}

INSTANTIATE_TEST_SUITE_P(Backends, PQContract, ::testing::ValuesIn(backend_indices()),
                         [](const ::testing::TestParamInfo<size_t>& p) { return ops_backends()[p.param].name; });

TEST(PQParityRegistry, CpuBackendIsRegistered) {
  bool found = false;
  for (const auto& b : ops_backends()) found = found || b.name == "cpu";
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace vq::test
