// H200 benchmark of the fp16-weight GEMV at m = 1 (the decode step's weight stream): the shipped
// kernel (gemv_f16.cu) against variants that differ in rows per warp (R), column steps in flight
// per lane (U), warps per block (NW) and the load flavour (NC: ld.global.nc.L1::no_allocate),
// at the Llama-3.1-8B shapes. Two measurements per kernel:
//   alone  median of CUDA-event timings of one projection, weights rotated over >= 4x the L2;
//   chain  the 4 projections of 32 layers (distinct weights, 13.96 GB) captured in one CUDA graph
//          and launched with programmatic dependent launch, as the decode step runs them.
// Each line: ms, GB/s of weight bytes, share of the device-to-device copy rate measured here.
//   bench_gemv_f16
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/gemv_cuda.h"
#include "ops/cuda/pdl.cuh"

namespace {

using namespace vq::bench;
namespace vc = vq::cuda;

__device__ __forceinline__ uint4 load_w(const __half* p, bool nc) {
  uint4 v;
  if (nc)
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  else
    v = __ldg(reinterpret_cast<const uint4*>(p));
  return v;
}

__device__ __forceinline__ float dot8(const uint4& w, const float4& a, const float4& b, float acc) {
  const float2 w01 = __half22float2(*reinterpret_cast<const __half2*>(&w.x));
  const float2 w23 = __half22float2(*reinterpret_cast<const __half2*>(&w.y));
  const float2 w45 = __half22float2(*reinterpret_cast<const __half2*>(&w.z));
  const float2 w67 = __half22float2(*reinterpret_cast<const __half2*>(&w.w));
  acc = fmaf(w01.x, a.x, acc), acc = fmaf(w01.y, a.y, acc), acc = fmaf(w23.x, a.z, acc), acc = fmaf(w23.y, a.w, acc);
  acc = fmaf(w45.x, b.x, acc), acc = fmaf(w45.y, b.y, acc), acc = fmaf(w67.x, b.z, acc), acc = fmaf(w67.y, b.w, acc);
  return acc;
}

struct Args {
  const __half* w;
  int64_t rows, cols;
  const float* x;
  float* y;
};

// Warp = R rows; per outer step a lane loads U x R 16-byte weight chunks (all in flight), then
// reads x through the read-only path and accumulates. rows % R == 0, cols % 8 == 0.
template <int R, int U, int NW, bool NC, int PF>
__global__ void __launch_bounds__(32 * NW) gemv_var(Args p) {
  const int lane = threadIdx.x & 31;
  const int64_t row0 = (int64_t(blockIdx.x) * NW + (threadIdx.x >> 5)) * R;
  if (row0 >= p.rows) return;
  // PF column steps of 512 bytes per row head for L2 before the wait (the weights do not depend
  // on the previous kernel).
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int k = 0; k < PF; ++k) {
      const int64_t c = int64_t(lane) * 8 + k * 256;
      if (c < p.cols) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p.w + (row0 + r) * p.cols + c));
    }
  vc::pdl_wait();
  vc::pdl_trigger();
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.f;
  for (int64_t c0 = int64_t(lane) * 8; c0 < p.cols; c0 += 256 * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int64_t c = c0 + u * 256;
        wv[u][r] = c < p.cols ? load_w(p.w + (row0 + r) * p.cols + c, NC) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * 256;
      if (c < p.cols) {
        const float4 xa = __ldg(reinterpret_cast<const float4*>(p.x + c));
        const float4 xb = __ldg(reinterpret_cast<const float4*>(p.x + c + 4));
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r] = dot8(wv[u][r], xa, xb, acc[r]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float a = acc[r];
#pragma unroll
    for (int o = 16; o; o >>= 1) a += __shfl_xor_sync(0xffffffffu, a, o);
    if (lane == 0) p.y[row0 + r] = a;
  }
}

struct Variant {
  std::string name;
  void (*launch)(const Args&, cudaStream_t);
};

template <int R, int U, int NW, bool NC, int PF>
void launch_var(const Args& a, cudaStream_t st) {
  const int64_t per = int64_t(NW) * R;
  vc::launch_pdl("gemv_var", gemv_var<R, U, NW, NC, PF>, dim3(unsigned((a.rows + per - 1) / per)), dim3(32 * NW), 0, st, a);
}

void launch_shipped(const Args& a, cudaStream_t st) {
  vc::GemvF16Params g;
  g.w = a.w, g.rows = a.rows, g.cols = a.cols, g.m = 1, g.x = a.x, g.y = a.y;
  vc::gemv_f16_device(g, st);
}

template <int R, int U, int NW, bool NC, int PF = 0>
Variant var() {
  return {"R" + std::to_string(R) + "_U" + std::to_string(U) + "_W" + std::to_string(NW) + (NC ? "_nc" : "") +
              (PF ? "_pf" + std::to_string(PF) : ""),
          launch_var<R, U, NW, NC, PF>};
}

__global__ void fill_half(__half* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = __float2half((float(h >> 8) / 16777216.0f - 0.5f) * 0.04f);
  }
}

// Writes y = W x with the reference (double) for a few rows and reports the largest relative error.
__global__ void ref_rows(const __half* w, int64_t cols, const float* x, double* out, int n) {
  const int r = blockIdx.x;
  if (r >= n) return;
  double s = 0;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) s += double(__half2float(w[int64_t(r) * cols + c])) * x[c];
  __shared__ double red[256];
  red[threadIdx.x] = s;
  __syncthreads();
  for (int o = blockDim.x / 2; o; o >>= 1) {
    if (int(threadIdx.x) < o) red[threadIdx.x] += red[threadIdx.x + o];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[r] = red[0];
}

}  // namespace

