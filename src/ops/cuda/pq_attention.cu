// Decode attention on VecInfer codes: split kernel + merge kernel (see pq_attention_cuda.h).
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/smem_attr.cuh"
#include "ops/cuda/mma_ptx.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_cuda.h"
#include "ops/cuda/pq_attention_lut.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/stream_cuda.h"
#include "ops/cuda/paged_split.cuh"

namespace vq::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = 32 * kWarps;
constexpr int kStages = 4;      // cp.async pipeline depth per warp (tiles of 16 tokens)
constexpr int kHeadsTile = 8;   // query heads per block (mma N)
constexpr float kLog2e = 1.4426950408889634f;

struct SplitParams {
  int n_kv_heads, group, head_tiles, n_q_heads;
  int kd, kbits, kK, kbooks, kcb;  // key sub_dim, bits, centroids, books, row bytes
  int vd, vbits, vK, vbooks, vcb;
  int kshift, vshift;              // log2(sub_dim): sub_dim is 4, 8 or 16
  const float* q;                  // q_code
  const uint8_t* const* k_codes;
  const uint8_t* const* v_codes;
  const int* n_coded;
  int64_t code_head_stride;
  const __half* k_book;
  const __half* v_book;
  int chunk, n_splits;
  float* part;  // [rows, n_kv_heads, head_tiles, n_splits][2*8 + 8*D] : m[8], l[8], o[8][D]
  // Paged mode (kernel template flag): row b's coded tokens through its block table, the range
  // and chunk derived from pos[b] by detail::coded_split (paged_attention_cuda.h).
  const uint8_t* const* const* tables;
  const int32_t* row_table;  // null: row b uses tables[b]
  const uint8_t* row_skip;   // rows the prefill kernel computes (null: none)
  const int32_t* pos;
  PagedRule rule;
  int lb;              // log2(block_tokens)
  int64_t keys_bytes;  // n_kv_heads * block_tokens * kcb: where a block's values start
  PagedKeyBias kbias;  // paged mode: the rotated key mean's score terms (values null: none)
};

using ptx::smem_u32;  // mma_ptx.cuh
// This kernel's cp.async wrappers take a byte count (partial rows zero-filled) and no memory
// clobber: each wait is followed by the __syncwarp / __syncthreads that orders the shared reads.

__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

using ptx::mma16816;  // mma_ptx.cuh

// Code `i` of a packed row in shared memory (any width 1..16; bytes fast path).
__device__ __forceinline__ uint32_t code_at(const uint8_t* row, int i, int bits) {
  if (bits == 8) return row[i];
  const int bit = i * bits;
  const uint8_t* q = row + (bit >> 3);
  const unsigned shift = unsigned(bit & 7);
  const unsigned need = shift + unsigned(bits);
  uint32_t v = q[0];
  if (need > 8) v |= uint32_t(q[1]) << 8;
  if (need > 16) v |= uint32_t(q[2]) << 16;
  return (v >> shift) & ((1u << bits) - 1u);
}

__device__ __forceinline__ uint2 ld_u2(const __half* p) { return *reinterpret_cast<const uint2*>(p); }

