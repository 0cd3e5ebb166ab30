#pragma once
// Reference dense attention (plain scalar C++, double accumulation): the yardstick for every
// KV cache's attend(). Also the partial (online-softmax state) form the caches accumulate.
#include <cstddef>
#include <cstdint>

namespace vq::ref {

// Causal GQA attention over fp32 keys/values.
// q:   [n_q, n_heads, head_dim] f32 row-major; query i sits at position n_keys - n_q + i and
//      sees keys [0, n_keys - n_q + i].
// k,v: [n_keys, n_kv_heads, head_dim] f32 row-major.
// out: [n_q, n_heads, head_dim] f32. Query head h reads KV head h / (n_heads / n_kv_heads).
void attention(const float* q, int n_q, const float* k, const float* v, int64_t n_keys, int n_heads,
               int n_kv_heads, int head_dim, float scale, float* out);

// Partial attention of n_q queries (group heads each) of one KV head over n_keys contiguous
// key/value rows, accumulated into an online-softmax state.
struct DenseAttnArgs {
  int n_q = 0, group = 0, head_dim = 0;
  const float* q = nullptr;  // query i, head g at q + i*q_stride + g*head_dim (not scaled)
  int64_t q_stride = 0;
  float scale = 1.0f;
  // Keys are stored transposed (channel-major) so 16 keys' scores are 16 lanes of one FMA chain:
  // key t, channel c at k[c * k_stride + t] (k_stride >= n_keys). Values are row-major.
  const uint16_t* k16 = nullptr;  // [head_dim, k_stride] fp16 bits, or null and then k32
  const uint16_t* v16 = nullptr;  // [n_keys, head_dim] fp16 bits, or null and then v32
  const float* k32 = nullptr;     // [head_dim, k_stride] f32
  const float* v32 = nullptr;     // [n_keys, head_dim] f32
  int64_t k_stride = 0;  // vq::cpu needs a multiple of 16 (it reads whole vectors of keys)
  // Paged keys/values (block_tokens > 0; the KV store's blocks): key t of the call sits at slot
  // (first + t) % block_tokens of block (first + t) / block_tokens; in block b the keys are at
  // blocks[b] + k_offset bytes, channel-major [head_dim][block_tokens], and the values at
  // blocks[b] + v_offset bytes, row-major [block_tokens][head_dim]; fp16 unless paged_f32.
  // k16/v16/k32/v32 and k_stride are then unused. vq::cpu needs block_tokens % 16 == 0 and
  // readable memory for a vector past each key row (the block's value part follows its keys).
  const uint8_t* const* blocks = nullptr;
  int block_tokens = 0;
  int first = 0;
  size_t k_offset = 0, v_offset = 0;
  bool paged_f32 = false;
  int64_t n_keys = 0;
  const int64_t* n_visible = nullptr;  // [n_q]: query i sees rows [0, clamp(n_visible[i], 0, n_keys))
  float* m = nullptr;  // [n_q, group] running max (start: -inf)
  float* d = nullptr;  // [n_q, group] running sum of exp (start: 0)
  float* o = nullptr;  // [n_q, group, head_dim] running sum of exp(s - m) * v (start: 0)
};
void dense_attention(const DenseAttnArgs& a);

}  // namespace vq::ref
