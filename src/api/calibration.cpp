// veloxquant::Calibration over the calibration file and trainer (src/codec, src/kvcache,
// src/eval/calibrate).
#include <filesystem>

#include "api/impl.h"
#include "codec/key_mean.h"
#include "core/error.h"
#include "kvcache/calibration_train.h"
#include "eval/calibrate.h"
#include "veloxquant/calibration.h"

namespace veloxquant {

static_assert(kMinHeldOutTokens == vq::kMinHeldOutTokens, "the public and internal held-out minimum differ");

// key_transform "auto": from_model lets calibrate_model choose (by books and tokens); from
// arrays (no queries) it is the Walsh-Hadamard transform.
static vq::CalibTrainOptions train_options(const CalibrationOptions& o, bool from_model) {
  vq::CalibTrainOptions t;
  t.kmeans_iters = o.kmeans_iters;
  t.seed = o.seed;
  t.max_points_per_centroid = o.max_points_per_centroid;
  t.segment_tokens = o.segment_tokens;
  t.skip_tokens = o.skip_tokens;
  t.query_aware = o.query_aware;
  t.position_span = o.position_span;
  t.key_mean_tokens = o.key_mean_tokens >= 0 ? o.key_mean_tokens : vq::kKeyMeanTokens;
  t.held_out_tokens = o.held_out_tokens;
  VQ_CHECK(o.key_transform == "auto" || o.key_transform == "hadamard" || o.key_transform == "learned",
           "calibration: key_transform '{}' must be auto, hadamard or learned", o.key_transform);
  t.key_transform = o.key_transform == "learned" ? vq::KeyTransform::learned : vq::KeyTransform::hadamard;
  t.key_transform_auto = o.key_transform == "auto" && from_model;
  return t;
}

static Calibration make_handle(vq::Calibration c) {
  return ApiAccess::make_calibration(std::make_shared<const vq::Calibration>(std::move(c)));
}

Calibration::Calibration(std::shared_ptr<const vq::Calibration> data) : data_(std::move(data)) {
  VQ_CHECK(data_ != nullptr, "calibration: no data");
}

Calibration Calibration::load(const std::string& path) { return make_handle(vq::load_calibration(path)); }

Calibration Calibration::train(const KVCacheConfig& cfg, int n_kv_heads, int head_dim, const std::vector<const float*>& k,
                               const std::vector<const float*>& v, int64_t n_tokens, const CalibrationOptions& opt,
                               const std::string& model_name) {
  VQ_CHECK(cfg.method == KVMethod::vecinfer, "calibration: the config is {}, not a vecinfer cache", cfg.name());
  VQ_CHECK(!k.empty() && k.size() == v.size(), "calibration: {} key and {} value layers (need the same, >= 1)",
           k.size(), v.size());
  for (size_t l = 0; l < k.size(); ++l)
    VQ_CHECK(k[l] && v[l], "calibration: layer {} has a null key or value array", l);
  return make_handle(
      vq::train_calibration(cfg, n_kv_heads, head_dim, k, v, n_tokens, train_options(opt, false), model_name));
}

Calibration Calibration::from_model(const Model& model, const std::string& text, int max_tokens, const KVCacheConfig& cfg,
                                    const CalibrationOptions& opt, const CalibrationProgress& progress) {
  VQ_CHECK(cfg.method == KVMethod::vecinfer, "calibration: the config is {}, not a vecinfer cache", cfg.name());
  const Model::Impl& m = ApiAccess::model_impl(model);
  const std::string name = std::filesystem::path(m.info.path).filename().string();
  return make_handle(
      vq::calibrate_model(*m.model, text, max_tokens, cfg,
                          train_options(opt, true), name, progress, to_internal(opt.device)));
}

void Calibration::save(const std::string& path) const { vq::save_calibration(path, *data_); }

int Calibration::n_layers() const { return data_->n_layers; }
int Calibration::n_kv_heads() const { return data_->n_kv_heads; }
int Calibration::head_dim() const { return data_->head_dim; }
PQPreset Calibration::key_preset() const { return {data_->key.sub_dim, data_->key.bits}; }
PQPreset Calibration::value_preset() const { return {data_->value.sub_dim, data_->value.bits}; }
CodebookGranularity Calibration::granularity() const { return to_public(data_->granularity); }
int Calibration::key_books() const { return data_->key_books(); }
int Calibration::value_books() const { return data_->value_books(); }
uint64_t Calibration::n_calib_tokens() const { return data_->n_calib_tokens; }
int Calibration::key_mean_tokens() const { return data_->key_mean_tokens; }
std::string Calibration::key_transform() const { return vq::key_transform_name(data_->key_transform); }
std::string Calibration::model_name() const { return data_->model; }
CalibrationCheck Calibration::held_out_check() const {
  const vq::CalibrationCheck& k = data_->check;
  return {int(k.tokens), k.kl, k.top1, k.ppl_ratio};
}

static const vq::CalibrationLayer& layer_of(const vq::Calibration& c, int layer) {
  VQ_CHECK(layer >= 0 && layer < c.n_layers, "calibration: layer {} out of range [0, {})", layer, c.n_layers);
  return c.layers[size_t(layer)];
}
const float* Calibration::smoothing(int layer) const { return layer_of(*data_, layer).smoothing.data(); }
const float* Calibration::key_codebooks(int layer) const { return layer_of(*data_, layer).key_codebooks.data(); }
const float* Calibration::value_codebooks(int layer) const { return layer_of(*data_, layer).value_codebooks.data(); }

void Calibration::check_fits(int n_layers, int n_kv_heads, int head_dim) const {
  vq::check_calibration_geometry(*data_, n_layers, n_kv_heads, head_dim);
}

vq::Granularity to_internal(CodebookGranularity g) {
  return g == CodebookGranularity::shared ? vq::Granularity::shared : vq::Granularity::per_subspace;
}
CodebookGranularity to_public(vq::Granularity g) {
  return g == vq::Granularity::shared ? CodebookGranularity::shared : CodebookGranularity::per_subspace;
}

}  // namespace veloxquant