// Grid: (n_splits, n_kv_heads*head_tiles, rows). Dynamic smem: [books (if kSmemBooks)] [stages] [P tiles],
// reused at the end for the cross-warp merge.
template <int D, bool kSmemBooks, bool kPaged = false>
__global__ void __launch_bounds__(kThreads, D <= 128 ? 2 : 1) split_kernel(SplitParams p) {
  constexpr int KS = D / 16;    // k-steps of the score mma (4 dims per lane each)
  constexpr int MT = D / 16;    // m-tiles of the value mma
  constexpr int VU = D / 32;    // 4-dim groups per lane on the value side
  extern __shared__ __align__(16) unsigned char smem[];

  const int split = blockIdx.x;
  const int kh = blockIdx.y / p.head_tiles, ht = blockIdx.y % p.head_tiles;
  const int b = blockIdx.z;
  int tok_begin, tok_end, lo = 0;
  const uint8_t* const* tab = nullptr;
  if constexpr (kPaged) {
    if (p.row_skip && p.row_skip[b]) return;
    if (!detail::coded_split_tokens(p, b, split, detail::kGatherAlign, detail::kGatherChunkAlign, detail::kGatherMinChunk, tok_begin, tok_end, lo,
                                    tab))
      return;  // the merge kernel reads only splits that hold tokens
  } else {
    const int len = p.n_coded[b];
    tok_begin = split * p.chunk;
    if (tok_begin >= len) return;  // the merge kernel reads only splits that hold tokens
    tok_end = min(len, tok_begin + p.chunk);
  }
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  // ---- shared memory carve-up ----
  const size_t kbook_halves = size_t(p.kbooks) * p.kK * p.kd, vbook_halves = size_t(p.vbooks) * p.vK * p.vd;
  unsigned char* sp = smem;
  const __half* kbook = p.k_book + size_t(kh) * kbook_halves;
  const __half* vbook = p.v_book + size_t(kh) * vbook_halves;
  if constexpr (kSmemBooks) {
    __half* sk = reinterpret_cast<__half*>(sp);
    __half* sv = sk + kbook_halves;
    const uint4* gk = reinterpret_cast<const uint4*>(kbook);
    const uint4* gv = reinterpret_cast<const uint4*>(vbook);
    for (size_t i = threadIdx.x; i < kbook_halves / 8; i += kThreads) reinterpret_cast<uint4*>(sk)[i] = gk[i];
    for (size_t i = threadIdx.x; i < vbook_halves / 8; i += kThreads) reinterpret_cast<uint4*>(sv)[i] = gv[i];
    kbook = sk;
    vbook = sv;
    sp += ((kbook_halves + vbook_halves) * 2 + 15) / 16 * 16;
  }
  const int tile_bytes = 16 * (p.kcb + p.vcb);
  unsigned char* stage_base = sp + size_t(warp) * kStages * tile_bytes;
  unsigned char* merge_base = sp;  // reused after the main loop
  __half* ps = reinterpret_cast<__half*>(sp + size_t(kWarps) * kStages * tile_bytes) + warp * (kHeadsTile * 16 + 8);

  // ---- queries: B fragments of S^T = K Q^T, pre-scaled by log2(e) (softmax in base 2) ----
  const int qh_local = ht * kHeadsTile + g;  // head of this lane's B column
  const bool q_valid = qh_local < p.group;
  uint32_t qf[KS][2];
  {
    const float* qrow = p.q + (int64_t(b) * p.n_q_heads + int64_t(kh) * p.group + qh_local) * D;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      const int d0 = t * (D / 4) + 4 * ks;
      float4 v = q_valid ? *reinterpret_cast<const float4*>(qrow + d0) : make_float4(0.f, 0.f, 0.f, 0.f);
      __half2 lo = __floats2half2_rn(v.x * kLog2e, v.y * kLog2e), hi = __floats2half2_rn(v.z * kLog2e, v.w * kLog2e);
      qf[ks][0] = *reinterpret_cast<uint32_t*>(&lo);
      qf[ks][1] = *reinterpret_cast<uint32_t*>(&hi);
    }
  }

  const uint8_t* kbase = nullptr;
  const uint8_t* vbase = nullptr;
  if constexpr (!kPaged) {
    kbase = p.k_codes[b] + int64_t(kh) * p.code_head_stride * p.kcb;
    vbase = p.v_codes[b] + int64_t(kh) * p.code_head_stride * p.vcb;
  }
  const int n_tiles = (tok_end - tok_begin + 15) / 16;
  const int my_tiles = warp < n_tiles ? (n_tiles - warp + kWarps - 1) / kWarps : 0;

  auto issue = [&](int i) {  // i-th tile of this warp into stage i % kStages
    const int tile = warp + i * kWarps;
    const int tok0 = tok_begin + tile * 16;
    const int nv = min(16, tok_end - tok0);
    unsigned char* st = stage_base + (i % kStages) * tile_bytes;
    const uint8_t* ksrc;
    const uint8_t* vsrc;
    if constexpr (kPaged) {  // a 16-token tile lies in one block (B is a multiple of 16)
      const uint8_t* blk = tab[tok0 >> p.lb];
      const int64_t row0 = (int64_t(kh) << p.lb) + (tok0 & ((1 << p.lb) - 1));
      ksrc = blk + row0 * p.kcb;
      vsrc = blk + p.keys_bytes + row0 * p.vcb;
    } else {
      ksrc = kbase + int64_t(tok0) * p.kcb;
      vsrc = vbase + int64_t(tok0) * p.vcb;
    }
    const int kch = p.kcb, vch = p.vcb;  // 16-byte chunks per side (16 tokens * row bytes / 16)
    for (int c = lane; c < kch + vch; c += 32) {
      if (c < kch) {
        const int valid = min(16, max(0, nv * p.kcb - 16 * c));
        cp_async16(st + 16 * c, ksrc + (valid ? 16 * c : 0), valid);
      } else {
        const int cv = c - kch;
        const int valid = min(16, max(0, nv * p.vcb - 16 * cv));
        cp_async16(st + 16 * kch + 16 * cv, vsrc + (valid ? 16 * cv : 0), valid);
      }
    }
  };

  if constexpr (kSmemBooks) __syncthreads();  // books staged

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < my_tiles) issue(s);
    cp_async_commit();
  }

  float m_run[2] = {-INFINITY, -INFINITY};  // per head 2t, 2t+1 (base-2 scores)
  float l_run[2] = {0.f, 0.f};              // lane partial over its tokens
  float oc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) oc[mt][0] = oc[mt][1] = oc[mt][2] = oc[mt][3] = 0.f;

  for (int i = 0; i < my_tiles; ++i) {
    if (i + kStages - 1 < my_tiles) issue(i + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();
    const unsigned char* st = stage_base + (i % kStages) * tile_bytes;
    const uint8_t* krows = st;
    const uint8_t* vrows = st + 16 * p.kcb;
    const int tok0 = tok_begin + (warp + i * kWarps) * 16;
    const int nv = min(16, tok_end - tok0);

    // ---- scores: S^T[16 tokens][8 heads] ----
    float sc[4] = {0.f, 0.f, 0.f, 0.f};
    {
      const uint8_t* rg = krows + g * p.kcb;
      const uint8_t* rg8 = krows + (g + 8) * p.kcb;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const int d0 = t * (D / 4) + 4 * ks;
        const int sub = d0 >> p.kshift, off = d0 & (p.kd - 1);
        const int base = ((p.kbooks > 1 ? sub : 0) << (p.kbits + p.kshift)) + off;  // halves
        const uint32_t cg = code_at(rg, sub, p.kbits), cg8 = code_at(rg8, sub, p.kbits);
        const uint2 ag = ld_u2(kbook + base + int(cg << p.kshift));
        const uint2 ag8 = ld_u2(kbook + base + int(cg8 << p.kshift));
        mma16816(sc, ag.x, ag8.x, ag.y, ag8.y, qf[ks][0], qf[ks][1]);
      }
    }
    const int lv = lo - tok0;  // tokens below the row's coded range (paged mode, first tile only)
    if (kPaged && p.kbias.values) {  // the rotated key mean's terms (S^T rows g, g+8; head columns 2t, 2t+1)
      const int nseg = p.kbias.row_nseg[b];
      const int64_t off = p.kbias.row_off[b];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (ht * kHeadsTile + 2 * t + j >= p.group) continue;
        const int qh = kh * p.group + ht * kHeadsTile + 2 * t + j;
        if (g < nv && g >= lv) sc[j] += p.kbias.values[key_bias_index(off, nseg, lo, qh, tok0 + g)] * kLog2e;
        if (g + 8 < nv && g + 8 >= lv)
          sc[2 + j] += p.kbias.values[key_bias_index(off, nseg, lo, qh, tok0 + g + 8)] * kLog2e;
      }
    }
    if (g >= nv || g < lv) sc[0] = sc[1] = -INFINITY;
    if (g + 8 >= nv || g + 8 < lv) sc[2] = sc[3] = -INFINITY;

    // ---- online softmax (base 2), per head column j: 2t + j ----
    float pv[4];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float mx = fmaxf(sc[j], sc[2 + j]);
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
      const float m_new = fmaxf(m_run[j], mx);  // finite: every tile has >= 1 valid token
      const float alpha = ptx::exp2_ftz(m_run[j] - m_new);  // m_run = -inf -> 0
      pv[j] = ptx::exp2_ftz(sc[j] - m_new);
      pv[2 + j] = ptx::exp2_ftz(sc[2 + j] - m_new);
      l_run[j] = l_run[j] * alpha + pv[j] + pv[2 + j];
      m_run[j] = m_new;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) oc[mt][j] *= alpha, oc[mt][2 + j] *= alpha;
    }
    // P^T to the warp's tile [head][token] (fp16) for the value mma's B fragment.
    ps[(2 * t) * 16 + g] = __float2half_rn(pv[0]);
    ps[(2 * t + 1) * 16 + g] = __float2half_rn(pv[1]);
    ps[(2 * t) * 16 + g + 8] = __float2half_rn(pv[2]);
    ps[(2 * t + 1) * 16 + g + 8] = __float2half_rn(pv[3]);
    __syncwarp();
    const uint32_t pb0 = *reinterpret_cast<const uint32_t*>(ps + g * 16 + 2 * t);
    const uint32_t pb1 = *reinterpret_cast<const uint32_t*>(ps + g * 16 + 2 * t + 8);

    // ---- values: O^T[D][8 heads] += V^T[D][16 tokens] P^T[16 tokens][8 heads] ----
    // Lane (g, t) gathers dims [g*D/8, (g+1)*D/8) of tokens (slots) 2t, 2t+1, 2t+8, 2t+9.
    {
      uint2 xv[4][VU];
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int slot = 2 * t + (s & 1) + (s >> 1) * 8;
        const uint8_t* row = vrows + slot * p.vcb;
#pragma unroll
        for (int u = 0; u < VU; ++u) {
          const int d0 = g * (D / 8) + 4 * u;
          const int sub = d0 >> p.vshift, off = d0 & (p.vd - 1);
          const int base = ((p.vbooks > 1 ? sub : 0) << (p.vbits + p.vshift)) + off;
          const uint32_t c = code_at(row, sub, p.vbits);
          xv[s][u] = ld_u2(vbook + base + int(c << p.vshift));
        }
      }
