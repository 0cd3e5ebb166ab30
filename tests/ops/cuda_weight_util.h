#pragma once
// Random GGUF weight rows for the GPU weight tests: every quant byte uniformly random (all bit
// patterns of the codes and 6-bit scales), the fp16 scale fields finite (normal or, now and
// then, subnormal), float types finite.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "model/weight_formats.h"
#include "ops/cuda/weights_cuda.h"

namespace vq::test {

// Byte offsets of the fp16 scale fields inside one block of a quantized type.
inline std::vector<int> f16_fields(uint32_t type) {
  namespace g = cuda::ggml;
  switch (type) {
    case g::Q8_0: case g::Q4_0: case g::Q5_0: return {0};
    case g::Q4_1: case g::Q5_1: case g::Q4_K: case g::Q5_K: return {0, 2};
    case g::Q6_K: return {208};
    default: return {};
  }
}

inline uint16_t random_scale_f16(std::mt19937& rng, float magnitude) {
  std::normal_distribution<float> nd;
  if (rng() % 16 == 0) return uint16_t((rng() % 0x3ffu + 1) | (rng() & 0x8000u));  // subnormal
  return f32_to_f16(nd(rng) * magnitude);
}

// rows x cols of `type`, packed as in a GGUF file.
inline std::vector<uint8_t> random_weight_rows(uint32_t type, int64_t rows, int64_t cols, std::mt19937& rng,
                                               float magnitude = 0.02f) {
  const size_t rb = cuda::weight_row_bytes(type, cols);
  std::vector<uint8_t> w(size_t(rows) * rb);
  std::normal_distribution<float> nd;
  namespace g = cuda::ggml;
  if (type == g::F32 || type == g::F16 || type == g::BF16) {
    for (int64_t i = 0; i < rows * cols; ++i) {
      const float v = nd(rng);
      if (type == g::F32) std::memcpy(&w[size_t(i) * 4], &v, 4);
      const uint16_t h = type == g::F16 ? f32_to_f16(v) : f32_to_bf16(v);
      if (type != g::F32) std::memcpy(&w[size_t(i) * 2], &h, 2);
    }
    return w;
  }
  for (auto& b : w) b = uint8_t(rng());
  const size_t bb = cuda::weight_block_bytes(type);
  for (size_t off = 0; off < w.size(); off += bb)
    for (int f : f16_fields(type)) {
      const uint16_t h = random_scale_f16(rng, magnitude);
      std::memcpy(&w[off + size_t(f)], &h, 2);
    }
  return w;
}

// The CPU's decode of the rows (vq::dequantize_row), [rows, cols] f32.
inline std::vector<float> cpu_decode(uint32_t type, const std::vector<uint8_t>& w, int64_t rows, int64_t cols) {
  std::vector<float> out(size_t(rows * cols));
  const size_t rb = cuda::weight_row_bytes(type, cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(GGMLType(type), w.data() + size_t(r) * rb, &out[size_t(r * cols)], cols);
  return out;
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace vq::test
