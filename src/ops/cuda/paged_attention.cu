// Attention over the KV pool's blocks (paged_attention_cuda.h): the dense split kernel, the
// merge kernel, and the launch sequence with the coded split kernels of pq_attention.cu /
// pq_attention_lut.cu in their paged mode.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/paged_attention_cuda.h"
#include "ops/cuda/paged_split.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_lut.cuh"
#include "ops/cuda/stream_cuda.h"

namespace vq::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kDenseWarps = 4;
constexpr int kTile8 = 8;  // partials are laid out in tiles of 8 query heads (the coded kernels' layout)

struct DenseParams {
  int n_kv_heads, group, tiles8, n_q_heads, lb;
  int ht_tiles;  // HT-head tiles per KV head: ceil(group / HT)
  PagedRule rule;
  const int32_t* pos;
  const int32_t* row_table;
  const uint8_t* row_skip;
  const uint8_t* const* const* tables;
  const float* q;
  int64_t q_stride;
  float qscale;  // scale * log2(e)
  int splits;
  float* part;   // [rows, n_kv_heads, tiles8, splits][2*8 + 8*D]
};

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
               "l"(src));
}

// Grid (splits, n_kv_heads * ceil(group / HT), rows); 4 warps. A block takes HT query heads of
// one KV head over one split of the row's dense tokens (sinks + window, or all keys of an fp16
// layer). Warp = 32 tokens at a time, lane = token for the scores (keys are channel-major, so
// the lanes of a warp read consecutive fp16 of one channel), lane = dims for the values (rows
// of D fp16, D/32 per lane). Online softmax in base 2 with a lazy max (as the LUT kernel).
template <int D, int HT>
__global__ void __launch_bounds__(32 * kDenseWarps) dense_split_kernel(DenseParams p) {
  constexpr int VPL = D / 32;   // value dims per lane
  extern __shared__ __align__(16) float dsm[];
  float* sq = dsm;                                 // [HT][D]
  float* sp = sq + HT * D;                         // [warps][32][HT]
  const __half** svp = reinterpret_cast<const __half**>(sp + kDenseWarps * 32 * HT);  // [warps][32]
  // [warps] staging of one whole block's K [D][32] and V [32][D] of this head (16-byte aligned)
  __half* stage = reinterpret_cast<__half*>(
      (reinterpret_cast<uintptr_t>(svp + kDenseWarps * 32) + 15) & ~uintptr_t(15));

  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int split = blockIdx.x, b = blockIdx.z;
  const int kh = blockIdx.y / p.ht_tiles;
  const int head0 = (blockIdx.y % p.ht_tiles) * HT;  // first query head of the group in this block
  const int t8 = head0 / kTile8;                     // HT divides 8: a tile lies in one 8-head tile
  if (p.row_skip && p.row_skip[b]) return;
  const detail::DenseSplit ds = detail::dense_split(p.rule, p.pos[b], p.splits);
  if (!ds.holds(split)) return;
  const int vbeg = split * ds.chunk, vend = min(ds.n(), vbeg + ds.chunk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int H = p.n_kv_heads, B = 1 << p.lb;

  for (int i = threadIdx.x; i < HT * D; i += blockDim.x) {
    const int h = i / D, d = i % D, qh = head0 + h;
    sq[i] = qh < p.group ? p.q[int64_t(b) * p.q_stride + (int64_t(kh) * p.group + qh) * D + d] * p.qscale : 0.f;
  }
  __syncthreads();
  const uint8_t* const* tab = p.tables[p.row_table ? p.row_table[b] : b];

  float m_run[HT], l_run[HT], o[HT][VPL];
#pragma unroll
  for (int h = 0; h < HT; ++h) {
    m_run[h] = -INFINITY, l_run[h] = 0.f;
#pragma unroll
    for (int e = 0; e < VPL; ++e) o[h][e] = 0.f;
  }
  float* spw = sp + warp * 32 * HT;
  const __half** svw = svp + warp * 32;
  __half* kst = stage + size_t(warp) * 2 * D * 32;  // K [D][32]
  __half* vst = kst + D * 32;                       // V [32][D]
  for (int g0 = vbeg + warp * 32; g0 < vend; g0 += kDenseWarps * 32) {
    const int v = g0 + lane;
    const bool valid = v < vend;
    // A group that is one whole block (the common case: sinks and window start on block
    // boundaries) is staged with cp.async: all its K/V loads in flight at once, instead of a
    // dependent chain of 2-byte loads per channel.
    const int t0 = ds.position(g0);
    const bool whole = B == 32 && g0 + 32 <= vend && (t0 & 31) == 0 && (g0 >= ds.n0 || g0 + 32 <= ds.n0);
    if (whole) {
      const __half* blk = reinterpret_cast<const __half*>(tab[t0 >> p.lb]);
      const __half* kg = blk + size_t(kh) * D * 32;
      const __half* vg = blk + size_t(H) * D * 32 + size_t(kh) * 32 * D;
      for (int i = lane; i < D * 4; i += 32) cp_async16(kst + 8 * i, kg + 8 * i);
      for (int i = lane; i < D * 4; i += 32) cp_async16(vst + 8 * i, vg + 8 * i);
      asm volatile("cp.async.commit_group;\n" ::);
      asm volatile("cp.async.wait_group 0;\n" ::);
      __syncwarp();
    }
    float s[HT];
#pragma unroll
    for (int h = 0; h < HT; ++h) s[h] = 0.f;
    const __half* vrow = nullptr;
    if (valid) {
      const int t = ds.position(v);
      const __half* blk = reinterpret_cast<const __half*>(tab[t >> p.lb]);
      const int slot = t & (B - 1);
      const __half* kp = whole ? kst + lane : blk + size_t(kh) * D * B + slot;  // channel c at kp[c*B]
      vrow = whole ? vst + size_t(lane) * D : blk + size_t(H) * D * B + (size_t(kh) * B + slot) * D;
#pragma unroll 2
      for (int c0 = 0; c0 < D; c0 += 16) {
        float kv[16];
#pragma unroll
        for (int j = 0; j < 16; ++j) kv[j] = __half2float(kp[size_t(c0 + j) * B]);
#pragma unroll
        for (int j = 0; j < 16; j += 4) {
#pragma unroll
          for (int h = 0; h < HT; ++h) {
            const float4 qv = *reinterpret_cast<const float4*>(sq + h * D + c0 + j);
            s[h] = fmaf(qv.x, kv[j], fmaf(qv.y, kv[j + 1], fmaf(qv.z, kv[j + 2], fmaf(qv.w, kv[j + 3], s[h]))));
          }
        }
      }
    } else {
#pragma unroll
      for (int h = 0; h < HT; ++h) s[h] = -INFINITY;
    }
    // Lazy max: the reference max may lag the true one by up to 8 (P <= 2^8); the state stays exact.
    bool over = false;
#pragma unroll
    for (int h = 0; h < HT; ++h) over |= s[h] > m_run[h] + 8.f;
    if (__any_sync(0xffffffffu, over)) {
#pragma unroll
      for (int h = 0; h < HT; ++h) {
        float mx = s[h];
#pragma unroll
        for (int off = 16; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        if (mx > m_run[h]) {
          const float alpha = exp2f(m_run[h] - mx);  // -inf -> 0
          l_run[h] *= alpha;
#pragma unroll
          for (int e = 0; e < VPL; ++e) o[h][e] *= alpha;
          m_run[h] = mx;
        }
      }
    }
#pragma unroll
    for (int h = 0; h < HT; ++h) {
      const float pr = valid ? exp2f(s[h] - m_run[h]) : 0.f;
      l_run[h] += pr;
      spw[lane * HT + h] = pr;
    }
    svw[lane] = vrow;
    __syncwarp();
    const int nv = min(32, vend - g0);
    for (int j = 0; j < nv; ++j) {
      const __half* vr = svw[j] + lane * VPL;
      float vv[VPL];
      if constexpr (VPL == 2) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(vr));
        vv[0] = f.x, vv[1] = f.y;
      } else if constexpr (VPL == 4) {
        const uint2 u = *reinterpret_cast<const uint2*>(vr);
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
        const float2 c = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
        vv[0] = a.x, vv[1] = a.y, vv[2] = c.x, vv[3] = c.y;
      } else {
        const uint4 u = *reinterpret_cast<const uint4*>(vr);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&w[k]));
          vv[2 * k] = a.x, vv[2 * k + 1] = a.y;
        }
      }
      float pj[HT];
      if constexpr (HT >= 4) {
#pragma unroll
        for (int h = 0; h < HT; h += 4) {
          const float4 f = *reinterpret_cast<const float4*>(spw + j * HT + h);
          pj[h] = f.x, pj[h + 1] = f.y, pj[h + 2] = f.z, pj[h + 3] = f.w;
        }
      } else {
#pragma unroll
        for (int h = 0; h < HT; ++h) pj[h] = spw[j * HT + h];
      }
