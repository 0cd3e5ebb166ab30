// Quantized matrix-vector products for decode (gemv_cuda.h): weight packing, activation
// quantization and the dp4a products for Q8_0, Q4_1 and Q4_K.
//
// Product kernel: a block of 128 threads owns R weight rows and splits the row's chunks over its
// threads (chunk = 32 elements: one block of Q8_0 / Q4_1; for Q4_K 16 quant bytes, i.e. half of
// two sub-blocks); per chunk a thread loads the R rows' quants with 16-byte loads, then for each
// activation row m the matching int8 activations (L1/L2-resident: [m, cols] int8 is at most
// 8 x 16K bytes), sums the integer products with dp4a and applies the block scales in fp32. The
// R*M partial sums are reduced over the warp by shuffles and over the 4 warps in shared memory.
// Bytes moved per weight element: 34/32 (Q8_0), 20/32 (Q4_1), 144/256 (Q4_K).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/gemv_cuda.h"
#include "ops/cuda/weights_cuda.h"

namespace vq::cuda {
namespace {

constexpr int kThreads = 128;

// ---- packing ----
// Q8_0: one thread per block: 32 quants -> q + (r*cols + 32b) (two 16-byte stores), d -> scales.
__global__ void pack_q8_0_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                 uint16_t* __restrict__ d) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < n_blocks; b += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t* s = src + b * 34;
    uint32_t w[8];
#pragma unroll
    for (int i = 0; i < 8; ++i)
      w[i] = uint32_t(s[2 + 4 * i]) | uint32_t(s[3 + 4 * i]) << 8 | uint32_t(s[4 + 4 * i]) << 16 |
             uint32_t(s[5 + 4 * i]) << 24;
    uint4* dst = reinterpret_cast<uint4*>(q + b * 32);
    dst[0] = make_uint4(w[0], w[1], w[2], w[3]);
    dst[1] = make_uint4(w[4], w[5], w[6], w[7]);
    d[b] = uint16_t(s[0]) | uint16_t(s[1]) << 8;
  }
}
// Q4_1: one thread per block: 16 nibble bytes -> q + 16b, (d, m) -> dm[b].
__global__ void pack_q4_1_kernel(const uint8_t* __restrict__ src, int64_t n_blocks, uint8_t* __restrict__ q,
                                 uint32_t* __restrict__ dm) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < n_blocks; b += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t* s = reinterpret_cast<const uint32_t*>(src + b * 20);  // 20-byte blocks: 4-byte aligned
    reinterpret_cast<uint4*>(q)[b] = make_uint4(s[1], s[2], s[3], s[4]);
    dm[b] = s[0];
  }
}

// ---- activation quantization: one warp per block of 32, lane = element ----
template <class TX>
__global__ void quantize_act_kernel(const TX* __restrict__ x, int64_t x_stride, int rows, int64_t cols,
                                    int8_t* __restrict__ q, float* __restrict__ d, float* __restrict__ s) {
  const int64_t nbr = cols / 32, total = int64_t(rows) * nbr;
  const int lane = threadIdx.x & 31;
  for (int64_t blk = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) >> 5; blk < total;
       blk += (int64_t(gridDim.x) * blockDim.x) >> 5) {
    const int64_t r = blk / nbr, b = blk % nbr;
    float v;
    if constexpr (sizeof(TX) == 4) v = x[r * x_stride + b * 32 + lane];
    else v = __half2float(x[r * x_stride + b * 32 + lane]);
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float db = __fdiv_rn(amax, 127.0f);
    // The CPU's rounding (codec/scalar_blocks.h, llama.cpp's q8_0): the f32 reciprocal of d, then
    // roundf (half away from zero), so the quantized products equal the CPU's bit for bit.
    const float id = db != 0.0f ? __fdiv_rn(1.0f, db) : 0.0f;
    const int qi = int(roundf(__fmul_rn(v, id)));
    int sum = qi;
#pragma unroll
    for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    q[r * cols + b * 32 + lane] = int8_t(qi);
    if (lane == 0) {
      d[r * nbr + b] = db;
      s[r * nbr + b] = __fmul_rn(db, float(sum));
    }
  }
}

