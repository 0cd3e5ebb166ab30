#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/bitpack.h"
#include "core/error.h"

namespace vq {
namespace {

TEST(BitPack, RowBytes) {
  EXPECT_EQ(packed_row_bytes(16, 8), 16u);
  EXPECT_EQ(packed_row_bytes(16, 12), 24u);
  EXPECT_EQ(packed_row_bytes(3, 4), 2u);
  EXPECT_EQ(packed_row_bytes(0, 5), 0u);
  EXPECT_EQ(packed_row_bytes(1, 1), 1u);
  EXPECT_THROW(packed_row_bytes(4, 0), Error);
  EXPECT_THROW(packed_row_bytes(4, 17), Error);
  EXPECT_THROW(packed_row_bytes(-1, 8), Error);
}

TEST(BitPack, RoundTripEveryWidth) {
  std::mt19937 rng(7);
  for (int bits = 1; bits <= 16; ++bits) {
    for (int n : {0, 1, 2, 3, 7, 8, 15, 16, 17, 31, 64, 129}) {
      std::vector<uint16_t> codes(n), back(n, 0xffff);
      for (auto& c : codes) c = uint16_t(rng() & ((1u << bits) - 1));
      // Guard bytes after the row catch overruns.
      std::vector<uint8_t> buf(packed_row_bytes(n, bits) + 4, 0xAB);
      pack_codes(codes.data(), n, bits, buf.data());
      for (size_t g = packed_row_bytes(n, bits); g < buf.size(); ++g) ASSERT_EQ(buf[g], 0xAB) << bits << " " << n;
      unpack_codes(buf.data(), n, bits, back.data());
      ASSERT_EQ(codes, back) << "bits " << bits << " n " << n;
      for (int i = 0; i < n; ++i) ASSERT_EQ(read_code(buf.data(), i, bits), codes[i]) << bits << " " << i;
    }
  }
}

TEST(BitPack, LayoutIsLsbFirst) {
  // b=4: low nibble first.
  const uint16_t c4[3] = {0x1, 0xA, 0x7};
  uint8_t o4[2];
  pack_codes(c4, 3, 4, o4);
  EXPECT_EQ(o4[0], 0xA1);
  EXPECT_EQ(o4[1], 0x07);  // padding bits zero
  // b=12: two codes per 3 bytes.
  const uint16_t c12[2] = {0xABC, 0x123};
  uint8_t o12[3];
  pack_codes(c12, 2, 12, o12);
  EXPECT_EQ(o12[0], 0xBC);
  EXPECT_EQ(o12[1], 0x3A);
  EXPECT_EQ(o12[2], 0x12);
  // b=1: bit i of byte 0 is code i.
  const uint16_t c1[8] = {1, 0, 0, 0, 0, 0, 0, 1};
  uint8_t o1;
  pack_codes(c1, 8, 1, &o1);
  EXPECT_EQ(o1, 0x81);
}

TEST(BitPack, CodeTooWideIsAnError) {
  const uint16_t c[2] = {3, 16};
  uint8_t out[2];
  try {
    pack_codes(c, 2, 4, out);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vq
