// Kernel variants of the LUT decode attention that lost to the shipped v4 (docs/CUDA_NOTES.md
// section 3), kept runnable for bench_cuda_ops: v3b (fp32 LUT, 16 warps) and v5 (v4 with 20 warps
// of 96 registers). This is the kernel as it was measured, with all three forms (H16 / NWT
// template flags); the shipped src/ops/cuda/pq_attention_lut.cu is its v4 form alone. Launched
// through detail::pq_attention_device_with_split, which supplies the LUT plan and the merge.
//
// Original description:
// v4 differs from the description below in the key side only: LUT entries are 8 bytes (the 4 heads
// as two half2, built from queries held in registers), lane l reads sub-space (l & 15) ^ i (a
// half-warp covers 16 bank pairs: 2 wavefronts per LDS.64 instead of 4 per LDS.128), and pairs of
// terms are summed in fp16 before the fp32 accumulation.
//
// Block = 16 warps on one (row, KV head, tile of 4 query heads, token range); 1 block per SM.
// Keys: the block builds LUT[c][s] = (q~_h[s] . centroid_c of sub-space s) for the 4 heads, one
// 16-byte float4 per (code, sub-space), in shared memory. A warp takes 32 tokens, one per lane;
// at step i lane l reads sub-space s = (l & 7) ^ i, so the 8 lanes of each quarter-warp (one
// LDS.128 wavefront) hit 8 different bank quads: every lookup is conflict-free, and one lookup
// yields the score terms of all 4 heads of the GQA tile. Scores accumulate in fp32 per lane.
// Values: O^T = V^T P^T with mma.m16n8k16 (fp16 in, fp32 accumulate); value centroids are
// gathered from a bank-sliced copy of the (shared, d4, 8-bit) value book: 16 copies, copy j in
// banks 2j, 2j+1, lane j of each half-warp reads copy j, so every LDS.64 gather is conflict-free.
// Online softmax in base 2; the accumulators are rescaled only when a head's running max grows.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/mma_ptx.cuh"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_lut.cuh"
#include "pq_attention_lut_variants.h"