// ---- the product ----
struct GemvK {
  const uint8_t* w;      // packed weight
  int64_t rows, cols;
  const int8_t* xq;
  const float* xd;
  const float* xs;
  float* y;
  int64_t y_stride;
  bool accumulate;
};

__device__ __forceinline__ uint4 ldg16(const void* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }
__device__ __forceinline__ int dot8(const uint32_t (&w)[8], const uint4 a, const uint4 b, int acc) {
  acc = __dp4a(int(w[0]), int(a.x), acc);
  acc = __dp4a(int(w[1]), int(a.y), acc);
  acc = __dp4a(int(w[2]), int(a.z), acc);
  acc = __dp4a(int(w[3]), int(a.w), acc);
  acc = __dp4a(int(w[4]), int(b.x), acc);
  acc = __dp4a(int(w[5]), int(b.y), acc);
  acc = __dp4a(int(w[6]), int(b.z), acc);
  return __dp4a(int(w[7]), int(b.w), acc);
}

// Byte k (runtime) of a 32-bit word.
__device__ __forceinline__ int byte_of(uint32_t w, int k) { return int((w >> (8 * k)) & 0xffu); }

// Elements per chunk and the per-chunk product. kWide: the 64-element Q4_K chunk (fewer header
// decodes per weight byte; more registers, so only with R = 2 rows, i.e. m <= 2).
template <uint32_t T, bool kWide = false>
struct Chunk;

template <>
struct Chunk<ggml::Q8_0> {
  static constexpr int kElems = 32;
  struct W {
    uint32_t q[8];
    float d;
  };
  static __device__ __forceinline__ void load(const GemvK& p, int64_t row, int64_t c, W& w) {
    const uint4 a = ldg16(p.w + row * p.cols + 32 * c), b = ldg16(p.w + row * p.cols + 32 * c + 16);
    w.q[0] = a.x, w.q[1] = a.y, w.q[2] = a.z, w.q[3] = a.w, w.q[4] = b.x, w.q[5] = b.y, w.q[6] = b.z, w.q[7] = b.w;
    const __half* sc = reinterpret_cast<const __half*>(p.w + p.rows * p.cols);
    w.d = __half2float(sc[row * (p.cols / 32) + c]);
  }
  struct X {
    uint4 a, b;
    float d;
  };
  static __device__ __forceinline__ void load_x(const GemvK& p, int m, int64_t c, X& x) {
    const int8_t* xq = p.xq + m * p.cols + 32 * c;
    x.a = ldg16(xq), x.b = ldg16(xq + 16);
    x.d = __ldg(p.xd + m * (p.cols / 32) + c);
  }
  static __device__ __forceinline__ float dot(const W& w, const X& x) {
    return __fmul_rn(w.d, x.d) * float(dot8(w.q, x.a, x.b, 0));
  }
};

