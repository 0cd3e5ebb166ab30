// Prefill attention over the KV pool's blocks on tensor cores (paged_attention_cuda.h, tiles):
// a block of 8 warps takes one tile of consecutive query positions of one sequence and one KV
// head: its 128 rows are (position, query head of the group) pairs, 16 per warp. It walks the
// sequence's key blocks once (32 tokens each), so each block's K/V is read once per tile, not
// once per query row as in the decode kernels:
//   dense block: fp16 K (channel-major [D][32]) and V ([32][D]) copied to shared memory;
//   coded block: the VecInfer codes decoded into the same shared-memory tiles (centroids from the
//                fp16 books); keys there are in the transformed space, so those blocks are scored
//                with the transformed queries q~ (both query tiles live in shared memory).
// S = Q K^T and O += P V with mma.m16n8k16 (fp16 in, fp32 accumulate): A fragments of Q by
// ldmatrix, B fragments of K and V by ldmatrix.trans, P reused from the S accumulators as A.
// Online softmax in base 2 per row. Which form of a block a row reads follows the window rule
// per row (paged_ranges): a block a row reads as codes is masked in its dense pass and vice versa.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/paged_attention_cuda.h"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_lut.cuh"

namespace vq::cuda::detail {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 16 * kWarps;  // query rows per tile
constexpr int kB = 32;              // keys per pass (one block of the pool: block_tokens == 32)
constexpr int kKPad = 8;            // halves of padding per shared-memory row (conflict-free ldmatrix)
constexpr float kLog2e = 1.4426950408889634f;

struct PrefillParams {
  int n_kv_heads, group, n_q_heads, D;
  PagedRule rule;
  const int32_t* pos;
  const int32_t* row_table;
  const uint8_t* const* const* dense_tables;
  const uint8_t* const* const* coded_tables;
  const float* q;
  int64_t q_stride;
  float qscale;         // scale * log2(e) for the plain queries
  const float* q_code;  // [rows][n_q_heads][D]: already times scale
  int kd, kbits, kbooks, kcb;  // coded keys: sub_dim, bits, books per head, packed row bytes
  int vd, vbits, vbooks, vcb;
  const __half* k_book;  // [n_kv_heads, kbooks, 2^kbits, kd]
  const __half* v_book;
  const PagedPrefillTile* tiles;
  ElemType out_type;
  void* out;
  int64_t out_stride;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t code_of(const uint8_t* row, int i, int bits) {
  if (bits == 8) return row[i];
  const int bit = i * bits;
  const uint8_t* q = row + (bit >> 3);
  const unsigned shift = unsigned(bit & 7), need = shift + unsigned(bits);
  uint32_t v = q[0];
  if (need > 8) v |= uint32_t(q[1]) << 8;
  if (need > 16) v |= uint32_t(q[2]) << 16;
  return (v >> shift) & ((1u << bits) - 1u);
}

// Shared memory: qp [kRows][D+8] | qc [kRows][D+8] (coded layers) | ks [D][kB+8] | vs [kB][D+8] (fp16).
template <int D>
__global__ void __launch_bounds__(32 * kWarps, 1) prefill_kernel(PrefillParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int QLD = D + kKPad, KLD = kB + kKPad, VLD = D + kKPad;
  constexpr int NT = D / 8;  // n-tiles of the output
  __half* qp = reinterpret_cast<__half*>(smem);
  __half* qc = qp + kRows * QLD;
  __half* ks = qc + (p.rule.coded ? kRows * QLD : 0);
  __half* vs = ks + D * KLD;

  const PagedPrefillTile tile = p.tiles[blockIdx.x];
  const int kh = blockIdx.y;
  const int G = p.group, P = kRows / G;
  const int n_pos = tile.n_pos;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tab = p.row_table ? p.row_table[tile.row0] : tile.row0;
  const uint8_t* const* dtab = p.dense_tables[tab];
  const uint8_t* const* ctab = p.rule.coded ? p.coded_tables[tab] : nullptr;

  // ---- queries: row m = (position m / G, head m % G), fp16, scaled for base-2 softmax ----
  for (int i = threadIdx.x; i < kRows * D; i += blockDim.x) {
    const int m = i / D, d = i % D, pi = m / G, hg = m % G;
    float vp = 0.f, vc = 0.f;
    if (pi < n_pos && pi < P) {
      const int64_t r = tile.row0 + pi;
      vp = p.q[r * p.q_stride + (int64_t(kh) * G + hg) * D + d] * p.qscale;
      if (p.rule.coded) vc = p.q_code[(r * p.n_q_heads + int64_t(kh) * G + hg) * D + d] * kLog2e;
    }
    qp[m * QLD + d] = __float2half_rn(vp);
    if (p.rule.coded) qc[m * QLD + d] = __float2half_rn(vc);
  }
  // This thread's two rows (g and g + 8 of the warp's 16): position and key ranges.
  PagedRanges rg[2];
  int rpos[2];
  bool rvalid[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = warp * 16 + g + 8 * h, pi = m / G;
    rvalid[h] = pi < n_pos && pi < P;
    rpos[h] = rvalid[h] ? p.pos[tile.row0 + pi] : -1;
    rg[h] = paged_ranges(p.rule, rvalid[h] ? rpos[h] : 0);
  }
  const int t_first = p.pos[tile.row0], t_last = p.pos[tile.row0 + n_pos - 1];
  const PagedRanges gf = paged_ranges(p.rule, t_first), gl = paged_ranges(p.rule, t_last);
  const int64_t kmin = p.rule.coded ? min(gf.sink_hi > gf.sink_lo ? gf.sink_lo : gf.code_lo, gf.win_lo) : gf.win_lo;

  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const int H = p.n_kv_heads;
  const int64_t kbytes = int64_t(H) * kB * p.kcb;

  for (int64_t j = kmin / kB; j * kB <= t_last; ++j) {
    const int64_t u0 = j * kB;
    for (int form = 0; form < 2; ++form) {  // 0: dense, 1: coded
      // Does any row of the tile read block j in this form?
      // (hulls over the rows: ce grows with the position, so the first row has the earliest
      // sink / code / window starts and the last row the latest code end)
      bool need;
      if (form == 1) {
        need = p.rule.coded && u0 < gl.code_hi && u0 + kB > gf.code_lo;
      } else {
        const bool sink = p.rule.coded && u0 < gf.sink_hi && u0 + kB > gf.sink_lo;
        need = sink || u0 + kB > gf.win_lo;
      }
      if (!need) continue;
      __syncthreads();  // previous pass done with ks / vs (and the queries written, first time)
      if (form == 0) {
        const __half* blk = reinterpret_cast<const __half*>(dtab[j]);
        const __half* kg = blk + size_t(kh) * D * kB;                // [D][kB]
        const __half* vg = blk + size_t(H) * D * kB + size_t(kh) * kB * D;  // [kB][D]
        for (int i = threadIdx.x; i < D * kB / 8; i += blockDim.x) {
          const int d = i / (kB / 8), c = i % (kB / 8);
          *reinterpret_cast<uint4*>(ks + d * KLD + 8 * c) = *reinterpret_cast<const uint4*>(kg + d * kB + 8 * c);
        }
        // Slots past the last position hold whatever the pool block held before (maybe NaN as fp16):
        // their P is 0, but 0 * NaN is NaN in the product, so their values are zeroed.
        for (int i = threadIdx.x; i < kB * D / 8; i += blockDim.x) {
          const int k = i / (D / 8), c = i % (D / 8);
          *reinterpret_cast<uint4*>(vs + k * VLD + 8 * c) =
              u0 + k <= t_last ? *reinterpret_cast<const uint4*>(vg + k * D + 8 * c) : make_uint4(0, 0, 0, 0);
        }
      } else {
        const uint8_t* blk = ctab[j];
        const int ksub = D / p.kd, vsub = D / p.vd;
        for (int i = threadIdx.x; i < kB * ksub; i += blockDim.x) {
          const int k = i / ksub, s = i % ksub;
          const uint8_t* row = blk + (int64_t(kh) * kB + k) * p.kcb;
          const uint32_t c = code_of(row, s, p.kbits);
          const __half* cen = p.k_book + ((int64_t(kh) * p.kbooks + (p.kbooks > 1 ? s : 0)) << p.kbits) * p.kd +
                              int64_t(c) * p.kd;
          for (int e = 0; e < p.kd; ++e) ks[(s * p.kd + e) * KLD + k] = cen[e];
        }
        for (int i = threadIdx.x; i < kB * vsub; i += blockDim.x) {
          const int k = i / vsub, s = i % vsub;
          const uint8_t* row = blk + kbytes + (int64_t(kh) * kB + k) * p.vcb;
          const uint32_t c = code_of(row, s, p.vbits);
          const __half* cen = p.v_book + ((int64_t(kh) * p.vbooks + (p.vbooks > 1 ? s : 0)) << p.vbits) * p.vd +
                              int64_t(c) * p.vd;
          for (int e = 0; e < p.vd; ++e) vs[k * VLD + s * p.vd + e] = cen[e];
        }
      }
      __syncthreads();
      // ---- S = Q K^T: 16 rows x 32 keys per warp ----
      const __half* qs = form ? qc : qp;
      float s[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t a[4];
        ldsm_x4(a, qs + (warp * 16 + (lane & 15)) * QLD + k0 + (lane >> 4) * 8);
#pragma unroll
        for (int n0 = 0; n0 < kB; n0 += 16) {
          uint32_t b[4];
          const int mi = lane >> 3, r = lane & 7;
          ldsm_x4_t(b, ks + (k0 + r + (mi & 1) * 8) * KLD + n0 + (mi >> 1) * 8);
          mma16816(s[n0 / 8], a, b[0], b[1]);
          mma16816(s[n0 / 8 + 1], a, b[2], b[3]);
        }
      }
      // ---- masks: row h reads key u in this form ----
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const PagedRanges& R = rg[h];
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
          for (int c = 0; c < 2; ++c) {
            const int64_t u = u0 + n * 8 + 2 * t + c;
            bool vis = rvalid[h] && u <= rpos[h];
            if (form) vis = vis && u >= R.code_lo && u < R.code_hi;
            else vis = vis && ((u >= R.sink_lo && u < R.sink_hi) || (u >= R.win_lo && u < R.win_hi));
            if (!vis) s[n][2 * h + c] = -INFINITY;
          }
      }
      // ---- online softmax (base 2), rows g and g + 8 ----
      float alpha[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 4; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m_run[h], mx);
        const float mref = m_new == -INFINITY ? 0.f : m_new;  // a row with nothing visible yet
        alpha[h] = exp2f(m_run[h] - mref);
        float sum = 0.f;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          s[n][2 * h] = exp2f(s[n][2 * h] - mref);
          s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - mref);
          sum += s[n][2 * h] + s[n][2 * h + 1];
        }
        l_run[h] = l_run[h] * alpha[h] + sum;
        m_run[h] = m_new;
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
      // ---- O += P V: P from the S accumulators (two k-steps of 16 keys) ----
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        uint32_t a[4];
        a[0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
        a[1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
        a[2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int d0 = 0; d0 < D; d0 += 16) {
          uint32_t b[4];
          const int mi = lane >> 3, r = lane & 7;
          ldsm_x4_t(b, vs + (kk * 16 + r + (mi & 1) * 8) * VLD + d0 + (mi >> 1) * 8);
          mma16816(o[d0 / 8], a, b[0], b[1]);
          mma16816(o[d0 / 8 + 1], a, b[2], b[3]);
        }
      }
    }
  }
  // ---- normalise and write the tile's rows ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    l_run[h] = l > 0.f ? 1.0f / l : 0.f;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!rvalid[h]) continue;
    const int m = warp * 16 + g + 8 * h, pi = m / G, hg = m % G;
    const int64_t base = int64_t(tile.row0 + pi) * p.out_stride + (int64_t(kh) * G + hg) * D;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const float v0 = o[n][2 * h] * l_run[h], v1 = o[n][2 * h + 1] * l_run[h];
      const int d = n * 8 + 2 * t;
      if (p.out_type == ElemType::f16) {
        *reinterpret_cast<__half2*>(static_cast<__half*>(p.out) + base + d) = __floats2half2_rn(v0, v1);
      } else {
        float* o32 = static_cast<float*>(p.out) + base + d;
        o32[0] = v0, o32[1] = v1;
      }
    }
  }
}

