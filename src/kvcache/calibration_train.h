#pragma once
// Trains VecInfer calibration (smoothing factors + key/value codebooks per layer and KV head)
// from collected keys and values. The model-level driver (eval/calibrate.h) collects them.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "codec/calibration_file.h"
#include "veloxquant/config.h"

namespace vq {

inline constexpr int64_t kMaxCalibPositionSpan = 32768;

struct CalibTrainOptions {
  int kmeans_iters = 12;
  uint64_t seed = 1234;
  int max_points_per_centroid = 64;  // k-means subsample: 2^bits * this points per codebook
  // The collected tokens are sequences of segment_tokens each (0: one sequence), each run from an
  // empty cache. The first skip_tokens of every sequence are left out of the smoothing factors and
  // the codebooks: they are the attention sinks a VecInfer cache keeps in fp16 (sink_tokens) and
  // never encodes, and their keys/values are atypical (measured: training without them lowers the
  // KL vs fp16 of SmolLM2 d4b8 from 0.029 to 0.027).
  int segment_tokens = 0;
  int skip_tokens = 4;
  // Query energy per layer (issue 18): query_energy[l]: [n_kv_heads * head_dim], the mean square of
  // each channel of the post-RoPE queries of that KV head's query heads over the calibration text.
  // Given, the smoothing factors are query-aware (codec/key_transform.h smoothing_from_energy);
  // empty, they come from the keys' absolute maxima alone (VecInfer's original rule).
  std::vector<std::vector<double>> query_energy;
  // The model-level trainer (eval/calibrate.h) fills query_energy from its recording when true.
  bool query_aware = true;
  // The key transform (codec/calibration_file.h KeyTransform). learned needs query_moment and
  // per-sub-space books: query_moment[l]: [n_kv_heads, head_dim, head_dim], the second moment of the
  // post-RoPE queries of each KV head's query heads (the model-level trainer fills it from its
  // recording); the map of each (layer, KV head) comes from it and the keys' covariance
  // (codec/learned_key_map.h), the smoothing factors are 1.
  KeyTransform key_transform = KeyTransform::hadamard;
  std::vector<std::vector<double>> query_moment;
  // For the model-level trainer (eval/calibrate.h calibrate_model): key_transform is chosen there by
  // default_key_transform, once the tokens it trains on are known.
  bool key_transform_auto = false;
  // For the model-level recorder (eval/calibrate.h record_kv): keys and queries re-rotated to random
  // positions in [0, position_span). -1: the model's trained context, at most kMaxCalibPositionSpan;
  // 0 (the default): the positions the calibration text ran at. Measured (docs/QUALITY.md): a span
  // far past the evaluated context costs quality there, so it is not the default.
  int64_t position_span = 0;
  // For the model-level trainer (eval/calibrate.h calibrate_recording): the rotated key mean's segment
  // (Calibration::key_mean_tokens; codec/key_mean.h); 0: keys coded with their mean. The CLI, the API
  // and the first-use recipe use kKeyMeanTokens.
  int key_mean_tokens = 0;
  // For the model-level trainer (eval/calibrate.h calibrate_model): after training, the new cache is
  // compared with fp16 on up to this many tokens of the text that follow the ones trained on
  // (Calibration::check; 0 or no tokens left: not measured).
  int held_out_tokens = 1024;
  // Called after each finished (layer, head, K/V) job with (done, total); from worker threads,
  // serialised by the trainer.
  std::function<void(int, int)> progress;
};

// The key transform of a calibration with books of cfg from train_tokens tokens of keys of head_dim
// channels (the first use, and `calibrate`'s auto): learned (docs/QUALITY.md "Learned key
// transform") for per-sub-space books from at least kLearnedKeyTokensPerChannel tokens per channel;
// else Walsh-Hadamard: for shared books, which the learned map's uneven sub-spaces do not suit; and
// from fewer tokens, where the map's head_dim x head_dim covariances are estimated too noisily
// (measured on Gemma 3, head_dim 256: from 2048 tokens the learned map's KL was 6% above the
// rotation's, from 8192 29% below).
inline constexpr int kLearnedKeyTokensPerChannel = 16;
KeyTransform default_key_transform(const KVCacheConfig& cfg, int64_t train_tokens, int head_dim);

// k[l], v[l]: [n_tokens, n_kv_heads, head_dim] f32 row-major, the post-RoPE keys / values of
// layer l. Granularity follows cfg.granularity; per_subspace needs >= 2^bits tokens left after
// the skipped ones.
Calibration train_calibration(const KVCacheConfig& cfg, int n_kv_heads, int head_dim,
                              const std::vector<const float*>& k, const std::vector<const float*>& v,
                              int64_t n_tokens, const CalibTrainOptions& opt, const std::string& model);

// The rotated key mean (codec/key_mean.h) fitted on a recording: per layer the pre-RoPE mean of
// the keys k[l] ([n_tokens, n_kv_heads, head_dim], post-RoPE, token t at position pos[t]; tokens
// with use[t] false left out) on the rotary pairs slow enough for segments of T tokens, and the
// keys with it removed, which the codebooks train on exactly as the cache removes it before coding.
// freqs[l]: layer l's rotary inverse frequencies [n_rot / 2] (radians per token).
struct FittedKeyMean {
  std::vector<std::vector<float>> means;    // [n_layers][n_kv_heads * head_dim]
  std::vector<std::vector<float>> centred;  // [n_layers][n_tokens * n_kv_heads * head_dim]
};
FittedKeyMean fit_rotated_key_mean(const std::vector<const float*>& k, const int64_t* pos, const std::vector<bool>& use,
                                   int64_t n_tokens, int n_kv_heads, int head_dim, int n_rot, bool neox,
                                   const std::vector<std::vector<double>>& freqs, int T);
// Gives cal the fitted means (moved out of fit) with their rotary layout, and validates it.
void attach_key_mean(Calibration& cal, FittedKeyMean&& fit, const std::vector<std::vector<double>>& freqs, int n_rot,
                     bool neox, int T);

// What train_calibration_with_key_mean needs to fit the rotated key mean first (T = 0: none):
// the tokens' positions and use flags, and the rotary layout (as fit_rotated_key_mean).
struct KeyMeanFitSpec {
  int T = 0;
  const int64_t* pos = nullptr;          // [n_tokens]
  const std::vector<bool>* use = nullptr;  // [n_tokens]
  int n_rot = 0;
  bool neox = true;
  std::vector<std::vector<double>> freqs;  // [n_layers][n_rot / 2]
};
// The CLI's and the PyTorch bridge's trainer: with km.T > 0 the rotated key mean is fitted on k,
// the codebooks train on the centred keys and the calibration carries the means; otherwise
// train_calibration as it is.
Calibration train_calibration_with_key_mean(const KVCacheConfig& cfg, int n_kv_heads, int head_dim,
                                            std::vector<const float*> k, const std::vector<const float*>& v,
                                            int64_t n_tokens, const CalibTrainOptions& opt, const std::string& model,
                                            const KeyMeanFitSpec& km);

// A calibration with random contents for speed work and device-parity tests where only the
// shapes matter: smoothing factors 1 + |N(0, 0.1)|, codebooks N(0, scale^2) (granularity from cfg).
Calibration random_calibration(const KVCacheConfig& cfg, int n_layers, int n_kv_heads, int head_dim, uint64_t seed,
                               float scale = 1.0f);
// Gives c a rotated key mean (codec/key_mean.h) with random contents, N(0, scale^2) on the rotary
// pairs of freqs [n_rot / 2] (radians per token, every layer) that turn slowly enough over a
// segment of T tokens to carry one (as the trainer keeps them), for speed work and parity tests.
void add_random_key_mean(Calibration& c, const std::vector<double>& freqs, int n_rot, bool neox, int T, uint64_t seed,
                         float scale = 3.0f);
// Gives c the learned key transform (codec/learned_key_map.h) with random maps M = diag(s) (I +
// spread G / sqrt(head_dim)), G and log s N(0, 1) and N(0, 0.3^2) per (layer, KV head): invertible and
// well conditioned at spread <= 0.5, for speed work and parity tests. Needs per-sub-space books.
void add_random_key_map(Calibration& c, uint64_t seed, float spread = 0.5f);

}  // namespace vq
