#pragma once
// Block layouts of the GGML quantized types (GGUF specification). All little-endian, packed
// (no padding), blocks stored back to back along a row. "d"/"m"/"dmin" are IEEE fp16 bits.
//   Q8_0 (32 elems, 34 B):  d | int8 qs[32]                      x_i = d * qs[i]
//   Q4_0 (32 elems, 18 B):  d | u8 qs[16]                        x_i = d * (q_i - 8)
//   Q4_1 (32 elems, 20 B):  d | m | u8 qs[16]                    x_i = d * q_i + m
//        q_i = qs[i] & 15 for i < 16, qs[i-16] >> 4 for i >= 16
//   Q5_0 (32 elems, 22 B):  d | u8 qh[4] | u8 qs[16]             x_i = d * (q_i - 16)
//   Q5_1 (32 elems, 24 B):  d | m | u8 qh[4] | u8 qs[16]         x_i = d * q_i + m
//        q_i = nibble_i (as Q4) | (bit i of the u32 qh) << 4
//   Q4_K (256 elems, 144 B): d | dmin | u8 scales[12] | u8 qs[128]
//        sub-block j (0..7) of 32 elems: x = (d * sc_j) * q - (dmin * m_j), sc/m 6-bit from scales:
//          j < 4: sc = scales[j] & 63, m = scales[j+4] & 63
//          j >= 4: sc = (scales[j+4] & 15) | (scales[j-4] >> 6) << 4, m = (scales[j+4] >> 4) | (scales[j] >> 6) << 4
//        element 64g + l (g 0..3, l 0..31) = qs[32g + l] & 15 (sub-block 2g); 64g + 32 + l = qs[32g + l] >> 4
//   Q5_K (256 elems, 176 B): d | dmin | u8 scales[12] | u8 qh[32] | u8 qs[128]
//        as Q4_K plus a fifth bit: element 64g + l adds ((qh[l] >> 2g) & 1) << 4, element 64g+32+l
//        adds ((qh[l] >> (2g+1)) & 1) << 4
//   Q6_K (256 elems, 210 B): u8 ql[128] | u8 qh[64] | int8 scales[16] | d
//        element 128n + 32k + l (n 0..1, k 0..3, l 0..31):
//          low 4 bits  = ql[64n + l + 32(k & 1)] >> (4 (k >> 1)) & 15
//          high 2 bits = (qh[32n + l] >> 2k) & 3
//          x = (d * scales[8n + 2k + l/16]) * (q - 32)
//   Q2_K (256 elems, 84 B): u8 scales[16] | u8 qs[64] | d | dmin
//        16 sub-blocks of 16; scales[i] = sc | m << 4 (4 bits each) for sub-block i.
//        element 128n + 32k + l (n 0..1, k 0..3, l 0..31): q = (qs[32n + l] >> 2k) & 3,
//          i = 8n + 2k + l/16, x = (d * sc_i) * q - (dmin * m_i)
//   Q3_K (256 elems, 110 B): u8 hmask[32] | u8 qs[64] | u8 scales[12] | d
//        element 128n + 32k + l: low = (qs[32n + l] >> 2k) & 3, high = (hmask[l] >> (4n + k)) & 1,
//          q = low - 4 * (1 - high) (-4..3), i = 8n + 2k + l/16, x = (d * (s_i - 32)) * q
//        s_i 6-bit: low 4 bits = scales[i] & 15 (i < 8) or scales[i - 8] >> 4 (i >= 8),
//          high 2 bits = (scales[8 + i % 4] >> 2 (i / 4)) & 3
#include <cstdint>

namespace vq::blocks {

constexpr int kQK = 32;    // elements per block of the 32-element types
constexpr int kQKK = 256;  // elements per super-block of the K-quants

struct BlockQ8_0 { uint16_t d; int8_t qs[32]; };
struct BlockQ4_0 { uint16_t d; uint8_t qs[16]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[16]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[16]; };
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[32]; uint8_t qs[128]; };
struct BlockQ6_K { uint8_t ql[128]; uint8_t qh[64]; int8_t scales[16]; uint16_t d; };
struct BlockQ2_K { uint8_t scales[16]; uint8_t qs[64]; uint16_t d, dmin; };
struct BlockQ3_K { uint8_t hmask[32]; uint8_t qs[64]; uint8_t scales[12]; uint16_t d; };

static_assert(sizeof(BlockQ8_0) == 34 && alignof(BlockQ8_0) == 2);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);

// 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block.
inline void k_scale_min(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
    *m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
  }
}

// Signed scale (s_i - 32, in -32..31) of sub-block i (0..15) of a Q3_K super-block.
inline int q3k_scale(const uint8_t* scales, int i) {
  const int lo = i < 8 ? scales[i] & 15 : scales[i - 8] >> 4;
  const int hi = (scales[8 + (i & 3)] >> (2 * (i >> 2))) & 3;
  return (lo | hi << 4) - 32;
}

}  // namespace vq::blocks
