#pragma once
#include <cstddef>
#include <cstdint>

namespace vq {
// XXH64 of a byte range (seed 0); used by file formats to detect corruption.
uint64_t checksum64(const void* data, size_t n);
}  // namespace vq
