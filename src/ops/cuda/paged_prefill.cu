// Prefill attention over the KV pool's blocks on tensor cores (paged_attention_cuda.h, tiles):
// a block of W warps takes one tile of consecutive query positions of one sequence and one KV
// head: its 16*W rows are (position, query head of the group) pairs, 16 per warp. It walks the
// sequence's key blocks once as a list of passes (NB pool blocks of 32 tokens, one form), so each
// block's K/V is read once per tile, not once per query row as in the decode kernels:
//   dense pass: fp16 K (channel-major [D][32]) and V ([32][D]) copied by cp.async into shared
//               memory;
//   scalar pass (an all-dense layer of scalar blocks, PagedRule::elem): the blocks' raw rows (K
//               then V) copied by cp.async, then dequantized in shared memory into token-major
//               K and V tiles (scalar_blocks.cuh), scored with the plain queries;
//   coded pass: the blocks' code rows (K then V) copied by cp.async, then decoded in shared
//               memory into a token-major K tile [KN][D] and the V tile (centroids from the fp16
//               books, staged in shared memory when they are small); keys there are in the
//               transformed space, so those passes are scored with the transformed queries q~
//               (both query tiles live in shared memory).
// Two stages: the copy of pass i+1 runs while pass i is multiplied. Two forms of the products
// (template flag WG), the same walk, masks, online softmax (base 2) and output:
//   WG (Hopper, sm_90a build): each warpgroup of 4 warps takes 64 rows; S = Q K^T by wgmma
//     m64nKNk16 with Q and K read from shared memory through descriptors (wgmma_ptx.cuh; keys
//     MN-major for dense passes, K-major for decoded ones), O += P V by wgmma m64nDk16 with P
//     in registers; shared tiles in the no-swizzle core-matrix layout (cm_off). Default W = 8
//     (two warpgroups, 128 rows) and KN = 128 keys per pass where they fit.
//   mma.sync (other GPUs, VQ_PREFILL_WGMMA=0): mma.m16n8k16 with ldmatrix(.trans) fragments from
//     padded row-major tiles; W = 8 for coded layers (a decoded tile serves 128 rows), else 4.
// Few tiles (a small chunk beside decode rows, few KV heads): the keys are split over blockIdx.z
// (prefill_key_splits), each split writes per-row partials and prefill_merge_kernel combines
// them, so the grid fills the GPU. Which form of a block a row reads follows the window rule per
// row (paged_ranges): a block a row reads as codes is masked in its dense pass and vice versa.
// Passes shrink (VQ_PREFILL_KEYS, or the dispatcher) where two stages do not fit in shared
// memory (D=256 with coded layers). Variants and their times: docs/CUDA_NOTES.md section 6.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cmath>

#include "core/env.h"
#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/smem_attr.cuh"
#include "ops/cuda/mma_ptx.cuh"
#include "ops/cuda/paged_attention_cuda.h"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_lut.cuh"
#include "ops/cuda/scalar_blocks.cuh"
#include "ops/cuda/wgmma_ptx.cuh"

namespace vq::cuda::detail {
namespace {

constexpr int kB = 32;     // tokens of one block of the pool (block_tokens == 32); a pass takes NB blocks
constexpr int kKPad = 8;   // halves of padding per shared-memory row (conflict-free ldmatrix)
constexpr int kBookSmemMax = 8192;  // bytes per side: books up to this size are staged in shared memory
constexpr float kLog2e = 1.4426950408889634f;

// A warp's score accumulators (16 rows x NS groups of 8 keys, the mma C layout; g = lane / 4) at
// the start of a pass: the rotated key mean's terms staged with a coded pass (kbs: rows of 2 NB
// segments of 16 tokens, so column groups 2k and 2k + 1 share segment k; keys outside a row's code
// range got 0 and are masked later), in log2 units; zeros where kbs is null. The products add to them.
template <int NS, int NB>
__device__ __forceinline__ void init_scores(float (&s)[NS][4], const float* kbs, int row0) {
  const int g = (threadIdx.x & 31) >> 2;
  if (kbs) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float* row = kbs + (row0 + g + 8 * h) * (2 * NB);
#pragma unroll
      for (int k = 0; k < NS / 2; ++k) {
        const float v = row[k] * kLog2e;
        s[2 * k][2 * h] = s[2 * k][2 * h + 1] = s[2 * k + 1][2 * h] = s[2 * k + 1][2 * h + 1] = v;
      }
    }
  } else {
#pragma unroll
    for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
  }
}

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
  int kd, kbits, kbooks, kcb;  // coded keys: sub_dim, bits, books per head, packed row bytes (scalar blocks: kcb, vcb)
  int vd, vbits, vbooks, vcb;
  const __half* k_book;  // [n_kv_heads, kbooks, 2^kbits, kd]
  const __half* v_book;
  bool books_smem;       // both sides' books of one head staged in shared memory
  int kbook_halves, vbook_halves;  // per head
  int raw_bytes;         // per stage: K code rows (padded to 16) + V code rows + 16
  const PagedPrefillTile* tiles;
  // Split over the keys (prefill_key_splits): block z of a (tile, KV head) walks passes
  // [j0 + z*per, j0 + (z+1)*per) and, with ksplits > 1, writes a partial (base-2 max, sum,
  // unnormalised o) per row to part instead of the output; prefill_merge_kernel combines them.
  int ksplits;
  float* part;  // [n_tiles][n_kv_heads][ksplits][rows of a tile][2 + D]
  ElemType out_type;
  void* out;
  int64_t out_stride;
  PagedKeyBias kbias;  // coded passes: the rotated key mean's score terms (values null: none)
  // Coded passes copied from the step's decoded past (PrefillScratch: slot slot0[table] + block,
  // prefill_scratch_halves(D) per KV head, K then V token-major) instead of decoded here; null: decode.
  const __half* scr;
  const int64_t* scr_slot0;
  const uint8_t* dense_base;  // PagedAttnParams::dense_base (the warp-specialised form's tensor maps)
};

using namespace ptx;  // smem_u32, cp_async*, ldsm_x4(_t), mma16816, pack_half2 (mma_ptx.cuh)

// 4 bytes global -> shared, asynchronously; valid == false reads nothing and writes 0.
__device__ __forceinline__ void cp_async4_zfill(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
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

// Decode `rows` packed code rows (row_bytes apart, in shared memory) into fp16 rows: the
// centroid of code (k, s) goes to dst[off(k, s*sd + 4x)] in pieces of four halves (`off` maps
// (row, channel) to a half offset; four consecutive channels from a multiple of 4 must stay
// contiguous). 8-bit codes: four per 32-bit load.
// Sub-space s's centroid of code c in a book of 2^bits centroids of sd halves (one book per
// sub-space when per_sub), as sd / 4 pieces of 8 bytes.
__device__ __forceinline__ const uint2* centroid_pieces(const __half* book, bool per_sub, int s, int bits, uint32_t c,
                                                        int sd) {
  return reinterpret_cast<const uint2*>(book + (((per_sub ? s : 0) << bits) + int(c)) * sd);  // < 2^31: books are small
}
// 8-bit codes whose rows can be read four at a time (32-bit loads of four sub-spaces' codes).
__device__ __forceinline__ bool codes_by_word(int bits, int nsub, int row_bytes) {
  return bits == 8 && (nsub & 3) == 0 && (row_bytes & 3) == 0;
}
template <class Off>
__device__ __forceinline__ void decode_rows(int rows, const unsigned char* raw, int row_bytes, int bits, int sd,
                                            int nsub, bool per_sub, const __half* book, __half* dst, Off off, int tid,
                                            int nth) {
  const int q4 = sd / 4;  // 8-byte pieces per centroid
  if (codes_by_word(bits, nsub, row_bytes)) {
    const int n4 = nsub / 4;
    for (int i = tid; i < rows * n4; i += nth) {
      const int k = i / n4, s0 = (i % n4) * 4;
      const uint32_t w = *reinterpret_cast<const uint32_t*>(raw + k * row_bytes + s0);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t c = (w >> (8 * e)) & 0xffu;
        const uint2* cen = centroid_pieces(book, per_sub, s0 + e, 8, c, sd);
        for (int x = 0; x < q4; ++x) *reinterpret_cast<uint2*>(dst + off(k, (s0 + e) * sd + 4 * x)) = cen[x];
      }
    }
    return;
  }
  for (int i = tid; i < rows * nsub; i += nth) {
    const int k = i / nsub, s = i % nsub;
    const uint32_t c = code_of(raw + k * row_bytes, s, bits);
    const uint2* cen = centroid_pieces(book, per_sub, s, bits, c, sd);
    for (int x = 0; x < q4; ++x) *reinterpret_cast<uint2*>(dst + off(k, s * sd + 4 * x)) = cen[x];
  }
}

// Offset in halves of element (r, c) of an fp16 matrix of `cols` columns in the no-swizzle core-
// matrix layout wgmma reads (wgmma_ptx.cuh): 8x8 core matrices of 128 contiguous bytes, the core
// matrices of a group of 8 rows side by side, row groups cols * 8 halves apart.
__device__ __forceinline__ int cm_off(int r, int c, int cols) {
  return (r >> 3) * (cols * 8) + (c >> 3) * 64 + (r & 7) * 8 + (c & 7);
}

// The step's decoded past (PrefillParams::scr) of block table `tab` and KV head kh: block b at
// scratch_blocks(...) + b * scratch_stride(...), K then V token-major; null without a scratch.
__device__ __forceinline__ int64_t scratch_stride(const PrefillParams& p) {
  return int64_t(p.n_kv_heads) * prefill_scratch_halves(p.D);
}
__device__ __forceinline__ const __half* scratch_blocks(const PrefillParams& p, int tab, int kh) {
  return p.scr ? p.scr + p.scr_slot0[tab] * scratch_stride(p) + kh * prefill_scratch_halves(p.D) : nullptr;
}

// Scalar passes: the KN raw K rows at raw and V rows at vraw (row_bytes each, token-major) into
// fp16 tiles, 8 channels per item at k(n, d) / v(n, d) (8 consecutive channels from a multiple of
// 8 are contiguous in both layouts); live(n) false: the value row is zeros (no row reads the
// token, and its slot may hold anything).
template <PagedElem E, class KOff, class VOff, class Live>
__device__ __forceinline__ void dequant_pass(int kn, int D, const unsigned char* raw, const unsigned char* vraw,
                                             int row_bytes, __half* ks, __half* vs, KOff k, VOff v, Live live, int tid,
                                             int nth) {
  constexpr int QB = scalar_block_bytes(E);
  const int nch = D / 8;
  for (int i = tid; i < kn * nch; i += nth) {
    const int n = i / nch, ch = i % nch;
    uint4 w;
    dequantize8_h2<E>(raw + n * row_bytes + (ch >> 2) * QB, ch & 3, w);
    *reinterpret_cast<uint4*>(ks + k(n, 8 * ch)) = w;
    dequantize8_h2<E>(vraw + n * row_bytes + (ch >> 2) * QB, ch & 3, w);
    if (!live(n)) w = make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(vs + v(n, 8 * ch)) = w;
  }
}

