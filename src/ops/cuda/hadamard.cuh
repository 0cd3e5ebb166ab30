#pragma once
// Internal to src/ops/cuda: the block Walsh-Hadamard butterflies of vq::fwht_inplace (same
// pairs, same order of additions) on a vector spread over a warp, element e = lane + 32*i for
// i < epl (head_dim = 32*epl <= 256), blocks of `hblock` (a power of two). Unscaled: callers
// multiply by 1/sqrt(hblock).
#include <cuda_runtime.h>

namespace vq::cuda::detail {

__device__ __forceinline__ void fwht_warp(float (&v)[8], int epl, int hblock, int lane) {
  // Stages with partner distance < 32: across lanes (same i).
  for (int hh = 1; hh < 32 && hh < hblock; hh <<= 1) {
    const bool upper = lane & hh;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < epl) {
        const float o = __shfl_xor_sync(0xffffffffu, v[i], hh);
        v[i] = upper ? (o - v[i]) : (v[i] + o);
      }
  }
  // Stages with distance >= 32: within the lane (i and i | hh/32).
  for (int hh = 32; hh < hblock; hh <<= 1) {
    const int m = hh >> 5;
#pragma unroll
    for (int i = 0; i < 8; ++i)
      if (i < epl && !(i & m)) {
        // partner index i|m is > i; both < epl since epl is a multiple of 2m here
#pragma unroll
        for (int j = 0; j < 8; ++j)
          if (j == (i | m)) {
            const float a = v[i], b = v[j];
            v[i] = a + b;
            v[j] = a - b;
          }
      }
  }
}

}  // namespace vq::cuda::detail