template <>
struct Chunk<ggml::Q4_1> {
  static constexpr int kElems = 32;
  struct W {
    uint32_t lo[4], hi[4];
    float d, m;
  };
  static __device__ __forceinline__ void load(const GemvK& p, int64_t row, int64_t c, W& w) {
    const int64_t b = row * (p.cols / 32) + c;
    const uint4 a = ldg16(p.w + 16 * b);
    const uint32_t q[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) w.lo[j] = q[j] & 0x0f0f0f0fu, w.hi[j] = (q[j] >> 4) & 0x0f0f0f0fu;
    const uint32_t dm = __ldg(reinterpret_cast<const uint32_t*>(p.w + p.rows * p.cols / 2) + b);
    const __half2 h = *reinterpret_cast<const __half2*>(&dm);
    w.d = __low2float(h), w.m = __high2float(h);
  }
  struct X {
    uint4 a, b;
    float d, s;
  };
  static __device__ __forceinline__ void load_x(const GemvK& p, int m, int64_t c, X& x) {
    const int8_t* xq = p.xq + m * p.cols + 32 * c;
    x.a = ldg16(xq), x.b = ldg16(xq + 16);
    x.d = __ldg(p.xd + m * (p.cols / 32) + c);
    x.s = __ldg(p.xs + m * (p.cols / 32) + c);
  }
  static __device__ __forceinline__ float dot(const W& w, const X& x) {
    const uint32_t q[8] = {w.lo[0], w.lo[1], w.lo[2], w.lo[3], w.hi[0], w.hi[1], w.hi[2], w.hi[3]};
    const int isum = dot8(q, x.a, x.b, 0);
    return fmaf(__fmul_rn(w.d, x.d), float(isum), __fmul_rn(w.m, x.s));
  }
};

// Q4_K scale and min of sub-blocks 2g and 2g+1 from the super-block header h (d, dmin, scales[12]):
// scales[0..11] = bytes of h.y, h.z, h.w; sub-block j < 4: sc = s[j] & 63, m = s[j+4] & 63;
// j >= 4: sc = (s[j+4] & 15) | (s[j-4] >> 6) << 4, m = (s[j+4] >> 4) | (s[j] >> 6) << 4.
// dmin_on = false zeroes the mins (the second half of a split sub-block pair adds none).
__device__ __forceinline__ void q4k_scales(const uint4 h, int g, bool dmin_on, float& a0, float& b0, float& a1,
                                           float& b1) {
  const __half2 dd = *reinterpret_cast<const __half2*>(&h.x);
  const float d = __low2float(dd), dmin = dmin_on ? __high2float(dd) : 0.0f;
  int sc[2], mn[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int j = 2 * g + k;
    if (g < 2) {
      sc[k] = byte_of(h.y, j) & 63;
      mn[k] = byte_of(h.z, j) & 63;
    } else {
      sc[k] = (byte_of(h.w, j - 4) & 15) | (byte_of(h.y, j - 4) >> 6) << 4;
      mn[k] = (byte_of(h.w, j - 4) >> 4) | (byte_of(h.z, j - 4) >> 6) << 4;
    }
  }
  a0 = __fmul_rn(d, float(sc[0])), b0 = __fmul_rn(dmin, float(mn[0]));
  a1 = __fmul_rn(d, float(sc[1])), b1 = __fmul_rn(dmin, float(mn[1]));
}

template <>
struct Chunk<ggml::Q4_K, true> {
  // chunk c = (super-block c/4, pair g = c%4): qs[32g .. 32g+31]; low nibbles are sub-block 2g
  // (elements 64g .. 64g+31), high nibbles sub-block 2g+1 (64g+32 ..).
  static constexpr int kElems = 64;
  struct W {
    uint32_t lo[8], hi[8];
    float a0, b0, a1, b1;
  };
  static __device__ __forceinline__ void load(const GemvK& p, int64_t row, int64_t c, W& w) {
    const uint8_t* sb = p.w + row * (p.cols / 256) * 144 + (c >> 2) * 144;
    const int g = int(c & 3);
    const uint4 h = ldg16(sb), qa = ldg16(sb + 16 + 32 * g), qb = ldg16(sb + 32 + 32 * g);
    const uint32_t q[8] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};
#pragma unroll
    for (int j = 0; j < 8; ++j) w.lo[j] = q[j] & 0x0f0f0f0fu, w.hi[j] = (q[j] >> 4) & 0x0f0f0f0fu;
    q4k_scales(h, g, true, w.a0, w.b0, w.a1, w.b1);
  }
  struct X {
    uint4 la, lb, ha, hb;
    float d0, s0, d1, s1;
  };
  static __device__ __forceinline__ void load_x(const GemvK& p, int m, int64_t c, X& x) {
    const int8_t* xq = p.xq + m * p.cols + 64 * c;
    x.la = ldg16(xq), x.lb = ldg16(xq + 16), x.ha = ldg16(xq + 32), x.hb = ldg16(xq + 48);
    const int64_t b = m * (p.cols / 32) + 2 * c;
    x.d0 = __ldg(p.xd + b), x.d1 = __ldg(p.xd + b + 1);
    x.s0 = __ldg(p.xs + b), x.s1 = __ldg(p.xs + b + 1);
  }
  static __device__ __forceinline__ float dot(const W& w, const X& x) {
    const int i0 = dot8(w.lo, x.la, x.lb, 0), i1 = dot8(w.hi, x.ha, x.hb, 0);
    const float v0 = fmaf(__fmul_rn(w.a0, x.d0), float(i0), -__fmul_rn(w.b0, x.s0));
    const float v1 = fmaf(__fmul_rn(w.a1, x.d1), float(i1), -__fmul_rn(w.b1, x.s1));
    return v0 + v1;
  }
};

