// The score terms of VecInfer's rotated key mean (key_mean_cuda.h).
//
// Over pair j = (a, b) of the mean, q . R(phi) mu = cos(phi) (q_a mu_a + q_b mu_b) + sin(phi) (q_b mu_a -
// q_a mu_b): the terms of a block's (row, query head) pairs at 32 segments are one product
//   T[outputs][32] = C[outputs][2 n_pairs] x S[2 n_pairs][32],
// C the two coefficients per pair of each (row, head) and S the segments' (cos, sin) (the host-built
// table). It runs on the tensor cores, mma.m16n8k8 in TF32 with each operand split in a high and a
// low TF32 part (hi*hi + hi*lo + lo*hi: about fp32 accuracy; plain TF32 would leave ~1e-3 of a term
// that can be tens of nats on Qwen2.5's layers with large k_proj biases).
//
// Block = (rows_per_block consecutive rows, one KV head, one of gridDim.z segment slots), 256
// threads. It builds C in shared memory once, then walks tiles of 64 segments (slot z takes tiles
// z, z + gridDim.z, ...) over the union of its rows' coded ranges: the tile's S is staged, each warp
// multiplies 16-row tiles of C by it, and the terms inside each row's range are written. Rows of a
// prefill chunk are consecutive positions of one sequence, so their ranges nearly coincide (32 rows
// per block); decode rows (4 per block) share the table's tiles where they overlap.
// Measured against the CUDA-core form it replaced (one FMA chain per (row, head, segment); ncu on the
// H200, Llama-3.1-8B's geometry): a 2048-row prefill chunk at ~22K tokens 839 -> 737 us per layer, a
// 16-row decode step at 32K 33 -> 28 us. Still latency- and ALU-bound (the TF32 splits are redone per
// tile): splitting C once per block is the next step (docs/BENCHMARKS.md).
#include <cuda_runtime.h>

#include <algorithm>

#include "core/error.h"
#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/smem_attr.cuh"
#include "ops/cuda/key_mean_cuda.h"
#include "ops/cuda/stream_cuda.h"

namespace vq::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kSegTile = 64;  // segments per tile (8 mma n-tiles of 8)

// K (2 n_pairs) padded to the mma's 8; the row stride in shared memory is 4 more than a multiple of
// 32 floats, so that lane (g, t) reading element (g, t) of a fragment hits bank 4g + t: no conflicts.
__host__ __device__ inline int k_padded(int n_pairs) { return (2 * n_pairs + 7) / 8 * 8; }
__host__ __device__ inline int k_stride(int n_pairs) { return (k_padded(n_pairs) + 27) / 32 * 32 + 4; }
__host__ __device__ inline int outs_padded(int rpb, int group) { return (rpb * group + 15) / 16 * 16; }

size_t bias_smem_bytes(int rpb, int group, int n_pairs) {
  return (size_t(outs_padded(rpb, group)) + kSegTile) * k_stride(n_pairs) * sizeof(float) +
         size_t(rpb) * 2 * sizeof(int64_t);
}