#pragma unroll
      for (int h = 0; h < HT; ++h)
#pragma unroll
        for (int e = 0; e < VPL; ++e) o[h][e] = fmaf(pj[h], vv[e], o[h][e]);
    }
    __syncwarp();
  }

  // ---- cross-warp merge (shared memory reused) and the split's partial ----
#pragma unroll
  for (int h = 0; h < HT; ++h)
#pragma unroll
    for (int off = 16; off; off >>= 1) l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], off);
  __syncthreads();
  float* wm = dsm;                    // [warps][HT]
  float* wl = wm + kDenseWarps * HT;  // [warps][HT]
  float* wo = wl + kDenseWarps * HT;  // [warps][HT][D]
  if (lane == 0) {
#pragma unroll
    for (int h = 0; h < HT; ++h) wm[warp * HT + h] = m_run[h], wl[warp * HT + h] = l_run[h];
  }
#pragma unroll
  for (int h = 0; h < HT; ++h)
#pragma unroll
    for (int e = 0; e < VPL; ++e) wo[(warp * HT + h) * D + lane * VPL + e] = o[h][e];
  __syncthreads();
  float* out = p.part + (((int64_t(b) * p.n_kv_heads + kh) * p.tiles8 + t8) * p.splits + split) * (2 * kTile8 + kTile8 * D);
  const int slot0 = head0 % kTile8;
  for (int i = threadIdx.x; i < HT * D + 2 * HT; i += blockDim.x) {
    const int hh = i < HT * D ? i / D : (i - HT * D) % HT;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kDenseWarps; ++w) M = fmaxf(M, wm[w * HT + hh]);
    float acc = 0.f;
    if (i < HT * D) {
      const int dim = i % D;
#pragma unroll
      for (int w = 0; w < kDenseWarps; ++w) {
        const float mw = wm[w * HT + hh];
        if (mw != -INFINITY) acc += exp2f(mw - M) * wo[(w * HT + hh) * D + dim];
      }
      out[2 * kTile8 + (slot0 + hh) * D + dim] = acc;
    } else if (i < HT * D + HT) {
      out[slot0 + hh] = M;
    } else {
#pragma unroll
      for (int w = 0; w < kDenseWarps; ++w) {
        const float mw = wm[w * HT + hh];
        if (mw != -INFINITY) acc += exp2f(mw - M) * wl[w * HT + hh];
      }
      out[kTile8 + slot0 + hh] = acc;
    }
  }
}

