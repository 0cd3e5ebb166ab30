#pragma once
// Geometry of a product-quantization encode/decode, shared by vq::ref, vq::cpu and vq::cuda.
#include <cstdint>

#include "core/error.h"

namespace vq {

struct PQShape {
  int64_t n;          // vectors
  int n_sub;          // sub-spaces per vector; a vector has n_sub * sub_dim floats
  int sub_dim;        // floats per sub-vector
  int n_centroids;    // entries per codebook (<= 65536: codes are uint16)
  bool per_subspace;  // true: one codebook per sub-space; false: one codebook shared by all
};

// Number of codebooks the shape addresses.
inline int pq_n_books(const PQShape& s) { return s.per_subspace ? s.n_sub : 1; }

// Throws vq::Error naming `who` and the field at fault unless the shape is usable.
inline void check_pq_shape(const PQShape& s, const char* who) {
  VQ_CHECK(s.n >= 0, "{}: n = {} must be >= 0", who, s.n);
  VQ_CHECK(s.n_sub >= 1, "{}: n_sub = {} must be >= 1", who, s.n_sub);
  VQ_CHECK(s.sub_dim >= 1 && s.sub_dim <= 256, "{}: sub_dim = {} must be in 1..256", who, s.sub_dim);
  VQ_CHECK(s.n_centroids >= 1 && s.n_centroids <= 65536, "{}: n_centroids = {} must be in 1..65536", who,
           s.n_centroids);
}

}  // namespace vq
