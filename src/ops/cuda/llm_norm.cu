// RMSNorm, gated activations, residual add and casts (llm_ops_cuda.h).
// All memory-bound: each kernel reads its inputs once (RMSNorm twice, the second time from
// L1/L2) and writes once; rows of 4-aligned length and strides use 16-byte accesses.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <initializer_list>
#include <utility>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/ggml_decode.cuh"
#include "ops/cuda/llm_ops_cuda.h"
#include "ops/cuda/pdl.cuh"

namespace vq::cuda {
namespace {

constexpr int kThreads = 256;

// Four consecutive f32 stored as E (0 f32, 1 f16, 2 bf16) at element i (16-byte / 8-byte aligned).
template <int E>
__device__ __forceinline__ void store4(void* out, int64_t i, float4 v) {
  if constexpr (E == 0) {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + i) = v;
  } else if constexpr (E == 1) {
    const __half2 a = __floats2half2_rn(v.x, v.y), b = __floats2half2_rn(v.z, v.w);
    *reinterpret_cast<uint2*>(static_cast<__half*>(out) + i) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  } else {
    const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
    *reinterpret_cast<uint2*>(static_cast<__nv_bfloat16*>(out) + i) =
        make_uint2(*reinterpret_cast<const uint32_t*>(&a), *reinterpret_cast<const uint32_t*>(&b));
  }
}

template <class F>
void dispatch_elem(ElemType e, F&& f) {
  if (e == ElemType::f32) f(std::integral_constant<int, 0>{});
  else if (e == ElemType::f16) f(std::integral_constant<int, 1>{});
  else f(std::integral_constant<int, 2>{});
}

bool aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

unsigned grid_for(int64_t work, int per_block) {
  return unsigned(std::clamp<int64_t>((work + per_block - 1) / per_block, 1, 1 << 20));
}

// ---- RMSNorm ----
struct NormK {
  int64_t rows;  // n_tokens * n_heads
  int n_heads, n;
  const float* x;
  int64_t xs;
  const float* add;
  float* sum_out;
  const float* w;
  float eps;
  void* out;
  int64_t os;
};

// One row per `TPR` threads (a warp for short rows, the whole block for long ones). V: 4-wide.
template <int E, bool V, int TPR>
__global__ void __launch_bounds__(kThreads) rms_norm_kernel(NormK p) {
  constexpr int kRowsPerBlock = kThreads / TPR;
  __shared__ float red[kThreads / 32];
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int64_t row = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / TPR;
  const int tid = threadIdx.x % TPR;
  const bool live = row < p.rows;
  const int64_t t = live ? row / p.n_heads : 0, h = live ? row % p.n_heads : 0;
  const float* x = p.x + t * p.xs + h * p.n;
  const float* a = p.add ? p.add + t * p.xs + h * p.n : nullptr;
  float* so = p.add ? p.sum_out + t * p.xs + h * p.n : nullptr;
  constexpr int W = V ? 4 : 1;
  float ss = 0.f;
  if (live) {
    for (int i = tid * W; i < p.n; i += TPR * W) {
      if constexpr (V) {
        float4 v = *reinterpret_cast<const float4*>(x + i);
        if (a) {
          const float4 b = *reinterpret_cast<const float4*>(a + i);
          v = make_float4(__fadd_rn(v.x, b.x), __fadd_rn(v.y, b.y), __fadd_rn(v.z, b.z), __fadd_rn(v.w, b.w));
          *reinterpret_cast<float4*>(so + i) = v;
        }
        ss = fmaf(v.x, v.x, ss), ss = fmaf(v.y, v.y, ss), ss = fmaf(v.z, v.z, ss), ss = fmaf(v.w, v.w, ss);
      } else {
        float v = x[i];
        if (a) v = __fadd_rn(v, a[i]), so[i] = v;
        ss = fmaf(v, v, ss);
      }
    }
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
  if constexpr (TPR > 32) {
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = ss;
    __syncthreads();
    ss = 0.f;
#pragma unroll
    for (int k = 0; k < TPR / 32; ++k) ss += red[k];
  }
  if (!live) return;
  // The CPU's scale: 1 / sqrt(ss / n + eps) in double, rounded to float.
  const float scale = float(1.0 / sqrt(double(ss) / double(p.n) + double(p.eps)));
  const int64_t o = t * p.os + h * p.n;
  // With the fused add the row is re-read from sum_out: this thread wrote the same elements.
  const float* src = a ? so : x;
  for (int i = tid * W; i < p.n; i += TPR * W) {
    if constexpr (V) {
      const float4 v = *reinterpret_cast<const float4*>(src + i), g = *reinterpret_cast<const float4*>(p.w + i);
      store4<E>(p.out, o + i,
                make_float4(__fmul_rn(__fmul_rn(v.x, scale), g.x), __fmul_rn(__fmul_rn(v.y, scale), g.y),
                            __fmul_rn(__fmul_rn(v.z, scale), g.z), __fmul_rn(__fmul_rn(v.w, scale), g.w)));
    } else {
      detail::store_elem<E>(p.out, o + i, __fmul_rn(__fmul_rn(src[i], scale), p.w[i]));
    }
  }
}

// ---- element-wise kernels over [n_tokens, n] with strides; V: 4 elements per item ----
struct EwK {
  int64_t n_tokens;
  int n;
  const float* a;
  int64_t as;
  const float* b;
  int64_t bs;
  void* out;
  int64_t os;
};

__device__ __forceinline__ float silu_mul(float g, float u) { return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u); }
// 0.5 (1 + tanh(z)) = 1 / (1 + exp(-2z)): no cancellation for negative z, where 1 + tanh(z)
// would lose the digits of a small result.
__device__ __forceinline__ float gelu_tanh_mul(float g, float u) {
  const float z = 0.7978845608028654f * (g + 0.044715f * g * g * g);
  return g / (1.0f + expf(-2.0f * z)) * u;
}

// OP: 0 swiglu, 1 gelu_tanh, 2 add (out = a + b, out may be a), 3 cast (out = a)
template <int OP, int E, bool V>
__global__ void __launch_bounds__(kThreads) elementwise_kernel(EwK p) {
  constexpr int W = V ? 4 : 1;
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int64_t per_row = p.n / W, total = p.n_tokens * per_row;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total; idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / per_row, i = (idx % per_row) * W;
    float r[W];
    float av[W], bv[W];
    if constexpr (V) {
      const float4 x = *reinterpret_cast<const float4*>(p.a + t * p.as + i);
      av[0] = x.x, av[1] = x.y, av[2] = x.z, av[3] = x.w;
      if constexpr (OP != 3) {
        const float4 y = *reinterpret_cast<const float4*>(p.b + t * p.bs + i);
        bv[0] = y.x, bv[1] = y.y, bv[2] = y.z, bv[3] = y.w;
      }
    } else {
      av[0] = p.a[t * p.as + i];
      if constexpr (OP != 3) bv[0] = p.b[t * p.bs + i];
    }
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if constexpr (OP == 0) r[k] = silu_mul(av[k], bv[k]);
      else if constexpr (OP == 1) r[k] = gelu_tanh_mul(av[k], bv[k]);
      else if constexpr (OP == 2) r[k] = __fadd_rn(av[k], bv[k]);
      else r[k] = av[k];
    }
    if constexpr (V) store4<E>(p.out, t * p.os + i, make_float4(r[0], r[1], r[2], r[3]));
    else detail::store_elem<E>(p.out, t * p.os + i, r[0]);
  }
}

