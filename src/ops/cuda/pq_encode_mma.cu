// Tensor-core nearest-centroid encoder (pq.h: pq_encode_mma_device). Design, floor and
// measurements: docs/CUDA_NOTES.md section 1, "Tensor-core encoder".
//
// Distances as a matrix product: d(x, c) - |x|^2 = |c|^2 - 2 x.c. A warp takes tiles of 16
// sub-vectors (the rows of an mma.m16n8k16 A operand) against the whole codebook in n-tiles of 8
// centroids, fp32 accumulation:
//   sub_dim 8: D = [x_hi | x_lo] . [-2c ; -2c] + |c|^2   (m16n8k16; x = x_hi + x_lo, both fp16;
//              |c|^2 in fp32 as the accumulator's initial value)
//   sub_dim 4: D = [x_hi | x_lo | 1 1 | 0...] . [-2c ; -2c ; |c|^2_hi ; |c|^2_lo ; 0...]  (one m16n8k16)
// so x enters at ~2^-22 relative precision and |c|^2 likewise; the centroids enter as fp16
// (2^-11 relative rounding): that is this encoder's only approximation beyond fp32 rounding.
// The codebook is staged once per block in shared memory as fp16 -2c and fp32 |c|^2 (persistent
// grid); per n-tile a lane reads its B fragment (one conflict-free LDS.32) and, for sub_dim 8, its
// accumulator quad of |c|^2 (one broadcast LDS.128): ~2 wavefronts per 16x8 tile against ~9 ALU
// instructions of argmin (measurements and SASS counts: docs/CUDA_NOTES.md section 1, variants v3a-v3e). (All
// fragments in registers made ptxas hoist every n-tile's mma and spill: 128 registers, 268 B.)
// Argmin: the centroid index is spliced into the low 8 mantissa bits of each distance (LOP3)
// and a running fminf keeps the best (FMNMX): 2 ALU ops per (sub-vector, centroid) pair, and
// distances are compared at 2^-15 relative resolution (finer than the fp16 centroid rounding).
// Zero scratch: x is read once from global memory (prefetched a tile ahead), codes written once.
#include <cuda_fp16.h>

#include <cstdint>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/pq.h"

namespace vq::cuda {
namespace {

constexpr int kMmaThreads = 256;

struct MmaEncodeParams {
  int64_t n;           // sub-vectors (rows of x viewed as [n, DS])
  const float* x;      // [n, DS] f32
  const float* book;   // [K, DS] f32
  uint16_t* codes;     // [n]
  // 0xFFFFFF00, passed at run time so that it stays a register: (d & mask) | index is then one
  // LOP3 with the index as its immediate (with both constants ptxas emitted two LOP3s, run 6b).
  uint32_t hi_mask;
};

__device__ __forceinline__ uint32_t pack_half2(__half lo, __half hi) {
  return uint32_t(__half_as_ushort(lo)) | (uint32_t(__half_as_ushort(hi)) << 16);
}
// (x0, x1) -> hi = fp16(x), lo = fp16(x - hi), each as a half2 register (element 0 in the low half).
__device__ __forceinline__ void split2(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
  hi = pack_half2(h0, h1);
  lo = pack_half2(__float2half_rn(x0 - __half2float(h0)), __float2half_rn(x1 - __half2float(h1)));
}

__device__ __forceinline__ void mma_k16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1, const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3]));
}


// Lane (g = lane/4, t = lane%4) loads the two floats of x it needs for rows g and g+8 of a tile:
// dims 2t, 2t+1 (sub_dim 8) or 2(t&1), 2(t&1)+1 (sub_dim 4, lanes t >= 2 take the lo part).
template <int DS>
__device__ __forceinline__ void load_tile(const MmaEncodeParams& p, int64_t tile, int g, int t, float2 (&v)[2]) {
  const int dim = DS == 8 ? 2 * t : 2 * (t & 1);
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = tile * 16 + g + 8 * r;
    v[r] = row < p.n ? __ldg(reinterpret_cast<const float2*>(p.x + row * DS + dim)) : make_float2(0.f, 0.f);
  }
}