namespace vq::cuda::bench_variants {
namespace {

using detail::kLutWarps;
#ifndef VQ_LUT5_WARPS
#define VQ_LUT5_WARPS 20
#endif
constexpr int kLut5Warps = VQ_LUT5_WARPS;  // v5: more warps with fewer registers

constexpr int kH = 4;         // query heads per LUT entry (float4)
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
};

using ptx::mma16816;  // mma_ptx.cuh

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// NS: key sub-spaces (16 or 32); D: head_dim (64 or 128); H16: fp16 LUT (v4) instead of fp32 (v3b).
// Shared memory: lut | vsl [256][16] uint2 | sq [4][D] f32 | ps [kNW][8][kPRow] half, where
//   v3b: lut [NS/16][256][16] float4 (entry (c, s) = 4 heads in fp32)
//   v4:  lut [256][32] uint2 (entry (c, s) = 4 heads as two half2; rows of 256 B, NS = 16 uses half a row)
// NWT: warps per block. 16 = v4 (128 registers); 24 = v5 (80 registers: value codes loaded in their
// own iteration, value centroids gathered per sub-space; docs/CUDA_NOTES.md section 3a, v5).
template <int NS, int D, bool H16, int NWT>
__global__ void __launch_bounds__(32 * NWT, 1) lut_split_kernel(LutParams p) {
  constexpr int kNW = NWT;
  constexpr int kThreads = 32 * NWT;
  constexpr bool V5 = NWT != kLutWarps;
  static_assert(H16 || !V5, "v5 is the fp16-LUT kernel");
  constexpr int MT = D / 16;  // m-tiles of the value mma
  constexpr int VU = D / 32;  // 4-dim groups (value sub-spaces) per lane
  constexpr int NW4 = NS / 4; // key code words per token
  extern __shared__ __align__(16) unsigned char smem[];
  float4* lut = reinterpret_cast<float4*>(smem);
  constexpr int kLutBytes = H16 ? 256 * 256 : NS * 256 * 16;
  uint2* vsl = reinterpret_cast<uint2*>(smem + kLutBytes);
  float* sq = reinterpret_cast<float*>(smem + kLutBytes + 256 * 16 * 8);
  __half* ps_all = reinterpret_cast<__half*>(sq + kH * D);

  const int split = blockIdx.x;
  const int kh = blockIdx.y / ((p.group + kH - 1) / kH), ht4 = blockIdx.y % ((p.group + kH - 1) / kH);
  const int b = blockIdx.z;
  const int len = p.n_coded[b];
  const int tok_begin = split * p.chunk;
  if (tok_begin >= len) return;  // the merge kernel reads only splits that hold tokens
  const int tok_end = min(len, tok_begin + p.chunk);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;

  // ---- queries (base-2 scaled), zero for heads past the group ----
  for (int i = threadIdx.x; i < kH * D; i += kThreads) {
    const int h = i / D, d = i % D, qh = ht4 * kH + h;
    sq[i] = qh < p.group ? p.q[(int64_t(b) * p.n_q_heads + int64_t(kh) * p.group + qh) * D + d] * kLog2e : 0.f;
  }
  // ---- value book, 16 bank-sliced copies: vsl[c*16 + j] = centroid c (loads batched) ----
  {
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
  __syncthreads();
  // ---- key LUT ----
  if constexpr (H16) {
    // v4: thread keeps one sub-space s (its 4 heads' query slices in registers) and builds the
    // entries of codes c = tid/NS + k*(kThreads/NS). A half-warp stores 16 distinct s of one c:
    // 16 distinct bank pairs. All centroid loads are issued before the FMAs.
    constexpr int KD = D / NS;
    constexpr int CSTEP = kThreads / NS;
    constexpr int PASSES = (256 + CSTEP - 1) / CSTEP;
    constexpr bool exact = PASSES * CSTEP == 256;  // v4: yes; v5 (24 warps): the last pass is partial
    const int s = threadIdx.x % NS, c0 = threadIdx.x / NS;
    const __half* kb = p.k_book + (size_t(kh) * p.kbooks + (p.kbooks > 1 ? s : 0)) * 256 * KD;
    float qr[kH][KD];
#pragma unroll
    for (int h = 0; h < kH; ++h)
#pragma unroll
      for (int j = 0; j < KD; ++j) qr[h][j] = sq[h * D + s * KD + j];
    uint32_t cw[PASSES][KD / 2];
#pragma unroll
    for (int k = 0; k < PASSES; ++k) {
      if (!exact && c0 + k * CSTEP >= 256) break;
      const uint32_t* cent = reinterpret_cast<const uint32_t*>(kb + size_t(c0 + k * CSTEP) * KD);
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
    uint2* lut16 = reinterpret_cast<uint2*>(smem);
#pragma unroll
    for (int k = 0; k < PASSES; ++k) {
      if (!exact && c0 + k * CSTEP >= 256) break;
      float acc[kH] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < KD / 2; ++j) {
        const float2 cv = __half22float2(*reinterpret_cast<const __half2*>(&cw[k][j]));
#pragma unroll
        for (int h = 0; h < kH; ++h) acc[h] = fmaf(qr[h][2 * j], cv.x, fmaf(qr[h][2 * j + 1], cv.y, acc[h]));
      }
      const __half2 h01 = __floats2half2_rn(acc[0], acc[1]), h23 = __floats2half2_rn(acc[2], acc[3]);
      lut16[(c0 + k * CSTEP) * 32 + s] =
          make_uint2(*reinterpret_cast<const uint32_t*>(&h01), *reinterpret_cast<const uint32_t*>(&h23));
    }
  } else {
    // v3b: entry (c, s) at float4 index (s>>4)*4096 + c*16 + (s&15)
    constexpr int KD = D / NS;                     // key sub_dim: 4 or 8
    constexpr int PASSES = NS * 256 / kThreads;    // entries per thread
    const __half* kb = p.k_book + size_t(kh) * p.kbooks * 256 * KD;
    // A warp covers 8 sub-spaces x 4 codes per pass: quarter-warps store to 8 distinct bank quads.
    // All centroid loads are issued first (one L2 round trip instead of PASSES).
    uint32_t cw[PASSES][KD / 2];
#pragma unroll
    for (int k = 0; k < PASSES; ++k) {
      const int pass = warp + k * kNW;
      const int s = (pass % (NS / 8)) * 8 + (lane & 7), c = (pass / (NS / 8)) * 4 + (lane >> 3);
      const uint32_t* cent = reinterpret_cast<const uint32_t*>(kb + (size_t(p.kbooks > 1 ? s : 0) * 256 + c) * KD);
#pragma unroll
      for (int j = 0; j < KD / 2; ++j) cw[k][j] = __ldg(cent + j);
    }
#pragma unroll
    for (int k = 0; k < PASSES; ++k) {
      const int pass = warp + k * kNW;
      const int s = (pass % (NS / 8)) * 8 + (lane & 7), c = (pass / (NS / 8)) * 4 + (lane >> 3);
      float acc[kH] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < KD / 2; ++j) {
        const float2 cv = __half22float2(*reinterpret_cast<const __half2*>(&cw[k][j]));
#pragma unroll
        for (int h = 0; h < kH; ++h)
          acc[h] = fmaf(sq[h * D + s * KD + 2 * j], cv.x, fmaf(sq[h * D + s * KD + 2 * j + 1], cv.y, acc[h]));
      }
      lut[(s >> 4) * 4096 + c * 16 + (s & 15)] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    }
  }
  __half* ps = ps_all + warp * 8 * kPRow;
  for (int i = lane; i < 8 * kPRow; i += 32) ps[i] = __float2half_rn(0.f);  // heads 4..7 stay 0
  __syncthreads();

  const uint8_t* kbase = p.k_codes[b] + int64_t(kh) * p.code_head_stride * p.kcb;
  const uint8_t* vbase = p.v_codes[b] + int64_t(kh) * p.code_head_stride * p.vcb;
  const int n_groups = (tok_end - tok_begin + 31) / 32;
  const int kcb = p.kcb, vcb = p.vcb;

  // Per-lane constants of the diagonal lookup.
  const int l7 = lane & 7;
  const bool swap_pairs = (lane >> 2) & 1;      // word index = (i>>2) ^ ((l&7)>>2)
  uint32_t sel[4];                               // PRMT selector: byte ((l&3)^k) -> bits 8..15
#pragma unroll
  for (int k = 0; k < 4; ++k) sel[k] = 0x4404u | (uint32_t((lane & 3) ^ k) << 4);
  uint32_t bsel = 0;                             // v5: PRMT selector, byte k <- byte (l&3)^k
#pragma unroll
  for (int k = 0; k < 4; ++k) bsel |= uint32_t((lane & 3) ^ k) << (4 * k);
  const uint32_t l16 = uint32_t(l7) << 4;
  const bool swap_quads = (lane >> 3) & 1;      // v4: word index = (i>>2) ^ ((l>>2)&3)
  const uint32_t l8 = uint32_t(lane & 15) << 3;
  const unsigned char* lutb = reinterpret_cast<const unsigned char*>(lut);
  // Value code word of lane g: value sub-spaces [g*VU, g*VU + VU) of a row.
  const int vword_off = (g * VU) & ~3, vbyte0 = (g * VU) & 3;

  auto load_vcodes = [&](int gi, uint32_t (&vw)[2][4]) {
    const int tok0 = tok_begin + gi * 32;
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int vt = tok0 + 16 * ks + 2 * t + (s & 1) + (s >> 1) * 8;
        vw[ks][s] = vt < tok_end ? __ldg(reinterpret_cast<const uint32_t*>(vbase + int64_t(vt) * vcb + vword_off)) : 0u;
      }
  };
  // v4 loads key and value codes one group ahead; v5 only the key codes (kv_ahead = false).
  auto load_codes = [&](int gi, uint32_t (&kw)[NW4], uint32_t (&vw)[2][4], bool kv_ahead) {
    const int tok0 = tok_begin + gi * 32;
    const int tok = tok0 + lane;
    if (tok < tok_end) {
      const uint4* src = reinterpret_cast<const uint4*>(kbase + int64_t(tok) * kcb);
#pragma unroll
      for (int j = 0; j < NW4 / 4; ++j) {
        const uint4 x = __ldg(src + j);
        kw[4 * j] = x.x, kw[4 * j + 1] = x.y, kw[4 * j + 2] = x.z, kw[4 * j + 3] = x.w;
      }
    } else {
#pragma unroll
      for (int j = 0; j < NW4; ++j) kw[j] = 0u;
    }
    if (kv_ahead) load_vcodes(gi, vw);
  };

