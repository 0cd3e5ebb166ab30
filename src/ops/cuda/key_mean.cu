// The score terms of VecInfer's rotated key mean (key_mean_cuda.h).
//
// Block = (kRows consecutive rows, one KV head, one of gridDim.z segment slots), 256 threads. The
// block turns its rows' queries into two coefficients per (row, query head, pair):
//   q . R(phi) mu over pair (a, b) = cos(phi) (q_a mu_a + q_b mu_b) + sin(phi) (q_b mu_a - q_a mu_b),
// then walks tiles of 32 segments (slot z takes tiles z, z + gridDim.z, ...) over the union of its
// rows' coded ranges: the tile's (cos, sin) rows are staged once in shared memory and serve every
// row and query head of the block; a warp computes one (row, head)'s 32 segments, lane = segment.
// Rows of a prefill chunk are consecutive positions of one sequence, so their ranges nearly
// coincide; decode rows of different sequences share the table's tiles where they overlap.
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/key_mean_cuda.h"
#include "ops/cuda/stream_cuda.h"

namespace vq::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 4;      // rows per block
constexpr int kSegTile = 32;  // segments per tile (a warp's lanes)

size_t bias_smem_bytes(int group, int n_pairs) {
  return (size_t(kRows) * group * n_pairs * 2 + size_t(kSegTile) * (2 * n_pairs + 1)) * sizeof(float) +
         kRows * 2 * sizeof(int64_t);
}

__global__ void __launch_bounds__(kThreads) key_bias_kernel(KeyBiasParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int np = p.km.n_pairs, G = p.group, D = p.head_dim, lt = p.km.log2_tokens;
  const int ldc = 2 * np + 1;  // floats per staged segment (odd: lanes on consecutive segments, distinct banks)
  int64_t* seg_lo = reinterpret_cast<int64_t*>(smem);  // [kRows] first segment of the row's coded range
  int64_t* seg_hi = seg_lo + kRows;                    // [kRows] one past its last (lo == hi: none)
  float* coef = reinterpret_cast<float*>(seg_hi + kRows);  // [kRows][G][np][2]
  float* cs = coef + kRows * G * np * 2;                   // [kSegTile][ldc]
  const int r0 = blockIdx.x * kRows, kh = blockIdx.y;
  const int64_t q_stride = p.q_stride ? p.q_stride : int64_t(p.n_kv_heads) * G * D;
  if (threadIdx.x < kRows) {
    const int r = r0 + threadIdx.x;
    int64_t lo = 0, hi = 0;
    if (r < p.rows) {
      const PagedRanges g = paged_ranges(p.rule, p.pos[r]);
      if (g.code_hi > g.code_lo) lo = g.code_lo >> lt, hi = ((g.code_hi - 1) >> lt) + 1;
    }
    seg_lo[threadIdx.x] = lo, seg_hi[threadIdx.x] = hi;
  }
  const float* mu = p.km.mu + int64_t(kh) * D;
  for (int i = threadIdx.x; i < kRows * G * np; i += kThreads) {
    const int rr = i / (G * np), gq = (i / np) % G, j = i % np, r = r0 + rr;
    if (r >= p.rows) continue;
    const float* q = p.q + int64_t(r) * q_stride + int64_t(kh * G + gq) * D;
    const int a = p.km.pairs[2 * j], b = p.km.pairs[2 * j + 1];
    coef[2 * i] = p.scale * (q[a] * mu[a] + q[b] * mu[b]);
    coef[2 * i + 1] = p.scale * (q[b] * mu[a] - q[a] * mu[b]);
  }
  __syncthreads();
  int64_t ulo = INT64_MAX, uhi = 0;
  for (int rr = 0; rr < kRows; ++rr)
    if (seg_hi[rr] > seg_lo[rr]) ulo = min(ulo, seg_lo[rr]), uhi = max(uhi, seg_hi[rr]);
  if (uhi == 0) return;  // uniform: no row of the block has coded keys
  const float2* table = reinterpret_cast<const float2*>(p.km.cs);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t tile = ulo / kSegTile + blockIdx.z; tile * kSegTile < uhi; tile += gridDim.z) {
    const int64_t s0 = tile * kSegTile;
    for (int i = threadIdx.x; i < kSegTile * np; i += kThreads) {
      const int si = i / np, j = i % np;
      const int64_t s = s0 + si;
      const float2 v = s < p.km.cs_segs ? table[s * np + j] : make_float2(0.f, 0.f);
      cs[si * ldc + 2 * j] = v.x;
      cs[si * ldc + 2 * j + 1] = v.y;
    }
    __syncthreads();
    const int64_t s = s0 + lane;
    for (int rg = warp; rg < kRows * G; rg += kThreads / 32) {
      const int rr = rg / G, gq = rg % G, r = r0 + rr;
      if (r >= p.rows || s < seg_lo[rr] || s >= seg_hi[rr]) continue;
      const float* cf = coef + rg * np * 2;
      const float* c = cs + lane * ldc;
      float acc = 0.f;
      for (int j = 0; j < np; ++j) acc = fmaf(cf[2 * j], c[2 * j], fmaf(cf[2 * j + 1], c[2 * j + 1], acc));
      p.out.values[p.out.row_off[r] + int64_t(kh * G + gq) * p.out.row_nseg[r] + (s - seg_lo[rr])] = acc;
    }
    __syncthreads();  // the tile's table is rewritten next
  }
}

}  // namespace

void key_bias_device(const KeyBiasParams& p, void* stream) {
  VQ_CHECK(p.rows >= 0 && p.n_kv_heads >= 1 && p.n_kv_heads <= 65535 && p.group >= 1 && p.group <= 16,
           "cuda::key_bias: rows {} / {} KV heads / group {} out of range", p.rows, p.n_kv_heads, p.group);
  VQ_CHECK(p.km.n_pairs >= 1 && 2 * p.km.n_pairs <= p.head_dim && p.km.log2_tokens >= 0 && p.km.log2_tokens <= 12,
           "cuda::key_bias: {} pairs / segments of 2^{} tokens do not fit head_dim {}", p.km.n_pairs,
           p.km.log2_tokens, p.head_dim);
  if (p.rows == 0) return;
  VQ_CHECK(p.pos && p.q && p.km.pairs && p.km.mu && p.km.cs && p.out.values && p.out.row_off && p.out.row_nseg,
           "cuda::key_bias: a null pointer");
  const size_t smem = bias_smem_bytes(p.group, p.km.n_pairs);
  static size_t attr = 0;  // raised once per size (host microseconds otherwise)
  if (smem > 48 * 1024 && smem > attr) {
    VQ_CUDA_CHECK(cudaFuncSetAttribute(key_bias_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  const int64_t blocks = (int64_t(p.rows) + kRows - 1) / kRows * p.n_kv_heads;
  const int slots = int(std::clamp<int64_t>((2 * int64_t(device_sm_count()) + blocks - 1) / blocks, 1, 32));
  const dim3 grid(unsigned((p.rows + kRows - 1) / kRows), unsigned(p.n_kv_heads), unsigned(slots));
  key_bias_kernel<<<grid, kThreads, smem, as_stream(stream)>>>(p);
  VQ_CUDA_LAUNCHED("key_bias_kernel");
}

}  // namespace vq::cuda
