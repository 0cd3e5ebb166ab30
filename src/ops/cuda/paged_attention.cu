// Attention over the KV pool's blocks (paged_attention_cuda.h): the dense split kernel, the
// merge kernel, and the launch sequence with the coded split kernels of pq_attention.cu /
// pq_attention_lut.cu in their paged mode.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/smem_attr.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/mma_ptx.cuh"
#include "ops/cuda/paged_attention_cuda.h"
#include "ops/cuda/paged_split.cuh"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_lut.cuh"
#include "ops/cuda/scalar_blocks.cuh"
#include "ops/cuda/stream_cuda.h"

namespace vq::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;
constexpr int kTile8 = 8;  // partials are laid out in tiles of 8 query heads (the coded kernels' layout)

struct DenseParams {
  int n_kv_heads, group, tiles8, n_q_heads, lb;
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

using namespace ptx;  // smem_u32, cp_async*, ldsm_x4(_t), mma16816, split_half2 (mma_ptx.cuh)

// Shared-memory layout of the dense split kernel, in halves: the query tile (hi and lo parts,
// 16 rows of D + 8: padded), then per warp ST stages of one key tile (channel-major [D][KN]) and
// one value tile (token-major [KN][D]), unpadded: the 16-byte chunks of a row are XOR-swizzled
// (kswz / vswz) so that the 8 rows one ldmatrix reads fall in 8 distinct 16-byte bank groups.
template <int D, int KN>
struct DenseLayout {
  static constexpr int QLD = D + 8, KLD = KN, VLD = D;
  static constexpr int KC = KN / 8, RPL = 128 / (KN * 2);  // chunks per key row, key rows per 128 bytes
  // halves offset of 16-byte chunk x of key row c / value row r
  static __device__ __forceinline__ int kswz(int c, int x) { return c * KLD + 8 * (x ^ ((c / RPL) & (KC - 1))); }
  static __device__ __forceinline__ int vswz(int r, int x) { return r * VLD + 8 * (x ^ (r & 7)); }
  static constexpr int stage_halves = D * KLD + KN * VLD;
  static constexpr int stage_bytes = stage_halves * 2;
  static constexpr int q_bytes = 2 * 16 * QLD * 2;
  static constexpr int stages(int warps, int budget) {
    const int s = budget / (stage_bytes * warps);
    return s < 2 ? 2 : s > 8 ? 8 : s;
  }
  static constexpr size_t smem(int warps, int st) { return size_t(q_bytes) + size_t(warps) * st * stage_bytes; }
  // the cross-warp merge reuses each warp's stages: m, l and O of 16 rows in fp32
  static_assert(2 * stage_bytes >= (16 * D + 32) * 4, "merge scratch must fit in a warp's stages");
};

// A warp's shared memory in the dense split kernel for blocks of element form E: fp16 blocks
// stream through ST stages of the fp16 tiles; scalar blocks (PagedElem q8_0 ...) stream their raw
// rows (a tile's K rows then its V rows, token-major as the pool holds them) through ST raw
// stages and are dequantized into one fp16 tile of the same layout before the products.
template <int D, int KN, PagedElem E>
struct DenseStages {
  using Lay = DenseLayout<D, KN>;
  static constexpr bool quant = E != PagedElem::f16;
  static constexpr int row_bytes = detail::scalar_row_bytes(E, D);
  static constexpr int raw_bytes = 2 * KN * row_bytes;  // a multiple of 16 (row_bytes % 4 == 0, KN >= 16)
  static constexpr int warp_bytes(int st) { return quant ? Lay::stage_bytes + st * raw_bytes : st * Lay::stage_bytes; }
  static constexpr size_t smem(int warps, int st) { return size_t(Lay::q_bytes) + size_t(warps) * warp_bytes(st); }
  static_assert(!quant || (raw_bytes % 16 == 0 && Lay::stage_bytes + 2 * raw_bytes >= (16 * D + 32) * 4),
                "raw stages must be 16-byte multiples and a warp's area must hold the merge scratch");
};

// Grid (splits, n_kv_heads, rows), W warps. A block takes every query head of one KV head (the
// group, up to 16, as the 16 rows of the tensor-core tiles: K/V bytes are read once per group)
// over one split of the row's dense tokens (sinks + window, or all keys of an fp16 layer), as
// tiles of KN tokens. Each warp streams its own tiles (tiles j0 + warp, j0 + warp + W, ...)
// through ST shared-memory stages with cp.async (16-byte copies; ST - 1 tiles in flight while
// it multiplies one), and runs S = Q K^T and O += P V with mma.m16n8k16 (fp32 accumulation):
// q and P enter as fp16 hi + lo pairs, so the result keeps fp32-like precision. Online softmax
// in base 2 per row; the warps' states are merged through shared memory at the end into the
// split's partial (m, l, o).
// Scalar blocks (E != f16): the same walk and products; a tile's raw rows arrive by cp.async in the
// warp's raw stages and are dequantized (scalar_blocks.cuh) into the warp's fp16 tile.
template <int D, int KN, int W, int ST, PagedElem E>
__global__ void __launch_bounds__(32 * W, 1) dense_mma_kernel(DenseParams p) {
  using Lay = DenseLayout<D, KN>;
  using Stg = DenseStages<D, KN, E>;
  constexpr bool QT = Stg::quant;
  constexpr int QLD = Lay::QLD, KLD = Lay::KLD;
  constexpr int NS = KN / 8, NO = D / 8;
  extern __shared__ __align__(16) unsigned char dsm_raw[];
  __half* qhi = reinterpret_cast<__half*>(dsm_raw);
  __half* qlo = qhi + 16 * QLD;
  __half* stages = qlo + 16 * QLD;

  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int split = blockIdx.x, kh = blockIdx.y, b = blockIdx.z;
  if (p.row_skip && p.row_skip[b]) return;
  const detail::DenseTiles dt = detail::dense_tiles(p.rule, p.pos[b], p.splits, KN);
  if (!dt.holds(split)) return;
  const int j0 = split * dt.chunk, j1 = min(dt.n(), j0 + dt.chunk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int H = p.n_kv_heads, B = 1 << p.lb, G = p.group;
  const uint8_t* const* tab = p.tables[p.row_table ? p.row_table[b] : b];
  unsigned char* mine_b = reinterpret_cast<unsigned char*>(stages) + size_t(warp) * Stg::warp_bytes(ST);
  __half* mine = reinterpret_cast<__half*>(mine_b);
  auto raw_stage = [&](int k) { return mine_b + Lay::stage_bytes + (k % ST) * Stg::raw_bytes; };
  // The warp's k-th tile: tiles go to the warps in groups of TPB (the tiles of one 32-token span),
  // so the two halves of a block's key rows (KN = 16) are read by one warp back to back.
  constexpr int TPB = KN >= 32 ? 1 : 32 / KN;
  auto tile_of = [&](int k) { return j0 + ((k / TPB) * W + warp) * TPB + k % TPB; };
  int n_my;
  {
    const int T = j1 - j0, GT = (T + TPB - 1) / TPB;
    const int ng = GT > warp ? (GT - warp + W - 1) / W : 0;
    n_my = ng * TPB;
    if (ng > 0 && (GT - 1) % W == warp) n_my -= GT * TPB - T;
  }

  // The pool block of the warp's tile k (null past its last): loaded one tile before issue() needs
  // it, so the copies never wait on the table read.
  auto block_of = [&](int k) -> const __half* {
    if (k >= n_my) return nullptr;
    int t0, lo, hi;
    dt.at(tile_of(k), t0, lo, hi);
    return reinterpret_cast<const __half*>(tab[t0 >> p.lb]);
  };
  auto issue = [&](int k, const __half* blk) {
    if (k < n_my) {
      int t0, lo, hi;
      dt.at(tile_of(k), t0, lo, hi);
      const int slot0 = t0 & (B - 1);
      if constexpr (QT) {  // the tile's K rows, then its V rows: KN * row_bytes contiguous bytes each
        constexpr int RB = Stg::row_bytes, SPAN = KN * RB;
        const uint8_t* b8 = reinterpret_cast<const uint8_t*>(blk);
        const uint8_t* kr = b8 + (size_t(kh) * B + slot0) * RB;
        const uint8_t* vr = b8 + (size_t(H + kh) * B + slot0) * RB;
        unsigned char* raw = raw_stage(k);
#pragma unroll
        for (int i = lane; i < SPAN / 16; i += 32) {
          cp_async16(raw + 16 * i, kr + 16 * i);
          cp_async16(raw + SPAN + 16 * i, vr + 16 * i);
        }
        cp_async_commit();
        return;
      }
      const __half* kg = blk + size_t(kh) * D * B + slot0;
      const __half* vg = blk + size_t(H) * D * B + (size_t(kh) * B + slot0) * D;
      __half* ks = mine + (k % ST) * Lay::stage_halves;
      __half* vs = ks + D * KLD;
      constexpr int KC = KN / 8, VC = D / 8;  // 16-byte chunks per key channel / per value row
#pragma unroll
      for (int i = lane; i < D * KC; i += 32) {
        const int c = i / KC, x = i % KC;
        cp_async16(ks + Lay::kswz(c, x), kg + size_t(c) * B + x * 8);
      }
#pragma unroll
      for (int i = lane; i < KN * VC; i += 32) {
        const int r = i / VC, x = i % VC, u = t0 + r;
        // values of masked tokens are zeros (their P is 0, and unwritten slots may hold NaN)
        cp_async16(vs + Lay::vswz(r, x), vg + size_t(r) * D + x * 8, u >= lo && u < hi);
      }
    }
    cp_async_commit();  // an empty group past the warp's last tile keeps the group count uniform
  };
#pragma unroll
  for (int k = 0; k < ST - 1; ++k) issue(k, block_of(k));
  const __half* next_blk = block_of(ST - 1);

  for (int i = threadIdx.x; i < 16 * D; i += 32 * W) {
    const int h = i / D, d = i % D;
    const float x = h < G ? p.q[int64_t(b) * p.q_stride + (int64_t(kh) * G + h) * D + d] * p.qscale : 0.f;
    const __half hi = __float2half_rn(x);
    qhi[h * QLD + d] = hi;
    qlo[h * QLD + d] = __float2half_rn(x - __half2float(hi));
  }
  __syncthreads();

  const int g = lane >> 2, t4 = lane & 3, mi = lane >> 3, r8 = lane & 7;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  float o[NO][4];
#pragma unroll
  for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  for (int k = 0; k < n_my; ++k) {
    issue(k + ST - 1, next_blk);
    next_blk = block_of(k + ST);
    cp_async_wait<ST - 1>();  // tile k has landed (this lane's copies) ...
    __syncwarp();              // ... and every lane's
    if constexpr (QT) {
      // Dequantize the raw rows into the fp16 tile, keys and values both token-major in the
      // values' swizzled layout (vswz: 16-byte stores, conflict-free ldmatrix; the keys are then
      // read without .trans); values of tokens outside the tile's range are zeros (their P is 0,
      // and unwritten slots may decode to NaN). Item i: token i / (D/8), channels 8*(i % (D/8)) ..
      constexpr int RB = Stg::row_bytes, QB = detail::scalar_block_bytes(E);
      const unsigned char* raw = raw_stage(k);
      int t0, lo, hi;
      dt.at(tile_of(k), t0, lo, hi);
      __half* kt = mine;
      __half* vt = mine + D * KLD;
#pragma unroll 4
      for (int i = lane; i < KN * (D / 8); i += 32) {
        const int r = i / (D / 8), ch = i % (D / 8);
        const unsigned char* kb = raw + r * RB + (ch >> 2) * QB;
        uint4 w;
        detail::dequantize8_h2<E>(kb, ch & 3, w);
        *reinterpret_cast<uint4*>(kt + Lay::vswz(r, ch)) = w;
        detail::dequantize8_h2<E>(kb + KN * RB, ch & 3, w);
        if (!(t0 + r >= lo && t0 + r < hi)) w = make_uint4(0, 0, 0, 0);
        *reinterpret_cast<uint4*>(vt + Lay::vswz(r, ch)) = w;
      }
      __syncwarp();
    }
    const __half* ks = QT ? mine : mine + (k % ST) * Lay::stage_halves;
    const __half* vs = ks + D * KLD;
    // ---- S = Q K^T: 16 rows (query heads) x KN tokens ----
    // (the hi and lo products in separate accumulators: two independent mma chains, not one)
    float s[NS][4], sl[NS][4];
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] = sl[n][c] = 0.f;
#pragma unroll
    for (int k0 = 0; k0 < D; k0 += 16) {
      uint32_t ah[4], al[4];
      ldsm_x4(ah, qhi + (lane & 15) * QLD + k0 + (lane >> 4) * 8);
      ldsm_x4(al, qlo + (lane & 15) * QLD + k0 + (lane >> 4) * 8);
#pragma unroll
      for (int n0 = 0; n0 < KN; n0 += 16) {
        uint32_t bb[4];
        if constexpr (QT) ldsm_x4(bb, ks + Lay::vswz(n0 + r8 + (mi >> 1) * 8, k0 / 8 + (mi & 1)));  // [KN][D]
        else ldsm_x4_t(bb, ks + Lay::kswz(k0 + r8 + (mi & 1) * 8, n0 / 8 + (mi >> 1)));           // [D][KN]
        mma16816(s[n0 / 8], ah, bb[0], bb[1]);
        mma16816(s[n0 / 8 + 1], ah, bb[2], bb[3]);
        mma16816(sl[n0 / 8], al, bb[0], bb[1]);
        mma16816(sl[n0 / 8 + 1], al, bb[2], bb[3]);
      }
    }
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int c = 0; c < 4; ++c) s[n][c] += sl[n][c];
    // ---- mask tokens outside the tile's range ----
    {
      int t0, lo, hi;
      dt.at(tile_of(k), t0, lo, hi);
      if (t0 < lo || t0 + KN > hi) {
#pragma unroll
        for (int n = 0; n < NS; ++n)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const int u = t0 + n * 8 + 2 * t4 + (c & 1);
            if (u < lo || u >= hi) s[n][c] = -INFINITY;
          }
      }
    }
    // ---- online softmax (base 2), rows g and g + 8 ----
    float alpha[2];
    online_softmax_step<NS>(s, m_run, l_run, alpha);
    if (any_rescale(alpha)) {
#pragma unroll
      for (int n = 0; n < NO; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }
    // ---- O += P V: P from the S accumulators, k-steps of 16 tokens ----
#pragma unroll
    for (int kk = 0; kk < KN / 16; ++kk) {
      uint32_t ph[4], pl[4];
      split_half2(s[2 * kk][0], s[2 * kk][1], ph[0], pl[0]);
      split_half2(s[2 * kk][2], s[2 * kk][3], ph[1], pl[1]);
      split_half2(s[2 * kk + 1][0], s[2 * kk + 1][1], ph[2], pl[2]);
      split_half2(s[2 * kk + 1][2], s[2 * kk + 1][3], ph[3], pl[3]);
#pragma unroll
      for (int d0 = 0; d0 < D; d0 += 16) {
        uint32_t bb[4];
        ldsm_x4_t(bb, vs + Lay::vswz(kk * 16 + r8 + (mi & 1) * 8, d0 / 8 + (mi >> 1)));
        mma16816(o[d0 / 8], ph, bb[0], bb[1]);
        mma16816(o[d0 / 8 + 1], ph, bb[2], bb[3]);
        mma16816(o[d0 / 8], pl, bb[0], bb[1]);
        mma16816(o[d0 / 8 + 1], pl, bb[2], bb[3]);
      }
    }
    __syncwarp();  // every lane is done with this stage before it is refilled
  }
  cp_async_wait<0>();
  __syncwarp();

