#include "cli_checks.h"

#include <cmath>

#include "codec/calibration_check.h"
#include "core/error.h"
#include "core/text_escape.h"
#include "kvcache/kv_method.h"

namespace vq::cli {

void check_cache_flags(const KVCacheConfig& cfg, const std::string& calib_flag) {
  VQ_CHECK(calib_flag.empty() || kv_method(cfg.method).needs_calibration(),
           "--calib: the kv cache {} uses no calibration (only vecinfer does)", cfg.name());
}

void check_cache_fits_model(const KVCacheConfig& cfg, const Model& model, const std::string& model_path) {
  try {
    cfg.validate(model.config().head_dim);
  } catch (const Error& e) {
    VQ_FAIL("--kv-cache {} does not fit {} (head_dim {}): {}", cfg.name(), model_path, model.config().head_dim,
            e.what());
  }
}

KVSpec make_checked_spec(KVCacheConfig cfg, const Model& model, const std::string& calib_path, bool auto_calib) {
  if (kv_method(cfg.method).needs_calibration() && !calib_path.empty()) {
    auto calib = std::make_shared<const Calibration>(load_calibration(calib_path));
    if (auto_calib)
      cfg.granularity = calib->granularity == Granularity::shared ? CodebookGranularity::shared
                                                                  : CodebookGranularity::per_subspace;
    try {
      check_calibration_matches(*calib, cfg, model.kv_geometry(), model.config().n_layers);
    } catch (const Error& e) {
      VQ_FAIL("{}: {}", calib_path, e.what());
    }
    cfg.calibration = std::move(calib);
    return make_kv_spec(cfg);
  }
  return make_kv_spec(cfg, calib_path);
}

void check_weights_finite(const Model& model, const std::string& model_path) {
  for (const GGUFTensorInfo& t : model.gguf().tensors()) {
    if (!ggml_type_supported(t.type) || t.dims.empty()) continue;  // unused, or refused where used
    const int64_t at = find_non_finite(t.type, t.data, t.numel());
    VQ_CHECK(at < 0, "{}: tensor '{}' ({}) holds a NaN or inf {} at element {}", model_path, t.name,
             ggml_type_name(t.type), ggml_block_elems(t.type) == 1 ? "value" : "block scale", at);
  }
}

void check_logits_finite(const float* logits, int n_vocab, int64_t pos) {
  for (int i = 0; i < n_vocab; ++i)
    VQ_CHECK(std::isfinite(logits[i]),
             "the model produced a non-finite logit ({} for token id {}) at position {}: its weights or the KV "
             "cache hold NaN or inf values",
             logits[i], i, pos);
}

std::string printable(const std::string& text) { return escape_control(text); }

}  // namespace vq::cli
