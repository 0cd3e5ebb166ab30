#pragma once
// Does a calibration fit the cache spec and the model it is about to be used with? One place for
// the checks every VecInfer cache (CPU, GPU, the engine's pool) needs before it uses codebooks.
#include <string>

#include "codec/calibration_file.h"
#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"

namespace vq {

// Throws vq::Error naming the field at fault ("calibration: granularity is per_subspace but the
// cache spec says gran=shared", "calibration: n_layers = 30 but the model has 32", ...) unless
// cfg is a VecInfer spec whose key/value presets and granularity are the calibration's, and the
// calibration's layers, KV heads and head_dim are the model's.
void check_calibration_matches(const Calibration& c, const KVCacheConfig& cfg, const KVGeometry& geometry,
                               int n_layers);

// Throws vq::Error unless the calibration was made for this model: the model recorded in the file
// (`veloxquant calibrate` records the GGUF file's name) is the model's file name, that name
// without ".gguf", or its general.name. The geometry check above cannot tell two models of one
// shape apart; the codebooks of one are wrong for the other.
void check_calibration_model(const Calibration& c, const std::string& model_file_name,
                             const std::string& model_general_name);

}  // namespace vq
