#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "core/fp16.h"

namespace vq {
namespace {

// The value of an IEEE binary16 pattern, computed independently of the code under test.
double half_value(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  double v;
  if (exp == 0) v = std::ldexp(double(man), -24);
  else if (exp == 31) v = man ? NAN : INFINITY;
  else v = std::ldexp(double(1024 + man), exp - 25);
  return sign ? -v : v;
}

bool is_nan_half(uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff); }

TEST(Fp16, ExhaustiveValuesAndRoundTrip) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  std::vector<float> bulk(65536);
  f16_to_f32(all.data(), bulk.data(), all.size());
  std::vector<uint16_t> back(65536);
  f32_to_f16(bulk.data(), back.data(), bulk.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = uint16_t(i);
    const float f = f16_to_f32(h);
    if (is_nan_half(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      ASSERT_TRUE(std::isnan(bulk[i])) << std::hex << i;
      ASSERT_TRUE(is_nan_half(f32_to_f16(f))) << std::hex << i;
      ASSERT_TRUE(is_nan_half(back[i])) << std::hex << i;
      continue;
    }
    ASSERT_EQ(double(f), half_value(h)) << std::hex << i;
    ASSERT_EQ(std::signbit(f), bool(h & 0x8000)) << std::hex << i;
    uint32_t fb, bb;
    std::memcpy(&fb, &f, 4);
    std::memcpy(&bb, &bulk[i], 4);
    ASSERT_EQ(fb, bb) << "bulk vs scalar at " << std::hex << i;
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << i;
    ASSERT_EQ(back[i], h) << "bulk round trip at " << std::hex << i;
  }
}

TEST(Fp16, RoundToNearestEvenAtEveryMidpoint) {
  // Between adjacent positive finite halves a < b, the midpoint rounds to the even pattern,
  // anything above it to b, below it to a.
  for (uint32_t a = 0; a < 0x7bff; ++a) {
    const uint16_t b = uint16_t(a + 1);
    const double va = half_value(uint16_t(a)), vb = half_value(b);
    const float mid = float((va + vb) / 2);  // exact: 12 significant bits
    ASSERT_EQ(double(mid), (va + vb) / 2);
    const uint16_t even = (a & 1) ? b : uint16_t(a);
    ASSERT_EQ(f32_to_f16(mid), even) << std::hex << a;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, INFINITY)), b) << std::hex << a;
    ASSERT_EQ(f32_to_f16(std::nextafter(mid, 0.f)), uint16_t(a)) << std::hex << a;
    ASSERT_EQ(f32_to_f16(-mid), uint16_t(even | 0x8000)) << std::hex << a;
  }
  EXPECT_EQ(f32_to_f16(65504.f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.f), 0x7c00);  // rounds up to infinity
  EXPECT_EQ(f32_to_f16(1e10f), 0x7c00);
  EXPECT_EQ(f32_to_f16(-1e10f), 0xfc00);
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
}

TEST(Bf16, ExhaustiveRoundTripAndRounding) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = uint16_t(i);
  std::vector<float> bulk(65536);
  bf16_to_f32(all.data(), bulk.data(), all.size());
  for (uint32_t i = 0; i < 65536; ++i) {
    const float f = bf16_to_f32(uint16_t(i));
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    ASSERT_EQ(bits, i << 16);
    ASSERT_EQ(std::memcmp(&f, &bulk[i], 4), 0);
    if (std::isnan(f)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(f))));
    } else {
      ASSERT_EQ(f32_to_bf16(f), uint16_t(i)) << std::hex << i;
    }
  }
  // 1 + 2^-8 is the midpoint between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.0f + 0.00390625f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.0f + 0.00390625f, 2.f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(1.0f + 3 * 0.00390625f), 0x3f82);  // midpoint of 0x3f81/0x3f82 -> even
}

}  // namespace
}  // namespace vq
