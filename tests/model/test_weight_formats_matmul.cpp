// The fast products (int8 activations, SIMD, threads) against dequantize-then-fp64 products.
//
// Tolerance. The quantized kernels first round each block of 32 activations to
// x ~= d_b * q (d_b = max|x_b| / 127, q integer), so |x_i - d_b q_i| <= d_b / 2 and
//   |y - y_exact| <= sum_b (d_b / 2) * sum_{i in b} |w_i|                         (1)
// On top of that, the kernel's float arithmetic (per-block scale products and the
// accumulation over blocks, all in fp32) adds at most a few ulps per term:
//   <= 1e-5 * sum_i |w_i x_i|  (a handful of fp32 roundings, 6e-8 each, over <= 64 blocks) (2)
// The integer block sums are exact. Check 1 uses (1) + (2) against the exact product; check 2
// rebuilds the quantized activations here (same rounding rule) and requires (2) alone, so any
// error beyond fp32 rounding in the integer path is caught.
#include <gtest/gtest.h>
// Same target set as model/matmul_kernels.cpp (which adds AVX3_DL for its VNNI kernels), so the
// loops over hwy::SupportedAndGeneratedTargets() below reach that target too.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"
#include "model/matmul_kernels.h"
#include "model/matmul_packed.h"
#include "model/weight_formats.h"