#pragma unroll
      for (int u = 0; u < VU; ++u) {
        // m-tile 2u: dims +0 (row g) / +1 (row g+8); m-tile 2u+1: dims +2 / +3.
        mma16816(oc[2 * u], __byte_perm(xv[0][u].x, xv[1][u].x, 0x5410), __byte_perm(xv[0][u].x, xv[1][u].x, 0x7632),
                 __byte_perm(xv[2][u].x, xv[3][u].x, 0x5410), __byte_perm(xv[2][u].x, xv[3][u].x, 0x7632), pb0, pb1);
        mma16816(oc[2 * u + 1], __byte_perm(xv[0][u].y, xv[1][u].y, 0x5410),
                 __byte_perm(xv[0][u].y, xv[1][u].y, 0x7632), __byte_perm(xv[2][u].y, xv[3][u].y, 0x5410),
                 __byte_perm(xv[2][u].y, xv[3][u].y, 0x7632), pb0, pb1);
      }
    }
    __syncwarp();  // stage and P tile are rewritten in later iterations
  }
  cp_async_wait<0>();

  // ---- cross-warp merge in shared memory ----
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], 4);
    l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], 8);
    l_run[j] += __shfl_xor_sync(0xffffffffu, l_run[j], 16);
  }
  __syncthreads();  // all warps done with stages before the merge buffer overwrites them
  // merge buffer: wm [kWarps][8], wl [kWarps][8], wo [kWarps][8][D]
  float* wm = reinterpret_cast<float*>(merge_base);
  float* wl = wm + kWarps * kHeadsTile;
  float* wo = wl + kWarps * kHeadsTile;
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wm[warp * kHeadsTile + 2 * t + j] = m_run[j];
      wl[warp * kHeadsTile + 2 * t + j] = l_run[j];
    }
  }
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int dim_lo = g * (D / 8) + 2 * mt;  // row g -> +0, row g+8 -> +1
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      wo[(warp * kHeadsTile + 2 * t + j) * D + dim_lo] = oc[mt][j];
      wo[(warp * kHeadsTile + 2 * t + j) * D + dim_lo + 1] = oc[mt][2 + j];
    }
  }
  __syncthreads();
  float* out = p.part + ((((int64_t(b) * p.n_kv_heads + kh) * p.head_tiles + ht) * p.n_splits + split) *
                         (2 * kHeadsTile + kHeadsTile * D));
  for (int i = threadIdx.x; i < kHeadsTile * D + 2 * kHeadsTile; i += kThreads) {
    const int hh = i < kHeadsTile * D ? i / D : (i - kHeadsTile * D) % kHeadsTile;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wm[w * kHeadsTile + hh]);
    float acc = 0.f;
    if (i < kHeadsTile * D) {
      const int dim = i % D;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float mw = wm[w * kHeadsTile + hh];
        if (mw != -INFINITY) acc += exp2f(mw - M) * wo[(w * kHeadsTile + hh) * D + dim];
      }
      out[2 * kHeadsTile + i] = acc;
    } else if (i < kHeadsTile * D + kHeadsTile) {
      out[hh] = M;
    } else {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float mw = wm[w * kHeadsTile + hh];
        if (mw != -INFINITY) acc += exp2f(mw - M) * wl[w * kHeadsTile + hh];
      }
      out[kHeadsTile + hh] = acc;
    }
  }
}

