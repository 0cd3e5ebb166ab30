#pragma once
// Internal interface between the threaded products (matmul.cpp) and the per-target kernels
// (matmul_kernels.cpp, Highway dispatch) or their portable scalar versions (matmul_scalar.cpp).
// A kernel computes y[m * ldy + r] for rows r in [r0, r1) and every activation row m.
#include <cstddef>
#include <cstdint>

#include "model/weight_formats.h"

namespace vq {

// x: [M, cols] f32 (cols % 32 == 0) -> q: [M, cols] int8, d, s: [M, cols/32] f32.
void quantize_rows_kernel(const float* x, int64_t M, int64_t cols, int8_t* q, float* d, float* s);
// Quantized weight types (q8_0, q4_0, q4_1, q5_0, q5_1, q2_K, q3_K, q4_K, q5_K, q6_K); W rows rb bytes apart.
void quant_rows_kernel(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X,
                       float* y, int64_t ldy);
// Float weight types (f32, f16, bf16); x: [M, cols] f32.
void float_rows_kernel(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const float* x,
                       int64_t M, int64_t cols, float* y, int64_t ldy);

// Portable versions (same arithmetic: int32 block sums, float scales).
void quantize_rows_scalar(const float* x, int64_t M, int64_t cols, int8_t* q, float* d, float* s);
void quant_rows_scalar(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X,
                       float* y, int64_t ldy);
void float_rows_scalar(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const float* x, int64_t M,
                       int64_t cols, float* y, int64_t ldy);

}  // namespace vq
