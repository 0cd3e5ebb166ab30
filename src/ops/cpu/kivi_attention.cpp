// KIVI partial attention (ops/cpu/scalar_attention.h). b-bit codes are widened N bytes at a time
// (one byte per 32-bit lane) and split by shifts, so lane j of sub-vector k of chunk c holds
// channel cpb*(c*N + j) + k (cpb = 8/b codes per byte): a fixed permutation of the channels.
// Instead of un-permuting the codes, the kernel works in that order: per key group the queries
// are multiplied by the key scales and permuted once (score = q.min + sum code * (q*scale)); the
// value accumulators live in permuted order during the call (per-token value scales reach their
// lanes by one table lookup) and the value mins are summed per channel group, then both are put
// back in channel order when the call ends.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/bitpack.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/fp16.h"
#include "ops/cpu/scalar_attention.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/kivi_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "ops/cpu/softmax_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;


// Codes of sub-vector k of chunk c of a row, as f32 lanes.
template <class DF>
HWY_INLINE hn::Vec<DF> CodeVec(DF df, const uint8_t* row, int c, int k, int bits) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> du8;
  const int N = int(hn::Lanes(df));
  const auto by = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(), hn::LoadU(du8, row + size_t(c) * N)));
  return hn::ConvertTo(df, hn::And(hn::ShiftRightSame(by, k * bits), hn::Set(di, (1 << bits) - 1)));
}