struct MergeParams {
  int n_kv_heads, group, head_tiles, n_q_heads, D;
  int chunk, n_splits;
  const int* n_coded;
  const float* part;
  const float* q_code;
  const float* q_plain;
  F16Segment seg[2];
  float* out;
};

constexpr int kMergeThreads = 128;
constexpr int kSegTile = 128;  // fp16 tokens scored per pass

// Grid: (n_q_heads, rows). Merges the split partials, attends over the fp16 segments, normalises.
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(MergeParams p) {
  extern __shared__ float sm[];
  float* sq = sm;             // [D] query for the current segment (base-2 scaled)
  float* ss = sq + p.D;       // [kSegTile] scores
  // Launched with programmatic stream serialization behind the split kernel: wait here for its
  // partials (a no-op when launched normally).
  cudaGridDependencySynchronize();
  const int qh = blockIdx.x, b = blockIdx.y;
  const int kh = qh / p.group, gl = qh % p.group, ht = gl / kHeadsTile, hh = gl % kHeadsTile;
  const int D = p.D;
  constexpr int per = 2;  // dims per thread: d = threadIdx.x + k*128 < D <= 256
  float o[2] = {0.f, 0.f};
  float M = -INFINITY, L = 0.f;

  const int len = p.n_coded[b];
  const int nsp = (len + p.chunk - 1) / p.chunk;
  const int64_t pstride = 2 * kHeadsTile + kHeadsTile * D;
  const float* base = p.part + (((int64_t(b) * p.n_kv_heads + kh) * p.head_tiles + ht) * p.n_splits) * pstride;
  // Split weights in shared memory (read in parallel), then independent loads per dimension.
  float* sw = ss;  // reuses the score buffer: [nsp] weights, chunked by kSegTile
  for (int s0 = 0; s0 < nsp; s0 += kSegTile) {
    const int ns = min(kSegTile, nsp - s0);
    __syncthreads();
    for (int s = threadIdx.x; s < ns; s += kMergeThreads) sw[s] = base[(s0 + s) * pstride + hh];
    __syncthreads();
    float mc = -INFINITY;
    for (int s = 0; s < ns; ++s) mc = fmaxf(mc, sw[s]);
    const float m_new = fmaxf(M, mc);
    const float alpha = M == -INFINITY ? 0.f : exp2f(M - m_new);
    L *= alpha, o[0] *= alpha, o[1] *= alpha;
    M = m_new;
#pragma unroll 4
    for (int s = 0; s < ns; ++s) {
      const float* ps = base + (s0 + s) * pstride;
      const float w = sw[s] == -INFINITY ? 0.f : exp2f(sw[s] - M);
      L += w * ps[kHeadsTile + hh];
#pragma unroll
      for (int k = 0; k < per; ++k) {
        const int d = threadIdx.x + k * kMergeThreads;
        if (d < D) o[k] += w * ps[2 * kHeadsTile + hh * D + d];
      }
    }
  }

  for (int sgi = 0; sgi < 2; ++sgi) {
    const F16Segment& sg = p.seg[sgi];
    if (!sg.len) continue;
    const int n = sg.len[b];
    if (n <= 0) continue;
    const float* qsrc = (sg.keys_transformed ? p.q_code : p.q_plain) + (int64_t(b) * p.n_q_heads + qh) * D;
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += kMergeThreads) sq[d] = qsrc[d] * kLog2e;
    const __half* kb = reinterpret_cast<const __half*>(sg.k[b]) + int64_t(kh) * sg.head_stride;
    const __half* vb = reinterpret_cast<const __half*>(sg.v[b]) + int64_t(kh) * sg.head_stride;
    for (int t0 = 0; t0 < n; t0 += kSegTile) {
      const int nt = min(kSegTile, n - t0);
      __syncthreads();
      // Scores: warp per token, lanes over dims.
      const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
      for (int r = warp; r < nt; r += kMergeThreads / 32) {
        const __half* kr = kb + int64_t(t0 + r) * sg.token_stride;
        float acc = 0.f;
        for (int d = lane; d < D; d += 32) acc = fmaf(sq[d], __half2float(kr[d]), acc);
        for (int o2 = 16; o2; o2 >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o2);
        if (lane == 0) ss[r] = acc;
      }
      __syncthreads();
      float tmax = -INFINITY;
      for (int r = 0; r < nt; ++r) tmax = fmaxf(tmax, ss[r]);
      const float m_new = fmaxf(M, tmax);
      const float alpha = M == -INFINITY ? 0.f : exp2f(M - m_new);
      L *= alpha;
      o[0] *= alpha, o[1] *= alpha;
      for (int r = 0; r < nt; ++r) {
        const float pr = exp2f(ss[r] - m_new);
        L += pr;
        const __half* vr = vb + int64_t(t0 + r) * sg.token_stride;
    #pragma unroll
    for (int k = 0; k < per; ++k) {
          const int d = threadIdx.x + k * kMergeThreads;
          if (d < D) o[k] = fmaf(pr, __half2float(vr[d]), o[k]);
        }
      }
      M = m_new;
    }
  }
  const float inv = L > 0.f ? 1.0f / L : 0.f;
  float* dst = p.out + (int64_t(b) * p.n_q_heads + qh) * D;
