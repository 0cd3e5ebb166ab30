// veloxquant::KVSpec over the spec parser and the cache factory (src/kvcache).
#include "core/error.h"
#include "api/impl.h"
#include "kvcache/factory.h"
#include "kvcache/kv_method.h"
#include "kvcache/spec_syntax.h"
#include "eval/calibrate.h"

namespace veloxquant {

// The spec is parsed in one place, vq::parse_kv_cache_spec over the KV method registry; every
// entry point below (and the CLI, which calls the same function) goes through it.
KVCacheConfig parse_kv_cache_config(const std::string& spec) { return vq::parse_kv_cache_spec(spec); }

std::vector<std::string> kv_cache_methods() { return vq::kv_method_presets(); }

std::string kv_cache_spec_help() { return vq::kv_cache_spec_syntax(); }

KVSpec KVSpec::parse(const std::string& spec, const std::string& calibration_file) {
  return ApiAccess::make_spec(vq::make_kv_spec(vq::parse_kv_cache_spec(spec), calibration_file));
}

KVSpec KVSpec::parse(const std::string& spec, const Calibration& calibration) {
  KVCacheConfig c = vq::parse_kv_cache_spec(spec);
  VQ_CHECK(vq::kv_method(c.method).needs_calibration(), "kv cache '{}': a calibration applies to vecinfer caches only",
           spec);
  c.calibration = calibration.data();
  return ApiAccess::make_spec(vq::make_kv_spec(c));
}

KVSpec KVSpec::from_config(const KVCacheConfig& config, const std::string& calibration_file) {
  return ApiAccess::make_spec(vq::make_kv_spec(config, calibration_file));
}

bool kv_cache_needs_calibration(const KVCacheConfig& config) { return vq::kv_method(config.method).needs_calibration(); }

KVSpec KVSpec::for_model(const Model& model, const std::string& spec, const std::string& calibration_file) {
  return for_model_config(model, vq::parse_kv_cache_spec(spec), calibration_file);
}

KVSpec KVSpec::for_model_config(const Model& model, const KVCacheConfig& config, const std::string& calibration_file,
                                const CalibrationProgress& progress, bool* made) {
  const Model::Impl& m = ApiAccess::model_impl(model);
  config.validate(m.info.head_dim);
  KVSpec out = ApiAccess::make_spec(vq::model_kv_spec(*m.model, m.info.path, m.is_default, config, calibration_file,
                                                      progress, made));
  check_spec_fits(out, model);
  return out;
}

void check_spec_fits(const KVSpec& spec, const Model& model) {
  const vq::KVSpec& s = ApiAccess::spec(spec);
  const ModelInfo& i = model.info();
  s.config.validate(i.head_dim);
  if (s.calibration) vq::check_calibration_geometry(*s.calibration, i.n_layers, i.n_kv_heads, i.head_dim);
}

const KVCacheConfig& KVSpec::config() const { return impl_->spec.config; }
std::string KVSpec::name() const { return impl_->spec.name(); }
double KVSpec::nominal_bits_per_element() const { return impl_->spec.config.nominal_bits_per_element(); }
bool KVSpec::has_calibration() const { return impl_->spec.calibration != nullptr; }

std::string KVSpec::quality_warning() const {
  return impl_->spec.calibration ? vq::calibration_quality_warning(impl_->spec.config, *impl_->spec.calibration) : "";
}

Calibration KVSpec::calibration() const {
  VQ_CHECK(impl_->spec.calibration, "kv cache {}: has no calibration (only vecinfer caches have one)", name());
  return ApiAccess::make_calibration(impl_->spec.calibration);
}

std::unique_ptr<KVCache> KVSpec::make_cache(int layer, const KVGeometry& geometry) const {
  VQ_CHECK(layer >= 0, "kv cache {}: layer {} must be >= 0", name(), layer);
  if (impl_->spec.calibration)
    VQ_CHECK(layer < impl_->spec.calibration->n_layers, "kv cache {}: layer {} but the calibration has {} layers",
             name(), layer, impl_->spec.calibration->n_layers);
  return vq::make_kv_cache_factory(impl_->spec)(layer, geometry);
}

KVCacheFactory KVSpec::cache_factory() const { return vq::make_kv_cache_factory(impl_->spec); }

}  // namespace veloxquant
