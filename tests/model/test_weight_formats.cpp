// Decoding of every supported weight type against an independent element-wise reference
// written here from the GGUF/GGML block specification (quant_blocks.h documents the layouts).
// The library decodes block-wise; this reference computes each element from its index alone.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "core/error.h"
#include "core/fp16.h"
#include "model/gguf_writer.h"
#include "model/weight_formats.h"

namespace {

using vq::GGMLType;

float h(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return vq::f16_to_f32(v);
}

// Element i of the row starting at `row` (type t), straight from the specification formulas.
float spec_value(GGMLType t, const uint8_t* row, int64_t i) {
  switch (t) {
    case GGMLType::F32: {
      float v;
      std::memcpy(&v, row + 4 * i, 4);
      return v;
    }
    case GGMLType::F16: return h(row + 2 * i);
    case GGMLType::BF16: {
      uint16_t v;
      std::memcpy(&v, row + 2 * i, 2);
      return vq::bf16_to_f32(v);
    }
    default: break;
  }
  const int64_t be = vq::ggml_block_elems(t);
  const uint8_t* b = row + (i / be) * int64_t(vq::ggml_block_bytes(t));
  const int e = int(i % be);
  // 32-element types: element e < 16 is the low nibble of byte e, e >= 16 the high nibble of byte e-16.
  auto nib = [&](const uint8_t* qs) { return e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4; };
  auto bit = [&](const uint8_t* qh4) {  // bit e of the little-endian 32-bit qh
    return (qh4[e / 8] >> (e % 8)) & 1;
  };
  switch (t) {
    case GGMLType::Q8_0: return h(b) * float(int8_t(b[2 + e]));
    case GGMLType::Q4_0: return h(b) * float(nib(b + 2) - 8);
    case GGMLType::Q4_1: return h(b) * float(nib(b + 4)) + h(b + 2);
    case GGMLType::Q5_0: return h(b) * float((nib(b + 6) + 16 * bit(b + 2)) - 16);
    case GGMLType::Q5_1: return h(b) * float(nib(b + 8) + 16 * bit(b + 4)) + h(b + 2);
    case GGMLType::Q4_K:
    case GGMLType::Q5_K: {
      const bool five = t == GGMLType::Q5_K;
      const uint8_t* scales = b + 4;
      const int j = e / 32, l = e % 32, g = e / 64;
      int sc, m;
      if (j < 4) {
        sc = scales[j] & 0x3F;
        m = scales[j + 4] & 0x3F;
      } else {
        sc = (scales[j + 4] & 0x0F) + 16 * (scales[j - 4] >> 6);
        m = (scales[j + 4] >> 4) + 16 * (scales[j] >> 6);
      }
      const uint8_t byte = b[(five ? 48 : 16) + 32 * g + l];
      int q = (j % 2 == 0) ? (byte & 0x0F) : (byte >> 4);
      if (five) q += 16 * ((b[16 + l] >> j) & 1);  // sub-block j takes bit j of qh[l]
      return (h(b) * float(sc)) * float(q) - (h(b + 2) * float(m));
    }
    case GGMLType::Q6_K: {
      const int n = e / 128, r = e % 128, k = r / 32, l = r % 32;
      const uint8_t byte = b[64 * n + l + 32 * (k % 2)];
      const int lo = k < 2 ? (byte & 0x0F) : (byte >> 4);
      const int hi = (b[128 + 32 * n + l] >> (2 * k)) & 3;
      const int8_t sc = int8_t(b[192 + e / 16]);  // one scale per 16 consecutive elements
      return (h(b + 208) * float(sc)) * float(lo + 16 * hi - 32);
    }
    case GGMLType::Q2_K: {  // scales[16] | qs[64] | d | dmin; 2-bit q, 4-bit scale and min per 16
      const int n = e / 128, k = (e % 128) / 32, l = e % 32;
      const int q = (b[16 + 32 * n + l] >> (2 * k)) & 3;
      const uint8_t sm = b[e / 16];
      return (h(b + 80) * float(sm % 16)) * float(q) - h(b + 82) * float(sm / 16);
    }
    case GGMLType::Q3_K: {  // hmask[32] | qs[64] | scales[12] | d
      const int n = e / 128, k = (e % 128) / 32, l = e % 32, i = e / 16;
      const int lo2 = (b[32 + 32 * n + l] >> (2 * k)) & 3;
      const bool high = (b[l] >> (4 * n + k)) & 1;
      // 6-bit scales: the 16 low nibbles are the low then the high nibbles of bytes 0..7; the
      // 2-bit tops of scale i sit in byte 8 + i % 4 at bit 2 * (i / 4).
      const uint8_t* sb = b + 96;
      const int low4 = (sb[i % 8] >> (4 * (i / 8))) & 15;
      const int top2 = (sb[8 + i % 4] >> (2 * (i / 4))) & 3;
      const int s = low4 + 16 * top2 - 32;
      return (h(b + 108) * float(s)) * float(high ? lo2 : lo2 - 4);
    }
    default: ADD_FAILURE() << "no reference for " << vq::ggml_type_name(t); return 0;
  }
}

void expect_decodes_exactly(GGMLType t, const std::vector<uint8_t>& data, int64_t n, const char* what) {
  std::vector<float> got(static_cast<size_t>(n));
  vq::dequantize_row(t, data.data(), got.data(), n);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const float want = spec_value(t, data.data(), i);
    uint32_t a, b;
    std::memcpy(&a, &got[size_t(i)], 4);
    std::memcpy(&b, &want, 4);
    if (a != b) {
      ++bad;
      ADD_FAILURE() << vq::ggml_type_name(t) << " (" << what << ") element " << i << ": got " << got[size_t(i)]
                    << " want " << want;
    }
  }
}