// Layout of one tile's shared memory (halves unless said): qp [R][D] | qc [R][D] (coded layers) |
// 2 stages of { K | V [KN][D] | raw code bytes } | books, KN = 32*NB keys per pass. K is [D][KN]
// for dense passes (channel-major, as the pool holds it) and [KN][D] for decoded ones. WG = false
// (mma.sync): row-major with 8 halves of padding per row (conflict-free ldmatrix); WG = true
// (wgmma): the core-matrix layout of cm_off, no padding.
template <int D, int NB, bool WG>
struct PrefillSmem {
  static constexpr int KN = kB * NB;
  static constexpr int P = WG ? 0 : kKPad;
  static constexpr int QLD = D + P, KLD = KN + P, KLDC = D + P, VLD = D + P;
  static constexpr int KH = (D * KLD > KN * KLDC) ? D * KLD : KN * KLDC;  // halves of a K stage
  static constexpr int VH = KN * VLD;
  // Element offsets (halves): query row m, channel d; dense key n, channel d; decoded key n; value k.
  static __device__ __forceinline__ int q(int m, int d) { return WG ? cm_off(m, d, D) : m * QLD + d; }
  static __device__ __forceinline__ int kd(int d, int n) { return WG ? cm_off(d, n, KN) : d * KLD + n; }
  static __device__ __forceinline__ int kc(int n, int d) { return WG ? cm_off(n, d, D) : n * KLDC + d; }
  static __device__ __forceinline__ int v(int k, int d) { return WG ? cm_off(k, d, D) : k * VLD + d; }
};

// Bytes of a stage's code-row area with NB blocks per pass: K rows (padded to 16), V rows, 16 spare
// (code_of may read a byte or two past a row), then with the rotated key mean the pass's score terms
// [128 rows][2 NB segments of 16 tokens] f32 (prefill_kbias_offset).
__host__ __device__ inline int prefill_kbias_offset(const PrefillParams& pp, int NB) {
  return ((kB * NB * pp.kcb + 15) & ~15) + ((kB * NB * pp.vcb + 15) & ~15) + 16;
}
int prefill_raw_bytes(const PrefillParams& pp, int NB) {
  if (!pp.rule.coded && pp.rule.elem == PagedElem::f16) return 0;
  return prefill_kbias_offset(pp, NB) + (pp.kbias.values ? 128 * 2 * NB * 4 : 0);
}

// Dynamic shared memory of prefill_kernel<D, W, NB, WG> (the layout above).
template <int D, int W, int NB, bool WG>
size_t prefill_smem_bytes(const PrefillParams& pp) {
  using L = PrefillSmem<D, NB, WG>;
  const bool coded = pp.rule.coded;
  size_t b = size_t(16 * W) * L::QLD * (coded ? 2 : 1) * 2;
  // Scalar layers: one fp16 tile (dequantized after the barrier that ends the last pass's products)
  // and two raw stages; the others: two stages of { fp16 tiles | raw }.
  if (pp.rule.elem != PagedElem::f16) b += size_t(L::KH + L::VH) * 2 + 2 * size_t(prefill_raw_bytes(pp, NB));
  else b += 2 * (size_t(L::KH + L::VH) * 2 + size_t(prefill_raw_bytes(pp, NB)));
  if (coded && pp.books_smem) b += size_t(pp.kbook_halves + pp.vbook_halves) * 2;
  return b;
}

// The passes of a tile: (block j, form) in order, form 0 dense then 1 coded, only those some row
// of the tile reads (hulls over the rows: ce grows with the position, so the first row has the
// earliest sink / code / window starts and the last row the latest code end).
struct PassWalk {
  // The rule by pool block (kB tokens; positions fit in 31 bits): block b is read in form 1 when
  // b is in [cb_lo, cb_hi), in form 0 when in [sb_lo, sb_hi) (sinks) or >= wb_lo (window), and
  // never past bl_last (the block of the tile's last position). Set by make(); closed forms, so a
  // pass's test is a few integer compares (the consumers run it once per pass).
  bool coded;
  int bl_last, sb_lo, sb_hi, cb_lo, cb_hi, wb_lo;
  int kn;       // keys per pass (a multiple of kB)
  int64_t j_end;  // passes at or past it belong to the next key split
  // sink [sink_lo, sink_hi), codes [code_lo, code_hi) and window from win_lo, in tokens: block b
  // (tokens [b kB, b kB + kB)) is needed when it overlaps a range, so the block bounds are the
  // floor of each start and the ceiling of each end.
  __device__ __forceinline__ static PassWalk make(bool coded, int64_t sink_lo, int64_t sink_hi, int64_t code_lo,
                                                  int64_t code_hi, int64_t win_lo, int t_last, int kn) {
    PassWalk w;
    w.coded = coded, w.kn = kn, w.j_end = 0;
    w.bl_last = t_last / kB;
    w.sb_lo = int(sink_lo / kB), w.sb_hi = int((sink_hi + kB - 1) / kB);
    w.cb_lo = int(code_lo / kB), w.cb_hi = int((code_hi + kB - 1) / kB);
    w.wb_lo = int(win_lo / kB);
    return w;
  }
  // Does some row read pool block b (32 tokens) in this form?
  __device__ __forceinline__ bool block_needed(int64_t b64, int form) const {
    const int b = int(b64);
    if (b > bl_last) return false;
    if (form == 1) return coded && b >= cb_lo && b < cb_hi;
    return (coded && b >= sb_lo && b < sb_hi) || b >= wb_lo;
  }
  __device__ __forceinline__ bool needed(int j, int form) const {  // pass j: blocks [j kn / kB, (j + 1) kn / kB)
    const int b0 = j * (kn / kB), b1 = min(b0 + kn / kB, bl_last + 1);
    if (form == 1) return coded && max(b0, cb_lo) < min(b1, cb_hi);
    return (coded && max(b0, sb_lo) < min(b1, sb_hi)) || max(b0, wb_lo) < b1;
  }
  // The first needed pass at or after (j, form); j = -1 when none is left.
  __device__ __forceinline__ void seek(int64_t& j64, int& form) const {
    const int jl = min(int(j_end), bl_last / (kn / kB) + 1);  // j kn <= t_last  <=>  j kn / kB <= bl_last
    for (int j = int(j64); j < jl; form = 0, ++j)
      for (; form < 2; ++form)
        if (needed(j, form)) {
          j64 = j;
          return;
        }
    j64 = -1;
  }
};

// Masks S (row h of this thread reads key u0 + column in this form; nothing to do for a row that
// reads the whole pass), then the online softmax in base 2 of rows g and g + 8: S becomes P, the
// running max/sum advance and alpha is the factor the accumulated output rows must take.
template <int NS>
__device__ __forceinline__ void mask_softmax(float (&s)[NS][4], int form, int64_t u0, const PagedRanges (&rg)[2],
                                             const int (&rpos)[2], const bool (&rvalid)[2], int t, float (&m_run)[2],
                                             float (&l_run)[2], float (&alpha)[2]) {
  constexpr int KN = NS * 8;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const PagedRanges& rr = rg[h];
    const int r = rpos[h], base = int(u0), u1 = base + KN;  // positions fit in 31 bits (kv_store_device.cpp)
    const int clo = int(rr.code_lo), chi = int(rr.code_hi), slo = int(rr.sink_lo), shi = int(rr.sink_hi);
    const int wlo = int(rr.win_lo), whi = int(rr.win_hi);
    const bool full = rvalid[h] && u1 - 1 <= r &&
                      (form ? base >= clo && u1 <= chi : (base >= slo && u1 <= shi) || (base >= wlo && u1 <= whi));
    if (full) continue;
#pragma unroll
    for (int n = 0; n < NS; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int u = base + n * 8 + 2 * t + c;
        bool vis = rvalid[h] && u <= r;
        if (form) vis = vis && u >= clo && u < chi;
        else vis = vis && ((u >= slo && u < shi) || (u >= wlo && u < whi));
        if (!vis) s[n][2 * h + c] = -INFINITY;
      }
  }
  online_softmax_step<NS>(s, m_run, l_run, alpha);
}

// Normalises this thread's two rows (w16 + g, + 8) and writes them to the output, or with key splits
// the split's partials (base-2 max, sum, unnormalised o) for prefill_merge_kernel.
template <int D, int ROWS>
__device__ __forceinline__ void write_rows(const PrefillParams& p, const PagedPrefillTile& tile, int kh, int w16,
                                           int g, int t, float (&o)[D / 8][4], const float (&m_run)[2],
                                           float (&l_run)[2], const bool (&rvalid)[2]) {
  constexpr int NT = D / 8;
  const int G = p.group;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float l = l_run[h];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    l_run[h] = p.ksplits > 1 ? l : l > 0.f ? 1.0f / l : 0.f;
  }
  if (p.ksplits > 1) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = w16 + g + 8 * h;
      float* rec = p.part + (((int64_t(blockIdx.x) * p.n_kv_heads + kh) * p.ksplits + blockIdx.z) * ROWS + m) * (2 + D);
      if (t == 0) rec[0] = m_run[h], rec[1] = l_run[h];  // m: -inf where this split saw no key of the row
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const int d = n * 8 + 2 * t;
        rec[2 + d] = o[n][2 * h], rec[3 + d] = o[n][2 * h + 1];
      }
    }
    return;
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    if (!rvalid[h]) continue;
    const int m = w16 + g + 8 * h, pi = m / G, hg = m % G;
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

#if defined(VQ_HAVE_WGMMA)
// S = Q K^T of one warpgroup's 64 rows: D/16 k-steps of m64nKNk16 from shared memory, Q K-major
// (core-matrix rows of D channels, at shared address qa), K at ka: TB = 1 for keys stored
// channel-major [D][KN] (B MN-major: a k-step is two row groups of KN*16 bytes), TB = 0 for
// token-major [KN][D] (K-major: a k-step is two core matrices). Waits for the result.
template <int D, int KN, int TB>
__device__ __forceinline__ void wg_scores(float (&sf)[KN / 2], uint32_t qa, uint32_t ka) {
  constexpr uint32_t kstep = TB ? 2 * KN * 16 : 256, lbo = TB ? KN * 16 : 128, sbo = TB ? 128 : D * 16;
  wg::fence_regs(sf);
  wg::fence();
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint64_t da = wg::desc(qa + kk * 256, 128, D * 16), db = wg::desc(ka + kk * kstep, lbo, sbo);
    if constexpr (KN == 128) wg::mma_ss_m64n128<TB>(sf, da, db, 1);
    else if constexpr (KN == 64) wg::mma_ss_m64n64<TB>(sf, da, db, 1);
    else wg::mma_ss_m64n32<TB>(sf, da, db, 1);
  }
  wg::commit();
  wg::wait<0>();
  wg::fence_regs(sf);
}
#endif

