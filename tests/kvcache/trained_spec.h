#pragma once
// A KV spec for store-level tests (kvcache tests): for VecInfer, codebooks trained for a few
// k-means iterations on 512 random keys/values of geometry g, the same data for every layer.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "test_util.h"

namespace vq {

inline KVSpec trained_spec(const std::string& s, const KVGeometry& g, std::mt19937& rng, int n_layers, int kmeans_iters) {
  KVCacheConfig cfg = parse_kv_cache_spec(s);
  if (cfg.method == KVMethod::vecinfer) {
    const int n = 512;
    auto k = randn(size_t(n) * g.n_kv_heads * g.head_dim, rng), v = randn(size_t(n) * g.n_kv_heads * g.head_dim, rng);
    CalibTrainOptions opt;
    opt.kmeans_iters = kmeans_iters;
    std::vector<const float*> kp(size_t(n_layers), k.data()), vp(size_t(n_layers), v.data());
    cfg.calibration = std::make_shared<Calibration>(train_calibration(cfg, g.n_kv_heads, g.head_dim, kp, vp, n, opt, "random"));
  }
  return make_kv_spec(cfg);
}

}  // namespace vq
