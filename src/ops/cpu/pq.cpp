// Fused nearest-centroid search (see pq.h). Per target (Highway foreach_target), a kernel
// holds R sub-vectors x C vectors of L centroids of partial distances in registers, walks the
// codebook once per R sub-vectors, and keeps a per-lane running min/argmin in registers; the
// L lanes are reduced once per sub-vector at the end.
#include "ops/cpu/no_sve_targets.h"  // first: before any Highway header
#include "ops/cpu/pq.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/thread_pool.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/pq.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace vq::cpu {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

int Lanes32() { return int(hn::Lanes(hn::ScalableTag<float>())); }
const char* TargetName() { return hwy::TargetName(HWY_TARGET); }

// One block of R sub-vectors against a whole codebook.
// ct: [kv, D, L] transposed centroids (kv = k_pad / L vectors); norms: [k_pad] (kDot only).
// Sub-vector r starts at x + r*xs; its code goes to out[r*os].
// (Arrays of vectors: fine on x86/NEON; SVE targets are not built by this Highway version.)
template <int D, int R, int C, bool kDot>
HWY_INLINE void EncodeBlock(const float* HWY_RESTRICT ct, const float* HWY_RESTRICT norms, int64_t kv,
                            const float* HWY_RESTRICT x, int64_t xs, uint16_t* HWY_RESTRICT out, int64_t os) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  using VF = hn::Vec<decltype(df)>;
  using VI = hn::Vec<decltype(di)>;
  const int64_t L = int64_t(hn::Lanes(df));
  float xv[R][D];  // the block's sub-vectors (kDot: times -2)
  for (int r = 0; r < R; ++r)
    for (int e = 0; e < D; ++e) xv[r][e] = kDot ? -2.0f * x[r * xs + e] : x[r * xs + e];
  VF best[R];
  VI bidx[R];
  for (int r = 0; r < R; ++r) {
    best[r] = hn::Set(df, std::numeric_limits<float>::infinity());
    bidx[r] = hn::Zero(di);
  }
  VI cidx = hn::Iota(di, 0);
  const VI step = hn::Set(di, int32_t(L));
  for (int64_t v = 0; v < kv; v += C) {
    const float* cb = ct + v * D * L;
    VF acc[R][C];
    for (int j = 0; j < C; ++j) {
      const VF init = kDot ? hn::LoadU(df, norms + (v + j) * L) : hn::Zero(df);
      for (int r = 0; r < R; ++r) acc[r][j] = init;
    }
    for (int e = 0; e < D; ++e) {
      VF c[C];
      for (int j = 0; j < C; ++j) c[j] = hn::Load(df, cb + (j * D + e) * L);
      for (int r = 0; r < R; ++r) {
        const VF xb = hn::Set(df, xv[r][e]);
        for (int j = 0; j < C; ++j) {
          if constexpr (kDot) {
            acc[r][j] = hn::MulAdd(xb, c[j], acc[r][j]);
          } else {
            const VF diff = hn::Sub(xb, c[j]);
            acc[r][j] = hn::MulAdd(diff, diff, acc[r][j]);
          }
        }
      }
    }
    for (int j = 0; j < C; ++j) {
      for (int r = 0; r < R; ++r) {
        const auto m = hn::Lt(acc[r][j], best[r]);
        best[r] = hn::IfThenElse(m, acc[r][j], best[r]);
        bidx[r] = hn::IfThenElse(hn::RebindMask(di, m), cidx, bidx[r]);
      }
      cidx = hn::Add(cidx, step);
    }
  }
  // Lane reduction: the minimum, then the lowest centroid index holding it.
  const VI big = hn::Set(di, std::numeric_limits<int32_t>::max());
  for (int r = 0; r < R; ++r) {
    const VF mn = hn::MinOfLanes(df, best[r]);
    const VI cand = hn::IfThenElse(hn::RebindMask(di, hn::Eq(best[r], mn)), bidx[r], big);
    const int32_t code = hn::GetLane(hn::MinOfLanes(di, cand));
    out[r * os] = uint16_t(code == std::numeric_limits<int32_t>::max() ? 0 : code);  // NaN: code 0
  }
}

// Sub-vectors t = 0..m-1 at x + t*xs, codes at out + t*os, all against one codebook.
template <int D, int R, int C, bool kDot>
HWY_NOINLINE void EncodeRun(const float* ct, const float* norms, int64_t kv, const float* x, int64_t xs, int64_t m,
                            uint16_t* out, int64_t os) {
  int64_t t = 0;
  for (; t + R <= m; t += R) EncodeBlock<D, R, C, kDot>(ct, norms, kv, x + t * xs, xs, out + t * os, os);
  for (; t < m; ++t) EncodeBlock<D, 1, C, kDot>(ct, norms, kv, x + t * xs, xs, out + t * os, os);
}

