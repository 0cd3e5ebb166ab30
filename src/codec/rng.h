#pragma once
// A small seeded generator whose output is fixed by its specification (SplitMix64), so a seed
// gives the same codebooks on every platform and standard library.
#include <cstdint>

namespace vq {

class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : s_(seed) {}
  uint64_t next() {
    uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, n) (n >= 1), via the high half of a 128-bit product.
  uint64_t below(uint64_t n) { return uint64_t((unsigned __int128)next() * n >> 64); }
  // Uniform double in [0, 1).
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }

 private:
  uint64_t s_;
};

}  // namespace vq
