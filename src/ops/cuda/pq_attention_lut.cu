// Decode attention on VecInfer codes, LUT form: the v4 split kernel (docs/CUDA_NOTES.md section 3),
// the shipped winner. Its measured predecessors and siblings (v3b: fp32 LUT; v5: 20 warps of 96
// registers) live in bench/cuda/pq_attention_lut_variants.cu.
//
// Block = 16 warps on one (row, KV head, tile of 4 query heads, token range); 1 block per SM.
// Keys: the block builds LUT[c][s] = (q~_h[s] . centroid_c of sub-space s) for the 4 heads, one
// 8-byte entry per (code, sub-space) (the 4 heads as two half2, built from queries held in
// registers), in shared memory. A warp takes 32 tokens, one per lane; at step i lane l reads
// sub-space s = (l & 15) ^ i, so each half-warp (one LDS.64 wavefront) hits 16 distinct bank
// pairs: every lookup is conflict-free, and one lookup yields the score terms of all 4 heads of
// the GQA tile. Pairs of terms are summed in fp16, then accumulated in fp32 per lane.
// Values: O^T = V^T P^T with mma.m16n8k16 (fp16 in, fp32 accumulate); value centroids are
// gathered from a bank-sliced copy of the (shared, d4, 8-bit) value book: 16 copies, copy j in
// banks 2j, 2j+1, lane j of each half-warp reads copy j, so every LDS.64 gather is conflict-free.
// Online softmax in base 2 with a lazy max (one vote per group unless a score passes the running
// max + 8); the accumulators are rescaled only when a head's running max grows.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/smem_attr.cuh"
#include "ops/cuda/mma_ptx.cuh"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_lut.cuh"
#include "ops/cuda/paged_split.cuh"
#include "ops/cuda/pdl.cuh"

