#pragma once
// Model-level calibration for VecInfer: run the model over text, record every layer's real
// (post-RoPE) keys and values, train smoothing + codebooks (kvcache/calibration_train.h).
// Plus the first-use calibration of the default model, so `generate --kv-cache vecinfer:d4b8`
// works out of the box.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "codec/calibration_file.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/kv_pool.h"
#include "model/model.h"
#include "veloxquant/config.h"

namespace vq {

// Progress callback: (stage, done, total); stage is "prefill" or "train".
using CalibProgress = std::function<void(const char*, int, int)>;

// Reads a text file; ".gz" files through `gzip -dc`; HTML tags are stripped from ".html" files.
std::string read_text_file(const std::string& path);

// Every layer's post-RoPE keys and values of the model over ids, run with an fp16 cache as
// independent sequences of `segment` tokens: keys[l], values[l]: [n_tokens, n_kv_heads, head_dim].
// query_energy[l]: [n_kv_heads, head_dim], the mean square of each post-RoPE query channel over the
// tokens and the query heads of each KV head (for query-aware smoothing, calibration_train.h).
struct KVRecording {
  int64_t n_tokens = 0;
  std::vector<std::vector<float>> keys, values;
  std::vector<std::vector<double>> query_energy;
  // query_moment[l]: [n_kv_heads, head_dim, head_dim], the second moment of the same queries (for the
  // learned key transform); recorded only when asked (it is head_dim times query_energy's size).
  std::vector<std::vector<double>> query_moment;
  std::vector<int64_t> positions;  // [n_tokens] the position each token's keys were rotated to
  int segment = 0;                 // tokens per independent sequence
};
// position_span > 0: each token's keys and queries are re-rotated (RoPE) from the position they ran
// at to a random position in [0, position_span), so that codebooks trained on them cover every
// position a cache of that length holds, not only the calibration's (issue 18: Qwen2.5's key biases
// make post-RoPE keys drift with position; trained on positions < 2048 only, 2-bit codes fail at
// 8192). Values are kept as they are.
KVRecording record_kv(const Model& model, const std::vector<int32_t>& ids, int segment,
                      const CalibProgress& progress = {}, KVDevice device = KVDevice::cpu,
                      int64_t position_span = 0, bool query_moment = false);

// The position span record_kv uses for opt (CalibTrainOptions::position_span; -1: the model's
// trained context, at most kMaxCalibPositionSpan).
int64_t calib_position_span(const Model& model, const CalibTrainOptions& opt);

// Trains a calibration from a recording made with segments of opt.segment_tokens (0: 2048).
Calibration calibrate_recording(const Model& model, const KVRecording& rec, const KVCacheConfig& cfg,
                                const CalibTrainOptions& opt, const std::string& model_name,
                                const CalibProgress& progress = {});

// The cache of cfg with calibration `cal` against an fp16 cache on `ids` (tokens training did not
// see), as one window: the numbers stored in Calibration::check.
CalibrationCheck measure_calibration(const Model& model, const std::vector<int32_t>& ids, const KVCacheConfig& cfg,
                                     const Calibration& cal, KVDevice device = KVDevice::cpu);

// The fewest held-out tokens a calibration check scores (CalibTrainOptions::held_out_tokens; the
// public veloxquant::kMinHeldOutTokens, checked equal in src/api/calibration.cpp).
inline constexpr int kMinHeldOutTokens = 64;

// The KL vs fp16 this project targets for a 2-bit cache (issue 18). A calibration whose held-out
// check measured more gets calibration_quality_warning's message.
inline constexpr double kQualityTargetKL = 0.02;
// "" when cal's check is absent or within kQualityTargetKL, else one line: the cache, the measured
// numbers, and what to use instead.
std::string calibration_quality_warning(const KVCacheConfig& cfg, const Calibration& cal);

// The first-use calibration's recipe (resolve_calibration): the first kFirstUseCalibTokens tokens of
// the Jargon File, default training options, and this configuration for cfg. 8192 tokens (4 sequences
// of 2048): with 256 centroids per sub-space, 2048 tokens give 8 points per centroid and the books
// fit the calibration text; 8192 lowered the held-out KL vs fp16 of d4b8 on every model measured
// (docs/QUALITY.md, "Calibration size"), at about 4x the first-use time.
inline constexpr int kFirstUseCalibTokens = 8192;
// Wider heads take more: at least kFirstUseTokensPerChannel tokens per key channel, for the learned
// key transform's head_dim x head_dim covariances (Gemma 3, head_dim 256, 16384 tokens instead of
// 8192, context 2048: d4b8 KL 0.0294 -> 0.0268, k=d4b10,v=d8b12 0.0221 -> 0.0190; SmolLM2, head_dim
// 64, already has 128 per channel at 8192: the split preset 0.0179 -> 0.0180; docs/QUALITY.md).
inline constexpr int kFirstUseTokensPerChannel = 64;
int first_use_calib_tokens(int head_dim);
KVCacheConfig first_use_calib_config(const KVCacheConfig& cfg);

// Tokenizes text and keeps the first max_tokens tokens (throws if fewer than min_tokens); the
// opt.held_out_tokens after them (when the text has at least 64) make the held-out check.
// Runs them through the model (fp16 cache, on `device`) as independent sequences of opt.segment_tokens tokens
// (0: 2048, see calibrate.cpp) and trains the calibration (each sequence's first opt.skip_tokens
// left out: the cache keeps them in fp16).
Calibration calibrate_model(const Model& model, const std::string& text, int max_tokens, const KVCacheConfig& cfg,
                            const CalibTrainOptions& opt, const std::string& model_name,
                            const CalibProgress& progress = {}, KVDevice device = KVDevice::cpu);

// The Jargon File (Debian package jargon-text) if installed, else "".
std::string default_calibration_text_path();
// <cache>/calib/<first 16 hex of the model's sha256>-<preset><recipe>.vqcal (<cache>:
// core/cache_dir.h) for a model of head_dim channels per head; the recipe tag follows the key
// transform (default_key_transform) and names the tokens when they are more than
// kFirstUseCalibTokens (first_use_calib_tokens).
std::string default_calibration_path(const std::string& model_path, const KVCacheConfig& cfg, int head_dim);

// For vecinfer: calib_flag when given; else, for the default model, the cached first-use
// calibration (made now from the Jargon File when absent; recorded on the CPU, so that the file is
// the same whichever machine makes it, and one file serves caches on either device); else an error
// saying how to make one. Other methods: "". `made` is set when a new file was written.
std::string resolve_calibration(const Model& model, const std::string& model_path, bool is_default_model,
                                const KVCacheConfig& cfg, const std::string& calib_flag,
                                const CalibProgress& progress = {}, bool* made = nullptr);

// The KV spec a model runs with, assembled in one place for the CLI, the server and the public API
// (veloxquant::KVSpec::for_model): cfg and, for VecInfer, its calibration: calib_file when given,
// else resolve_calibration's (the first-use one of a known model, made now when absent). A
// calibration file is loaded once and checked against the spec and the model's geometry; a file the
// caller named must also record this model (check_calibration_model), while for the automatic one
// the spec's default granularity yields to the file's (that recipe picks shared codebooks for
// 12-bit presets). Errors about the file name it. cfg must fit the model (validate(head_dim)).
KVSpec model_kv_spec(const Model& model, const std::string& model_path, bool is_known_model, KVCacheConfig cfg,
                     const std::string& calib_file, const CalibProgress& progress = {}, bool* made = nullptr);

}  // namespace vq