#pragma unroll
  for (int k = 0; k < per; ++k) {
    const int d = threadIdx.x + k * kMergeThreads;
    if (d < D) dst[d] = o[k] * inv;
  }
}

__global__ void f32_to_f16_kernel(const float* src, __half* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    dst[i] = __float2half_rn(src[i]);
}

int max_smem_optin() {
  static int v = [] {
    int dev = 0, n = 0;
    VQ_CUDA_CHECK(cudaGetDevice(&dev));
    VQ_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return n;
  }();
  return v;
}

using detail::ensure_smem_attr;

struct Plan {
  bool lut;  // LUT split kernel (pq_attention_lut.cu) instead of the gather-mma one
  int head_tiles, chunk, n_splits, kcb, vcb;
  size_t books_bytes, split_smem_small, split_smem_books;
};

// force_lut: the LUT plan whatever a.kernel says (bench variants of the LUT kernel).
Plan make_plan(const PQAttnBatchArgs& a, bool query_device, bool force_lut = false) {
  Plan pl{};
  pl.head_tiles = (a.group + kHeadsTile - 1) / kHeadsTile;
  pl.kcb = int(code_row_bytes(a.head_dim / a.k_sub_dim, a.k_bits));
  pl.vcb = int(code_row_bytes(a.head_dim / a.v_sub_dim, a.v_bits));
  pl.lut = force_lut || a.kernel == PQAttnKernel::lut ||
           (a.kernel == PQAttnKernel::automatic && detail::lut_kernel_supported(a) &&
            (!query_device || detail::lut_kernel_smem(a) <= size_t(max_smem_optin())));
  int chunk = a.split_tokens;
  if (chunk <= 0 && pl.lut) {
    // 1 block of 16 warps per SM: one full wave (measured best in run 5a at every bench shape),
    // each block at least 32 tokens per warp.
    const int sms = query_device ? device_sm_count() : 132;
    const int kh = detail::lut_heads_per_block(a);
    const int64_t per_split = int64_t(a.rows) * a.n_kv_heads * ((a.group + kh - 1) / kh) *
                              detail::lut_value_parts(a.head_dim, a.v_per_subspace);
    const int64_t by_len = std::max<int64_t>(1, (int64_t(a.max_coded) + 511) / 512);
    const int64_t splits = std::max<int64_t>(1, std::min<int64_t>(by_len, int64_t(sms) / per_split));
    chunk = int(std::max<int64_t>(32, (int64_t(a.max_coded) + splits - 1) / splits));
    chunk = (chunk + 31) / 32 * 32;
  } else if (chunk <= 0) {
    const int sms = query_device ? device_sm_count() : 132;
    const int64_t per_split = int64_t(a.rows) * a.n_kv_heads * pl.head_tiles;
    const int64_t target_blocks = 4LL * sms;
    const int64_t splits = std::max<int64_t>(1, (target_blocks + per_split - 1) / per_split);
    chunk = int(std::max<int64_t>(256, (int64_t(a.max_coded) + splits - 1) / splits));
  }
  pl.chunk = pl.lut ? (chunk + 31) / 32 * 32 : (chunk + 127) / 128 * 128;
  pl.n_splits = std::max(1, (a.max_coded + pl.chunk - 1) / pl.chunk);
  const int kK = 1 << a.k_bits, vK = 1 << a.v_bits;
  const int kbooks = a.k_per_subspace ? a.head_dim / a.k_sub_dim : 1;
  const int vbooks = a.v_per_subspace ? a.head_dim / a.v_sub_dim : 1;
  pl.books_bytes = (size_t(kbooks) * kK * a.k_sub_dim + size_t(vbooks) * vK * a.v_sub_dim) * 2;
  pl.books_bytes = (pl.books_bytes + 15) / 16 * 16;
  const size_t stages = size_t(kWarps) * kStages * 16 * (pl.kcb + pl.vcb);
  const size_t ptiles = size_t(kWarps) * (kHeadsTile * 16 + 8) * 2;
  const size_t merge = size_t(kWarps) * kHeadsTile * (2 + a.head_dim) * 4;
  pl.split_smem_small = std::max(stages + ptiles, merge);
  pl.split_smem_books = pl.books_bytes + pl.split_smem_small;
  return pl;
}

}  // namespace

