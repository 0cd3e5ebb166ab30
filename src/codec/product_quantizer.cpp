#include "codec/product_quantizer.h"

#include <algorithm>
#include <cmath>

#include "core/bitpack.h"
#include "core/error.h"

namespace vq {

namespace {
constexpr int64_t kRowsPerBlock = 2048;  // rows encoded per block before packing
}

ProductQuantizer::ProductQuantizer(int dim, CodecParams params, Granularity granularity)
    : dim_(dim), params_(params), granularity_(granularity) {
  const int d = params.sub_dim;
  VQ_CHECK(d == 2 || d == 4 || d == 8 || d == 16, "ProductQuantizer: sub_dim = {} must be 2, 4, 8 or 16", d);
  VQ_CHECK(params.bits >= 4 && params.bits <= 12, "ProductQuantizer: bits = {} must be in 4..12", params.bits);
  VQ_CHECK(dim >= 1 && dim % d == 0, "ProductQuantizer: dim = {} is not a positive multiple of sub_dim = {}", dim,
           d);
  VQ_CHECK(granularity == Granularity::shared || granularity == Granularity::per_subspace,
           "ProductQuantizer: granularity = {} unknown", uint32_t(granularity));
}

ProductQuantizer::ProductQuantizer(int dim, CodecParams params, Granularity granularity, std::vector<float> books)
    : ProductQuantizer(dim, params, granularity) {
  set_codebooks(std::move(books));
}

void ProductQuantizer::set_codebooks(std::vector<float> books) {
  const size_t want = size_t(n_books()) * n_centroids() * sub_dim();
  VQ_CHECK(books.size() == want, "ProductQuantizer: codebooks have {} floats, expected [{}, {}, {}] = {}",
           books.size(), n_books(), n_centroids(), sub_dim(), want);
  for (size_t i = 0; i < books.size(); ++i)
    VQ_CHECK(std::isfinite(books[i]), "ProductQuantizer: codebook value {} at {} is not finite", books[i], i);
  codebooks_ = std::move(books);
  const PQShape s{0, n_sub(), sub_dim(), n_centroids(), granularity_ == Granularity::per_subspace};
  encoder_ = std::make_shared<const cpu::PQEncoder>(s, codebooks_.data());
}

void ProductQuantizer::check_trained(const char* who) const {
  VQ_CHECK(trained(), "ProductQuantizer::{}: no codebooks (train first)", who);
}

size_t ProductQuantizer::code_size() const { return packed_row_bytes(n_sub(), bits()); }

void ProductQuantizer::train(const float* x, int64_t n, KMeansParams kp) {
  VQ_CHECK(n >= 1, "ProductQuantizer::train: n = {} rows, need at least 1", n);
  kp.k = n_centroids();
  const int d = sub_dim(), ns = n_sub();
  std::vector<float> books(size_t(n_books()) * kp.k * d);  // books: [n_books, k, d] f32
  try {
    if (granularity_ == Granularity::shared) {
      // [n, dim] row-major is exactly [n * n_sub, sub_dim]: every sub-vector is a point.
      const KMeansResult r = kmeans(x, n * ns, d, kp);
      std::copy(r.centroids.begin(), r.centroids.end(), books.begin());
    } else {
      std::vector<float> pts(size_t(n) * d);  // pts: [n, d] f32, sub-space j of every row
      const uint64_t seed = kp.seed;
      for (int j = 0; j < ns; ++j) {
        for (int64_t i = 0; i < n; ++i)
          std::copy(x + i * dim_ + int64_t(j) * d, x + i * dim_ + int64_t(j + 1) * d, pts.data() + i * d);
        kp.seed = seed + uint64_t(j);
        const KMeansResult r = kmeans(pts.data(), n, d, kp);
        std::copy(r.centroids.begin(), r.centroids.end(), books.begin() + int64_t(j) * kp.k * d);
      }
    }
  } catch (const Error& e) {
    VQ_FAIL("ProductQuantizer::train (dim {}, d{}b{}, {}): {}", dim_, d, bits(), granularity_name(granularity_),
            e.what());
  }
  set_codebooks(std::move(books));
}

void ProductQuantizer::encode_codes(const float* x, int64_t n, uint16_t* codes) const {
  check_trained("encode");
  VQ_CHECK(n >= 0, "ProductQuantizer::encode: n = {} must be >= 0", n);
  for (int64_t i = 0; i < n * dim_; ++i)
    VQ_CHECK(std::isfinite(x[i]), "ProductQuantizer::encode: x[{}][{}] = {} is not finite", i / dim_, i % dim_,
             x[i]);
  encoder_->encode(x, n, codes);
}

void ProductQuantizer::encode(const float* x, int64_t n, uint8_t* packed) const {
  const int ns = n_sub();
  const size_t row = code_size();
  std::vector<uint16_t> tmp(size_t(std::min(n, kRowsPerBlock)) * ns);  // tmp: [block rows, n_sub] uint16
  for (int64_t i0 = 0; i0 < n; i0 += kRowsPerBlock) {
    const int64_t m = std::min(kRowsPerBlock, n - i0);
    encode_codes(x + i0 * dim_, m, tmp.data());
    for (int64_t i = 0; i < m; ++i) pack_codes(tmp.data() + i * ns, ns, bits(), packed + (i0 + i) * row);
  }
}

void ProductQuantizer::decode_codes(const uint16_t* codes, int64_t n, float* out) const {
  check_trained("decode");
  const PQShape s{n, n_sub(), sub_dim(), n_centroids(), granularity_ == Granularity::per_subspace};
  cpu::pq_decode(s, codes, codebooks_.data(), out);
}

void ProductQuantizer::decode(const uint8_t* packed, int64_t n, float* out) const {
  check_trained("decode");
  const int ns = n_sub(), d = sub_dim(), k = n_centroids();
  const size_t row = code_size();
  const bool per = granularity_ == Granularity::per_subspace;
  for (int64_t i = 0; i < n; ++i)
    for (int j = 0; j < ns; ++j) {
      const uint32_t c = read_code(packed + i * row, j, bits());  // < 2^bits = k by construction
      const float* src = codebooks_.data() + ((per ? int64_t(j) * k : 0) + c) * d;
      std::copy(src, src + d, out + i * dim_ + int64_t(j) * d);
    }
}

}  // namespace vq