struct MergeParams {
  int n_kv_heads, group, tiles8, n_q_heads, D;
  PagedRule rule;
  const int32_t* pos;
  const uint8_t* row_skip;
  int coded_splits, dense_splits;
  bool lut;  // which coded split geometry
  const float* coded_part;
  const float* dense_part;
  ElemType out_type;
  void* out;
  int64_t out_stride;
};

// Grid (n_q_heads, rows), 128 threads (2 dims each): the valid partials of both kinds combined
// by log-sum-exp, normalised. A row with no keys gets zeros. Two passes over the partials (their
// max, then the weighted sums) whose loads do not depend on each other: unrolled, many are in
// flight at once. (One online pass made a chain of dependent L2 round trips, one per partial:
// 38 us for the 132 partials of an fp16 layer at B=1, 4K; docs/CUDA_NOTES.md section 9.)
__global__ void __launch_bounds__(128) paged_merge_kernel(MergeParams p) {
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int qh = blockIdx.x, b = blockIdx.y;
  if (p.row_skip && p.row_skip[b]) return;  // the prefill kernel writes this row
  const int kh = qh / p.group, gl = qh % p.group, t8 = gl / kTile8, hh = gl % kTile8;
  const int D = p.D;
  const int64_t pstride = 2 * kTile8 + kTile8 * D;
  const int pos = p.pos[b];
  // The splits that hold tokens are a prefix of each kind: nc coded, nd dense.
  int nc = 0;
  if (p.rule.coded && p.coded_splits > 0) {
    const detail::CodedSplit cs =
        p.lut ? detail::coded_split(p.rule, pos, p.coded_splits, detail::kLutAlign, detail::kLutChunkAlign,
                                    detail::kLutMinChunk)
              : detail::coded_split(p.rule, pos, p.coded_splits, detail::kGatherAlign, detail::kGatherChunkAlign,
                                    detail::kGatherMinChunk);
    if (cs.hi > cs.lo) nc = min(p.coded_splits, (cs.hi - cs.a0 + cs.chunk - 1) / cs.chunk);
  }
  const detail::DenseSplit ds = detail::dense_split(p.rule, pos, p.dense_splits);
  const int nd = min(p.dense_splits, (ds.n() + ds.chunk - 1) / ds.chunk);
  const float* cbase = p.coded_part + ((int64_t(b) * p.n_kv_heads + kh) * p.tiles8 + t8) * p.coded_splits * pstride;
  const float* dbase = p.dense_part + ((int64_t(b) * p.n_kv_heads + kh) * p.tiles8 + t8) * p.dense_splits * pstride;
  auto part = [&](int i) { return i < nc ? cbase + i * pstride : dbase + (i - nc) * pstride; };
  const int n = nc + nd;
  float M = -INFINITY;
#pragma unroll 8
  for (int i = 0; i < n; ++i) M = fmaxf(M, part(i)[hh]);
  const int d0 = threadIdx.x, d1 = threadIdx.x + 128;
  float L = 0.f, o0 = 0.f, o1 = 0.f;
  if (M != -INFINITY) {
#pragma unroll 4
    for (int i = 0; i < n; ++i) {
      const float* q = part(i);
      const float m = q[hh];
      const bool live = m != -INFINITY;  // a split whose tokens were all masked: skipped
      const float w = exp2f(m - M);
      const float l = q[kTile8 + hh];
      const float v0 = d0 < D ? q[2 * kTile8 + hh * D + d0] : 0.f;
      const float v1 = d1 < D ? q[2 * kTile8 + hh * D + d1] : 0.f;
      L = live ? fmaf(w, l, L) : L;
      o0 = live ? fmaf(w, v0, o0) : o0;
      o1 = live ? fmaf(w, v1, o1) : o1;
    }
  }
  const float inv = L > 0.f ? 1.0f / L : 0.f;
  const float o[2] = {o0, o1};
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int d = threadIdx.x + k * 128;
    if (d >= D) continue;
    const int64_t i = int64_t(b) * p.out_stride + int64_t(qh) * D + d;
    if (p.out_type == ElemType::f16) static_cast<__half*>(p.out)[i] = __float2half_rn(o[k] * inv);
    else static_cast<float*>(p.out)[i] = o[k] * inv;
  }
}