TEST(WeightFormats, TypeTable) {
  struct Row { GGMLType t; const char* name; int64_t be; size_t bb; };
  // Sizes from the block layouts: fp16 scales (2 B) plus the quant fields.
  const Row rows[] = {{GGMLType::F32, "f32", 1, 4},       {GGMLType::F16, "f16", 1, 2},
                      {GGMLType::BF16, "bf16", 1, 2},     {GGMLType::Q8_0, "q8_0", 32, 2 + 32},
                      {GGMLType::Q4_0, "q4_0", 32, 2 + 16}, {GGMLType::Q4_1, "q4_1", 32, 4 + 16},
                      {GGMLType::Q5_0, "q5_0", 32, 2 + 4 + 16}, {GGMLType::Q5_1, "q5_1", 32, 4 + 4 + 16},
                      {GGMLType::Q4_K, "q4_K", 256, 4 + 12 + 128}, {GGMLType::Q5_K, "q5_K", 256, 4 + 12 + 32 + 128},
                      {GGMLType::Q6_K, "q6_K", 256, 128 + 64 + 16 + 2},
                      {GGMLType::Q2_K, "q2_K", 256, 16 + 64 + 4}, {GGMLType::Q3_K, "q3_K", 256, 32 + 64 + 12 + 2}};
  for (const auto& r : rows) {
    EXPECT_EQ(vq::ggml_type_name(r.t), r.name);
    EXPECT_TRUE(vq::ggml_type_supported(r.t)) << r.name;
    EXPECT_EQ(vq::ggml_block_elems(r.t), r.be) << r.name;
    EXPECT_EQ(vq::ggml_block_bytes(r.t), r.bb) << r.name;
    EXPECT_EQ(vq::ggml_row_bytes(r.t, r.be * 3), 3 * r.bb) << r.name;
  }
  EXPECT_FALSE(vq::ggml_type_supported(GGMLType::Q8_1));
  EXPECT_FALSE(vq::ggml_type_supported(GGMLType::Q8_K));
  EXPECT_EQ(vq::ggml_type_name(static_cast<GGMLType>(99)), "type(99)");
  EXPECT_FALSE(vq::ggml_type_supported(static_cast<GGMLType>(99)));
  EXPECT_THROW(vq::ggml_row_bytes(GGMLType::Q4_K, 100), vq::Error);
  EXPECT_THROW(vq::ggml_row_bytes(static_cast<GGMLType>(99), 32), vq::Error);
}

