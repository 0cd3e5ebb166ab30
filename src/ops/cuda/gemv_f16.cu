// fp16-weight matrix-vector products for decode (gemv_cuda.h, gemv_f16_device): a warp owns
// R = 2 weight rows, each lane loads 8 fp16 weights (16 bytes) per row and step, the M <= 4
// activation rows come through the read-only cache (all warps read the same x), fp32 FMAs, one
// shuffle reduction per (row, activation row) at the end.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/gemv_cuda.h"

namespace vq::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kRowsPerWarp = 2;

template <int M>
__global__ void __launch_bounds__(32 * kWarpsPerBlock) gemv_f16_kernel(GemvF16Params p) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * kRowsPerWarp;
  if (row0 >= p.rows) return;
  const int nr = p.rows - row0 >= kRowsPerWarp ? kRowsPerWarp : int(p.rows - row0);
  const __half* w = static_cast<const __half*>(p.w);
  float acc[kRowsPerWarp][M];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
#pragma unroll 4
  for (int64_t c = int64_t(lane) * 8; c < p.cols; c += 256) {
    uint4 wv[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r)
      wv[r] = r < nr ? __ldg(reinterpret_cast<const uint4*>(w + (row0 + r) * p.cols + c)) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float4 xa = __ldg(reinterpret_cast<const float4*>(p.x + m * p.x_stride + c));
      const float4 xb = __ldg(reinterpret_cast<const float4*>(p.x + m * p.x_stride + c + 4));
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r) {
        const float2 w01 = __half22float2(*reinterpret_cast<const __half2*>(&wv[r].x));
        const float2 w23 = __half22float2(*reinterpret_cast<const __half2*>(&wv[r].y));
        const float2 w45 = __half22float2(*reinterpret_cast<const __half2*>(&wv[r].z));
        const float2 w67 = __half22float2(*reinterpret_cast<const __half2*>(&wv[r].w));
        float a = acc[r][m];
        a = fmaf(w01.x, xa.x, a), a = fmaf(w01.y, xa.y, a), a = fmaf(w23.x, xa.z, a), a = fmaf(w23.y, xa.w, a);
        a = fmaf(w45.x, xb.x, a), a = fmaf(w45.y, xb.y, a), a = fmaf(w67.x, xb.z, a), a = fmaf(w67.y, xb.w, a);
        acc[r][m] = a;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float a = acc[r][m];
#pragma unroll
      for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
      if (lane == 0 && r < nr) {
        float* y = p.y + m * p.y_stride + row0 + r;
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
  const int64_t per_block = int64_t(kWarpsPerBlock) * kRowsPerWarp;
  const unsigned blocks = unsigned((p.rows + per_block - 1) / per_block);
  cudaStream_t st = as_stream(stream);
  switch (p.m) {
    case 1: gemv_f16_kernel<1><<<blocks, 32 * kWarpsPerBlock, 0, st>>>(p); break;
    case 2: gemv_f16_kernel<2><<<blocks, 32 * kWarpsPerBlock, 0, st>>>(p); break;
    case 3: gemv_f16_kernel<3><<<blocks, 32 * kWarpsPerBlock, 0, st>>>(p); break;
    default: gemv_f16_kernel<4><<<blocks, 32 * kWarpsPerBlock, 0, st>>>(p); break;
  }
  VQ_CUDA_LAUNCHED("gemv_f16_kernel");
}

}  // namespace vq::cuda
