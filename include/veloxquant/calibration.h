#pragma once
// VecInfer calibration: per layer and KV head, the key smoothing factors and the key/value
// codebooks, trained by k-means on a model's real keys and values. A Calibration is an immutable,
// cheaply copied handle; KVSpec takes one in memory, or a file written by save() /
// `veloxquant calibrate`. File format: src/codec/calibration_file.h (versioned, checksummed).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "veloxquant/config.h"
#include "veloxquant/runtime.h"
#include "veloxquant/status.h"

namespace vq {
struct Calibration;  // the internal data; users hold it through veloxquant::Calibration
}

namespace veloxquant {

class Model;

// The fewest held-out tokens a calibration check scores (CalibrationOptions::held_out_tokens).
inline constexpr int kMinHeldOutTokens = 64;

struct CalibrationOptions {
  int kmeans_iters = 12;
  uint64_t seed = 1234;
  int max_points_per_centroid = 64;  // k-means subsample: 2^bits * this points per codebook
  // The recorded tokens are independent sequences of segment_tokens each (0: one sequence); the
  // first skip_tokens of each are left out of training: a VecInfer cache keeps those attention
  // sinks in fp16 and never encodes them.
  int segment_tokens = 0;
  int skip_tokens = 4;
  // from_model only. query_aware: smoothing factors from the recorded queries' energy as well as the
  // keys (docs/QUALITY.md); false: VecInfer's sqrt(max |k|). position_span > 0: the recorded keys and
  // queries re-rotated to random positions in [0, position_span) (0: the positions they ran at).
  bool query_aware = true;
  int64_t position_span = 0;
  // from_model only: the rotated key mean (docs/QUALITY.md "Rotated key mean"): the keys' pre-RoPE
  // mean, turned to each segment of this many tokens, is removed before coding and its exact score
  // added back in attention (on the CPU and the GPU). 0: keys coded with their mean; -1 (auto): 16;
  // on the GPU a power of two.
  int key_mean_tokens = -1;
  // How keys are turned before coding (docs/QUALITY.md "Learned key transform"): "hadamard": the
  // smoothing then the Walsh-Hadamard rotation; "learned": a dense map per (layer, KV head) from the
  // recorded keys and queries (from_model only; per-sub-space books; caches on either device);
  // "auto": learned for from_model with per-sub-space books from at least 16 tokens per key channel
  // (4096 at head_dim 256), else hadamard.
  std::string key_transform = "auto";
  // from_model only: after training, the new cache is compared with fp16 on up to this many tokens
  // of the text after the max_tokens trained on (held_out_check(); 0: not measured; otherwise at
  // least kMinHeldOutTokens, and the text must have that many left, or there is no check).
  int held_out_tokens = 1024;
  Device device = Device::cpu;  // where the model runs while recording
};

// The cache with a calibration against an fp16 cache on tokens its training did not see, measured
// when it was made (from_model) and stored in its file. tokens == 0: not measured.
struct CalibrationCheck {
  int tokens = 0;        // held-out tokens scored
  double kl = 0;         // mean KL(fp16 || this cache) of the next-token distributions, nats
  double top1 = 0;       // fraction of positions whose argmax agrees with fp16's
  double ppl_ratio = 0;  // perplexity with this cache / with fp16
};

// Progress of a long calibration: (stage, done, total); stage is "prefill", "train" or "check".
using CalibrationProgress = std::function<void(const char* stage, int done, int total)>;

class Calibration {
 public:
  // Throws vq::Error naming the path and the problem (missing, truncated, bad checksum, ...).
  static Calibration load(const std::string& path);
  // Trains from recorded keys/values. k[l], v[l]: [n_tokens, n_kv_heads, head_dim] float32,
  // row-major, the post-RoPE keys and the values of layer l (k.size() == v.size() == n_layers).
  // The key/value presets and the codebook granularity come from cfg (a vecinfer config).
  static Calibration train(const KVCacheConfig& cfg, int n_kv_heads, int head_dim,
                           const std::vector<const float*>& k, const std::vector<const float*>& v,
                           int64_t n_tokens, const CalibrationOptions& opt = {}, const std::string& model_name = "");
  // Runs the model over the first max_tokens tokens of text (fp16 cache), records every layer's
  // keys and values and trains on them (segment_tokens 0 here means 2048-token sequences).
  static Calibration from_model(const Model& model, const std::string& text, int max_tokens,
                                const KVCacheConfig& cfg, const CalibrationOptions& opt = {},
                                const CalibrationProgress& progress = {});

  // Written to a temporary name and renamed: a failed save leaves no partial file. Check the path
  // before a long from_model with check_output_path (files.h).
  void save(const std::string& path) const;

  int n_layers() const;
  int n_kv_heads() const;
  int head_dim() const;
  PQPreset key_preset() const;
  PQPreset value_preset() const;
  CodebookGranularity granularity() const;
  int key_books() const;    // codebooks per KV head: 1 (shared) or head_dim / key sub_dim
  int value_books() const;
  uint64_t n_calib_tokens() const;
  // The rotated key mean's segment (CalibrationOptions::key_mean_tokens); 0: none.
  int key_mean_tokens() const;
  // "hadamard" or "learned" (CalibrationOptions::key_transform).
  std::string key_transform() const;
  std::string model_name() const;
  CalibrationCheck held_out_check() const;
  // Arrays of layer l (0 <= l < n_layers(), else vq::Error), float32, row-major, owned by the
  // calibration (valid while any copy of this handle lives):
  const float* smoothing(int layer) const;        // [n_kv_heads, head_dim]
  const float* key_codebooks(int layer) const;    // [n_kv_heads, key_books, 2^key.bits, key.sub_dim]
  const float* value_codebooks(int layer) const;  // [n_kv_heads, value_books, 2^value.bits, value.sub_dim]
  // Throws vq::Error naming the mismatched field unless it fits a model of this geometry.
  void check_fits(int n_layers, int n_kv_heads, int head_dim) const;

  // The shared data, for KVCacheConfig::calibration (cfg.calibration = c.data()).
  std::shared_ptr<const vq::Calibration> data() const { return data_; }

 private:
  friend struct ApiAccess;  // src/api: makes handles from internal data
  explicit Calibration(std::shared_ptr<const vq::Calibration> data);
  std::shared_ptr<const vq::Calibration> data_;  // never null
};

}  // namespace veloxquant
