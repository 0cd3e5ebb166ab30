#pragma once
// Checks the subcommands run before any expensive work, so that a bad option or input fails in
// one line at once rather than after minutes (docs/RELIABILITY.md lists the cases).
#include <memory>
#include <string>

#include "codec/calibration_file.h"
#include "kvcache/factory.h"
#include "model/model.h"

namespace vq::cli {

// Options that only a VecInfer cache uses (--calib) given with another method.
void check_cache_flags(const KVCacheConfig& cfg, const std::string& calib_flag);

// What depends on the model's geometry (head_dim divisibility, the Hadamard block), right after
// the model is mapped and before any calibration or generation.
void check_cache_fits_model(const KVCacheConfig& cfg, const Model& model, const std::string& model_path);

// The KV spec; for VecInfer it loads the calibration file once and checks it against the spec
// and the model (check_calibration_matches) before any session exists. When the file is the
// automatic first-use calibration (auto_calib), the spec's default granularity yields to the
// file's: that recipe picks shared codebooks for 12-bit presets.
KVSpec make_checked_spec(KVCacheConfig cfg, const Model& model, const std::string& calib_path, bool auto_calib);

// Every weight finite (find_non_finite over every supported tensor: the float values and the
// block scales), before generation: a NaN weight otherwise yields garbage with exit 0, and the
// attention's softmax can hide it from the logits. Costs one pass over the float tensors and a
// few bytes per quantized block, which the first forward pass reads anyway.
void check_weights_finite(const Model& model, const std::string& model_path);

// Logits [n_vocab] after position pos must be finite: NaN or inf weights (which the loader does
// not scan, that would read every weight) or an overflowing cache otherwise sample garbage
// with exit 0. Throws naming the position and the first bad entry.
void check_logits_finite(const float* logits, int n_vocab, int64_t pos);

// Text from a file (a prompt, an id list, a name) made safe to print on a terminal.
std::string printable(const std::string& text);

}  // namespace vq::cli
