#include "ops/cpu/pq_attention.h"

#include <algorithm>
#include <cmath>

#include "codec/bitpack.h"
#include "core/buffer.h"
#include "core/error.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/pq_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kTile = 64;  // tokens per softmax step

void BuildLut(const PQAttnArgs& a, const float* cbt, float* lut) {
  const hn::ScalableTag<float> df;
  const int N = int(hn::Lanes(df));
  const int sd = a.k_sub_dim, nks = a.head_dim / sd, K = 1 << a.k_bits;
  for (int g = 0; g < a.group; ++g) {
    const float* q = a.q + int64_t(g) * a.head_dim;
    for (int j = 0; j < nks; ++j) {
      const float* bt = cbt + int64_t(a.k_books == 1 ? 0 : j) * sd * K;  // [sd][K]
      float* out = lut + (int64_t(g) * nks + j) * K;
      const float* qj = q + j * sd;
      if (K % N == 0) {
        for (int c = 0; c < K; c += N) {
          auto acc = hn::Mul(hn::Set(df, qj[0]), hn::LoadU(df, bt + c));
          for (int e = 1; e < sd; ++e) acc = hn::MulAdd(hn::Set(df, qj[e]), hn::LoadU(df, bt + int64_t(e) * K + c), acc);
          hn::StoreU(acc, df, out + c);
        }
      } else {
        for (int c = 0; c < K; ++c) {
          float acc = 0;
          for (int e = 0; e < sd; ++e) acc += qj[e] * bt[int64_t(e) * K + c];
          out[c] = acc;
        }
      }
    }
  }
}

// codes of tokens [0, nt) of a tile, transposed: out[j * kTile + t] (int32).
HWY_INLINE void UnpackTransposed(const uint8_t* rows, size_t row_bytes, int nt, int n_sub, int bits, int32_t* out) {
  if (bits == 8) {
    for (int t = 0; t < nt; ++t) {
      const uint8_t* r = rows + size_t(t) * row_bytes;
      for (int j = 0; j < n_sub; ++j) out[j * kTile + t] = r[j];
    }
  } else {
    for (int t = 0; t < nt; ++t) {
      const uint8_t* r = rows + size_t(t) * row_bytes;
      for (int j = 0; j < n_sub; ++j) out[j * kTile + t] = int32_t(read_code(r, j, bits));
    }
  }
  for (int j = 0; j < n_sub; ++j)  // pad the tile so whole vectors can be gathered
    for (int t = nt; t < kTile; ++t) out[j * kTile + t] = 0;
}