template <class DF>
void KiviImpl(DF df, const cpu::KiviAttnArgs& a) {
  const int N = int(hn::Lanes(df));
  const int D = a.head_dim, GQ = a.group, GK = a.kivi_group, bits = a.bits, cpb = 8 / bits;
  const int n_chunks = D / (N * cpb), ncg = D / GK;
  const size_t krow = packed_row_bytes(D, bits);
  // perm: [D] channel of permuted position p; lane_cg: [D] int32 value channel group of p;
  // qs: [GQ, D] permuted q * key scale; op: [GQ, D] permuted value accumulators; bias: [GQ, ncg];
  // s: [GQ, kTile]; vsc, vmn: [kTile, N] per-token value scales / mins (ncg used); qm: [GQ]
  thread_local AlignedBuffer<int32_t> perm_buf, lane_cg_buf;
  thread_local AlignedBuffer<float> qs_buf, op_buf, bias_buf, s_buf, vsc_buf, vmn_buf, qm_buf, al_buf, ks_buf, km_buf;
  auto need = [](auto& b, size_t n) {
    if (b.size() < n) b.resize(n);
    return b.data();
  };
  int32_t* perm = need(perm_buf, size_t(D));
  int32_t* lane_cg = need(lane_cg_buf, size_t(D));
  float* qs = need(qs_buf, size_t(GQ) * D);
  float* op = need(op_buf, size_t(GQ) * D);
  float* bias = need(bias_buf, size_t(GQ) * ncg);
  float* s = need(s_buf, size_t(GQ) * kTile);
  float* vsc = need(vsc_buf, size_t(kTile) * N);
  float* vmn = need(vmn_buf, size_t(kTile) * N);
  float* qm = need(qm_buf, size_t(GQ));
  float* alpha = need(al_buf, size_t(GQ));
  float* ksc = need(ks_buf, size_t(D));
  float* kmn = need(km_buf, size_t(D));
  for (int c = 0; c < n_chunks; ++c)
    for (int k = 0; k < cpb; ++k)
      for (int j = 0; j < N; ++j) {
        const int p = (c * cpb + k) * N + j;
        perm[p] = cpb * (c * N + j) + k;
        lane_cg[p] = perm[p] / GK;
      }
  for (int g = 0; g < GQ; ++g) {
    for (int p = 0; p < D; ++p) op[g * D + p] = a.o[int64_t(g) * D + perm[p]];
    std::fill(bias + g * ncg, bias + (g + 1) * ncg, 0.0f);
  }
  const hn::RebindToSigned<DF> di;
  const int t_end = a.first + a.n_tokens;
  for (int t0 = a.first; t0 < t_end;) {
    // one key group (or its first kTile tokens): its scale/min fold into the queries
    const int grp = t0 / GK, in_grp = t0 % GK;
    const int nt = std::min({kTile, GK - in_grp, t_end - t0});
    const uint8_t* kg = a.k_groups + size_t(grp) * a.k_group_stride;
    if (in_grp == 0 || t0 == a.first) {
      for (int ch = 0; ch < D; ++ch) {
        ksc[ch] = LoadF16Scalar(kg + size_t(ch) * 2);
        kmn[ch] = LoadF16Scalar(kg + size_t(D) * 2 + size_t(ch) * 2);
      }
      for (int g = 0; g < GQ; ++g) {
        const float* qg = a.q + int64_t(g) * D;
        float acc = 0;
        for (int ch = 0; ch < D; ++ch) acc += qg[ch] * kmn[ch];
        qm[g] = acc;
        for (int p = 0; p < D; ++p) qs[g * D + p] = qg[perm[p]] * ksc[perm[p]];
      }
    }
    // scores, up to 4 heads' accumulators in registers
    const uint8_t* kc = kg + size_t(D) * 4 + size_t(in_grp) * krow;
    for (int g0 = 0; g0 < GQ; g0 += 4) {
      const int ng = std::min(4, GQ - g0);
      const float* q0 = qs + g0 * D;
      for (int t = 0; t < nt; ++t) {
        const uint8_t* row = kc + size_t(t) * krow;
        auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
        for (int c = 0; c < n_chunks; ++c)
          for (int k = 0; k < cpb; ++k) {
            const auto cv = CodeVec(df, row, c, k, bits);
            const int p = (c * cpb + k) * N;
            a0 = hn::MulAdd(cv, hn::Load(df, q0 + p), a0);
            if (ng > 1) a1 = hn::MulAdd(cv, hn::Load(df, q0 + D + p), a1);
            if (ng > 2) a2 = hn::MulAdd(cv, hn::Load(df, q0 + 2 * D + p), a2);
            if (ng > 3) a3 = hn::MulAdd(cv, hn::Load(df, q0 + 3 * D + p), a3);
          }
        s[g0 * kTile + t] = qm[g0] + hn::GetLane(hn::SumOfLanes(df, a0));
        if (ng > 1) s[(g0 + 1) * kTile + t] = qm[g0 + 1] + hn::GetLane(hn::SumOfLanes(df, a1));
        if (ng > 2) s[(g0 + 2) * kTile + t] = qm[g0 + 2] + hn::GetLane(hn::SumOfLanes(df, a2));
        if (ng > 3) s[(g0 + 3) * kTile + t] = qm[g0 + 3] + hn::GetLane(hn::SumOfLanes(df, a3));
      }
    }
    SoftmaxTile(df, s, GQ, nt, a.m, a.d, alpha);
    // value rows: per-token scales (for the lanes) and mins (summed per channel group)
    for (int t = 0; t < nt; ++t) {
      const uint8_t* vr = a.v_rows + size_t(t0 + t) * a.v_stride;
      for (int cg = 0; cg < ncg; ++cg) {
        vsc[t * N + cg] = LoadF16Scalar(vr + size_t(cg) * 4);
        vmn[t * N + cg] = LoadF16Scalar(vr + size_t(cg) * 4 + 2);
      }
    }
    for (int g = 0; g < GQ; ++g) {
      const auto va = hn::Set(df, alpha[g]);
      for (int p = 0; p < D; p += N) hn::Store(hn::Mul(hn::Load(df, op + g * D + p), va), df, op + g * D + p);
      float* bg = bias + g * ncg;
      for (int cg = 0; cg < ncg; ++cg) {
        float acc = bg[cg] * alpha[g];
        for (int t = 0; t < nt; ++t) acc += s[g * kTile + t] * vmn[t * N + cg];
        bg[cg] = acc;
      }
    }
    for (int c = 0; c < n_chunks; ++c)
      for (int k = 0; k < cpb; ++k) {
        const int p = (c * cpb + k) * N;
        const auto idx = hn::SetTableIndices(df, lane_cg + p);
        for (int g0 = 0; g0 < GQ; g0 += 4) {
          const int ng = std::min(4, GQ - g0);
          float* o0 = op + g0 * D + p;
          auto v0 = hn::Load(df, o0);
          auto v1 = ng > 1 ? hn::Load(df, o0 + D) : hn::Zero(df);
          auto v2 = ng > 2 ? hn::Load(df, o0 + 2 * D) : hn::Zero(df);
          auto v3 = ng > 3 ? hn::Load(df, o0 + 3 * D) : hn::Zero(df);
          const float* sg = s + g0 * kTile;
          for (int t = 0; t < nt; ++t) {
            const uint8_t* vr = a.v_rows + size_t(t0 + t) * a.v_stride + size_t(ncg) * 4;
            const auto x = hn::Mul(CodeVec(df, vr, c, k, bits), hn::TableLookupLanes(hn::Load(df, vsc + t * N), idx));
            v0 = hn::MulAdd(hn::Set(df, sg[t]), x, v0);
            if (ng > 1) v1 = hn::MulAdd(hn::Set(df, sg[kTile + t]), x, v1);
            if (ng > 2) v2 = hn::MulAdd(hn::Set(df, sg[2 * kTile + t]), x, v2);
            if (ng > 3) v3 = hn::MulAdd(hn::Set(df, sg[3 * kTile + t]), x, v3);
          }
          hn::Store(v0, df, o0);
          if (ng > 1) hn::Store(v1, df, o0 + D);
          if (ng > 2) hn::Store(v2, df, o0 + 2 * D);
          if (ng > 3) hn::Store(v3, df, o0 + 3 * D);
        }
      }
    t0 += nt;
  }
  (void)di;
  for (int g = 0; g < GQ; ++g)
    for (int p = 0; p < D; ++p) a.o[int64_t(g) * D + perm[p]] = op[g * D + p] + bias[g * ncg + lane_cg[p]];
}