// Query rows m0 .. m0 + kRows - 1 of a tile into shared memory (layout L), fp16, scaled for the
// base-2 softmax: row m is (position m / G, head m % G), rows of positions n_valid and on zero.
// Each of kThreads threads (index ti) takes elements ti, ti + kThreads, ... (a warp's 32 loads
// are consecutive floats), and issues its global loads kBatch at a time before it converts and
// stores any of them: one load then one store per element made a chain of D / 2 dependent
// round trips to memory per thread (batched, the 512 x 32K chunk is 3-8% faster, most where the
// key splits make blocks short: docs/BENCHMARKS.md "the query rows loaded in batches"). The same
// float operations on each element as before (load, multiply by the scale, round to fp16).
template <class L, int D, int kRows, int kThreads>
__device__ __forceinline__ void load_queries(const PrefillParams& p, int64_t row0, int kh, int G, int n_valid,
                                             bool coded, int m0, int ti, __half* qp, __half* qc) {
  static_assert(kRows * D % kThreads == 0, "whole elements per thread");
  constexpr int kPer = kRows * D / kThreads, kBatch = kPer < 16 ? kPer : 16;
  static_assert(kPer % kBatch == 0, "whole batches");
  for (int b0 = 0; b0 < kPer; b0 += kBatch) {
    float vp[kBatch], vc[kBatch];
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = ti + kThreads * (b0 + k), m = m0 + i / D, d = i % D, pi = m / G, hg = m % G;
      vp[k] = vc[k] = 0.f;
      if (pi < n_valid) {
        const int64_t r = row0 + pi;
        vp[k] = p.q[r * p.q_stride + (int64_t(kh) * G + hg) * D + d];
        if (coded) vc[k] = p.q_code[(r * p.n_q_heads + int64_t(kh) * G + hg) * D + d];
      }
    }
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
      const int i = ti + kThreads * (b0 + k), m = m0 + i / D, d = i % D;
      qp[L::q(m, d)] = __float2half_rn(vp[k] * p.qscale);
      if (coded) qc[L::q(m, d)] = __float2half_rn(vc[k] * kLog2e);
    }
  }
}