template <int OP>
void launch_elementwise(const EwK& k, ElemType out_type, bool v4, cudaStream_t st, const char* name) {
  const int64_t items = k.n_tokens * (v4 ? k.n / 4 : k.n);
  dispatch_elem(out_type, [&](auto e) {
    constexpr int E = decltype(e)::value;
    if (v4) launch_pdl(name, elementwise_kernel<OP, E, true>, dim3(grid_for(items, kThreads)), dim3(kThreads), 0, st, k);
    else launch_pdl(name, elementwise_kernel<OP, E, false>, dim3(grid_for(items, kThreads)), dim3(kThreads), 0, st, k);
  });
}

// 16-byte accesses when every row start is 16-byte aligned (f32 inputs) and the outputs' 4-element
// groups are aligned for their type.
bool can_vec4(int n, std::initializer_list<std::pair<const void*, int64_t>> f32_rows, const void* out, int64_t os,
              ElemType ot) {
  if (n % 4) return false;
  for (const auto& [ptr, stride] : f32_rows)
    if (ptr && (!aligned(ptr, 16) || stride % 4)) return false;
  return aligned(out, 4 * elem_bytes(ot)) && os % 4 == 0;
}

void check_device(const char* op) { VQ_CHECK(cuda_device_available(), "cuda::{}: {}", op, cuda_unavailable_reason()); }

}  // namespace

