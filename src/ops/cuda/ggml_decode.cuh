#pragma once
// Internal to src/ops/cuda: device decoders of the GGUF weight blocks, one group of 32 elements
// at a time (a whole block of the 32-element types, one sub-block of the 256-element K-quants).
// Layouts: model/quant_blocks.h. Each element is computed with the CPU decoder's formula
// (model/weight_formats.cpp) in the same grouping, with explicitly rounded operations
// (__fmul_rn / __fadd_rn / __fsub_rn) so that nvcc cannot contract them into FMAs: the result
// is bit-identical to vq::dequantize_row. Blocks are read with byte/2-byte loads because GGUF
// blocks of 18, 20, 22, 34 bytes are not 4-byte aligned.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/weights_cuda.h"

namespace vq::cuda::detail {

__device__ __forceinline__ float ld_half(const uint8_t* p) {
  return __half2float(__ushort_as_half(uint16_t(p[0]) | uint16_t(p[1]) << 8));
}
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
// 6-bit scale and min of sub-block j of a Q4_K / Q5_K super-block (same as blocks::k_scale_min).
__device__ __forceinline__ void k_scale_min_dev(const uint8_t* sc, int j, int& s, int& m) {
  if (j < 4) {
    s = sc[j] & 63;
    m = sc[j + 4] & 63;
  } else {
    s = (sc[j + 4] & 15) | ((sc[j - 4] >> 6) << 4);
    m = (sc[j + 4] >> 4) | ((sc[j] >> 6) << 4);
  }
}

// Bytes of one block and groups of 32 elements in it, per block type.
template <uint32_t T>
constexpr size_t kBlockBytes = T == ggml::Q8_0   ? 34
                               : T == ggml::Q4_0 ? 18
                               : T == ggml::Q4_1 ? 20
                               : T == ggml::Q5_0 ? 22
                               : T == ggml::Q5_1 ? 24
                               : T == ggml::Q4_K ? 144
                               : T == ggml::Q5_K ? 176
                                                 : 210;
template <uint32_t T>
constexpr int kGroupsPerBlock = (T == ggml::Q4_K || T == ggml::Q5_K || T == ggml::Q6_K) ? 8 : 1;

// Decodes group j (elements 32j .. 32j+31) of the block at `b` into y. T: a block type id
// (ggml::Q8_0 .. ggml::Q6_K); j = 0 for the 32-element types.
template <uint32_t T>
__device__ __forceinline__ void decode_group(const uint8_t* b, int j, float (&y)[32]) {
  if constexpr (T == ggml::Q8_0) {
    const float d = ld_half(b);
#pragma unroll
    for (int i = 0; i < 32; ++i) y[i] = __fmul_rn(d, float(int8_t(b[2 + i])));
  } else if constexpr (T == ggml::Q4_0) {
    const float d = ld_half(b);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      y[i] = __fmul_rn(d, float(int(b[2 + i] & 15) - 8));
      y[i + 16] = __fmul_rn(d, float(int(b[2 + i] >> 4) - 8));
    }
  } else if constexpr (T == ggml::Q4_1) {
    const float d = ld_half(b), m = ld_half(b + 2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      y[i] = __fadd_rn(__fmul_rn(d, float(b[4 + i] & 15)), m);
      y[i + 16] = __fadd_rn(__fmul_rn(d, float(b[4 + i] >> 4)), m);
    }
  } else if constexpr (T == ggml::Q5_0) {
    const float d = ld_half(b);
    const uint32_t qh = ld_u32(b + 2);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int lo = (b[6 + i] & 15) | int((qh >> i) & 1) << 4;
      const int hi = (b[6 + i] >> 4) | int((qh >> (i + 16)) & 1) << 4;
      y[i] = __fmul_rn(d, float(lo - 16));
      y[i + 16] = __fmul_rn(d, float(hi - 16));
    }
  } else if constexpr (T == ggml::Q5_1) {
    const float d = ld_half(b), m = ld_half(b + 2);
    const uint32_t qh = ld_u32(b + 4);
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int lo = (b[8 + i] & 15) | int((qh >> i) & 1) << 4;
      const int hi = (b[8 + i] >> 4) | int((qh >> (i + 16)) & 1) << 4;
      y[i] = __fadd_rn(__fmul_rn(d, float(lo)), m);
      y[i + 16] = __fadd_rn(__fmul_rn(d, float(hi)), m);
    }
  } else if constexpr (T == ggml::Q4_K || T == ggml::Q5_K) {
    // sub-block j: nibble (j & 1) of qs[32 (j/2) + l]; Q5_K adds bit j of qh[l] as bit 4
    const float d = ld_half(b), dmin = ld_half(b + 2);
    int sc, mn;
    k_scale_min_dev(b + 4, j, sc, mn);
    const float a = __fmul_rn(d, float(sc)), o = __fmul_rn(dmin, float(mn));
    const uint8_t* qs = b + (T == ggml::Q5_K ? 48 : 16) + 32 * (j >> 1);
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      int q = (qs[l] >> shift) & 15;
      if constexpr (T == ggml::Q5_K) q |= ((b[16 + l] >> j) & 1) << 4;
      y[l] = __fsub_rn(__fmul_rn(a, float(q)), o);
    }
  } else if constexpr (T == ggml::Q6_K) {
    // sub-block j = 4n + k: elements 128n + 32k + l
    const int n = j >> 2, k = j & 3;
    const float d = ld_half(b + 208);
    const uint8_t* ql = b + 64 * n + 32 * (k & 1);
    const uint8_t* qh = b + 128 + 32 * n;
    const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192) + 8 * n + 2 * k;
    const float s0 = __fmul_rn(d, float(sc[0])), s1 = __fmul_rn(d, float(sc[1]));
