#pragma once
// Product quantizer: a vector of `dim` floats is cut into n_sub = dim / sub_dim sub-vectors,
// each replaced by the index of its nearest centroid in a codebook of 2^bits entries (one
// codebook shared by every sub-space, or one per sub-space). Codes are bit-packed
// (core/bitpack.h): code_size() = ceil(n_sub * bits / 8) bytes per vector.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "codec/calibration_file.h"  // CodecParams, Granularity
#include "codec/kmeans.h"
#include "ops/cpu/pq.h"

namespace vq {

class ProductQuantizer {
 public:
  // Throws vq::Error unless sub_dim in {2,4,8,16}, bits in 4..12 and dim divisible by sub_dim.
  ProductQuantizer(int dim, CodecParams params, Granularity granularity);
  // An already trained quantizer. codebooks: [n_books, 2^bits, sub_dim] f32 (finite).
  ProductQuantizer(int dim, CodecParams params, Granularity granularity, std::vector<float> codebooks);

  // x: [n, dim] f32 row-major, finite. k-means per codebook (kp.k is set to 2^bits; per-subspace
  // books use seed kp.seed + j). Shared: every sub-vector of every row is one training point.
  void train(const float* x, int64_t n, KMeansParams kp = {});

  // x: [n, dim] f32; packed: [n, code_size()] bytes. Non-finite x throws naming row and column.
  void encode(const float* x, int64_t n, uint8_t* packed) const;
  // x: [n, dim] f32; codes: [n, n_sub] uint16 (unpacked).
  void encode_codes(const float* x, int64_t n, uint16_t* codes) const;
  // packed: [n, code_size()]; out: [n, dim] f32.
  void decode(const uint8_t* packed, int64_t n, float* out) const;
  // codes: [n, n_sub] uint16; out: [n, dim] f32.
  void decode_codes(const uint16_t* codes, int64_t n, float* out) const;

  size_t code_size() const;  // bytes per packed vector
  int dim() const { return dim_; }
  int n_sub() const { return dim_ / params_.sub_dim; }
  int sub_dim() const { return params_.sub_dim; }
  int bits() const { return params_.bits; }
  int n_centroids() const { return 1 << params_.bits; }
  int n_books() const { return granularity_ == Granularity::shared ? 1 : n_sub(); }
  Granularity granularity() const { return granularity_; }
  bool trained() const { return !codebooks_.empty(); }
  // [n_books, 2^bits, sub_dim] f32
  const std::vector<float>& codebooks() const { return codebooks_; }

 private:
  void set_codebooks(std::vector<float> books);
  void check_trained(const char* who) const;
  int dim_;
  CodecParams params_;
  Granularity granularity_;
  std::vector<float> codebooks_;  // [n_books, 2^bits, sub_dim] f32
  // Derived from codebooks_ in set_codebooks() only: the transposed SIMD layout (+|c|^2).
  // Immutable, so copies of the quantizer share it.
  std::shared_ptr<const cpu::PQEncoder> encoder_;
};

}  // namespace vq