  // ---- cross-warp merge through the warps' own stages, then the split's partial ----
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  float* wm = reinterpret_cast<float*>(mine);  // [16]
  float* wl = wm + 16;                         // [16]
  float* wo = wl + 16;                         // [16][D]
  if (t4 == 0) wm[g] = m_run[0], wm[g + 8] = m_run[1], wl[g] = l_run[0], wl[g + 8] = l_run[1];
#pragma unroll
  for (int n = 0; n < NO; ++n) {
    *reinterpret_cast<float2*>(wo + g * D + n * 8 + 2 * t4) = make_float2(o[n][0], o[n][1]);
    *reinterpret_cast<float2*>(wo + (g + 8) * D + n * 8 + 2 * t4) = make_float2(o[n][2], o[n][3]);
  }
  __syncthreads();
  constexpr int WSTRIDE = Stg::warp_bytes(ST) / 4;  // floats between two warps' scratch
  const float* sw = reinterpret_cast<const float*>(stages);
  const int64_t pstride = 2 * kTile8 + kTile8 * D;
  for (int i = threadIdx.x; i < G * D + 2 * G; i += 32 * W) {
    const int hh = i < G * D ? i / D : (i - G * D) % G;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < W; ++w) M = fmaxf(M, sw[w * WSTRIDE + hh]);
    float* out = p.part + (((int64_t(b) * H + kh) * p.tiles8 + hh / kTile8) * p.splits + split) * pstride;
    const int slot = hh % kTile8;
    float acc = 0.f;
    if (i < G * D) {
      const int dim = i % D;
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float mw = sw[w * WSTRIDE + hh];
        if (mw != -INFINITY) acc += exp2f(mw - M) * sw[w * WSTRIDE + 32 + hh * D + dim];
      }
      out[2 * kTile8 + slot * D + dim] = acc;
    } else if (i < G * D + G) {
      out[slot] = M;
    } else {
#pragma unroll
      for (int w = 0; w < W; ++w) {
        const float mw = sw[w * WSTRIDE + hh];
        if (mw != -INFINITY) acc += exp2f(mw - M) * sw[w * WSTRIDE + 16 + hh];
      }
      out[kTile8 + slot] = acc;
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
  int dense_tile;  // tokens per tile of the dense kernel's variant
  const float* coded_part;
  const float* dense_part;
  ElemType out_type;
  void* out;
  int64_t out_stride;
};

