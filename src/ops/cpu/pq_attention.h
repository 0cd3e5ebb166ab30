#pragma once
// Fast attention on VecInfer codes (Highway SIMD, runtime dispatch); same contract as
// vq::ref::pq_attention (ops/ref/pq_attention.h). Per call: LUT[g][j][c] = q~_g,j . c for the
// group's heads (vectorised over centroids from a channel-major copy of the key codebook);
// codes are unpacked per tile of 64 tokens, transposed so that 16 tokens' scores are 16 lanes
// of one gather-and-add chain; softmax is online per tile; values are decoded in registers
// (centroid slices assembled into full vectors) and accumulated with one FMA per head.
#include <cstddef>
#include <vector>

#include "ops/ref/pq_attention.h"

namespace vq::cpu {

void pq_attention(const PQAttnArgs& a);

// Split form for callers that keep one query's tables across several key ranges.
// The channel-major key codebook: [k_books, k_sub_dim, 2^k_bits] from [k_books, 2^k_bits, k_sub_dim].
std::vector<float> transpose_codebook(const float* codebook, int books, int bits, int sub_dim);
size_t pq_lut_floats(const PQAttnArgs& a);  // group * (head_dim / k_sub_dim) * 2^k_bits
// lut: [group, head_dim / k_sub_dim, 2^k_bits] f32. k_codebook_t: transpose_codebook(a.k_codebook).
void pq_build_lut(const PQAttnArgs& a, const float* k_codebook_t, float* lut);
// Continues the online-softmax state already in a.m, a.d, a.o (empty: -inf, 0, 0) over the
// a.n_tokens coded tokens, with tables from pq_build_lut.
void pq_attention_accumulate(const PQAttnArgs& a, const float* lut);

}  // namespace vq::cpu