namespace vq::cuda::detail {
namespace {

// KH: query heads per LUT entry, 4 (two half2, LDS.64 lookups) or 8 (four half2, LDS.128): one
// block covers a tile of KH heads of the GQA group; the value mma's 8 columns hold up to 8 heads.
constexpr int kPRow = 40;     // halves per P-tile row (32 tokens + 8 pad: conflict-free fragment reads)
constexpr float kLog2e = 1.4426950408889634f;

struct LutParams {
  int n_kv_heads, group, head_tiles8, n_q_heads;
  int kd, kbooks;   // key sub_dim, books (1 or n_sub)
  int kcb, vcb;     // packed row bytes
  const float* q;
  const uint8_t* const* k_codes;
  const uint8_t* const* v_codes;
  const int* n_coded;
  int64_t code_head_stride;
  const __half* k_book;  // [n_kv_heads, kbooks, 256, kd]
  const __half* v_book;  // [n_kv_heads, 1, 256, 4]
  int chunk, n_splits;
  float* part;
  // Paged mode (template flag): codes through the rows' block tables (paged_attention_cuda.h).
  const uint8_t* const* const* tables;
  const int32_t* row_table;  // null: row b uses tables[b]
  const uint8_t* row_skip;   // rows the prefill kernel computes (null: none)
  const int32_t* pos;
  PagedRule rule;
  int lb;              // log2(block_tokens); block_tokens >= 32, so a 32-token group is in one block
  int64_t keys_bytes;  // n_kv_heads * block_tokens * kcb
  PagedKeyBias kbias;  // paged mode: the rotated key mean's score terms (values null: none)
};

using ptx::mma16816;  // mma_ptx.cuh

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// NS: key sub-spaces (16 or 32); D: head_dim (64 or 128).
// Shared memory: lut [256][32] uint2 (entry (c, s) = 4 heads as two half2; rows of 256 B, NS = 16
// uses half a row) | vsl [256][16] uint2 | sq [4][D] f32 | ps [kNW][8][kPRow] half.
// kVPer: value codebooks per sub-space (the default calibration granularity): vsl is replaced by
// the D/4 books [D/4][256] uint2 as they are (no bank-sliced copies: 32x the bytes); lane (g, t)
// reads the book of its sub-space g*VU + u, so the gathers are no longer conflict-free (random
// codes: ~3 wavefronts per half-warp instead of 1).
// NW: warps per block (16; 8 at head_dim 256, whose value accumulators and code words need ~2x
// the registers). NS = 64 (head_dim 256, d4 keys): the LUT is two 64 KiB halves, sub-spaces
// 0..31 and 32..63, each laid out as for NS = 32 (lookups add the half's offset).
// VH: value parts (1, or 2 for per-sub-space value books at head_dim 256, whose 128 KiB do not fit
// beside the 128 KiB LUT): block vh of a (row, KV head, head tile, split) computes the same scores
// and the output dims of value sub-spaces g*VU*VH + vh*VU + u (u < VU) of each lane group g, so it
// holds only those books (64 KiB). Both parts write the same running max and sum.
template <int NS, int D, bool kPaged = false, bool kVPer = false, int NW = kLutWarps, int KH = 4, int VH = 1>
__global__ void __launch_bounds__(32 * NW, 1) lut_split_kernel(LutParams p) {
  static_assert(KH == 4 || (KH == 8 && NS <= 32), "8-head LUT entries: at most 32 key sub-spaces (128 KiB)");
  static_assert(VH == 1 || (VH == 2 && kVPer), "value parts split per-sub-space books only");
  constexpr int kH = KH;
  constexpr int kNW = NW;
  constexpr int kThreads = 32 * kNW;
  constexpr int MT = D / 16 / VH;  // m-tiles of the value mma
  constexpr int VU = D / 32 / VH;  // 4-dim groups (value sub-spaces) per lane
  constexpr int NW4 = NS / 4; // key code words per token
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kLutBytes = 256 * 256 * (NS > 32 ? 2 : 1) * (KH / 4);
  constexpr int VWN = VU > 4 ? 2 : 1;  // value code words per lane and token
  constexpr int kVBytes = kVPer ? (D / 4 / VH) * 256 * 8 : 256 * 16 * 8;
  uint2* vsl = reinterpret_cast<uint2*>(smem + kLutBytes);
  float* sq = reinterpret_cast<float*>(smem + kLutBytes + kVBytes);
  __half* ps_all = reinterpret_cast<__half*>(sq + kH * D);

  const int split = blockIdx.x;
  const int vh = VH == 1 ? 0 : int(blockIdx.y % VH), by = VH == 1 ? int(blockIdx.y) : int(blockIdx.y / VH);
  const int kh = by / ((p.group + kH - 1) / kH), ht4 = by % ((p.group + kH - 1) / kH);
  const int b = blockIdx.z;
  int tok_begin, tok_end, lo = 0;
  const uint8_t* const* tab = nullptr;
  if constexpr (kPaged) {
    if (p.row_skip && p.row_skip[b]) return;
    if (!detail::coded_split_tokens(p, b, split, detail::kLutAlign, detail::kLutChunkAlign, detail::kLutMinChunk, tok_begin, tok_end, lo,
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

  // ---- value book, 16 bank-sliced copies: vsl[c*16 + j] = centroid c (loads batched) ----
  if constexpr (kVPer) {  // the sub-spaces' books as they are: vsl[(g*VU + u)*256 + c]
    const uint4* vb = reinterpret_cast<const uint4*>(p.v_book + size_t(kh) * (D / 4) * 256 * 4);
    for (int i = threadIdx.x; i < (D / 4 / VH) * 256 / 2; i += kThreads) {
      const int lb = i >> 7;  // local book (128 uint4 each)
      const int gs = VH == 1 ? lb : (lb / VU) * (VU * VH) + vh * VU + lb % VU;
      reinterpret_cast<uint4*>(vsl)[i] = __ldg(vb + gs * 128 + (i & 127));
    }
  } else {
    const uint2* vb = reinterpret_cast<const uint2*>(p.v_book + size_t(kh) * 256 * 4);
    constexpr int VPT = (256 * 16 + kThreads - 1) / kThreads;
    constexpr bool exact = VPT * kThreads == 256 * 16;
    uint2 x[VPT];
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (exact || threadIdx.x + k * kThreads < 256 * 16) x[k] = __ldg(vb + ((threadIdx.x + k * kThreads) >> 4));
#pragma unroll
    for (int k = 0; k < VPT; ++k)
      if (exact || threadIdx.x + k * kThreads < 256 * 16) vsl[threadIdx.x + k * kThreads] = x[k];
  }
  // Launched with PDL (pdl.cuh): everything above reads what no kernel of this step writes or
  // what kernels before the previous one wrote (positions, block tables, codebooks); the queries
  // come from the previous kernel (the query transform). The dependents are triggered after the
  // main loop.
  pdl_wait();
  // ---- queries (base-2 scaled), zero for heads past the group ----
  for (int i = threadIdx.x; i < kH * D; i += kThreads) {
    const int h = i / D, d = i % D, qh = ht4 * kH + h;
    sq[i] = qh < p.group ? p.q[(int64_t(b) * p.n_q_heads + int64_t(kh) * p.group + qh) * D + d] * kLog2e : 0.f;
  }
  __syncthreads();
  // ---- key LUT ----
  {
    // Each thread keeps one sub-space s (its 4 heads' query slices in registers) and builds the
    // entries of codes c = tid/NS + k*(kThreads/NS). A half-warp stores 16 distinct s of one c:
    // 16 distinct bank pairs. All centroid loads are issued before the FMAs.
    constexpr int KD = D / NS;
    constexpr int CSTEP = kThreads / NS;
    constexpr int PASSES = 256 / CSTEP;
    static_assert(PASSES * CSTEP == 256, "whole passes over the 256 codes");
    constexpr int PB = PASSES < 16 ? PASSES : 16;  // passes whose centroid loads are in flight together
    const int s = threadIdx.x % NS, c0 = threadIdx.x / NS;
    const __half* kb = p.k_book + (size_t(kh) * p.kbooks + (p.kbooks > 1 ? s : 0)) * 256 * KD;
    float qr[kH][KD];
#pragma unroll
    for (int h = 0; h < kH; ++h)
#pragma unroll
      for (int j = 0; j < KD; ++j) qr[h][j] = sq[h * D + s * KD + j];
    uint2* lut16 = reinterpret_cast<uint2*>(smem) + (s >> 5) * 8192;  // the half of sub-space s
#pragma unroll 1
    for (int k0 = 0; k0 < PASSES; k0 += PB) {
    uint32_t cw[PB][KD / 2];
#pragma unroll
    for (int k = 0; k < PB; ++k) {
      const uint32_t* cent = reinterpret_cast<const uint32_t*>(kb + size_t(c0 + (k0 + k) * CSTEP) * KD);
      if constexpr (KD == 2) {
        cw[k][0] = __ldg(cent);
      } else if constexpr (KD == 4) {
        const uint2 x = __ldg(reinterpret_cast<const uint2*>(cent));
        cw[k][0] = x.x, cw[k][1] = x.y;
      } else {
        const uint4 x = __ldg(reinterpret_cast<const uint4*>(cent));
        cw[k][0] = x.x, cw[k][1] = x.y, cw[k][2] = x.z, cw[k][3] = x.w;
      }
    }
#pragma unroll
    for (int k = 0; k < PB; ++k) {
      float acc[kH];
#pragma unroll
      for (int h = 0; h < kH; ++h) acc[h] = 0.f;
#pragma unroll
      for (int j = 0; j < KD / 2; ++j) {
        const float2 cv = __half22float2(*reinterpret_cast<const __half2*>(&cw[k][j]));
#pragma unroll
        for (int h = 0; h < kH; ++h) acc[h] = fmaf(qr[h][2 * j], cv.x, fmaf(qr[h][2 * j + 1], cv.y, acc[h]));
      }
      const __half2 h01 = __floats2half2_rn(acc[0], acc[1]), h23 = __floats2half2_rn(acc[2], acc[3]);
      if constexpr (KH == 8) {  // rows of 512 B: entry (c, s) = heads 0..7 as four half2
        const __half2 h45 = __floats2half2_rn(acc[4], acc[5]), h67 = __floats2half2_rn(acc[6], acc[7]);
        reinterpret_cast<uint4*>(smem)[(c0 + (k0 + k) * CSTEP) * 32 + s] =
            make_uint4(*reinterpret_cast<const uint32_t*>(&h01), *reinterpret_cast<const uint32_t*>(&h23),
                       *reinterpret_cast<const uint32_t*>(&h45), *reinterpret_cast<const uint32_t*>(&h67));
      } else {
        lut16[(c0 + (k0 + k) * CSTEP) * 32 + (s & 31)] =
            make_uint2(*reinterpret_cast<const uint32_t*>(&h01), *reinterpret_cast<const uint32_t*>(&h23));
      }
    }
    }
  }
  __half* ps = ps_all + warp * 8 * kPRow;
  for (int i = lane; i < 8 * kPRow; i += 32) ps[i] = __float2half_rn(0.f);  // heads kH..7 stay 0
  __syncthreads();

  const uint8_t* kbase = nullptr;
  const uint8_t* vbase = nullptr;
  if constexpr (!kPaged) {
    kbase = p.k_codes[b] + int64_t(kh) * p.code_head_stride * p.kcb;
    vbase = p.v_codes[b] + int64_t(kh) * p.code_head_stride * p.vcb;
  }
  const int n_groups = (tok_end - tok_begin + 31) / 32;
  const int kcb = p.kcb, vcb = p.vcb;

  // Per-lane constants of the diagonal lookup: the code word of sub-space (l & 15) ^ i is
  // kw[(i>>2) ^ ((l>>2)&3)] (two conditional word swaps), its byte (l&3) ^ (i&3).
  const bool swap_pairs = (lane >> 2) & 1;
  const bool swap_quads = (lane >> 3) & 1;
  uint32_t sel[4];                               // PRMT selector: byte ((l&3)^k) -> bits 8..15
#pragma unroll
  for (int k = 0; k < 4; ++k) sel[k] = 0x4404u | (uint32_t((lane & 3) ^ k) << 4);
  const uint32_t l8 = uint32_t(lane & 15) << 3;
  const unsigned char* lutb = smem;
  // Value code word of lane g: value sub-spaces [g*VU, g*VU + VU) of a row.
  const int vword_off = (g * VU * VH + vh * VU) & ~3, vbyte0 = (g * VU * VH + vh * VU) & 3;

  // Key and value codes of group gi (loaded one group ahead of their use).
  auto load_codes = [&](int gi, uint32_t (&kw)[NW4], uint32_t (&vw)[2][4][VWN]) {
    const int tok0 = tok_begin + gi * 32;
    const int tok = tok0 + lane;
    // Rows of token tok0 + i: key kb + i*kcb, value vb + i*vcb (the group lies in one block).
    const uint8_t* kb;
    const uint8_t* vb;
    if constexpr (kPaged) {
      const uint8_t* blk = tab[tok0 >> p.lb];
      const int64_t row0 = (int64_t(kh) << p.lb) + (tok0 & ((1 << p.lb) - 1));
      kb = blk + row0 * kcb;
      vb = blk + p.keys_bytes + row0 * vcb;
    } else {
      kb = kbase + int64_t(tok0) * kcb;
      vb = vbase + int64_t(tok0) * vcb;
    }
    if (tok < tok_end && tok >= lo) {
      const uint4* src = reinterpret_cast<const uint4*>(kb + int64_t(lane) * kcb);
#pragma unroll
      for (int j = 0; j < NW4 / 4; ++j) {
        const uint4 x = __ldg(src + j);
        kw[4 * j] = x.x, kw[4 * j + 1] = x.y, kw[4 * j + 2] = x.z, kw[4 * j + 3] = x.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < NW4; ++j) kw[j] = 0u;
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int vt = tok0 + 16 * ks + 2 * t + (s & 1) + (s >> 1) * 8;
        if constexpr (VWN == 2) {
          const uint2 x = vt < tok_end && vt >= lo
                              ? __ldg(reinterpret_cast<const uint2*>(vb + int64_t(vt - tok0) * vcb + vword_off))
                              : make_uint2(0u, 0u);
          vw[ks][s][0] = x.x, vw[ks][s][1] = x.y;
        } else {
          vw[ks][s][0] = vt < tok_end && vt >= lo
                             ? __ldg(reinterpret_cast<const uint32_t*>(vb + int64_t(vt - tok0) * vcb + vword_off))
                             : 0u;
        }
      }
  };

  float m_run[kH], l_run[kH];
#pragma unroll
  for (int h = 0; h < kH; ++h) m_run[h] = -INFINITY, l_run[h] = 0.f;
  float oc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) oc[mt][0] = oc[mt][1] = oc[mt][2] = oc[mt][3] = 0.f;

  // The rotated key mean's terms of a group (paged mode, kbias set): this lane's token, the tile's
  // heads, loaded one group ahead with the codes. Segments are 16 tokens (kv_device_unsupported_reason).
  const bool kb_on = kPaged && p.kbias.values != nullptr;
  int64_t kb_base = 0;
  int kb_nseg = 0;
  if (kb_on) {
    kb_nseg = p.kbias.row_nseg[b];
    kb_base = key_bias_index(p.kbias.row_off[b], kb_nseg, lo, kh * p.group + ht4 * kH, 0);
  }
  auto load_bias = [&](int gi, float (&bv)[kH]) {
    const int tok = tok_begin + gi * 32 + lane;
    const bool ok = tok < tok_end && tok >= lo;
#pragma unroll
    for (int h = 0; h < kH; ++h)
      bv[h] = ok && ht4 * kH + h < p.group ? p.kbias.values[kb_base + int64_t(h) * kb_nseg + (tok >> kKeyMeanSegmentLog2)] * kLog2e : 0.f;
  };

  uint32_t kw[NW4], vw[2][4][VWN];
  float bv[kH];
  if (warp < n_groups) {
    load_codes(warp, kw, vw);
    if (kb_on) load_bias(warp, bv);
  }
  for (int gi = warp; gi < n_groups; gi += kNW) {
    uint32_t kwn[NW4], vwn[2][4][VWN];
    float bvn[kH];
    const bool more = gi + kNW < n_groups;
    if (more) {
      load_codes(gi + kNW, kwn, vwn);
      if (kb_on) load_bias(gi + kNW, bvn);
    }

    // ---- scores of token tok0 + lane for the 4 heads ----
    float sc[kH];
#pragma unroll
    for (int h = 0; h < kH; ++h) sc[h] = 0.f;
    if constexpr (KH == 8) {
      // Lane l at step i reads sub-space s = (l & 7) ^ i: a quarter-warp (one LDS.128 wavefront)
      // hits 8 distinct 16-byte bank groups. Its code word is kw[(i >> 2) ^ ((l >> 2) & 1)], its
      // byte (l & 3) ^ (i & 3); entry (c, s) lies at c*512 + s*16.
      uint32_t kp[NW4];
#pragma unroll
      for (int j = 0; j < NW4; ++j) kp[j] = swap_pairs ? kw[j ^ 1] : kw[j];
      const uint32_t l16 = uint32_t(lane & 7) << 3;  // in units of 2 bytes
#pragma unroll
      for (int i = 0; i < NS; i += 2) {
        const uint32_t o0 = __byte_perm(kp[i >> 2], 0u, sel[i & 3]) | (l16 ^ uint32_t(i << 3));
        const uint32_t o1 = __byte_perm(kp[(i + 1) >> 2], 0u, sel[(i + 1) & 3]) | (l16 ^ uint32_t((i + 1) << 3));
        const uint4 e0 = *reinterpret_cast<const uint4*>(lutb + 2 * o0);
        const uint4 e1 = *reinterpret_cast<const uint4*>(lutb + 2 * o1);
        const uint32_t a[4] = {e0.x, e0.y, e0.z, e0.w}, c[4] = {e1.x, e1.y, e1.z, e1.w};
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const float2 f = __half22float2(__hadd2(*reinterpret_cast<const __half2*>(&a[q]),
                                                  *reinterpret_cast<const __half2*>(&c[q])));
          sc[2 * q] += f.x, sc[2 * q + 1] += f.y;
        }
      }
    } else {
      uint32_t kt[NW4], kp[NW4];
#pragma unroll
      for (int j = 0; j < NW4; ++j) kt[j] = swap_pairs ? kw[j ^ 1] : kw[j];
#pragma unroll
      for (int j = 0; j < NW4; ++j) kp[j] = swap_quads ? kt[j ^ 2] : kt[j];
#pragma unroll
      for (int i = 0; i < NS; i += 2) {
        const uint32_t o0 = __byte_perm(kp[i >> 2], 0u, sel[i & 3]) | (l8 ^ uint32_t((i & 31) << 3));
        const uint32_t o1 = __byte_perm(kp[(i + 1) >> 2], 0u, sel[(i + 1) & 3]) | (l8 ^ uint32_t(((i + 1) & 31) << 3));
        const uint2 e0 = *reinterpret_cast<const uint2*>(lutb + (i >> 5) * 65536 + o0);
        const uint2 e1 = *reinterpret_cast<const uint2*>(lutb + ((i + 1) >> 5) * 65536 + o1);
        // two terms summed in fp16, then accumulated in fp32
        const float2 f01 = __half22float2(__hadd2(*reinterpret_cast<const __half2*>(&e0.x),
                                                  *reinterpret_cast<const __half2*>(&e1.x)));
        const float2 f23 = __half22float2(__hadd2(*reinterpret_cast<const __half2*>(&e0.y),
                                                  *reinterpret_cast<const __half2*>(&e1.y)));
        sc[0] += f01.x, sc[1] += f01.y, sc[2] += f23.x, sc[3] += f23.y;
      }
    }
    const int tok0 = tok_begin + gi * 32;
    if (tok0 + lane >= tok_end || tok0 + lane < lo) {
#pragma unroll
      for (int h = 0; h < kH; ++h) sc[h] = -INFINITY;
    } else if (kb_on) {  // the rotated key mean's term of this token's segment
#pragma unroll
      for (int h = 0; h < kH; ++h) sc[h] += bv[h];
    }

    // ---- online softmax (base 2); rescale only when a running max grows (warp-uniform) ----
    // The reference max may lag the true one by up to kSlack (P <= 2^kSlack, safe in fp16 and in
    // the fp32 sums): one vote replaces the 4 warp-max reductions unless some score exceeds
    // m_run + kSlack; then the exact max is taken. The partial state stays exact.
    constexpr float kSlack = 8.f;
    bool over = false;
#pragma unroll
    for (int h = 0; h < kH; ++h) over |= sc[h] > m_run[h] + kSlack;
    const bool need = __any_sync(0xffffffffu, over);
    float mx[kH];
    bool grow = false;
    if (need) {
#pragma unroll
      for (int h = 0; h < kH; ++h) {
        mx[h] = warp_max(sc[h]);
        grow |= mx[h] > m_run[h];
      }
    }
    if (grow) {
      float alpha[kH];
#pragma unroll
      for (int h = 0; h < kH; ++h) {
        const float m_new = fmaxf(m_run[h], mx[h]);
        alpha[h] = ptx::exp2_ftz(m_run[h] - m_new);  // -inf -> 0
        l_run[h] *= alpha[h];
        m_run[h] = m_new;
      }
      // lane (g, t) holds heads 2t, 2t+1 in oc columns 0/2 and 1/3 (kH = 4, t >= 2: padding heads)
      float a0 = t == 0 ? alpha[0] : alpha[2], a1 = t == 0 ? alpha[1] : alpha[3];
      if constexpr (KH == 8) {
        a0 = t == 0 ? alpha[0] : t == 1 ? alpha[2] : t == 2 ? alpha[4] : alpha[6];
        a1 = t == 0 ? alpha[1] : t == 1 ? alpha[3] : t == 2 ? alpha[5] : alpha[7];
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) oc[mt][0] *= a0, oc[mt][2] *= a0, oc[mt][1] *= a1, oc[mt][3] *= a1;
    }
#pragma unroll
    for (int h = 0; h < kH; ++h) {
      const float pr = ptx::exp2_ftz(sc[h] - m_run[h]);
      l_run[h] += pr;
      ps[h * kPRow + lane] = __float2half_rn(pr);
    }
    __syncwarp();

    // ---- values: two k-steps of 16 tokens ----
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const uint32_t pb0 = *reinterpret_cast<const uint32_t*>(ps + g * kPRow + 16 * ks + 2 * t);
      const uint32_t pb1 = *reinterpret_cast<const uint32_t*>(ps + g * kPRow + 16 * ks + 2 * t + 8);
      constexpr int UB = VU < 4 ? VU : 4;  // value sub-spaces gathered per batch (registers)
#pragma unroll
      for (int u0 = 0; u0 < VU; u0 += UB) {
      uint2 xv[4][VU];
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int u = u0; u < u0 + UB; ++u) {
          const uint32_t c = (vw[ks][s][(vbyte0 + u) >> 2] >> (8 * ((vbyte0 + u) & 3))) & 0xffu;
          if constexpr (kVPer) xv[s][u] = vsl[(g * VU + u) * 256 + c];
          else xv[s][u] = vsl[c * 16 + (lane & 15)];
        }
#pragma unroll
      for (int u = u0; u < u0 + UB; ++u) {
        mma16816(oc[2 * u], __byte_perm(xv[0][u].x, xv[1][u].x, 0x5410), __byte_perm(xv[0][u].x, xv[1][u].x, 0x7632),
                 __byte_perm(xv[2][u].x, xv[3][u].x, 0x5410), __byte_perm(xv[2][u].x, xv[3][u].x, 0x7632), pb0, pb1);
        mma16816(oc[2 * u + 1], __byte_perm(xv[0][u].y, xv[1][u].y, 0x5410),
                 __byte_perm(xv[0][u].y, xv[1][u].y, 0x7632), __byte_perm(xv[2][u].y, xv[3][u].y, 0x5410),
                 __byte_perm(xv[2][u].y, xv[3][u].y, 0x7632), pb0, pb1);
      }
      }
    }
    __syncwarp();  // the P tile is rewritten next iteration

    if (more) {
#pragma unroll
      for (int h = 0; h < kH; ++h) bv[h] = bvn[h];
#pragma unroll
      for (int j = 0; j < NW4; ++j) kw[j] = kwn[j];
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int s = 0; s < 4; ++s)
#pragma unroll
          for (int j = 0; j < VWN; ++j) vw[ks][s][j] = vwn[ks][s][j];
    }
  }