int ht_for(int group) { return group >= 8 ? 8 : group >= 4 ? 4 : group >= 2 ? (group == 2 ? 2 : 4) : 1; }

size_t dense_smem(int D, int HT) {
  const size_t main = (size_t(HT) * D + size_t(kDenseWarps) * 32 * HT) * 4 + size_t(kDenseWarps) * 32 * 8 + 16 +
                      size_t(kDenseWarps) * 2 * D * 32 * 2;
  const size_t merge = (size_t(kDenseWarps) * HT * 2 + size_t(kDenseWarps) * HT * D) * 4;
  return std::max(main, merge);
}

template <int D, int HT>
void launch_dense(const DenseParams& dp, int rows, cudaStream_t st, bool pdl) {
  const size_t smem = dense_smem(D, HT);
  static bool attr = false;
  if (!attr && smem > 48 * 1024) {
    VQ_CUDA_CHECK(cudaFuncSetAttribute(dense_split_kernel<D, HT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)));
    attr = true;
  }
  const dim3 grid(unsigned(dp.splits), unsigned(dp.n_kv_heads * dp.ht_tiles), unsigned(rows));
  launch_kernel("dense_split_kernel", pdl, dense_split_kernel<D, HT>, grid, dim3(32 * kDenseWarps), smem, st, dp);
}

template <int D>
void launch_dense_d(DenseParams dp, int rows, int HT, cudaStream_t st, bool pdl) {
  dp.ht_tiles = (dp.group + HT - 1) / HT;
  switch (HT) {
    case 1: return launch_dense<D, 1>(dp, rows, st, pdl);
    case 2: return launch_dense<D, 2>(dp, rows, st, pdl);
    case 4: return launch_dense<D, 4>(dp, rows, st, pdl);
    default: return launch_dense<D, 8>(dp, rows, st, pdl);
  }
}

size_t part_floats(const PagedAttnParams& p, int splits) {
  return size_t(p.rows) * p.n_kv_heads * ((p.group + 7) / 8) * size_t(splits) * (2 * kTile8 + kTile8 * p.head_dim);
}

}  // namespace

bool paged_attention_uses_lut(const PagedAttnParams& p) {
  if (!p.rule.coded) return false;
  if (p.kernel == PQAttnKernel::gather_mma) return false;
  return detail::lut_kernel_supported_paged(p);
}

