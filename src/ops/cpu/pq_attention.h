#pragma once
// Fast attention on VecInfer codes (Highway SIMD, runtime dispatch); same contract as
// vq::ref::pq_attention (ops/ref/pq_attention.h). Per call: LUT[hg][j][c][KH] = q~_{KH hg+h},j . c
// for the group's heads, KH = pq_lut_heads(group) heads interleaved per entry (one load serves KH heads);
// tokens in blocks of 256, sub-spaces in passes whose tables stay in L1; online softmax per
// block; values decoded in registers (broadcast centroid x per-head weights, one FMA per
// sub-space and token). Design and measurements: docs/CPU_KV_NOTES.md.
#include <cstddef>
#include <vector>

#include "ops/ref/pq_attention.h"

namespace vq::cpu {

void pq_attention(const PQAttnArgs& a);

// Split form for callers that keep one query's tables across several key ranges.
// The channel-major key codebook: [k_books, k_sub_dim, 2^k_bits] from [k_books, 2^k_bits, k_sub_dim].
std::vector<float> transpose_codebook(const float* codebook, int books, int bits, int sub_dim);
// Heads per LUT entry for a GQA group: 8 where that pads the group to no more lanes than 4 does
// (groups of 5-8, 13-16, ...: one pass over the codes serves them), else 4.
int pq_lut_heads(int group);
size_t pq_lut_floats(const PQAttnArgs& a);  // ceil(group / KH) * KH * (head_dim / k_sub_dim) * 2^k_bits
// lut: [ceil(group / KH), head_dim / k_sub_dim, 2^k_bits, KH] f32, KH = pq_lut_heads(group) (lanes
// of absent heads are 0). k_codebook_t: transpose_codebook(a.k_codebook). With a.v_codebook set, its
// lines are requested into L2 during the build (the attention on the same head reads them next).
void pq_build_lut(const PQAttnArgs& a, const float* k_codebook_t, float* lut);
// The same tables for key sub-spaces [j0, j1) only (entries of other sub-spaces untouched), so that
// one query's build can be split over threads; the value-book request covers the same share.
void pq_build_lut_part(const PQAttnArgs& a, const float* k_codebook_t, float* lut, int j0, int j1);
// Continues the online-softmax state already in a.m, a.d, a.o (empty: -inf, 0, 0) over the
// a.n_tokens coded tokens, with tables from pq_build_lut.
void pq_attention_accumulate(const PQAttnArgs& a, const float* lut);

}  // namespace vq::cpu