template <>
struct Chunk<ggml::Q4_K, false> {
  // chunk c = (super-block c/8, pair g = (c/2)%4, half h = c%2): the 16 bytes qs[32g + 16h ..];
  // low nibbles are elements 64g + 16h + (0..15) of sub-block 2g, high nibbles the same places of
  // sub-block 2g+1. The min term -dmin*m * sum(x) of each sub-block is added once, by h = 0.
  static constexpr int kElems = 32;
  struct W {
    uint32_t lo[4], hi[4];
    float a0, b0, a1, b1;  // d*sc, dmin*m of sub-blocks 2g and 2g+1 (b = 0 for h = 1)
  };
  static __device__ __forceinline__ void load(const GemvK& p, int64_t row, int64_t c, W& w) {
    const uint8_t* sb = p.w + row * (p.cols / 256) * 144 + (c >> 3) * 144;
    const int g = int((c >> 1) & 3), hf = int(c & 1);
    const uint4 h = ldg16(sb), qa = ldg16(sb + 16 + 32 * g + 16 * hf);
    const uint32_t q[4] = {qa.x, qa.y, qa.z, qa.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) w.lo[j] = q[j] & 0x0f0f0f0fu, w.hi[j] = (q[j] >> 4) & 0x0f0f0f0fu;
    q4k_scales(h, g, hf == 0, w.a0, w.b0, w.a1, w.b1);
  }
  struct X {
    uint4 lo, hi;
    float d0, s0, d1, s1;
  };
  static __device__ __forceinline__ void load_x(const GemvK& p, int m, int64_t c, X& x) {
    const int64_t e = (c >> 3) * 256 + ((c >> 1) & 3) * 64 + (c & 1) * 16;  // first low-nibble element
    const int8_t* xq = p.xq + m * p.cols + e;
    x.lo = ldg16(xq), x.hi = ldg16(xq + 32);
    const int64_t b = m * (p.cols / 32) + (c >> 3) * 8 + ((c >> 1) & 3) * 2;
    x.d0 = __ldg(p.xd + b), x.d1 = __ldg(p.xd + b + 1);
    x.s0 = __ldg(p.xs + b), x.s1 = __ldg(p.xs + b + 1);
  }
  static __device__ __forceinline__ float dot(const W& w, const X& x) {
    int i0 = __dp4a(int(w.lo[0]), int(x.lo.x), 0);
    i0 = __dp4a(int(w.lo[1]), int(x.lo.y), i0);
    i0 = __dp4a(int(w.lo[2]), int(x.lo.z), i0);
    i0 = __dp4a(int(w.lo[3]), int(x.lo.w), i0);
    int i1 = __dp4a(int(w.hi[0]), int(x.hi.x), 0);
    i1 = __dp4a(int(w.hi[1]), int(x.hi.y), i1);
    i1 = __dp4a(int(w.hi[2]), int(x.hi.z), i1);
    i1 = __dp4a(int(w.hi[3]), int(x.hi.w), i1);
    const float v0 = fmaf(__fmul_rn(w.a0, x.d0), float(i0), -__fmul_rn(w.b0, x.s0));
    const float v1 = fmaf(__fmul_rn(w.a1, x.d1), float(i1), -__fmul_rn(w.b1, x.s1));
    return v0 + v1;
  }
};