template <int D, int W, int NB, bool WG>
__global__ void __launch_bounds__(32 * W, W == 4 ? 2 : 1) prefill_kernel(PrefillParams p) {
#if !defined(VQ_HAVE_WGMMA)
  if constexpr (WG) {  // not built for this device: the dispatcher never launches it (prefill_wgmma)
    __trap();
  } else
#endif
  {
  extern __shared__ __align__(128) unsigned char smem[];
  using L = PrefillSmem<D, NB, WG>;
  constexpr int ROWS = 16 * W, NT = D / 8, NTH = 32 * W, KN = L::KN, NS = KN / 8;
  constexpr int QLD = L::QLD, KLD = L::KLD, KLDC = L::KLDC, VLD = L::VLD;
  const bool coded_layer = p.rule.coded;
  const bool quant = p.rule.elem != PagedElem::f16;  // scalar blocks: dense passes read raw rows
  __half* qp = reinterpret_cast<__half*>(smem);
  __half* qc = qp + ROWS * QLD;
  unsigned char* stage0 = reinterpret_cast<unsigned char*>(qc + (coded_layer ? ROWS * QLD : 0));
  // Stages (prefill_smem_bytes): two of { K | V fp16 tiles | raw code rows }, or for a scalar layer
  // one fp16 tile pair and two raw stages (its passes are dequantized into the tile after the
  // barrier that ends the previous pass's products, so the tile needs no second copy).
  const int tile_bytes = (L::KH + L::VH) * 2;
  const int stage_bytes = tile_bytes + (coded_layer || quant ? p.raw_bytes : 0);
  __half* books = reinterpret_cast<__half*>(stage0 + 2 * stage_bytes);
  auto kst = [&](int s) { return reinterpret_cast<__half*>(stage0 + (quant ? 0 : s * stage_bytes)); };
  auto vst = [&](int s) { return kst(s) + L::KH; };
  auto rawst = [&](int s) { return quant ? stage0 + tile_bytes + s * p.raw_bytes : stage0 + s * stage_bytes + tile_bytes; };

  const PagedPrefillTile tile = p.tiles[blockIdx.x];
  const int kh = blockIdx.y;
  const int G = p.group, P = ROWS / G;
  const int n_pos = tile.n_pos;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, t = lane & 3;
  const int tab = p.row_table ? p.row_table[tile.row0] : tile.row0;
  const uint8_t* const* dtab = p.dense_tables[tab];
  const uint8_t* const* ctab = coded_layer ? p.coded_tables[tab] : nullptr;
  const int H = p.n_kv_heads;
  const int64_t kbytes = int64_t(H) * kB * p.kcb;
  const int kraw = kB * p.kcb, vraw_off = (KN * p.kcb + 15) & ~15, vraw = kB * p.vcb;  // per block
  const int64_t scr_stride = scratch_stride(p);
  const __half* scr_k = scratch_blocks(p, tab, kh);  // the step's decoded past, if any

  const int t_first = p.pos[tile.row0], t_last = p.pos[tile.row0 + n_pos - 1];
  const PagedRanges gf = paged_ranges(p.rule, t_first), gl = paged_ranges(p.rule, t_last);
  PassWalk walk = PassWalk::make(coded_layer, gf.sink_lo, gf.sink_hi, gf.code_lo, gl.code_hi, gf.win_lo, t_last, KN);
  const int64_t kmin =
      coded_layer ? min(gf.sink_hi > gf.sink_lo ? gf.sink_lo : gf.code_lo, gf.win_lo) : gf.win_lo;
  // This block's passes: the z-th of ksplits equal runs of [kmin / KN, t_last / KN].
  const int64_t j_first = kmin / KN, n_passes = int64_t(t_last) / KN - j_first + 1;
  const int64_t per_split = (n_passes + p.ksplits - 1) / p.ksplits;
  const int64_t j_begin = j_first + int64_t(blockIdx.z) * per_split;
  walk.j_end = min(j_begin + per_split, j_first + n_passes);

  // (segments of 16 tokens: a pass of KN keys spans KN / 16 of them, column groups 2k, 2k + 1 the k-th)
  static_assert(kKeyMeanSegmentLog2 == 4, "the staged terms' layout takes segments of 16 tokens");
  // The rotated key mean's terms: issue() stages a coded pass's KN / 16 segment terms of every row in
  // the stage (kbst), half a row per thread (thread i: row i / 2, segments (i & 1) * NB ..), zeros
  // outside the row's code range; the products start from them.
  const bool kb_on = coded_layer && p.kbias.values != nullptr;
  int64_t kb_base = 0, kb_slo = 0, kb_shi = -1;  // staged row's term of segment s: values[kb_base + s], s in [slo, shi]
  if (kb_on) {
    const int m = threadIdx.x >> 1, pi = m / G;
    if (pi < n_pos && pi < P) {
      const int r = tile.row0 + pi;
      const PagedRanges g = paged_ranges(p.rule, p.pos[r]);
      if (g.code_hi > g.code_lo) {
        kb_base = key_bias_index(p.kbias.row_off[r], p.kbias.row_nseg[r], g.code_lo, kh * G + m % G, 0);
        kb_slo = g.code_lo >> kKeyMeanSegmentLog2, kb_shi = (g.code_hi - 1) >> kKeyMeanSegmentLog2;
      }
    }
  }
  const int kb_off = prefill_kbias_offset(p, NB);
  auto kbst = [&](int s) { return reinterpret_cast<float*>(rawst(s) + kb_off); };

  // Issue the copies of pass (j, form) into stage s (one commit group): its NB pool blocks, each
  // only where some row reads it in this form (others: dense V zeroed, coded rows left as they are,
  // decoding to finite values that the masks drop).
  auto issue = [&](int64_t j, int form, int s) {
    __half* ks = kst(s);
    __half* vs = vst(s);
    unsigned char* raw = rawst(s);
    if (form == 1 && kb_on) {  // this thread's half row of the pass's terms
      float* dst = kbst(s) + (threadIdx.x >> 1) * (2 * NB) + (threadIdx.x & 1) * NB;
      const int64_t sg0 = j * (KN / 16) + (threadIdx.x & 1) * NB;
#pragma unroll
      for (int k = 0; k < NB; ++k) {
        const bool ok = sg0 + k >= kb_slo && sg0 + k <= kb_shi;
        cp_async4_zfill(dst + k, ok ? p.kbias.values + kb_base + sg0 + k : p.kbias.values, ok);
      }
    }
#pragma unroll
    for (int hb = 0; hb < NB; ++hb) {
      const int64_t b = j * NB + hb, u0 = b * kB;
      const bool need = walk.block_needed(b, form);
      if (form == 0 && !quant) {
        if (!need) {
          for (int i = threadIdx.x; i < kB * D / 8; i += NTH) {
            const int k = i / (D / 8), c = i % (D / 8);
            *reinterpret_cast<uint4*>(vs + L::v(hb * kB + k, 8 * c)) = make_uint4(0, 0, 0, 0);
          }
          continue;
        }
        const __half* blk = reinterpret_cast<const __half*>(dtab[b]);
        const __half* kg = blk + size_t(kh) * D * kB;                       // [D][kB]
        const __half* vg = blk + size_t(H) * D * kB + size_t(kh) * kB * D;  // [kB][D]
        for (int i = threadIdx.x; i < D * kB / 8; i += NTH) {
          const int d = i / (kB / 8), c = i % (kB / 8);
          cp_async16(ks + L::kd(d, hb * kB + 8 * c), kg + d * kB + 8 * c);
        }
        // Slots past the last position hold whatever the pool block held before (maybe NaN as
        // fp16): their P is 0, but 0 * NaN is NaN in the product, so their values are zero-filled.
        for (int i = threadIdx.x; i < kB * D / 8; i += NTH) {
          const int k = i / (D / 8), c = i % (D / 8);
          const bool ok = u0 + k <= t_last;
          cp_async16(vs + L::v(hb * kB + k, 8 * c), ok ? vg + k * D + 8 * c : vg, ok);
        }
      } else if (need && form == 1 && scr_k) {  // decoded once for the step: K, V token-major
        const __half* sb = scr_k + b * scr_stride;
        for (int i = threadIdx.x; i < kB * D / 8; i += NTH) {
          const int k = i / (D / 8), c = i % (D / 8);
          cp_async16(ks + L::kc(hb * kB + k, 8 * c), sb + k * D + 8 * c);
          cp_async16(vs + L::v(hb * kB + k, 8 * c), sb + kB * D + k * D + 8 * c);
        }
      } else if (form == 1 && scr_k) {  // no row reads the block: V zeroed (the tile may hold anything)
        for (int i = threadIdx.x; i < kB * D / 8; i += NTH) {
          const int k = i / (D / 8), c = i % (D / 8);
          *reinterpret_cast<uint4*>(vs + L::v(hb * kB + k, 8 * c)) = make_uint4(0, 0, 0, 0);
        }
      } else if (need) {  // code rows, or a scalar layer's raw rows (the same layout: K rows, then V rows)
        const uint8_t* blk = form == 1 ? ctab[b] : dtab[b];
        const uint8_t* kc = blk + int64_t(kh) * kB * p.kcb;
        const uint8_t* vc = blk + kbytes + int64_t(kh) * kB * p.vcb;
        for (int i = threadIdx.x; i < kraw / 16; i += NTH) cp_async16(raw + hb * kraw + 16 * i, kc + 16 * i);
        for (int i = threadIdx.x; i < vraw / 16; i += NTH)
          cp_async16(raw + vraw_off + hb * vraw + 16 * i, vc + 16 * i);
      }
    }
    cp_async_commit();
  };

  int64_t cj = j_begin;
  int cform = 0;
  walk.seek(cj, cform);
  if (cj >= 0) issue(cj, cform, 0);

  // ---- queries: row m = (position m / G, head m % G), fp16, scaled for base-2 softmax ----
  load_queries<L, D, ROWS, NTH>(p, tile.row0, kh, G, min(n_pos, P), coded_layer, 0, threadIdx.x, qp, qc);
  const __half* kbook = nullptr;
  const __half* vbook = nullptr;
  if (coded_layer) {
    kbook = p.k_book + int64_t(kh) * p.kbook_halves;
    vbook = p.v_book + int64_t(kh) * p.vbook_halves;
    if (p.books_smem) {
      for (int i = threadIdx.x; i < p.kbook_halves / 4; i += NTH)
        reinterpret_cast<uint2*>(books)[i] = reinterpret_cast<const uint2*>(kbook)[i];
      for (int i = threadIdx.x; i < p.vbook_halves / 4; i += NTH)
        reinterpret_cast<uint2*>(books + p.kbook_halves)[i] = reinterpret_cast<const uint2*>(vbook)[i];
      kbook = books;
      vbook = books + p.kbook_halves;
    }
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


  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  const int ksub = D / p.kd, vsub = D / p.vd;

  for (int st = 0; cj >= 0; st ^= 1) {
    const int64_t j = cj;
    const int form = cform;
    cp_async_wait<0>();
    if constexpr (WG) wg::fence_proxy_async();  // this thread's copies and stores, visible to wgmma
    __syncthreads();  // pass j's data in stage st; everyone done with stage st ^ 1 (and the queries written)
    __half* ks = kst(st);
    __half* vs = vst(st);
    if (form == 1 && !scr_k) {  // decode the code rows into fp16 tiles: K token-major [KN][D], V [KN][D]
      const unsigned char* raw = rawst(st);
      decode_rows(KN, raw, p.kcb, p.kbits, p.kd, ksub, p.kbooks > 1, kbook, ks,
                  [](int k, int d) { return L::kc(k, d); }, threadIdx.x, NTH);
      decode_rows(KN, raw + vraw_off, p.vcb, p.vbits, p.vd, vsub, p.vbooks > 1, vbook, vs,
                  [](int k, int d) { return L::v(k, d); }, threadIdx.x, NTH);
      if constexpr (WG) wg::fence_proxy_async();
      __syncthreads();
    } else if (quant) {  // dequantize the raw rows: K token-major [KN][D], V [KN][D]
      const unsigned char* raw = rawst(st);
      auto live = [&](int n) {
        const int64_t u = j * KN + n;
        return u <= t_last && walk.block_needed(u / kB, 0);
      };
      auto kof = [](int n, int d) { return L::kc(n, d); };
      auto vof = [](int n, int d) { return L::v(n, d); };
      with_scalar_elem(p.rule.elem, [&](auto tag) {
        dequant_pass<decltype(tag)::value>(KN, D, raw, raw + vraw_off, p.kcb, ks, vs, kof, vof, live, threadIdx.x, NTH);
      });
      if constexpr (WG) wg::fence_proxy_async();
      __syncthreads();
    }
    // The next pass's copies run under this pass's products.
    ++cform;
    if (cform == 2) cform = 0, ++cj;
    walk.seek(cj, cform);
    if (cj >= 0) issue(cj, cform, st ^ 1);

    const int64_t u0 = j * KN;
    // ---- S = Q K^T: 16 rows x KN keys per warp ----
    const __half* qs = form ? qc : qp;
    float s[NS][4];
    init_scores<NS, NB>(s, form == 1 && kb_on ? kbst(st) : nullptr, warp * 16);
    const int mi = lane >> 3, r8 = lane & 7;
#if defined(VQ_HAVE_WGMMA)
    if constexpr (WG) {
      // The warpgroup's 64 rows x KN keys: D/16 k-steps of m64nKNk16, Q and K from shared memory.
      float(&sf)[NS * 4] = reinterpret_cast<float(&)[NS * 4]>(s);
      const uint32_t qa = smem_u32(qs) + uint32_t(warp >> 2) * 64 * D * 2, ka = smem_u32(ks);
      if (form == 0 && !quant) wg_scores<D, KN, 1>(sf, qa, ka);  // dense keys [D][KN]
      else wg_scores<D, KN, 0>(sf, qa, ka);            // decoded keys [KN][D]
    } else
#endif
    if (form == 0 && !quant) {
#pragma unroll
      for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t a[4];
        ldsm_x4(a, qs + (warp * 16 + (lane & 15)) * QLD + k0 + (lane >> 4) * 8);
#pragma unroll
        for (int n0 = 0; n0 < KN; n0 += 16) {
          uint32_t b[4];
          ldsm_x4_t(b, ks + (k0 + r8 + (mi & 1) * 8) * KLD + n0 + (mi >> 1) * 8);
          mma16816(s[n0 / 8], a, b[0], b[1]);
          mma16816(s[n0 / 8 + 1], a, b[2], b[3]);
        }
      }
    } else {
#pragma unroll
      for (int k0 = 0; k0 < D; k0 += 16) {
        uint32_t a[4];
        ldsm_x4(a, qs + (warp * 16 + (lane & 15)) * QLD + k0 + (lane >> 4) * 8);
#pragma unroll
        for (int n0 = 0; n0 < KN; n0 += 16) {
          uint32_t b[4];
          ldsm_x4(b, ks + (n0 + r8 + (mi >> 1) * 8) * KLDC + k0 + (mi & 1) * 8);
          mma16816(s[n0 / 8], a, b[0], b[1]);
          mma16816(s[n0 / 8 + 1], a, b[2], b[3]);
        }
      }
    }
    float alpha[2];
    mask_softmax<NS>(s, form, u0, rg, rpos, rvalid, t, m_run, l_run, alpha);
    if (any_rescale(alpha)) {
#pragma unroll
      for (int n = 0; n < NT; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }
    // ---- O += P V: P from the S accumulators (k-steps of 16 keys) ----
#if defined(VQ_HAVE_WGMMA)
    if constexpr (WG) {  // m64nDk16 per k-step, P from registers, V [KN][D] MN-major
      float(&of)[NT * 4] = reinterpret_cast<float(&)[NT * 4]>(o);
      const uint32_t va = smem_u32(vs);
      uint32_t a[KN / 16][4];
#pragma unroll
      for (int kk = 0; kk < KN / 16; ++kk) {
        a[kk][0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
        a[kk][1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
        a[kk][2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[kk][3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      }
      wg::fence_regs(of);
      wg::fence();
#pragma unroll
      for (int kk = 0; kk < KN / 16; ++kk) {
        const uint64_t db = wg::desc(va + kk * 2 * D * 16, D * 16, 128);
        if constexpr (D == 64) wg::mma_rs_m64n64(of, a[kk], db);
        else if constexpr (D == 128) wg::mma_rs_m64n128(of, a[kk], db);
        else wg::mma_rs_m64n256(of, a[kk], db);
      }
      wg::commit();
      wg::wait<0>();
      wg::fence_regs(of);
    } else
#endif
    {
#pragma unroll
      for (int kk = 0; kk < KN / 16; ++kk) {
        uint32_t a[4];
        a[0] = pack_half2(s[2 * kk][0], s[2 * kk][1]);
        a[1] = pack_half2(s[2 * kk][2], s[2 * kk][3]);
        a[2] = pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[3] = pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int d0 = 0; d0 < D; d0 += 16) {
          uint32_t b[4];
          ldsm_x4_t(b, vs + (kk * 16 + r8 + (mi & 1) * 8) * VLD + d0 + (mi >> 1) * 8);
          mma16816(o[d0 / 8], a, b[0], b[1]);
          mma16816(o[d0 / 8 + 1], a, b[2], b[3]);
        }
      }
    }
  }
  write_rows<D, ROWS>(p, tile, kh, warp * 16, g, t, o, m_run, l_run, rvalid);
  }  // the kernel body
}

// ---- The warp-specialised form (Hopper, sm_90a build; GpuTuning::prefill_ws) ----
// Three warpgroups per tile of 128 rows: warpgroup 0 is the producer, 1 and 2 the consumers (64 rows
// each). The producer walks the passes and fills NST shared-memory stages by TMA (one thread issues
// a block's boxes; dense passes: the pool's fp16 blocks, coded passes: the step's decoded past,
// PrefillParams::scr) in the swizzled layouts wgmma reads (WsTiles), and hands a stage over when its
// copies land (the boxes' bytes counted on full[s], plus a cp.async.mbarrier.arrive per thread for
// the few rows copied by cp.async: the block holding the tile's last key, whose later rows are
// zeroed, and the rotated key mean's terms), so up to NST passes are in flight; the consumers score, mask, softmax and accumulate
// (wgmma, as the WG form above) and hand the stage back (empty[s]). Nothing waits on the whole block
// after the start: each consumer warpgroup proceeds at its own pace (one's softmax under the other's
// products). Registers move from the producer (80) to the consumers (208) with setmaxnreg.
// Scalar-block layers and coded layers without the decoded past keep the form above.
struct WsOffsets {
  int q, qc, stage, stage_bytes, total;  // bytes from the start of dynamic shared memory
};

// The tensor maps of the producer's copies, 2-D views of fp16 rows: k, the dense arena as rows of
// 32 halves (a block's keys of one KV head, [D][32]: D rows, one box of 32 x D, 64-byte swizzle);
// v, the dense arena as rows of D halves (a block's values of one KV head: 32 rows, boxes of 64
// channels x 32, 128-byte swizzle); s, the decoded past as rows of D halves (keys and values
// token-major, boxed as v).
struct WsMaps {
  CUtensorMap k, v, s;
};

// Shared tiles of the warp-specialised form, offsets in halves. Dense keys: NB blocks of [D][32]
// (MN-major, keys along 64-byte rows, 64-byte swizzle), block hb at hb * 32 * D. Values and
// decoded keys: D / 64 column blocks of [KN][64] (128-byte rows, 128-byte swizzle), column block c
// at c * KN * 64; sw(k, d) is element (key k, channel d) there.
template <int D, int KN>
struct WsTiles {
  static __device__ __forceinline__ int sw(int k, int d) {
    return (d >> 6) * (KN * 64) + k * 64 + ((((d >> 3) & 7) ^ (k & 7)) << 3) + (d & 7);
  }
  // k-step kk (16 channels) of S = Q K^T: dense keys (TB 1) or decoded keys (TB 0).
  static __device__ __forceinline__ uint64_t kdesc(uint32_t ka, int kk, int tb) {
    return tb ? wg::desc_sw64(ka + kk * 1024, 32 * D * 2, 512)
              : wg::desc_sw128(ka + (kk >> 2) * (KN * 128) + (kk & 3) * 32, 16, 1024);
  }
  // k-step kk (16 keys) of O += P V.
  static __device__ __forceinline__ uint64_t vdesc(uint32_t va, int kk) {
    return wg::desc_sw128(va + kk * 2048, KN * 128, 1024);
  }
};

template <int D, int NB, int NST>
WsOffsets ws_offsets(const PrefillParams& pp) {
  static_assert(2 * NST * 8 <= 128, "mbarriers fit in the first 128 bytes");
  WsOffsets o{};
  const bool coded = pp.rule.coded;
  int at = 128;  // full[NST], empty[NST]; the kernel aligns the start to 1024 bytes
  o.q = at;
  at += 128 * D * 2;
  o.qc = at;
  if (coded) at += 128 * D * 2;
  at = (at + 1023) & ~1023;  // swizzle atoms at their boundaries
  o.stage = at;
  using L = PrefillSmem<D, NB, true>;
  o.stage_bytes = (L::KH + L::VH) * 2 + (coded && pp.kbias.values ? 128 * 2 * NB * 4 : 0);
  at += NST * o.stage_bytes;
  o.total = at + 1024;  // room to align the start
  return o;
}

#if defined(VQ_HAVE_WGMMA)
// Registers per thread after setmaxnreg: 128 x 80 + 256 x 208 <= 65536.
constexpr int kWsProducerRegs = 80, kWsConsumerRegs = 208;

namespace wsb {
__device__ __forceinline__ void init(uint64_t* b, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void arrive(uint64_t* b) {
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_u32(b)) : "memory");
}
__device__ __forceinline__ void wait(uint64_t* b, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\nLAB_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra LAB_WAIT;\n}\n" ::"r"(smem_u32(b)),
      "r"(parity)
      : "memory");
}
// Arrives on b once every cp.async this thread has issued so far has landed (counted against the
// barrier's expected arrivals): the producer hands a stage over without waiting for its copies.
__device__ __forceinline__ void arrive_on_copies(uint64_t* b) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(b)) : "memory");
}
// The current phase of b also waits for `bytes` more to land (TMA's complete_tx); no arrival.
__device__ __forceinline__ void expect_tx(uint64_t* b, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(b)), "r"(bytes) : "memory");
}
// TMA: the box of tensor map tm at coordinates (c0, c1) into shared memory at dst, its bytes
// counted on b.
__device__ __forceinline__ void tma_2d(void* dst, const CUtensorMap* tm, int c0, int c1, uint64_t* b) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tm)), "r"(c0), "r"(c1), "r"(smem_u32(b))
      : "memory");
}
__device__ __forceinline__ void named_sync(unsigned id, unsigned n) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
template <int R>
__device__ __forceinline__ void regs_down() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ __forceinline__ void regs_up() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
}  // namespace wsb
#endif

