#pragma once
// Attention on VecInfer codes (API.md). One call covers one KV head, `group` query heads (GQA)
// and n_tokens coded tokens; it returns the online-softmax partial (m, d, o) that the cache merges
// with its fp16 residual window (softmax_merge, ops/online_softmax.h).
//   vq::ref::pq_attention             : plain LUT form (LUT[j][c] = q~_j . c, score = sum of reads)
//   vq::ref::pq_attention_dequantized : decodes every K/V row, then attends (test yardstick)
//   vq::cpu::pq_attention             : SIMD version (ops/cpu/pq_attention.h)
#include <cstdint>

namespace vq {

struct PQAttnArgs {
  int n_tokens = 0;                  // tokens in the coded part
  int group = 0;                     // query heads sharing this KV head (GQA)
  int head_dim = 0;
  int k_sub_dim = 0, k_bits = 0, k_books = 0;  // k_books: 1 (shared) or head_dim / k_sub_dim
  int v_sub_dim = 0, v_bits = 0, v_books = 0;
  const float* q = nullptr;          // [group, head_dim] transformed queries (q~ = H(q*lambda)), already * scale
  const uint8_t* k_codes = nullptr;  // [n_tokens, packed_row_bytes(head_dim/k_sub_dim, k_bits)]
  const float* k_codebook = nullptr; // [k_books, 2^k_bits, k_sub_dim] (in the transformed key space)
  const uint8_t* v_codes = nullptr;  // [n_tokens, packed_row_bytes(head_dim/v_sub_dim, v_bits)]
  const float* v_codebook = nullptr; // [v_books, 2^v_bits, v_sub_dim] (original value space)
  // Paged codes (block_tokens > 0; vq::cpu::pq_attention_accumulate only): token t of the run
  // sits at slot (first + t) % block_tokens of block (first + t) / block_tokens, whose code rows
  // for this KV head start at k_blocks[b] / v_blocks[b]; k_codes / v_codes are then unused.
  const uint8_t* const* k_blocks = nullptr;
  const uint8_t* const* v_blocks = nullptr;
  int block_tokens = 0;
  int first = 0;
  // Score terms added per segment (VecInfer's rotated key mean, codec/key_mean.h): token t of the run
  // gets seg_bias[((seg_first + t) / seg_tokens) * group + g] added to its score for head g (already
  // * scale). Null: none.
  const float* seg_bias = nullptr;
  int seg_tokens = 0, seg_first = 0;
  float* m = nullptr;                // [group] out: max score
  float* d = nullptr;                // [group] out: sum exp(s - m)
  float* o = nullptr;                // [group, head_dim] out: sum_t exp(s_t - m) v_t (not normalised)
};

// Throws vq::Error naming the field unless the arguments are consistent.
void check_pq_attn_args(const PQAttnArgs& a, const char* who);
// The seg_bias term of run token t, head g (0 without seg_bias).
float seg_bias_at(const PQAttnArgs& a, int t, int g);

namespace ref {
// n_tokens == 0 -> m = -inf, d = 0, o = 0.
void pq_attention(const PQAttnArgs& a);
void pq_attention_dequantized(const PQAttnArgs& a);
}  // namespace ref

}  // namespace vq