template <uint32_t T, int M, int R>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvK p) {
  using C = Chunk<T, T == ggml::Q4_K && R == 2>;
  const int64_t r0 = int64_t(blockIdx.x) * R;
  const int64_t n_chunks = p.cols / C::kElems;
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.f;
  for (int64_t c = threadIdx.x; c < n_chunks; c += kThreads) {
    typename C::W w[R];
#pragma unroll
    for (int r = 0; r < R; ++r) C::load(p, min(r0 + r, p.rows - 1), c, w[r]);  // rows past the end: clamped, not stored
#pragma unroll
    for (int m = 0; m < M; ++m) {
      typename C::X x;
      C::load_x(p, m, c, x);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][m] += C::dot(w[r], x);
    }
  }
  __shared__ float red[kThreads / 32][R * M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = acc[r][m];
#pragma unroll
      for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) red[warp][r * M + m] = v;
    }
  __syncthreads();
  if (threadIdx.x < R * M) {
    const int r = threadIdx.x / M, m = threadIdx.x % M;
    if (r0 + r < p.rows) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < kThreads / 32; ++w) v += red[w][threadIdx.x];
      float* y = p.y + m * p.y_stride + r0 + r;
      *y = p.accumulate ? *y + v : v;
    }
  }
}

// R0 > 0: that many weight rows per block whatever M (GemvParams::row_invariant), else the
// measured best (2 rows for M <= 2, 4 above).
template <uint32_t T, int M, int R0>
void launch_m(const GemvK& k, cudaStream_t st) {
  constexpr int R = R0 > 0 ? R0 : M <= 2 ? 2 : 4;
  const int64_t blocks = (k.rows + R - 1) / R;
  gemv_kernel<T, M, R><<<unsigned(blocks), kThreads, 0, st>>>(k);
}

template <uint32_t T, int R0 = 0>
void launch_t(const GemvK& k, int m, cudaStream_t st) {
  switch (m) {
    case 1: launch_m<T, 1, R0>(k, st); break;
    case 2: launch_m<T, 2, R0>(k, st); break;
    case 3: launch_m<T, 3, R0>(k, st); break;
    case 4: launch_m<T, 4, R0>(k, st); break;
    case 5: launch_m<T, 5, R0>(k, st); break;
    case 6: launch_m<T, 6, R0>(k, st); break;
    case 7: launch_m<T, 7, R0>(k, st); break;
    default: launch_m<T, 8, R0>(k, st); break;
  }
}

int64_t col_multiple(uint32_t type) { return type == ggml::Q4_K ? 256 : 32; }

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

bool gemv_type_supported(uint32_t type) { return type == ggml::Q8_0 || type == ggml::Q4_1 || type == ggml::Q4_K; }

size_t gemv_packed_bytes(uint32_t type, int64_t rows, int64_t cols) {
  VQ_CHECK(gemv_type_supported(type), "cuda::gemv: type {} has no quantized product (q8_0, q4_1, q4_K do)",
           weight_type_name(type));
  VQ_CHECK(rows >= 0 && cols > 0 && cols % col_multiple(type) == 0,
           "cuda::gemv({} [{}, {}]): cols must be a positive multiple of {}", weight_type_name(type), rows, cols,
           col_multiple(type));
  return size_t(rows) * weight_row_bytes(type, cols);
}

