// Dense partial attention. Keys are channel-major (k[c * k_stride + t]), so the scores of a
// vector of keys are one FMA chain over channels with the query channel broadcast: no
// horizontal sums. Up to four heads of the GQA group share each widened key vector, and each
// value row is widened once for them; each pass keeps up to kMaxAcc independent chains (heads x
// key vectors, heads x channel vectors). Softmax runs per tile of 64 keys (one rescale per tile).
// Paged tiles prefetch their block's values and the next block's keys (decode at batch > 1 and
// long contexts read the blocks from memory: SmolLM2 geometry, 4096 tokens, one thread, 11.8 ->
// 6.4 ms per token; bench/kv_attend).
#include "ops/cpu/no_sve_targets.h"  // first: before any Highway header
#include "ops/cpu/attention.h"

#include <algorithm>
#include <cmath>

#include "core/buffer.h"
#include "core/error.h"
#include "core/fp16.h"
#include "ops/cpu/prefetch.h"

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

using cpu::Slices;
// What a paged tile prefetches: its block's values from the tile's first key (during the scores)
// and the next block's keys (during the values).
struct TilePrefetch {
  const uint8_t *v = nullptr, *k = nullptr;
  size_t v_bytes = 0, k_bytes = 0;
};

// Accumulators one step keeps in registers: the FMA chains that hide the FMA latency (4 cycles,
// two pipes: 8 chains at least) while leaving room for the loads and broadcasts.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
constexpr int kMaxAcc = 16;  // of 32 vector registers
#else
constexpr int kMaxAcc = 8;
#endif

// Scores of KV vectors of keys from kp (channel c at kp + c * ks) for NG heads: s[g * kTile + ...]
// (lanes at or past nvalid: -inf). One FMA chain per (head, key vector).
template <int NG, int KV, class DF, class KT>
HWY_INLINE void ScoresKV(DF df, const KT* kp, int64_t ks, int D, const float* q, int nvalid, float* s, const Slices& pf) {
  using V = hn::Vec<DF>;
  const int N = int(hn::Lanes(df));
  V acc[NG][KV];
  for (int g = 0; g < NG; ++g)
    for (int v = 0; v < KV; ++v) acc[g][v] = hn::Zero(df);
  for (int c = 0; c < D; ++c) {
    pf(c);
    const KT* row = kp + int64_t(c) * ks;
    V kc[KV];
    for (int v = 0; v < KV; ++v) kc[v] = LoadKV(df, row + v * N);
    for (int g = 0; g < NG; ++g) {
      const V qb = hn::Set(df, q[g * D + c]);
      for (int v = 0; v < KV; ++v) acc[g][v] = hn::MulAdd(qb, kc[v], acc[g][v]);
    }
  }
  const V ninf = hn::Set(df, -INFINITY);
  for (int v = 0; v < KV; ++v) {
    const auto valid = hn::FirstN(df, size_t(std::max(0, nvalid - v * N)));
    for (int g = 0; g < NG; ++g) hn::Store(hn::IfThenElse(valid, acc[g][v], ninf), df, s + g * kTile + v * N);
  }
}

// Scores of keys [t0, t0 + nt) for heads g0..g0+NG-1: s[g][0..nt) (lanes past nt: -inf), up to
// kMaxAcc / NG key vectors per pass over the channels.
template <int NG, class DF, class KT>
HWY_INLINE void Scores(DF df, const KT* K, int64_t ks, int D, const float* q, int t0, int nt, float* s,
                       Slices pf) {
  const int N = int(hn::Lanes(df));
  constexpr int kv_max = std::min(4, kMaxAcc / NG);
  for (int tt = 0; tt < nt; tt += kv_max * N) {
    const int nv = std::min(kv_max, (nt - tt + N - 1) / N), left = nt - tt;
    const KT* kp = K + t0 + tt;
    float* st = s + tt;
    switch (nv) {
      case 1: ScoresKV<NG, 1>(df, kp, ks, D, q, left, st, pf); break;
      case 2: ScoresKV<NG, std::min(2, kv_max)>(df, kp, ks, D, q, left, st, pf); break;
      case 3: ScoresKV<NG, std::min(3, kv_max)>(df, kp, ks, D, q, left, st, pf); break;
      default: ScoresKV<NG, kv_max>(df, kp, ks, D, q, left, st, pf); break;
    }
    pf.p = nullptr;  // asked for in the first pass
  }
}

