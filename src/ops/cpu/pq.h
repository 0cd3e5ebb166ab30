#pragma once
// Fast CPU product-quantization encode/decode: same contract as vq::ref (ops/ref/pq.h).
// pq_encode is the fused nearest-centroid search: SIMD through Highway (runtime dispatch),
// register-blocked with the running min/argmin in registers, threads across n (vq::parallel_for),
// fp32. It allocates no [n, k, d] or [n, k] temporaries: only a transposed copy of the
// codebook(s) (k*d floats per book).
#include <cstdint>

#include "ops/pq_shape.h"

namespace vq::cpu {

// x: [n, n_sub*sub_dim] f32 row-major; codebooks: [pq_n_books, n_centroids, sub_dim] f32;
// codes: [n, n_sub] uint16, nearest centroid (squared L2; ties may pick either; NaN -> code 0).
void pq_encode(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes);

// out: [n, n_sub*sub_dim] f32 = gathered centroids. Codes >= n_centroids throw vq::Error.
void pq_decode(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out);

}  // namespace vq::cpu