void rms_norm_device(const RmsNormParams& p, void* stream) {
  check_device("rms_norm");
  VQ_CHECK(p.n_tokens >= 0 && p.n_heads >= 1 && p.n >= 1, "cuda::rms_norm: shape [{} tokens, {} heads, {}] invalid",
           p.n_tokens, p.n_heads, p.n);
  const int64_t row = int64_t(p.n_heads) * p.n;
  const int64_t xs = p.x_stride ? p.x_stride : row, os = p.out_stride ? p.out_stride : row;
  VQ_CHECK(xs >= row && os >= row, "cuda::rms_norm([{}, {} x {}]): strides x {} / out {} below the row of {}",
           p.n_tokens, p.n_heads, p.n, xs, os, row);
  if (p.n_tokens == 0) return;
  VQ_CHECK(p.x && p.w && p.out && (!p.add || p.sum_out), "cuda::rms_norm([{}, {} x {}]): null x, w, out or sum_out",
           p.n_tokens, p.n_heads, p.n);
  NormK k{int64_t(p.n_tokens) * p.n_heads, p.n_heads, p.n, p.x, xs, p.add, p.sum_out, p.w, p.eps, p.out, os};
  const bool v4 = can_vec4(p.n, {{p.x, xs}, {p.add, xs}, {p.sum_out, xs}, {p.w, 0}}, p.out, os, p.out_type);
  cudaStream_t st = as_stream(stream);
  const bool warp_rows = p.n <= 1024;
  dispatch_elem(p.out_type, [&](auto e) {
    constexpr int E = decltype(e)::value;
    if (warp_rows) {
      const unsigned grid = unsigned((k.rows + kThreads / 32 - 1) / (kThreads / 32));
      if (v4) launch_pdl("rms_norm", rms_norm_kernel<E, true, 32>, dim3(grid), dim3(kThreads), 0, st, k);
      else launch_pdl("rms_norm", rms_norm_kernel<E, false, 32>, dim3(grid), dim3(kThreads), 0, st, k);
    } else {
      if (v4) launch_pdl("rms_norm", rms_norm_kernel<E, true, kThreads>, dim3(unsigned(k.rows)), dim3(kThreads), 0, st, k);
      else launch_pdl("rms_norm", rms_norm_kernel<E, false, kThreads>, dim3(unsigned(k.rows)), dim3(kThreads), 0, st, k);
    }
  });
}

void glu_device(const GluParams& p, void* stream) {
  check_device("glu");
  VQ_CHECK(p.n_tokens >= 0 && p.n >= 1, "cuda::glu: shape [{}, {}] invalid", p.n_tokens, p.n);
  const int64_t gs = p.gate_stride ? p.gate_stride : p.n, us = p.up_stride ? p.up_stride : p.n,
                os = p.out_stride ? p.out_stride : p.n;
  VQ_CHECK(gs >= p.n && us >= p.n && os >= p.n, "cuda::glu([{}, {}]): a stride is below the row length", p.n_tokens,
           p.n);
  if (p.n_tokens == 0) return;
  VQ_CHECK(p.gate && p.up && p.out, "cuda::glu([{}, {}]): null gate, up or out", p.n_tokens, p.n);
  const EwK k{p.n_tokens, p.n, p.gate, gs, p.up, us, p.out, os};
  const bool v4 = can_vec4(p.n, {{p.gate, gs}, {p.up, us}}, p.out, os, p.out_type);
  cudaStream_t st = as_stream(stream);
  if (p.kind == GluKind::swiglu) launch_elementwise<0>(k, p.out_type, v4, st, "glu swiglu");
  else launch_elementwise<1>(k, p.out_type, v4, st, "glu gelu_tanh");
}

void add_device(const AddParams& p, void* stream) {
  check_device("add");
  VQ_CHECK(p.n_tokens >= 0 && p.n >= 1, "cuda::add: shape [{}, {}] invalid", p.n_tokens, p.n);
  const int64_t xs = p.x_stride ? p.x_stride : p.n, ys = p.y_stride ? p.y_stride : p.n;
  VQ_CHECK(xs >= p.n && ys >= p.n, "cuda::add([{}, {}]): a stride is below the row length", p.n_tokens, p.n);
  if (p.n_tokens == 0) return;
  VQ_CHECK(p.x && p.y, "cuda::add([{}, {}]): null x or y", p.n_tokens, p.n);
  const EwK k{p.n_tokens, p.n, p.x, xs, p.y, ys, p.x, xs};
  const bool v4 = can_vec4(p.n, {{p.x, xs}, {p.y, ys}}, p.x, xs, ElemType::f32);
  launch_elementwise<2>(k, ElemType::f32, v4, as_stream(stream), "add");
}

void cast_device(const CastParams& p, void* stream) {
  check_device("cast");
  VQ_CHECK(p.n_tokens >= 0 && p.n >= 1, "cuda::cast: shape [{}, {}] invalid", p.n_tokens, p.n);
  const int64_t xs = p.x_stride ? p.x_stride : p.n, os = p.out_stride ? p.out_stride : p.n;
  VQ_CHECK(xs >= p.n && os >= p.n, "cuda::cast([{}, {}]): a stride is below the row length", p.n_tokens, p.n);
  if (p.n_tokens == 0) return;
  VQ_CHECK(p.x && p.out, "cuda::cast([{}, {}]): null x or out", p.n_tokens, p.n);
  const EwK k{p.n_tokens, p.n, p.x, xs, nullptr, 0, p.out, os};
  const bool v4 = can_vec4(p.n, {{p.x, xs}}, p.out, os, p.out_type);
  launch_elementwise<3>(k, p.out_type, v4, as_stream(stream), "cast");
}

}  // namespace vq::cuda