// 32 rows per block for prefill-sized steps (more (row, head) pairs per staged tile), 4 for decode
// steps, fewer where shared memory would pass 96 KiB.
int bias_rows_per_block(int rows, int group, int n_pairs) {
  int rpb = rows >= 256 ? 32 : 4;
  while (rpb > 1 && bias_smem_bytes(rpb, group, n_pairs) > 96 * 1024) rpb /= 2;
  return rpb;
}

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
  return r;
}
// x = hi + lo, both TF32.
__device__ __forceinline__ void split_tf32(float x, uint32_t& hi, uint32_t& lo) {
  hi = to_tf32(x);
  lo = to_tf32(x - __uint_as_float(hi));
}
__device__ __forceinline__ void mma_tf32(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__global__ void __launch_bounds__(kThreads) key_bias_kernel(KeyBiasParams p, int rpb) {
  extern __shared__ __align__(16) unsigned char smem[];
  const int np = p.km.n_pairs, G = p.group, D = p.head_dim, lt = kKeyMeanSegmentLog2;
  const int kp = k_padded(np), ldk = k_stride(np);
  const int n_out = rpb * G, m_pad = outs_padded(rpb, G);
  int64_t* seg_lo = reinterpret_cast<int64_t*>(smem);  // [rpb] first segment of the row's coded range
  int64_t* seg_hi = seg_lo + rpb;                      // [rpb] one past its last (lo == hi: none)
  float* coef = reinterpret_cast<float*>(seg_hi + rpb);  // C [m_pad][ldk]: (A_j, B_j) at 2j, 2j + 1; padding 0
  float* cs = coef + m_pad * ldk;                        // S^T [kSegTile][ldk]: (cos, sin) at 2j, 2j + 1
  const int r0 = blockIdx.x * rpb, kh = blockIdx.y;
  const int64_t q_stride = p.q_stride ? p.q_stride : int64_t(p.n_kv_heads) * G * D;
  for (int i = threadIdx.x; i < rpb; i += kThreads) {
    const int r = r0 + i;
    int64_t lo = 0, hi = 0;
    if (r < p.rows) {
      const PagedRanges g = paged_ranges(p.rule, p.pos[r]);
      if (g.code_hi > g.code_lo) lo = g.code_lo >> lt, hi = ((g.code_hi - 1) >> lt) + 1;
    }
    seg_lo[i] = lo, seg_hi[i] = hi;
  }
  const float* mu = p.km.mu + int64_t(kh) * D;
  for (int i = threadIdx.x; i < m_pad * (kp / 2); i += kThreads) {
    const int o = i / (kp / 2), j = i % (kp / 2), rr = o / G, gq = o % G, r = r0 + rr;
    float2 c = make_float2(0.f, 0.f);
    if (o < n_out && r < p.rows && j < np) {
      const float* q = p.q + int64_t(r) * q_stride + int64_t(kh * G + gq) * D;
      const int a = p.km.pairs[2 * j], b = p.km.pairs[2 * j + 1];
      c = make_float2(p.scale * (q[a] * mu[a] + q[b] * mu[b]), p.scale * (q[b] * mu[a] - q[a] * mu[b]));
    }
    coef[o * ldk + 2 * j] = c.x;
    coef[o * ldk + 2 * j + 1] = c.y;
  }
  for (int i = threadIdx.x; i < kSegTile * (kp - 2 * np); i += kThreads)  // S's K padding stays 0
    cs[(i / (kp - 2 * np)) * ldk + 2 * np + i % (kp - 2 * np)] = 0.f;
  __syncthreads();
  int64_t ulo = INT64_MAX, uhi = 0;
  for (int rr = 0; rr < rpb; ++rr)
    if (seg_hi[rr] > seg_lo[rr]) ulo = min(ulo, seg_lo[rr]), uhi = max(uhi, seg_hi[rr]);
  if (uhi == 0) return;  // uniform: no row of the block has coded keys
  const float2* table = reinterpret_cast<const float2*>(p.km.cs);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int64_t tile = ulo / kSegTile + blockIdx.z; tile * kSegTile < uhi; tile += gridDim.z) {
    const int64_t s0 = tile * kSegTile;
    for (int i = threadIdx.x; i < kSegTile * np; i += kThreads) {
      const int si = i / np, j = i % np;
      const int64_t s = s0 + si;
      const float2 v = s < p.km.cs_segs ? table[s * np + j] : make_float2(0.f, 0.f);
      cs[si * ldk + 2 * j] = v.x;
      cs[si * ldk + 2 * j + 1] = v.y;
    }
    __syncthreads();
    // Units of 16 outputs x 16 segments (two n-tiles), spread over the warps: a decode block's 16
    // outputs still keep every warp busy.
    constexpr int kNU = kSegTile / 16;
    for (int u = warp; u < m_pad / 16 * kNU; u += kThreads / 32) {
      const int mt = u / kNU, n0 = (u % kNU) * 2;
      float acc[2][4] = {};
      const float* ca = coef + (mt * 16) * ldk;
      for (int k0 = 0; k0 < kp; k0 += 8) {
        uint32_t ah[4], al[4];
        split_tf32(ca[g * ldk + k0 + t], ah[0], al[0]);
        split_tf32(ca[(g + 8) * ldk + k0 + t], ah[1], al[1]);
        split_tf32(ca[g * ldk + k0 + t + 4], ah[2], al[2]);
        split_tf32(ca[(g + 8) * ldk + k0 + t + 4], ah[3], al[3]);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          uint32_t bh0, bl0, bh1, bl1;  // B (k, n) = S[k0 + k][segment n]: lane holds (t, g), (t + 4, g)
          const float* cb = cs + ((n0 + nt) * 8 + g) * ldk + k0;
          split_tf32(cb[t], bh0, bl0);
          split_tf32(cb[t + 4], bh1, bl1);
          mma_tf32(acc[nt], al, bh0, bh1);
          mma_tf32(acc[nt], ah, bl0, bl1);
          mma_tf32(acc[nt], ah, bh0, bh1);
        }
      }
      // acc[nt]: (output mt*16 + g, segment (n0+nt)*8 + 2t), (.., + 1), (output + 8, ..), (output + 8, .. + 1)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int o = mt * 16 + g + 8 * h, rr = o / G, gq = o % G, r = r0 + rr;
        if (o >= n_out || r >= p.rows) continue;
        const int64_t base = p.out.row_off[r] + int64_t(kh * G + gq) * p.out.row_nseg[r] - seg_lo[rr];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int64_t s = s0 + (n0 + nt) * 8 + 2 * t + c;
            if (s >= seg_lo[rr] && s < seg_hi[rr]) p.out.values[base + s] = acc[nt][2 * h + c];
          }
      }
    }
    __syncthreads();  // the tile's S is rewritten next
  }
}

}  // namespace

