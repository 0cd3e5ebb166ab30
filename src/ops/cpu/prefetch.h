#pragma once
// Software prefetch spread over a loop, for the CPU attention kernels whose next pool block the
// hardware prefetchers do not run into (blocks are separate allocations; at batch > 1 other
// sequences' blocks lie between them). A burst of prefetches at the start of a block stalls on the
// miss buffers; one slice per loop step does not.
#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace vq::cpu {

// Step i of n asks for the i-th slice of [p, p + bytes), whole cache lines (null p: nothing).
struct Slices {
  const uint8_t* p = nullptr;
  int lines = 0, per = 0;  // cache lines in all, per step (divided once: a division per step cost 25%)
  Slices() = default;
  Slices(const uint8_t* p_, size_t bytes, int n)
      : p(p_), lines(int((bytes + 63) / 64)), per(n > 0 ? (int((bytes + 63) / 64) + n - 1) / n : 0) {}
  __attribute__((always_inline)) inline void operator()(int i) const { request<3>(i); }
  // The same with a cache level (__builtin_prefetch's locality: 3 to L1, 2 to L2).
  template <int Locality>
  __attribute__((always_inline)) inline void request(int i) const {
    if (!p) return;
    const int l1 = std::min(lines, (i + 1) * per);
    for (int l = i * per; l < l1; ++l) __builtin_prefetch(p + int64_t(l) * 64, 0, Locality);
  }
};

}  // namespace vq::cpu