void check_pq_attention_args(const PQAttnBatchArgs& a) {
  VQ_CHECK(a.rows >= 0 && a.rows <= 65535, "cuda::pq_attention: rows = {} must be in 0..65535", a.rows);
  VQ_CHECK(a.n_kv_heads >= 1 && a.group >= 1, "cuda::pq_attention: n_kv_heads = {}, group = {} must be >= 1",
           a.n_kv_heads, a.group);
  VQ_CHECK(a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256,
           "cuda::pq_attention: head_dim = {} must be 64, 128 or 256", a.head_dim);
  for (int side = 0; side < 2; ++side) {
    const int d = side ? a.v_sub_dim : a.k_sub_dim, bits = side ? a.v_bits : a.k_bits;
    const char* name = side ? "v" : "k";
    VQ_CHECK((d == 4 || d == 8 || d == 16) && (a.head_dim / 8) % d == 0,
             "cuda::pq_attention: {}_sub_dim = {} must be 4, 8 or 16 and divide head_dim/8 = {}", name, d,
             a.head_dim / 8);
    VQ_CHECK(bits >= 1 && bits <= 16, "cuda::pq_attention: {}_bits = {} must be in 1..16", name, bits);
  }
  VQ_CHECK(a.code_head_stride % 16 == 0 && a.code_head_stride >= a.max_coded,
           "cuda::pq_attention: code_head_stride = {} must be a multiple of 16 and >= max_coded = {}",
           a.code_head_stride, a.max_coded);
  VQ_CHECK(a.max_coded >= 0, "cuda::pq_attention: max_coded = {} < 0", a.max_coded);
  VQ_CHECK(a.kernel == PQAttnKernel::automatic || a.kernel == PQAttnKernel::gather_mma ||
               a.kernel == PQAttnKernel::lut,
           "cuda::pq_attention: kernel = {} is not one of auto, gather_mma, lut", int(a.kernel));
  VQ_CHECK(a.kernel != PQAttnKernel::lut || detail::lut_kernel_supported(a),
           "cuda::pq_attention: kernel lut needs 8-bit keys with head_dim/k_sub_dim 16 or 32, values d4 8-bit, "
           "head_dim 64 or 128 (got head_dim {}, k d{}b{}, v d{}b{})", a.head_dim, a.k_sub_dim, a.k_bits,
           a.v_sub_dim, a.v_bits);
  VQ_CHECK(a.out && a.n_coded && a.q_code, "cuda::pq_attention: null out, n_coded or q_code");
  if (a.max_coded > 0)
    VQ_CHECK(a.k_codes && a.v_codes && a.k_book && a.v_book, "cuda::pq_attention: null codes or codebooks");
  for (int s = 0; s < 2; ++s)
    if (a.seg[s].len) {
      VQ_CHECK(a.seg[s].k && a.seg[s].v, "cuda::pq_attention: segment {} has lengths but no k/v pointers", s);
      VQ_CHECK(a.seg[s].keys_transformed || a.q_plain, "cuda::pq_attention: segment {} needs q_plain", s);
    }
}