void gemv_pack_device(const GemvPackParams& p, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::gemv_pack: {}", cuda_unavailable_reason());
  const size_t bytes = gemv_packed_bytes(p.type, p.rows, p.cols);
  if (p.rows == 0) return;
  VQ_CHECK(p.src && p.dst && aligned16(p.dst), "cuda::gemv_pack({} [{}, {}]): null src, or dst not 16-byte aligned",
           weight_type_name(p.type), p.rows, p.cols);
  cudaStream_t st = as_stream(stream);
  const int64_t n_blocks = p.rows * (p.cols / 32);
  const unsigned grid = unsigned(std::clamp<int64_t>((n_blocks + 255) / 256, 1, 1 << 16));
  const uint8_t* src = static_cast<const uint8_t*>(p.src);
  uint8_t* dst = static_cast<uint8_t*>(p.dst);
  if (p.type == ggml::Q4_K) {
    VQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, st));
  } else if (p.type == ggml::Q8_0) {
    pack_q8_0_kernel<<<grid, 256, 0, st>>>(src, n_blocks, dst, reinterpret_cast<uint16_t*>(dst + p.rows * p.cols));
    VQ_CUDA_LAUNCHED("gemv_pack q8_0");
  } else {
    VQ_CHECK(reinterpret_cast<uintptr_t>(src) % 4 == 0, "cuda::gemv_pack(q4_1 [{}, {}]): src must be 4-byte aligned",
             p.rows, p.cols);
    pack_q4_1_kernel<<<grid, 256, 0, st>>>(src, n_blocks, dst, reinterpret_cast<uint32_t*>(dst + p.rows * p.cols / 2));
    VQ_CUDA_LAUNCHED("gemv_pack q4_1");
  }
}

void quantize_act_device(const QuantizeActParams& p, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::quantize_act: {}", cuda_unavailable_reason());
  VQ_CHECK(p.rows >= 0 && p.cols > 0 && p.cols % 32 == 0,
           "cuda::quantize_act([{}, {}]): cols must be a positive multiple of 32", p.rows, p.cols);
  VQ_CHECK(p.x_type != ElemType::bf16, "cuda::quantize_act([{}, {}]): x must be f32 or f16", p.rows, p.cols);
  if (p.rows == 0) return;
  VQ_CHECK(p.x && p.q && p.d && p.s, "cuda::quantize_act([{}, {}]): null pointer", p.rows, p.cols);
  const int64_t xs = p.x_stride ? p.x_stride : p.cols;
  VQ_CHECK(xs >= p.cols, "cuda::quantize_act([{}, {}]): x_stride {} < cols", p.rows, p.cols, xs);
  const int64_t warps = int64_t(p.rows) * (p.cols / 32);
  const unsigned grid = unsigned(std::clamp<int64_t>((warps + 7) / 8, 1, 1 << 16));
  cudaStream_t st = as_stream(stream);
  if (p.x_type == ElemType::f32)
    quantize_act_kernel<float><<<grid, 256, 0, st>>>(static_cast<const float*>(p.x), xs, p.rows, p.cols, p.q, p.d, p.s);
  else
    quantize_act_kernel<__half><<<grid, 256, 0, st>>>(static_cast<const __half*>(p.x), xs, p.rows, p.cols, p.q, p.d, p.s);
  VQ_CUDA_LAUNCHED("quantize_act");
}

namespace {
template <class TO>
__global__ void dequantize_act_kernel(const int8_t* __restrict__ q, const float* __restrict__ d, int64_t n, int64_t cols,
                                      TO* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const float v = d[r * (cols / 32) + c / 32] * float(q[i]);
    if constexpr (sizeof(TO) == 4) out[i] = v;
    else out[i] = __float2half_rn(v);
  }
}
}  // namespace

