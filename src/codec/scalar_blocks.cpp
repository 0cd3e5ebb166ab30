#include "codec/scalar_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"

namespace vq {

void quantize_q8_0(const float* x, uint8_t* b) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = d > 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b, &dh, 2);
  for (int i = 0; i < 32; ++i) b[2 + i] = uint8_t(int8_t(std::lround(x[i] * id)));
}

void quantize_q4_0(const float* x, uint8_t* b) {
  // scale from the signed value of largest magnitude, mapped to -8 (the full 4-bit range)
  float amax = 0, mx = 0;
  for (int i = 0; i < 32; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      mx = x[i];
    }
  const float d = mx / -8.0f;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  const uint16_t dh = f32_to_f16(d);
  std::memcpy(b, &dh, 2);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, int(x[j] * id + 8.5f));
    const int hi = std::min(15, int(x[j + 16] * id + 8.5f));
    b[2 + j] = uint8_t(std::max(0, lo) | (std::max(0, hi) << 4));
  }
}

void dequantize_q8_0(const uint8_t* b, float* x) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  const float d = f16_to_f32(dh);
  for (int i = 0; i < 32; ++i) x[i] = d * float(int8_t(b[2 + i]));
}

void dequantize_q4_0(const uint8_t* b, float* x) {
  uint16_t dh;
  std::memcpy(&dh, b, 2);
  const float d = f16_to_f32(dh);
  for (int j = 0; j < 16; ++j) {
    x[j] = d * float(int(b[2 + j] & 15) - 8);
    x[j + 16] = d * float(int(b[2 + j] >> 4) - 8);
  }
}

}  // namespace vq
