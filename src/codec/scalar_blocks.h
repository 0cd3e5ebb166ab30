#pragma once
// llama.cpp's scalar block formats of 32 elements: the one implementation of each, shared by the
// KV caches (q8_0, q4_0), the GGUF weight formats (model/weight_formats, model/quant_encode) and
// the int8 activation quantizer of the weight products (model/matmul*).
//
// Layouts (little-endian, packed; d and m are fp16 bits):
//   q8_0 (34 B): d | int8 q[32]                    x_i = d * q_i
//   q4_0 (18 B): d | u8 qs[16]                     x_i = d * (n_i - 8)
//   q4_1 (20 B): d | m | u8 qs[16]                 x_i = d * n_i + m
//   q5_0 (22 B): d | u8 qh[4] | u8 qs[16]          x_i = d * (n_i - 16)
//   q5_1 (24 B): d | m | u8 qh[4] | u8 qs[16]      x_i = d * n_i + m
//   nibble n_i: qs[i] & 15 for i < 16, qs[i - 16] >> 4 for i >= 16; q5 adds bit i of the u32 qh
//   as bit 4.
//
// Rounding: that of llama.cpp's reference quantizers (ggml-quants.c quantize_row_*_ref), which
// define what these GGUF formats hold; gguf-py's NumPy quantizers reproduce them bit for bit and
// tests/python/test_block_formats.py checks ours against those. Scales are computed in f32 from
// the block's extremes, the codes from the f32 scale, and only the stored d, m are fp16:
//   q8_0: d = amax / 127,           q = roundf(x / d)                 (half away from zero)
//   q4_0: d = max / -8,             n = min(15, trunc(x / d + 8.5))   (max: the signed value of
//   q5_0: d = max / -16,            n = min(31, trunc(x / d + 16.5))   largest magnitude)
//   q4_1: d = (max - min) / 15,     n = min(15, trunc((x - min) / d + 0.5)), m = min
//   q5_1: d = (max - min) / 31,     n = min(31, trunc((x - min) / d + 0.5)), m = min
// where "x / d" is x times the f32 reciprocal 1/d (0 when d is 0), as in the reference.
#include <cstdint>

namespace vq {

// x: [32] f32 -> block bytes (34, 18, 20, 22, 24 respectively).
void quantize_q8_0(const float* x, uint8_t* block);
void quantize_q4_0(const float* x, uint8_t* block);
void quantize_q4_1(const float* x, uint8_t* block);
void quantize_q5_0(const float* x, uint8_t* block);
void quantize_q5_1(const float* x, uint8_t* block);
// block -> x: [32] f32.
void dequantize_q8_0(const uint8_t* block, float* x);
void dequantize_q4_0(const uint8_t* block, float* x);
void dequantize_q4_1(const uint8_t* block, float* x);
void dequantize_q5_0(const uint8_t* block, float* x);
void dequantize_q5_1(const uint8_t* block, float* x);

// The q8_0 rounding with an f32 scale (the activation blocks of the integer weight products):
// x: [32] f32 -> q: [32] int8 (|q| <= 127); returns d = amax / 127, x ~= d * q.
float quantize_int8_block(const float* x, int8_t* q);

}  // namespace vq
