#pragma once
// Attention on VecInfer codes on the GPU (vq::cuda), batched over "rows": a row is one query
// position of one sequence (decode: one row per sequence; prefill: one row per position of the
// chunk, all pointing at the same codes). No CUDA types here; all pointers are device pointers
// unless a comment says otherwise.
//
// For each row b and query head qh (KV head kh = qh / group) the output is
//   softmax over [coded tokens 0..n_coded[b]) U [fp16 segment 0] U [fp16 segment 1]
// of the scores  s = q_code[b][qh] . k~_t  (coded keys, transformed space: q~ = H(q*lambda)*scale)
//            or  s = q_plain[b][qh] . k_t  (fp16 keys; segments may instead say keys_transformed),
// times the values (decoded from the value codebook, or the fp16 values), normalised:
//   out[b][qh] = sum_t exp(s_t - m) v_t / sum_t exp(s_t - m).
// Rows with no tokens at all get out = 0. The result matches vq::ref::pq_attention (partial
// state over the coded part) merged with the fp16 window by softmax_merge (ops/online_softmax.h).
//
// Kernel (design and measurements in docs/CUDA_NOTES.md): split over the sequence
// (flash-decoding); a block = 8 warps on one (row, KV head, 8 query heads of its group, token
// range); each warp streams tiles of 16 tokens' codes through a cp.async pipeline, gathers fp16
// key centroids straight into tensor-core fragments (S^T = K Q^T, m16n8k16, no LUT), keeps an
// online softmax, and accumulates O^T = V^T P^T with a second mma from value centroids gathered
// the same way. One read of a KV head's codes serves all query heads of its group.
// Partials (m, l, o) are merged by log-sum-exp in a second kernel that also attends over the
// fp16 segments.
#include <cstddef>
#include <cstdint>

namespace vq::cuda {

// An fp16 key/value run per row, e.g. the cache's residual window or, in prefill, the current
// chunk (with len[b] = position in chunk + 1 for causality).
struct F16Segment {
  const uint16_t* const* k = nullptr;  // [rows] device array of device pointers; element
  const uint16_t* const* v = nullptr;  //   (h, t, c) at k[b] + h*head_stride + t*token_stride + c (fp16 bits)
  const int* len = nullptr;            // [rows] tokens per row (device); null: segment absent
  int64_t head_stride = 0;             // elements
  int64_t token_stride = 0;            // elements
  bool keys_transformed = false;       // true: keys are in the transformed space (score with q_code)
};

// Split kernel of the decode attention. Only the measured winners ship (docs/CUDA_NOTES.md
// section 3: v2 gather-mma for every shape, v4 LUT for the 8-bit d4/d8 shapes); the losing
// variants (v3b fp32 LUT, v5 20-warp LUT) are in bench/cuda with their measured times.
enum class PQAttnKernel {
  automatic,   // the LUT kernel where it applies (and fits in shared memory), else gather-mma
  gather_mma,  // v2: any supported shape
  lut,         // v4: 8-bit keys with head_dim/k_sub_dim in {16, 32}, values d4 8-bit (one shared book,
               // or per-sub-space books since the paged runtime), head_dim 64 or 128; other shapes throw
};
const char* pq_attn_kernel_name(PQAttnKernel k);  // "auto", "gather_mma", "lut"

struct PQAttnBatchArgs {
  int rows = 0;
  int n_kv_heads = 0;
  int group = 1;        // query heads per KV head (GQA), any >= 1
  int head_dim = 0;     // 64, 128 or 256
  int k_sub_dim = 4, k_bits = 8;  // sub_dim in {4, 8, 16} with (head_dim/8) % sub_dim == 0; bits 1..16
  bool k_per_subspace = false;
  int v_sub_dim = 4, v_bits = 8;
  bool v_per_subspace = false;

  const float* q_code = nullptr;   // [rows, n_kv_heads*group, head_dim] f32: q~ * scale
  const float* q_plain = nullptr;  // [rows, n_kv_heads*group, head_dim] f32: q * scale (fp16 segments)

  const uint8_t* const* k_codes = nullptr;  // [rows] device pointers, each [n_kv_heads][code_head_stride][k row bytes],
  const uint8_t* const* v_codes = nullptr;  //   16-byte aligned; rows of code_row_bytes(head_dim/sub_dim, bits)
  const int* n_coded = nullptr;             // [rows] coded tokens (device)
  int64_t code_head_stride = 0;             // tokens between heads: a multiple of 16
  int max_coded = 0;                        // host copy of max(n_coded): sizes the split grid

  const uint16_t* k_book = nullptr;  // [n_kv_heads, k_books, 2^k_bits, k_sub_dim] fp16 (see codebook_to_f16_device)
  const uint16_t* v_book = nullptr;  // [n_kv_heads, v_books, 2^v_bits, v_sub_dim] fp16

  F16Segment seg[2];

  float* out = nullptr;         // [rows, n_kv_heads*group, head_dim] f32
  void* workspace = nullptr;    // pq_attention_workspace_bytes(args) bytes of device memory
  size_t workspace_bytes = 0;
  int split_tokens = 0;         // tokens per split block; 0 = choose from the device's SM count
  PQAttnKernel kernel = PQAttnKernel::automatic;
};

// Throws vq::Error naming the field unless the arguments are supported.
void check_pq_attention_args(const PQAttnBatchArgs& a);
size_t pq_attention_workspace_bytes(const PQAttnBatchArgs& a);
// Asynchronous on `stream` (cudaStream_t; nullptr = default stream).
void pq_attention_device(const PQAttnBatchArgs& a, void* stream = nullptr);

// dst[i] = fp16(src[i]) for i < n (device pointers): codebooks for the attention kernel.
void f32_to_f16_device(const float* src, uint16_t* dst, int64_t n, void* stream = nullptr);

}  // namespace vq::cuda
