// Type table, row sizes and the scalar reference decoder of the GGML weight types. Block
// layouts are documented in quant_blocks.h. The decoder is exact: each element is computed
// with the formula of its type in float32, in the grouping written in quant_blocks.h. The
// 32-element formats share their decoders with the KV caches (codec/scalar_blocks.h).
#include "model/weight_formats.h"

#include <cstring>
#include <vector>

#include "codec/scalar_blocks.h"
#include "core/error.h"
#include "core/fp16.h"
#include "model/quant_blocks.h"

namespace vq {

namespace {

struct TypeInfo {
  const char* name;
  int64_t block_elems;
  size_t block_bytes;  // 0: unknown layout
  bool supported;
};

// Layouts of the GGML types we can at least size (so that files holding them can be listed and
// their tensor data bounds-checked); only `supported` ones can be decoded and multiplied.
TypeInfo type_info(GGMLType t) {
  switch (uint32_t(t)) {
    case 0: return {"f32", 1, 4, true};
    case 1: return {"f16", 1, 2, true};
    case 2: return {"q4_0", 32, 18, true};
    case 3: return {"q4_1", 32, 20, true};
    case 6: return {"q5_0", 32, 22, true};
    case 7: return {"q5_1", 32, 24, true};
    case 8: return {"q8_0", 32, 34, true};
    case 9: return {"q8_1", 32, 36, false};
    case 10: return {"q2_K", 256, 84, true};
    case 11: return {"q3_K", 256, 110, true};
    case 12: return {"q4_K", 256, 144, true};
    case 13: return {"q5_K", 256, 176, true};
    case 14: return {"q6_K", 256, 210, true};
    case 15: return {"q8_K", 256, 292, false};
    case 16: return {"iq2_xxs", 256, 66, false};
    case 17: return {"iq2_xs", 256, 74, false};
    case 18: return {"iq3_xxs", 256, 98, false};
    case 19: return {"iq1_s", 256, 50, false};
    case 20: return {"iq4_nl", 32, 18, false};
    case 21: return {"iq3_s", 256, 110, false};
    case 22: return {"iq2_s", 256, 82, false};
    case 23: return {"iq4_xs", 256, 136, false};
    case 24: return {"i8", 1, 1, false};
    case 25: return {"i16", 1, 2, false};
    case 26: return {"i32", 1, 4, false};
    case 27: return {"i64", 1, 8, false};
    case 28: return {"f64", 1, 8, false};
    case 29: return {"iq1_m", 256, 56, false};
    case 30: return {"bf16", 1, 2, true};
    case 34: return {"tq1_0", 256, 54, false};
    case 35: return {"tq2_0", 256, 66, false};
    default: return {nullptr, 0, 0, false};
  }
}

inline uint16_t ld16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float ldh(const uint8_t* p) { return f16_to_f32(ld16(p)); }

void check_row(GGMLType t, int64_t n) {
  const TypeInfo ti = type_info(t);
  if (!ti.supported) VQ_FAIL("weight type {} ({}) is not supported", ggml_type_name(t), uint32_t(t));
  VQ_CHECK(n >= 0 && n % ti.block_elems == 0, "row of {} elements is not a multiple of the {} block size {}", n,
           ti.name, ti.block_elems);
}

// --- one block of each type -> 32 or 256 floats

// (the 32-element formats q8_0, q4_0, q4_1, q5_0, q5_1 decode through codec/scalar_blocks)
void dq_q4_k(const uint8_t* b, float* y) {
  const float d = ldh(b), dmin = ldh(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  for (int g = 0; g < 4; ++g) {
    int sc0, m0, sc1, m1;
    blocks::k_scale_min(scales, 2 * g, &sc0, &m0);
    blocks::k_scale_min(scales, 2 * g + 1, &sc1, &m1);
    const float a0 = d * float(sc0), b0 = dmin * float(m0);
    const float a1 = d * float(sc1), b1 = dmin * float(m1);
    for (int l = 0; l < 32; ++l) {
      y[64 * g + l] = a0 * float(qs[32 * g + l] & 15) - b0;
      y[64 * g + 32 + l] = a1 * float(qs[32 * g + l] >> 4) - b1;
    }
  }
}
void dq_q5_k(const uint8_t* b, float* y) {
  const float d = ldh(b), dmin = ldh(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 48;
  for (int g = 0; g < 4; ++g) {
    int sc0, m0, sc1, m1;
    blocks::k_scale_min(scales, 2 * g, &sc0, &m0);
    blocks::k_scale_min(scales, 2 * g + 1, &sc1, &m1);
    const float a0 = d * float(sc0), b0 = dmin * float(m0);
    const float a1 = d * float(sc1), b1 = dmin * float(m1);
    for (int l = 0; l < 32; ++l) {
      const int q0 = (qs[32 * g + l] & 15) | ((qh[l] >> (2 * g)) & 1) << 4;
      const int q1 = (qs[32 * g + l] >> 4) | ((qh[l] >> (2 * g + 1)) & 1) << 4;
      y[64 * g + l] = a0 * float(q0) - b0;
      y[64 * g + 32 + l] = a1 * float(q1) - b1;
    }
  }
}
void dq_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = ldh(b + 208);
  for (int n = 0; n < 2; ++n) {
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < 32; ++l) {
        const int lo = (ql[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
        const int hi = (qh[32 * n + l] >> (2 * k)) & 3;
        const float s = d * float(sc[8 * n + 2 * k + l / 16]);
        y[128 * n + 32 * k + l] = s * float((lo | hi << 4) - 32);
      }
    }
  }
}
void dq_q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + 16;
  const float d = ldh(b + 80), dmin = ldh(b + 82);
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int i = 8 * n + 2 * k + l / 16;
        const int q = (qs[32 * n + l] >> (2 * k)) & 3;
        y[128 * n + 32 * k + l] = (d * float(scales[i] & 15)) * float(q) - dmin * float(scales[i] >> 4);
      }
}
void dq_q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + 32;
  const uint8_t* scales = b + 96;
  const float d = ldh(b + 108);
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int i = 8 * n + 2 * k + l / 16;
        const int lo = (qs[32 * n + l] >> (2 * k)) & 3, hi = (hmask[l] >> (4 * n + k)) & 1;
        y[128 * n + 32 * k + l] = (d * float(blocks::q3k_scale(scales, i))) * float(lo - 4 * (1 - hi));
      }
}

}  // namespace