  // The merge kernel is launched with programmatic stream serialization: let it start its launch
  // now (it waits in cudaGridDependencySynchronize until this grid's writes are visible).
  cudaTriggerProgrammaticLaunchCompletion();
  // ---- cross-warp merge (the LUT area is reused) ----
#pragma unroll
  for (int h = 0; h < kH; ++h)
#pragma unroll
    for (int o = 16; o; o >>= 1) l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], o);
  __syncthreads();
  float* wm = reinterpret_cast<float*>(smem);  // [kNW][kH]
  float* wl = wm + kNW * kH;                   // [kNW][kH]
  float* wo = wl + kNW * kH;                   // [kNW][kH][D]
  if (lane < kH) {
    float mv = m_run[0], lv = l_run[0];
#pragma unroll
    for (int h = 1; h < kH; ++h)
      if (lane == h) mv = m_run[h], lv = l_run[h];
    wm[warp * kH + lane] = mv;  // -inf when the warp had no tokens
    wl[warp * kH + lane] = lv;
  }
  if (2 * t < kH) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int dim_lo = g * (D / 8) + vh * (D / 16) + 2 * mt;  // row g -> +0, row g+8 -> +1
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wo[(warp * kH + 2 * t + j) * D + dim_lo] = oc[mt][j];
        wo[(warp * kH + 2 * t + j) * D + dim_lo + 1] = oc[mt][2 + j];
      }
    }
  }
  __syncthreads();
  float* out = p.part + ((((int64_t(b) * p.n_kv_heads + kh) * p.head_tiles8 + (KH == 8 ? ht4 : ht4 >> 1)) * p.n_splits + split) *
                         (2 * 8 + 8 * D));
  const int slot0 = KH == 8 ? 0 : (ht4 & 1) * kH;
  constexpr int DV = D / VH;  // output dims of this block
  for (int i = threadIdx.x; i < kH * DV + 2 * kH; i += kThreads) {
    const int hh = i < kH * DV ? i / DV : (i - kH * DV) % kH;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kNW; ++w) M = fmaxf(M, wm[w * kH + hh]);
    float acc = 0.f;
    if (i < kH * DV) {
      const int j = i % DV;
      const int dim = VH == 1 ? j : (j / (D / 16)) * (D / 8) + vh * (D / 16) + j % (D / 16);
#pragma unroll
      for (int w = 0; w < kNW; ++w) {
        const float mw = wm[w * kH + hh];
        if (mw != -INFINITY) acc += exp2f(mw - M) * wo[(w * kH + hh) * D + dim];
      }
      out[2 * 8 + (slot0 + hh) * D + dim] = acc;
    } else if (i < kH * DV + kH) {
      out[slot0 + hh] = M;
    } else {
#pragma unroll
      for (int w = 0; w < kNW; ++w) {
        const float mw = wm[w * kH + hh];
        if (mw != -INFINITY) acc += exp2f(mw - M) * wl[w * kH + hh];
      }
      out[8 + slot0 + hh] = acc;
    }
  }
}