#if defined(VQ_HAVE_WGMMA)
// Issues S = Q K^T of one warpgroup's 64 rows (query core matrices at qa) over the key tile at ka
// (WsTiles: TB 1 dense, 0 decoded) as one commit group. acc = 0: the first k-step overwrites sf
// (the caller leaves it unset, which saves zeroing its KN / 2 registers every pass), 1: adds to it.
template <int D, int KN, int TB>
__device__ __forceinline__ void ws_issue_scores(float (&sf)[KN / 2], uint32_t qa, uint32_t ka, int acc) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    const uint64_t da = wg::desc(qa + kk * 256, 128, D * 16), db = WsTiles<D, KN>::kdesc(ka, kk, TB);
    const int a = kk == 0 ? acc : 1;
    if constexpr (KN == 128) wg::mma_ss_m64n128<TB>(sf, da, db, a);
    else if constexpr (KN == 64) wg::mma_ss_m64n64<TB>(sf, da, db, a);
    else wg::mma_ss_m64n32<TB>(sf, da, db, a);
  }
  wg::commit();
}
// Issues O += P V (P in registers, the value tile at va) as one commit group.
template <int D, int KN>
__device__ __forceinline__ void ws_issue_pv(float (&of)[D / 2], const uint32_t (&pa)[KN / 16][4], uint32_t va) {
#pragma unroll
  for (int kk = 0; kk < KN / 16; ++kk) {
    const uint64_t db = WsTiles<D, KN>::vdesc(va, kk);
    if constexpr (D == 64) wg::mma_rs_m64n64(of, pa[kk], db);
    else if constexpr (D == 128) wg::mma_rs_m64n128(of, pa[kk], db);
    else wg::mma_rs_m64n256(of, pa[kk], db);
  }
  wg::commit();
}
// S = Q K^T, waited for.
template <int D, int KN, int TB>
__device__ __forceinline__ void ws_scores(float (&sf)[KN / 2], uint32_t qa, uint32_t ka, int acc) {
  wg::fence_regs(sf);
  wg::fence();
  ws_issue_scores<D, KN, TB>(sf, qa, ka, acc);
  wg::wait<0>();
  wg::fence_regs(sf);
}
// O += P V, waited for.
template <int D, int KN>
__device__ __forceinline__ void ws_pv(float (&of)[D / 2], const uint32_t (&pa)[KN / 16][4], uint32_t va) {
  wg::fence_regs(of);
  wg::fence();
  ws_issue_pv<D, KN>(of, pa, va);
  wg::wait<0>();
  wg::fence_regs(of);
}
// The overlapped consumer step (OV): S = Q K^T of this pass and O += P V of the previous pass (P in
// pa, values at va) issued together as two commit groups; returns when S is done, the P V product
// still running (wg::wait<0> ends it). One straight sequence: ptxas serializes wgmma across branches.
template <int D, int KN, int TB>
__device__ __forceinline__ void ws_products(float (&sf)[KN / 2], uint32_t qa, uint32_t ka, float (&of)[D / 2],
                                            const uint32_t (&pa)[KN / 16][4], uint32_t va, int acc) {
  wg::fence_regs(sf);
  wg::fence_regs(of);
  wg::fence();
  ws_issue_scores<D, KN, TB>(sf, qa, ka, acc);
  ws_issue_pv<D, KN>(of, pa, va);
  wg::wait<1>();
  wg::fence_regs(sf);
}
#endif

