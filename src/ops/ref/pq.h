#pragma once
// Reference product-quantization encode/decode (plain scalar C++, obviously right).
// pq_encode is the "materialising" encoder of the original's pure-framework path: for a chunk
// of up to 4096 sub-vectors it builds the difference tensor [chunk, k, d], sums its squares to
// [chunk, k] and takes the argmin. It is the baseline of the quantize benchmark.
#include <cstddef>
#include <cstdint>

#include "ops/pq_shape.h"

namespace vq::ref {

// x: [n, n_sub*sub_dim] f32 row-major; codebooks: [pq_n_books, n_centroids, sub_dim] f32;
// codes: [n, n_sub] uint16 = index of the nearest centroid (squared L2, fp32; ties -> lowest index).
// A sub-vector containing NaN gets code 0 (no distance compares below NaN).
void pq_encode(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes);

// out: [n, n_sub*sub_dim] f32 = the centroids named by codes. Codes >= n_centroids throw.
void pq_decode(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out);

// Sub-vectors per chunk: 4096, reduced so that the difference tensor stays <= 64 MiB
// (for k*d > 4096, e.g. 4096 centroids of 16 floats).
int64_t pq_encode_chunk(const PQShape& s);
// Bytes of scratch pq_encode allocates (difference tensor + distance matrix of one chunk).
size_t pq_encode_scratch_bytes(const PQShape& s);

}  // namespace vq::ref