  float m_run[kH], l_run[kH];
#pragma unroll
  for (int h = 0; h < kH; ++h) m_run[h] = -INFINITY, l_run[h] = 0.f;
  float oc[MT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) oc[mt][0] = oc[mt][1] = oc[mt][2] = oc[mt][3] = 0.f;

  uint32_t kw[NW4], vw[2][4];
  if (warp < n_groups) load_codes(warp, kw, vw, !V5);
  for (int gi = warp; gi < n_groups; gi += kNW) {
    uint32_t kwn[NW4], vwn[2][4];
    const bool more = gi + kNW < n_groups;
    if constexpr (V5) load_vcodes(gi, vw);  // consumed after the scores: latency hidden by the lookups
    if (more) load_codes(gi + kNW, kwn, vwn, !V5);

    // ---- scores of token tok0 + lane for the 4 heads ----
    float sc[kH] = {0.f, 0.f, 0.f, 0.f};
    if constexpr (H16) {
      // v4: at step i lane l reads s = (l & 15) ^ i: a half-warp (one LDS.64 wavefront) covers 16
      // distinct s, i.e. 16 distinct bank pairs. Code word of s: kw[(i>>2) ^ ((l>>2)&3)].
      uint32_t kt[NW4], kp[NW4];
#pragma unroll
      for (int j = 0; j < NW4; ++j) kt[j] = swap_pairs ? kw[j ^ 1] : kw[j];
#pragma unroll
      for (int j = 0; j < NW4; ++j) kp[j] = swap_quads ? kt[j ^ 2] : kt[j];
      if constexpr (V5) {
        // byte k of each word := byte (l&3)^k, so that the per-step selectors are immediates (v5 keeps
        // one selector register instead of four)
#pragma unroll
        for (int j = 0; j < NW4; ++j) kp[j] = __byte_perm(kp[j], 0u, bsel);
      }
#pragma unroll
      for (int i = 0; i < NS; i += 2) {
        const uint32_t s0 = V5 ? 0x4404u | uint32_t((i & 3) << 4) : sel[i & 3];
        const uint32_t s1 = V5 ? 0x4404u | uint32_t(((i + 1) & 3) << 4) : sel[(i + 1) & 3];
        const uint32_t o0 = __byte_perm(kp[i >> 2], 0u, s0) | (l8 ^ uint32_t(i << 3));
        const uint32_t o1 = __byte_perm(kp[(i + 1) >> 2], 0u, s1) | (l8 ^ uint32_t((i + 1) << 3));
        const uint2 e0 = *reinterpret_cast<const uint2*>(lutb + o0);
        const uint2 e1 = *reinterpret_cast<const uint2*>(lutb + o1);
        // two terms summed in fp16, then accumulated in fp32
        const float2 f01 = __half22float2(__hadd2(*reinterpret_cast<const __half2*>(&e0.x),
                                                  *reinterpret_cast<const __half2*>(&e1.x)));
        const float2 f23 = __half22float2(__hadd2(*reinterpret_cast<const __half2*>(&e0.y),
                                                  *reinterpret_cast<const __half2*>(&e1.y)));
        sc[0] += f01.x, sc[1] += f01.y, sc[2] += f23.x, sc[3] += f23.y;
      }
    } else {
      uint32_t kp[NW4];
#pragma unroll
      for (int j = 0; j < NW4; j += 2) {
        kp[j] = swap_pairs ? kw[j + 1] : kw[j];
        kp[j + 1] = swap_pairs ? kw[j] : kw[j + 1];
      }
#pragma unroll
      for (int i = 0; i < NS; ++i) {
        const uint32_t c8 = __byte_perm(kp[i >> 2], 0u, sel[i & 3]);  // code << 8
        const uint32_t off = c8 | (l16 ^ uint32_t((i & 15) << 4));
        const float4 e = *reinterpret_cast<const float4*>(lutb + (i >> 4) * 65536 + off);
        sc[0] += e.x, sc[1] += e.y, sc[2] += e.z, sc[3] += e.w;
      }
    }
    const int tok0 = tok_begin + gi * 32;
    if (tok0 + lane >= tok_end) sc[0] = sc[1] = sc[2] = sc[3] = -INFINITY;

    // ---- online softmax (base 2); rescale only when a running max grows (warp-uniform) ----
    // v4 (H16): the reference max may lag the true one by up to kSlack (P <= 2^kSlack, safe in fp16
    // and in the fp32 sums): one vote replaces the 4 warp-max reductions unless some score
    // exceeds m_run + kSlack; then the exact max is taken. The partial state stays exact.
    bool need = true;
    if constexpr (H16) {
      constexpr float kSlack = 8.f;
      bool over = false;
#pragma unroll
      for (int h = 0; h < kH; ++h) over |= sc[h] > m_run[h] + kSlack;
      need = __any_sync(0xffffffffu, over);
    }
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
        alpha[h] = exp2f(m_run[h] - m_new);  // -inf -> 0
        l_run[h] *= alpha[h];
        m_run[h] = m_new;
      }
      // lane (g, t) holds heads 2t, 2t+1 in oc columns 0/2 and 1/3 (t >= 2: padding heads)
      const float a0 = t == 0 ? alpha[0] : alpha[2], a1 = t == 0 ? alpha[1] : alpha[3];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) oc[mt][0] *= a0, oc[mt][2] *= a0, oc[mt][1] *= a1, oc[mt][3] *= a1;
    }
