#pragma once
// Shared by the commands that hold a KV pool: the --kv-budget default, the memory summary and
// the --kv-cache help (the library's method list, veloxquant::kv_cache_methods(): the KV method
// registry; the spec itself is parsed only by the library, parse_kv_cache_config).
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "veloxquant/kv_spec.h"
#include "veloxquant/status.h"

namespace vq::cli {

// Share of the memory available at start that the KV pool may take when --kv-budget is not given.
inline constexpr double kDefaultKVShare = 0.5;

// Bytes of MemAvailable in /proc/meminfo (0 when unreadable).
inline size_t mem_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  size_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return 0;
}

// --kv-budget MiB (> 0), or kDefaultKVShare of the available memory (1 GiB if unknown).
inline size_t kv_budget_bytes(double mib) {
  if (mib < 0)
    throw veloxquant::Error(
        fmt::format("--kv-budget: {} MiB must be >= 0 (0: {:.0f}% of the available memory)", mib, kDefaultKVShare * 100));
  if (mib > 0) return size_t(mib * 1048576.0);
  const size_t avail = mem_available_bytes();
  return avail ? size_t(double(avail) * kDefaultKVShare) : (size_t(1) << 30);
}

// "KV cache spec: fp16, fp32, q8_0, ... (syntax below)": every registered method's presets.
inline std::string kv_cache_option_help() {
  std::string s = "KV cache spec: ";
  const auto presets = veloxquant::kv_cache_methods();
  for (size_t i = 0; i < presets.size(); ++i) s += (i ? ", " : "") + presets[i];
  return s + " (syntax below)";
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