// Value rows of a tile decoded into registers, accumulated for NG heads: o_g += sum_t p_g[t] v_t.
template <int NG>
HWY_INLINE void AccumulateValues(const PQAttnArgs& a, const int32_t* vcT, int nt, const float* p, const float* alpha,
                                 float* o) {
  const int D = a.head_dim, sd = a.v_sub_dim, VC = 1 << a.v_bits;
  const int64_t book_stride = a.v_books == 1 ? 0 : int64_t(VC) * sd;
  const float* cb = a.v_codebook;
#if HWY_TARGET <= HWY_AVX3
  const hn::ScalableTag<float> df;  // 16 lanes
  const int N = 16;
  if (sd == 4 || sd == 8 || sd == 16) {
    const hn::Full128<float> d4;
    const hn::Full256<float> d8;
    const int per = N / sd;  // sub-spaces per vector
    for (int c0 = 0; c0 < D; c0 += N) {
      const int j0 = c0 / sd;
      auto o0 = hn::Mul(hn::LoadU(df, o + c0), hn::Set(df, alpha[0]));
      auto o1 = NG > 1 ? hn::Mul(hn::LoadU(df, o + D + c0), hn::Set(df, alpha[1])) : hn::Zero(df);
      auto o2 = NG > 2 ? hn::Mul(hn::LoadU(df, o + 2 * D + c0), hn::Set(df, alpha[2])) : hn::Zero(df);
      auto o3 = NG > 3 ? hn::Mul(hn::LoadU(df, o + 3 * D + c0), hn::Set(df, alpha[3])) : hn::Zero(df);
      const float* base[4];
      for (int u = 0; u < per; ++u) base[u] = cb + int64_t(j0 + u) * book_stride;
      for (int t = 0; t < nt; ++t) {
        hn::Vec<decltype(df)> v;
        if (sd == 16) {
          v = hn::LoadU(df, base[0] + int64_t(vcT[j0 * kTile + t]) * 16);
        } else if (sd == 8) {
          v = hn::Combine(df, hn::LoadU(d8, base[1] + int64_t(vcT[(j0 + 1) * kTile + t]) * 8),
                          hn::LoadU(d8, base[0] + int64_t(vcT[j0 * kTile + t]) * 8));
        } else {
          const auto lo = hn::Combine(d8, hn::LoadU(d4, base[1] + int64_t(vcT[(j0 + 1) * kTile + t]) * 4),
                                      hn::LoadU(d4, base[0] + int64_t(vcT[j0 * kTile + t]) * 4));
          const auto hi = hn::Combine(d8, hn::LoadU(d4, base[3] + int64_t(vcT[(j0 + 3) * kTile + t]) * 4),
                                      hn::LoadU(d4, base[2] + int64_t(vcT[(j0 + 2) * kTile + t]) * 4));
          v = hn::Combine(df, hi, lo);
        }
        o0 = hn::MulAdd(hn::Set(df, p[t]), v, o0);
        if (NG > 1) o1 = hn::MulAdd(hn::Set(df, p[kTile + t]), v, o1);
        if (NG > 2) o2 = hn::MulAdd(hn::Set(df, p[2 * kTile + t]), v, o2);
        if (NG > 3) o3 = hn::MulAdd(hn::Set(df, p[3 * kTile + t]), v, o3);
      }
      hn::StoreU(o0, df, o + c0);
      if (NG > 1) hn::StoreU(o1, df, o + D + c0);
      if (NG > 2) hn::StoreU(o2, df, o + 2 * D + c0);
      if (NG > 3) hn::StoreU(o3, df, o + 3 * D + c0);
    }
    return;
  }
#endif
  // Portable path: one sub-space slice at a time, heads' accumulators in memory.
  for (int g = 0; g < NG; ++g)
    for (int c = 0; c < D; ++c) o[int64_t(g) * D + c] *= alpha[g];
  for (int j = 0; j < D / sd; ++j) {
    const float* book = cb + int64_t(j) * book_stride;
    for (int t = 0; t < nt; ++t) {
      const float* cent = book + int64_t(vcT[j * kTile + t]) * sd;
      for (int g = 0; g < NG; ++g) {
        const float pg = p[g * kTile + t];
        float* og = o + int64_t(g) * D + j * sd;
        for (int e = 0; e < sd; ++e) og[e] += pg * cent[e];
      }
    }
  }
}

template <int NG>
void HeadsTile(const PQAttnArgs& a, const float* lut, const int32_t* kcT, const int32_t* vcT, int nt, float* s,
               float* m, float* d, float* o) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const int N = int(hn::Lanes(df));
  const int nks = a.head_dim / a.k_sub_dim, K = 1 << a.k_bits;
  alignas(64) float alpha[4];
  for (int g = 0; g < NG; ++g) {
    const float* lg = lut + int64_t(g) * nks * K;
    float* sg = s + g * kTile;
    auto vmax = hn::Set(df, -INFINITY);
    for (int t = 0; t < nt; t += N) {
      auto acc = hn::Zero(df);
      for (int j = 0; j < nks; ++j)
        acc = hn::Add(acc, hn::GatherIndex(df, lg + int64_t(j) * K, hn::LoadU(di, kcT + j * kTile + t)));
      acc = hn::IfThenElse(hn::FirstN(df, size_t(nt - t)), acc, hn::Set(df, -INFINITY));
      hn::Store(acc, df, sg + t);
      vmax = hn::Max(vmax, acc);
    }
    const float m_new = std::max(m[g], hn::GetLane(hn::MaxOfLanes(df, vmax)));
    alpha[g] = m[g] == -INFINITY ? 0.0f : std::exp(m[g] - m_new);
    const auto vm = hn::Set(df, m_new);
    auto vsum = hn::Zero(df);
    for (int t = 0; t < nt; t += N) {
      const auto pv = hn::Exp(df, hn::Sub(hn::Load(df, sg + t), vm));
      hn::Store(pv, df, sg + t);
      vsum = hn::Add(vsum, pv);
    }
    d[g] = d[g] * alpha[g] + hn::GetLane(hn::SumOfLanes(df, vsum));
    m[g] = m_new;
  }
  AccumulateValues<NG>(a, vcT, nt, s, alpha, o);
}

