#include "kvcache/factory.h"

#include <fmt/format.h>

#include "core/error.h"
#include "codec/calibration_file.h"
#include "kvcache/dense_cache.h"
#include "kvcache/kivi_cache.h"
#include "kvcache/scalar_cache.h"
#include "kvcache/vecinfer_cache.h"
#include "kvcache/vecinfer_gpu.h"  // CUDA-2 hook
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

// use_gpu_kernels: require fails here (construction) without a usable device. The GPU attention
// path is the CUDA helper's; until a cache routes to it, auto and forbid both run on the CPU.
static void check_gpu_switch(const KVCacheConfig& c) {
  if (c.use_gpu_kernels != GpuKernels::require) return;
#ifdef VQ_HAVE_CUDA
  VQ_CHECK(cuda::cuda_device_available(), "kv_cache.use_gpu_kernels: require but no CUDA device can be used ({})",
           cuda::cuda_unavailable_reason());
#else
  VQ_FAIL("kv_cache.use_gpu_kernels: require but no CUDA device can be used (this build has no CUDA backend)");
#endif
}

KVCacheFactory make_kv_cache_factory(const KVCacheConfig& config, const std::string& calib_path) {
  config.validate();
  check_gpu_switch(config);
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
    case KVMethod::q8_0:
    case KVMethod::q4_0: {
      const bool q4 = config.method == KVMethod::q4_0;
      return [q4, config](int, const KVGeometry& g) -> std::unique_ptr<KVCache> {
        config.validate(g.head_dim);
        return std::make_unique<BlockQuantCache>(g, q4);
      };
    }
    case KVMethod::kivi:
      return [config](int, const KVGeometry& g) -> std::unique_ptr<KVCache> {
        return std::make_unique<KiviCache>(g, config);
      };
    case KVMethod::vecinfer: {
      std::shared_ptr<const Calibration> calib = config.calibration;
      const std::string path = !calib_path.empty() ? calib_path : config.calibration_file;
      if (!calib) {
        VQ_CHECK(!path.empty(), "{}", calibration_howto(config));
        calib = std::make_shared<const Calibration>(load_calibration(path));
      }
      return [config, calib](int layer, const KVGeometry& g) -> std::unique_ptr<KVCache> {
        // CUDA-2 hook (use_gpu_kernels routing): GPU-resident cache when allowed and a GPU is present.
        if (auto gpu = make_vecinfer_gpu_cache(g, config, calib, layer)) return gpu;
        return std::make_unique<VecInferCache>(g, config, calib, layer);
      };
    }
    default:
      VQ_FAIL("kv cache {}: not available in this build yet", config.name());
  }
}

}  // namespace vq