template <int NS, int D, bool kPaged = false, bool kVPer = false, int KH = 4, int VH = 1>
void launch(const LutParams& lp, dim3 grid, size_t smem, cudaStream_t st) {
  constexpr int NW = lut_warps(D);
  detail::ensure_smem_attr(lut_split_kernel<NS, D, kPaged, kVPer, NW, KH, VH>, smem);
  launch_pdl("lut_split_kernel", lut_split_kernel<NS, D, kPaged, kVPer, NW, KH, VH>, grid, dim3(32 * NW), smem, st,
             lp);
}

// One call site per (NS, D, kPaged, kVPer): picks the heads per LUT entry.
template <int NS, int D, bool kPaged, bool kVPer>
void launch_kh(const LutParams& lp, int kh, dim3 grid, size_t smem, cudaStream_t st) {
  if constexpr (NS <= 32) {
    if (kh == 8) return launch<NS, D, kPaged, kVPer, 8>(lp, grid, smem, st);
  }
  launch<NS, D, kPaged, kVPer, 4>(lp, grid, smem, st);
}

}  // namespace

bool lut_kernel_supported(const PQAttnBatchArgs& a) {
  const int ns = a.k_sub_dim > 0 ? a.head_dim / a.k_sub_dim : 0;
  if (a.k_bits != 8 || a.v_bits != 8 || a.v_sub_dim != 4) return false;
  if (a.head_dim == 64 || a.head_dim == 128) return ns == 16 || ns == 32;
  // head_dim 256: per-sub-space value books in two value parts (lut_value_parts).
  return a.head_dim == 256 && (ns == 32 || ns == 64);
}