// o_g = o_g * alpha_g + sum_t p_g[t] * V[t] over CC vectors of channels from c0, NG heads (p in
// s[g * kTile + t]): one FMA chain per (head, channel vector), each value vector widened once.
template <int NG, int CC, class DV, class KT>
HWY_INLINE void AccumulateVCC(DV dv, const KT* Vt, int D, int c0, int nt, const float* s, const float* alpha,
                              float* o, const Slices& pf) {
  using V = hn::Vec<DV>;
  const int N = int(hn::Lanes(dv));
  V acc[NG][CC];
  for (int g = 0; g < NG; ++g) {
    const V a = hn::Set(dv, alpha[g]);
    for (int cc = 0; cc < CC; ++cc) acc[g][cc] = hn::Mul(hn::LoadU(dv, o + g * D + c0 + cc * N), a);
  }
  for (int t = 0; t < nt; ++t) {
    pf(t);
    const KT* row = Vt + int64_t(t) * D + c0;
    V v[CC];
    for (int cc = 0; cc < CC; ++cc) v[cc] = LoadKV(dv, row + cc * N);
    for (int g = 0; g < NG; ++g) {
      const V p = hn::Set(dv, s[g * kTile + t]);
      for (int cc = 0; cc < CC; ++cc) acc[g][cc] = hn::MulAdd(p, v[cc], acc[g][cc]);
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int cc = 0; cc < CC; ++cc) hn::StoreU(acc[g][cc], dv, o + g * D + c0 + cc * N);
}

// o_g = o_g * alpha_g + sum_t p_g[t] * V[t] for NG heads; p in s[g][t]. Channel vectors in groups
// of CC: the largest power of two <= kMaxAcc / NG dividing the head's vector count.
template <int NG, class DV, class KT>
HWY_INLINE void AccumulateV(DV dv, const KT* Vt, int D, int nt, const float* s, const float* alpha, float* o,
                            Slices pf) {
  const int N = int(hn::Lanes(dv)), nvec = D / N;
  int cc = 1;
  while (cc * 2 <= kMaxAcc / NG && nvec % (cc * 2) == 0) cc *= 2;
  for (int c0 = 0; c0 < D; c0 += cc * N) {
    switch (cc) {
      case 1: AccumulateVCC<NG, 1>(dv, Vt, D, c0, nt, s, alpha, o, pf); break;
      case 2: AccumulateVCC<NG, 2>(dv, Vt, D, c0, nt, s, alpha, o, pf); break;
      case 4: AccumulateVCC<NG, std::min(4, kMaxAcc / NG)>(dv, Vt, D, c0, nt, s, alpha, o, pf); break;
      case 8: AccumulateVCC<NG, std::min(8, kMaxAcc / NG)>(dv, Vt, D, c0, nt, s, alpha, o, pf); break;
      default: AccumulateVCC<NG, std::min(16, kMaxAcc / NG)>(dv, Vt, D, c0, nt, s, alpha, o, pf); break;
    }
    pf.p = nullptr;
  }
}

template <int NG, class DV, class KT>
void HeadGroupTile(DV dv, const KT* K, const KT* Vv, int64_t ks, int D, const float* q, int t0, int nt, float* s,
                   float* m, float* d, float* o, const TilePrefetch& pf) {
  const hn::ScalableTag<float> df;
  Scores<NG>(df, K, ks, D, q, t0, nt, s, Slices{pf.v, pf.v_bytes, D});
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
  AccumulateV<NG>(dv, Vv + int64_t(t0) * D, D, nt, s, alpha, o, Slices{pf.k, pf.k_bytes, nt});
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
      TilePrefetch pf;
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
        // Blocks are separate allocations the hardware prefetchers do not run into (and at batch
        // > 1 other sequences' blocks lie between them): the tile asks for the rest of its own
        // block's values during the scores and for the next block's keys during the values,
        // one cache line per step of those loops, so the requests never pile up.
        pf.v = reinterpret_cast<const uint8_t*>(Vp + local * D);
        pf.v_bytes = size_t(nt) * D * sizeof(KT);
        const int64_t nb = u / B + 1;
        pf.k = local + nt == B && nb * B < a.first + nv ? a.blocks[nb] + a.k_offset : nullptr;
        pf.k_bytes = size_t(D) * B * sizeof(KT);
      }
      for (int g0 = 0; g0 < G; g0 += 4) {
        const int ng = std::min(4, G - g0);
        const float* qg = qs + int64_t(g0) * D;
        float* og = o + int64_t(g0) * D;
        switch (ng) {
          case 1: HeadGroupTile<1>(dv, Kp, Vp, ks, D, qg, int(local), int(nt), s, m + g0, d + g0, og, pf); break;
          case 2: HeadGroupTile<2>(dv, Kp, Vp, ks, D, qg, int(local), int(nt), s, m + g0, d + g0, og, pf); break;
          case 3: HeadGroupTile<3>(dv, Kp, Vp, ks, D, qg, int(local), int(nt), s, m + g0, d + g0, og, pf); break;
          default: HeadGroupTile<4>(dv, Kp, Vp, ks, D, qg, int(local), int(nt), s, m + g0, d + g0, og, pf); break;
        }
        pf = TilePrefetch{};  // the first head group asked for them
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
