// The learned key transform (codec/learned_key_map.h): exact scores, the score error it is built to
// lower, and clear refusals of what cannot be a map.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "codec/key_transform.h"
#include "codec/learned_key_map.h"
#include "codec/product_quantizer.h"
#include "core/error.h"

namespace vq {
namespace {

constexpr int kD = 32;

// Keys of a low-rank structure with channels of very different scales and a large offset (what
// real keys look like: docs/QUALITY.md), queries whose energy sits elsewhere. rows: [n, kD].
struct Data {
  std::vector<float> k, q;
};
Data make_data(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd;
  const int r = 6;
  std::vector<float> lk(size_t(kD) * r), lq(size_t(kD) * kD), off(kD);
  std::mt19937_64 fixed(77);  // the same "model" for every draw: only the tokens differ with seed
  for (auto& x : lk) x = nd(fixed);
  for (int c = 0; c < kD; ++c) {
    off[size_t(c)] = c % 5 == 0 ? 20.0f * nd(fixed) : 0.0f;
    for (int j = 0; j < kD; ++j) lq[size_t(c) * kD + j] = nd(fixed) * (c < kD / 2 ? 0.2f : 2.0f);
  }
  Data d;
  d.k.resize(size_t(n) * kD);
  d.q.resize(size_t(n) * kD);
  std::vector<float> z(r), w(kD);
  for (int t = 0; t < n; ++t) {
    for (auto& x : z) x = nd(rng);
    for (auto& x : w) x = nd(rng);
    for (int c = 0; c < kD; ++c) {
      float s = off[size_t(c)] + 0.05f * nd(rng) * float(1 + c % 7);
      for (int j = 0; j < r; ++j) s += lk[size_t(c) * r + j] * z[size_t(j)] * (c % 3 == 0 ? 4.0f : 1.0f);
      d.k[size_t(t) * kD + c] = s;
      float u = 0;
      for (int j = 0; j < kD; ++j) u += lq[size_t(c) * kD + j] * w[size_t(j)];
      d.q[size_t(t) * kD + c] = u;
    }
  }
  return d;
}

std::vector<double> second_moment(const std::vector<float>& x, int n) {
  std::vector<double> s(size_t(kD) * kD, 0.0);
  add_second_moment(x.data(), n, kD, kD, s.data());
  for (auto& v : s) v /= n;
  return s;
}

TEST(LearnedKeyMap, QueriesThroughTheInverseTransposeKeepEveryScore) {
  const Data d = make_data(2000, 1);
  const std::vector<float> M = learned_key_map(covariance_of_rows(d.k.data(), 2000, kD), second_moment(d.q, 2000), kD, 4);
  const std::vector<float> N = key_map_query_side(M.data(), kD, "test");
  std::vector<float> k(d.k.begin(), d.k.begin() + 50 * kD), q(d.q.begin(), d.q.begin() + 50 * kD);
  apply_key_map(M.data(), k.data(), 50, kD, kD);
  apply_key_map(N.data(), q.data(), 50, kD, kD);
  for (int i = 0; i < 50; ++i)
    for (int j = 0; j < 50; ++j) {
      double exact = 0, mapped = 0, scale = 0;
      for (int c = 0; c < kD; ++c) {
        exact += double(d.q[size_t(i) * kD + c]) * d.k[size_t(j) * kD + c];
        mapped += double(q[size_t(i) * kD + c]) * k[size_t(j) * kD + c];
        scale += std::fabs(double(d.q[size_t(i) * kD + c]) * d.k[size_t(j) * kD + c]);
      }
      ASSERT_NEAR(mapped, exact, 1e-4 * scale) << i << ", " << j;
    }
}

TEST(LearnedKeyMap, KeepsTheKeysEnergy) {
  const Data d = make_data(2000, 2);
  const std::vector<double> cov = covariance_of_rows(d.k.data(), 2000, kD);
  const std::vector<float> M = learned_key_map(cov, second_moment(d.q, 2000), kD, 4);
  double tr = 0, coded = 0;
  for (int c = 0; c < kD; ++c) tr += cov[size_t(c) * kD + c];
  for (int i = 0; i < kD; ++i)
    for (int a = 0; a < kD; ++a)
      for (int b = 0; b < kD; ++b) coded += double(M[size_t(i) * kD + a]) * cov[size_t(a) * kD + b] * M[size_t(i) * kD + b];
  EXPECT_NEAR(coded, tr, 1e-3 * tr);
}

// Mean squared score error of keys coded by a product quantizer trained on the training half, in
// the space a transform puts them, over held-out keys and queries.
template <class KeyT, class QueryT>
double score_error(const Data& train, const Data& test, int n, KeyT to_coded, QueryT query_side) {
  std::vector<float> x = train.k;
  to_coded(x.data(), n);
  ProductQuantizer pq(kD, CodecParams{4, 6}, Granularity::per_subspace);
  KMeansParams kp;
  kp.seed = 5;
  pq.train(x.data(), n, kp);
  std::vector<float> kt = test.k, qt = test.q, dec(size_t(n) * kD);
  to_coded(kt.data(), n);
  query_side(qt.data(), n);
  std::vector<uint8_t> codes(size_t(n) * pq.code_size());
  pq.encode(kt.data(), n, codes.data());
  pq.decode(codes.data(), n, dec.data());
  double err = 0;
  for (int i = 0; i < n; i += 7)
    for (int j = 0; j < n; j += 5) {
      double e = 0;
      for (int c = 0; c < kD; ++c) e += double(qt[size_t(i) * kD + c]) * (kt[size_t(j) * kD + c] - dec[size_t(j) * kD + c]);
      err += e * e;
    }
  return err;
}

// What the map is for: at the same bits, a lower score error than the query-aware smoothing + the
// Walsh-Hadamard rotation on keys of a low-rank, unevenly scaled structure.
TEST(LearnedKeyMap, LowersTheScoreErrorOfProductCodesAgainstSmoothingAndHadamard) {
  const int n = 4000;
  const Data train = make_data(n, 3), test = make_data(n, 4);
  const std::vector<double> cov = covariance_of_rows(train.k.data(), n, kD), qm = second_moment(train.q, n);
  std::vector<double> var(kD), qe(kD);
  for (int c = 0; c < kD; ++c) var[size_t(c)] = cov[size_t(c) * kD + c], qe[size_t(c)] = qm[size_t(c) * kD + c];
  const std::vector<float> lambda = smoothing_from_energy(var, qe, 1, kD);
  const double had = score_error(
      train, test, n, [&](float* k, int m) { transform_keys(k, m, 1, kD, lambda.data()); },
      [&](float* q, int m) { transform_queries(q, m, 1, 1, kD, lambda.data()); });
  const std::vector<float> M = learned_key_map(cov, qm, kD, 4), N = key_map_query_side(M.data(), kD, "test");
  const std::vector<float> ones(kD, 1.0f);
  const double learned = score_error(
      train, test, n, [&](float* k, int m) { transform_keys_mapped(k, m, 1, kD, ones.data(), M.data()); },
      [&](float* q, int m) { transform_queries_mapped(q, m, 1, 1, kD, ones.data(), N.data()); });
  EXPECT_LT(learned, 0.7 * had) << "learned " << learned << " vs smoothing + Hadamard " << had;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one naming '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(LearnedKeyMap, RefusesWhatCannotBeAMap) {
  const Data d = make_data(500, 6);
  std::vector<double> cov = covariance_of_rows(d.k.data(), 500, kD), qm = second_moment(d.q, 500);
  expect_error([&] { (void)learned_key_map(cov, qm, kD, 3); }, "sub_dim 3 does not divide head_dim 32");
  expect_error([&] { (void)learned_key_map(std::vector<double>(10), qm, kD, 4); }, "key covariance has 10 values");
  auto bad = cov;
  bad[3] = std::nan("");
  expect_error([&] { (void)learned_key_map(bad, qm, kD, 4); }, "key covariance[0, 3] is nan");
  bad = qm;
  bad[1] += 1.0;
  expect_error([&] { (void)learned_key_map(cov, bad, kD, 4); }, "query second moment is not symmetric");
  expect_error([&] { (void)learned_key_map(std::vector<double>(size_t(kD) * kD, 0.0), qm, kD, 4); }, "all zero");
  // A map with a zero row is singular; a NaN is named.
  std::vector<float> M = learned_key_map(cov, qm, kD, 4);
  auto z = M;
  for (int j = 0; j < kD; ++j) z[size_t(5) * kD + j] = 0.0f;
  expect_error([&] { (void)key_map_query_side(z.data(), kD, "layer 1 KV head 0"); }, "layer 1 KV head 0: the key map is singular");
  z = M;
  z[7] = std::nanf("");
  expect_error([&] { (void)key_map_query_side(z.data(), kD, "here"); }, "here: key map entry [0, 7] is nan");
}

}  // namespace
}  // namespace vq
