#pragma once
// Helpers for the GPU-only tests (test_cuda_*.cpp): skip without a device, pack codes per
// API.md, fp16 rounding, relative L2 error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/fp16.h"
#include "ops/cuda/device.h"

#define VQ_SKIP_WITHOUT_CUDA()                                                                   \
  do {                                                                                           \
    if (!::vq::cuda::cuda_device_available())                                                    \
      GTEST_SKIP() << "no usable CUDA device (" << ::vq::cuda::cuda_unavailable_reason()         \
                   << "): GPU tests run on the H200 via bench/cuda/run_all.sh";                  \
  } while (0)

namespace vq::test {

// Packs n codes of `bits` bits LSB-first (API.md) into out (size (n*bits+7)/8, zero-filled here).
inline void pack_row(const uint16_t* codes, int n, int bits, uint8_t* out) {
  const size_t nb = (size_t(n) * bits + 7) / 8;
  for (size_t i = 0; i < nb; ++i) out[i] = 0;
  for (int i = 0; i < n; ++i)
    for (int b = 0; b < bits; ++b)
      if ((codes[i] >> b) & 1) {
        const size_t bit = size_t(i) * bits + b;
        out[bit >> 3] |= uint8_t(1u << (bit & 7));
      }
}
inline uint32_t unpack_one(const uint8_t* row, int i, int bits) {
  uint32_t v = 0;
  for (int b = 0; b < bits; ++b) {
    const size_t bit = size_t(i) * bits + b;
    v |= uint32_t((row[bit >> 3] >> (bit & 7)) & 1u) << b;
  }
  return v;
}

inline float round_f16(float x) { return f16_to_f32(f32_to_f16(x)); }

inline double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

}  // namespace vq::test