// Any sub_dim: the transposed layout with a runtime loop over dims, one sub-vector at a time.
template <bool kDot>
HWY_NOINLINE void EncodeRunGeneric(int d, const float* ct, const float* norms, int64_t kv, const float* x, int64_t xs,
                                   int64_t m, uint16_t* out, int64_t os) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const int64_t L = int64_t(hn::Lanes(df));
  for (int64_t t = 0; t < m; ++t) {
    const float* xt = x + t * xs;
    auto best = hn::Set(df, std::numeric_limits<float>::infinity());
    auto bidx = hn::Zero(di);
    auto cidx = hn::Iota(di, 0);
    for (int64_t v = 0; v < kv; ++v) {
      auto acc = kDot ? hn::LoadU(df, norms + v * L) : hn::Zero(df);
      for (int e = 0; e < d; ++e) {
        const auto c = hn::Load(df, ct + (v * d + e) * L);
        if constexpr (kDot) {
          acc = hn::MulAdd(hn::Set(df, -2.0f * xt[e]), c, acc);
        } else {
          const auto diff = hn::Sub(hn::Set(df, xt[e]), c);
          acc = hn::MulAdd(diff, diff, acc);
        }
      }
      const auto msk = hn::Lt(acc, best);
      best = hn::IfThenElse(msk, acc, best);
      bidx = hn::IfThenElse(hn::RebindMask(di, msk), cidx, bidx);
      cidx = hn::Add(cidx, hn::Set(di, int32_t(L)));
    }
    const auto mn = hn::MinOfLanes(df, best);
    const auto cand =
        hn::IfThenElse(hn::RebindMask(di, hn::Eq(best, mn)), bidx, hn::Set(di, std::numeric_limits<int32_t>::max()));
    const int32_t code = hn::GetLane(hn::MinOfLanes(di, cand));
    out[t * os] = uint16_t(code == std::numeric_limits<int32_t>::max() ? 0 : code);
  }
}

// Register blocking per (sub_dim, centroid vectors C): R x C accumulators plus 2R min/argmin
// vectors and C centroid vectors must fit the register file.
template <int D, bool kDot>
void RunD(int c_vecs, const float* ct, const float* norms, int64_t kv, const float* x, int64_t xs, int64_t m,
          uint16_t* out, int64_t os) {
  switch (c_vecs) {
    case 1: return EncodeRun<D, 8, 1, kDot>(ct, norms, kv, x, xs, m, out, os);
    case 2: return EncodeRun<D, 6, 2, kDot>(ct, norms, kv, x, xs, m, out, os);
    default: return EncodeRun<D, 4, 4, kDot>(ct, norms, kv, x, xs, m, out, os);
  }
}