std::string ggml_type_name(GGMLType t) {
  const TypeInfo ti = type_info(t);
  return ti.name ? std::string(ti.name) : "type(" + std::to_string(uint32_t(t)) + ")";
}

bool ggml_type_supported(GGMLType t) { return type_info(t).supported; }
int64_t ggml_block_elems(GGMLType t) { return type_info(t).block_elems; }
size_t ggml_block_bytes(GGMLType t) { return type_info(t).block_bytes; }

size_t ggml_row_bytes(GGMLType t, int64_t n) {
  const TypeInfo ti = type_info(t);
  VQ_CHECK(ti.block_bytes != 0, "weight type {} has no known block layout", ggml_type_name(t));
  VQ_CHECK(n >= 0 && n % ti.block_elems == 0, "row of {} elements is not a multiple of the {} block size {}", n,
           ti.name, ti.block_elems);
  return size_t(n / ti.block_elems) * ti.block_bytes;
}

namespace {
bool f16_non_finite(const uint8_t* p) { return (ld16(p) & 0x7c00) == 0x7c00; }
}  // namespace

int64_t find_non_finite(GGMLType t, const void* data, int64_t n) {
  check_row(t, n);
  const uint8_t* p = static_cast<const uint8_t*>(data);
  switch (t) {
    case GGMLType::F32:
      for (int64_t i = 0; i < n; ++i) {
        uint32_t u;
        std::memcpy(&u, p + 4 * i, 4);
        if ((u & 0x7f800000u) == 0x7f800000u) return i;
      }
      return -1;
    case GGMLType::F16:
      for (int64_t i = 0; i < n; ++i)
        if (f16_non_finite(p + 2 * i)) return i;
      return -1;
    case GGMLType::BF16:
      for (int64_t i = 0; i < n; ++i)
        if ((ld16(p + 2 * i) & 0x7f80) == 0x7f80) return i;
      return -1;
    default: break;
  }
  // Byte offsets of the fp16 scale fields in a block (quant_blocks.h): d, and m / dmin if any.
  int first = 0, second = -1;
  switch (t) {
    case GGMLType::Q4_1: case GGMLType::Q5_1: case GGMLType::Q4_K: case GGMLType::Q5_K: second = 2; break;
    case GGMLType::Q6_K: first = 208; break;
    case GGMLType::Q2_K: first = 80, second = 82; break;
    case GGMLType::Q3_K: first = 108; break;
    default: break;  // q8_0, q4_0, q5_0: d only
  }
  const TypeInfo ti = type_info(t);
  for (int64_t b = 0; b < n / ti.block_elems; ++b) {
    const uint8_t* blk = p + size_t(b) * ti.block_bytes;
    if (f16_non_finite(blk + first) || (second >= 0 && f16_non_finite(blk + second))) return b * ti.block_elems;
  }
  return -1;
}