void key_bias_device(const KeyBiasParams& p, void* stream) {
  VQ_CHECK(p.rows >= 0 && p.n_kv_heads >= 1 && p.n_kv_heads <= 65535 && p.group >= 1 && p.group <= 16,
           "cuda::key_bias: rows {} / {} KV heads / group {} out of range", p.rows, p.n_kv_heads, p.group);
  VQ_CHECK(p.km.n_pairs >= 1 && 2 * p.km.n_pairs <= p.head_dim, "cuda::key_bias: {} pairs do not fit head_dim {}",
           p.km.n_pairs, p.head_dim);
  if (p.rows == 0) return;
  VQ_CHECK(p.pos && p.q && p.km.pairs && p.km.mu && p.km.cs && p.out.values && p.out.row_off && p.out.row_nseg,
           "cuda::key_bias: a null pointer");
  const int rpb = bias_rows_per_block(p.rows, p.group, p.km.n_pairs);
  const size_t smem = bias_smem_bytes(rpb, p.group, p.km.n_pairs);
  if (smem > 48 * 1024) detail::ensure_smem_attr(key_bias_kernel, smem);
  // Enough segment slots for about 8 blocks per SM (a block's tiles are latency-bound: a staged
  // table load, then a short product), at most 64.
  const int64_t blocks = (int64_t(p.rows) + rpb - 1) / rpb * p.n_kv_heads;
  const int slots = int(std::clamp<int64_t>((8 * int64_t(device_sm_count()) + blocks - 1) / blocks, 1, 64));
  const dim3 grid(unsigned((p.rows + rpb - 1) / rpb), unsigned(p.n_kv_heads), unsigned(slots));
  key_bias_kernel<<<grid, kThreads, smem, as_stream(stream)>>>(p, rpb);
  VQ_CUDA_LAUNCHED("key_bias_kernel");
}

}  // namespace vq::cuda