int lut_heads_per_block(const PQAttnBatchArgs& a) {
  return lut_heads_per_block(a.group, a.head_dim, a.k_sub_dim > 0 ? a.head_dim / a.k_sub_dim : 0);
}

size_t lut_kernel_smem(const PQAttnBatchArgs& a) {
  const int ns = a.k_sub_dim > 0 ? a.head_dim / a.k_sub_dim : 0;
  const int kh = lut_heads_per_block(a);
  const size_t vbytes = a.v_per_subspace ? size_t(a.head_dim / 4 / lut_value_parts(a.head_dim, true)) * 256 * 8
                                         : size_t(256) * 16 * 8;
  return size_t(256) * 256 * (ns > 32 ? 2 : 1) * (kh / 4) + vbytes + size_t(kh) * a.head_dim * 4 +
         size_t(lut_warps(a.head_dim)) * 8 * kPRow * 2;
}

namespace {

// The kernel arguments both modes share; grid (n_splits, n_kv_heads * ceil(group/4), rows).
template <bool kPaged>
void launch_lut(const PQAttnBatchArgs& a, LutParams lp, int n_splits, cudaStream_t st) {
  lp.n_kv_heads = a.n_kv_heads;
  lp.group = a.group;
  lp.n_q_heads = a.n_kv_heads * a.group;
  lp.kd = a.k_sub_dim;
  lp.kbooks = a.k_per_subspace ? a.head_dim / a.k_sub_dim : 1;
  lp.kcb = int(code_row_bytes(a.head_dim / a.k_sub_dim, 8));
  lp.vcb = int(code_row_bytes(a.head_dim / 4, 8));
  lp.q = a.q_code;
  lp.k_book = reinterpret_cast<const __half*>(a.k_book);
  lp.v_book = reinterpret_cast<const __half*>(a.v_book);
  lp.n_splits = n_splits;
  const int kh = lut_heads_per_block(a);
  const int tiles = (a.group + kh - 1) / kh * lut_value_parts(a.head_dim, a.v_per_subspace);
  VQ_CHECK(a.n_kv_heads * tiles <= 65535, "cuda::pq_attention: grid too large");
  const dim3 grid(unsigned(n_splits), unsigned(a.n_kv_heads * tiles), unsigned(a.rows));
  const size_t smem = lut_kernel_smem(a);
  const int ns = a.head_dim / a.k_sub_dim;
  if (a.head_dim == 256 && a.v_per_subspace) {
    ns == 64 ? launch<64, 256, kPaged, true, 4, 2>(lp, grid, smem, st)
             : launch<32, 256, kPaged, true, 4, 2>(lp, grid, smem, st);
  } else if (a.head_dim == 256) {
    ns == 64 ? launch<64, 256, kPaged>(lp, grid, smem, st) : launch<32, 256, kPaged>(lp, grid, smem, st);
  } else if (a.v_per_subspace) {
    if (a.head_dim == 128)
      ns == 32 ? launch_kh<32, 128, kPaged, true>(lp, kh, grid, smem, st)
               : launch_kh<16, 128, kPaged, true>(lp, kh, grid, smem, st);
    else ns == 32 ? launch_kh<32, 64, kPaged, true>(lp, kh, grid, smem, st)
                  : launch_kh<16, 64, kPaged, true>(lp, kh, grid, smem, st);
  } else {
    if (a.head_dim == 128)
      ns == 32 ? launch_kh<32, 128, kPaged, false>(lp, kh, grid, smem, st)
               : launch_kh<16, 128, kPaged, false>(lp, kh, grid, smem, st);
    else ns == 32 ? launch_kh<32, 64, kPaged, false>(lp, kh, grid, smem, st)
                  : launch_kh<16, 64, kPaged, false>(lp, kh, grid, smem, st);
  }
}

// The LUT arguments of a paged call (the shapes and the query pointers).
PQAttnBatchArgs batch_args_of(const PagedAttnParams& a) {
  PQAttnBatchArgs b{};
  b.rows = a.rows, b.n_kv_heads = a.n_kv_heads, b.group = a.group, b.head_dim = a.head_dim;
  b.k_sub_dim = a.k_sub_dim, b.k_bits = a.k_bits, b.k_per_subspace = a.k_per_subspace;
  b.v_sub_dim = a.v_sub_dim, b.v_bits = a.v_bits, b.v_per_subspace = a.v_per_subspace;
  b.q_code = a.q_code, b.k_book = a.k_book, b.v_book = a.v_book;
  return b;
}

}  // namespace

