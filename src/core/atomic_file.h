#pragma once
// Writes a whole file atomically: to a temporary name next to <path>, fsync, then rename over
// <path>. A failed write leaves no partial file and the old file (if any) untouched; errors name
// <path> (the name the caller gave), never the temporary one.
#include <cstddef>
#include <string>

namespace vq {
void write_file_atomic(const std::string& path, const void* data, size_t n);

// What can be known before any work about a later write_file_atomic(path): the path is not
// empty, names no directory or non-regular file, and its directory exists and is writable.
// Throws vq::Error "<what> '<path>': <problem>" (what: the option, e.g. "--stats-json").
void check_output_path(const std::string& path, const std::string& what);
}  // namespace vq