// RT: row tiles of 16 sub-vectors per warp and loop iteration (2: each B fragment and |c|^2 quad
// read from shared memory serves two independent mma + argmin chains; run 19).
template <int DS, int NT, int RT>
__global__ void __launch_bounds__(kMmaThreads, 4) encode_mma_kernel(MmaEncodeParams p) {
  constexpr int K = NT * 8;
  // s_b: [K][DS] half, -2c; s_n: [K] f32 |c|^2; s_bn: [K] half2 (staging for the register fragments)
  __shared__ __align__(16) __half s_b[K * DS];
  __shared__ __align__(8) float s_n[K];
  __shared__ uint32_t s_bn[K];  // (|c|^2 hi, lo) as half2 (sub_dim 4)
  // s_n4[i] = (|c|^2 of centroids 2i, 2i+1, again 2i, 2i+1): sub_dim 8's accumulator quad in one LDS.128
  __shared__ float4 s_n4[K / 2];
  for (int c = threadIdx.x; c < K; c += kMmaThreads) {
    float n = 0.f;
#pragma unroll
    for (int e = 0; e < DS; ++e) {
      const float v = __ldg(p.book + c * DS + e);
      n = fmaf(v, v, n);
      s_b[c * DS + e] = __float2half_rn(-2.0f * v);
    }
    s_n[c] = n;
    const __half nh = __float2half_rn(n);
    s_bn[c] = pack_half2(nh, __float2half_rn(n - __half2float(nh)));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < K / 2; i += kMmaThreads) s_n4[i] = make_float4(s_n[2 * i], s_n[2 * i + 1], s_n[2 * i], s_n[2 * i + 1]);
  __syncthreads();
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  // B fragment of n-tile j (column g = centroid 8j+g; b0 = B rows 2t, 2t+1, b1 = rows 2t+8, 2t+9):
  // -2c at dims (2t, 2t+1) [sub_dim 8] or (2(t&1), +1) [sub_dim 4, rows 4..7 repeat rows 0..3];
  // sub_dim 4: b1 = (|c|^2 hi, lo) on the lanes t == 0, else 0.
  const int bdim = DS == 8 ? 2 * t : 2 * (t & 1);
  const uint32_t ones = t == 0 ? pack_half2(__float2half_rn(1.f), __float2half_rn(1.f)) : 0u;

  const int64_t n_tiles = (p.n + 16 * RT - 1) / (16 * RT);  // super-tiles of RT row tiles
  const int64_t warp0 = (int64_t(blockIdx.x) * kMmaThreads + threadIdx.x) >> 5;
  const int64_t n_warps = (int64_t(gridDim.x) * kMmaThreads) >> 5;
  float2 nxt[RT][2];
  if (warp0 < n_tiles)
#pragma unroll
    for (int r = 0; r < RT; ++r) load_tile<DS>(p, warp0 * RT + r, g, t, nxt[r]);
  for (int64_t tile = warp0; tile < n_tiles; tile += n_warps) {
    float2 cur[RT][2];
#pragma unroll
    for (int r = 0; r < RT; ++r) cur[r][0] = nxt[r][0], cur[r][1] = nxt[r][1];
    if (tile + n_warps < n_tiles)  // prefetch
#pragma unroll
      for (int r = 0; r < RT; ++r) load_tile<DS>(p, (tile + n_warps) * RT + r, g, t, nxt[r]);
    // A fragments: a0 (row g, k 2t..), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..), a3 (row g+8, k 2t+8..)
    uint32_t a0[RT], a1[RT], a2[RT], a3[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      uint32_t hi[2], lo[2];
      split2(cur[r][0].x, cur[r][0].y, hi[0], lo[0]);
      split2(cur[r][1].x, cur[r][1].y, hi[1], lo[1]);
      if constexpr (DS == 8) {
        a0[r] = hi[0], a1[r] = hi[1], a2[r] = lo[0], a3[r] = lo[1];
      } else {
        a0[r] = t < 2 ? hi[0] : lo[0], a1[r] = t < 2 ? hi[1] : lo[1], a2[r] = ones, a3[r] = ones;
      }
    }
    // Running minima of spliced keys, rows g and g+8 of each row tile, split by column parity (two
    // independent chains per row). The spliced index is 8j + col (compile-time, an immediate of the
    // LOP3); the lane's 2t is OR-ed in once at the end (bits 1-2 of the index are zero until then).
    float b0e[RT], b0o[RT], b1e[RT], b1o[RT];
#pragma unroll
    for (int r = 0; r < RT; ++r) b0e[r] = b0o[r] = b1e[r] = b1o[r] = INFINITY;
    const uint32_t hi_mask = p.hi_mask;
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      const uint32_t bc = *reinterpret_cast<const uint32_t*>(s_b + (8 * j + g) * DS + bdim);
      float e[4];
      uint32_t bn = 0u;
      if constexpr (DS == 8) {
        const float4 cn = s_n4[4 * j + t];
        e[0] = cn.x, e[1] = cn.y, e[2] = cn.z, e[3] = cn.w;
      } else {
        bn = t == 0 ? s_bn[8 * j + g] : 0u;
        e[0] = e[1] = e[2] = e[3] = 0.f;
      }
#pragma unroll
      for (int r = 0; r < RT; ++r) {
        float d[4];
        mma_k16(d, a0[r], a1[r], a2[r], a3[r], bc, DS == 8 ? bc : bn, e);
        b0e[r] = fminf(b0e[r], __uint_as_float((__float_as_uint(d[0]) & hi_mask) | uint32_t(8 * j)));
        b0o[r] = fminf(b0o[r], __uint_as_float((__float_as_uint(d[1]) & hi_mask) | uint32_t(8 * j + 1)));
        b1e[r] = fminf(b1e[r], __uint_as_float((__float_as_uint(d[2]) & hi_mask) | uint32_t(8 * j)));
        b1o[r] = fminf(b1o[r], __uint_as_float((__float_as_uint(d[3]) & hi_mask) | uint32_t(8 * j + 1)));
      }
    }
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      float best0 = __uint_as_float(__float_as_uint(fminf(b0e[r], b0o[r])) | uint32_t(2 * t));
      float best1 = __uint_as_float(__float_as_uint(fminf(b1e[r], b1o[r])) | uint32_t(2 * t));
#pragma unroll
      for (int o = 1; o <= 2; o <<= 1) {
        best0 = fminf(best0, __shfl_xor_sync(0xffffffffu, best0, o));
        best1 = fminf(best1, __shfl_xor_sync(0xffffffffu, best1, o));
      }
      // A row whose distances are all NaN keeps +inf: code 0 (as the exact encoder).
      const int64_t r0 = (tile * RT + r) * 16 + g, r1 = r0 + 8;
      if (t == 0 && r0 < p.n) p.codes[r0] = uint16_t(__float_as_uint(best0) & 0xFFu);
      if (t == 1 && r1 < p.n) p.codes[r1] = uint16_t(__float_as_uint(best1) & 0xFFu);
    }
  }
}

