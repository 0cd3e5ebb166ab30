// Highway per-target compilation of the element-wise layers (see layers.h).
#include "model/layers.h"

#include <algorithm>
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

// 0.5 g (1 + tanh(u)) = g / (1 + exp(-2u)): the same function without the cancellation of
// 1 + tanh(u) for negative u. The exponent is clamped to [-88, 88]: Highway's Exp is undefined
// past ~88 (it does not saturate to inf), and the cubic term gets there from |g| ~ 10; at the
// clamp the quotient is already g (up to 1e-38) or 0 (|g| / 1.6e38).
constexpr float kGeluC1 = 0.7978845608028654f;           // sqrt(2/pi)
constexpr float kGeluC3 = 0.7978845608028654f * 0.044715f;  // sqrt(2/pi) * 0.044715

void GeluTanhMulImpl(const float* gate, const float* up, float* out, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto one = hn::Set(d, 1.0f);
  const auto m2c1 = hn::Set(d, -2.0f * kGeluC1), m2c3 = hn::Set(d, -2.0f * kGeluC3);
  const auto lo = hn::Set(d, -88.0f), hi = hn::Set(d, 88.0f);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const auto g = hn::LoadU(d, gate + i);
    const auto g2 = hn::Mul(g, g);
    const auto m2u = hn::Mul(g, hn::MulAdd(m2c3, g2, m2c1));  // -2u = g (-2 c1 - 2 c3 g^2)
    const auto e = hn::Exp(d, hn::Min(hn::Max(m2u, lo), hi));
    hn::StoreU(hn::Mul(hn::Div(g, hn::Add(one, e)), hn::LoadU(d, up + i)), d, out + i);
  }
  for (; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(std::clamp(-2.0f * g * (kGeluC1 + kGeluC3 * g * g), -88.0f, 88.0f))) * up[i];
  }
}

void ScaleInplaceImpl(float* x, float s, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, s);
  int64_t i = 0;
  for (; i + L <= n; i += L) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, x + i);
  for (; i < n; ++i) x[i] *= s;
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
HWY_EXPORT(GeluTanhMulImpl);
HWY_EXPORT(ScaleInplaceImpl);

void rms_norm(const float* x, const float* w, float* y, int n, float eps) {
  HWY_DYNAMIC_DISPATCH(RmsNormImpl)(x, w, y, n, eps);
}
void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMulImpl)(gate, up, out, n);
}
void add_inplace(float* x, const float* y, int64_t n) { HWY_DYNAMIC_DISPATCH(AddInplaceImpl)(x, y, n); }
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n) {
  HWY_DYNAMIC_DISPATCH(GeluTanhMulImpl)(gate, up, out, n);
}
void scale_inplace(float* x, float s, int64_t n) { HWY_DYNAMIC_DISPATCH(ScaleInplaceImpl)(x, s, n); }

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
