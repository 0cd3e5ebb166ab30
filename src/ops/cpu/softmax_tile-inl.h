// Online softmax over one tile of scores and the fp16 scale loads, shared by the CPU attention
// kernels on integer codes (scalar_attention.cpp, kivi_attention.cpp). Per-target Highway code:
// include it after <hwy/highway.h> in a translation unit that uses hwy/foreach_target.h.
#if defined(VQ_OPS_CPU_SOFTMAX_TILE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef VQ_OPS_CPU_SOFTMAX_TILE_INL_H_
#undef VQ_OPS_CPU_SOFTMAX_TILE_INL_H_
#else
#define VQ_OPS_CPU_SOFTMAX_TILE_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "core/fp16.h"

#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Tokens per score tile.
constexpr int kTile = 64;

// The fp16 number at p (a block's scale or minimum) as f32: one F16C instruction on the x86
// targets that have it (all from AVX2 up), else the portable conversion (core/fp16.h).
HWY_INLINE float LoadF16Scalar(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}

// s: [G][kTile] scores of nt tokens for G query heads -> softmax weights exp(s - m_new) in place;
// updates the running max m[g] and denominator d[g] and writes the factor alpha[g] by which the
// head's output accumulator must be rescaled.
template <class DF>
HWY_INLINE void SoftmaxTile(DF df, float* s, int G, int nt, float* m, float* d, float* alpha) {
  const int N = int(hn::Lanes(df));
  const int ntp = (nt + N - 1) / N * N;
  for (int g = 0; g < G; ++g) {
    float* sg = s + g * kTile;
    for (int t = nt; t < ntp; ++t) sg[t] = -INFINITY;
    auto vmax = hn::Set(df, -INFINITY);
    for (int t = 0; t < ntp; t += N) vmax = hn::Max(vmax, hn::Load(df, sg + t));
    const float m_new = std::max(m[g], hn::GetLane(hn::MaxOfLanes(df, vmax)));
    alpha[g] = m[g] == -INFINITY ? 0.0f : std::exp(m[g] - m_new);
    const auto vm = hn::Set(df, m_new);
    auto vsum = hn::Zero(df);
    for (int t = 0; t < ntp; t += N) {
      const auto p = hn::Exp(df, hn::Sub(hn::Load(df, sg + t), vm));
      hn::Store(p, df, sg + t);
      vsum = hn::Add(vsum, p);
    }
    d[g] = d[g] * alpha[g] + hn::GetLane(hn::SumOfLanes(df, vsum));
    m[g] = m_new;
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace vq
HWY_AFTER_NAMESPACE();

#endif  // VQ_OPS_CPU_SOFTMAX_TILE_INL_H_