size_t pq_attention_workspace_bytes(const PQAttnBatchArgs& a) {
  const Plan pl = make_plan(a, cuda_device_available());
  return size_t(a.rows) * a.n_kv_heads * pl.head_tiles * pl.n_splits * (2 * kHeadsTile + kHeadsTile * a.head_dim) *
         sizeof(float);
}

namespace {

// split: the LUT split launcher (the shipped one, or a bench variant through
// detail::pq_attention_device_with_split, which also forces the LUT plan).
// The split kernel's arguments shared by the contiguous and the paged modes.
SplitParams split_params(const PQAttnBatchArgs& a, const Plan& pl) {
  SplitParams sp{};
  sp.n_kv_heads = a.n_kv_heads;
  sp.group = a.group;
  sp.head_tiles = pl.head_tiles;
  sp.n_q_heads = a.n_kv_heads * a.group;
  sp.kd = a.k_sub_dim, sp.kbits = a.k_bits, sp.kK = 1 << a.k_bits;
  sp.kbooks = a.k_per_subspace ? a.head_dim / a.k_sub_dim : 1, sp.kcb = pl.kcb;
  sp.vd = a.v_sub_dim, sp.vbits = a.v_bits, sp.vK = 1 << a.v_bits;
  sp.vbooks = a.v_per_subspace ? a.head_dim / a.v_sub_dim : 1, sp.vcb = pl.vcb;
  sp.kshift = a.k_sub_dim == 4 ? 2 : a.k_sub_dim == 8 ? 3 : 4;
  sp.vshift = a.v_sub_dim == 4 ? 2 : a.v_sub_dim == 8 ? 3 : 4;
  sp.q = a.q_code;
  sp.k_book = reinterpret_cast<const __half*>(a.k_book);
  sp.v_book = reinterpret_cast<const __half*>(a.v_book);
  sp.chunk = pl.chunk;
  sp.n_splits = pl.n_splits;
  return sp;
}

// Grid (splits, n_kv_heads * head_tiles, rows) of the gather-mma split kernel.
template <bool kPaged>
void launch_gather_split(const PQAttnBatchArgs& a, const Plan& pl, const SplitParams& sp, int splits, cudaStream_t st) {
  VQ_CHECK(a.n_kv_heads * pl.head_tiles <= 65535 && splits <= (1 << 30),
           "cuda::pq_attention: grid too large ({} KV heads x {} head tiles)", a.n_kv_heads, pl.head_tiles);
  const bool books_in_smem = pl.split_smem_books <= size_t(max_smem_optin());
  const size_t smem = books_in_smem ? pl.split_smem_books : pl.split_smem_small;
  const dim3 grid(unsigned(splits), unsigned(a.n_kv_heads * pl.head_tiles), unsigned(a.rows));
  auto launch = [&](auto kernel) {
    ensure_smem_attr(reinterpret_cast<const void*>(kernel), smem);
    kernel<<<grid, kThreads, smem, st>>>(sp);
    VQ_CUDA_LAUNCHED(kPaged ? "split_kernel (paged)" : "split_kernel");
  };
  if (a.head_dim == 64) books_in_smem ? launch(split_kernel<64, true, kPaged>) : launch(split_kernel<64, false, kPaged>);
  else if (a.head_dim == 128) books_in_smem ? launch(split_kernel<128, true, kPaged>) : launch(split_kernel<128, false, kPaged>);
  else books_in_smem ? launch(split_kernel<256, true, kPaged>) : launch(split_kernel<256, false, kPaged>);
}

void run_pq_attention(const PQAttnBatchArgs& a, void* stream, detail::SplitLauncher split, bool force_lut) {
  VQ_CHECK(cuda_device_available(), "cuda::pq_attention: {}", cuda_unavailable_reason());
  check_pq_attention_args(a);
  VQ_CHECK(!force_lut || detail::lut_kernel_supported(a), "cuda::pq_attention: a LUT variant was asked for a shape "
           "the LUT kernels do not take");
  if (a.rows == 0) return;
  const Plan pl = make_plan(a, true, force_lut);
  const size_t need = size_t(a.rows) * a.n_kv_heads * pl.head_tiles * pl.n_splits *
                      (2 * kHeadsTile + kHeadsTile * a.head_dim) * sizeof(float);
  VQ_CHECK(a.workspace_bytes >= need && (need == 0 || a.workspace),
           "cuda::pq_attention: workspace of {} bytes is smaller than the {} needed", a.workspace_bytes, need);
  cudaStream_t st = as_stream(stream);
  SplitParams sp = split_params(a, pl);
  sp.k_codes = a.k_codes;
  sp.v_codes = a.v_codes;
  sp.n_coded = a.n_coded;
  sp.code_head_stride = a.code_head_stride;
  sp.part = static_cast<float*>(a.workspace);
  if (a.max_coded > 0 && pl.lut) {
    VQ_CHECK(detail::lut_kernel_supported(a), "cuda::pq_attention: the LUT kernel does not take these shapes "
             "(needs 8-bit keys with head_dim/k_sub_dim 16 or 32, values d4 8-bit, head_dim 64 or 128)");
    VQ_CHECK(a.n_kv_heads * ((a.group + 3) / 4) * 2 <= 65535, "cuda::pq_attention: grid too large");
    split(a, pl.head_tiles, pl.chunk, pl.n_splits, sp.part, st);
  } else if (a.max_coded > 0) {
    launch_gather_split<false>(a, pl, sp, pl.n_splits, st);
  }
  MergeParams mp{};
  mp.n_kv_heads = a.n_kv_heads;
  mp.group = a.group;
  mp.head_tiles = pl.head_tiles;
  mp.n_q_heads = a.n_kv_heads * a.group;
  mp.D = a.head_dim;
  mp.chunk = pl.chunk;
  mp.n_splits = pl.n_splits;
  mp.n_coded = a.n_coded;
  mp.part = sp.part;
  mp.q_code = a.q_code;
  mp.q_plain = a.q_plain;
  mp.seg[0] = a.seg[0];
  mp.seg[1] = a.seg[1];
  mp.out = a.out;
  const size_t msmem = (a.head_dim + kSegTile + kMergeThreads / 32) * sizeof(float);
  // Programmatic dependent launch: the merge grid's launch overlaps the split kernel's tail.
  launch_pdl("merge_kernel", merge_kernel, dim3(unsigned(mp.n_q_heads), unsigned(a.rows)), dim3(kMergeThreads), msmem,
             st, mp);
}

}  // namespace

