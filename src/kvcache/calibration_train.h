#pragma once
// Trains VecInfer calibration (smoothing factors + key/value codebooks per layer and KV head)
// from collected keys and values. The model-level driver (model/calibrate.h) collects them.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "codec/calibration_file.h"
#include "veloxquant/config.h"

namespace vq {

struct CalibTrainOptions {
  int kmeans_iters = 12;
  uint64_t seed = 1234;
  int max_points_per_centroid = 64;  // k-means subsample: 2^bits * this points per codebook
  // Called after each finished (layer, head, K/V) job with (done, total); from worker threads,
  // serialised by the trainer.
  std::function<void(int, int)> progress;
};

// k[l], v[l]: [n_tokens, n_kv_heads, head_dim] f32 row-major, the post-RoPE keys / values of
// layer l. Granularity follows cfg.granularity; per_subspace needs n_tokens >= 2^bits.
Calibration train_calibration(const KVCacheConfig& cfg, int n_kv_heads, int head_dim,
                              const std::vector<const float*>& k, const std::vector<const float*>& v,
                              int64_t n_tokens, const CalibTrainOptions& opt, const std::string& model);

}  // namespace vq