void dequantize_row(GGMLType t, const void* src, float* dst, int64_t n) {
  check_row(t, n);
  const uint8_t* p = static_cast<const uint8_t*>(src);
  const TypeInfo ti = type_info(t);
  const int64_t nb = n / ti.block_elems;
  void (*fn)(const uint8_t*, float*) = nullptr;
  switch (t) {
    case GGMLType::F32: std::memcpy(dst, p, size_t(n) * 4); return;
    case GGMLType::F16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(ld16(p + 2 * i));
      return;
    case GGMLType::BF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(ld16(p + 2 * i));
      return;
    case GGMLType::Q8_0: fn = dequantize_q8_0; break;
    case GGMLType::Q4_0: fn = dequantize_q4_0; break;
    case GGMLType::Q4_1: fn = dequantize_q4_1; break;
    case GGMLType::Q5_0: fn = dequantize_q5_0; break;
    case GGMLType::Q5_1: fn = dequantize_q5_1; break;
    case GGMLType::Q4_K: fn = dq_q4_k; break;
    case GGMLType::Q5_K: fn = dq_q5_k; break;
    case GGMLType::Q6_K: fn = dq_q6_k; break;
    case GGMLType::Q2_K: fn = dq_q2_k; break;
    case GGMLType::Q3_K: fn = dq_q3_k; break;
    default: VQ_FAIL("weight type {} is not supported", ggml_type_name(t));
  }
  for (int64_t b = 0; b < nb; ++b) fn(p + size_t(b) * ti.block_bytes, dst + b * ti.block_elems);
}

void matmul_ref(GGMLType t, const void* W, int64_t rows, int64_t cols, const float* x, int64_t M, float* y) {
  check_row(t, cols);
  const size_t rb = ggml_row_bytes(t, cols);
  std::vector<float> w(static_cast<size_t>(cols));  // w: [cols] f32, one decoded weight row
  for (int64_t r = 0; r < rows; ++r) {
    dequantize_row(t, static_cast<const uint8_t*>(W) + size_t(r) * rb, w.data(), cols);
    for (int64_t m = 0; m < M; ++m) {
      double s = 0;
      for (int64_t k = 0; k < cols; ++k) s += double(w[size_t(k)]) * double(x[m * cols + k]);
      y[m * rows + r] = float(s);
    }
  }
}

}  // namespace vq
