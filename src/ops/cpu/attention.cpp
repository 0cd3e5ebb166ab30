// Dense partial attention. Keys are channel-major (k[c * k_stride + t]), so the scores of a
// vector of keys are one FMA chain over channels with the query channel broadcast: no
// horizontal sums. Up to four heads of the GQA group share each widened key vector, and each
// value row is widened once for them. Softmax runs per tile of 64 keys (one rescale per tile).
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

constexpr int kTile = 64;  // keys per softmax step (a multiple of every vector width)

template <class DF>
HWY_INLINE hn::Vec<DF> LoadKV(DF df, const float* p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadKV(DF df, const uint16_t* p) {
  const hn::Rebind<hwy::float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p)));
}

// Scores of keys [t0, t0 + nt) for heads g0..g0+NG-1: s[g][0..nt) (lanes past nt: -inf).
template <int NG, class DF, class KT>
HWY_INLINE void Scores(DF df, const KT* K, int64_t ks, int D, const float* q, int t0, int nt, float* s) {
  using V = hn::Vec<DF>;
  const int N = int(hn::Lanes(df));
  for (int tt = 0; tt < nt; tt += N) {
    V a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
    const KT* kp = K + t0 + tt;
    for (int c = 0; c < D; ++c) {
      const V kc = LoadKV(df, kp + int64_t(c) * ks);
      a0 = hn::MulAdd(hn::Set(df, q[c]), kc, a0);
      if (NG > 1) a1 = hn::MulAdd(hn::Set(df, q[D + c]), kc, a1);
      if (NG > 2) a2 = hn::MulAdd(hn::Set(df, q[2 * D + c]), kc, a2);
      if (NG > 3) a3 = hn::MulAdd(hn::Set(df, q[3 * D + c]), kc, a3);
    }
    const auto valid = hn::FirstN(df, size_t(nt - tt));
    const V ninf = hn::Set(df, -INFINITY);
    hn::Store(hn::IfThenElse(valid, a0, ninf), df, s + tt);
    if (NG > 1) hn::Store(hn::IfThenElse(valid, a1, ninf), df, s + kTile + tt);
    if (NG > 2) hn::Store(hn::IfThenElse(valid, a2, ninf), df, s + 2 * kTile + tt);
    if (NG > 3) hn::Store(hn::IfThenElse(valid, a3, ninf), df, s + 3 * kTile + tt);
  }
}

// o_g = o_g * alpha_g + sum_t p_g[t] * V[t] for NG heads; p in s[g][t].
template <int NG, class DV, class KT>
HWY_INLINE void AccumulateV(DV dv, const KT* Vt, int D, int nt, const float* s, const float* alpha, float* o) {
  using V = hn::Vec<DV>;
  const int N = int(hn::Lanes(dv));
  for (int c = 0; c < D; c += N) {
    V o0 = hn::Mul(hn::LoadU(dv, o + c), hn::Set(dv, alpha[0]));
    V o1 = NG > 1 ? hn::Mul(hn::LoadU(dv, o + D + c), hn::Set(dv, alpha[1])) : hn::Zero(dv);
    V o2 = NG > 2 ? hn::Mul(hn::LoadU(dv, o + 2 * D + c), hn::Set(dv, alpha[2])) : hn::Zero(dv);
    V o3 = NG > 3 ? hn::Mul(hn::LoadU(dv, o + 3 * D + c), hn::Set(dv, alpha[3])) : hn::Zero(dv);
    for (int t = 0; t < nt; ++t) {
      const V v = LoadKV(dv, Vt + int64_t(t) * D + c);
      o0 = hn::MulAdd(hn::Set(dv, s[t]), v, o0);
      if (NG > 1) o1 = hn::MulAdd(hn::Set(dv, s[kTile + t]), v, o1);
      if (NG > 2) o2 = hn::MulAdd(hn::Set(dv, s[2 * kTile + t]), v, o2);
      if (NG > 3) o3 = hn::MulAdd(hn::Set(dv, s[3 * kTile + t]), v, o3);
    }
    hn::StoreU(o0, dv, o + c);
    if (NG > 1) hn::StoreU(o1, dv, o + D + c);
    if (NG > 2) hn::StoreU(o2, dv, o + 2 * D + c);
    if (NG > 3) hn::StoreU(o3, dv, o + 3 * D + c);
  }
}

template <int NG, class DV, class KT>
void HeadGroupTile(DV dv, const KT* K, const KT* Vv, int64_t ks, int D, const float* q, int t0, int nt, float* s,
                   float* m, float* d, float* o) {
  const hn::ScalableTag<float> df;
  Scores<NG>(df, K, ks, D, q, t0, nt, s);
  alignas(64) float alpha[4];
  const int N = int(hn::Lanes(df));
  for (int g = 0; g < NG; ++g) {
    float* sg = s + g * kTile;
    auto vmax = hn::Set(df, -INFINITY);
    for (int t = 0; t < nt; t += N) vmax = hn::Max(vmax, hn::Load(df, sg + t));
    const float tile_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
    const float m_new = std::max(m[g], tile_max);
    alpha[g] = m[g] == -INFINITY ? 0.0f : std::exp(m[g] - m_new);
    const auto vm = hn::Set(df, m_new);
    auto vsum = hn::Zero(df);
    for (int t = 0; t < nt; t += N) {
      const auto p = hn::Exp(df, hn::Sub(hn::Load(df, sg + t), vm));  // -inf lanes -> 0
      hn::Store(p, df, sg + t);
      vsum = hn::Add(vsum, p);
    }
    d[g] = d[g] * alpha[g] + hn::GetLane(hn::SumOfLanes(df, vsum));
    m[g] = m_new;
  }
  AccumulateV<NG>(dv, Vv + int64_t(t0) * D, D, nt, s, alpha, o);
}

