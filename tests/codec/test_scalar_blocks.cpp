// The scalar block formats (codec/scalar_blocks.h): llama.cpp's reference rounding pinned on
// hand-made blocks, and the encoders' round trips. tests/python/test_block_formats.py compares
// the same encoders with gguf-py's bit-exact copies of llama.cpp's on random data.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codec/scalar_blocks.h"
#include "core/fp16.h"

namespace vq {
namespace {

using Block = std::array<float, 32>;
using Enc = void (*)(const float*, uint8_t*);
using Dec = void (*)(const uint8_t*, float*);
struct Format {
  const char* name;
  Enc enc;
  Dec dec;
  size_t bytes;
};
const Format kFormats[] = {{"q8_0", quantize_q8_0, dequantize_q8_0, 34}, {"q4_0", quantize_q4_0, dequantize_q4_0, 18},
                           {"q4_1", quantize_q4_1, dequantize_q4_1, 20}, {"q5_0", quantize_q5_0, dequantize_q5_0, 22},
                           {"q5_1", quantize_q5_1, dequantize_q5_1, 24}};

Block decode(const Format& f, const Block& x) {
  std::vector<uint8_t> b(f.bytes);
  f.enc(x.data(), b.data());
  Block y;
  f.dec(b.data(), y.data());
  return y;
}

// Blocks whose scale is exactly 1 (or whose min and scale are 0 and 1), so x/d is x itself and
// the rounding of each element is visible in the decoded value.
TEST(ScalarBlocks, RoundingIsLlamaCppsReference) {
  Block x{};
  // q8_0: d = 127/127 = 1; roundf rounds halves away from zero (lrint would give 0, 2, -0, -2).
  x[0] = 127, x[1] = 0.5f, x[2] = 1.5f, x[3] = -0.5f, x[4] = -2.5f, x[5] = 2.4999998f, x[6] = -126.5f;
  Block y = decode(kFormats[0], x);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 7), (std::vector<float>{127, 1, 2, -1, -3, 2, -127}));
  // q4_0: max = -8 -> d = 1; n = trunc(x + 8.5): halves go up, 7.5 and more clamp to 7.
  x = {};
  // 2.4999998 + 8.5 rounds to 11 in f32 before the truncation, as in the reference.
  x[0] = -8, x[1] = 0.5f, x[2] = -0.5f, x[3] = -1.5f, x[4] = 6.5f, x[5] = 7.9f, x[6] = 2.4999998f, x[7] = 2.49f;
  y = decode(kFormats[1], x);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 8), (std::vector<float>{-8, 1, 0, -1, 7, 7, 3, 2}));
  // q5_0: max = -16 -> d = 1; n = trunc(x + 16.5).
  x = {};
  x[0] = -16, x[1] = 0.5f, x[2] = -0.5f, x[3] = 14.5f, x[4] = 15.7f;
  y = decode(kFormats[3], x);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 5), (std::vector<float>{-16, 1, 0, 15, 15}));
  // q4_1: min 0, max 15 -> d = 1, m = 0; n = trunc(x + 0.5).
  x = {};
  x[0] = 15, x[1] = 0.5f, x[2] = 2.5f, x[3] = 3.4999998f, x[4] = 14.5f;
  y = decode(kFormats[2], x);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 5), (std::vector<float>{15, 1, 3, 3, 15}));
  // q5_1: min 0, max 31 -> d = 1.
  x = {};
  x[0] = 31, x[1] = 0.5f, x[2] = 30.5f;
  y = decode(kFormats[4], x);
  EXPECT_EQ(std::vector<float>(y.begin(), y.begin() + 3), (std::vector<float>{31, 1, 31}));
}

// The codes come from the f32 scale, not the fp16-rounded one the block stores (as in the
// reference): 1/d of an f32 d that fp16 cannot hold exactly.
TEST(ScalarBlocks, CodesUseTheF32Scale) {
  Block x{};
  x[0] = 100.0f;  // d = 100/127
  x[1] = 50.4f;   // 50.4 * 127/100 = 64.008 -> 64
  x[2] = 0.39370079f * 100.0f / 127.0f * 127.0f / 100.0f;  // below half a step -> 0
  std::vector<uint8_t> b(34);
  quantize_q8_0(x.data(), b.data());
  const float d32 = 100.0f / 127.0f;
  EXPECT_EQ(int8_t(b[2 + 1]), int8_t(std::round(50.4f * (1.0f / d32))));
  uint16_t dh;
  std::memcpy(&dh, b.data(), 2);
  EXPECT_EQ(dh, f32_to_f16(d32));
  int8_t q[32];
  EXPECT_EQ(quantize_int8_block(x.data(), q), d32);  // the activation blocks keep the f32 scale
  EXPECT_EQ(0, std::memcmp(q, b.data() + 2, 32));
}

// Encoding what a block decodes to gives the same block back (for the symmetric formats, whose
// decoded extreme is exactly -2^(bits-1) d), and every element is within half a step.
TEST(ScalarBlocks, RoundTrip) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Format& f : kFormats) {
    for (int trial = 0; trial < 300; ++trial) {
      Block x;
      const float scale = std::ldexp(1.0f, int(rng() % 20) - 10);
      for (float& v : x) v = nd(rng) * scale + (f.name[2] == '1' ? scale * 3 : 0.0f);
      std::vector<uint8_t> b(f.bytes), b2(f.bytes);
      f.enc(x.data(), b.data());
      Block y;
      f.dec(b.data(), y.data());
      float lo = x[0], hi = x[0], amax = 0;
      for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v), amax = std::max(amax, std::fabs(v));
      const int bits = f.name[1] - '0';
      const bool asym = f.name[3] == '1';
      const float step = asym ? (hi - lo) / float((1 << bits) - 1) : amax / float(bits == 8 ? 127 : 1 << (bits - 1));
      // Half a step (a whole one for q4_0/q5_0: the code range is -2^(b-1)..2^(b-1)-1, so a
      // value at the extreme opposite the block's largest magnitude clamps one step short), plus
      // the fp16 rounding of the stored scale (and min) at the block's extremes:
      // relative 2^-11 when normal, absolute 2^-25 per code step when subnormal (tiny blocks).
      const float tol = (!asym && bits != 8 ? 1.0f : 0.5f) * step + (asym ? 1.0f : 0.5f) * std::ldexp(amax + std::fabs(lo), -10) +
                        (asym ? 2.0f : 1.0f) * 128.0f * std::ldexp(1.0f, -25);
      for (int i = 0; i < 32; ++i) ASSERT_LE(std::fabs(y[size_t(i)] - x[size_t(i)]), tol) << f.name << " " << i;
      if (!asym) {
        f.enc(y.data(), b2.data());
        EXPECT_EQ(b, b2) << f.name << " trial " << trial;
      }
    }
  }
}

TEST(ScalarBlocks, ZeroAndConstantBlocks) {
  for (const Format& f : kFormats) {
    Block zero{};
    EXPECT_EQ(decode(f, zero), zero) << f.name;
    Block c;
    c.fill(-0.75f);
    const Block y = decode(f, c);
    // Exact where the scale is (0.75/8, 0.75/16, or 0 with m = -0.75); q8_0's 0.75/127 is not.
    for (float v : y) EXPECT_NEAR(v, -0.75f, 0.75f / 2048) << f.name;
    if (f.bytes != 34) {
      for (float v : y) EXPECT_EQ(v, -0.75f) << f.name;
    }
  }
}

}  // namespace
}  // namespace vq
