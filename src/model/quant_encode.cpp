// Plain round-to-nearest encoders for the GGML weight types (layouts in quant_blocks.h).
// They exist to write GGUF files (tests, tiny models); scales are chosen from block minima and
// maxima, not by error minimisation. The 32-element formats are llama.cpp's reference
// quantizers, shared with the KV caches (codec/scalar_blocks.h); the K-quants are simpler than
// llama.cpp's (no search for the best scales).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "codec/scalar_blocks.h"
#include "core/error.h"
#include "core/fp16.h"
#include "model/quant_blocks.h"
#include "model/weight_formats.h"

namespace vq {

namespace {

inline void st16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
inline int clampi(int v, int lo, int hi) { return std::min(hi, std::max(lo, v)); }
inline int rnd(float v) { return int(std::lrintf(v)); }
// Multiplier 1/d that maps x to quantized steps, 0 when d rounds to 0 (all-zero block).
inline float inv(float d) { return d != 0.0f ? 1.0f / d : 0.0f; }

// The element of largest magnitude, keeping its sign (symmetric types put it at q = -2^(b-1)).
float signed_absmax(const float* x, int n) {
  float best = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > std::fabs(best)) best = x[i];
  return best;
}

// Q4_K / Q5_K super-block: per sub-block scale (max - min)/qmax and min -min (min <= 0),
// both stored as 6-bit multiples of the super-block's d and dmin.
void q_k(const float* x, uint8_t* b, int bits) {
  const int qmax = (1 << bits) - 1;
  float scale[8], mn[8];
  float max_scale = 0, max_mn = 0;
  for (int j = 0; j < 8; ++j) {
    float lo = 0, hi = x[32 * j];
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * j + l]), hi = std::max(hi, x[32 * j + l]);
    scale[j] = (hi - lo) / float(qmax);
    mn[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_mn = std::max(max_mn, mn[j]);
  }
  const uint16_t dh = f32_to_f16(max_scale / 63.0f), dminh = f32_to_f16(max_mn / 63.0f);
  const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
  int sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = clampi(rnd(scale[j] * inv(d)), 0, 63);
    m[j] = clampi(rnd(mn[j] * inv(dmin)), 0, 63);
  }
  st16(b, dh);
  st16(b + 2, dminh);
  uint8_t* scales = b + 4;
  for (int j = 0; j < 4; ++j) {
    scales[j] = uint8_t((sc[j] & 63) | (sc[j + 4] >> 4) << 6);
    scales[j + 4] = uint8_t((m[j] & 63) | (m[j + 4] >> 4) << 6);
    scales[j + 8] = uint8_t((sc[j + 4] & 15) | (m[j + 4] & 15) << 4);
  }
  uint8_t q[256];
  for (int j = 0; j < 8; ++j) {
    const float a = d * float(sc[j]), off = dmin * float(m[j]);
    const float ia = inv(a);
    for (int l = 0; l < 32; ++l) q[32 * j + l] = uint8_t(clampi(rnd((x[32 * j + l] + off) * ia), 0, qmax));
  }
  uint8_t* qh = b + 16;
  uint8_t* qs = b + (bits == 4 ? 16 : 48);
  if (bits == 5) std::memset(qh, 0, 32);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t q0 = q[64 * g + l], q1 = q[64 * g + 32 + l];
      qs[32 * g + l] = uint8_t((q0 & 15) | (q1 & 15) << 4);
      if (bits == 5) qh[l] |= uint8_t((q0 >> 4) << (2 * g) | (q1 >> 4) << (2 * g + 1));
    }
  }
}

// Q6_K super-block: 16 sub-blocks of 16 with int8 scales relative to d; q in -32..31.
void q6_k(const float* x, uint8_t* b) {
  float scale[16];
  float max_abs_scale = 0, max_scale = 0;
  for (int j = 0; j < 16; ++j) {
    scale[j] = signed_absmax(x + 16 * j, 16) / -32.0f;
    if (std::fabs(scale[j]) > max_abs_scale) max_abs_scale = std::fabs(scale[j]), max_scale = scale[j];
  }
  const uint16_t dh = f32_to_f16(max_scale / -128.0f);
  const float d = f16_to_f32(dh);
  int8_t sc[16];
  for (int j = 0; j < 16; ++j) sc[j] = int8_t(clampi(rnd(scale[j] * inv(d)), -128, 127));
  uint8_t q[256];
  for (int j = 0; j < 16; ++j) {
    const float ia = inv(d * float(sc[j]));
    for (int l = 0; l < 16; ++l) q[16 * j + l] = uint8_t(clampi(rnd(x[16 * j + l] * ia), -32, 31) + 32);
  }
  uint8_t* ql = b;
  uint8_t* qh = b + 128;
  std::memset(b, 0, 192);
  std::memcpy(b + 192, sc, 16);
  st16(b + 208, dh);
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const uint8_t v = q[128 * n + 32 * k + l];
        ql[64 * n + l + 32 * (k & 1)] |= uint8_t((v & 15) << (4 * (k >> 1)));
        qh[32 * n + l] |= uint8_t((v >> 4) << (2 * k));
      }
}