// Grid (n_q_heads, rows), kMergeThreads threads: the valid partials of both kinds combined by
// log-sum-exp, normalised. A row with no keys gets zeros. Every load is independent of the others,
// so the merge is two rounds of L2 loads, not a chain: thread i loads partial i's (m, l) and a block
// max and sum over shared memory give the weights; then thread (group g, lane j) loads the 4 dims
// 4j..4j+3 of o from the partials g, g + G, ... (G = 4 * kMergeThreads / D groups, 16-byte loads,
// all in flight at once) and the groups' sums meet in shared memory. (The online form made one
// dependent L2 round trip per partial: 38 us for the 132 partials of an fp16 layer at B=1, 4K; the
// two-pass form after it still walked ceil(n/32) + ceil(n/16) rounds: docs/CUDA_NOTES.md section 5.)
constexpr int kMergeThreads = 256;
constexpr int kMergeMaxParts = 2 * kMergeThreads;  // (m, l) of two partials per thread

__global__ void __launch_bounds__(kMergeThreads) paged_merge_kernel(MergeParams p) {
  constexpr int T = kMergeThreads;
  __shared__ float sw[kMergeMaxParts];  // weight of partial i: exp2(m_i - M), 0 for an empty split
  __shared__ float red[T / 32];         // per-warp max, then sum
  __shared__ float4 so[T];              // per-group sums of o: [group][D / 4]
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int qh = blockIdx.x, b = blockIdx.y;
  if (p.row_skip && p.row_skip[b]) return;  // the prefill kernel writes this row
  const int kh = qh / p.group, gl = qh % p.group, t8 = gl / kTile8, hh = gl % kTile8;
  const int D = p.D, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
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
  const detail::DenseTiles dt = detail::dense_tiles(p.rule, pos, p.dense_splits, p.dense_tile);
  const int nd = min(p.dense_splits, dt.used_splits());
  const float* cbase = p.coded_part + ((int64_t(b) * p.n_kv_heads + kh) * p.tiles8 + t8) * p.coded_splits * pstride;
  const float* dbase = p.dense_part + ((int64_t(b) * p.n_kv_heads + kh) * p.tiles8 + t8) * p.dense_splits * pstride;
  auto part = [&](int i) { return i < nc ? cbase + i * pstride : dbase + (i - nc) * pstride; };
  const int n = nc + nd;  // <= kMergeMaxParts (paged_attention_device)
  // ---- round 1: (m, l) of partials tid and tid + T; M = the block's max ----
  float mi[2], li[2];
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int i = tid + k * T;
    mi[k] = i < n ? part(i)[hh] : -INFINITY;
    li[k] = i < n ? part(i)[kTile8 + hh] : 0.f;
  }
  float M = fmaxf(mi[0], mi[1]);