// Lanes usable for this geometry (chunks of N bytes must tile a row; per-token value scales of a
// row must fit one vector for the lane lookup); 0: use the scalar form.
template <class DF>
bool Fits(DF df, const cpu::KiviAttnArgs& a) {
  const int N = int(hn::Lanes(df)), cpb = 8 / a.bits;
  return a.head_dim % (N * cpb) == 0 && a.head_dim / a.kivi_group <= N;
}

void KiviScalar(const cpu::KiviAttnArgs& a);

void KiviAttention(const cpu::KiviAttnArgs& a) {
  const hn::ScalableTag<float> d16;
  const hn::CappedTag<float, 8> d8;
  const hn::CappedTag<float, 4> d4;
  if (Fits(d16, a)) return KiviImpl(d16, a);
  if (Fits(d8, a)) return KiviImpl(d8, a);
  if (Fits(d4, a)) return KiviImpl(d4, a);
  KiviScalar(a);
}

// Any geometry: decode a row at a time (plain C++).
void KiviScalar(const cpu::KiviAttnArgs& a) {
  const int D = a.head_dim, GQ = a.group, GK = a.kivi_group, ncg = D / GK;
  const size_t krow = packed_row_bytes(D, a.bits);
  std::vector<float> x(static_cast<size_t>(D)), s(static_cast<size_t>(GQ));
  for (int t = a.first; t < a.first + a.n_tokens; ++t) {
    const uint8_t* kg = a.k_groups + size_t(t / GK) * a.k_group_stride;
    const uint8_t* row = kg + size_t(D) * 4 + size_t(t % GK) * krow;
    for (int ch = 0; ch < D; ++ch)
      x[size_t(ch)] = LoadF16Scalar(kg + size_t(D) * 2 + size_t(ch) * 2) +
                      LoadF16Scalar(kg + size_t(ch) * 2) * float(read_code(row, ch, a.bits));
    for (int g = 0; g < GQ; ++g) {
      float acc = 0;
      for (int ch = 0; ch < D; ++ch) acc += a.q[int64_t(g) * D + ch] * x[size_t(ch)];
      const float m_new = std::max(a.m[g], acc);
      const float alpha = a.m[g] == -INFINITY ? 0.0f : std::exp(a.m[g] - m_new);
      s[size_t(g)] = std::exp(acc - m_new);
      a.d[g] = a.d[g] * alpha + s[size_t(g)];
      a.m[g] = m_new;
      for (int ch = 0; ch < D; ++ch) a.o[int64_t(g) * D + ch] *= alpha;
    }
    const uint8_t* vr = a.v_rows + size_t(t) * a.v_stride;
    for (int ch = 0; ch < D; ++ch)
      x[size_t(ch)] = LoadF16Scalar(vr + size_t(ch / GK) * 4 + 2) +
                      LoadF16Scalar(vr + size_t(ch / GK) * 4) * float(read_code(vr + size_t(ncg) * 4, ch, a.bits));
    for (int g = 0; g < GQ; ++g)
      for (int ch = 0; ch < D; ++ch) a.o[int64_t(g) * D + ch] += s[size_t(g)] * x[size_t(ch)];
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace vq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace vq::cpu {
HWY_EXPORT(KiviAttention);

void kivi_attention(const KiviAttnArgs& a) {
  VQ_CHECK(a.bits == 2 || a.bits == 4, "cpu::kivi_attention: bits = {} must be 2 or 4", a.bits);
  VQ_CHECK(a.kivi_group >= 1 && a.head_dim > 0 && a.head_dim % a.kivi_group == 0,
           "cpu::kivi_attention: kivi_group {} must divide head_dim {}", a.kivi_group, a.head_dim);
  VQ_CHECK(a.group > 0 && a.n_tokens >= 0, "cpu::kivi_attention: group {}, n_tokens {}", a.group, a.n_tokens);
  if (a.n_tokens > 0) HWY_DYNAMIC_DISPATCH(KiviAttention)(a);
}
}  // namespace vq::cpu
#endif