template <class DV, class KT>
void DenseAttnImpl(DV dv, const KT* K, const KT* Vv, const ref::DenseAttnArgs& a) {
  const int D = a.head_dim, G = a.group;
  thread_local AlignedBuffer<float> q_buf, s_buf;  // q: [G, D] scaled; s: [4, kTile]
  if (q_buf.size() < size_t(G) * D) q_buf.resize(size_t(G) * D);
  if (s_buf.size() < size_t(4) * kTile) s_buf.resize(size_t(4) * kTile);
  float* qs = q_buf.data();
  float* s = s_buf.data();
  for (int i = 0; i < a.n_q; ++i) {
    const int64_t nv = std::clamp<int64_t>(a.n_visible[i], 0, a.n_keys);
    if (nv == 0) continue;
    const float* qi = a.q + i * a.q_stride;
    for (int c = 0; c < G * D; ++c) qs[c] = qi[c] * a.scale;
    float* m = a.m + int64_t(i) * G;
    float* d = a.d + int64_t(i) * G;
    float* o = a.o + int64_t(i) * G * D;
    for (int64_t t0 = 0; t0 < nv;) {
      // A tile never crosses a block: Kp/Vp are the tile's block (or the whole contiguous run)
      // and `local` the tile's first key in it.
      const KT *Kp = K, *Vp = Vv;
      int64_t ks = a.k_stride, local = t0, nt = std::min<int64_t>(kTile, nv - t0);
      if (a.block_tokens > 0) {
        const int64_t u = a.first + t0, B = a.block_tokens;
        const uint8_t* blk = a.blocks[u / B];
        Kp = reinterpret_cast<const KT*>(blk + a.k_offset);
        Vp = reinterpret_cast<const KT*>(blk + a.v_offset);
        ks = B;
        local = u % B;
        nt = std::min<int64_t>(nt, B - local);
      }
      for (int g0 = 0; g0 < G; g0 += 4) {
        const int ng = std::min(4, G - g0);
        const float* qg = qs + int64_t(g0) * D;
        float* og = o + int64_t(g0) * D;
        switch (ng) {
          case 1: HeadGroupTile<1>(dv, Kp, Vp, ks, D, qg, int(local), int(nt), s, m + g0, d + g0, og); break;
          case 2: HeadGroupTile<2>(dv, Kp, Vp, ks, D, qg, int(local), int(nt), s, m + g0, d + g0, og); break;
          case 3: HeadGroupTile<3>(dv, Kp, Vp, ks, D, qg, int(local), int(nt), s, m + g0, d + g0, og); break;
          default: HeadGroupTile<4>(dv, Kp, Vp, ks, D, qg, int(local), int(nt), s, m + g0, d + g0, og); break;
        }
      }
      t0 += nt;
    }
  }
}

template <class KT>
void DenseAttnTyped(const KT* K, const KT* Vv, const ref::DenseAttnArgs& a) {
  const hn::ScalableTag<float> df;
  const hn::CappedTag<float, 8> d8;
  const hn::CappedTag<float, 4> d4;
  if (a.head_dim % int(hn::Lanes(df)) == 0) return DenseAttnImpl(df, K, Vv, a);
  if (a.head_dim % int(hn::Lanes(d8)) == 0) return DenseAttnImpl(d8, K, Vv, a);
  if (a.head_dim % int(hn::Lanes(d4)) == 0) return DenseAttnImpl(d4, K, Vv, a);
  ref::dense_attention(a);
}

void DenseAttention(const ref::DenseAttnArgs& a) {
  if (a.block_tokens > 0) {
    if (a.paged_f32) DenseAttnTyped(static_cast<const float*>(nullptr), static_cast<const float*>(nullptr), a);
    else DenseAttnTyped(static_cast<const uint16_t*>(nullptr), static_cast<const uint16_t*>(nullptr), a);
  } else if (a.k16) {
    DenseAttnTyped(a.k16, a.v16, a);
  } else {
    DenseAttnTyped(a.k32, a.v32, a);
  }
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
  if (a.block_tokens > 0) {
    VQ_CHECK(a.block_tokens % 16 == 0 && a.first >= 0 && a.first < a.block_tokens,
             "cpu::dense_attention: block_tokens {} must be a multiple of 16 and first {} inside a block",
             a.block_tokens, a.first);
  } else {
    VQ_CHECK(a.k_stride % 16 == 0 && a.k_stride >= a.n_keys,
             "cpu::dense_attention: k_stride {} must be a multiple of 16 and >= n_keys {}", a.k_stride, a.n_keys);
  }
  HWY_DYNAMIC_DISPATCH(DenseAttention)(a);
}
}  // namespace vq::cpu
#endif