void dequantize_act_device(const DequantizeActParams& p, void* stream) {
  VQ_CHECK(p.rows >= 0 && p.cols > 0 && p.cols % 32 == 0,
           "cuda::dequantize_act([{}, {}]): cols must be a positive multiple of 32", p.rows, p.cols);
  VQ_CHECK(p.out_type != ElemType::bf16, "cuda::dequantize_act([{}, {}]): out must be f32 or f16", p.rows, p.cols);
  if (p.rows == 0) return;
  VQ_CHECK(p.q && p.d && p.out, "cuda::dequantize_act([{}, {}]): null pointer", p.rows, p.cols);
  const int64_t n = int64_t(p.rows) * p.cols;
  const unsigned grid = unsigned(std::clamp<int64_t>((n + 255) / 256, 1, 1 << 16));
  cudaStream_t st = as_stream(stream);
  if (p.out_type == ElemType::f32)
    dequantize_act_kernel<float><<<grid, 256, 0, st>>>(p.q, p.d, n, p.cols, static_cast<float*>(p.out));
  else
    dequantize_act_kernel<__half><<<grid, 256, 0, st>>>(p.q, p.d, n, p.cols, static_cast<__half*>(p.out));
  VQ_CUDA_LAUNCHED("dequantize_act");
}

void gemv_device(const GemvParams& p, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::gemv: {}", cuda_unavailable_reason());
  gemv_packed_bytes(p.type, p.rows, p.cols);  // type and shape checks
  const char* tn = weight_type_name(p.type);
  VQ_CHECK(p.m >= 1 && p.m <= kGemvMaxRows, "cuda::gemv({} [{}, {}]): m = {} activation rows, must be 1..{}", tn,
           p.rows, p.cols, p.m, kGemvMaxRows);
  if (p.rows == 0) return;
  VQ_CHECK(p.w && p.xq && p.xd && p.xs && p.y, "cuda::gemv({} [{}, {}], m={}): null pointer", tn, p.rows, p.cols, p.m);
  VQ_CHECK(aligned16(p.w) && aligned16(p.xq), "cuda::gemv({} [{}, {}]): w and xq must be 16-byte aligned", tn, p.rows,
           p.cols);
  const int64_t ys = p.y_stride ? p.y_stride : p.rows;
  VQ_CHECK(p.m == 1 || ys >= p.rows, "cuda::gemv({} [{}, {}]): y_stride {} < rows", tn, p.rows, p.cols, ys);
  VQ_CHECK(p.rows / 2 < (int64_t(1) << 31), "cuda::gemv({} [{}, {}]): too many rows", tn, p.rows, p.cols);
  GemvK k{static_cast<const uint8_t*>(p.w), p.rows, p.cols, p.xq, p.xd, p.xs, p.y, ys, p.accumulate};
  cudaStream_t st = as_stream(stream);
  if (p.row_invariant) {
    if (p.type == ggml::Q8_0) launch_t<ggml::Q8_0, 4>(k, p.m, st);
    else if (p.type == ggml::Q4_1) launch_t<ggml::Q4_1, 4>(k, p.m, st);
    else launch_t<ggml::Q4_K, 4>(k, p.m, st);
  } else if (p.type == ggml::Q8_0) {
    launch_t<ggml::Q8_0>(k, p.m, st);
  } else if (p.type == ggml::Q4_1) {
    launch_t<ggml::Q4_1>(k, p.m, st);
  } else {
    launch_t<ggml::Q4_K>(k, p.m, st);
  }
  VQ_CUDA_LAUNCHED("gemv");
}

// Run 9 (docs/CUDA_NOTES.md section 8): counting the activation-quantization launch, the quantized
// product beat fp16 cuBLAS on the large Llama / Falcon projections for q8_0 and q4_1 up to 4 rows
// (geomean 1.16-1.62x) and for q4_K up to 2 rows (1.09-1.34x), and lost at 8 rows (0.72-0.93x),
// where the dp4a inner loop, not memory, is the bound.
bool gemv_preferred(uint32_t type, int m) {
  if (!gemv_type_supported(type) || m < 1) return false;
  return m <= (type == ggml::Q4_K ? 2 : 4);
}

}  // namespace vq::cuda
