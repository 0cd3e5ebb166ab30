#pragma once
// Element types of device tensors (no CUDA types here).
#include <cstddef>

namespace vq::cuda {

enum class ElemType { f32, f16, bf16 };

// The element form of a KV pool block of an all-dense layer (PagedRule::elem, KVAppendParams::elem):
// fp16 (keys channel-major [H][D][B], values [H][B][D]) or one of llama.cpp's scalar blocks of 32
// elements, the blocks of the store's direct methods (q8_0, q4_0 and q4_0h, q5_0:
// kvcache/methods), token-major [2 (K, V)][H][B][D/32 blocks]. The attention kernels dequantize
// the latter into their fp16 tiles in shared memory.
enum class PagedElem : int { f16 = 0, q8_0 = 1, q4_0 = 2, q5_0 = 3 };

inline size_t elem_bytes(ElemType t) { return t == ElemType::f32 ? 4 : 2; }
inline const char* elem_type_name(ElemType t) {
  return t == ElemType::f32 ? "f32" : t == ElemType::f16 ? "f16" : "bf16";
}

}  // namespace vq::cuda