#pragma unroll
    for (int l = 0; l < 32; ++l) {
      const int lo = (ql[l] >> (4 * (k >> 1))) & 15;
      const int hi = (qh[l] >> (2 * k)) & 3;
      y[l] = __fmul_rn(l < 16 ? s0 : s1, float((lo | hi << 4) - 32));
    }
  }
}

// Element i of a float-typed row (F32, F16, BF16), as f32.
template <uint32_t T>
__device__ __forceinline__ float decode_float_elem(const uint8_t* row, int64_t i) {
  if constexpr (T == ggml::F32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (T == ggml::F16) {
    return __half2float(reinterpret_cast<const __half*>(row)[i]);
  } else {
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[i]);
  }
}

// Calls f(std::integral_constant-like tag) with T fixed to the runtime type id: one template
// instantiation per supported type. Returns false for an unsupported id.
template <uint32_t V>
struct TypeTag {
  static constexpr uint32_t value = V;
};
template <class F>
bool dispatch_block_type(uint32_t type, F&& f) {
  switch (type) {
    case ggml::Q8_0: f(TypeTag<ggml::Q8_0>{}); return true;
    case ggml::Q4_0: f(TypeTag<ggml::Q4_0>{}); return true;
    case ggml::Q4_1: f(TypeTag<ggml::Q4_1>{}); return true;
    case ggml::Q5_0: f(TypeTag<ggml::Q5_0>{}); return true;
    case ggml::Q5_1: f(TypeTag<ggml::Q5_1>{}); return true;
    case ggml::Q4_K: f(TypeTag<ggml::Q4_K>{}); return true;
    case ggml::Q5_K: f(TypeTag<ggml::Q5_K>{}); return true;
    case ggml::Q6_K: f(TypeTag<ggml::Q6_K>{}); return true;
    default: return false;
  }
}
template <class F>
bool dispatch_float_type(uint32_t type, F&& f) {
  switch (type) {
    case ggml::F32: f(TypeTag<ggml::F32>{}); return true;
    case ggml::F16: f(TypeTag<ggml::F16>{}); return true;
    case ggml::BF16: f(TypeTag<ggml::BF16>{}); return true;
    default: return false;
  }
}

// Stores v as the output element type E (0 = f32, 1 = f16, 2 = bf16), round-to-nearest-even.
template <int E>
__device__ __forceinline__ void store_elem(void* out, int64_t i, float v) {
  if constexpr (E == 0) {
    static_cast<float*>(out)[i] = v;
  } else if constexpr (E == 1) {
    static_cast<__half*>(out)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
  }
}

// Stores 32 consecutive outputs at element o (out + o 16-byte aligned) with 16-byte stores.
template <int E>
__device__ __forceinline__ void store_group(void* out, int64_t o, const float (&y)[32]) {
  if constexpr (E == 0) {
    float4* d = reinterpret_cast<float4*>(static_cast<float*>(out) + o);
#pragma unroll
    for (int i = 0; i < 8; ++i) d[i] = make_float4(y[4 * i], y[4 * i + 1], y[4 * i + 2], y[4 * i + 3]);
  } else {
    uint32_t w[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      if constexpr (E == 1) {
        const __half2 h = __floats2half2_rn(y[2 * i], y[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&h);
      } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(y[2 * i], y[2 * i + 1]);
        w[i] = *reinterpret_cast<const uint32_t*>(&h);
      }
    }
    uint4* d = reinterpret_cast<uint4*>(static_cast<uint16_t*>(out) + o);
#pragma unroll
    for (int i = 0; i < 4; ++i) d[i] = make_uint4(w[4 * i], w[4 * i + 1], w[4 * i + 2], w[4 * i + 3]);
  }
}

}  // namespace vq::cuda::detail
