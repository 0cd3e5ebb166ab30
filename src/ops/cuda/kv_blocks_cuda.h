#pragma once
// Device data paths of the KV pool (vq::cuda): new keys/values into dense blocks, dense blocks
// encoded into VecInfer coded blocks, the step's block-table updates and copy-on-write copies,
// and the small row ops of the device forward that have no home in llm_ops_cuda.h (query
// transform, bias add, row gather, random fill). Block layouts are the CPU's
// (kvcache/kv_store.h): dense fp16 keys channel-major [H][D][B], then values [H][B][D]; coded
// keys [H][B][krow] then values [H][B][vrow].
// Counts that vary per step (jobs, updates, copies) are read from device memory and the grids
// are sized by a fixed maximum, so a step's launches can be captured once in a CUDA graph.
// No CUDA types here; pointers are device pointers; `stream` is a cudaStream_t as void*.
#include <cstddef>
#include <cstdint>

#include "ops/cuda/elem_type.h"
#include "ops/cuda/key_mean_cuda.h"

namespace vq::cuda {

// ---- new rows of K/V into dense blocks ----
// Row r (position pos[r]) goes to slot pos[r] % B of block tables[r][pos[r] / B].
struct KVAppendParams {
  int rows = 0;
  int n_kv_heads = 0, head_dim = 0;
  int block_tokens = 32;                 // B, a power of two
  const float* k = nullptr;              // row r at k + r*k_stride: [n_kv_heads][head_dim] f32 (after RoPE)
  int64_t k_stride = 0;                  // elements; 0: packed
  const float* v = nullptr;
  int64_t v_stride = 0;
  const int32_t* pos = nullptr;          // [rows]
  const int32_t* row_table = nullptr;    // [rows] row r uses tables[row_table[r]] (null: tables[r])
  uint8_t* const* const* tables = nullptr;  // the sequences' dense block tables
  // Scalar blocks (a direct method's, elem_type.h): each K and V row is coded into its slot's
  // rows, bit for bit as codec/scalar_blocks.h; rotate: after the orthonormal Walsh-Hadamard
  // rotation of the row (q4_0h; head_dim a power of two). The tables are then the coded ones.
  PagedElem elem = PagedElem::f16;
  bool rotate = false;
};
void kv_append_device(const KVAppendParams& p, void* stream = nullptr);

// ---- per-step fix-ups, before anything reads the tables: table entries set, blocks copied ----
struct TableUpdate {
  uint8_t** where = nullptr;  // a table entry (device)
  uint8_t* value = nullptr;   // a block base pointer (device)
};
struct BlockCopy {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  uint64_t bytes = 0;  // a multiple of 16, 16-byte aligned pointers
};
struct StepFixupParams {
  const int* n_updates = nullptr;  // device count (<= max_updates)
  const TableUpdate* updates = nullptr;
  int max_updates = 0;
  const int* n_copies = nullptr;   // device count (<= max_copies)
  const BlockCopy* copies = nullptr;
  int max_copies = 0;
};
void step_fixup_device(const StepFixupParams& p, void* stream = nullptr);

// ---- dense blocks -> VecInfer coded blocks (smoothing + Hadamard or the learned map on keys,
// nearest centroid, bit-packing; the fused encoder of pq.h reading the block layout) ----
struct BlockEncodeJob {
  const uint8_t* dense = nullptr;  // a dense block (fp16)
  uint8_t* coded = nullptr;        // its coded block
  int32_t pos0 = 0;                // position of the block's first token (the rotated key mean's segments)
};
struct KVEncodeParams {
  int n_kv_heads = 0, head_dim = 0;
  int block_tokens = 32;
  const int* n_jobs = nullptr;     // device count (<= max_jobs)
  const BlockEncodeJob* jobs = nullptr;
  int max_jobs = 0;
  int k_sub_dim = 4, k_bits = 8;
  bool k_per_subspace = false;
  const float* lambda = nullptr;   // [n_kv_heads, head_dim] smoothing
  // The learned key transform (codec/learned_key_map.h): keys are coded as M (k / lambda) instead of
  // H (k / lambda). key_map_t: [n_kv_heads][head_dim (j)][head_dim (e)] = M[e][j] (transposed, so a
  // warp's reads of one j are contiguous); null: the Walsh-Hadamard rotation.
  const float* key_map_t = nullptr;
  const float* k_books = nullptr;  // [n_kv_heads, books, 2^k_bits, k_sub_dim] f32
  int v_sub_dim = 4, v_bits = 8;
  bool v_per_subspace = false;
  const float* v_books = nullptr;
  KeyMeanDevice key_mean;          // n_pairs > 0: keys are coded as k - R(p_b) mu (key_mean_cuda.h)
};
void kv_encode_blocks_device(const KVEncodeParams& p, void* stream = nullptr);

// ---- VecInfer queries: out = H(q * lambda) * scale per query head (KV head = head / group), or
// with the learned key transform out = N (q * lambda) * scale, N = M^-T of the query head's KV head ----
struct QueryTransformParams {
  int rows = 0;
  int n_q_heads = 0, n_kv_heads = 0, head_dim = 0;  // head_dim % 32 == 0, <= 256
  const float* q = nullptr;       // row r at q + r*q_stride: [n_q_heads][head_dim]
  int64_t q_stride = 0;           // 0: packed
  const float* lambda = nullptr;  // [n_kv_heads, head_dim]
  const float* map_t = nullptr;   // [n_kv_heads][head_dim (j)][head_dim (e)] = N[e][j]; null: H
  float scale = 1.0f;
  float* out = nullptr;           // [rows][n_q_heads][head_dim] packed
};
void query_transform_device(const QueryTransformParams& p, void* stream = nullptr);

// ---- x = H x per (row, head) in place: the orthonormal block Walsh-Hadamard rotation of
// vq::fwht_inplace (q4_0h's attention output back from the rotated space) ----
struct RotateRowsParams {
  int rows = 0, n_heads = 0, head_dim = 0;  // head_dim % 32 == 0, <= 256
  ElemType type = ElemType::f32;            // f32 or f16
  void* x = nullptr;                        // row r at x + r*stride: [n_heads][head_dim]
  int64_t stride = 0;                       // elements; 0: packed
};
void rotate_rows_device(const RotateRowsParams& p, void* stream = nullptr);

// ---- x[r] += bias (broadcast over rows) ----
struct BiasAddParams {
  int rows = 0, n = 0;
  float* x = nullptr;
  int64_t x_stride = 0;  // 0: n
  const float* bias = nullptr;  // [n]
};
void bias_add_device(const BiasAddParams& p, void* stream = nullptr);

// ---- out[i] = convert(x[index[i]]) ----
struct GatherRowsParams {
  int rows = 0, n = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;           // 0: n
  const int32_t* index = nullptr; // [rows] source rows
  ElemType out_type = ElemType::f32;
  void* out = nullptr;
  int64_t out_stride = 0;         // 0: n
};
void gather_rows_device(const GatherRowsParams& p, void* stream = nullptr);

// ---- deterministic pseudo-random fill: offset + scale * u, u ~ approximately N(0, 1) ----
// (the sum of four uniform hashes, rescaled); for random-weight models and benchmark K/V.
struct RandomFillParams {
  ElemType type = ElemType::f16;
  void* out = nullptr;
  int64_t n = 0;
  uint64_t seed = 1;
  float scale = 1.0f, offset = 0.0f;
};
void random_fill_device(const RandomFillParams& p, void* stream = nullptr);

}  // namespace vq::cuda
