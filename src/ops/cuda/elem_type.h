#pragma once
// Element types of device tensors (no CUDA types here).
#include <cstddef>

namespace vq::cuda {

enum class ElemType { f32, f16, bf16 };

inline size_t elem_bytes(ElemType t) { return t == ElemType::f32 ? 4 : 2; }
inline const char* elem_type_name(ElemType t) {
  return t == ElemType::f32 ? "f32" : t == ElemType::f16 ? "f16" : "bf16";
}

}  // namespace vq::cuda
