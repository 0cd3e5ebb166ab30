#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/bitpack.h"
#include "codec/product_quantizer.h"
#include "core/error.h"

namespace vq {
namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  return x;
}

double mse(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i] - b[i]) * (a[i] - b[i]);
  return s / double(a.size());
}

TEST(ProductQuantizer, TrainEncodeDecode) {
  const int dim = 32, n = 3000;
  const auto x = gaussian(size_t(n) * dim, 1);
  for (Granularity g : {Granularity::shared, Granularity::per_subspace})
    for (CodecParams p : {CodecParams{4, 6}, CodecParams{8, 8}, CodecParams{2, 4}}) {
      ProductQuantizer pq(dim, p, g);
      KMeansParams kp;
      kp.max_iters = 10;
      pq.train(x.data(), n, kp);
      ASSERT_TRUE(pq.trained());
      EXPECT_EQ(pq.code_size(), packed_row_bytes(dim / p.sub_dim, p.bits));
      std::vector<uint8_t> packed(pq.code_size() * n);
      pq.encode(x.data(), n, packed.data());
      std::vector<float> y(x.size());
      pq.decode(packed.data(), n, y.data());
      // Unpacked path agrees with the packed one.
      std::vector<uint16_t> codes(size_t(n) * pq.n_sub());
      pq.encode_codes(x.data(), n, codes.data());
      std::vector<float> y2(x.size());
      pq.decode_codes(codes.data(), n, y2.data());
      EXPECT_EQ(y, y2);
      const double e = mse(x, y);
      // Quantization error is well below the data variance (1) and shrinks with bits/element.
      EXPECT_LT(e, 0.8) << p.sub_dim << "b" << p.bits;
      EXPECT_GT(e, 0.0);
    }
}

TEST(ProductQuantizer, BadInput) {
  EXPECT_THROW(ProductQuantizer(30, CodecParams{4, 8}, Granularity::shared), Error);   // 30 % 4
  EXPECT_THROW(ProductQuantizer(32, CodecParams{3, 8}, Granularity::shared), Error);   // sub_dim 3
  EXPECT_THROW(ProductQuantizer(32, CodecParams{4, 3}, Granularity::shared), Error);   // bits 3
  EXPECT_THROW(ProductQuantizer(32, CodecParams{4, 13}, Granularity::shared), Error);  // bits 13
  EXPECT_THROW(ProductQuantizer(32, CodecParams{4, 8}, Granularity::shared, std::vector<float>(5)), Error);
  ProductQuantizer pq(16, CodecParams{4, 4}, Granularity::shared);
  std::vector<float> x = gaussian(16 * 10, 2);
  std::vector<uint8_t> out(pq.code_size() * 10);
  EXPECT_THROW(pq.encode(x.data(), 10, out.data()), Error);  // not trained
  EXPECT_THROW(pq.train(x.data(), 0), Error);               // empty input
  EXPECT_THROW(pq.train(x.data(), 3), Error);               // 12 sub-vectors < 16 centroids
  pq.train(x.data(), 10);
  x[17] = std::numeric_limits<float>::quiet_NaN();
  try {
    pq.encode(x.data(), 10, out.data());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("x[1][1]"), std::string::npos) << e.what();
  }
  x[17] = -std::numeric_limits<float>::infinity();
  EXPECT_THROW(pq.encode(x.data(), 10, out.data()), Error);
  EXPECT_THROW(pq.train(x.data(), 10), Error);
}

}  // namespace
}  // namespace vq
