#include "codec/calibration_check.h"

#include "core/error.h"

namespace vq {

namespace {
// Names built here rather than with KVCacheConfig::name(), which lives a layer up (kvcache).
const char* granularity_name(CodebookGranularity g) {
  return g == CodebookGranularity::shared ? "shared" : "per_subspace";
}
std::string preset(int sub_dim, int bits) { return fmt::format("d{}b{}", sub_dim, bits); }
}  // namespace

void check_calibration_matches(const Calibration& c, const KVCacheConfig& cfg, const KVGeometry& g, int n_layers) {
  VQ_CHECK(cfg.method == KVMethod::vecinfer, "calibration: only a vecinfer kv cache uses a calibration");
  VQ_CHECK(c.n_layers == n_layers, "calibration: n_layers = {} but the model has {}", c.n_layers, n_layers);
  VQ_CHECK(c.n_kv_heads == g.n_kv_heads, "calibration: n_kv_heads = {} but the model has {}", c.n_kv_heads,
           g.n_kv_heads);
  VQ_CHECK(c.head_dim == g.head_dim, "calibration: head_dim = {} but the model has {}", c.head_dim, g.head_dim);
  const std::string how =
      fmt::format("(make a matching file with `veloxquant calibrate --kv-cache vecinfer:k={},v={},gran={}`)",
                  preset(cfg.key.sub_dim, cfg.key.bits), preset(cfg.value.sub_dim, cfg.value.bits),
                  granularity_name(cfg.granularity));
  VQ_CHECK(c.key.sub_dim == cfg.key.sub_dim && c.key.bits == cfg.key.bits,
           "calibration: key codebooks are {} but the cache spec asks for k={} {}", preset(c.key.sub_dim, c.key.bits),
           preset(cfg.key.sub_dim, cfg.key.bits), how);
  VQ_CHECK(c.value.sub_dim == cfg.value.sub_dim && c.value.bits == cfg.value.bits,
           "calibration: value codebooks are {} but the cache spec asks for v={} {}",
           preset(c.value.sub_dim, c.value.bits), preset(cfg.value.sub_dim, cfg.value.bits), how);
  const bool same = (c.granularity == Granularity::shared) == (cfg.granularity == CodebookGranularity::shared);
  VQ_CHECK(same, "calibration: granularity is {} but the cache spec says gran={} (add gran={} to the spec, or {}",
           granularity_name(c.granularity), granularity_name(cfg.granularity), granularity_name(c.granularity),
           how.substr(1));
}

void check_calibration_model(const Calibration& c, const std::string& model_file_name,
                             const std::string& model_general_name) {
  const std::string stem = model_file_name.size() > 5 &&
                                   model_file_name.compare(model_file_name.size() - 5, 5, ".gguf") == 0
                               ? model_file_name.substr(0, model_file_name.size() - 5)
                               : model_file_name;
  const bool same = (!c.model.empty() && (c.model == model_file_name || c.model == stem)) ||
                    (!model_general_name.empty() && c.model == model_general_name);
  VQ_CHECK(same,
           "calibration: made for model '{}', not this one ({}{}); its codebooks are for that model's activations "
           "(make one with `veloxquant calibrate -m {}`)",
           c.model, model_file_name,
           model_general_name.empty() ? std::string() : fmt::format(", general.name '{}'", model_general_name),
           model_file_name);
}

}  // namespace vq
