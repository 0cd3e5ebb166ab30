#pragma once
// The syntax of the KV cache spec strings parse_kv_cache_spec() (kvcache/factory.h) accepts, as
// help text (several lines) for --kv-cache, assembled in config.cpp from every registered method's
// help() (kv_method.h), so that the syntax and the parser change together.
#include <string>

namespace vq {
std::string kv_cache_spec_syntax();
}  // namespace vq