int mma_blocks() {
  static int v = [] {
    int dev = 0, sms = 0;
    VQ_CUDA_CHECK(cudaGetDevice(&dev));
    VQ_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return 4 * sms;  // __launch_bounds__(256, 4): four blocks (32 warps) per SM
  }();
  return v;
}

template <int DS, int NT>
void launch_nt(const MmaEncodeParams& p, int rt, cudaStream_t st) {
  const int64_t tiles = (p.n + 16 * rt - 1) / (16 * rt);
  const int64_t need = (tiles + kMmaThreads / 32 - 1) / (kMmaThreads / 32);
  const int blocks = int(need < mma_blocks() ? need : mma_blocks());
  if (rt == 2) encode_mma_kernel<DS, NT, 2><<<blocks, kMmaThreads, 0, st>>>(p);
  else encode_mma_kernel<DS, NT, 1><<<blocks, kMmaThreads, 0, st>>>(p);
  VQ_CUDA_LAUNCHED("encode_mma_kernel");
}

template <int DS>
void launch_ds(const MmaEncodeParams& p, int K, int rt, cudaStream_t st) {
  switch (K) {
    case 8: return launch_nt<DS, 1>(p, rt, st);
    case 16: return launch_nt<DS, 2>(p, rt, st);
    case 32: return launch_nt<DS, 4>(p, rt, st);
    case 64: return launch_nt<DS, 8>(p, rt, st);
    case 128: return launch_nt<DS, 16>(p, rt, st);
    default: return launch_nt<DS, 32>(p, rt, st);
  }
}

// Row tiles per warp iteration of the shipped encoder (run 19: BENCHMARKS.md (a)).
constexpr int kShippedRowTiles = 2;

}  // namespace

bool pq_encode_mma_supported(const PQShape& s) {
  const int K = s.n_centroids;
  return !s.per_subspace && (s.sub_dim == 4 || s.sub_dim == 8) && K >= 8 && K <= 256 && (K & (K - 1)) == 0;
}

void pq_encode_mma_device(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes, void* stream) {
  detail::pq_encode_mma_device_rt(s, x, codebooks, codes, kShippedRowTiles, stream);
}

void detail::pq_encode_mma_device_rt(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes,
                                     int row_tiles, void* stream) {
  check_pq_shape(s, "cuda::pq_encode_mma");
  VQ_CHECK(pq_encode_mma_supported(s),
           "cuda::pq_encode_mma: sub_dim {} / n_centroids {} / per_subspace {} not supported (sub_dim 4 or 8, "
           "n_centroids a power of two in 8..256, one shared codebook)",
           s.sub_dim, s.n_centroids, s.per_subspace);
  VQ_CHECK(cuda_device_available(), "cuda::pq_encode_mma: {}", cuda_unavailable_reason());
  MmaEncodeParams p{int64_t(s.n) * s.n_sub, x, codebooks, codes, 0xFFFFFF00u};
  if (p.n == 0) return;
  VQ_CHECK(row_tiles == 1 || row_tiles == 2, "cuda::pq_encode_mma: row_tiles = {} must be 1 or 2", row_tiles);
  if (s.sub_dim == 8) launch_ds<8>(p, s.n_centroids, row_tiles, as_stream(stream));
  else launch_ds<4>(p, s.n_centroids, row_tiles, as_stream(stream));
}

void pq_encode_mma(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes) {
  check_pq_shape(s, "cuda::pq_encode_mma");
  const size_t xb = size_t(s.n) * s.n_sub * s.sub_dim * 4;
  const size_t cb = size_t(pq_n_books(s)) * s.n_centroids * s.sub_dim * 4;
  const size_t ob = size_t(s.n) * s.n_sub * 2;
  DeviceBuffer dx = to_device(x, xb), dc = to_device(codebooks, cb), dout(ob);
  pq_encode_mma_device(s, dx.as<float>(), dc.as<float>(), dout.as<uint16_t>());
  device_synchronize();
  dout.download(codes, ob);
}

}  // namespace vq::cuda