void launch_lut_split(const PQAttnBatchArgs& a, int head_tiles8, int chunk, int n_splits, float* part, cudaStream_t st) {
  LutParams lp{};
  lp.head_tiles8 = head_tiles8;
  lp.k_codes = a.k_codes;
  lp.v_codes = a.v_codes;
  lp.n_coded = a.n_coded;
  lp.code_head_stride = a.code_head_stride;
  lp.chunk = chunk;
  lp.part = part;
  launch_lut<false>(a, lp, n_splits, st);
}

bool lut_kernel_supported_paged(const PagedAttnParams& a) {
  return lut_kernel_supported(batch_args_of(a)) && a.rule.block_tokens >= 32;
}

void launch_lut_split_paged(const PagedAttnParams& a, float* part, cudaStream_t st) {
  LutParams lp{};
  lp.head_tiles8 = (a.group + 7) / 8;
  lp.part = part;
  lp.tables = a.coded_tables;
  lp.row_table = a.row_table;
  lp.row_skip = a.row_skip;
  lp.pos = a.pos;
  lp.rule = a.rule;
  int lb = 0;
  while ((1 << lb) < a.rule.block_tokens) ++lb;
  lp.lb = lb;
  lp.keys_bytes = int64_t(a.n_kv_heads) * a.rule.block_tokens * int64_t(code_row_bytes(a.head_dim / a.k_sub_dim, 8));
  lp.kbias = a.key_bias;
  launch_lut<true>(batch_args_of(a), lp, a.coded_splits, st);
}

}  // namespace vq::cuda::detail
