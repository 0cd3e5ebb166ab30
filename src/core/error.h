#pragma once
#include <fmt/format.h>

#include <string>

#include "veloxquant/status.h"

namespace vq {
// An exception's message is read back as a C string (what()): a NUL inside it (from a file's
// string, a metadata value) would cut the message there. It becomes the visible "\0".
inline std::string error_text(std::string s) {
  for (size_t i = s.find('\0'); i != std::string::npos; i = s.find('\0', i + 2)) s.replace(i, 1, "\\0");
  return s;
}
}  // namespace vq

// VQ_CHECK(cond, "format {}", args...): throws vq::Error with the formatted message.
#define VQ_CHECK(cond, ...)                                                           \
  do {                                                                                \
    if (!(cond)) throw ::vq::Error(::vq::error_text(::fmt::format(__VA_ARGS__)));     \
  } while (0)

#define VQ_FAIL(...) throw ::vq::Error(::vq::error_text(::fmt::format(__VA_ARGS__)))
