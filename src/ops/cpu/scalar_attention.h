#pragma once
// Fast partial attention on integer-coded KV rows (Highway SIMD, runtime dispatch), continuing an
// online-softmax state (m, d, o) like vq::ref::dense_attention. Two formats:
//  - llama.cpp's q8_0 / q4_0 blocks of 32 (kvcache/scalar_cache.h): q8_0 = fp16 d + 32 int8,
//    x = d*q; q4_0 = fp16 d + 16 bytes, byte j holds element j (low nibble) and j+16 (high),
//    x = d*(nibble - 8).
//  - KIVI (kvcache/kivi_cache.h): keys per channel over groups of G tokens (fp16 scale[D],
//    min[D], then G rows of b-bit codes), values per token (fp16 (scale, min) per group of G
//    channels, then b-bit codes); x = min + scale * code, b in {2, 4}.
// Scores read each row once for all heads of the GQA group; no dequantized K/V tensor exists
// beyond one row in registers / L1.
#include <cstddef>
#include <cstdint>

namespace vq::cpu {

struct BlockQuantAttnArgs {
  int n_tokens = 0, group = 0, head_dim = 0;  // head_dim % 32 == 0
  bool q4 = false;                            // q4_0 rows, else q8_0
  const float* q = nullptr;                   // [group, head_dim] f32, already * scale
  const uint8_t* k_rows = nullptr;            // row t at k_rows + t * row_stride
  const uint8_t* v_rows = nullptr;
  size_t row_stride = 0;
  // Optional: the rows the next call will read (the next pool block), requested while this one
  // runs (the blocks are separate allocations the hardware prefetchers do not run into).
  const uint8_t* next_k_rows = nullptr;
  const uint8_t* next_v_rows = nullptr;
  int next_tokens = 0;
  float* m = nullptr;  // [group] running max (start -inf)
  float* d = nullptr;  // [group] running sum of exp
  float* o = nullptr;  // [group, head_dim] running sum exp(s - m) v
};
void block_quant_attention(const BlockQuantAttnArgs& a);

struct KiviAttnArgs {
  int n_tokens = 0, group = 0, head_dim = 0;
  int bits = 2;       // 2 or 4
  int kivi_group = 32;  // G: tokens per key group = channels per value group (head_dim % G == 0)
  const float* q = nullptr;  // [group, head_dim] f32, already * scale
  // Key groups: group i at k_groups + i * k_group_stride; token t (counted from group 0) is row
  // t % kivi_group of group t / kivi_group. The call covers tokens [first, first + n_tokens).
  const uint8_t* k_groups = nullptr;
  int first = 0;
  size_t k_group_stride = 0;
  const uint8_t* v_rows = nullptr;  // value row of token t at v_rows + t * v_stride (same counting)
  size_t v_stride = 0;
  float* m = nullptr;  // [group]
  float* d = nullptr;  // [group]
  float* o = nullptr;  // [group, head_dim]
};
void kivi_attention(const KiviAttnArgs& a);

}  // namespace vq::cpu