#pragma unroll
  for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
  if (lane == 0) red[warp] = M;
  __syncthreads();
  M = red[0];
#pragma unroll
  for (int w = 1; w < T / 32; ++w) M = fmaxf(M, red[w]);
  // Weights (a split whose tokens were all masked has m = -inf: weight 0) and L = sum w l.
  float L = 0.f;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int i = tid + k * T;
    const float w = (M != -INFINITY && mi[k] != -INFINITY) ? exp2f(mi[k] - M) : 0.f;
    if (i < n) sw[i] = w;
    L = fmaf(w, li[k], L);
  }
#pragma unroll
  for (int o = 16; o; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
  __syncthreads();  // every thread has read the max out of red before it holds the sums
  if (lane == 0) red[warp] = L;
  __syncthreads();  // sw and red complete
  L = 0.f;
#pragma unroll
  for (int w = 0; w < T / 32; ++w) L += red[w];
  // ---- round 2: thread (group g, lane j) sums w_i o_i[4j..4j+3] over i = g, g + G, ... ----
  const int lanes = D / 4, G = T / lanes, g = tid / lanes, j = tid % lanes;  // D in {64, 128, 256}
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
  for (int i = g; i < n; i += G) {
    const float w = sw[i];
    const float4 v = reinterpret_cast<const float4*>(part(i) + 2 * kTile8 + hh * D)[j];
    if (w != 0.f) {  // an empty split's o may hold anything
      acc.x = fmaf(w, v.x, acc.x);
      acc.y = fmaf(w, v.y, acc.y);
      acc.z = fmaf(w, v.z, acc.z);
      acc.w = fmaf(w, v.w, acc.w);
    }
  }
  so[tid] = acc;
  __syncthreads();
  if (tid < D) {
    const int jj = tid / 4, c = tid % 4;
    float o = 0.f;
    for (int k = 0; k < G; ++k) o += reinterpret_cast<const float*>(&so[k * lanes + jj])[c];
    const float inv = L > 0.f ? 1.0f / L : 0.f;
    const int64_t i = int64_t(b) * p.out_stride + int64_t(qh) * D + tid;
    if (p.out_type == ElemType::f16) static_cast<__half*>(p.out)[i] = __float2half_rn(o * inv);
    else static_cast<float*>(p.out)[i] = o * inv;
  }
}