int main() {
  if (!vc::cuda_device_available()) {
    std::printf("no GPU: %s\n", vc::cuda_unavailable_reason().c_str());
    return 0;
  }
  std::printf("device %s\n", vc::cuda_device_description().c_str());
  const double bw = copy_gbps();
  const std::vector<Variant> vars = {
      {"shipped", launch_shipped}, var<2, 4, 8, true>(),    var<2, 4, 8, true, 2>(), var<1, 8, 8, true, 2>(),
      var<1, 8, 8, true, 4>(),     var<1, 8, 4, true, 2>(), var<1, 4, 8, true, 2>(), var<1, 8, 8, false, 2>(),
      var<2, 4, 4, true, 2>(),     var<1, 16, 4, true, 4>(), var<4, 2, 8, true, 2>(),
  };
  struct Shape {
    const char* name;
    int64_t rows, cols;
  };
  const Shape shapes[] = {{"qkv", 6144, 4096}, {"wo", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336},
                          {"head", 128256, 4096}};
  vc::DeviceBuffer xb(size_t(14336) * 4), yb(size_t(128256) * 4);
  fill_normal_f32<<<64, 256>>>(xb.as<float>(), 14336, 7, 1.0f);
  CK(cudaDeviceSynchronize());
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  // ---- alone ----
  for (const Shape& s : shapes) {
    const size_t bytes = size_t(s.rows) * s.cols * 2;
    const int copies = int(std::max<size_t>(2, (size_t(256) << 20) / bytes + 1));
    std::vector<vc::DeviceBuffer> w;
    for (int i = 0; i < copies; ++i) {
      w.emplace_back(bytes);
      fill_half<<<1024, 256>>>(static_cast<__half*>(w.back().data()), bytes / 2, 11 + i);
    }
    // correctness of every variant on the first rows against a double reference
    const int nref = 64;
    vc::DeviceBuffer ref(nref * 8);
    ref_rows<<<nref, 256>>>(static_cast<const __half*>(w[0].data()), s.cols, xb.as<float>(), ref.as<double>(), nref);
    std::vector<double> href(nref);
    CK(cudaMemcpy(href.data(), ref.data(), nref * 8, cudaMemcpyDeviceToHost));
    for (const Variant& v : vars) {
      Args a{static_cast<const __half*>(w[0].data()), s.rows, s.cols, xb.as<float>(), yb.as<float>()};
      v.launch(a, st);
      CK(cudaStreamSynchronize(st));
      std::vector<float> hy(nref);
      CK(cudaMemcpy(hy.data(), yb.data(), nref * 4, cudaMemcpyDeviceToHost));
      double err = 0, mag = 0;
      for (int i = 0; i < nref; ++i) err = std::max(err, std::abs(hy[i] - href[i])), mag = std::max(mag, std::abs(href[i]));
      const double ms = median_ms(
          [&](int i) {
            Args b{static_cast<const __half*>(w[size_t(i) % w.size()].data()), s.rows, s.cols, xb.as<float>(), yb.as<float>()};
            v.launch(b, nullptr);
          },
          20);
      std::printf("gemv_alone shape=%s rows=%lld cols=%lld variant=%s ms=%.4f GBps=%.0f of_copy=%.2f max_err_rel=%.1e\n",
                  s.name, (long long)s.rows, (long long)s.cols, v.name.c_str(), ms, bytes / (ms * 1e-3) / 1e9,
                  bytes / (ms * 1e-3) / 1e9 / bw, err / (mag > 0 ? mag : 1));
    }
  }
  // ---- chain: 32 layers x (qkv, wo, gate_up, down) in one graph ----
  const int layers = 32;
  std::vector<vc::DeviceBuffer> lw;
  size_t total = 0;
  for (int l = 0; l < layers; ++l)
    for (int k = 0; k < 4; ++k) {
      const size_t bytes = size_t(shapes[k].rows) * shapes[k].cols * 2;
      lw.emplace_back(bytes);
      CK(cudaMemset(lw.back().data(), 0x11, bytes));
      total += bytes;
    }
  for (const Variant& v : vars) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int l = 0; l < layers; ++l)
      for (int k = 0; k < 4; ++k) {
        Args a{static_cast<const __half*>(lw[size_t(l) * 4 + k].data()), shapes[k].rows, shapes[k].cols, xb.as<float>(),
               yb.as<float>()};
        v.launch(a, st);
      }
    CK(cudaStreamEndCapture(st, &g));
    cudaGraphExec_t ge;
    CK(cudaGraphInstantiate(&ge, g, 0));
    const double ms = median_ms([&](int) { CK(cudaGraphLaunch(ge, nullptr)); }, 1, 15, 3);
    std::printf("gemv_chain variant=%s layers=%d GB=%.2f ms=%.4f GBps=%.0f of_copy=%.2f floor_ms=%.4f\n", v.name.c_str(),
                layers, total / 1e9, ms, total / (ms * 1e-3) / 1e9, total / (ms * 1e-3) / 1e9 / bw,
                total / (bw * 1e9) * 1e3);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
  }
  return 0;
}
