// The batch-invariant product of the deterministic mode (gemm_cuda.h: gemm_invariant_device).
//
// Why not cuBLAS: cuBLAS picks its kernel, tile and split over k by the shape, m included, so one
// row's result changes with the number of rows beside it (a decode step of 1 row and of 8 rows
// give different last bits; the GEMV paths for few rows differ again). Here every output element
// is one chain of mma.m16n8k16 steps over k, 16 at a time in ascending order, from a zero fp32
// accumulator, then added to y when accumulating. The tile shape only decides which rows and
// columns a block owns; it never changes an element's chain, so the shape may follow m for
// speed, and so may the width of the k slices staged in shared memory: the chain always has
// ceil(k/16) steps (a step wholly past k is not run; the half of a step past k reads zeros).
// Rows and columns past the edges are zero-filled and never stored.
//
// Pipeline: STAGES-deep cp.async ring of BK-wide k slices of x and W (rows padded by 8 halves,
// so the ldmatrix row addresses of a warp fall in distinct banks), one barrier per slice.
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/smem_attr.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/gemm_cuda.h"
#include "ops/cuda/mma_ptx.cuh"

namespace vq::cuda {
namespace {

using namespace ptx;


struct InvArgs {
  int m, n, k;
  const __half* x;
  int64_t ldx;
  const __half* w;
  int64_t ldw;
  void* y;
  int64_t ldy;
  bool y_f16, accumulate;
};

template <int BM, int BN, int BK, int WM, int WN, int STAGES>
__global__ void __launch_bounds__(WM* WN * 32) gemm_invariant_kernel(InvArgs a) {
  constexpr int NT = WM * WN * 32;
  constexpr int MI = BM / WM / 16, NI = BN / WN / 8;
  static_assert(MI >= 1 && NI >= 2 && NI % 2 == 0, "warp tile: 16*MI rows x 8*NI columns");
  static_assert(BK % 32 == 0, "k slices of whole 16-byte chunks per row");
  constexpr int kLds = BK + 8;   // halves per shared-memory row
  constexpr int CH = BK / 8;     // 16-byte chunks per row of a slice
  extern __shared__ __align__(16) unsigned char smem[];
  __half* As = reinterpret_cast<__half*>(smem);
  __half* Bs = As + STAGES * BM * kLds;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wm = warp / WN, wn = warp % WN;
  const int64_t m0 = int64_t(blockIdx.y) * BM, n0 = int64_t(blockIdx.x) * BN;
  const int KT = (a.k + BK - 1) / BK;

  auto load = [&](int stage, int kt) {
    const int k0 = kt * BK;
    for (int c = tid; c < BM * CH; c += NT) {
      const int r = c / CH, kc = (c % CH) * 8;
      const bool v = m0 + r < a.m && k0 + kc < a.k;
      cp_async16(As + (stage * BM + r) * kLds + kc, v ? a.x + (m0 + r) * a.ldx + k0 + kc : a.x, v);
    }
    for (int c = tid; c < BN * CH; c += NT) {
      const int r = c / CH, kc = (c % CH) * 8;
      const bool v = n0 + r < a.n && k0 + kc < a.k;
      cp_async16(Bs + (stage * BN + r) * kLds + kc, v ? a.w + (n0 + r) * a.ldw + k0 + kc : a.w, v);
    }
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load(s, s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // slice kt landed for every thread; slice kt-1's stage is free again
    if (kt + STAGES - 1 < KT) load((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
    cp_async_commit();
    const __half* A = As + (kt % STAGES) * BM * kLds;
    const __half* B = Bs + (kt % STAGES) * BN * kLds;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      if (kt * BK + kk >= a.k) break;  // the chain has ceil(k/16) steps whatever the slice width
      uint32_t af[MI][4];
#pragma unroll
      for (int i = 0; i < MI; ++i)
        ldsm_x4(af[i], A + (wm * MI * 16 + i * 16 + lane % 16) * kLds + kk + (lane / 16) * 8);
#pragma unroll
      for (int j = 0; j < NI; j += 2) {
        uint32_t bf[4];  // columns j*8.. (b0, b1) and (j+1)*8.. (b2, b3)
        ldsm_x4(bf, B + (wn * NI * 8 + j * 8 + lane % 8 + (lane / 16) * 8) * kLds + kk + ((lane / 8) % 2) * 8);
#pragma unroll
        for (int i = 0; i < MI; ++i) {
          mma16816(acc[i][j], af[i], bf[0], bf[1]);
          mma16816(acc[i][j + 1], af[i], bf[2], bf[3]);
        }
      }
    }
  }
  cp_async_wait<0>();

#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t r = m0 + wm * MI * 16 + i * 16 + lane / 4 + (e / 2) * 8;
        const int64_t c = n0 + wn * NI * 8 + j * 8 + (lane % 4) * 2 + (e % 2);
        if (r >= a.m || c >= a.n) continue;
        const int64_t o = r * a.ldy + c;
        if (a.y_f16) {
          __half* y = static_cast<__half*>(a.y);
          y[o] = __float2half_rn(a.accumulate ? __half2float(y[o]) + acc[i][j][e] : acc[i][j][e]);
        } else {
          float* y = static_cast<float*>(a.y);
          y[o] = a.accumulate ? y[o] + acc[i][j][e] : acc[i][j][e];
        }
      }
}

template <int BM, int BN, int BK, int WM, int WN, int STAGES>
void launch(const InvArgs& a, cudaStream_t st) {
  constexpr size_t smem = size_t(STAGES) * (BM + BN) * (BK + 8) * sizeof(__half);
  auto fn = gemm_invariant_kernel<BM, BN, BK, WM, WN, STAGES>;
  detail::ensure_smem_attr(fn, smem);
  const dim3 grid(unsigned((a.n + BN - 1) / BN), unsigned((a.m + BM - 1) / BM));
  fn<<<grid, WM * WN * 32, smem, st>>>(a);
  VQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int gemm_invariant_tile_rows(int64_t m) { return m <= 16 ? 16 : m <= 64 ? 64 : 128; }

void gemm_invariant_device(const GemmParams& p, void* stream) {
  const int64_t ldw = p.ldw ? p.ldw : p.k, ldx = p.ldx ? p.ldx : p.k, ldy = p.ldy ? p.ldy : p.n;
  VQ_CHECK(p.ab_type == ElemType::f16, "cuda::gemm_invariant: weights and activations must be f16 (got {})",
           elem_type_name(p.ab_type));
  VQ_CHECK(p.y_type == ElemType::f32 || p.y_type == ElemType::f16, "cuda::gemm_invariant: y must be f32 or f16 (got {})",
           elem_type_name(p.y_type));
  VQ_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 1 && p.m <= int64_t(65535) * 128 && p.n < (int64_t(1) << 31) &&
               p.k < (int64_t(1) << 31),
           "cuda::gemm_invariant: shape m={} n={} k={} out of range", p.m, p.n, p.k);
  VQ_CHECK(p.k % 8 == 0 && ldw % 8 == 0 && ldx % 8 == 0 && ldw >= p.k && ldx >= p.k && ldy >= p.n,
           "cuda::gemm_invariant(m={} n={} k={}): k, ldw ({}) and ldx ({}) must be multiples of 8 (16-byte rows), "
           "ldy ({}) >= n",
           p.m, p.n, p.k, ldw, ldx, ldy);
  if (p.m == 0 || p.n == 0) return;
  VQ_CHECK(p.w && p.x && p.y, "cuda::gemm_invariant(m={} n={} k={}): null pointer", p.m, p.n, p.k);
  VQ_CHECK(reinterpret_cast<uintptr_t>(p.w) % 16 == 0 && reinterpret_cast<uintptr_t>(p.x) % 16 == 0,
           "cuda::gemm_invariant(m={} n={} k={}): w and x must be 16-byte aligned", p.m, p.n, p.k);
  InvArgs a;
  a.m = int(p.m), a.n = int(p.n), a.k = int(p.k);
  a.x = static_cast<const __half*>(p.x), a.ldx = ldx;
  a.w = static_cast<const __half*>(p.w), a.ldw = ldw;
  a.y = p.y, a.ldy = ldy;
  a.y_f16 = p.y_type == ElemType::f16;
  a.accumulate = p.accumulate;
  const cudaStream_t st = as_stream(stream);
  switch (gemm_invariant_tile_rows(p.m)) {
    case 16: launch<16, 32, 128, 1, 2, 6>(a, st); break;  // decode: narrow blocks, wide deep k slices
    case 64: launch<64, 64, 64, 2, 2, 4>(a, st); break;
    default: launch<128, 128, 32, 2, 4, 3>(a, st); break;  // prefill
  }
}

}  // namespace vq::cuda