#pragma unroll
    for (int h = 0; h < kH; ++h) {
      const float pr = exp2f(sc[h] - m_run[h]);
      l_run[h] += pr;
      ps[h * kPRow + lane] = __float2half_rn(pr);
    }
    __syncwarp();

    // ---- values: two k-steps of 16 tokens ----
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      const uint32_t pb0 = *reinterpret_cast<const uint32_t*>(ps + g * kPRow + 16 * ks + 2 * t);
      const uint32_t pb1 = *reinterpret_cast<const uint32_t*>(ps + g * kPRow + 16 * ks + 2 * t + 8);
      if constexpr (V5) {
        // gathers of one value sub-space (8 registers) right before its two mma
#pragma unroll
        for (int u = 0; u < VU; ++u) {
          uint2 xu[4];
#pragma unroll
          for (int s = 0; s < 4; ++s) xu[s] = vsl[((vw[ks][s] >> (8 * (vbyte0 + u))) & 0xffu) * 16 + (lane & 15)];
          mma16816(oc[2 * u], __byte_perm(xu[0].x, xu[1].x, 0x5410), __byte_perm(xu[0].x, xu[1].x, 0x7632),
                   __byte_perm(xu[2].x, xu[3].x, 0x5410), __byte_perm(xu[2].x, xu[3].x, 0x7632), pb0, pb1);
          mma16816(oc[2 * u + 1], __byte_perm(xu[0].y, xu[1].y, 0x5410), __byte_perm(xu[0].y, xu[1].y, 0x7632),
                   __byte_perm(xu[2].y, xu[3].y, 0x5410), __byte_perm(xu[2].y, xu[3].y, 0x7632), pb0, pb1);
        }
        continue;
      }
      uint2 xv[4][VU];
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int u = 0; u < VU; ++u) {
          const uint32_t c = (vw[ks][s] >> (8 * (vbyte0 + u))) & 0xffu;
          xv[s][u] = vsl[c * 16 + (lane & 15)];
        }