template <int D, int NB, int NST, bool OV>
__global__ void __launch_bounds__(384, 1)
    prefill_ws_kernel(PrefillParams p, WsOffsets lo, const __grid_constant__ WsMaps maps) {
#if !defined(VQ_HAVE_WGMMA)
  __trap();  // not built for this device: the dispatcher never launches it (launch_ws_d)
#else
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);  // WsOffsets are from here
  using L = PrefillSmem<D, NB, true>;
  using T = WsTiles<D, L::KN>;
  constexpr int ROWS = 128, NT = D / 8, KN = L::KN, NS = KN / 8;
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + NST;
  __half* qp = reinterpret_cast<__half*>(smem + lo.q);
  __half* qc = reinterpret_cast<__half*>(smem + lo.qc);
  auto kst = [&](int s) { return reinterpret_cast<__half*>(smem + lo.stage + s * lo.stage_bytes); };
  auto vst = [&](int s) { return kst(s) + L::KH; };
  auto kbst = [&](int s) { return reinterpret_cast<float*>(smem + lo.stage + s * lo.stage_bytes + 2 * (L::KH + L::VH)); };

  const PagedPrefillTile tile = p.tiles[blockIdx.x];
  const int kh = blockIdx.y;
  const int G = p.group, P = ROWS / G;
  const int n_pos = tile.n_pos;
  const bool coded_layer = p.rule.coded;
  const int tab = p.row_table ? p.row_table[tile.row0] : tile.row0;
  const int H = p.n_kv_heads;

  const int t_first = p.pos[tile.row0], t_last = p.pos[tile.row0 + n_pos - 1];
  const PagedRanges gf = paged_ranges(p.rule, t_first), gl = paged_ranges(p.rule, t_last);
  PassWalk walk = PassWalk::make(coded_layer, gf.sink_lo, gf.sink_hi, gf.code_lo, gl.code_hi, gf.win_lo, t_last, KN);
  const int64_t kmin =
      coded_layer ? min(gf.sink_hi > gf.sink_lo ? gf.sink_lo : gf.code_lo, gf.win_lo) : gf.win_lo;
  const int64_t j_first = kmin / KN, n_passes = int64_t(t_last) / KN - j_first + 1;
  const int64_t per_split = (n_passes + p.ksplits - 1) / p.ksplits;
  const int64_t j_begin = j_first + int64_t(blockIdx.z) * per_split;
  walk.j_end = min(j_begin + per_split, j_first + n_passes);
  const bool kb_on = coded_layer && p.kbias.values != nullptr;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < NST; ++s) wsb::init(full + s, 128), wsb::init(empty + s, 256);
  }
  __syncthreads();

  if (threadIdx.x < 128) {  // ---------------- producer warpgroup ----------------
    wsb::regs_down<kWsProducerRegs>();
    const int tid = threadIdx.x;
    const uint8_t* const* dtab = p.dense_tables[tab];
    // Coded layers run here only with the step's decoded past (launch_ws_d).
    const int64_t scr_stride = scratch_stride(p);
    const __half* scr_k = scratch_blocks(p, tab, kh);
    const __half* zsrc = reinterpret_cast<const __half*>(p.q);  // a valid address for zero-fills (nothing read)
    // The rotated key mean's terms of row tid (as the WG form's issue(), a whole row per thread).
    int64_t kb_base = 0, kb_slo = 0, kb_shi = -1;
    if (kb_on) {
      const int m = tid, pi = m / G;
      if (pi < n_pos && pi < P) {
        const int r = tile.row0 + pi;
        const PagedRanges g = paged_ranges(p.rule, p.pos[r]);
        if (g.code_hi > g.code_lo) {
          kb_base = key_bias_index(p.kbias.row_off[r], p.kbias.row_nseg[r], g.code_lo, kh * G + m % G, 0);
          kb_slo = g.code_lo >> kKeyMeanSegmentLog2, kb_shi = (g.code_hi - 1) >> kKeyMeanSegmentLog2;
        }
      }
    }
    // Token-major rows of D halves ([kB][D]) by cp.async into the swizzled tile (T::sw), rows no
    // one reads zero-filled (src-size 0): a warp takes 4 rows of 64 channels (whole 128-byte rows).
    auto copy_rows = [&](__half* dst, const __half* src, int n0, bool need, int64_t u0) {
      for (int i = tid; i < kB * (D / 8); i += 128) {
        const int k = (i >> 3) % kB, c = ((i >> 3) / kB) * 8 + (i & 7);
        const bool ok = need && u0 + k <= t_last;
        cp_async16(dst + T::sw(n0 + k, 8 * c), ok ? src + k * D + 8 * c : zsrc, ok);
      }
    };
    // Rows of the tensor maps (WsMaps): a block's keys in k, its values in v, and block b of the
    // decoded past in s (keys; values 32 rows on).
    const int64_t scr_row0 = p.scr ? (p.scr_slot0[tab] * H + kh) * 64 : 0;
    auto issue = [&](int64_t j, int form, int s) {
      __half* ks = kst(s);
      __half* vs = vst(s);
      if (form == 1 && kb_on) {
        float* dst = kbst(s) + tid * (2 * NB);
        const int64_t sg0 = j * (KN / 16);
#pragma unroll
        for (int k = 0; k < 2 * NB; ++k) {
          const bool ok = sg0 + k >= kb_slo && sg0 + k <= kb_shi;
          cp_async4_zfill(dst + k, ok ? p.kbias.values + kb_base + sg0 + k : p.kbias.values, ok);
        }
      }
#pragma unroll
      for (int hb = 0; hb < NB; ++hb) {
        const int64_t b = j * NB + hb, u0 = b * kB;
        const bool need = walk.block_needed(b, form);
        // A block read whole goes by TMA; the one holding the tile's last key has its later value
        // rows zeroed (cp.async), and values of a block no row reads are zeros. Keys no row reads
        // are left as they are (their scores are masked).
        const bool whole = need && u0 + kB - 1 <= t_last;
        __half* vdst = vs + hb * kB * 64;
        if (form == 0) {  // the pool's block
          const uint8_t* blk = need ? dtab[b] : nullptr;
          if (tid == 0 && need) {
            const int64_t off = blk - p.dense_base;
            wsb::expect_tx(full + s, uint32_t(whole ? 2 * kB * D * 2 : kB * D * 2));
            wsb::tma_2d(ks + hb * kB * D, &maps.k, 0, int(off / 64) + kh * D, full + s);
            if (whole)
#pragma unroll
              for (int c = 0; c < D / 64; ++c)
                wsb::tma_2d(vdst + c * KN * 64, &maps.v, 64 * c, int(off / (2 * D)) + (H + kh) * kB, full + s);
          }
          if (!whole)
            copy_rows(vdst, need ? reinterpret_cast<const __half*>(blk) + size_t(H + kh) * kB * D : zsrc, 0, need, u0);
        } else {  // decoded once for the step: keys and values token-major
          const int r0 = int(scr_row0 + b * H * 64);
          if (tid == 0 && need) {
            wsb::expect_tx(full + s, uint32_t(whole ? 2 * kB * D * 2 : kB * D * 2));
#pragma unroll
            for (int c = 0; c < D / 64; ++c) {
              wsb::tma_2d(ks + hb * kB * 64 + c * KN * 64, &maps.s, 64 * c, r0, full + s);
              if (whole) wsb::tma_2d(vdst + c * KN * 64, &maps.s, 64 * c, r0 + kB, full + s);
            }
          }
          if (!whole) copy_rows(vdst, need ? scr_k + b * scr_stride + kB * D : zsrc, 0, need, u0);
        }
      }
      cp_async_commit();
    };
    int64_t cj = j_begin;
    int cform = 0;
    walk.seek(cj, cform);
    // Each stage is handed over when its copies land (the barrier counts the 128 threads' copy
    // completions), so up to NST passes are in flight.
    for (int it = 0; cj >= 0; ++it) {
      const int s = it % NST;
      wsb::wait(empty + s, ((it / NST) & 1) ^ 1);
      issue(cj, cform, s);
      wsb::arrive_on_copies(full + s);
      ++cform;
      if (cform == 2) cform = 0, ++cj;
      walk.seek(cj, cform);
    }
    return;
  }

  // ---------------- consumer warpgroups ----------------
  wsb::regs_up<kWsConsumerRegs>();
  const int ct = threadIdx.x - 128, cw = ct >> 5, cwg = cw >> 2, lane = ct & 31;
  const int g = lane >> 2, t = lane & 3;
  // This warpgroup's 64 query rows: row m = (position m / G, head m % G), fp16, scaled for base 2.
  load_queries<L, D, 64, 128>(p, tile.row0, kh, G, min(n_pos, P), coded_layer, cwg * 64, ct & 127, qp, qc);
  wg::fence_proxy_async();
  wsb::named_sync(2 + cwg, 128);
  PagedRanges rg[2];
  int rpos[2];
  bool rvalid[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = cw * 16 + g + 8 * h, pi = m / G;
    rvalid[h] = pi < n_pos && pi < P;
    rpos[h] = rvalid[h] ? p.pos[tile.row0 + pi] : -1;
    rg[h] = paged_ranges(p.rule, rvalid[h] ? rpos[h] : 0);
  }
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.f, 0.f};
  int64_t cj = j_begin;
  int cform = 0;
  walk.seek(cj, cform);
  if constexpr (OV) {
    // S of pass i and P V of pass i - 1 in flight together; the softmax of pass i runs under that
    // P V, and stage i - 1 goes back to the producer once it is done (hence 3 stages). The first
    // pass multiplies P = 0 by its own (finite) values.
    float(&of)[NT * 4] = reinterpret_cast<float(&)[NT * 4]>(o);
    uint32_t pa[KN / 16][4];
#pragma unroll
    for (int kk = 0; kk < KN / 16; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
    int prev_s = -1;
    for (int it = 0; cj >= 0; ++it) {
      const int64_t j = cj;
      const int form = cform;
      const int s = it % NST;
      wsb::wait(full + s, (it / NST) & 1);
      float sc[NS][4];  // set by the first k-step, or from the key mean's terms
      const bool kbi = form == 1 && kb_on;
      if (kbi) init_scores<NS, NB>(sc, kbst(s), cw * 16);
      float(&sf)[NS * 4] = reinterpret_cast<float(&)[NS * 4]>(sc);
      const uint32_t qa = smem_u32(form ? qc : qp) + uint32_t(cwg) * 64 * D * 2, ka = smem_u32(kst(s));
      const uint32_t va = smem_u32(vst(prev_s >= 0 ? prev_s : s));
      if (form == 0) ws_products<D, KN, 1>(sf, qa, ka, of, pa, va, kbi);
      else ws_products<D, KN, 0>(sf, qa, ka, of, pa, va, kbi);
      float alpha[2];
      mask_softmax<NS>(sc, form, j * KN, rg, rpos, rvalid, t, m_run, l_run, alpha);
      wg::wait<0>();
      wg::fence_regs(of);
      if (prev_s >= 0) wsb::arrive(empty + prev_s);
      if (any_rescale(alpha)) {
#pragma unroll
        for (int n = 0; n < NT; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
      }
#pragma unroll
      for (int kk = 0; kk < KN / 16; ++kk) {
        pa[kk][0] = pack_half2(sc[2 * kk][0], sc[2 * kk][1]);
        pa[kk][1] = pack_half2(sc[2 * kk][2], sc[2 * kk][3]);
        pa[kk][2] = pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        pa[kk][3] = pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
      }
      prev_s = s;
      ++cform;
      if (cform == 2) cform = 0, ++cj;
      walk.seek(cj, cform);
    }
    if (prev_s >= 0) ws_pv<D, KN>(of, pa, smem_u32(vst(prev_s)));  // the last pass's P V
  }
  for (int it = 0; !OV && cj >= 0; ++it) {
    const int64_t j = cj;
    const int form = cform;
    const int s = it % NST;
    wsb::wait(full + s, (it / NST) & 1);
    const __half* ks = kst(s);
    const __half* vs = vst(s);
    const int64_t u0 = j * KN;
    float sc[NS][4];  // set by the first k-step, or from the key mean's terms
    const bool kbi = form == 1 && kb_on;
    if (kbi) init_scores<NS, NB>(sc, kbst(s), cw * 16);
    {
      float(&sf)[NS * 4] = reinterpret_cast<float(&)[NS * 4]>(sc);
      const uint32_t qa = smem_u32(form ? qc : qp) + uint32_t(cwg) * 64 * D * 2, ka = smem_u32(ks);
      if (form == 0) ws_scores<D, KN, 1>(sf, qa, ka, kbi);  // dense keys
      else ws_scores<D, KN, 0>(sf, qa, ka, kbi);            // decoded keys
    }
    float alpha[2];
    mask_softmax<NS>(sc, form, u0, rg, rpos, rvalid, t, m_run, l_run, alpha);
    if (any_rescale(alpha)) {
#pragma unroll
      for (int n = 0; n < NT; ++n) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
    }
    {
      float(&of)[NT * 4] = reinterpret_cast<float(&)[NT * 4]>(o);
      uint32_t a[KN / 16][4];
#pragma unroll
      for (int kk = 0; kk < KN / 16; ++kk) {
        a[kk][0] = pack_half2(sc[2 * kk][0], sc[2 * kk][1]);
        a[kk][1] = pack_half2(sc[2 * kk][2], sc[2 * kk][3]);
        a[kk][2] = pack_half2(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        a[kk][3] = pack_half2(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
      }
      ws_pv<D, KN>(of, a, smem_u32(vs));
    }
    wsb::arrive(empty + s);  // this thread is done with stage s
    ++cform;
    if (cform == 2) cform = 0, ++cj;
    walk.seek(cj, cform);
  }
  write_rows<D, ROWS>(p, tile, kh, cw * 16, g, t, o, m_run, l_run, rvalid);
#endif
}


// Grid (n_tiles, n_kv_heads, rows_per_tile / 8), 256 threads: warp w combines row
// blockIdx.z * 8 + w of a tile over the key splits' partials by log-sum-exp (base 2) and writes
// the normalised output as the kernel would. Lane z (< ksplits <= 32) reads split z's max and sum
// and the warp reduces them; then each lane adds its dims over the splits (coalesced). Rows spread
// over many blocks: a small chunk beside decode rows has few (tile, KV head) pairs (one block per
// pair read 8 splits x 128 rows in ~100 us on an H100, the largest kernel of a mixed step).
__global__ void __launch_bounds__(256) prefill_merge_kernel(PrefillParams p, int rows_per_tile) {
  const PagedPrefillTile tile = p.tiles[blockIdx.x];
  const int kh = blockIdx.y, G = p.group, D = p.D, P = rows_per_tile / G;
  const int lane = int(threadIdx.x & 31), m = int(blockIdx.z) * 8 + int(threadIdx.x >> 5);
  const int pi = m / G, hg = m % G;
  if (m >= rows_per_tile || pi >= tile.n_pos || pi >= P) return;  // whole warps
  const int64_t stride = int64_t(rows_per_tile) * (2 + D);  // floats from one split's rows to the next's
  const float* rec = p.part + (int64_t(blockIdx.x) * p.n_kv_heads + kh) * p.ksplits * stride + int64_t(m) * (2 + D);
  float mz = -INFINITY, lz = 0.f;
  if (lane < p.ksplits) {
    mz = rec[lane * stride];
    lz = rec[lane * stride + 1];
  }
  float M = mz;
  for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
  const float w = M == -INFINITY || mz == -INFINITY ? 0.f : exp2f(mz - M);  // a split with no key: 0
  float L = w * lz;
  for (int off = 16; off > 0; off >>= 1) L += __shfl_xor_sync(0xffffffffu, L, off);
  const int64_t at = int64_t(tile.row0 + pi) * p.out_stride + (int64_t(kh) * G + hg) * D;
  for (int d0 = 0; d0 < D; d0 += 32) {  // D is a multiple of 32: every lane runs every pass
    const int d = d0 + lane;
    float acc = 0.f;
    for (int z = 0; z < p.ksplits; ++z) {
      const float wz = __shfl_sync(0xffffffffu, w, z);
      if (wz != 0.f) acc = fmaf(wz, rec[z * stride + 2 + d], acc);
    }
    const float v = L > 0.f ? acc / L : 0.f;
    if (p.out_type == ElemType::f16) static_cast<__half*>(p.out)[at + d] = __float2half_rn(v);
    else static_cast<float*>(p.out)[at + d] = v;
  }
}

// prefill_merge_kernel over tiles of rows_per_tile rows, when the keys were split.
void launch_merge(const PrefillParams& pp, int rows_per_tile, int n_tiles, int H, cudaStream_t st) {
  if (pp.ksplits <= 1) return;
  prefill_merge_kernel<<<dim3(unsigned(n_tiles), unsigned(H), unsigned((rows_per_tile + 7) / 8)), 256, 0, st>>>(
      pp, rows_per_tile);
  VQ_CUDA_LAUNCHED("prefill_merge_kernel");
}

// The step's decoded past (PrefillScratch): block (slot, KV head) decodes the slot's code block,
// K and V rows, into fp16 [32][D] each, token-major (the layout of a tile's decoded pass). 8-bit
// codes with rows of whole 32-bit words only (launch_prefill checks): the fast path of decode_rows,
// which reads no byte past a row.
// The scratch's rows of one pool block (kB tokens, row-major [kB][D] halves) from 8-bit codes of
// 4-dim sub-spaces, 128 threads: a thread takes 4 sub-spaces of a token and stores their 4 centroids
// (32 contiguous bytes) as two 16-byte pieces, so a warp's stores fill whole 32-byte sectors
// (decode_rows' 8-byte stores, one sub-space each, wrote every sector in four partial writes: the
// kernel moved 0.6 TB/s). The same halves as decode_rows.
__device__ __forceinline__ bool scratch_rows_fast(int bits, int sd, int D, int row_bytes) {
  return sd == 4 && codes_by_word(bits, D / 4, row_bytes);
}
__device__ __forceinline__ void scratch_rows(const unsigned char* raw, int row_bytes, int nsub, bool per_sub,
                                             const __half* book, __half* dst, int D) {
  const int n4 = nsub / 4;
  for (int i = threadIdx.x; i < kB * n4; i += 128) {
    const int k = i / n4, s0 = (i % n4) * 4;
    const uint32_t w = *reinterpret_cast<const uint32_t*>(raw + k * row_bytes + s0);
    uint2 c[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) c[e] = *centroid_pieces(book, per_sub, s0 + e, 8, (w >> (8 * e)) & 0xffu, 4);
    uint4* out = reinterpret_cast<uint4*>(dst + k * D + s0 * 4);
    out[0] = make_uint4(c[0].x, c[0].y, c[1].x, c[1].y);
    out[1] = make_uint4(c[2].x, c[2].y, c[3].x, c[3].y);
  }
}

__global__ void __launch_bounds__(128) prefill_scratch_kernel(PrefillParams p, PrefillScratch s) {
  const int slot = blockIdx.x, kh = blockIdx.y, n = *s.n_seqs;
  const int32_t* e = nullptr;
  for (int i = 0; i < n && i < s.max_seqs; ++i)
    if (slot >= s.seqs[4 * i + 3] && slot < s.seqs[4 * i + 3] + s.seqs[4 * i + 2]) e = s.seqs + 4 * i;
  if (!e) return;  // a slot this step does not use
  const int H = p.n_kv_heads, D = p.D;
  const uint8_t* blk = p.coded_tables[e[0]][int64_t(e[1]) + (slot - e[3])];
  const uint8_t* kc = blk + int64_t(kh) * kB * p.kcb;
  const uint8_t* vc = blk + int64_t(H) * kB * p.kcb + int64_t(kh) * kB * p.vcb;
  __half* dst = static_cast<__half*>(s.blocks) + (int64_t(slot) * H + kh) * prefill_scratch_halves(D);
  const auto row_major = [D](int k, int d) { return k * D + d; };
  const __half* kbook = p.k_book + int64_t(kh) * p.kbook_halves;
  const __half* vbook = p.v_book + int64_t(kh) * p.vbook_halves;
  if (scratch_rows_fast(p.kbits, p.kd, D, p.kcb)) scratch_rows(kc, p.kcb, D / 4, p.kbooks > 1, kbook, dst, D);
  else decode_rows(kB, kc, p.kcb, p.kbits, p.kd, D / p.kd, p.kbooks > 1, kbook, dst, row_major, threadIdx.x, 128);
  if (scratch_rows_fast(p.vbits, p.vd, D, p.vcb)) scratch_rows(vc, p.vcb, D / 4, p.vbooks > 1, vbook, dst + kB * D, D);
  else decode_rows(kB, vc, p.vcb, p.vbits, p.vd, D / p.vd, p.vbooks > 1, vbook, dst + kB * D, row_major, threadIdx.x, 128);
}

size_t smem_optin() {
  static const size_t b = [] {
    int dev = 0, v = 0;
    VQ_CUDA_CHECK(cudaGetDevice(&dev));
    VQ_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    return size_t(v);
  }();
  return b;
}

template <int D, int W, int NB, bool WG>
void launch(PrefillParams pp, int n_tiles, int H, cudaStream_t st) {
  pp.raw_bytes = prefill_raw_bytes(pp, NB);
  const size_t smem = prefill_smem_bytes<D, W, NB, WG>(pp);
  VQ_CHECK(smem <= smem_optin(), "cuda::paged_attention prefill: {} bytes of shared memory at head_dim {} (the device has {})",
           smem, D, smem_optin());
  detail::ensure_smem_attr(prefill_kernel<D, W, NB, WG>, smem);
  prefill_kernel<D, W, NB, WG><<<dim3(unsigned(n_tiles), unsigned(H), unsigned(pp.ksplits)), 32 * W, smem, st>>>(pp);
  VQ_CUDA_LAUNCHED("prefill_kernel");
  launch_merge(pp, 16 * W, n_tiles, H, st);
}

// The wgmma form of the kernel (WG = true) where it was built and runs: an sm_90 device and a
// build with sm_90a machine code (VQ_CUDA_SM90A, from CMAKE_CUDA_ARCHITECTURES); elsewhere (PTX
// JIT on newer GPUs, builds without 90a) the mma.sync form. GpuTuning.prefill_wgmma = false
// (VQ_PREFILL_WGMMA=0) forces the mma.sync form, for comparison.
bool prefill_wgmma() {
  static const bool on = [] {
#if defined(VQ_CUDA_SM90A)
    if (!gpu_tuning().prefill_wgmma) return false;
    int dev = 0, major = 0, minor = 0;
    VQ_CUDA_CHECK(cudaGetDevice(&dev));
    VQ_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    VQ_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    return major == 9 && minor == 0;
#else
    return false;
#endif
  }();
  return on;
}

// Variant (CUDA_NOTES.md section 6): warps per tile W and pool blocks per pass NB, chosen here
// (8 warps = two warpgroups for the wgmma form and for coded layers, else 4; 128 keys per pass
// for the wgmma form where they fit, else 64) unless GpuTuning (VQ_PREFILL_WARPS=4|8,
// VQ_PREFILL_KEYS=32|64) overrides them. Read once, so that tiles and launches agree.
int prefill_warps(bool coded) {
  const int w = gpu_tuning().prefill_warps;
  return w ? w : (coded || prefill_wgmma()) ? 8 : 4;
}
int prefill_blocks_per_pass() {
  static const int nb = (gpu_tuning().prefill_keys ? gpu_tuning().prefill_keys : 64) / kB;
  return nb;
}

template <int D, bool WG>
void launch_dw(const PrefillParams& pp, int w, int n_tiles, int H, cudaStream_t st) {
  int nb = prefill_blocks_per_pass();
  if constexpr (WG) {
    // The wgmma form: 128 keys per pass (m64n128k16 products: shared-memory reads per product
    // below the bandwidth) where they fit, unless VQ_PREFILL_KEYS says otherwise.
    if (!gpu_tuning().prefill_keys && w == 8 && prefill_smem_bytes<D, 8, 4, WG>(pp) <= smem_optin()) {
      launch<D, 8, 4, WG>(pp, n_tiles, H, st);
      return;
    }
  }
  // Two blocks per pass where their stages fit beside the query tiles (not at D=256 with 8 warps).
  if (nb == 2 &&
      (w == 8 ? prefill_smem_bytes<D, 8, 2, WG>(pp) : prefill_smem_bytes<D, 4, 2, WG>(pp)) > smem_optin())
    nb = 1;
  if (w == 8 && nb == 2) launch<D, 8, 2, WG>(pp, n_tiles, H, st);
  else if (w == 8) launch<D, 8, 1, WG>(pp, n_tiles, H, st);
  else if (nb == 2) launch<D, 4, 2, WG>(pp, n_tiles, H, st);
  else launch<D, 4, 1, WG>(pp, n_tiles, H, st);
}

// cuTensorMapEncodeTiled from the driver (the runtime hands out its entry point; no link to libcuda).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      f = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A 2-D map of fp16 rows of `cols` halves, `rows` of them from `base`, boxes of box_cols x box_rows.
bool encode_rows(CUtensorMap& m, const void* base, uint64_t cols, uint64_t rows, uint32_t box_cols,
                 uint32_t box_rows, CUtensorMapSwizzle sw) {
  const PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
  if (!enc || rows == 0 || rows > (uint64_t(1) << 31)) return false;
  const cuuint64_t dim[2] = {cols, rows}, stride[1] = {cols * 2};
  const cuuint32_t box[2] = {box_cols, box_rows}, estr[2] = {1, 1};
  return enc(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<void*>(base), dim, stride, box, estr,
             CU_TENSOR_MAP_INTERLEAVE_NONE, sw, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The warp-specialised form's tensor maps (WsMaps) for this layer; false where they cannot be made
// (no dense span, a span or scratch past 2^31 rows, a block not on a row boundary, no driver entry
// point): the layer takes the synchronous form.
bool ws_maps(const PagedAttnParams& a, WsMaps& m) {
  const int D = a.head_dim;
  if (!a.dense_base || a.dense_bytes == 0 || a.dense_align % size_t(2 * D) != 0 || a.dense_align % 64 != 0 ||
      reinterpret_cast<uintptr_t>(a.dense_base) % 16 != 0)
    return false;
  if (!encode_rows(m.k, a.dense_base, 32, a.dense_bytes / 64, 32, uint32_t(D), CU_TENSOR_MAP_SWIZZLE_64B) ||
      !encode_rows(m.v, a.dense_base, uint64_t(D), a.dense_bytes / (2 * D), 64, 32, CU_TENSOR_MAP_SWIZZLE_128B))
    return false;
  if (a.rule.coded) {
    const PrefillScratch& sc = a.prefill_scratch;
    if (!sc.blocks) return false;
    const uint64_t rows = uint64_t(sc.slots) * uint64_t(a.n_kv_heads) * 64;
    if (!encode_rows(m.s, sc.blocks, uint64_t(D), rows, 64, 32, CU_TENSOR_MAP_SWIZZLE_128B)) return false;
  } else {
    m.s = m.v;  // not read
  }
  return true;
}

// The warp-specialised form with NST stages of NB pool blocks, where it fits in shared memory; false:
// it does not fit.
template <int D, int NB, int NST, bool OV>
bool launch_ws(const PrefillParams& pp, const WsMaps& maps, int n_tiles, int H, cudaStream_t st) {
  const WsOffsets o = ws_offsets<D, NB, NST>(pp);
  if (size_t(o.total) > smem_optin()) return false;
  detail::ensure_smem_attr(prefill_ws_kernel<D, NB, NST, OV>, size_t(o.total));
  prefill_ws_kernel<D, NB, NST, OV>
      <<<dim3(unsigned(n_tiles), unsigned(H), unsigned(pp.ksplits)), 384, size_t(o.total), st>>>(pp, o, maps);
  VQ_CUDA_LAUNCHED("prefill_ws_kernel");
  launch_merge(pp, 128, n_tiles, H, st);
  return true;
}

// The warp-specialised form (tiles of 128 rows on an sm_90a build) unless GpuTuning::prefill_ws is
// off (VQ_PREFILL_WS=0) or the tile's stages do not fit: fp16 layers with 128 keys per pass at
// head_dim 64 and 128 (3 stages), 64 at 256; coded layers when the step decoded their past once
// (PrefillParams::scr: their passes are copies too) with 2 stages (their second query tile), 32
// keys per pass at 256. Coded layers decoding per tile and scalar-block layers take the
// synchronous form: a producer warpgroup decoding the passes was slower than the whole tile
// decoding between the products (H200, Llama-3.1-8B shape, 512 x 32K, d4b8: 5.66 ms against 3.98).
template <int D>
bool launch_ws_d(const PrefillParams& pp, const PagedAttnParams& a, int w, int n_tiles, int H, cudaStream_t st) {
  if (w != 8 || !prefill_wgmma() || !gpu_tuning().prefill_ws || pp.rule.elem != PagedElem::f16 ||
      (pp.rule.coded && !pp.scr) || gpu_tuning().prefill_keys)
    return false;
  WsMaps maps;
  if (!ws_maps(a, maps)) return false;
  const bool ov = gpu_tuning().prefill_ws == 2 && !pp.rule.coded;
  if constexpr (D == 64) {
    if (pp.rule.coded) return launch_ws<64, 4, 2, false>(pp, maps, n_tiles, H, st);
    return ov ? launch_ws<64, 4, 3, true>(pp, maps, n_tiles, H, st)
              : launch_ws<64, 4, 3, false>(pp, maps, n_tiles, H, st);
  } else if constexpr (D == 128) {
    if (pp.rule.coded) return launch_ws<128, 4, 2, false>(pp, maps, n_tiles, H, st);
    return ov ? launch_ws<128, 4, 3, true>(pp, maps, n_tiles, H, st)
              : launch_ws<128, 4, 3, false>(pp, maps, n_tiles, H, st);
  } else {
    if (pp.rule.coded) return launch_ws<256, 1, 2, false>(pp, maps, n_tiles, H, st);
    return launch_ws<256, 2, 2, false>(pp, maps, n_tiles, H, st);
  }
}

template <int D>
void launch_d(const PrefillParams& pp, const PagedAttnParams& a, int w, int n_tiles, int H, cudaStream_t st) {
  if (launch_ws_d<D>(pp, a, w, n_tiles, H, st)) return;
  if (prefill_wgmma()) launch_dw<D, true>(pp, w, n_tiles, H, st);
  else launch_dw<D, false>(pp, w, n_tiles, H, st);
}

}  // namespace

int prefill_tile_rows(bool coded) { return 16 * prefill_warps(coded); }

// At most this many key splits per (tile, KV head) (the merge takes up to 32: a lane per split).
constexpr int kPrefillMaxSplits = 16;
static_assert(kPrefillMaxSplits <= 32, "prefill_merge_kernel reads split z's max and sum in lane z");

int prefill_key_splits(int n_tiles, int n_kv_heads, int tile_rows, int sms) {
  // One block per (tile, KV head) unit walks all the keys of its rows, and the blocks run in waves
  // of `slots` (two 4-warp blocks per SM, one 8-warp block), the last one partly idle: 50 units ran
  // on 100 of 132 SMs as 2 splits each, 196 units took 2 waves for 1.48 waves of work. Splitting the
  // keys s ways takes ceil(units s / slots) waves of 1/s of a unit's work; counts 2..16 are tried in
  // order and one is taken when it beats the best fewer splits by more than 10% (the margin pays
  // the partials and their merge). Large chunks keep one split (no partials, no merge).
  const int64_t units = int64_t(n_tiles) * n_kv_heads;
  const int64_t slots = int64_t(sms) * (tile_rows <= 64 ? 2 : 1);
  if (units <= 0 || slots <= 0) return 1;
  int best = 1;
  double best_t = double((units + slots - 1) / slots);
  for (int s = 2; s <= kPrefillMaxSplits; ++s) {
    const double t = double((units * s + slots - 1) / slots) / s;
    if (t < 0.9 * best_t) best = s, best_t = t;
  }
  return best;
}

size_t prefill_part_bytes(int n_tiles, int n_kv_heads, int tile_rows, int head_dim, int ksplits) {
  return ksplits > 1 ? size_t(n_tiles) * n_kv_heads * ksplits * tile_rows * (2 + head_dim) * sizeof(float) : 0;
}

void launch_prefill(const PagedAttnParams& a, float* part, cudaStream_t st) {
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
  pp.kbias = a.key_bias;
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
    VQ_CHECK(pp.kd % 4 == 0 && pp.vd % 4 == 0, "cuda::paged_attention prefill: sub_dim {} / {} (multiples of 4)",
             pp.kd, pp.vd);
    pp.k_book = reinterpret_cast<const __half*>(a.k_book);
    pp.v_book = reinterpret_cast<const __half*>(a.v_book);
    pp.kbook_halves = (pp.kbooks << pp.kbits) * pp.kd;
    pp.vbook_halves = (pp.vbooks << pp.vbits) * pp.vd;
    pp.books_smem = pp.kbook_halves * 2 <= kBookSmemMax && pp.vbook_halves * 2 <= kBookSmemMax;
  }
  if (a.rule.elem != PagedElem::f16) pp.kcb = pp.vcb = scalar_row_bytes(a.rule.elem, a.head_dim);
  pp.tiles = a.tiles;
  pp.ksplits = a.prefill_splits > 0 ? a.prefill_splits : 1;
  pp.part = part;
  VQ_CHECK(pp.ksplits == 1 || part, "cuda::paged_attention prefill: {} key splits need a workspace", pp.ksplits);
  VQ_CHECK(pp.ksplits <= 32, "cuda::paged_attention prefill: {} key splits (the merge takes at most 32)", pp.ksplits);
  pp.out_type = a.out_type;
  pp.out = a.out;
  pp.out_stride = a.out_stride ? a.out_stride : int64_t(pp.n_q_heads) * a.head_dim;
  const PrefillScratch& sc = a.prefill_scratch;
  if (a.rule.coded && sc.blocks) {
    VQ_CHECK(prefill_scratch_supported(a.head_dim, a.k_sub_dim, a.k_bits, a.v_sub_dim, a.v_bits) && sc.slot0 &&
                 sc.seqs && sc.n_seqs && sc.slots > 0 && sc.slots <= 2147483647,
             "cuda::paged_attention prefill: a scratch for codes of {} / {} bits (8-bit codes only) or without its tables",
             a.k_bits, a.v_bits);
    prefill_scratch_kernel<<<dim3(unsigned(sc.slots), unsigned(a.n_kv_heads)), 128, 0, st>>>(pp, sc);
    VQ_CUDA_LAUNCHED("prefill_scratch_kernel");
    pp.scr = static_cast<const __half*>(sc.blocks);
    pp.scr_slot0 = sc.slot0;
  }
  const int w = a.tile_rows / 16;  // 4 or 8 (checked by paged_attention)
  pp.dense_base = a.dense_base;
  if (a.head_dim == 64) launch_d<64>(pp, a, w, a.n_tiles, a.n_kv_heads, st);
  else if (a.head_dim == 128) launch_d<128>(pp, a, w, a.n_tiles, a.n_kv_heads, st);
  else launch_d<256>(pp, a, w, a.n_tiles, a.n_kv_heads, st);
}

}  // namespace vq::cuda::detail
