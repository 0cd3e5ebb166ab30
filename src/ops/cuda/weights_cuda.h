#pragma once
// Model weights on the GPU (vq::cuda): GGUF tensors decoded on the device into fp16 / bf16 / f32
// matrices for the cuBLAS path (gemm_cuda.h). The native quantized products are in gemv_cuda.h.
// No CUDA types here: device pointers are plain pointers, streams are `void*` (a cudaStream_t;
// nullptr = the default stream). Every function throws vq::Error naming the op, the type and the
// shape when the arguments are unsupported or a CUDA call fails.
//
// Upload recipe (weights are uploaded once, at load): copy the tensor's bytes as they are in the
// GGUF file to a device staging buffer and decode them there (upload_dequantized does both), or
// keep the raw bytes on the device where a kernel reads them directly (embedding_device in
// llm_ops_cuda.h; gemv_pack_device in gemv_cuda.h).
#include <cstddef>
#include <cstdint>

#include "ops/cuda/elem_type.h"

namespace vq::cuda {

// GGUF tensor type ids: the values of vq::GGMLType (model/weight_formats.h; this layer sits
// below src/model, so it takes the id). These are the types the CPU decodes.
namespace ggml {
constexpr uint32_t F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13,
                   Q6_K = 14, BF16 = 30;
}

bool weight_type_supported(uint32_t type);  // one of the ids above
const char* weight_type_name(uint32_t type);  // "q4_K", ...; "unsupported" for others
int weight_block_elems(uint32_t type);       // 1 (F32, F16, BF16), 32 or 256 (K-quants)
size_t weight_block_bytes(uint32_t type);
// Bytes of one row of `cols` elements; throws unless the type is supported and cols is a
// positive multiple of its block.
size_t weight_row_bytes(uint32_t type, int64_t cols);

// out = the decoded matrix, element for element equal to vq::dequantize_row on the CPU (then
// rounded to nearest-even when out_type is f16 or bf16).
struct DequantParams {
  uint32_t type = 0;
  const void* src = nullptr;  // [rows] rows of weight_row_bytes(type, cols) bytes, back to back (device)
  int64_t rows = 0, cols = 0;
  ElemType out_type = ElemType::f16;
  void* out = nullptr;        // [rows, cols] out_type, row-major (device)
  int* overflow = nullptr;    // optional device int, set to 1 where a finite value becomes +-inf in f16
};
void dequantize_device(const DequantParams& p, void* stream = nullptr);

// Host bytes (e.g. the memory-mapped GGUF tensor) -> staging (device) -> decoded `out`. Waits for
// the stream, then throws naming `name` if a value overflowed fp16 (upload that tensor as bf16 or
// f32 instead). staging: at least rows * weight_row_bytes(type, cols) device bytes, reusable for
// the next tensor; overflow_flag: one device int of scratch.
struct UploadParams {
  const char* name = "";      // tensor name for error messages
  uint32_t type = 0;
  const void* host = nullptr; // [rows] raw rows (host memory)
  int64_t rows = 0, cols = 0;
  void* staging = nullptr;
  size_t staging_bytes = 0;
  int* overflow_flag = nullptr;
  ElemType out_type = ElemType::f16;
  void* out = nullptr;        // [rows, cols] out_type (device)
};
void upload_dequantized(const UploadParams& p, void* stream = nullptr);

}  // namespace vq::cuda
