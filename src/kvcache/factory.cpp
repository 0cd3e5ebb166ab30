#include "kvcache/factory.h"

#include <fmt/format.h>

#include "core/error.h"
#include "kvcache/dense_cache.h"

namespace vq {

std::string calibration_howto(const KVCacheConfig& c) {
  return fmt::format(
      "{} needs calibration data (codebooks trained on the model's real keys/values): make it with "
      "`veloxquant calibrate -m MODEL --text FILE --kv-cache {} -o FILE.vqcal` and pass --calib FILE.vqcal",
      c.name(), c.name());
}

KVCacheFactory make_kv_cache_factory(const KVCacheConfig& config, const std::string& calib_path) {
  config.validate();
  switch (config.method) {
    case KVMethod::fp16:
    case KVMethod::fp32: {
      const bool fp32 = config.method == KVMethod::fp32;
      const int hd = config.head_dim;
      return [fp32, hd, config](int, const KVGeometry& g) -> std::unique_ptr<KVCache> {
        config.validate(g.head_dim);
        (void)hd;
        return std::make_unique<DenseCache>(g, fp32);
      };
    }
    default:
      VQ_FAIL("kv cache {}: not available in this build yet", config.name());
  }
}

}  // namespace vq
