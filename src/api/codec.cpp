// veloxquant::ProductQuantizer over vq::ProductQuantizer (src/codec).
#include "api/impl.h"
#include "codec/product_quantizer.h"
#include "core/error.h"
#include "veloxquant/codec.h"

namespace veloxquant {

struct ProductQuantizer::Impl {
  vq::ProductQuantizer pq;
};

static vq::CodecParams params(PQPreset p) { return {p.sub_dim, p.bits}; }

ProductQuantizer::ProductQuantizer(int dim, PQPreset preset, CodebookGranularity granularity)
    : impl_(new Impl{vq::ProductQuantizer(dim, params(preset), to_internal(granularity))}) {}

ProductQuantizer::ProductQuantizer(int dim, PQPreset preset, CodebookGranularity granularity, const float* codebooks)
    : ProductQuantizer(dim, preset, granularity) {
  VQ_CHECK(codebooks != nullptr, "product quantizer: codebooks is null");
  const size_t n = size_t(impl_->pq.n_books()) * size_t(impl_->pq.n_centroids()) * size_t(preset.sub_dim);
  impl_->pq = vq::ProductQuantizer(dim, params(preset), to_internal(granularity),
                                   std::vector<float>(codebooks, codebooks + n));
}

ProductQuantizer::~ProductQuantizer() = default;
ProductQuantizer::ProductQuantizer(ProductQuantizer&&) noexcept = default;
ProductQuantizer& ProductQuantizer::operator=(ProductQuantizer&&) noexcept = default;
ProductQuantizer::ProductQuantizer(const ProductQuantizer& o) : impl_(std::make_unique<Impl>(*o.impl_)) {}
ProductQuantizer& ProductQuantizer::operator=(const ProductQuantizer& o) {
  if (this != &o) impl_ = std::make_unique<Impl>(*o.impl_);
  return *this;
}

void ProductQuantizer::train(const float* x, int64_t n, const TrainOptions& opt) {
  VQ_CHECK(x != nullptr || n == 0, "product quantizer: train data is null");
  vq::KMeansParams kp;
  kp.max_iters = opt.max_iters;
  kp.seed = opt.seed;
  kp.max_points_per_centroid = opt.max_points_per_centroid;
  impl_->pq.train(x, n, kp);
}

void ProductQuantizer::encode(const float* x, int64_t n, uint8_t* packed) const { impl_->pq.encode(x, n, packed); }
void ProductQuantizer::encode_codes(const float* x, int64_t n, uint16_t* codes) const {
  impl_->pq.encode_codes(x, n, codes);
}
void ProductQuantizer::decode(const uint8_t* packed, int64_t n, float* out) const { impl_->pq.decode(packed, n, out); }
void ProductQuantizer::decode_codes(const uint16_t* codes, int64_t n, float* out) const {
  // The decoder indexes codebooks with the codes unchecked; callers' arrays may hold anything.
  const int ns = impl_->pq.n_sub(), k = impl_->pq.n_centroids();
  for (int64_t i = 0; i < n * ns; ++i)
    VQ_CHECK(codes[i] < k, "product quantizer: decode: code {} at row {}, sub-vector {} is >= 2^bits = {}", codes[i],
             i / ns, i % ns, k);
  impl_->pq.decode_codes(codes, n, out);
}

size_t ProductQuantizer::code_size() const { return impl_->pq.code_size(); }
int ProductQuantizer::dim() const { return impl_->pq.dim(); }
int ProductQuantizer::n_sub() const { return impl_->pq.n_sub(); }
PQPreset ProductQuantizer::preset() const { return {impl_->pq.sub_dim(), impl_->pq.bits()}; }
CodebookGranularity ProductQuantizer::granularity() const { return to_public(impl_->pq.granularity()); }
int ProductQuantizer::n_books() const { return impl_->pq.n_books(); }
int ProductQuantizer::n_centroids() const { return impl_->pq.n_centroids(); }
bool ProductQuantizer::trained() const { return impl_->pq.trained(); }
const std::vector<float>& ProductQuantizer::codebooks() const { return impl_->pq.codebooks(); }

}  // namespace veloxquant
