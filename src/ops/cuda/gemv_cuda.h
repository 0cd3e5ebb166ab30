#pragma once
// Native quantized matrix-vector products on the GPU (vq::cuda) for decode: y[m, rows] = X W^T
// with 1..8 activation rows, reading the quantized weight bytes (Q8_0, Q4_1, Q4_K) instead of
// an fp16 copy, so that a decode step moves 0.56-1.06 bytes per weight instead of 2.
//
// Numerics follow the CPU's quantized product (vq::matmul_q): the activations are quantized in
// blocks of 32 to int8 with one scale (quantize_act_device, the same rounding as the CPU's
// ActivationBuffer), the block dot products are exact integer sums (dp4a), and the block scales
// are applied in fp32. Results equal matmul_q up to the order of the fp32 additions.
// No CUDA types here; streams are `void*` (cudaStream_t; nullptr = default stream). Every call
// is asynchronous, allocates nothing and does not synchronize: safe inside CUDA-graph capture.
#include <cstddef>
#include <cstdint>

#include "ops/cuda/elem_type.h"

namespace vq::cuda {

constexpr int kGemvMaxRows = 8;  // activation rows per call

// Q8_0, Q4_1 and Q4_K (ggml:: ids in weights_cuda.h).
bool gemv_type_supported(uint32_t type);

// ---- Weight layout for the product (made once, at load, on the device) ----
// Q4_K: the GGUF bytes unchanged (144-byte super-blocks are 16-byte aligned).
// Q8_0: [rows, cols] int8 quants, then [rows, cols/32] fp16 scales (34-byte blocks are not even
//       4-byte aligned; split, a lane reads its 32 quants with two 16-byte loads).
// Q4_1: [rows, cols/2] nibble bytes (GGUF order within a block), then [rows, cols/32] (d, m)
//       fp16 pairs.
// Sizes: gemv_packed_bytes (equal to the GGUF bytes for all three).
size_t gemv_packed_bytes(uint32_t type, int64_t rows, int64_t cols);
struct GemvPackParams {
  uint32_t type = 0;
  const void* src = nullptr;  // [rows] GGUF rows of the type (device)
  int64_t rows = 0, cols = 0; // cols: a multiple of 256 for Q4_K, of 32 otherwise
  void* dst = nullptr;        // gemv_packed_bytes(type, rows, cols) bytes, 16-byte aligned (device)
};
void gemv_pack_device(const GemvPackParams& p, void* stream = nullptr);

// ---- Activations: x [rows, cols] -> int8 blocks of 32, as vq::ActivationBuffer ----
// Per block: d = amax / 127, q = round-to-nearest-even(x * (127 / amax)) (0 when amax = 0),
// s = d * sum(q).
struct QuantizeActParams {
  int rows = 0;
  int64_t cols = 0;            // a multiple of 32
  ElemType x_type = ElemType::f32;  // f32 or f16
  const void* x = nullptr;     // row i at x + i*x_stride elements (device)
  int64_t x_stride = 0;        // 0: cols
  int8_t* q = nullptr;         // [rows, cols] (device, 16-byte aligned)
  float* d = nullptr;          // [rows, cols/32]
  float* s = nullptr;          // [rows, cols/32]
};
void quantize_act_device(const QuantizeActParams& p, void* stream = nullptr);

// ---- Back from int8 blocks: out = d * q (f32 or f16) ----
// The CPU multiplies quantized weights with int8-rounded activations (vq::matmul_q); the device
// products that read float activations (cuBLAS, the fp16 GEMV) take these dequantized rows for
// quantized weights, so that their results follow the CPU's (and llama.cpp's) rounding.
struct DequantizeActParams {
  int rows = 0;
  int64_t cols = 0;            // a multiple of 32
  const int8_t* q = nullptr;   // [rows, cols]
  const float* d = nullptr;    // [rows, cols/32]
  ElemType out_type = ElemType::f16;  // f32 or f16
  void* out = nullptr;         // [rows, cols] packed
};
void dequantize_act_device(const DequantizeActParams& p, void* stream = nullptr);

// ---- The product ----
struct GemvParams {
  uint32_t type = 0;
  const void* w = nullptr;     // the packed weight (gemv_pack_device), [rows, cols]
  int64_t rows = 0, cols = 0;
  int m = 1;                   // activation rows, 1..kGemvMaxRows
  const int8_t* xq = nullptr;  // [m, cols]      (quantize_act_device with rows = m)
  const float* xd = nullptr;   // [m, cols/32]
  const float* xs = nullptr;   // [m, cols/32]
  float* y = nullptr;          // y[i, r] at y + i*y_stride + r (device)
  int64_t y_stride = 0;        // 0: rows
  bool accumulate = false;     // y += X W^T (fuses the residual add after wo / w_down)
  // One block shape for every m (the batch-invariant mode): a row's result is then bit-identical
  // whatever m is (the fastest shapes differ between m <= 2 and more, and so would q4_K's sums).
  bool row_invariant = false;
};
void gemv_device(const GemvParams& p, void* stream = nullptr);

// Whether the quantized product (with its activation quantization) beat the fp16 cuBLAS product
// (gemm_cuda.h) for this type and activation row count on the H200's large projections
// (docs/CUDA_NOTES.md section 8): q8_0 and q4_1 for m <= 4, q4_K for m <= 2. Take the quantized
// path where true, the fp16 copy otherwise (prefill, larger batches).
bool gemv_preferred(uint32_t type, int m);

// ---- fp16 weights (fp16 models, or the fp16 copy of any model) for 1..4 activation rows ----
// y[i, r] (+)= sum_k x[i, k] W[r, k], x in f32, fp32 accumulation. A warp owns 2 weight rows and
// streams them with 16-byte loads (decode is bound by the weight bytes; cuBLAS reaches ~3.1 TB/s
// at m = 1 on the H200, docs/CUDA_NOTES.md section 8). cols: a multiple of 8.
constexpr int kGemvF16MaxRows = 4;
struct GemvF16Params {
  const void* w = nullptr;     // [rows, cols] fp16, row-major, 16-byte aligned rows
  int64_t rows = 0, cols = 0;
  int m = 1;                   // 1..kGemvF16MaxRows
  const float* x = nullptr;    // row i at x + i*x_stride (16-byte aligned)
  int64_t x_stride = 0;        // 0: cols
  float* y = nullptr;          // y[i, r] at y + i*y_stride + r
  int64_t y_stride = 0;        // 0: rows
  bool accumulate = false;
};
void gemv_f16_device(const GemvF16Params& p, void* stream = nullptr);

}  // namespace vq::cuda
