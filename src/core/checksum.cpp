#include "core/checksum.h"

#include <xxhash.h>

namespace vq {
uint64_t checksum64(const void* data, size_t n) { return XXH64(data, n, 0); }
}  // namespace vq
