// q8_0 / q4_0 / KIVI caches against the fp32 reference attention on random data, block
// formats, residual flushes and bytes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "core/error.h"
#include "kvcache/factory.h"
#include "codec/scalar_blocks.h"
#include "kvcache/pooled_cache.h"
#include "ops/ref/attention.h"
#include "test_util.h"

using namespace vq;

namespace {
double attention_nmse(const char* spec, int n, int nq, int chunk, std::mt19937& rng, KVCache** keep = nullptr) {
  const int HQ = 9, H = 3, D = 64;
  auto cache = make_kv_cache_factory(parse_kv_cache_spec(spec))(0, KVGeometry{HQ, H, D});
  auto k = randn(size_t(n) * H * D, rng), v = randn(size_t(n) * H * D, rng);
  for (int done = 0; done < n; done += chunk) {
    const int m = std::min(chunk, n - done);
    cache->append(k.data() + size_t(done) * H * D, v.data() + size_t(done) * H * D, m);
  }
  auto q = randn(size_t(nq) * HQ * D, rng, 0.5f);
  std::vector<float> out(q.size()), ref_out(q.size());
  cache->attend(q.data(), nq, 0.125f, out.data());
  ref::attention(q.data(), nq, k.data(), v.data(), n, HQ, H, D, 0.125f, ref_out.data());
  (void)keep;
  return nmse(out, ref_out);
}
}  // namespace

TEST(BlockFormats, RoundTripErrorWithinHalfStep) {
  std::mt19937 rng(1);
  auto x = randn(32, rng);
  uint8_t b[34];
  float y[32];
  quantize_q8_0(x.data(), b);
  dequantize_q8_0(b, y);
  float amax = 0;
  for (float e : x) amax = std::max(amax, std::fabs(e));
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(x[i] - y[i]), amax / 127.0f * 0.51f + 1e-3f);
  quantize_q4_0(x.data(), b);
  dequantize_q4_0(b, y);
  for (int i = 0; i < 32; ++i) EXPECT_LE(std::fabs(x[i] - y[i]), amax / 8.0f * 0.51f + 1e-2f);
}

TEST(ScalarCaches, AgreeWithReferenceOnRandomData) {
  // Thresholds ~5x the measured NMSE, which follows the quantization step on N(0,1) data:
  // q8_0 step amax/127 ~ 0.02 (measured 4e-5); q4_0 step amax/8 ~ 0.3 (1e-2); kivi4 step
  // (max-min)/15 ~ 0.35 per group of 32 (5e-3 to 9e-3); kivi2 step (max-min)/3 ~ 1.7 (0.18).
  // A broken code path gives NMSE ~1 or more.
  std::mt19937 rng(2);
  const std::pair<const char*, double> cases[] = {
      {"q8_0", 2e-4}, {"q4_0", 0.05}, {"kivi4", 0.05}, {"kivi2", 0.6}, {"kivi2,r=0", 0.6}, {"kivi4,g=64,r=32", 0.05}};
  for (auto [spec, lim] : cases) {
    const double e = attention_nmse(spec, 900, 3, 100, rng);
    std::printf("[ %s ] attention NMSE vs fp32 on random data: %.5f\n", spec, e);
    EXPECT_LT(e, lim) << spec;
  }
}

TEST(Kivi, FlushBoundariesAndExactWindow) {
  std::mt19937 rng(3);
  const int R = 40, G = 32;
  for (int n : {1, R - 1, R, R + 1, R + G - 1, R + G, R + G + 1, 300}) {
    for (int step : {1, 13, 1000}) {
      const std::string spec = "kivi4,r=" + std::to_string(R);
      const double e = attention_nmse(spec.c_str(), n, 1, step, rng);
      if (n <= R) EXPECT_LT(e, 1e-5) << "all tokens in the fp16 window, n=" << n;
      else EXPECT_LT(e, 0.05) << n;
      auto cp = make_kv_cache_factory(parse_kv_cache_spec(spec))(0, KVGeometry{4, 2, 64});
      auto& c = static_cast<PooledCache&>(*cp);
      std::vector<float> x(size_t(n) * 2 * 64, 0.5f);
      for (int done = 0; done < n; done += step) c.append(x.data(), x.data(), std::min(step, n - done));
      EXPECT_EQ(c.coded_tokens() % G, 0);
      // codes for every whole block that leaves the R-token window; fp16 blocks for the window
      // and the last chunk (its first queries read them; the next append releases them)
      EXPECT_EQ(c.coded_tokens(), std::max(0, (n - R) / G * G));
      const int last = n % step == 0 ? std::min(step, n) : n % step;
      EXPECT_LE(c.dense_block_tokens(), last + R + 2 * G);
      EXPECT_EQ(c.size(), n);
    }
  }
}

TEST(ScalarCaches, BytesAreAllocatedBytes) {
  auto c = make_kv_cache_factory(parse_kv_cache_spec("q8_0"))(0, KVGeometry{9, 3, 64});
  std::vector<float> x(size_t(300) * 3 * 64, 1.0f);
  c->append(x.data(), x.data(), 300);
  // 10 pool blocks of 32 tokens x 3 heads x (K, V) x 2 q8_0 blocks x 34 bytes
  EXPECT_EQ(c->bytes(), size_t(10) * 32 * 3 * 2 * 2 * 34);
  EXPECT_NEAR(c->bits_per_element(), 8.5 * 320.0 / 300.0, 1e-9);
  EXPECT_EQ(static_cast<PooledCache&>(*c).token_bytes(), size_t(300) * 3 * 2 * 2 * 34);
  EXPECT_THROW(make_kv_cache_factory(parse_kv_cache_spec("q4_0"))(0, KVGeometry{2, 1, 48}), Error);
}
