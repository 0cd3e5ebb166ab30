// find_non_finite: where a weight tensor can hold NaN or inf (float values, fp16 block scales).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "model/gguf_writer.h"
#include "model/weight_formats.h"

namespace {

using vq::GGMLType;

// Byte offsets of a block's fp16 scale fields (quant_blocks.h).
std::vector<size_t> scale_offsets(GGMLType t) {
  switch (t) {
    case GGMLType::Q4_1: case GGMLType::Q5_1: case GGMLType::Q4_K: case GGMLType::Q5_K: return {0, 2};
    case GGMLType::Q6_K: return {208};
    case GGMLType::Q2_K: return {80, 82};
    case GGMLType::Q3_K: return {108};
    default: return {0};
  }
}

TEST(NonFinite, FindsNaNAndInfInValuesAndBlockScales) {
  std::mt19937_64 rng(3);
  for (GGMLType t : vq::test::supported_types()) {
    const int64_t be = vq::ggml_block_elems(t), n = be * 7;
    const auto clean = vq::test::random_blocks(t, n, rng);
    EXPECT_EQ(vq::find_non_finite(t, clean.data(), n), -1) << vq::ggml_type_name(t);
    const size_t bb = vq::ggml_block_bytes(t);
    for (uint16_t bad16 : {uint16_t(0x7e00), uint16_t(0x7c00), uint16_t(0xfc00)}) {  // NaN, +inf, -inf (fp16)
      if (be == 1) {  // float types: element 5
        auto b = clean;
        if (t == GGMLType::F32) {
          const uint32_t u = uint32_t(bad16 & 0x8000) << 16 | 0x7f800000u | (bad16 == 0x7e00 ? 0x400000u : 0u);
          std::memcpy(b.data() + 4 * 5, &u, 4);
        } else {
          const uint16_t v = t == GGMLType::BF16 ? uint16_t((bad16 & 0x8000) | 0x7f80 | (bad16 == 0x7e00 ? 0x40 : 0)) : bad16;
          std::memcpy(b.data() + 2 * 5, &v, 2);
        }
        EXPECT_EQ(vq::find_non_finite(t, b.data(), n), 5) << vq::ggml_type_name(t);
        continue;
      }
      for (size_t off : scale_offsets(t)) {  // block 4's scale (or min)
        auto b = clean;
        std::memcpy(b.data() + 4 * bb + off, &bad16, 2);
        EXPECT_EQ(vq::find_non_finite(t, b.data(), n), 4 * be) << vq::ggml_type_name(t) << " offset " << off;
      }
    }
  }
}

}  // namespace
