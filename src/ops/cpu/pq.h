#pragma once
// Fast CPU product-quantization encode/decode: same contract as vq::ref (ops/ref/pq.h).
// pq_encode is the fused nearest-centroid search: SIMD through Highway (runtime dispatch),
// register-blocked (R sub-vectors x C vectors of centroids, the running min/argmin in
// registers), threads across n (vq::parallel_for), fp32. It allocates no [n, k, d] or [n, k]
// temporaries: only a transposed copy of the codebook(s) (k*d floats per book, padded).
#include <cstdint>
#include <cstddef>

#include "core/buffer.h"
#include "ops/pq_shape.h"

namespace vq::cpu {

// x: [n, n_sub*sub_dim] f32 row-major; codebooks: [pq_n_books, n_centroids, sub_dim] f32;
// codes: [n, n_sub] uint16, nearest centroid (squared L2; ties: lowest index, up to rounding
// of the distance form used). A sub-vector with NaN (or whose distances all overflow) -> code 0.
void pq_encode(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes);

// out: [n, n_sub*sub_dim] f32 = gathered centroids. Codes >= n_centroids throw vq::Error.
void pq_decode(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out);

// Name of the SIMD target the runtime dispatch chose (e.g. "AVX3", "AVX2", "NEON").
const char* simd_target_name();

// How distances are formed. direct: sum (x - c)^2 (2 ops per element: sub + fma).
// dot: |c|^2 - 2 x.c (1 fma per element; rounding error scales with |x|^2 + |c|^2, not with
// the distance). auto_select: the measured-faster one for the shape (see pq.cpp).
enum class PQDistance { auto_select, direct, dot };

// The codebook(s) in a SIMD-friendly layout, built once, reused across encode calls. This is the
// derived cache a codec holds; pq_encode builds a temporary one.
class PQEncoder {
 public:
  // books: [pq_n_books(s), n_centroids, sub_dim] f32 (s.n is ignored).
  PQEncoder(const PQShape& s, const float* books, PQDistance dist = PQDistance::auto_select);
  // x: [n, n_sub*sub_dim]; codes: [n, n_sub] uint16.
  void encode(const float* x, int64_t n, uint16_t* codes) const;
  PQDistance distance() const { return dist_; }
  // Bytes of the transposed layout (the encoder's only extra memory).
  size_t bytes() const { return ct_.size() * sizeof(float) + norms_.size() * sizeof(float); }

 private:
  PQShape s_;
  PQDistance dist_;
  int lanes_;                // SIMD lanes of the dispatched target (L)
  int c_vecs_;               // centroid vectors per register block (C)
  int64_t k_pad_;            // n_centroids rounded up to L * C
  AlignedBuffer<float> ct_;  // [n_books, k_pad / L, sub_dim, L] f32, L = SIMD lanes (padding: +inf)
  AlignedBuffer<float> norms_;  // [n_books, k_pad] f32, |c|^2 (dot form only; padding: +inf)
};

}  // namespace vq::cpu