// Q2_K super-block: 16 sub-blocks of 16, each with a 4-bit scale (max - min)/3 and a 4-bit min
// -min (min <= 0), relative to the super-block's d and dmin; q in 0..3.
void q2_k(const float* x, uint8_t* b) {
  float scale[16], mn[16];
  float max_scale = 0, max_mn = 0;
  for (int j = 0; j < 16; ++j) {
    float lo = 0, hi = x[16 * j];
    for (int l = 0; l < 16; ++l) lo = std::min(lo, x[16 * j + l]), hi = std::max(hi, x[16 * j + l]);
    scale[j] = (hi - lo) / 3.0f;
    mn[j] = -lo;
    max_scale = std::max(max_scale, scale[j]);
    max_mn = std::max(max_mn, mn[j]);
  }
  const uint16_t dh = f32_to_f16(max_scale / 15.0f), dminh = f32_to_f16(max_mn / 15.0f);
  const float d = f16_to_f32(dh), dmin = f16_to_f32(dminh);
  std::memset(b, 0, 84);
  uint8_t q[256];
  for (int j = 0; j < 16; ++j) {
    const int sc = clampi(rnd(scale[j] * inv(d)), 0, 15), m = clampi(rnd(mn[j] * inv(dmin)), 0, 15);
    b[j] = uint8_t(sc | m << 4);
    const float ia = inv(d * float(sc)), off = dmin * float(m);
    for (int l = 0; l < 16; ++l) q[16 * j + l] = uint8_t(clampi(rnd((x[16 * j + l] + off) * ia), 0, 3));
  }
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) b[16 + 32 * n + l] |= uint8_t(q[128 * n + 32 * k + l] << (2 * k));
  st16(b + 80, dh);
  st16(b + 82, dminh);
}

// Q3_K super-block: 16 sub-blocks of 16 with 6-bit signed scales (-32..31) relative to d;
// q in -4..3 stored as 2 low bits in qs and the third bit in hmask.
void q3_k(const float* x, uint8_t* b) {
  float scale[16];
  float max_abs_scale = 0, max_scale = 0;
  for (int j = 0; j < 16; ++j) {
    scale[j] = signed_absmax(x + 16 * j, 16) / -4.0f;
    if (std::fabs(scale[j]) > max_abs_scale) max_abs_scale = std::fabs(scale[j]), max_scale = scale[j];
  }
  const uint16_t dh = f32_to_f16(max_scale / -32.0f);
  const float d = f16_to_f32(dh);
  std::memset(b, 0, 110);
  uint8_t* scales = b + 96;
  uint8_t u[256];  // q + 4, 0..7
  for (int j = 0; j < 16; ++j) {
    const int sc = clampi(rnd(scale[j] * inv(d)), -32, 31);
    const int s = sc + 32;
    if (j < 8)
      scales[j] |= uint8_t(s & 15);
    else
      scales[j - 8] |= uint8_t((s & 15) << 4);
    scales[8 + (j & 3)] |= uint8_t((s >> 4) << (2 * (j >> 2)));
    const float ia = inv(d * float(sc));
    for (int l = 0; l < 16; ++l) u[16 * j + l] = uint8_t(clampi(rnd(x[16 * j + l] * ia), -4, 3) + 4);
  }
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const uint8_t v = u[128 * n + 32 * k + l];
        b[32 + 32 * n + l] |= uint8_t((v & 3) << (2 * k));
        b[l] |= uint8_t((v >> 2) << (4 * n + k));
      }
  st16(b + 108, dh);
}

}  // namespace

void quantize_row(GGMLType t, const float* src, void* dst, int64_t n) {
  VQ_CHECK(ggml_type_supported(t), "weight type {} ({}) is not supported", ggml_type_name(t), uint32_t(t));
  const size_t rb = ggml_row_bytes(t, n);  // checks the block multiple
  (void)rb;
  uint8_t* p = static_cast<uint8_t*>(dst);
  const int64_t be = ggml_block_elems(t);
  const size_t bb = ggml_block_bytes(t);
  for (int64_t i = 0; i < n; i += be, p += bb) {
    const float* x = src + i;
    switch (t) {
      case GGMLType::F32: std::memcpy(p, x, 4); break;
      case GGMLType::F16: st16(p, f32_to_f16(*x)); break;
      case GGMLType::BF16: st16(p, f32_to_bf16(*x)); break;
      case GGMLType::Q8_0: quantize_q8_0(x, p); break;
      case GGMLType::Q4_0: quantize_q4_0(x, p); break;
      case GGMLType::Q5_0: quantize_q5_0(x, p); break;
      case GGMLType::Q4_1: quantize_q4_1(x, p); break;
      case GGMLType::Q5_1: quantize_q5_1(x, p); break;
      case GGMLType::Q4_K: q_k(x, p, 4); break;
      case GGMLType::Q5_K: q_k(x, p, 5); break;
      case GGMLType::Q6_K: q6_k(x, p); break;
      case GGMLType::Q2_K: q2_k(x, p); break;
      case GGMLType::Q3_K: q3_k(x, p); break;
      default: VQ_FAIL("weight type {} cannot be encoded", ggml_type_name(t));
    }
  }
}

}  // namespace vq
