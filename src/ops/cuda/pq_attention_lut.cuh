#pragma once
// Internal to src/ops/cuda: the LUT split kernel of the decode attention (v4, docs/CUDA_NOTES.md).
// It writes the same split partials as the gather-mma split kernel of pq_attention.cu, so the
// merge kernel serves both.
#include <cuda_runtime.h>

#include <cstdint>

#include "ops/cuda/paged_attention_cuda.h"
#include "ops/cuda/pq_attention_cuda.h"

namespace vq::cuda::detail {

constexpr int kLutWarps = 16;                      // warps per block (1 block per SM: the LUT is large)
constexpr int kLutTokensPerIter = 32 * kLutWarps;  // tokens a block consumes per loop iteration
// Warps of the shipped LUT kernel per head_dim: 8 at 256 (registers), else 16.
constexpr int lut_warps(int head_dim) { return head_dim > 128 ? 8 : kLutWarps; }

// True when the LUT kernel takes these shapes: 8-bit key codes with head_dim/k_sub_dim in
// {16, 32} at head_dim 64 or 128, {32, 64} at 256; values d4 with 8-bit codes (shared or
// per-sub-space books).
bool lut_kernel_supported(const PQAttnBatchArgs& a);
// Query heads one block covers (its LUT entries hold them all): 8 when the group has more than 4
// (one block reads the codes once for all of them) and the 8-head LUT (128 KiB) fits beside the
// value books (at most 32 key sub-spaces, head_dim <= 128), else 4. Grid y = n_kv_heads * ceil(group / it).
constexpr int lut_heads_per_block(int group, int head_dim, int key_subspaces) {
  return group > 4 && key_subspaces <= 32 && head_dim <= 128 ? 8 : 4;
}
int lut_heads_per_block(const PQAttnBatchArgs& a);
// Blocks per (row, KV head, head tile, split) that split the value dims: 2 for per-sub-space value
// books at head_dim 256 (their 128 KiB would not fit beside the 128 KiB LUT), else 1.
constexpr int lut_value_parts(int head_dim, bool v_per_subspace) { return head_dim == 256 && v_per_subspace ? 2 : 1; }
// Dynamic shared memory of one block.
size_t lut_kernel_smem(const PQAttnBatchArgs& a);
// Grid (n_splits, n_kv_heads * ceil(group / lut_heads_per_block), rows). part: [rows, n_kv_heads, head_tiles8,
// n_splits][2*8 + 8*D] f32, the layout of the gather-mma kernel (8-head tiles).
void launch_lut_split(const PQAttnBatchArgs& a, int head_tiles8, int chunk, int n_splits, float* part, cudaStream_t st);

// For bench/cuda's kernel variants only: pq_attention_device with the LUT split plan (chunk,
// splits, workspace) and `split` launched in place of the shipped LUT split kernel; the merge is
// the shipped one. Same arguments as launch_lut_split. Throws unless the LUT kernel takes the shape.
using SplitLauncher = void (*)(const PQAttnBatchArgs& a, int head_tiles8, int chunk, int n_splits, float* part,
                               cudaStream_t st);
void pq_attention_device_with_split(const PQAttnBatchArgs& a, SplitLauncher split, void* stream = nullptr);

// The paged modes of the split kernels (paged_attention.cu): grid (a.coded_splits, heads x tiles,
// a.rows); part: [rows, n_kv_heads, ceil(group/8), coded_splits][2*8 + 8*D].
void launch_lut_split_paged(const PagedAttnParams& a, float* part, cudaStream_t st);
void launch_gather_split_paged(const PagedAttnParams& a, float* part, cudaStream_t st);
// The tensor-core prefill kernel over the tiles (paged_prefill.cu).
// part: the key splits' partials (prefill_part_bytes; null when a.prefill_splits <= 1).
void launch_prefill(const PagedAttnParams& a, float* part, cudaStream_t st);
int prefill_tile_rows(bool coded);
// Key splits of the prefill kernel for n_tiles tiles of tile_rows rows (1: none), and the bytes
// of their partials.
int prefill_key_splits(int n_tiles, int n_kv_heads, int tile_rows, int sms);
size_t prefill_part_bytes(int n_tiles, int n_kv_heads, int tile_rows, int head_dim, int ksplits);
// Whether the LUT kernel takes these presets (lut_kernel_supported for the paged arguments).
bool lut_kernel_supported_paged(const PagedAttnParams& a);

}  // namespace vq::cuda::detail
