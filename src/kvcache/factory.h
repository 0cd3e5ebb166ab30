#pragma once
// Spec strings -> KVCacheConfig, and KVCacheConfig -> a factory making one cache per layer.
#include <string>

#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"

namespace vq {

// "fp16", "fp32", "q8_0", "q4_0", "kivi2", "kivi4", "vecinfer:d4b8", "vecinfer:d8b12",
// "vecinfer:k=d4b8,v=d8b8"; options after a comma: r=N (residual length), g=N (kivi group),
// gran=shared|per_subspace, gpu=auto|require|forbid. Case-insensitive. Throws naming the part.
KVCacheConfig parse_kv_cache_spec(const std::string& spec);

// Makes caches for every layer. vecinfer needs calibration: config.calibration, or
// calib_path (non-empty) / config.calibration_file, loaded once here; without any it throws
// saying how to make one. Validation errors are thrown here (construction), naming the field.
KVCacheFactory make_kv_cache_factory(const KVCacheConfig& config, const std::string& calib_path = "");

// What the message of a missing-calibration error says (shared with the CLI).
std::string calibration_howto(const KVCacheConfig& config);

}  // namespace vq