void Accumulate(const PQAttnArgs& a, const float* lut) {
  const int nks = a.head_dim / a.k_sub_dim, nvs = a.head_dim / a.v_sub_dim;
  const size_t krow = packed_row_bytes(nks, a.k_bits), vrow = packed_row_bytes(nvs, a.v_bits);
  // kcT: [nks, kTile] int32 key codes of a tile; vcT: [nvs, kTile] value codes; s: [4, kTile] scores
  thread_local AlignedBuffer<int32_t> kc_buf, vc_buf;
  thread_local AlignedBuffer<float> s_buf;
  if (kc_buf.size() < size_t(nks) * kTile) kc_buf.resize(size_t(nks) * kTile);
  if (vc_buf.size() < size_t(nvs) * kTile) vc_buf.resize(size_t(nvs) * kTile);
  if (s_buf.size() < size_t(4) * kTile) s_buf.resize(size_t(4) * kTile);
  const int K = 1 << a.k_bits;
  for (int t0 = 0; t0 < a.n_tokens; t0 += kTile) {
    const int nt = std::min(kTile, a.n_tokens - t0);
    UnpackTransposed(a.k_codes + size_t(t0) * krow, krow, nt, nks, a.k_bits, kc_buf.data());
    UnpackTransposed(a.v_codes + size_t(t0) * vrow, vrow, nt, nvs, a.v_bits, vc_buf.data());
    for (int g0 = 0; g0 < a.group; g0 += 4) {
      const int ng = std::min(4, a.group - g0);
      const float* lg = lut + int64_t(g0) * nks * K;
      float* og = a.o + int64_t(g0) * a.head_dim;
      switch (ng) {
        case 1: HeadsTile<1>(a, lg, kc_buf.data(), vc_buf.data(), nt, s_buf.data(), a.m + g0, a.d + g0, og); break;
        case 2: HeadsTile<2>(a, lg, kc_buf.data(), vc_buf.data(), nt, s_buf.data(), a.m + g0, a.d + g0, og); break;
        case 3: HeadsTile<3>(a, lg, kc_buf.data(), vc_buf.data(), nt, s_buf.data(), a.m + g0, a.d + g0, og); break;
        default: HeadsTile<4>(a, lg, kc_buf.data(), vc_buf.data(), nt, s_buf.data(), a.m + g0, a.d + g0, og); break;
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace vq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace vq::cpu {
HWY_EXPORT(BuildLut);
HWY_EXPORT(Accumulate);

std::vector<float> transpose_codebook(const float* cb, int books, int bits, int sd) {
  const int K = 1 << bits;
  std::vector<float> t(size_t(books) * K * sd);  // [books, sd, K]
  for (int b = 0; b < books; ++b)
    for (int c = 0; c < K; ++c)
      for (int e = 0; e < sd; ++e) t[(size_t(b) * sd + e) * K + c] = cb[(size_t(b) * K + c) * sd + e];
  return t;
}

size_t pq_lut_floats(const PQAttnArgs& a) { return size_t(a.group) * (a.head_dim / a.k_sub_dim) * (size_t(1) << a.k_bits); }

void pq_build_lut(const PQAttnArgs& a, const float* cbt, float* lut) { HWY_DYNAMIC_DISPATCH(BuildLut)(a, cbt, lut); }

void pq_attention_accumulate(const PQAttnArgs& a, const float* lut) {
  if (a.n_tokens > 0) HWY_DYNAMIC_DISPATCH(Accumulate)(a, lut);
}

void pq_attention(const PQAttnArgs& a) {
  check_pq_attn_args(a, "cpu::pq_attention");
  for (int g = 0; g < a.group; ++g) {
    a.m[g] = -INFINITY;
    a.d[g] = 0.0f;
  }
  std::fill(a.o, a.o + int64_t(a.group) * a.head_dim, 0.0f);
  if (a.n_tokens == 0) return;
  const std::vector<float> cbt = transpose_codebook(a.k_codebook, a.k_books, a.k_bits, a.k_sub_dim);
  std::vector<float> lut(pq_lut_floats(a));
  pq_build_lut(a, cbt.data(), lut.data());
  pq_attention_accumulate(a, lut.data());
}

}  // namespace vq::cpu
#endif
