// fp16-weight matrix-vector products for decode (gemv_cuda.h, gemv_f16_device): a warp owns one
// weight row, each lane keeps 16 loads of 8 fp16 weights (16 bytes) in flight, the M <= 4
// activation rows come through the read-only cache (all warps read the same x), fp32 FMAs, one
// shuffle reduction per activation row at the end. Launched with PDL (pdl.cuh).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/gemv_cuda.h"
#include "ops/cuda/pdl.cuh"

namespace vq::cuda {
namespace {

// Measured on the H200 (bench/cuda/bench_gemv_f16.cu, the 4 projections of 32 Llama-3.1-8B
// layers as one graph with PDL): one row per warp with 16 column steps in flight per lane (256
// bytes), 4-warp blocks, loads that skip L1 and 4 steps prefetched into L2 before the wait
// streamed the chain at 90% of the copy rate, against 84% for the previous 2-rows x 4-steps
// 8-warp kernel (docs/CUDA_NOTES.md section 8).
constexpr int kWarpsPerBlock = 4;
constexpr int kSteps = 16;     // 16-byte column steps in flight per lane
constexpr int kPrefetch = 4;   // steps per row prefetched into L2 before pdl_wait

__device__ __forceinline__ uint4 load_stream(const __half* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <int M>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) gemv_f16_kernel(GemvF16Params p) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5);
  if (row >= p.rows) return;
  const __half* w = static_cast<const __half*>(p.w) + row * p.cols;
  // Launched with PDL behind the kernel that writes x: the weights do not depend on it, so the
  // row's first steps head for L2 before the wait.
#pragma unroll
  for (int k = 0; k < kPrefetch; ++k) {
    const int64_t c = int64_t(lane) * 8 + k * 256;
    if (c < p.cols) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(w + c));
  }
  pdl_wait();
  pdl_trigger();
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.f;
  for (int64_t c0 = int64_t(lane) * 8; c0 < p.cols; c0 += 256 * kSteps) {
    uint4 wv[kSteps];
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int64_t c = c0 + u * 256;
      wv[u] = c < p.cols ? load_stream(w + c) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < kSteps; ++u) {
      const int64_t c = c0 + u * 256;
      if (c < p.cols) {
        const float2 w01 = __half22float2(*reinterpret_cast<const __half2*>(&wv[u].x));
        const float2 w23 = __half22float2(*reinterpret_cast<const __half2*>(&wv[u].y));
        const float2 w45 = __half22float2(*reinterpret_cast<const __half2*>(&wv[u].z));
        const float2 w67 = __half22float2(*reinterpret_cast<const __half2*>(&wv[u].w));
#pragma unroll
        for (int m = 0; m < M; ++m) {
          const float4 xa = __ldg(reinterpret_cast<const float4*>(p.x + m * p.x_stride + c));
          const float4 xb = __ldg(reinterpret_cast<const float4*>(p.x + m * p.x_stride + c + 4));
          float a = acc[m];
          a = fmaf(w01.x, xa.x, a), a = fmaf(w01.y, xa.y, a), a = fmaf(w23.x, xa.z, a), a = fmaf(w23.y, xa.w, a);
          a = fmaf(w45.x, xb.x, a), a = fmaf(w45.y, xb.y, a), a = fmaf(w67.x, xb.z, a), a = fmaf(w67.y, xb.w, a);
          acc[m] = a;
        }
      }
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float a = acc[m];
#pragma unroll
    for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0) {
      float* y = p.y + m * p.y_stride + row;
      *y = p.accumulate ? *y + a : a;
    }
  }
}

}  // namespace

void gemv_f16_device(const GemvF16Params& p0, void* stream) {
  VQ_CHECK(p0.m >= 1 && p0.m <= kGemvF16MaxRows, "cuda::gemv_f16([{}, {}]): m = {} must be 1..{}", p0.rows, p0.cols,
           p0.m, kGemvF16MaxRows);
  VQ_CHECK(p0.rows >= 1 && p0.cols >= 8 && p0.cols % 8 == 0, "cuda::gemv_f16: [{}, {}]: cols must be a multiple of 8",
           p0.rows, p0.cols);
  VQ_CHECK(p0.w && p0.x && p0.y, "cuda::gemv_f16([{}, {}]): null w, x or y", p0.rows, p0.cols);
  GemvF16Params p = p0;
  if (!p.x_stride) p.x_stride = p.cols;
  if (!p.y_stride) p.y_stride = p.rows;
  VQ_CHECK(p.x_stride % 4 == 0 && (reinterpret_cast<uintptr_t>(p.x) & 15) == 0 &&
               (reinterpret_cast<uintptr_t>(p.w) & 15) == 0,
           "cuda::gemv_f16([{}, {}]): x and w must be 16-byte aligned (x_stride {} a multiple of 4)", p.rows, p.cols,
           p.x_stride);
  const int64_t per_block = kWarpsPerBlock;
  const unsigned blocks = unsigned((p.rows + per_block - 1) / per_block);
  cudaStream_t st = as_stream(stream);
  const dim3 g(blocks), b(32 * kWarpsPerBlock);
  switch (p.m) {
    case 1: launch_pdl("gemv_f16_kernel", gemv_f16_kernel<1>, g, b, 0, st, p); break;
    case 2: launch_pdl("gemv_f16_kernel", gemv_f16_kernel<2>, g, b, 0, st, p); break;
    case 3: launch_pdl("gemv_f16_kernel", gemv_f16_kernel<3>, g, b, 0, st, p); break;
    default: launch_pdl("gemv_f16_kernel", gemv_f16_kernel<4>, g, b, 0, st, p); break;
  }
}

}  // namespace vq::cuda
