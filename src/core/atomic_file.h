#pragma once
// Writes a whole file atomically: to "<path>.tmp.<pid>", fsync, then rename over <path>.
// A failed write leaves no partial file and the old file (if any) untouched.
#include <cstddef>
#include <string>

namespace vq {
void write_file_atomic(const std::string& path, const void* data, size_t n);
}  // namespace vq
