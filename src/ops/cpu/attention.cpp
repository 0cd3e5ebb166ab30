// Dense partial attention: keys/values in tiles of 32 rows are widened to f32 once per tile and
// serve every query and every head of the GQA group; scores and the softmax update are
// vectorised per tile (one rescale of the accumulator per tile, not per key).
#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "core/buffer.h"
#include "core/error.h"
#include "core/fp16.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kTile = 32;

template <class DF>
void DenseAttnImpl(DF df, const ref::DenseAttnArgs& a) {
  using V = hn::Vec<DF>;
  const int D = a.head_dim;
  const int N = int(hn::Lanes(df));
  const int G = a.group;
  // Scratch per thread: the widened tile and the scaled queries.
  thread_local AlignedBuffer<float> kt_buf, vt_buf, q_buf;  // [kTile, D], [kTile, D], [n_q*G, D]
  if (kt_buf.size() < size_t(kTile * D)) {
    kt_buf.resize(size_t(kTile * D));
    vt_buf.resize(size_t(kTile * D));
  }
  if (q_buf.size() < size_t(a.n_q) * G * D) q_buf.resize(size_t(a.n_q) * G * D);
  float* qs = q_buf.data();
  int64_t n_max = 0;
  for (int i = 0; i < a.n_q; ++i) {
    n_max = std::max(n_max, std::min(a.n_visible[i], a.n_keys));
    for (int g = 0; g < G; ++g) {
      const float* src = a.q + i * a.q_stride + int64_t(g) * D;
      float* dst = qs + (int64_t(i) * G + g) * D;
      for (int c = 0; c < D; ++c) dst[c] = src[c] * a.scale;
    }
  }
  alignas(64) float s[kTile];
  for (int64_t t0 = 0; t0 < n_max; t0 += kTile) {
    const int nt = int(std::min<int64_t>(kTile, n_max - t0));
    const float* kt;
    const float* vt;
    if (a.k16) {
      f16_to_f32(a.k16 + t0 * D, kt_buf.data(), size_t(nt) * D);
      f16_to_f32(a.v16 + t0 * D, vt_buf.data(), size_t(nt) * D);
      kt = kt_buf.data();
      vt = vt_buf.data();
    } else {
      kt = a.k32 + t0 * D;
      vt = a.v32 + t0 * D;
    }
    for (int i = 0; i < a.n_q; ++i) {
      const int64_t vis = std::min(a.n_visible[i], a.n_keys) - t0;
      if (vis <= 0) continue;
      const int nv = int(std::min<int64_t>(nt, vis));
      for (int g = 0; g < G; ++g) {
        const float* qv = qs + (int64_t(i) * G + g) * D;
        float tile_max = -INFINITY;
        int t = 0;
        for (; t + 4 <= nv; t += 4) {  // four keys at once hide the FMA latency
          const float* k0 = kt + int64_t(t) * D;
          V a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
          for (int c = 0; c < D; c += N) {
            const V qc = hn::Load(df, qv + c);
            a0 = hn::MulAdd(qc, hn::LoadU(df, k0 + c), a0);
            a1 = hn::MulAdd(qc, hn::LoadU(df, k0 + D + c), a1);
            a2 = hn::MulAdd(qc, hn::LoadU(df, k0 + 2 * D + c), a2);
            a3 = hn::MulAdd(qc, hn::LoadU(df, k0 + 3 * D + c), a3);
          }
          s[t] = hn::GetLane(hn::SumOfLanes(df, a0));
          s[t + 1] = hn::GetLane(hn::SumOfLanes(df, a1));
          s[t + 2] = hn::GetLane(hn::SumOfLanes(df, a2));
          s[t + 3] = hn::GetLane(hn::SumOfLanes(df, a3));
        }
        for (; t < nv; ++t) {
          V acc = hn::Zero(df);
          for (int c = 0; c < D; c += N) acc = hn::MulAdd(hn::Load(df, qv + c), hn::LoadU(df, kt + int64_t(t) * D + c), acc);
          s[t] = hn::GetLane(hn::SumOfLanes(df, acc));
        }
        for (t = 0; t < nv; ++t) tile_max = std::max(tile_max, s[t]);
        float& m = a.m[i * G + g];
        float& d = a.d[i * G + g];
        float* o = a.o + (int64_t(i) * G + g) * D;
        const float m_new = std::max(m, tile_max);
        const float alpha = m == -INFINITY ? 0.0f : std::exp(m - m_new);
        // p = exp(s - m_new), vectorised over the tile.
        const hn::ScalableTag<float> dfe;
        const int NE = int(hn::Lanes(dfe));
        const auto vm = hn::Set(dfe, m_new);
        auto vsum = hn::Zero(dfe);
        for (t = 0; t < nv; t += NE) {
          const size_t rem = size_t(nv - t);
          auto x = hn::Sub(hn::LoadU(dfe, s + t), vm);
          auto p = hn::Exp(dfe, x);
          if (rem < size_t(NE)) p = hn::IfThenElseZero(hn::FirstN(dfe, rem), p);
          hn::StoreU(p, dfe, s + t);
          vsum = hn::Add(vsum, p);
        }
        d = d * alpha + hn::GetLane(hn::SumOfLanes(dfe, vsum));
        m = m_new;
        const V va = hn::Set(df, alpha);
        for (int c = 0; c < D; c += N) {
          V acc0 = hn::Mul(hn::LoadU(df, o + c), va);
          V acc1 = hn::Zero(df);
          int u = 0;
          for (; u + 2 <= nv; u += 2) {
            acc0 = hn::MulAdd(hn::Set(df, s[u]), hn::LoadU(df, vt + int64_t(u) * D + c), acc0);
            acc1 = hn::MulAdd(hn::Set(df, s[u + 1]), hn::LoadU(df, vt + int64_t(u + 1) * D + c), acc1);
          }
          if (u < nv) acc0 = hn::MulAdd(hn::Set(df, s[u]), hn::LoadU(df, vt + int64_t(u) * D + c), acc0);
          hn::StoreU(hn::Add(acc0, acc1), df, o + c);
        }
      }
    }
  }
}

void DenseAttention(const ref::DenseAttnArgs& a) {
  const hn::ScalableTag<float> df;
  const hn::CappedTag<float, 8> d8;
  const hn::CappedTag<float, 4> d4;
  if (a.head_dim % int(hn::Lanes(df)) == 0) return DenseAttnImpl(df, a);
  if (a.head_dim % int(hn::Lanes(d8)) == 0) return DenseAttnImpl(d8, a);
  if (a.head_dim % int(hn::Lanes(d4)) == 0) return DenseAttnImpl(d4, a);
  ref::dense_attention(a);
}

}  // namespace HWY_NAMESPACE
}  // namespace vq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace vq::cpu {
HWY_EXPORT(DenseAttention);
void dense_attention(const DenseAttnArgs& a) {
  VQ_CHECK(a.head_dim > 0 && a.group > 0 && a.n_q >= 0, "cpu::dense_attention: bad geometry head_dim {} group {} n_q {}",
           a.head_dim, a.group, a.n_q);
  HWY_DYNAMIC_DISPATCH(DenseAttention)(a);
}
}  // namespace vq::cpu
#endif