namespace {

using vq::GGMLType;

struct Case {
  int64_t rows, cols;
};

std::vector<float> random_x(int64_t n, uint64_t seed) {
  auto x = vq::test::random_weights(size_t(n), seed, 1.0f);
  x[0] = 0.0f;  // a block with a zero, and an all-zero block below
  for (int64_t i = 32; i < 64 && i < n; ++i) x[size_t(i)] = 0.0f;
  return x;
}

bool is_float(GGMLType t) { return t == GGMLType::F32 || t == GGMLType::F16 || t == GGMLType::BF16; }

// Checks y [M, rows] from the fast path against the two references described at the top.
void check_product(GGMLType t, const std::vector<uint8_t>& W, int64_t rows, int64_t cols, const std::vector<float>& x,
                   int64_t M, const std::vector<float>& y, const std::string& what) {
  const size_t rb = vq::ggml_row_bytes(t, cols);
  std::vector<float> w(static_cast<size_t>(cols));  // w: [cols] one decoded weight row
  int failures = 0;
  for (int64_t r = 0; r < rows && failures < 5; ++r) {
    vq::dequantize_row(t, W.data() + size_t(r) * rb, w.data(), cols);
    for (int64_t m = 0; m < M && failures < 5; ++m) {
      const float* xm = x.data() + m * cols;
      double exact = 0, exact_q = 0, mag = 0, act_bound = 0;
      for (int64_t b = 0; b < cols; b += 32) {
        float amax = 0;
        for (int64_t i = b; i < b + 32 && i < cols; ++i) amax = std::max(amax, std::fabs(xm[i]));
        const float d = amax / 127.0f, id = amax != 0.0f ? 127.0f / amax : 0.0f;
        double wsum = 0;
        for (int64_t i = b; i < b + 32 && i < cols; ++i) {
          exact += double(w[size_t(i)]) * xm[i];
          exact_q += double(w[size_t(i)]) * (double(d) * std::lrintf(xm[i] * id));
          mag += std::fabs(double(w[size_t(i)]) * xm[i]);
          wsum += std::fabs(double(w[size_t(i)]));
        }
        act_bound += double(d) / 2 * wsum;
      }
      const double got = y[size_t(m * rows + r)];
      const double fp_slack = 1e-5 * mag + 1e-30;
      if (is_float(t)) {
        if (std::fabs(got - exact) > fp_slack) ++failures;
        EXPECT_LE(std::fabs(got - exact), fp_slack) << what << " r=" << r << " m=" << m;
        continue;
      }
      const double err = std::fabs(got - exact), err_q = std::fabs(got - exact_q);
      if (err > act_bound + fp_slack || err_q > fp_slack) ++failures;
      EXPECT_LE(err, act_bound + fp_slack) << what << " r=" << r << " m=" << m << " exact=" << exact;
      EXPECT_LE(err_q, fp_slack) << what << " r=" << r << " m=" << m << " exact_q=" << exact_q;
    }
  }
}

std::vector<uint8_t> make_weights(GGMLType t, int64_t rows, int64_t cols, bool random_bits, uint64_t seed) {
  if (random_bits) {
    std::mt19937_64 rng(seed);
    return vq::test::random_blocks(t, rows * cols, rng);
  }
  const auto v = vq::test::random_weights(size_t(rows * cols), seed, 0.05f);
  const size_t rb = vq::ggml_row_bytes(t, cols);
  std::vector<uint8_t> W(rb * size_t(rows));  // W: [rows, rb] packed
  for (int64_t r = 0; r < rows; ++r) vq::quantize_row(t, v.data() + r * cols, W.data() + size_t(r) * rb, cols);
  return W;
}

TEST(WeightMatmul, EveryTypeShapeAndBatch) {
  const Case cases[] = {{1, 256}, {37, 512}, {70, 768}};
  for (GGMLType t : vq::test::supported_types()) {
    for (const auto& c : cases) {
      for (bool random_bits : {false, true}) {
        const auto W = make_weights(t, c.rows, c.cols, random_bits, uint64_t(c.rows * 31 + c.cols));
        for (int64_t M : {1, 2, 3, 4, 5, 9}) {
          const auto x = random_x(M * c.cols, uint64_t(M));
          std::vector<float> y(static_cast<size_t>(M * c.rows), -1.0f);
          vq::matmul(t, W.data(), c.rows, c.cols, x.data(), M, y.data());
          check_product(t, W, c.rows, c.cols, x, M, y,
                        vq::ggml_type_name(t) + (random_bits ? " random-bits " : " quantized ") +
                            std::to_string(c.rows) + "x" + std::to_string(c.cols) + " M=" + std::to_string(M));
        }
      }
    }
  }
}

TEST(WeightMatmul, FloatWeightsAnyColumnCount) {
  for (GGMLType t : {GGMLType::F32, GGMLType::F16, GGMLType::BF16}) {
    const int64_t rows = 19, cols = 45, M = 6;
    const auto W = make_weights(t, rows, cols, false, 5);
    const auto x = random_x(M * cols, 9);
    std::vector<float> y(static_cast<size_t>(M * rows));
    vq::matmul(t, W.data(), rows, cols, x.data(), M, y.data());
    check_product(t, W, rows, cols, x, M, y, vq::ggml_type_name(t) + " 19x45");
  }
}

TEST(WeightMatmul, ThreadCountDoesNotChangeResults) {
  const int64_t rows = 1536, cols = 576, M = 3;
  for (GGMLType t : {GGMLType::Q4_1, GGMLType::Q8_0, GGMLType::Q4_K, GGMLType::Q6_K, GGMLType::F16}) {
    const int64_t c = vq::ggml_block_elems(t) == 256 ? 512 : cols;
    const auto W = make_weights(t, rows, c, false, 3);
    const auto x = random_x(M * c, 4);
    std::vector<float> y1(static_cast<size_t>(M * rows)), y2(y1.size());
    vq::set_num_threads(1);
    vq::matmul(t, W.data(), rows, c, x.data(), M, y1.data());
    vq::set_num_threads(2);
    vq::matmul(t, W.data(), rows, c, x.data(), M, y2.data());
    EXPECT_EQ(y1, y2) << vq::ggml_type_name(t);  // each row is computed by one thread, same code
  }
}

// Activation row counts 1..17 (the multi-row kernels take 1..4 rows at a time: every remainder,
// and several full groups) and odd weight-row counts, on every compiled target, every type.
TEST(WeightMatmul, RowCounts1To17OnEveryTarget) {
  const int64_t rows = 13;
  for (GGMLType t : vq::test::supported_types()) {
    const int64_t cols = vq::ggml_block_elems(t) == 256 ? 768 : 96;  // 3 super-blocks / 3 blocks: a tail
    const auto W = make_weights(t, rows, cols, true, uint64_t(t) + 100);
    const auto x = random_x(17 * cols, 23);
    // The x86 SIMD targets (AVX2, AVX-512, AVX-512 VNNI) run the same integer sums and the same
    // float operations in the same order: their products must be bit-identical, so a model's
    // logits do not depend on which of them the CPU gets.
    std::vector<std::vector<float>> first_simd(18);  // [M] y of the first x86 SIMD target
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      const bool x86_simd = target == HWY_AVX2 || target == HWY_AVX3 || target == HWY_AVX3_DL;
      for (int64_t M = 1; M <= 17; ++M) {
        std::vector<float> y(static_cast<size_t>(M * rows), -1.0f);
        vq::matmul(t, W.data(), rows, cols, x.data(), M, y.data());
        const std::string what =
            vq::ggml_type_name(t) + " target " + hwy::TargetName(target) + " M=" + std::to_string(M);
        check_product(t, W, rows, cols, x, M, y, what);
        if (!x86_simd) continue;
        auto& ref = first_simd[size_t(M)];
        if (ref.empty())
          ref = y;
        else
          EXPECT_EQ(y, ref) << what << ": differs from another x86 SIMD target";
      }
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

// The dispatch really reaches a SIMD kernel on this machine: at least one compiled target
// besides the scalar ones (the x86 build compiles AVX2 and AVX-512, and AVX3_DL for VNNI).
TEST(WeightMatmul, SimdTargetsAreCompiled) {
  int simd = 0;
  for (int64_t target : hwy::SupportedAndGeneratedTargets())
    if (target != HWY_SCALAR && target != HWY_EMU128) ++simd;
#if HWY_ARCH_X86
  EXPECT_GE(simd, 1) << "no SIMD target compiled and supported";
#endif
  (void)simd;
}

// Every compiled SIMD target, and the portable scalar kernel, give the same products.
TEST(WeightMatmul, AllTargetsAndScalarAgree) {
  const int64_t rows = 40, cols = 512, M = 5;
  for (GGMLType t : vq::test::supported_types()) {
    const auto W = make_weights(t, rows, cols, true, 17);
    const auto x = random_x(M * cols, 2);
    vq::ActivationBuffer ab;
    const vq::QuantizedRows& X = ab.quantize(x.data(), M, cols);
    std::vector<float> ys(static_cast<size_t>(M * rows));
    const size_t rb = vq::ggml_row_bytes(t, cols);
    if (is_float(t))
      vq::float_rows_scalar(uint32_t(t), W.data(), rb, 0, rows, x.data(), M, cols, ys.data(), rows);
    else
      vq::quant_rows_scalar(uint32_t(t), W.data(), rb, 0, rows, X, ys.data(), rows);
    check_product(t, W, rows, cols, x, M, ys, vq::ggml_type_name(t) + " scalar kernel");
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      std::vector<float> y(static_cast<size_t>(M * rows));
      vq::matmul(t, W.data(), rows, cols, x.data(), M, y.data());
      check_product(t, W, rows, cols, x, M, y, vq::ggml_type_name(t) + " target " + hwy::TargetName(target));
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

TEST(WeightMatmul, ReusedActivationsMatchDirectCall) {
  const int64_t rows = 64, cols = 576, M = 2;
  const auto W = make_weights(GGMLType::Q4_1, rows, cols, false, 8);
  const auto x = random_x(M * cols, 1);
  vq::ActivationBuffer ab;
  const auto& X = ab.quantize(x.data(), M, cols);
  std::vector<float> y1(static_cast<size_t>(M * rows)), y2(y1.size());
  vq::matmul_q(GGMLType::Q4_1, W.data(), rows, cols, X, y1.data());
  vq::matmul(GGMLType::Q4_1, W.data(), rows, cols, x.data(), M, y2.data());
  EXPECT_EQ(y1, y2);
  EXPECT_THROW(vq::matmul_q(GGMLType::Q4_1, W.data(), rows, 512, X, y1.data()), vq::Error);  // cols mismatch
}

TEST(WeightMatmul, MultiMatchesSeparateProducts) {
  const int64_t cols = 512, M = 3;
  const GGMLType types[] = {GGMLType::Q4_1, GGMLType::Q8_0, GGMLType::F16, GGMLType::Q6_K};
  const int64_t rows[] = {64, 32, 48, 1};
  std::vector<std::vector<uint8_t>> W;
  std::vector<std::vector<float>> y_sep, y_multi;
  std::vector<vq::MatmulJob> jobs;
  const auto x = random_x(M * cols, 6);
  for (int j = 0; j < 4; ++j) {
    W.push_back(make_weights(types[j], rows[j], cols, false, uint64_t(j)));
    y_sep.emplace_back(size_t(M * rows[j]));
    y_multi.emplace_back(size_t(M * rows[j]));
    vq::matmul(types[j], W[size_t(j)].data(), rows[j], cols, x.data(), M, y_sep.back().data());
  }
  for (int j = 0; j < 4; ++j) jobs.push_back({types[j], W[size_t(j)].data(), rows[j], y_multi[size_t(j)].data()});
  vq::ActivationBuffer ab;
  vq::matmul_q_multi(jobs.data(), 4, cols, ab.quantize(x.data(), M, cols));
  for (int j = 0; j < 4; ++j) EXPECT_EQ(y_sep[size_t(j)], y_multi[size_t(j)]) << vq::ggml_type_name(types[j]);

  // The tensor-level form on a written file.
  vq::test::GGUFWriter w;
  for (int j = 0; j < 4; ++j) w.add_tensor("w" + std::to_string(j), {cols, rows[j]}, types[j], W[size_t(j)]);
  w.add_tensor("narrow", {256, 2}, GGMLType::Q4_K, make_weights(GGMLType::Q4_K, 2, 256, false, 9));
  const auto bytes = w.bytes();
  auto f = vq::GGUFFile::from_memory(bytes.data(), bytes.size(), "multi.gguf");
  std::vector<const vq::GGUFTensorInfo*> ws;
  std::vector<float*> ys;
  std::vector<std::vector<float>> y_t(4);
  for (int j = 0; j < 4; ++j) {
    ws.push_back(&f->tensor("w" + std::to_string(j)));
    y_t[size_t(j)].resize(size_t(M * rows[j]));
    ys.push_back(y_t[size_t(j)].data());
  }
  vq::matmul_multi(ws, x.data(), M, ys);
  for (int j = 0; j < 4; ++j) EXPECT_EQ(y_sep[size_t(j)], y_t[size_t(j)]) << vq::ggml_type_name(types[j]);
  ws.push_back(&f->tensor("narrow"));
  ys.push_back(ys[0]);
  EXPECT_THROW(vq::matmul_multi(ws, x.data(), M, ys), vq::Error);  // column counts differ
}

TEST(WeightMatmul, BadArgumentsThrow) {
  std::vector<uint8_t> W(4096);
  std::vector<float> x(512), y(512);
  try {
    vq::matmul(static_cast<GGMLType>(23), W.data(), 1, 256, x.data(), 1, y.data());  // IQ4_XS: not supported
    FAIL() << "no throw";
  } catch (const vq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq4_xs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(vq::matmul(static_cast<GGMLType>(77), W.data(), 1, 32, x.data(), 1, y.data()), vq::Error);
  EXPECT_THROW(vq::matmul(GGMLType::Q4_1, W.data(), 1, 48, x.data(), 1, y.data()), vq::Error);
  EXPECT_THROW(vq::matmul(GGMLType::Q4_K, W.data(), 1, 32, x.data(), 1, y.data()), vq::Error);
  vq::ActivationBuffer ab;
  EXPECT_THROW(ab.quantize(x.data(), 1, 40), vq::Error);
  // Empty products are no-ops.
  EXPECT_NO_THROW(vq::matmul(GGMLType::Q4_1, W.data(), 0, 32, x.data(), 1, y.data()));
  EXPECT_NO_THROW(vq::matmul(GGMLType::Q4_1, W.data(), 4, 32, x.data(), 0, y.data()));
}

}  // namespace

// ----- packed (row-interleaved) weights: model/matmul_packed.h

namespace {

// The packed product of W on every target, and the portable kernel, against the references of
// check_product, for rows that fill 8-row groups exactly, partly (padding) or not at all.
void check_packed(GGMLType t, int64_t rows, int64_t cols, bool random_bits, const std::vector<int64_t>& Ms) {
  const auto W = make_weights(t, rows, cols, random_bits, uint64_t(rows * 7 + cols));
  const vq::PackedWeight P = vq::pack_weight(t, W.data(), rows, cols);
  const int64_t maxM = *std::max_element(Ms.begin(), Ms.end());
  const auto x = random_x(maxM * cols, uint64_t(rows));
  for (int64_t M : Ms) {
    vq::ActivationBuffer ab;
    const vq::QuantizedRows& X = ab.quantize(x.data(), M, cols);
    const std::string shape = vq::ggml_type_name(t) + (random_bits ? " random-bits " : " quantized ") +
                              std::to_string(rows) + "x" + std::to_string(cols) + " M=" + std::to_string(M);
    std::vector<float> ys(static_cast<size_t>(M * rows), -1.0f);
    vq::packed_groups_scalar(P, 0, (rows + 7) / 8, X, ys.data(), rows);
    check_product(t, W, rows, cols, x, M, ys, shape + " packed scalar");
    for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
      hwy::SetSupportedTargetsForTest(target);
      std::vector<float> y(static_cast<size_t>(M * rows), -1.0f);
      vq::matmul_packed(P, X, y.data());
      check_product(t, W, rows, cols, x, M, y, shape + " packed target " + hwy::TargetName(target));
    }
    hwy::SetSupportedTargetsForTest(0);
  }
}

}  // namespace

// Every type with a packed layout.
const GGMLType kPackedTypes[] = {GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1, GGMLType::Q8_0,
                                 GGMLType::Q2_K, GGMLType::Q3_K, GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K,
                                 GGMLType::F32,  GGMLType::F16,  GGMLType::BF16};

// Every supported weight type has a packed layout (the forward packs all of them on first use).
TEST(PackedWeights, EverySupportedTypeIsPacked) {
  for (GGMLType t : vq::test::supported_types())
    EXPECT_NE(std::find(std::begin(kPackedTypes), std::end(kPackedTypes), t), std::end(kPackedTypes))
        << vq::ggml_type_name(t) << " has no packed layout";
}
// Columns with a tail: 9 blocks of 32 (one 256-column step and one block more) for the
// 32-element types, 2 super-blocks for the K-quants.
int64_t packed_test_cols(GGMLType t) { return vq::unit_cols(t) == 256 ? 512 : 288; }

// Activation rows 1..17 (one register tile for 1..4, the batched-decode column steps for 5..16,
// the prefill panels for 17) and 70 (two panels, a tile of 2 at the end), on every target.
TEST(PackedWeights, EveryTypeEveryTargetRowCounts) {
  std::vector<int64_t> Ms;
  for (int64_t M = 1; M <= 17; ++M) Ms.push_back(M);
  Ms.push_back(70);
  for (GGMLType t : kPackedTypes) check_packed(t, 13, packed_test_cols(t), true, Ms);  // groups of 8 and of 5
}

// A row's output depends neither on how many rows are multiplied with it (the decode tile, the
// batched column steps, the prefill panels), nor on the thread count, nor on the x86 target:
// the same sums in the same order. Checked bit for bit.
TEST(PackedWeights, RowResultIndependentOfBatchThreadsAndTarget) {
  const int64_t rows = 45;
  for (GGMLType t : kPackedTypes) {
    const int64_t cols = packed_test_cols(t);
    const auto W = make_weights(t, rows, cols, true, 77);
    const vq::PackedWeight P = vq::pack_weight(t, W.data(), rows, cols);
    const int64_t maxM = 70;
    const auto x = random_x(maxM * cols, 5);
    std::vector<float> ref;  // [maxM, rows]: each row alone (M = 1), 1 thread, best target
    vq::set_num_threads(1);
    for (int64_t m = 0; m < maxM; ++m) {
      vq::ActivationBuffer ab;
      std::vector<float> y(static_cast<size_t>(rows));
      vq::matmul_packed(P, ab.quantize(x.data() + m * cols, 1, cols), y.data());
      ref.insert(ref.end(), y.begin(), y.end());
    }
    for (int threads : {1, 2, 3}) {
      vq::set_num_threads(threads);
      for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
        if (target != HWY_AVX2 && target != HWY_AVX3 && target != HWY_AVX3_DL) continue;
        hwy::SetSupportedTargetsForTest(target);
        for (int64_t M : {3, 8, 16, 70}) {
          vq::ActivationBuffer ab;
          std::vector<float> y(static_cast<size_t>(M * rows));
          vq::matmul_packed(P, ab.quantize(x.data(), M, cols), y.data());
          EXPECT_TRUE(std::equal(y.begin(), y.end(), ref.begin()))
              << vq::ggml_type_name(t) << " M=" << M << " threads=" << threads << " target " << hwy::TargetName(target);
        }
      }
      hwy::SetSupportedTargetsForTest(0);
    }
  }
  vq::set_num_threads(2);
}

TEST(PackedWeights, OddShapes) {
  for (GGMLType t : kPackedTypes)
    for (bool random_bits : {false, true}) {
      const int64_t u = vq::unit_cols(t);
      check_packed(t, 1, u, random_bits, {1, 2, 5});
      check_packed(t, 8, u, random_bits, {1, 4, 9});
      check_packed(t, 37, 3 * u, random_bits, {1, 3, 16});
    }
}

TEST(PackedWeights, PackedEqualsPlainProductWithinRounding) {
  const int64_t rows = 70, M = 6;
  for (GGMLType t : kPackedTypes) {
    const int64_t cols = vq::unit_cols(t) == 256 ? 1024 : 576;
    const auto W = make_weights(t, rows, cols, false, 41);
    const auto x = random_x(M * cols, 42);
    vq::ActivationBuffer ab;
    const vq::QuantizedRows& X = ab.quantize(x.data(), M, cols);
    std::vector<float> plain(static_cast<size_t>(M * rows)), packed(plain.size());
    vq::matmul_q(t, W.data(), rows, cols, X, plain.data());
    const vq::PackedWeight P = vq::pack_weight(t, W.data(), rows, cols);
    // Memory: as many bytes as the GGUF rows (padded to 8), but q4_K x8 1184 per 1152, q5_K x8
    // 1440 per 1408 (their 6-bit scales in whole bytes) and q3_K x8 912 per 880 (int8 scales).
    const size_t gguf = size_t((rows + 7) / 8 * 8) * vq::ggml_row_bytes(t, cols);
    const size_t expect = t == GGMLType::Q4_K   ? gguf / 1152 * 1184
                          : t == GGMLType::Q5_K ? gguf / 1408 * 1440
                          : t == GGMLType::Q3_K ? gguf / 880 * 912
                                                : gguf;
    EXPECT_EQ(P.data.size(), expect) << vq::ggml_type_name(t);
    vq::matmul_packed(P, X, packed.data());
    for (size_t i = 0; i < plain.size(); ++i)  // same integer sums; float order differs
      EXPECT_NEAR(packed[i], plain[i], 1e-4 * (1.0 + std::fabs(plain[i]))) << vq::ggml_type_name(t) << " " << i;
  }
}

// Several packed weights in one dispatch give each one's own product.
TEST(PackedWeights, MultiMatchesSeparateProducts) {
  const int64_t cols = 512;
  const GGMLType types[] = {GGMLType::Q4_K, GGMLType::Q6_K, GGMLType::Q4_1, GGMLType::Q8_0, GGMLType::F16, GGMLType::Q3_K};
  const int64_t rows[] = {100, 17, 8, 1, 24, 9};
  constexpr int kJobs = 6;
  std::vector<vq::PackedWeight> P;
  for (int j = 0; j < kJobs; ++j) {
    const auto W = make_weights(types[j], rows[j], cols, true, uint64_t(j) + 3);
    P.push_back(vq::pack_weight(types[j], W.data(), rows[j], cols));
  }
  for (int threads : {1, 2}) {
    vq::set_num_threads(threads);
    for (int64_t M : {1, 6, 20}) {
      const auto x = random_x(M * cols, uint64_t(M));
      vq::ActivationBuffer ab;
      const vq::QuantizedRows& X = ab.quantize(x.data(), M, cols);
      std::vector<std::vector<float>> sep(kJobs), multi(kJobs);
      std::vector<vq::PackedJob> jobs;
      for (int j = 0; j < kJobs; ++j) {
        sep[size_t(j)].assign(size_t(M * rows[j]), 0.0f);
        multi[size_t(j)].assign(size_t(M * rows[j]), -1.0f);
        vq::matmul_packed(P[size_t(j)], X, sep[size_t(j)].data());
        jobs.push_back({&P[size_t(j)], multi[size_t(j)].data()});
      }
      vq::matmul_packed_multi(jobs.data(), kJobs, X);
      for (int j = 0; j < kJobs; ++j)
        EXPECT_EQ(sep[size_t(j)], multi[size_t(j)]) << vq::ggml_type_name(types[j]) << " M=" << M << " t=" << threads;
    }
  }
  vq::set_num_threads(2);
}

TEST(PackedWeights, BadArgumentsThrow) {
  std::vector<uint8_t> W(4096);
  EXPECT_TRUE(vq::packable(GGMLType::Q2_K, 256));
  EXPECT_TRUE(vq::packable(GGMLType::Q3_K, 512));
  EXPECT_FALSE(vq::packable(GGMLType::Q3_K, 288));
  EXPECT_TRUE(vq::packable(GGMLType::F16, 256));
  EXPECT_TRUE(vq::packable(GGMLType::BF16, 96));
  EXPECT_FALSE(vq::packable(GGMLType::F32, 45));  // float weights of any width stay plain
  EXPECT_FALSE(vq::packable(GGMLType::Q8_K, 256));
  EXPECT_TRUE(vq::packable(GGMLType::Q5_K, 256));
  EXPECT_TRUE(vq::packable(GGMLType::Q6_K, 256));
  EXPECT_FALSE(vq::packable(GGMLType::Q4_K, 288));
  EXPECT_TRUE(vq::packable(GGMLType::Q4_1, 288));
  EXPECT_FALSE(vq::packable(GGMLType::Q8_0, 40));
  EXPECT_TRUE(vq::packable(GGMLType::Q4_K, 512));
  try {
    vq::pack_weight(GGMLType::Q8_K, W.data(), 2, 256);
    FAIL() << "no throw";
  } catch (const vq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_K"), std::string::npos) << e.what();
  }
  EXPECT_THROW(vq::pack_weight(GGMLType::F16, W.data(), 2, 40), vq::Error);
  EXPECT_THROW(vq::pack_weight(GGMLType::Q4_K, W.data(), 2, 300), vq::Error);
  EXPECT_THROW(vq::pack_weight(GGMLType::Q4_0, W.data(), 2, 48), vq::Error);
  const auto P = vq::pack_weight(GGMLType::Q4_K, W.data(), 2, 256);
  std::vector<float> x(512), y(16);
  vq::ActivationBuffer ab;
  EXPECT_THROW(vq::matmul_packed(P, ab.quantize(x.data(), 1, 512), y.data()), vq::Error);  // 512 != 256 columns
  // Float weights need the float rows, quantized ones the int8 codes.
  const auto PF = vq::pack_weight(GGMLType::F16, W.data(), 2, 256);
  vq::QuantizedRows no_x = ab.quantize(x.data(), 1, 256);
  no_x.x = nullptr;
  EXPECT_THROW(vq::matmul_packed(PF, no_x, y.data()), vq::Error);
  vq::QuantizedRows only_x;
  only_x.M = 1, only_x.cols = 256, only_x.x = x.data();
  EXPECT_THROW(vq::matmul_packed(P, only_x, y.data()), vq::Error);
  EXPECT_NO_THROW(vq::matmul_packed(PF, only_x, y.data()));
}

// The float-rows entry point (quantizes for the quantized types, not for the float ones) gives
// the product from pre-quantized rows.
TEST(PackedWeights, FloatRowsEntryMatchesQuantizedRows) {
  const int64_t rows = 21, cols = 256, M = 3;
  const auto x = random_x(M * cols, 31);
  for (GGMLType t : {GGMLType::Q3_K, GGMLType::BF16}) {
    const auto W = make_weights(t, rows, cols, true, 5);
    const vq::PackedWeight P = vq::pack_weight(t, W.data(), rows, cols);
    std::vector<float> y1(size_t(M * rows)), y2(y1.size());
    vq::ActivationBuffer ab;
    vq::matmul_packed(P, ab.quantize(x.data(), M, cols), y1.data());
    vq::matmul_packed(P, x.data(), M, y2.data());
    EXPECT_EQ(y1, y2) << vq::ggml_type_name(t);
  }
}