void paged_attention_plan(PagedAttnParams& p) {
  const int sms = cuda_device_available() ? device_sm_count() : 132;
  const int64_t heads = int64_t(std::max(p.rows, 1)) * p.n_kv_heads;
  const int64_t tiles8 = (p.group + 7) / 8;
  if (p.rule.coded) {
    if (paged_attention_uses_lut(p)) {  // one 16-warp block per SM: one wave
      const int64_t per = heads * ((p.group + 3) / 4);
      p.coded_splits = int(std::clamp<int64_t>(sms / per, 1, 64));
    } else {  // 8-warp blocks, two per SM: about four blocks per SM
      const int64_t per = heads * tiles8;
      p.coded_splits = int(std::clamp<int64_t>((4 * sms + per - 1) / per, 1, 128));
    }
    // The dense part of a coded layer is the sinks and the window (R..R+B-1 tokens).
    const int64_t dense_max = p.rule.sink_end + p.rule.residual + p.rule.block_tokens;
    p.dense_splits = int(std::clamp<int64_t>((dense_max + 127) / 128, 1, 8));
  } else {
    p.coded_splits = 0;
    const int HT = ht_for(std::min(p.group, 8));
    const int64_t per = heads * ((p.group + HT - 1) / HT);
    p.dense_splits = int(std::clamp<int64_t>((8 * sms + per - 1) / per, 1, 256));
  }
}

size_t paged_attention_workspace_bytes(const PagedAttnParams& p) {
  return (part_floats(p, p.rule.coded ? p.coded_splits : 0) + part_floats(p, p.dense_splits)) * sizeof(float);
}

void check_paged_attention(const PagedAttnParams& p) {
  VQ_CHECK(p.rows >= 0 && p.rows <= 65535, "cuda::paged_attention: rows = {} must be in 0..65535", p.rows);
  VQ_CHECK(p.n_kv_heads >= 1 && p.group >= 1 && p.group <= 16,
           "cuda::paged_attention: n_kv_heads = {} must be >= 1 and group = {} in 1..16", p.n_kv_heads, p.group);
  VQ_CHECK(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256,
           "cuda::paged_attention: head_dim = {} must be 64, 128 or 256", p.head_dim);
  const int B = p.rule.block_tokens;
  VQ_CHECK(B >= 32 && B <= 4096 && (B & (B - 1)) == 0,
           "cuda::paged_attention: block_tokens = {} must be a power of two in 32..4096", B);
  VQ_CHECK(p.rule.sink_end % B == 0 && p.rule.residual >= 0 && p.rule.window >= 0,
           "cuda::paged_attention: rule sink_end {} (a multiple of {}), residual {}, window {}", p.rule.sink_end, B,
           p.rule.residual, p.rule.window);
  VQ_CHECK(p.dense_splits >= 1 && (!p.rule.coded || p.coded_splits >= 1),
           "cuda::paged_attention: split counts {} (coded) {} (dense): call paged_attention_plan", p.coded_splits,
           p.dense_splits);
  VQ_CHECK(p.out_type == ElemType::f32 || p.out_type == ElemType::f16,
           "cuda::paged_attention: out_type {} must be f32 or f16", elem_type_name(p.out_type));
  if (p.rows == 0) return;
  VQ_CHECK(p.pos && p.dense_tables && p.q && p.out, "cuda::paged_attention: null pos, dense_tables, q or out");
  if (p.rule.coded) {
    VQ_CHECK(p.coded_tables && p.q_code && p.k_book && p.v_book,
             "cuda::paged_attention: a coded layer needs coded_tables, q_code and both codebooks");
    for (int side = 0; side < 2; ++side) {
      const int d = side ? p.v_sub_dim : p.k_sub_dim, bits = side ? p.v_bits : p.k_bits;
      VQ_CHECK((d == 4 || d == 8 || d == 16) && (p.head_dim / 8) % d == 0 && bits >= 1 && bits <= 16,
               "cuda::paged_attention: {} preset d{}b{}: sub_dim must be 4, 8 or 16 dividing head_dim/8 = {}, bits 1..16",
               side ? "value" : "key", d, bits, p.head_dim / 8);
    }
    VQ_CHECK(p.kernel != PQAttnKernel::lut || detail::lut_kernel_supported_paged(p),
             "cuda::paged_attention: kernel lut does not take k d{}b{} v d{}b{} at head_dim {}", p.k_sub_dim, p.k_bits,
             p.v_sub_dim, p.v_bits, p.head_dim);
  }
  VQ_CHECK(p.n_tiles >= 0 && (p.n_tiles == 0 || (p.tiles && p.row_skip && p.rule.block_tokens == 32)),
           "cuda::paged_attention: {} prefill tiles need tiles, row_skip and blocks of 32 tokens", p.n_tiles);
  VQ_CHECK(p.n_tiles == 0 || p.tile_rows == 64 || p.tile_rows == 128,
           "cuda::paged_attention: prefill tiles of {} rows (64 or 128: paged_prefill_tile_rows)", p.tile_rows);
  const size_t need = paged_attention_workspace_bytes(p);
  VQ_CHECK(p.workspace_bytes >= need && (need == 0 || p.workspace),
           "cuda::paged_attention: workspace of {} bytes is smaller than the {} needed", p.workspace_bytes, need);
}

