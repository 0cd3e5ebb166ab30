#pragma once
// llama.cpp's scalar block formats of 32 elements, one implementation shared by the KV caches and
// the weight formats. q8_0 block (34 bytes): fp16 scale d, 32 int8; x = d*q. q4_0 block (18
// bytes): fp16 scale d, 16 bytes; byte j holds element j (low nibble) and element j+16 (high
// nibble); x = d*(nibble - 8).
#include <cstdint>

namespace vq {

void quantize_q8_0(const float* x, uint8_t* block);  // x: [32] -> block: [34] bytes
void quantize_q4_0(const float* x, uint8_t* block);  // x: [32] -> block: [18] bytes
void dequantize_q8_0(const uint8_t* block, float* x);
void dequantize_q4_0(const uint8_t* block, float* x);

}  // namespace vq
