#include "kvcache/factory.h"

#include <fmt/format.h>

#include "core/error.h"
#include "codec/calibration_file.h"
#include "kvcache/kv_method.h"
#include "kvcache/pooled_cache.h"
#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace vq {

std::string calibration_howto(const KVCacheConfig& c) {
  return fmt::format(
      "{} needs calibration data (codebooks trained on the model's real keys/values): make it with "
      "`veloxquant calibrate -m MODEL --text FILE --kv-cache {} -o FILE.vqcal` and pass --calib FILE.vqcal",
      c.name(), c.name());
}

// use_gpu_kernels: require fails here (construction) without a usable device. Standalone caches
// run on the CPU; the GPU design is the device pool (KVStoreOptions::device = KVDevice::cuda),
// which the engine chooses (--device cuda). The former per-layer GPU cache (vecinfer_gpu.cpp)
// was retired for it.
static void check_gpu_switch(const KVCacheConfig& c) {
  if (c.use_gpu_kernels != GpuKernels::require) return;
#ifdef VQ_HAVE_CUDA
  VQ_CHECK(cuda::cuda_device_available(), "kv_cache.use_gpu_kernels: require but no CUDA device can be used ({})",
           cuda::cuda_unavailable_reason());
#else
  VQ_FAIL("kv_cache.use_gpu_kernels: require but no CUDA device can be used (this build has no CUDA backend)");
#endif
}

void check_geometry(const KVGeometry& g, const char* who) {
  VQ_CHECK(g.n_kv_heads >= 1, "{}: n_kv_heads = {} must be >= 1", who, g.n_kv_heads);
  VQ_CHECK(g.n_heads >= 1 && g.n_heads % g.n_kv_heads == 0, "{}: n_heads = {} must be a positive multiple of n_kv_heads = {}",
           who, g.n_heads, g.n_kv_heads);
  VQ_CHECK(g.head_dim >= 1 && g.head_dim <= 1024, "{}: head_dim = {} must be in 1..1024", who, g.head_dim);
}

KVSpec make_kv_spec(const KVCacheConfig& config, const std::string& calib_path) {
  config.validate();
  check_gpu_switch(config);
  KVSpec spec{config, config.calibration};
  if (kv_method(config.method).needs_calibration() && !spec.calibration) {
    const std::string path = !calib_path.empty() ? calib_path : config.calibration_file;
    VQ_CHECK(!path.empty(), "{}", calibration_howto(config));
    spec.calibration = std::make_shared<const Calibration>(load_calibration(path));
  }
  return spec;
}

KVCacheFactory make_kv_cache_factory(const KVSpec& spec) {
  return [spec](int layer, const KVGeometry& g) -> std::unique_ptr<KVCache> {
    check_geometry(g, (spec.name() + " cache").c_str());
    spec.config.validate(g.head_dim);
    return std::make_unique<PooledCache>(g, spec, layer);
  };
}

KVCacheFactory make_kv_cache_factory(const KVCacheConfig& config, const std::string& calib_path) {
  return make_kv_cache_factory(make_kv_spec(config, calib_path));
}

}  // namespace vq