void EncodeRunAny(int d, int c_vecs, bool dot, const float* ct, const float* norms, int64_t kv, const float* x,
                  int64_t xs, int64_t m, uint16_t* out, int64_t os) {
  if (dot) {
    switch (d) {
      case 2: return RunD<2, true>(c_vecs, ct, norms, kv, x, xs, m, out, os);
      case 4: return RunD<4, true>(c_vecs, ct, norms, kv, x, xs, m, out, os);
      case 8: return RunD<8, true>(c_vecs, ct, norms, kv, x, xs, m, out, os);
      case 16: return RunD<16, true>(c_vecs, ct, norms, kv, x, xs, m, out, os);
      default: return EncodeRunGeneric<true>(d, ct, norms, kv, x, xs, m, out, os);
    }
  }
  switch (d) {
    case 2: return RunD<2, false>(c_vecs, ct, norms, kv, x, xs, m, out, os);
    case 4: return RunD<4, false>(c_vecs, ct, norms, kv, x, xs, m, out, os);
    case 8: return RunD<8, false>(c_vecs, ct, norms, kv, x, xs, m, out, os);
    case 16: return RunD<16, false>(c_vecs, ct, norms, kv, x, xs, m, out, os);
    default: return EncodeRunGeneric<false>(d, ct, norms, kv, x, xs, m, out, os);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace vq::cpu
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace vq::cpu {
HWY_EXPORT(Lanes32);
HWY_EXPORT(TargetName);

const char* simd_target_name() { return HWY_DYNAMIC_DISPATCH(TargetName)(); }
HWY_EXPORT(EncodeRunAny);

namespace {
// Padding centroid coordinate: its distance is +inf (or NaN for infinite x), which never
// compares below the running minimum (initially +inf), so a padding index is never chosen.
constexpr float kPadCoord = std::numeric_limits<float>::infinity();
}  // namespace

PQEncoder::PQEncoder(const PQShape& s, const float* books, PQDistance dist) : s_(s), dist_(dist) {
  check_pq_shape(s, "cpu::PQEncoder");
  const int k = s.n_centroids, d = s.sub_dim, nb = pq_n_books(s);
  // Measured on AVX-512 (Zen 4, 1 thread, GFLOP/s counting 3*d per pair), direct vs dot:
  // k=256: d4 92 vs 102, d8 108 vs 113; k=4096: d8 118 vs 141, d16 127 vs 156. The dot form
  // pays off only for large codebooks, and its rounding grows with |x|^2 + |c|^2, so it is
  // used for k >= 1024 (b >= 10) only.
  if (dist_ == PQDistance::auto_select) dist_ = k >= 1024 ? PQDistance::dot : PQDistance::direct;
  lanes_ = HWY_DYNAMIC_DISPATCH(Lanes32)();
  const int64_t kv_min = (k + lanes_ - 1) / lanes_;
  c_vecs_ = kv_min >= 4 ? 4 : int(kv_min);  // 1, 2, 3 or 4 (3 runs as 4)
  if (c_vecs_ == 3) c_vecs_ = 4;
  if (d != 2 && d != 4 && d != 8 && d != 16) c_vecs_ = 1;  // generic kernel walks one vector at a time
  const int64_t block = int64_t(lanes_) * c_vecs_;
  k_pad_ = (k + block - 1) / block * block;
  const int64_t kv = k_pad_ / lanes_;
  ct_.resize(size_t(nb) * k_pad_ * d);
  std::fill(ct_.begin(), ct_.end(), kPadCoord);
  for (int b = 0; b < nb; ++b)
    for (int c = 0; c < k; ++c)
      for (int e = 0; e < d; ++e)
        ct_[size_t(((int64_t(b) * kv + c / lanes_) * d + e) * lanes_ + c % lanes_)] =
            books[(int64_t(b) * k + c) * d + e];
  if (dist_ == PQDistance::dot) {
    norms_.resize(size_t(nb) * k_pad_);
    std::fill(norms_.begin(), norms_.end(), std::numeric_limits<float>::infinity());
    std::fill(ct_.begin(), ct_.end(), 0.0f);  // padding: coordinates 0, |c|^2 = +inf
    for (int b = 0; b < nb; ++b)
      for (int c = 0; c < k; ++c) {
        float n2 = 0;
        for (int e = 0; e < d; ++e) {
          const float v = books[(int64_t(b) * k + c) * d + e];
          n2 += v * v;
          ct_[size_t(((int64_t(b) * kv + c / lanes_) * d + e) * lanes_ + c % lanes_)] = v;
        }
        norms_[size_t(int64_t(b) * k_pad_ + c)] = n2;
      }
  }
}

void PQEncoder::encode(const float* x, int64_t n, uint16_t* codes) const {
  VQ_CHECK(n >= 0, "cpu::pq_encode: n = {} must be >= 0", n);
  if (n == 0) return;
  const int d = s_.sub_dim, ns = s_.n_sub;
  const int64_t kv = k_pad_ / lanes_;
  const bool dot = dist_ == PQDistance::dot;
  const float* norms = dot ? norms_.data() : nullptr;
  // Rows per task: enough distance work (~1M element-pairs) to amortise the dispatch.
  const int64_t work_per_row = int64_t(ns) * k_pad_ * d;
  const size_t grain = size_t(std::max<int64_t>(1, (int64_t(1) << 20) / std::max<int64_t>(1, work_per_row)));
  const auto run = HWY_DYNAMIC_DISPATCH(EncodeRunAny);
  parallel_for(size_t(n), [&](size_t r0, size_t r1, int) {
    const int64_t rows = int64_t(r1 - r0);
    const float* xb = x + int64_t(r0) * ns * d;
    uint16_t* ob = codes + int64_t(r0) * ns;
    if (!s_.per_subspace) {  // every sub-vector of every row against the one codebook
      run(d, c_vecs_, dot, ct_.data(), norms, kv, xb, d, rows * ns, ob, 1);
    } else {  // sub-space j of every row against book j (book stays in cache)
      for (int j = 0; j < ns; ++j)
        run(d, c_vecs_, dot, ct_.data() + int64_t(j) * k_pad_ * d, dot ? norms + int64_t(j) * k_pad_ : nullptr, kv,
            xb + int64_t(j) * d, int64_t(ns) * d, rows, ob + j, ns);
    }
  }, grain);
}

void pq_encode(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes) {
  check_pq_shape(s, "cpu::pq_encode");
  if (s.n == 0) return;
  PQEncoder(s, codebooks).encode(x, s.n, codes);
}

void pq_decode(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out) {
  check_pq_shape(s, "cpu::pq_decode");
  const int k = s.n_centroids, d = s.sub_dim, ns = s.n_sub;
  const size_t grain = size_t(std::max(1, 65536 / (ns * d)));
  parallel_for(size_t(s.n), [&](size_t r0, size_t r1, int) {
    for (int64_t i = int64_t(r0); i < int64_t(r1); ++i)
      for (int j = 0; j < ns; ++j) {
        const uint16_t c = codes[i * ns + j];
        VQ_CHECK(c < k, "cpu::pq_decode: code {} at [{}, {}] >= n_centroids {}", c, i, j, k);
        const float* src = codebooks + ((s.per_subspace ? int64_t(j) * k : 0) + c) * d;
        std::memcpy(out + (i * ns + j) * d, src, size_t(d) * sizeof(float));
      }
  }, grain);
}

}  // namespace vq::cpu
#endif
