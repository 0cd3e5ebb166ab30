// Highway per-target compilation of the element-wise layers (see layers.h).
#include "model/layers.h"

#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/layers.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

void RmsNormImpl(const float* x, const float* w, float* y, int n, float eps) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  auto acc = hn::Zero(d);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto v = hn::LoadU(d, x + i);
    acc = hn::MulAdd(v, v, acc);
  }
  double ss = hn::GetLane(hn::SumOfLanes(d, acc));
  for (; i < n; ++i) ss += double(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / n + double(eps)));
  const auto vs = hn::Set(d, scale);
  i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(d, x + i), vs), hn::LoadU(d, w + i)), d, y + i);
  for (; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void SiluMulImpl(const float* gate, const float* up, float* out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  // exp(-g) overflows to inf for g < -88: silu -> g / inf = -0, which is the right limit.
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto g = hn::LoadU(d, gate + i);
    const auto e = hn::Exp(d, hn::Neg(g));
    hn::StoreU(hn::Mul(hn::Div(g, hn::Add(one, e)), hn::LoadU(d, up + i)), d, out + i);
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void AddInplaceImpl(float* x, const float* y, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Add(hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, x + i);
  for (; i < n; ++i) x[i] += y[i];
}

}  // namespace HWY_NAMESPACE
}  // namespace vq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace vq {
HWY_EXPORT(RmsNormImpl);
HWY_EXPORT(SiluMulImpl);
HWY_EXPORT(AddInplaceImpl);

void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x, w, y, n, eps);
}
void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMulImpl)(gate, up, out, n);
}
void add_inplace(float* x, const float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(AddInplaceImpl)(x, y, n); }

void rope_apply(float* x, int n_heads, int head_dim, int n_rot, const float* cos, const float* sin, bool neox) {
  const int half = n_rot / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    if (neox) {
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * cos[i] - b * sin[i];
        v[i + half] = a * sin[i] + b * cos[i];
      }
    } else {
      for (int i = 0; i < half; ++i) {
        const float a = v[2 * i], b = v[2 * i + 1];
        v[2 * i] = a * cos[i] - b * sin[i];
        v[2 * i + 1] = a * sin[i] + b * cos[i];
      }
    }
  }
}
}  // namespace vq
#endif  // HWY_ONCE