// The dense split kernel's variants (tile tokens, warps, shared-memory budget for the stages).
// Variant 0 is the one the dispatch picks. The losers of the sweep (16-token tiles with 4 or 8
// warps, 2 warps with 6 stages, 2 stages with two blocks per SM: docs/CUDA_NOTES.md section 4)
// are in git history; a new candidate goes here and is timed with bench_paged_attention --variants.
struct DenseVariant {
  int kn, warps, budget;
};
constexpr DenseVariant kDenseVariants[] = {
    {32, 4, 200 * 1024}};
constexpr int kNumDenseVariants = int(sizeof(kDenseVariants) / sizeof(kDenseVariants[0]));
int g_forced_dense_variant = -1;
int g_coded_split_cap = 0;  // bench only: 0 = kLutMaxSplits

template <int D, int VI, PagedElem E>
struct DenseKernel {
  // At head_dim 256 a tile is 16 tokens; warps halve until two stages each fit in shared memory.
  // Scalar blocks: 16-token tiles and two raw stages, so that several blocks share an SM (the
  // dequantization is ALU work whose latency more warps hide).
  static constexpr bool quant = E != PagedElem::f16;
  static constexpr int kn = D == 256 || quant ? 16 : kDenseVariants[VI].kn;
  using Stg = DenseStages<D, kn, E>;
  static constexpr int fit_warps(int w) { return w > 1 && Stg::smem(w, 2) > 227 * 1024 ? fit_warps(w / 2) : w; }
  static constexpr DenseVariant v{kn, fit_warps(kDenseVariants[VI].warps), kDenseVariants[VI].budget};
  static constexpr int st = quant ? 2 : DenseLayout<D, kn>::stages(v.warps, v.budget);
  static constexpr size_t smem = Stg::smem(v.warps, st);
  static constexpr auto fn = dense_mma_kernel<D, v.kn, v.warps, st, E>;
  static_assert(smem <= 227 * 1024, "dense split kernel: shared memory over the per-block limit");
  // Sets the dynamic shared-memory limit once; returns the resident blocks per SM.
  static int prepare() {
    detail::ensure_smem_attr(fn, smem);  // per device
    static int per_sm = [] {
      int n = 0;
      VQ_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, fn, 32 * v.warps, smem));
      return std::max(n, 1);
    }();
    return per_sm;
  }
  static void launch(const DenseParams& dp, int rows, cudaStream_t st_, bool pdl) {
    prepare();
    const dim3 grid(unsigned(dp.splits), unsigned(dp.n_kv_heads), unsigned(rows));
    launch_kernel("dense_mma_kernel", pdl, fn, grid, dim3(32 * v.warps), smem, st_, dp);
  }
};