#pragma unroll
      for (int u = 0; u < VU; ++u) {
        mma16816(oc[2 * u], __byte_perm(xv[0][u].x, xv[1][u].x, 0x5410), __byte_perm(xv[0][u].x, xv[1][u].x, 0x7632),
                 __byte_perm(xv[2][u].x, xv[3][u].x, 0x5410), __byte_perm(xv[2][u].x, xv[3][u].x, 0x7632), pb0, pb1);
        mma16816(oc[2 * u + 1], __byte_perm(xv[0][u].y, xv[1][u].y, 0x5410),
                 __byte_perm(xv[0][u].y, xv[1][u].y, 0x7632), __byte_perm(xv[2][u].y, xv[3][u].y, 0x5410),
                 __byte_perm(xv[2][u].y, xv[3][u].y, 0x7632), pb0, pb1);
      }
    }
    __syncwarp();  // the P tile is rewritten next iteration

    if (more) {
#pragma unroll
      for (int j = 0; j < NW4; ++j) kw[j] = kwn[j];
      if constexpr (!V5) {
#pragma unroll
        for (int ks = 0; ks < 2; ++ks)
#pragma unroll
          for (int s = 0; s < 4; ++s) vw[ks][s] = vwn[ks][s];
      }
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
  float* wm = reinterpret_cast<float*>(smem);  // [kNW][4]
  float* wl = wm + kNW * kH;                   // [kNW][4]
  float* wo = wl + kNW * kH;                   // [kNW][4][D]
  if (lane < kH) {
    float mv = m_run[0], lv = l_run[0];
#pragma unroll
    for (int h = 1; h < kH; ++h)
      if (lane == h) mv = m_run[h], lv = l_run[h];
    wm[warp * kH + lane] = mv;  // -inf when the warp had no tokens
    wl[warp * kH + lane] = lv;
  }
  if (t < 2) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int dim_lo = g * (D / 8) + 2 * mt;  // row g -> +0, row g+8 -> +1
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        wo[(warp * kH + 2 * t + j) * D + dim_lo] = oc[mt][j];
        wo[(warp * kH + 2 * t + j) * D + dim_lo + 1] = oc[mt][2 + j];
      }
    }
  }
  __syncthreads();
  float* out = p.part + ((((int64_t(b) * p.n_kv_heads + kh) * p.head_tiles8 + (ht4 >> 1)) * p.n_splits + split) *
                         (2 * 8 + 8 * D));
  const int slot0 = (ht4 & 1) * kH;
  for (int i = threadIdx.x; i < kH * D + 2 * kH; i += kThreads) {
    const int hh = i < kH * D ? i / D : (i - kH * D) % kH;
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kNW; ++w) M = fmaxf(M, wm[w * kH + hh]);
    float acc = 0.f;
    if (i < kH * D) {
      const int dim = i % D;
#pragma unroll
      for (int w = 0; w < kNW; ++w) {
        const float mw = wm[w * kH + hh];
        if (mw != -INFINITY) acc += exp2f(mw - M) * wo[(w * kH + hh) * D + dim];
      }
      out[2 * 8 + (slot0 + hh) * D + dim] = acc;
    } else if (i < kH * D + kH) {
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

template <int NS, int D, bool H16, int NWT>
void launch(const LutParams& lp, dim3 grid, size_t smem, cudaStream_t st) {
  static bool attr_set = false;  // one size per instantiation: set once
  if (!attr_set) {
    VQ_CUDA_CHECK(cudaFuncSetAttribute(lut_split_kernel<NS, D, H16, NWT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       int(smem)));
    attr_set = true;
  }
  lut_split_kernel<NS, D, H16, NWT><<<grid, 32 * NWT, smem, st>>>(lp);
  VQ_CUDA_LAUNCHED("lut_split_kernel");
}

template <bool H16, int NWT>
void launch_any(const LutParams& lp, int ns, int D, dim3 grid, size_t smem, cudaStream_t st) {
  if (D == 128)
    ns == 32 ? launch<32, 128, H16, NWT>(lp, grid, smem, st) : launch<16, 128, H16, NWT>(lp, grid, smem, st);
  else ns == 32 ? launch<32, 64, H16, NWT>(lp, grid, smem, st) : launch<16, 64, H16, NWT>(lp, grid, smem, st);
}

size_t lut_kernel_smem(const PQAttnBatchArgs& a, bool h16, int warps) {
  const int ns = a.head_dim / a.k_sub_dim;
  const size_t lut = h16 ? size_t(256) * 256 : size_t(ns) * 256 * 16;
  return lut + 256 * 16 * 8 + size_t(kH) * a.head_dim * 4 + size_t(warps) * 8 * kPRow * 2;
}

void launch_lut_split(const PQAttnBatchArgs& a, bool h16, int warps, int head_tiles8, int chunk, int n_splits, float* part,
                      cudaStream_t st) {
  LutParams lp{};
  lp.n_kv_heads = a.n_kv_heads;
  lp.group = a.group;
  lp.head_tiles8 = head_tiles8;
  lp.n_q_heads = a.n_kv_heads * a.group;
  lp.kd = a.k_sub_dim;
  lp.kbooks = a.k_per_subspace ? a.head_dim / a.k_sub_dim : 1;
  lp.kcb = int(code_row_bytes(a.head_dim / a.k_sub_dim, 8));
  lp.vcb = int(code_row_bytes(a.head_dim / 4, 8));
  lp.q = a.q_code;
  lp.k_codes = a.k_codes;
  lp.v_codes = a.v_codes;
  lp.n_coded = a.n_coded;
  lp.code_head_stride = a.code_head_stride;
  lp.k_book = reinterpret_cast<const __half*>(a.k_book);
  lp.v_book = reinterpret_cast<const __half*>(a.v_book);
  lp.chunk = chunk;
  lp.n_splits = n_splits;
  lp.part = part;
  const int tiles4 = (a.group + kH - 1) / kH;
  const dim3 grid(unsigned(n_splits), unsigned(a.n_kv_heads * tiles4), unsigned(a.rows));
  const size_t smem = lut_kernel_smem(a, h16, warps);
  const int ns = a.head_dim / a.k_sub_dim;
  VQ_CHECK(warps == kLutWarps || (h16 && warps == kLut5Warps), "launch_lut_split: warps = {} (h16 {})", warps, h16);
  if (warps == kLut5Warps) launch_any<true, kLut5Warps>(lp, ns, a.head_dim, grid, smem, st);
  else if (h16) launch_any<true, kLutWarps>(lp, ns, a.head_dim, grid, smem, st);
  else launch_any<false, kLutWarps>(lp, ns, a.head_dim, grid, smem, st);
}
}  // namespace

void launch_v3b(const PQAttnBatchArgs& a, int head_tiles8, int chunk, int n_splits, float* part, cudaStream_t st) {
  launch_lut_split(a, false, kLutWarps, head_tiles8, chunk, n_splits, part, st);
}
void launch_v5(const PQAttnBatchArgs& a, int head_tiles8, int chunk, int n_splits, float* part, cudaStream_t st) {
  launch_lut_split(a, true, kLut5Warps, head_tiles8, chunk, n_splits, part, st);
}

}  // namespace vq::cuda::bench_variants