void paged_attention_device(const PagedAttnParams& p, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::paged_attention: {}", cuda_unavailable_reason());
  check_paged_attention(p);
  if (p.rows == 0) return;
  cudaStream_t st = as_stream(stream);
  const int tiles8 = (p.group + 7) / 8;
  float* coded_part = static_cast<float*>(p.workspace);
  float* dense_part = coded_part + part_floats(p, p.rule.coded ? p.coded_splits : 0);
  const bool lut = paged_attention_uses_lut(p);
  if (p.rule.coded) {
    if (lut) detail::launch_lut_split_paged(p, coded_part, st);
    else detail::launch_gather_split_paged(p, coded_part, st);
  }
  int lb = 0;
  while ((1 << lb) < p.rule.block_tokens) ++lb;
  DenseParams dp{};
  dp.n_kv_heads = p.n_kv_heads;
  dp.group = p.group;
  dp.tiles8 = tiles8;
  dp.n_q_heads = p.n_kv_heads * p.group;
  dp.lb = lb;
  dp.rule = p.rule;
  dp.pos = p.pos;
  dp.row_table = p.row_table;
  dp.row_skip = p.row_skip;
  dp.tables = p.dense_tables;
  dp.q = p.q;
  dp.q_stride = p.q_stride ? p.q_stride : int64_t(dp.n_q_heads) * p.head_dim;
  dp.qscale = p.scale * kLog2e;
  dp.splits = p.dense_splits;
  dp.part = dense_part;
  const int HT = ht_for(std::min(p.group, 8));
  // On its own stream (a graph branch beside the coded kernel) the dense kernel follows an event
  // wait, not a kernel: plain launch there.
  const bool side = p.rule.coded && p.dense_stream && p.dense_join;
  cudaStream_t dst = side ? as_stream(p.dense_stream) : st;
  if (p.head_dim == 64) launch_dense_d<64>(dp, p.rows, HT, dst, !side);
  else if (p.head_dim == 128) launch_dense_d<128>(dp, p.rows, HT, dst, !side);
  else launch_dense_d<256>(dp, p.rows, HT, dst, !side);
  if (side) {
    VQ_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(p.dense_join), dst));
    VQ_CUDA_CHECK(cudaStreamWaitEvent(st, static_cast<cudaEvent_t>(p.dense_join), 0));
  }

  MergeParams mp{};
  mp.n_kv_heads = p.n_kv_heads;
  mp.group = p.group;
  mp.tiles8 = tiles8;
  mp.n_q_heads = dp.n_q_heads;
  mp.D = p.head_dim;
  mp.rule = p.rule;
  mp.pos = p.pos;
  mp.row_skip = p.row_skip;
  mp.coded_splits = p.rule.coded ? p.coded_splits : 0;
  mp.dense_splits = p.dense_splits;
  mp.lut = lut;
  mp.coded_part = coded_part;
  mp.dense_part = dense_part;
  mp.out_type = p.out_type;
  mp.out = p.out;
  mp.out_stride = p.out_stride ? p.out_stride : int64_t(dp.n_q_heads) * p.head_dim;
  launch_pdl("paged_merge_kernel", paged_merge_kernel, dim3(unsigned(dp.n_q_heads), unsigned(p.rows)), dim3(128), 0, st,
             mp);
  if (p.n_tiles > 0) detail::launch_prefill(p, st);
}

int paged_prefill_tile_rows(bool coded) { return detail::prefill_tile_rows(coded); }
int paged_prefill_positions_per_tile(int group, int tile_rows) { return tile_rows / group; }

}  // namespace vq::cuda
