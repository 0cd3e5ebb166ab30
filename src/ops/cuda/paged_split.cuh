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

// Dense tokens of a row: the sinks then the window (or all of [kb, t] for an all-dense layer)
// as one virtual list v in [0, n0 + n1): position(v) = v < n0 ? lo0 + v : lo1 + v - n0.
struct DenseSplit {
  int lo0, n0, lo1, n1, chunk;
  __device__ __forceinline__ int n() const { return n0 + n1; }
  __device__ __forceinline__ bool holds(int s) const { return s * chunk < n(); }
  __device__ __forceinline__ int position(int v) const { return v < n0 ? lo0 + v : lo1 + (v - n0); }
};

constexpr int kDenseMinChunk = 128;  // one group of 32 tokens per warp of a 4-warp block

__device__ __forceinline__ DenseSplit dense_split(const PagedRule& r, int pos, int splits) {
  const PagedRanges g = paged_ranges(r, pos);
  DenseSplit s;
  s.lo0 = int(g.sink_lo);
  s.n0 = g.sink_hi > g.sink_lo ? int(g.sink_hi - g.sink_lo) : 0;
  s.lo1 = int(g.win_lo);
  s.n1 = g.win_hi > g.win_lo ? int(g.win_hi - g.win_lo) : 0;
  int c = (s.n() + splits - 1) / splits;
  c = c > kDenseMinChunk ? c : kDenseMinChunk;
  s.chunk = (c + 31) / 32 * 32;
  return s;
}

// Split geometry constants of the two coded split kernels (the merge needs the same).
constexpr int kLutAlign = 32, kLutChunkAlign = 32, kLutMinChunk = 512;
constexpr int kGatherAlign = 16, kGatherChunkAlign = 128, kGatherMinChunk = 256;

}  // namespace vq::cuda::detail