size_t prefill_smem(int D, bool coded) {
  return (size_t(kRows) * (D + kKPad) * (coded ? 2 : 1) + size_t(D) * (kB + kKPad) + size_t(kB) * (D + kKPad)) * 2;
}

template <int D>
void launch(const PrefillParams& pp, int n_tiles, int H, cudaStream_t st) {
  const size_t smem = prefill_smem(D, pp.rule.coded);
  static size_t attr = 0;
  if (smem > attr) {
    VQ_CUDA_CHECK(cudaFuncSetAttribute(prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = smem;
  }
  prefill_kernel<D><<<dim3(unsigned(n_tiles), unsigned(H)), 32 * kWarps, smem, st>>>(pp);
  VQ_CUDA_LAUNCHED("prefill_kernel");
}

}  // namespace

int prefill_positions_per_tile(int group) { return kRows / group; }

void launch_prefill(const PagedAttnParams& a, cudaStream_t st) {
  VQ_CHECK(a.rule.block_tokens == kB, "cuda::paged_attention prefill: block_tokens {} (the prefill kernel takes 32)",
           a.rule.block_tokens);
  VQ_CHECK(a.n_tiles <= 2147483647 && a.n_kv_heads <= 65535, "cuda::paged_attention prefill: grid too large");
  PrefillParams pp{};
  pp.n_kv_heads = a.n_kv_heads;
  pp.group = a.group;
  pp.n_q_heads = a.n_kv_heads * a.group;
  pp.D = a.head_dim;
  pp.rule = a.rule;
  pp.pos = a.pos;
  pp.row_table = a.row_table;
  pp.dense_tables = a.dense_tables;
  pp.coded_tables = a.coded_tables;
  pp.q = a.q;
  pp.q_stride = a.q_stride ? a.q_stride : int64_t(pp.n_q_heads) * a.head_dim;
  pp.qscale = a.scale * kLog2e;
  pp.q_code = a.q_code;
  if (a.rule.coded) {
    pp.kd = a.k_sub_dim, pp.kbits = a.k_bits, pp.kbooks = a.k_per_subspace ? a.head_dim / a.k_sub_dim : 1;
    pp.kcb = int(code_row_bytes(a.head_dim / a.k_sub_dim, a.k_bits));
    pp.vd = a.v_sub_dim, pp.vbits = a.v_bits, pp.vbooks = a.v_per_subspace ? a.head_dim / a.v_sub_dim : 1;
    pp.vcb = int(code_row_bytes(a.head_dim / a.v_sub_dim, a.v_bits));
    pp.k_book = reinterpret_cast<const __half*>(a.k_book);
    pp.v_book = reinterpret_cast<const __half*>(a.v_book);
  }
  pp.tiles = a.tiles;
  pp.out_type = a.out_type;
  pp.out = a.out;
  pp.out_stride = a.out_stride ? a.out_stride : int64_t(pp.n_q_heads) * a.head_dim;
  if (a.head_dim == 64) launch<64>(pp, a.n_tiles, a.n_kv_heads, st);
  else if (a.head_dim == 128) launch<128>(pp, a.n_tiles, a.n_kv_heads, st);
  else launch<256>(pp, a.n_tiles, a.n_kv_heads, st);
}

}  // namespace vq::cuda::detail