// Calls f(ScalarTag<E>{}) with the compile-time form of e, fp16 included.
template <class F>
auto with_elem(PagedElem e, F&& f) {
  if (e == PagedElem::f16) return f(detail::ScalarTag<PagedElem::f16>{});
  return detail::with_scalar_elem(e, f);
}

// Tokens per tile of the dense kernel (DenseKernel::kn; the merge walks the same tiles).
int dense_tile_tokens(int D, int vi, PagedElem e) {
  return D == 256 || e != PagedElem::f16 ? 16 : kDenseVariants[vi].kn;
}

template <int D>
int dense_blocks_per_sm(int vi, PagedElem e) {
  static_assert(kNumDenseVariants == 1, "dispatch every variant here");
  (void)vi;
  return with_elem(e, [](auto tag) { return DenseKernel<D, 0, decltype(tag)::value>::prepare(); });
}
int dense_blocks_per_sm(int D, int vi, PagedElem e) {
  return D == 64 ? dense_blocks_per_sm<64>(vi, e) : D == 128 ? dense_blocks_per_sm<128>(vi, e)
                                                             : dense_blocks_per_sm<256>(vi, e);
}

template <int D>
void launch_dense_d(const DenseParams& dp, int rows, int vi, cudaStream_t st, bool pdl) {
  (void)vi;
  with_elem(dp.rule.elem, [&](auto tag) { DenseKernel<D, 0, decltype(tag)::value>::launch(dp, rows, st, pdl); });
}

// Split count of the dense kernel for `units` (row, KV head) pairs: the fewest splits whose
// blocks fill at least one wave of the GPU (sms * per_sm resident blocks) with every wave at
// least 85% full; past 2 splits per SM slot no more (then the best-filled count). Rows shorter
// than the split count times kDenseMinTokens leave later splits empty (they exit at once).
int dense_split_count(int64_t units, int sms, int per_sm) {
  const int64_t slots = int64_t(sms) * per_sm;
  int best = 1;
  double best_eff = 0;
  const int64_t max_splits = std::clamp<int64_t>((2 * slots + units - 1) / units, 1, 256);
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t blocks = units * s;
    const int64_t waves = (blocks + slots - 1) / slots;
    const double eff = double(blocks) / double(waves * slots);
    if (blocks >= slots && eff >= 0.85) return int(s);
    if (eff > best_eff + 1e-9) best_eff = eff, best = int(s);
  }
  return best;
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

void paged_attention_set_coded_split_cap(int cap) {
  VQ_CHECK(cap >= 0 && cap <= 1024, "cuda::paged_attention_set_coded_split_cap: {} is not in 0..1024", cap);
  g_coded_split_cap = cap;
}

void paged_attention_set_dense_variant(int v) {
  VQ_CHECK(v >= -1 && v < kNumDenseVariants, "cuda::paged_attention_set_dense_variant: {} is not in -1..{}", v,
           kNumDenseVariants - 1);
  g_forced_dense_variant = v;
}
int paged_attention_dense_variants() { return kNumDenseVariants; }

std::string paged_attention_unsupported_reason(const PagedAttnParams& p) {
  if (p.n_kv_heads < 1 || p.group < 1 || p.group > 16)
    return fmt::format("n_kv_heads = {} must be >= 1 and group = {} in 1..16", p.n_kv_heads, p.group);
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256)
    return fmt::format("head_dim = {} must be 64, 128 or 256", p.head_dim);
  const int B = p.rule.block_tokens;
  if (B < 32 || B > 4096 || (B & (B - 1)) != 0)
    return fmt::format("block_tokens = {} must be a power of two in 32..4096", B);
  if (p.rule.elem != PagedElem::f16 && p.rule.coded)
    return "a layer of scalar blocks (PagedRule::elem) has no coded form";
  if (p.rule.coded) {
    for (int side = 0; side < 2; ++side) {
      const int d = side ? p.v_sub_dim : p.k_sub_dim, bits = side ? p.v_bits : p.k_bits;
      if (!((d == 4 || d == 8 || d == 16) && (p.head_dim / 8) % d == 0 && bits >= 1 && bits <= 16))
        return fmt::format("{} preset d{}b{}: sub_dim must be 4, 8 or 16 dividing head_dim/8 = {}, bits 1..16",
                           side ? "value" : "key", d, bits, p.head_dim / 8);
    }
    if (p.kernel == PQAttnKernel::lut && !detail::lut_kernel_supported_paged(p))
      return fmt::format("kernel lut does not take k d{}b{} v d{}b{} at head_dim {}", p.k_sub_dim, p.k_bits,
                         p.v_sub_dim, p.v_bits, p.head_dim);
  }
  return {};
}

