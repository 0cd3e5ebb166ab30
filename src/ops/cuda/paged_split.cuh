#pragma once
// Internal to src/ops/cuda: how the paged attention cuts one row's key ranges into splits. The
// split kernels and the merge kernel both call these, so they agree on which splits hold tokens
// without any per-step host input (the launch sequence is graph-capturable).
#include <cstdint>

#include "ops/cuda/paged_attention_cuda.h"

namespace vq::cuda::detail {

// Coded tokens [lo, hi) of a row, cut into `splits` chunks starting at a0 = lo rounded down to
// `align` (tiles never straddle a block: B is a multiple of align); chunk is a multiple of
// chunk_align and at least min_chunk. Split s holds [max(lo, a0 + s*chunk), min(hi, a0 + (s+1)*chunk)).
struct CodedSplit {
  int lo, hi, a0, chunk;
  __device__ __forceinline__ bool holds(int s) const { return hi > lo && a0 + s * chunk < hi; }
};

__device__ __forceinline__ CodedSplit coded_split(const PagedRule& r, int pos, int splits, int align, int chunk_align,
                                                  int min_chunk) {
  const PagedRanges g = paged_ranges(r, pos);
  CodedSplit s;
  s.lo = int(g.code_lo);
  s.hi = int(g.code_hi);
  s.a0 = s.lo & ~(align - 1);
  const int n = s.hi > s.a0 ? s.hi - s.a0 : 0;
  int c = (n + splits - 1) / splits;
  c = c > min_chunk ? c : min_chunk;
  s.chunk = (c + chunk_align - 1) / chunk_align * chunk_align;
  return s;
}

// A coded split kernel block's tokens: [begin, end) of row b's split `split`, lo the row's first
// coded token (tokens below it in the first tile are masked), tab its block table. False: the
// split holds no token (the block exits; the merge kernel skips it).
template <class P>
__device__ __forceinline__ bool coded_split_tokens(const P& p, int b, int split, int align, int chunk_align,
                                                   int min_chunk, int& begin, int& end, int& lo,
                                                   const uint8_t* const*& tab) {
  const CodedSplit cs = coded_split(p.rule, p.pos[b], p.n_splits, align, chunk_align, min_chunk);
  if (!cs.holds(split)) return false;
  begin = cs.a0 + split * cs.chunk;
  end = min(cs.hi, begin + cs.chunk);
  lo = cs.lo;
  tab = p.tables[p.row_table ? p.row_table[b] : b];
  return true;
}

// Dense tokens of a row: the sinks [lo0, hi0) then the window [lo1, hi1) (or all of [kb, t] for an
// all-dense layer), walked as tiles of `tile` tokens aligned to absolute positions (a tile never
// straddles a pool block: block_tokens is a multiple of tile). Tiles of the sinks come first:
// n_t0 of them, then n_t1 of the window; tokens of a tile outside its range are masked. Split s
// holds tiles [s*chunk, min(n_t, (s+1)*chunk)); chunk >= kDenseMinTokens / tile.
struct DenseTiles {
  int lo0, hi0, lo1, hi1, a0, a1, n_t0, n_t1, chunk, tile;
  __device__ __forceinline__ int n() const { return n_t0 + n_t1; }
  __device__ __forceinline__ bool holds(int s) const { return s * chunk < n(); }
  __device__ __forceinline__ int used_splits() const { return (n() + chunk - 1) / chunk; }
  // Tile j: first position, and the range [lo, hi) its tokens must lie in.
  __device__ __forceinline__ void at(int j, int& t0, int& lo, int& hi) const {
    if (j < n_t0) t0 = a0 + j * tile, lo = lo0, hi = hi0;
    else t0 = a1 + (j - n_t0) * tile, lo = lo1, hi = hi1;
  }
};

constexpr int kDenseMinTokens = 128;
// Scalar blocks (PagedRule::elem): at least 512 tokens per split. Their splits are planned for the
// 2-3 blocks that share an SM (the dequantization is ALU work more warps hide), and with 128 a row
// of few KV heads was cut into ~200 short splits whose fixed costs and merge cost more than they
// gained (Qwen2.5-1.5B B=1 32K: 4.40 ms against 2.96 ms; B=16 needs the splits: 37.3 -> 27.1 ms on
// Llama-3.1-8B).
constexpr int kDenseMinTokensScalar = 512;

__device__ __forceinline__ DenseTiles dense_tiles(const PagedRule& r, int pos, int splits, int tile) {
  const PagedRanges g = paged_ranges(r, pos);
  DenseTiles s;
  s.tile = tile;
  s.lo0 = int(g.sink_lo), s.hi0 = int(g.sink_hi), s.lo1 = int(g.win_lo), s.hi1 = int(g.win_hi);
  s.a0 = s.lo0 / tile * tile, s.a1 = s.lo1 / tile * tile;
  s.n_t0 = s.hi0 > s.lo0 ? (s.hi0 - s.a0 + tile - 1) / tile : 0;
  s.n_t1 = s.hi1 > s.lo1 ? (s.hi1 - s.a1 + tile - 1) / tile : 0;
  const int min_tiles = (r.elem == PagedElem::f16 ? kDenseMinTokens : kDenseMinTokensScalar) / tile;
  const int c = (s.n() + splits - 1) / splits;
  s.chunk = c > min_tiles ? c : min_tiles;
  return s;
}

// Split geometry constants of the two coded split kernels (the merge needs the same).
constexpr int kLutAlign = 32, kLutChunkAlign = 32, kLutMinChunk = 512;
constexpr int kGatherAlign = 16, kGatherChunkAlign = 128, kGatherMinChunk = 256;

}  // namespace vq::cuda::detail
