#pragma once
// Shared by the commands that hold a KV pool: the --kv-budget flag, the memory summary and
// the --kv-cache help (the library's method list, veloxquant::kv_cache_methods(): the KV method
// registry; the spec itself is parsed only by the library, parse_kv_cache_config).
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"
#include "veloxquant/session.h"
#include "veloxquant/status.h"

namespace vq::cli {

// --kv-budget MIB (> 0), or the library's default share of the memory free on the device
// (veloxquant::default_kv_budget_bytes: half of the host's available memory, 85% of a GPU's).
inline size_t kv_budget_bytes(const veloxquant::Model& model, veloxquant::Device device, double mib) {
  if (!(mib >= 0))
    throw veloxquant::Error(fmt::format("--kv-budget: {} MiB must be >= 0 (0: the default share of the {}'s memory)",
                                        mib, veloxquant::device_name(device)));
  if (mib > 0) return size_t(mib * 1048576.0);
  return veloxquant::default_kv_budget_bytes(model, device);
}

// "KV cache spec: fp16, fp32, q8_0, ... (syntax below)": every registered method's presets.
inline std::string kv_cache_option_help() {
  std::string s = "KV cache spec: ";
  const auto presets = veloxquant::kv_cache_methods();
  for (size_t i = 0; i < presets.size(); ++i) s += (i ? ", " : "") + presets[i];
  return s + " (syntax below)";
}

// The KV spec a generating command runs with (KVSpec::for_model_config): --calib, else a known
// model's first-use calibration, made now with its progress on stderr.
inline veloxquant::KVSpec kv_spec_for_model(const veloxquant::Model& model, const KVCacheConfig& cfg,
                                            const std::string& calib) {
  return veloxquant::KVSpec::for_model_config(
      model, cfg, calib,
      [](const char* stage, int d, int t) {
        std::fprintf(stderr, "\rcalibrating (first use): %s %d/%d   ", stage, d, t);
        if (d == t) std::fprintf(stderr, "\n");
      },
      nullptr);
}

inline std::string mb(size_t bytes) { return fmt::format("{:.2f} MB", double(bytes) / 1e6); }

// "kv cache NAME: T tokens, X MB for the tokens (fp16 Y MB, Z bits/element), A MB allocated[, codebooks C MB]"
inline std::string kv_summary(const std::string& name, long long tokens, size_t token_bytes, size_t allocated,
                              size_t fp16, size_t codebooks) {
  const double bpe = fp16 ? 16.0 * double(token_bytes) / double(fp16) : 0.0;
  std::string s = fmt::format("kv cache {}: {} tokens, {} for the tokens (fp16 equivalent {}, {:.2f} bits/element), {} allocated",
                              name, tokens, mb(token_bytes), mb(fp16), bpe, mb(allocated));
  if (codebooks) s += fmt::format(", codebooks {}", mb(codebooks));
  return s;
}

}  // namespace vq::cli
