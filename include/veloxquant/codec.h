#pragma once
// ProductQuantizer on plain arrays: a vector of dim floats is cut into n_sub = dim / sub_dim
// sub-vectors, each replaced by the index of its nearest centroid in a codebook of 2^bits
// entries (one codebook shared by every sub-space, or one per sub-space). Packed codes are
// n_sub codes of `bits` bits each, little-endian bit order, code_size() bytes per vector.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "veloxquant/config.h"
#include "veloxquant/status.h"

namespace veloxquant {

struct TrainOptions {
  int max_iters = 25;                  // Lloyd iterations at most (k-means++ initialisation)
  uint64_t seed = 0;                   // per-subspace codebook j uses seed + j
  int max_points_per_centroid = 256;   // subsample to 2^bits * this points per codebook (0: all)
};

class ProductQuantizer {
 public:
  // Throws vq::Error unless preset.sub_dim is in {2,4,8,16}, preset.bits in 4..12 and dim a
  // multiple of sub_dim.
  ProductQuantizer(int dim, PQPreset preset, CodebookGranularity granularity = CodebookGranularity::per_subspace);
  // Already trained. codebooks: [n_books, 2^bits, sub_dim] float32 row-major, finite (copied).
  ProductQuantizer(int dim, PQPreset preset, CodebookGranularity granularity, const float* codebooks);
  ~ProductQuantizer();
  ProductQuantizer(ProductQuantizer&&) noexcept;
  ProductQuantizer& operator=(ProductQuantizer&&) noexcept;
  ProductQuantizer(const ProductQuantizer&);
  ProductQuantizer& operator=(const ProductQuantizer&);

  // x: [n, dim] float32 row-major, finite; n >= 2^bits (shared: n * n_sub >= 2^bits).
  void train(const float* x, int64_t n, const TrainOptions& opt = {});

  // x: [n, dim] float32; packed: [n, code_size()] bytes. Non-finite x throws naming row and column.
  void encode(const float* x, int64_t n, uint8_t* packed) const;
  // x: [n, dim] float32; codes: [n, n_sub] uint16 (one centroid index per sub-vector).
  void encode_codes(const float* x, int64_t n, uint16_t* codes) const;
  // packed: [n, code_size()]; out: [n, dim] float32.
  void decode(const uint8_t* packed, int64_t n, float* out) const;
  // codes: [n, n_sub] uint16, each < 2^bits; out: [n, dim] float32.
  void decode_codes(const uint16_t* codes, int64_t n, float* out) const;

  size_t code_size() const;  // bytes per packed vector: ceil(n_sub * bits / 8)
  int dim() const;
  int n_sub() const;
  PQPreset preset() const;
  CodebookGranularity granularity() const;
  int n_books() const;       // 1 (shared) or n_sub (per_subspace)
  int n_centroids() const;   // 2^bits
  bool trained() const;
  // [n_books, 2^bits, sub_dim] float32 row-major; empty before training. Valid until the next train().
  const std::vector<float>& codebooks() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace veloxquant
