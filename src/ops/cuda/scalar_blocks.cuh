#pragma once
// Internal to src/ops/cuda: llama.cpp's scalar blocks of 32 elements (codec/scalar_blocks.h
// has the layouts and the reference rounding) on the device, for the KV pool's direct methods
// (PagedElem, paged_attention_cuda.h): the writer of one row (a warp, element e = lane + 32*i,
// so block i is register i across the lanes) and the readers of 8 consecutive elements that the
// attention kernels use to fill their fp16 tiles in shared memory.
// Rounding is the CPU's bit for bit: the products and sums are written with __fmul_rn /
// __fadd_rn (no contraction into FMA) and the scale is an IEEE division, so the device's pool
// bytes equal the CPU store's.
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "ops/cuda/elem_type.h"

namespace vq::cuda::detail {

// Calls f(ScalarTag<E>{}) with the compile-time scalar type of e (q8_0, q4_0 or q5_0; the .cu files
// are C++17): the one place a launch picks its kernel instance per block type.
template <PagedElem E>
using ScalarTag = std::integral_constant<PagedElem, E>;
template <class F>
__host__ __device__ auto with_scalar_elem(PagedElem e, F&& f) {
  switch (e) {
    case PagedElem::q8_0: return f(ScalarTag<PagedElem::q8_0>{});
    case PagedElem::q4_0: return f(ScalarTag<PagedElem::q4_0>{});
    default: return f(ScalarTag<PagedElem::q5_0>{});
  }
}

// Bytes of one block of 32 elements (0: fp16 blocks, not this family).
__host__ __device__ constexpr int scalar_block_bytes(PagedElem e) {
  return e == PagedElem::q8_0 ? 34 : e == PagedElem::q4_0 ? 18 : e == PagedElem::q5_0 ? 22 : 0;
}
// Bytes of one K or V row of head_dim elements.
__host__ __device__ constexpr int scalar_row_bytes(PagedElem e, int head_dim) {
  return scalar_block_bytes(e) * (head_dim / 32);
}

// The element of largest magnitude with its sign, the lowest index on ties (the reference's
// strict "amax < |x|" scan), over the warp's lanes.
__device__ __forceinline__ float warp_signed_absmax(float x, int lane) {
  float a = fabsf(x), v = x;
  int idx = lane;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float a2 = __shfl_xor_sync(0xffffffffu, a, o), v2 = __shfl_xor_sync(0xffffffffu, v, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
    if (a2 > a || (a2 == a && i2 < idx)) a = a2, v = v2, idx = i2;
  }
  return a == 0.f ? 0.f : v;  // an all-zero block: the reference's max stays 0
}

// One block of 32 elements, element `lane` of it in x, written at dst (the whole warp calls).
template <PagedElem E>
__device__ __forceinline__ void quantize_block_warp(float x, int lane, uint8_t* dst) {
  if constexpr (E == PagedElem::q8_0) {
    float amax = fabsf(x);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f);
    const float id = d != 0.f ? __frcp_rn(d) : 0.f;
    dst[2 + lane] = uint8_t(int8_t(roundf(__fmul_rn(x, id))));
    if (lane == 0) *reinterpret_cast<__half*>(dst) = __float2half_rn(d);
  } else {
    constexpr int half = E == PagedElem::q5_0 ? 16 : 8, top = 2 * half - 1;
    const float d = __fdiv_rn(warp_signed_absmax(x, lane), float(-half));
    const float id = d != 0.f ? __frcp_rn(d) : 0.f;
    const int n = min(top, int(__fadd_rn(__fmul_rn(x, id), float(half) + 0.5f)));
    const int hi = __shfl_down_sync(0xffffffffu, n, 16);  // element lane + 16
    const int qs_off = E == PagedElem::q5_0 ? 6 : 2;
    if (lane < 16) dst[qs_off + lane] = uint8_t((n & 15) | ((hi & 15) << 4));
    if constexpr (E == PagedElem::q5_0) {
      const uint32_t qh = __ballot_sync(0xffffffffu, (n >> 4) & 1);
      if (lane == 0) {  // 2-byte aligned only: two halves
        reinterpret_cast<uint16_t*>(dst + 2)[0] = uint16_t(qh & 0xffffu);
        reinterpret_cast<uint16_t*>(dst + 2)[1] = uint16_t(qh >> 16);
      }
    }
    if (lane == 0) *reinterpret_cast<__half*>(dst) = __float2half_rn(d);
  }
}

// Elements [8c, 8c + 8) of the block at b (2-byte aligned, e.g. in shared memory) as fp16 pairs,
// each d * q rounded once to fp16 (the CPU's fp32 value d * q, exact since d has 11 significant bits
// and q at most 8, rounded to fp16). The integer codes become fp16
// without conversions: the half with bits 0x6400 | u is 1024 + u for a byte u, so
// (0x6400 | u) - (1024 + bias) is the code exactly; then one fp16 multiply per pair. The code
// bytes of 4 elements sit in one 32-bit word: q8_0's int8 codes biased by 128 (xor 0x80), q4_0's
// nibbles, q5_0's nibbles with their fifth bits spread to bit 4 of each byte.
template <PagedElem E>
__device__ __forceinline__ void dequantize8_h2(const uint8_t* b, int c, uint4& out) {
  uint32_t* o = reinterpret_cast<uint32_t*>(&out);
  const __half2 d2 = __half2half2(*reinterpret_cast<const __half*>(b));
  constexpr int qs_off = E == PagedElem::q5_0 ? 6 : 2;
  const uint16_t* q = reinterpret_cast<const uint16_t*>(b + qs_off + 8 * (E == PagedElem::q8_0 ? c : (c & 1)));
  uint32_t w[2] = {uint32_t(q[0]) | uint32_t(q[1]) << 16, uint32_t(q[2]) | uint32_t(q[3]) << 16};
  __half2 bias;
  if constexpr (E == PagedElem::q8_0) {
    w[0] ^= 0x80808080u, w[1] ^= 0x80808080u;  // int8 q -> q + 128
    bias = __float2half2_rn(1024.f + 128.f);
  } else {
    const int shift = c >= 2 ? 4 : 0;  // elements 16.. are the high nibbles
    w[0] = (w[0] >> shift) & 0x0f0f0f0fu, w[1] = (w[1] >> shift) & 0x0f0f0f0fu;
    if constexpr (E == PagedElem::q5_0) {
      const uint32_t qh = uint32_t(reinterpret_cast<const uint16_t*>(b + 2)[0]) |
                          uint32_t(reinterpret_cast<const uint16_t*>(b + 2)[1]) << 16;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        // bits 8c + 4k .. + 3 of qh to bit 4 of bytes 0..3 (the multiply copies bit e to bit 8e; no carries)
        const uint32_t x = (qh >> (8 * c + 4 * k)) & 0xfu;
        w[k] |= ((x * 0x00204081u) & 0x01010101u) << 4;
      }
      bias = __float2half2_rn(1024.f + 16.f);
    } else {
      bias = __float2half2_rn(1024.f + 8.f);
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const uint32_t lo = __byte_perm(w[k], 0x64646464u, 0x5140), hi = __byte_perm(w[k], 0x64646464u, 0x7362);
    __half2 a = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&lo), bias), d2);
    __half2 z = __hmul2(__hsub2(*reinterpret_cast<const __half2*>(&hi), bias), d2);
    o[2 * k] = *reinterpret_cast<uint32_t*>(&a);
    o[2 * k + 1] = *reinterpret_cast<uint32_t*>(&z);
  }
}

}  // namespace vq::cuda::detail
