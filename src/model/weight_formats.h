#pragma once
// GGML tensor element types as stored in GGUF files, and products on packed weights.
// Block layouts follow the GGUF/GGML specification; see weight_formats.cpp.
#include <cstddef>
#include <cstdint>
#include <string>

namespace vq {

enum class GGMLType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28, BF16 = 30,
};

std::string ggml_type_name(GGMLType t);       // "q4_K", ... or "type(N)" when unknown
bool ggml_type_supported(GGMLType t);         // can be decoded and multiplied here
int64_t ggml_block_elems(GGMLType t);         // elements per block (1 for F32/F16/BF16)
size_t ggml_block_bytes(GGMLType t);          // bytes per block
// Bytes of one row of n elements; throws naming the type when n is not a multiple of the block.
size_t ggml_row_bytes(GGMLType t, int64_t n);

// Index of the first of n elements (n a multiple of the block size) of type t whose value can be
// NaN or inf, or -1 when there is none: the values of the float types, the fp16 scales (and
// mins) of the quantized ones, whose codes are integers. For a block scale the index is the
// block's first element. Reads every float value but only 2-4 bytes per quantized block.
int64_t find_non_finite(GGMLType t, const void* data, int64_t n);

// Decodes one row of n elements (n a multiple of the block size) into float32.
void dequantize_row(GGMLType t, const void* src, float* dst, int64_t n);

// y[M, rows] = x[M, cols] @ W^T, W: [rows, cols] in type t, row-major, rows packed back to back
// (ggml_row_bytes(t, cols) each). Blocks are decoded on the fly; threads over rows.
void matmul(GGMLType t, const void* W, int64_t rows, int64_t cols, const float* x, int64_t M, float* y);

// Scalar reference of matmul: dequantize_row then a float64-accumulated dot (slow; for tests).
void matmul_ref(GGMLType t, const void* W, int64_t rows, int64_t cols, const float* x, int64_t M, float* y);

// Encodes one row of n floats (n a multiple of the block size) into type t with plain
// round-to-nearest quantizers (min/max or absmax per block, 6-bit K-quant scales relative to
// the super-block maxima). Used to write GGUF files in tests and tools; not an optimal
// (error-minimising) quantizer like llama.cpp's.
void quantize_row(GGMLType t, const float* src, void* dst, int64_t n);

// Activations quantized for the integer products: x rows cut into blocks of 32, each stored as
// int8 values q (|q| <= 127) with scale d and s = d * sum(q), so x ~= d * q per block.
// Quantize once and reuse for several weights with the same input (q, k, v; gate, up).
struct QuantizedRows {
  int64_t M = 0, cols = 0;   // cols: a multiple of 32
  int8_t* q = nullptr;       // q: [M, cols] int8, row-major
  float* d = nullptr;        // d: [M, cols/32] f32
  float* s = nullptr;        // s: [M, cols/32] f32
  const float* x = nullptr;  // the float rows [M, cols] (used by the f32/f16/bf16 weights)
};
// Owning storage for QuantizedRows (64-byte aligned); reuses its memory across calls.
class ActivationBuffer {
 public:
  ActivationBuffer();
  ~ActivationBuffer();
  ActivationBuffer(const ActivationBuffer&) = delete;
  ActivationBuffer& operator=(const ActivationBuffer&) = delete;
  // Quantizes x [M, cols] (cols a multiple of 32); x must stay valid while the result is used.
  const QuantizedRows& quantize(const float* x, int64_t M, int64_t cols);
  const QuantizedRows& rows() const { return rows_; }

 private:
  struct Storage;
  Storage* st_;
  QuantizedRows rows_;
};
// y[M, rows] = X @ W^T with X quantized by ActivationBuffer (cols must equal X.cols).
void matmul_q(GGMLType t, const void* W, int64_t rows, int64_t cols, const QuantizedRows& X, float* y);

// Several weights applied to the same activations in one threaded pass (e.g. q, k, v or gate,
// up): the rows of all weights are split across threads together, so the pool is woken once.
struct MatmulJob {
  GGMLType type;
  const void* W;  // [rows, cols] packed in `type`
  int64_t rows;
  float* y;       // [M, rows] f32 out
};
void matmul_q_multi(const MatmulJob* jobs, int n_jobs, int64_t cols, const QuantizedRows& X);

}  // namespace vq