TEST(WeightFormats, DecodeRandomBlocksMatchesSpec) {
  std::mt19937_64 rng(7);
  for (GGMLType t : vq::test::supported_types()) {
    const int64_t n = 4 * 256;
    for (int rep = 0; rep < 20; ++rep) {
      const auto data = vq::test::random_blocks(t, n, rng);
      expect_decodes_exactly(t, data, n, "random bits");
    }
  }
}

TEST(WeightFormats, DecodeQuantizedDataMatchesSpecAndApproximatesInput) {
  // Round-to-nearest quantization of x ~ N(0,1): the decoded row must be close to x. Relative
  // RMS limits are ~2x the uniform-noise estimate step/sqrt(12) over the data's spread
  // (8 bits: ~0.3%, 6 bits: ~1.5%, 5 bits: ~3%, 4 bits: ~6%) plus fp16/bf16 rounding.
  struct Lim { GGMLType t; double rel_rms; };
  const Lim lims[] = {{GGMLType::F32, 0.0},   {GGMLType::F16, 1e-3},  {GGMLType::BF16, 5e-3},
                      {GGMLType::Q8_0, 0.01}, {GGMLType::Q4_0, 0.15}, {GGMLType::Q4_1, 0.12},
                      {GGMLType::Q5_0, 0.08}, {GGMLType::Q5_1, 0.06}, {GGMLType::Q4_K, 0.15},
                      {GGMLType::Q5_K, 0.08}, {GGMLType::Q6_K, 0.04}, {GGMLType::Q3_K, 0.30},
                      {GGMLType::Q2_K, 0.50}};
  for (const auto& lim : lims) {
    const int64_t n = 8 * 256;
    const auto x = vq::test::random_weights(size_t(n), 11, 0.05f);
    std::vector<uint8_t> data(vq::ggml_row_bytes(lim.t, n));
    vq::quantize_row(lim.t, x.data(), data.data(), n);
    expect_decodes_exactly(lim.t, data, n, "quantized");
    std::vector<float> y(static_cast<size_t>(n));
    vq::dequantize_row(lim.t, data.data(), y.data(), n);
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) num += std::pow(double(y[size_t(i)]) - x[size_t(i)], 2), den += std::pow(double(x[size_t(i)]), 2);
    const double rel = std::sqrt(num / den);
    EXPECT_LE(rel, lim.rel_rms) << vq::ggml_type_name(lim.t);
    if (lim.t != GGMLType::F32) {
      EXPECT_GT(rel, 0.0) << vq::ggml_type_name(lim.t);  // it really quantized
    }
  }
}

TEST(WeightFormats, ZeroAndConstantBlocks) {
  for (GGMLType t : vq::test::supported_types()) {
    const int64_t n = 256;
    for (float c : {0.0f, 0.5f, -3.0f}) {
      std::vector<float> x(static_cast<size_t>(n), c), y(static_cast<size_t>(n));
      std::vector<uint8_t> data(vq::ggml_row_bytes(t, n));
      vq::quantize_row(t, x.data(), data.data(), n);
      vq::dequantize_row(t, data.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_TRUE(std::isfinite(y[size_t(i)])) << vq::ggml_type_name(t);
        ASSERT_NEAR(y[size_t(i)], c, 0.02 * std::fabs(c) + 1e-6) << vq::ggml_type_name(t) << " c=" << c;
      }
    }
  }
}

TEST(WeightFormats, BadArgumentsThrow) {
  std::vector<uint8_t> buf(1024);
  std::vector<float> out(256);
  EXPECT_THROW(vq::dequantize_row(GGMLType::Q4_1, buf.data(), out.data(), 33), vq::Error);
  try {
    vq::dequantize_row(static_cast<GGMLType>(23), buf.data(), out.data(), 256);  // IQ4_XS: not supported
    FAIL() << "no throw";
  } catch (const vq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("iq4_xs"), std::string::npos) << e.what();
  }
  EXPECT_THROW(vq::quantize_row(GGMLType::Q8_K, out.data(), buf.data(), 256), vq::Error);
}

}  // namespace
