#pragma once
// Spec strings -> KVCacheConfig -> KVSpec (the config with its calibration loaded), and
// KVSpec -> standalone per-layer caches (KVCache) for code that drives one layer by hand.
#include <string>

#include "kvcache/kv_store.h"
#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"

namespace vq {

// "fp16", "fp32", "q8_0", "q4_0", "q4_0h" (Hadamard-rotated q4_0), "kivi2", "kivi4", "vecinfer:d4b8", "vecinfer:d8b12",
// "vecinfer:k=d4b8,v=d8b8"; options after a comma: r=N (residual length), g=N (kivi group),
// gran=shared|per_subspace, gpu=auto|require|forbid. Case-insensitive. Throws naming the part.
KVCacheConfig parse_kv_cache_spec(const std::string& spec);

// Validates the config and loads what it needs: vecinfer takes config.calibration, else
// calib_path (non-empty) or config.calibration_file; without any it throws saying how to make one.
KVSpec make_kv_spec(const KVCacheConfig& config, const std::string& calib_path = "");

// Standalone caches, one per layer (PooledCache over a private one-sequence CPU store). Errors
// are thrown here.
KVCacheFactory make_kv_cache_factory(const KVCacheConfig& config, const std::string& calib_path = "");
KVCacheFactory make_kv_cache_factory(const KVSpec& spec);

// What the message of a missing-calibration error says (shared with the CLI).
std::string calibration_howto(const KVCacheConfig& config);

// Throws naming the field unless g is a usable attention geometry.
void check_geometry(const KVGeometry& g, const char* who);

}  // namespace vq
