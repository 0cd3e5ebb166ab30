#pragma once
// The syntax of the KV cache spec strings parse_kv_cache_spec() (kvcache/factory.h) accepts, as
// help text (several lines) for --kv-cache; implemented beside the parser in config.cpp so the
// two change together.
#include <string>

namespace vq {
std::string kv_cache_spec_syntax();
}  // namespace vq