// The rows the decode kernels cover (PagedAttnParams::decode_rows).
PagedAttnParams decode_part(const PagedAttnParams& p) {
  PagedAttnParams d = p;
  if (p.decode_rows >= 0 && p.decode_rows < p.rows) d.rows = p.decode_rows;
  return d;
}

PagedDecodeChoice paged_attention_choose(const PagedAttnParams& p, int sms) {
  PagedDecodeChoice c;
  c.why_not = paged_attention_unsupported_reason(p);
  if (!c.why_not.empty()) return c;
  c.supported = true;
  // The decode kernels' units: a step's prefill-tile rows (past decode_rows) are the prefill
  // kernel's, so a mixed step splits its decode rows as a decode step of those rows alone would.
  const int64_t units = int64_t(std::max(decode_part(p).rows, 1)) * p.n_kv_heads;
  c.dense_variant = g_forced_dense_variant >= 0 ? g_forced_dense_variant : 0;
  if (p.rule.coded) {
    c.coded = paged_attention_uses_lut(p) ? PQAttnKernel::lut : PQAttnKernel::gather_mma;
    if (c.coded == PQAttnKernel::lut) {
      // One block per SM, at most one wave, and at most 64 splits: with one (row, KV head) unit
      // all 132 SMs (128 splits) measured slower than 64 (70B-TP8 B=1: 0.0637 vs 0.0487 ms at
      // 64K, 0.0747 vs 0.0648 at 200K; issue 20, 2026-12-03): each block pays the LUT build, and
      // the dense window's kernel on the side stream finds no free SM.
      const int kh = detail::lut_heads_per_block(p.group, p.head_dim, p.head_dim / p.k_sub_dim);
      const int64_t per = units * ((p.group + kh - 1) / kh) * detail::lut_value_parts(p.head_dim, p.v_per_subspace);
      c.coded_splits = int(std::clamp<int64_t>(sms / per, 1, g_coded_split_cap > 0 ? g_coded_split_cap : 64));
    } else {  // 8-warp blocks, two per SM: about four blocks per SM
      const int64_t per = units * ((p.group + 7) / 8);
      c.coded_splits = int(std::clamp<int64_t>((4 * sms + per - 1) / per, 1, 128));
    }
    // The dense part of a coded layer is the sinks and the window (R..R+B-1 tokens).
    const int64_t dense_max = p.rule.sink_end + p.rule.residual + p.rule.block_tokens;
    c.dense_splits = int(std::clamp<int64_t>((dense_max + 127) / 128, 1, 8));
  } else {
    const int per_sm = cuda_device_available() ? dense_blocks_per_sm(p.head_dim, c.dense_variant, p.rule.elem) : 1;
    c.dense_splits = dense_split_count(units, sms, per_sm);
  }
  return c;
}

void paged_attention_plan(PagedAttnParams& p) {
  const int sms = cuda_device_available() ? device_sm_count() : 132;
  const PagedDecodeChoice c = paged_attention_choose(p, sms);
  VQ_CHECK(c.supported, "cuda::paged_attention: {}", c.why_not);
  p.coded_splits = c.coded_splits;
  p.dense_splits = c.dense_splits;
  p.dense_variant = c.dense_variant;
  p.prefill_splits = p.n_tiles > 0 ? detail::prefill_key_splits(p.n_tiles, p.n_kv_heads, p.tile_rows, sms) : 0;
}


size_t paged_attention_workspace_bytes(const PagedAttnParams& a) {
  const PagedAttnParams p = decode_part(a);
  return (part_floats(p, p.rule.coded ? p.coded_splits : 0) + part_floats(p, p.dense_splits)) * sizeof(float) +
         (p.n_tiles > 0 ? detail::prefill_part_bytes(p.n_tiles, p.n_kv_heads, p.tile_rows, p.head_dim, p.prefill_splits)
                        : 0);
}