namespace detail {

// The gather-mma split kernel in its paged mode (paged_attention.cu drives it): same kernel, the
// codes read through the rows' block tables.
void launch_gather_split_paged(const PagedAttnParams& a, float* part, cudaStream_t st) {
  PQAttnBatchArgs b{};
  b.rows = a.rows, b.n_kv_heads = a.n_kv_heads, b.group = a.group, b.head_dim = a.head_dim;
  b.k_sub_dim = a.k_sub_dim, b.k_bits = a.k_bits, b.k_per_subspace = a.k_per_subspace;
  b.v_sub_dim = a.v_sub_dim, b.v_bits = a.v_bits, b.v_per_subspace = a.v_per_subspace;
  b.kernel = PQAttnKernel::gather_mma;
  b.max_coded = 1;
  b.split_tokens = 256;
  const Plan pl = make_plan(b, true);
  SplitParams sp = split_params(b, pl);
  sp.q = a.q_code;
  sp.k_book = reinterpret_cast<const __half*>(a.k_book);
  sp.v_book = reinterpret_cast<const __half*>(a.v_book);
  sp.n_splits = a.coded_splits;
  sp.part = part;
  sp.tables = a.coded_tables;
  sp.row_table = a.row_table;
  sp.row_skip = a.row_skip;
  sp.pos = a.pos;
  sp.rule = a.rule;
  int lb = 0;
  while ((1 << lb) < a.rule.block_tokens) ++lb;
  sp.lb = lb;
  sp.keys_bytes = int64_t(a.n_kv_heads) * a.rule.block_tokens * pl.kcb;
  sp.kbias = a.key_bias;
  launch_gather_split<true>(b, pl, sp, a.coded_splits, st);
}

}  // namespace detail

void pq_attention_device(const PQAttnBatchArgs& a, void* stream) {
  run_pq_attention(a, stream, detail::launch_lut_split, false);
}

void detail::pq_attention_device_with_split(const PQAttnBatchArgs& a, SplitLauncher split, void* stream) {
  VQ_CHECK(split != nullptr, "cuda::pq_attention: null split launcher");
  run_pq_attention(a, stream, split, true);
}

const char* pq_attn_kernel_name(PQAttnKernel k) {
  switch (k) {
    case PQAttnKernel::automatic: return "auto";
    case PQAttnKernel::gather_mma: return "gather_mma";
    case PQAttnKernel::lut: return "lut";
  }
  return "unknown";
}

void f32_to_f16_device(const float* src, uint16_t* dst, int64_t n, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::f32_to_f16: {}", cuda_unavailable_reason());
  if (n <= 0) return;
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 65535));
  f32_to_f16_kernel<<<blocks, 256, 0, as_stream(stream)>>>(src, reinterpret_cast<__half*>(dst), n);
  VQ_CUDA_LAUNCHED("f32_to_f16_kernel");
}

}  // namespace vq::cuda
