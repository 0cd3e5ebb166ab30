#include "codec/scalar_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/fp16.h"

namespace vq {

namespace {

inline void store_f16(uint8_t* p, float x) {
  const uint16_t h = f32_to_f16(x);
  std::memcpy(p, &h, 2);
}
inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}
inline float reciprocal(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

// The element of largest magnitude with its sign (the first one on ties, as the reference).
float signed_absmax(const float* x) {
  float amax = 0, mx = 0;
  for (int i = 0; i < 32; ++i)
    if (amax < std::fabs(x[i])) amax = std::fabs(x[i]), mx = x[i];
  return mx;
}

// n[32] (< 2^bits) -> nibbles in qs[16] (element j low, j + 16 high) and, for 5 bits, the fifth
// bits in the u32 at qh.
void pack(const int* n, uint8_t* qs, uint8_t* qh) {
  uint32_t high = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = uint8_t((n[j] & 15) | (n[j + 16] & 15) << 4);
    high |= uint32_t(n[j] >> 4 & 1) << j | uint32_t(n[j + 16] >> 4 & 1) << (j + 16);
  }
  if (qh) std::memcpy(qh, &high, 4);
}
void unpack(const uint8_t* qs, const uint8_t* qh, int* n) {
  uint32_t high = 0;
  if (qh) std::memcpy(&high, qh, 4);
  for (int j = 0; j < 16; ++j) {
    n[j] = (qs[j] & 15) | int(high >> j & 1) << 4;
    n[j + 16] = (qs[j] >> 4) | int(high >> (j + 16) & 1) << 4;
  }
}

// q4_0 / q5_0: symmetric around 2^(bits-1), the signed extreme at code 0.
void quantize_sym(const float* x, uint8_t* b, int bits) {
  const int half = 1 << (bits - 1), top = 2 * half - 1;
  const float d = signed_absmax(x) / float(-half);
  const float id = reciprocal(d);
  store_f16(b, d);
  int n[32];
  // (x/d + half + 0.5) >= 0.5 for every x of the block; the cast truncates like the reference's.
  for (int i = 0; i < 32; ++i) n[i] = std::min(top, int(x[i] * id + (float(half) + 0.5f)));
  pack(n, b + (bits == 5 ? 6 : 2), bits == 5 ? b + 2 : nullptr);
}

// q4_1 / q5_1: from the minimum up.
void quantize_asym(const float* x, uint8_t* b, int bits) {
  const int top = (1 << bits) - 1;
  float lo = x[0], hi = x[0];
  for (int i = 1; i < 32; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  const float d = (hi - lo) / float(top);
  const float id = reciprocal(d);
  store_f16(b, d);
  store_f16(b + 2, lo);
  int n[32];
  for (int i = 0; i < 32; ++i) n[i] = std::min(top, int((x[i] - lo) * id + 0.5f));
  pack(n, b + (bits == 5 ? 8 : 4), bits == 5 ? b + 4 : nullptr);
}

void dequantize_sym(const uint8_t* b, float* x, int bits) {
  const float d = load_f16(b);
  int n[32];
  unpack(b + (bits == 5 ? 6 : 2), bits == 5 ? b + 2 : nullptr, n);
  for (int i = 0; i < 32; ++i) x[i] = d * float(n[i] - (1 << (bits - 1)));
}

void dequantize_asym(const uint8_t* b, float* x, int bits) {
  const float d = load_f16(b), m = load_f16(b + 2);
  int n[32];
  unpack(b + (bits == 5 ? 8 : 4), bits == 5 ? b + 4 : nullptr, n);
  for (int i = 0; i < 32; ++i) x[i] = d * float(n[i]) + m;
}

}  // namespace

float quantize_int8_block(const float* x, int8_t* q) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float d = amax / 127.0f;
  const float id = reciprocal(d);
  for (int i = 0; i < 32; ++i) q[i] = int8_t(std::round(x[i] * id));
  return d;
}

void quantize_q8_0(const float* x, uint8_t* b) {
  store_f16(b, quantize_int8_block(x, reinterpret_cast<int8_t*>(b + 2)));
}
void quantize_q4_0(const float* x, uint8_t* b) { quantize_sym(x, b, 4); }
void quantize_q5_0(const float* x, uint8_t* b) { quantize_sym(x, b, 5); }
void quantize_q4_1(const float* x, uint8_t* b) { quantize_asym(x, b, 4); }
void quantize_q5_1(const float* x, uint8_t* b) { quantize_asym(x, b, 5); }

void dequantize_q8_0(const uint8_t* b, float* x) {
  const float d = load_f16(b);
  for (int i = 0; i < 32; ++i) x[i] = d * float(int8_t(b[2 + i]));
}
void dequantize_q4_0(const uint8_t* b, float* x) { dequantize_sym(b, x, 4); }
void dequantize_q5_0(const uint8_t* b, float* x) { dequantize_sym(b, x, 5); }
void dequantize_q4_1(const uint8_t* b, float* x) { dequantize_asym(b, x, 4); }
void dequantize_q5_1(const uint8_t* b, float* x) { dequantize_asym(b, x, 5); }

}  // namespace vq