void check_paged_attention(const PagedAttnParams& p) {
  VQ_CHECK(p.rows >= 0 && p.rows <= 65535, "cuda::paged_attention: rows = {} must be in 0..65535", p.rows);
  VQ_CHECK(p.decode_rows <= p.rows && (p.decode_rows >= p.rows || p.n_tiles > 0),
           "cuda::paged_attention: decode_rows {} of {} rows (fewer only with prefill tiles)", p.decode_rows, p.rows);
  const std::string why = paged_attention_unsupported_reason(p);
  VQ_CHECK(why.empty(), "cuda::paged_attention: {}", why);
  const int B = p.rule.block_tokens;
  VQ_CHECK(p.rule.sink_end % B == 0 && p.rule.residual >= 0 && p.rule.window >= 0,
           "cuda::paged_attention: rule sink_end {} (a multiple of {}), residual {}, window {}", p.rule.sink_end, B,
           p.rule.residual, p.rule.window);
  VQ_CHECK(p.dense_variant >= 0 && p.dense_variant < kNumDenseVariants,
           "cuda::paged_attention: dense_variant {}: call paged_attention_plan", p.dense_variant);
  VQ_CHECK(p.dense_splits >= 1 && (!p.rule.coded || p.coded_splits >= 1),
           "cuda::paged_attention: split counts {} (coded) {} (dense): call paged_attention_plan", p.coded_splits,
           p.dense_splits);
  VQ_CHECK(p.out_type == ElemType::f32 || p.out_type == ElemType::f16,
           "cuda::paged_attention: out_type {} must be f32 or f16", elem_type_name(p.out_type));
  if (p.rows == 0) return;
  VQ_CHECK(p.pos && p.dense_tables && p.q && p.out, "cuda::paged_attention: null pos, dense_tables, q or out");
  if (p.rule.coded)
    VQ_CHECK(p.coded_tables && p.q_code && p.k_book && p.v_book,
             "cuda::paged_attention: a coded layer needs coded_tables, q_code and both codebooks");
  VQ_CHECK(p.n_tiles >= 0 && (p.n_tiles == 0 || (p.tiles && p.row_skip && p.rule.block_tokens == 32)),
           "cuda::paged_attention: {} prefill tiles need tiles, row_skip and blocks of 32 tokens", p.n_tiles);
  VQ_CHECK(p.n_tiles == 0 || p.tile_rows == 64 || p.tile_rows == 128,
           "cuda::paged_attention: prefill tiles of {} rows (64 or 128: paged_prefill_tile_rows)", p.tile_rows);
  VQ_CHECK(!p.key_bias.values || (p.rule.coded && p.key_bias.row_off && p.key_bias.row_nseg),
           "cuda::paged_attention: key_bias on a layer without codes, or without its row offsets");
  VQ_CHECK(reinterpret_cast<uintptr_t>(p.workspace) % 16 == 0,
           "cuda::paged_attention: the workspace must be 16-byte aligned (the merge reads partials as float4)");
  const size_t need = paged_attention_workspace_bytes(p);
  VQ_CHECK(p.workspace_bytes >= need && (need == 0 || p.workspace),
           "cuda::paged_attention: workspace of {} bytes is smaller than the {} needed", p.workspace_bytes, need);
}

void paged_attention_device(const PagedAttnParams& all, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::paged_attention: {}", cuda_unavailable_reason());
  check_paged_attention(all);
  if (all.rows == 0) return;
  cudaStream_t st = as_stream(stream);
  const PagedAttnParams p = decode_part(all);  // the decode kernels' rows
  if (p.rows == 0) {  // every row is a prefill tile's
    detail::launch_prefill(all, static_cast<float*>(all.workspace), st);
    return;
  }
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
  // On its own stream (a graph branch beside the coded kernel) the dense kernel follows an event
  // wait, not a kernel: plain launch there.
  const bool side = p.rule.coded && p.dense_stream && p.dense_join;
  cudaStream_t dst = side ? as_stream(p.dense_stream) : st;
  if (p.head_dim == 64) launch_dense_d<64>(dp, p.rows, p.dense_variant, dst, !side);
  else if (p.head_dim == 128) launch_dense_d<128>(dp, p.rows, p.dense_variant, dst, !side);
  else launch_dense_d<256>(dp, p.rows, p.dense_variant, dst, !side);
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
  mp.dense_tile = dense_tile_tokens(p.head_dim, p.dense_variant, p.rule.elem);
  mp.coded_part = coded_part;
  mp.dense_part = dense_part;
  mp.out_type = p.out_type;
  mp.out = p.out;
  mp.out_stride = p.out_stride ? p.out_stride : int64_t(dp.n_q_heads) * p.head_dim;
  VQ_CHECK(mp.coded_splits + mp.dense_splits <= kMergeMaxParts,
           "cuda::paged_attention: {} coded + {} dense splits (the merge takes {})", mp.coded_splits, mp.dense_splits,
           kMergeMaxParts);
  launch_pdl("paged_merge_kernel", paged_merge_kernel, dim3(unsigned(dp.n_q_heads), unsigned(p.rows)),
             dim3(kMergeThreads), 0, st, mp);
  if (p.n_tiles > 0)
    detail::launch_prefill(all, dense_part + part_floats(p, p.dense_splits), st);  // after the decode partials
}

int paged_prefill_tile_rows(bool coded) { return detail::prefill_tile_rows(coded); }
int paged_prefill_positions_per_tile(int group, int tile_rows) { return tile_rows / group; }

}  // namespace vq::cuda
