// One implementation of each scalar block format: the weight encoders and decoders and the int8
// activation quantizer of the weight products (every compiled SIMD target and the portable
// scalar kernel) give exactly what codec/scalar_blocks gives, ties included.
#include <gtest/gtest.h>

#include <hwy/highway.h>
#include <hwy/targets.h>

#include <cstring>
#include <random>
#include <vector>

#include "codec/scalar_blocks.h"
#include "model/matmul_kernels.h"
#include "model/weight_formats.h"

namespace {

using vq::GGMLType;

// Rows of activations with many exact ties: values k + 0.5 (times the block's step) that round
// half away from zero under the q8_0 rule and half to even under a plain NearestInt.
std::vector<float> activation_rows(int64_t M, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  std::vector<float> x(size_t(M * cols));
  for (size_t i = 0; i < x.size(); ++i) {
    if (i % 32 == 0) x[i] = 127.0f;  // step 1 in every block
    else if (i % 3 == 0) x[i] = float(int(rng() % 200) - 100) + 0.5f;
    else x[i] = nd(rng);
  }
  return x;
}

TEST(BlockRounding, ActivationQuantizerMatchesTheSharedQ8RuleOnEveryTarget) {
  const int64_t M = 3, cols = 256, nb = cols / 32;
  const auto x = activation_rows(M, cols, 4);
  // Reference: the shared block quantizer, block by block.
  std::vector<int8_t> q_ref(x.size());
  std::vector<float> d_ref(size_t(M * nb));
  for (int64_t b = 0; b < M * nb; ++b) d_ref[size_t(b)] = vq::quantize_int8_block(&x[size_t(b) * 32], &q_ref[size_t(b) * 32]);
  int ties = 0;
  for (size_t i = 0; i < x.size(); ++i) ties += x[i] - float(int(x[i])) == 0.5f || x[i] - float(int(x[i])) == -0.5f;
  ASSERT_GT(ties, 100);
  auto check = [&](const char* who) {
    std::vector<int8_t> q(x.size());
    std::vector<float> d(size_t(M * nb)), s(size_t(M * nb));
    if (std::strcmp(who, "scalar") == 0) vq::quantize_rows_scalar(x.data(), M, cols, q.data(), d.data(), s.data());
    else vq::quantize_rows_kernel(x.data(), M, cols, q.data(), d.data(), s.data());
    EXPECT_EQ(q, q_ref) << who;
    EXPECT_EQ(d, d_ref) << who;
    for (int64_t b = 0; b < M * nb; ++b) {
      int sum = 0;
      for (int i = 0; i < 32; ++i) sum += q_ref[size_t(b * 32 + i)];
      EXPECT_EQ(s[size_t(b)], d_ref[size_t(b)] * float(sum)) << who << " block " << b;
    }
  };
  check("scalar");
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    check(hwy::TargetName(target));
  }
  hwy::SetSupportedTargetsForTest(0);
}

TEST(BlockRounding, WeightFormatsAreTheSharedBlockFunctions) {
  struct F {
    GGMLType t;
    void (*enc)(const float*, uint8_t*);
    void (*dec)(const uint8_t*, float*);
  };
  const F formats[] = {{GGMLType::Q8_0, vq::quantize_q8_0, vq::dequantize_q8_0},
                       {GGMLType::Q4_0, vq::quantize_q4_0, vq::dequantize_q4_0},
                       {GGMLType::Q4_1, vq::quantize_q4_1, vq::dequantize_q4_1},
                       {GGMLType::Q5_0, vq::quantize_q5_0, vq::dequantize_q5_0},
                       {GGMLType::Q5_1, vq::quantize_q5_1, vq::dequantize_q5_1}};
  const int64_t n = 32 * 16;
  const auto x = activation_rows(1, n, 9);
  for (const F& f : formats) {
    const size_t bb = vq::ggml_block_bytes(f.t);
    std::vector<uint8_t> row(vq::ggml_row_bytes(f.t, n)), blocks(row.size());
    vq::quantize_row(f.t, x.data(), row.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) f.enc(&x[size_t(b) * 32], &blocks[size_t(b) * bb]);
    EXPECT_EQ(row, blocks) << vq::ggml_type_name(f.t);
    std::vector<float> y(static_cast<size_t>(n)), y_blocks(static_cast<size_t>(n));
    vq::dequantize_row(f.t, row.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) f.dec(&row[size_t(b) * bb], &y_blocks[size_t(b) * 32]);
    EXPECT_EQ(y, y_blocks) << vq::ggml_type_name(f.t);
  }
}

}  // namespace
