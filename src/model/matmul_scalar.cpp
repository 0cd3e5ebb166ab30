// Portable scalar kernels of the weight products, used on targets without 256-bit integer
// vectors. Same decomposition as the SIMD kernels: each 32-element weight block becomes int
// lanes w with weight = a * w + b, and the activation block contributes a*d_x*sum(w*q) + b*s_x.
#include <cmath>
#include <cstring>
#include <vector>

#include "codec/scalar_blocks.h"
#include "core/error.h"
#include "core/fp16.h"
#include "model/matmul_kernels.h"
#include "model/quant_blocks.h"

namespace vq {

namespace {

inline float h2f(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return f16_to_f32(v);
}

// Block b (32 elements) of a weight row -> w[32], a, b, and for Q2_K a second code vector w2
// with its scale a2: weight_i = a * w_i + a2 * w2_i + b (a2 = 0 for the other types).
void decode_block(GGMLType t, const uint8_t* row, int64_t blk, int32_t* w, float* a, float* off, int32_t* w2,
                  float* a2) {
  *a2 = 0;
  switch (t) {
    case GGMLType::Q8_0: {
      const uint8_t* p = row + blk * 34;
      for (int i = 0; i < 32; ++i) w[i] = int8_t(p[2 + i]);
      *a = h2f(p), *off = 0;
      return;
    }
    case GGMLType::Q4_0:
    case GGMLType::Q4_1: {
      const bool one = t == GGMLType::Q4_1;
      const uint8_t* p = row + blk * (one ? 20 : 18);
      const uint8_t* qs = p + (one ? 4 : 2);
      for (int i = 0; i < 16; ++i) w[i] = qs[i] & 15, w[i + 16] = qs[i] >> 4;
      *a = h2f(p), *off = one ? h2f(p + 2) : -8.0f * h2f(p);
      return;
    }
    case GGMLType::Q5_0:
    case GGMLType::Q5_1: {
      const bool one = t == GGMLType::Q5_1;
      const uint8_t* p = row + blk * (one ? 24 : 22);
      uint32_t qh;
      std::memcpy(&qh, p + (one ? 4 : 2), 4);
      const uint8_t* qs = p + (one ? 8 : 6);
      for (int i = 0; i < 16; ++i) {
        w[i] = (qs[i] & 15) | int((qh >> i) & 1) << 4;
        w[i + 16] = (qs[i] >> 4) | int((qh >> (i + 16)) & 1) << 4;
      }
      *a = h2f(p), *off = one ? h2f(p + 2) : -16.0f * h2f(p);
      return;
    }
    case GGMLType::Q4_K:
    case GGMLType::Q5_K: {
      const bool five = t == GGMLType::Q5_K;
      const uint8_t* p = row + (blk >> 3) * (five ? 176 : 144);
      const int j = int(blk & 7);
      int sc, m;
      blocks::k_scale_min(p + 4, j, &sc, &m);
      const uint8_t* qs = p + (five ? 48 : 16) + 32 * (j >> 1);
      for (int l = 0; l < 32; ++l) {
        w[l] = (j & 1) ? qs[l] >> 4 : qs[l] & 15;
        if (five) w[l] |= ((p[16 + l] >> j) & 1) << 4;
      }
      *a = h2f(p) * float(sc), *off = -(h2f(p + 2) * float(m));
      return;
    }
    case GGMLType::Q6_K: {
      const uint8_t* p = row + (blk >> 3) * 210;
      const int n = int((blk >> 2) & 1), k = int(blk & 3);
      const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192) + 8 * n + 2 * k;
      for (int l = 0; l < 32; ++l) {
        const int lo = (p[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
        const int hi = (p[128 + 32 * n + l] >> (2 * k)) & 3;
        w[l] = ((lo | hi << 4) - 32) * sc[l / 16];
      }
      *a = h2f(p + 208), *off = 0;
      return;
    }
    case GGMLType::Q3_K: {
      const uint8_t* p = row + (blk >> 3) * 110;
      const int n = int((blk >> 2) & 1), k = int(blk & 3);
      for (int l = 0; l < 32; ++l) {
        const int lo = (p[32 + 32 * n + l] >> (2 * k)) & 3, hi = (p[l] >> (4 * n + k)) & 1;
        w[l] = (lo - 4 * (1 - hi)) * blocks::q3k_scale(p + 96, 8 * n + 2 * k + l / 16);
      }
      *a = h2f(p + 108), *off = 0;
      return;
    }
    case GGMLType::Q2_K: {
      const uint8_t* p = row + (blk >> 3) * 84;
      const int n = int((blk >> 2) & 1), k = int(blk & 3);
      for (int l = 0; l < 32; ++l) {
        const uint8_t sc = p[8 * n + 2 * k + l / 16];
        w[l] = ((p[16 + 32 * n + l] >> (2 * k)) & 3) * (sc & 15);
        w2[l] = sc >> 4;
      }
      *a = h2f(p + 80), *off = 0, *a2 = -h2f(p + 82);
      return;
    }
    default:
      VQ_FAIL("weight type {} has no quantized product", ggml_type_name(t));
  }
}

}  // namespace

void quantize_rows_scalar(const float* x, int64_t M, int64_t cols, int8_t* q, float* d, float* s) {
  const int64_t nb = cols / 32;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      int8_t* qb = q + m * cols + b * 32;
      const float db = quantize_int8_block(x + m * cols + b * 32, qb);
      int32_t sum = 0;
      for (int i = 0; i < 32; ++i) sum += qb[i];
      d[m * nb + b] = db;
      s[m * nb + b] = db * float(sum);
    }
  }
}

void quant_rows_scalar(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X,
                       float* y, int64_t ldy) {
  const int64_t nb = X.cols / 32;
  int32_t w[32], w2[32] = {};
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = W + size_t(r) * rb;
    for (int64_t m = 0; m < X.M; ++m) {
      float acc = 0, accb = 0;
      for (int64_t b = 0; b < nb; ++b) {
        float a, off, a2;
        decode_block(GGMLType(type), row, b, w, &a, &off, w2, &a2);
        const int8_t* xq = X.q + m * X.cols + b * 32;
        int32_t dot = 0, dot2 = 0;
        for (int i = 0; i < 32; ++i) dot += w[i] * xq[i], dot2 += w2[i] * xq[i];
        acc += float(dot) * (a * X.d[m * nb + b]);
        if (a2 != 0.0f) acc += float(dot2) * (a2 * X.d[m * nb + b]);
        accb += off * X.s[m * nb + b];
      }
      y[m * ldy + r] = acc + accb;
    }
  }
}

void float_rows_scalar(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const float* x, int64_t M,
                       int64_t cols, float* y, int64_t ldy) {
  std::vector<float> w(static_cast<size_t>(cols));  // w: [cols] f32, one decoded weight row
  for (int64_t r = r0; r < r1; ++r) {
    dequantize_row(GGMLType(type), W + size_t(r) * rb, w.data(), cols);
    for (int64_t m = 0; m < M; ++m) {
      float s = 0;
      for (int64_t i = 0; i < cols; ++i) s += w[size_t(i)] * x[m * cols + i];
      y[m * ldy + r] = s;
    }
  }
}

}  // namespace vq
