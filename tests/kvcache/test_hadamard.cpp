// q4_0h (Hadamard-rotated q4_0): the cache computes exactly attention over the keys/values that its
// codes decode to (rotate, q4_0 round trip, rotate back), its error on random data is q4_0's, and on
// keys with outlier channels (as real keys have) the rotation removes most of q4_0's error.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <vector>

#include "codec/key_transform.h"
#include "codec/scalar_blocks.h"
#include "core/error.h"
#include "kvcache/factory.h"
#include "kvcache/pooled_cache.h"
#include "ops/ref/attention.h"
#include "test_util.h"

using namespace vq;

namespace {

constexpr int HQ = 8, H = 2;

// What the cache's codes decode to: each row rotated, q4_0 round trip, rotated back. x: [n, H, D].
std::vector<float> decoded(const std::vector<float>& x, int D) {
  std::vector<float> y(x);
  std::vector<uint8_t> b(18);
  for (size_t r = 0; r < y.size() / size_t(D); ++r) {
    float* row = y.data() + r * size_t(D);
    fwht_inplace(row, D);
    for (int j = 0; j < D / 32; ++j) {
      quantize_q4_0(row + j * 32, b.data());
      dequantize_q4_0(b.data(), row + j * 32);
    }
    fwht_inplace(row, D);
  }
  return y;
}

struct Outputs {
  std::vector<float> out, exact, on_decoded;
};

// Appends k, v ([n, H, D]) in chunks, attends with nq queries (at most the last chunk's tokens: older
// queries' windows are gone); exact: ref attention on k, v;
// on_decoded: ref attention on what the q4_0h codes decode to.
Outputs run(const char* spec, const std::vector<float>& k, const std::vector<float>& v, int n, int D, int chunk,
            std::mt19937& rng, int nq = 3, float q_sigma = 0.3f) {
  auto cache = make_kv_cache_factory(parse_kv_cache_spec(spec))(0, KVGeometry{HQ, H, D});
  nq = std::min(nq, n % chunk == 0 ? chunk : n % chunk);
  for (int done = 0; done < n; done += chunk) {
    const int m = std::min(chunk, n - done);
    cache->append(k.data() + size_t(done) * H * D, v.data() + size_t(done) * H * D, m);
  }
  const auto q = randn(size_t(nq) * HQ * D, rng, q_sigma);
  Outputs r;
  r.out.resize(q.size());
  r.exact.resize(q.size());
  r.on_decoded.resize(q.size());
  const float scale = 1.0f / std::sqrt(float(D));
  cache->attend(q.data(), nq, scale, r.out.data());
  ref::attention(q.data(), nq, k.data(), v.data(), n, HQ, H, D, scale, r.exact.data());
  const auto kd = decoded(k, D), vd = decoded(v, D);
  ref::attention(q.data(), nq, kd.data(), vd.data(), n, HQ, H, D, scale, r.on_decoded.data());
  return r;
}

}  // namespace

TEST(HadamardQ4, EqualsAttentionOverItsDecodedRows) {
  // Only float rounding separates the cache from attention over its decoded rows (measured NMSE
  // ~1e-13); a rotation left out on either side (queries, keys, values or the output) gives ~1.
  std::mt19937 rng(5);
  for (int D : {64, 128, 96}) {
    for (int chunk : {1, 37, 500}) {
      const int n = 300;
      const auto k = randn(size_t(n) * H * D, rng), v = randn(size_t(n) * H * D, rng);
      const Outputs r = run("q4_0h", k, v, n, D, chunk, rng);
      EXPECT_LT(nmse(r.out, r.on_decoded), 1e-9) << "D " << D << " chunk " << chunk;
    }
  }
}

TEST(HadamardQ4, RandomDataErrorIsQ4_0s) {
  // Gaussian rows have no outliers: rotating them changes nothing in distribution, so q4_0h and
  // q4_0 err alike (measured ~1e-2 each, within 30% of each other over these draws).
  std::mt19937 rng(6);
  const int n = 400, D = 64;
  const auto k = randn(size_t(n) * H * D, rng), v = randn(size_t(n) * H * D, rng);
  std::mt19937 rq1(7), rq2(7);
  const Outputs rot = run("q4_0h", k, v, n, D, 64, rq1), plain = run("q4_0", k, v, n, D, 64, rq2);
  const double eh = nmse(rot.out, rot.exact), ep = nmse(plain.out, plain.exact);
  std::printf("[ q4_0h ] random data: NMSE %.5f (q4_0 %.5f)\n", eh, ep);
  EXPECT_LT(eh, 0.05);
  EXPECT_LT(eh, 1.5 * ep);
  EXPECT_GT(eh, ep / 1.5);
}

TEST(HadamardQ4, RotationRemovesOutlierChannelError) {
  // Real keys carry a few channels 10-50x larger than the rest (docs/BENCHMARKS.md): q4_0's scale
  // per 32 elements then follows the outlier and rounds every other channel of its block to a
  // few levels. After the rotation every block shares the outlier's energy evenly.
  std::mt19937 rng(8);
  const int n = 400, D = 64;
  auto k = randn(size_t(n) * H * D, rng);
  const auto v = randn(size_t(n) * H * D, rng);
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < H; ++h) {
      float* row = k.data() + (size_t(t) * H + size_t(h)) * D;
      row[3] += 20.0f;  // two outlier channels with a large constant part, as in real keys
      row[40] -= 15.0f;
    }
  // Queries of unit scale: scores spread by ~1, so the keys' error moves the softmax.
  std::mt19937 rq1(9), rq2(9);
  const Outputs rot = run("q4_0h", k, v, n, D, 64, rq1, 4, 1.0f), plain = run("q4_0", k, v, n, D, 64, rq2, 4, 1.0f);
  const double eh = nmse(rot.out, rot.exact), ep = nmse(plain.out, plain.exact);
  std::printf("[ q4_0h ] keys with outlier channels: NMSE %.5f, q4_0 %.5f\n", eh, ep);
  EXPECT_LT(eh, ep / 3);
}

TEST(HadamardQ4, SpecBytesAndGeometry) {
  const KVCacheConfig c = parse_kv_cache_spec("Q4_0H");
  EXPECT_EQ(c.method, KVMethod::q4_0h);
  EXPECT_EQ(c.name(), "q4_0h");
  EXPECT_DOUBLE_EQ(c.nominal_bits_per_element(), 4.5);
  auto cp = make_kv_cache_factory(c)(0, KVGeometry{9, 3, 64});
  std::vector<float> x(size_t(300) * 3 * 64, 0.25f);
  cp->append(x.data(), x.data(), 300);
  auto& pc = static_cast<PooledCache&>(*cp);
  // direct: every token coded, as q4_0's 18-byte blocks (K and V, 2 blocks per 64-element row)
  EXPECT_EQ(pc.coded_tokens(), 300);
  EXPECT_EQ(pc.token_bytes(), size_t(300) * 3 * 2 * 2 * 18);
  EXPECT_THROW(make_kv_cache_factory(parse_kv_cache_spec("q4_0h"))(0, KVGeometry{2, 1, 48}), Error);
}
