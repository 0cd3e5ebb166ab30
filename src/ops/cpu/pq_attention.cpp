// Attention on VecInfer codes, CPU (Highway, runtime dispatch). Why this shape: see
// docs/CPU_KV_NOTES.md (counts per token, variants measured).
//
// - The LUT interleaves KH heads of the GQA group per entry: LUT[hg][j][c][KH], KH = 4 or 8
//   (pq_lut_heads: 8 where it wastes no more lanes than 4, i.e. groups of 5-8, 13-16, ...). One
//   16- or 32-byte load brings the (sub-space j, centroid c) term of KH heads, so the table reads
//   of a token serve KH query heads; no gathers, no transposition of the codes (they are read
//   where they lie). Groups of 6 (Qwen2.5-1.5B) run as one 8-head pass, not two 4-head passes
//   that each walk the codes again.
// - Tokens go in blocks of kBlock; inside a block the sub-spaces are visited in passes of a few,
//   so the LUT slice (keys) and codebook slice (values) of a pass stay in L1 (a whole d4b8 LUT
//   for 4 heads is 64 KiB, twice L1).
// - Softmax is online per block on the [token][KH heads] score tile, vectorised 16 lanes wide.
// - Values are decoded in registers: per token, a centroid (broadcast) times the block's softmax
//   weights of the KH heads (expanded by one permute) is KH * sub_dim / lanes FMAs per sub-space.
//   On 8-lane targets with 8-head entries holding 5-8 heads, the lanes hold two 4-dim sub-spaces of
//   one head instead (one FMA per head and sub-space pair, no lanes of padding heads).
#include "ops/cpu/no_sve_targets.h"  // first: before any Highway header
#include "ops/cpu/pq_attention.h"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/bitpack.h"
#include "core/buffer.h"
#include "core/error.h"
#include "ops/cpu/prefetch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/pq_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

constexpr int kBlock = 256;  // tokens per softmax step

// Key sub-spaces per pass over a block: the pass's LUT slice (4 x 2^bits x KH floats: 16 KiB at
// KH = 4, 32 KiB at KH = 8 for 8-bit codes) stays in L1 (2 per pass measured slower for KH = 8).
constexpr int kKJ = 4;

// Sub-spaces of the key codebook requested ahead of the one being multiplied: a sub-space's
// products take ~50 ns at 4 heads, a line from DRAM ~100 ns.
constexpr int kLutBookAhead = 2;

// The tables of key sub-spaces [j0, j1) of every head group (a part of one query's tables, so that
// one table's build can be split over threads).
template <int KH>
void BuildLutT(const PQAttnArgs& a, const float* cbt, float* lut, int j0, int j1) {
  const hn::ScalableTag<float> df;
  const int N = int(hn::Lanes(df));
  const int sd = a.k_sub_dim, nks = a.head_dim / sd, K = 1 << a.k_bits;
  const int n_hg = (a.group + KH - 1) / KH, nj = j1 - j0;
  if (nj <= 0) return;
  // The codebooks are read once per decode step and layer: the step's weights have pushed them out
  // of every cache level, and their short runs (one sub-space is sd rows of K floats) are too short
  // for the hardware prefetchers, so a build waited on DRAM for each line (docs/CPU_KV_NOTES.md 4).
  // The key book's sub-spaces are requested kLutBookAhead ahead into L1, and the value book (when
  // a.v_codebook is set; the share [j0, j1) of it) into L2 for the attention that follows, both
  // paced over the products.
  const size_t kslice = size_t(sd) * K * sizeof(float);
  const bool kpaced = a.k_books != 1 && K % N == 0;
  auto bytes_of = [](const float* f) { return reinterpret_cast<const uint8_t*>(f); };
  cpu::Slices vbook;  // over every products step of the build
  if (a.v_codebook && K % N == 0) {
    const size_t vbytes = size_t(a.v_books) * (size_t(1) << a.v_bits) * a.v_sub_dim * sizeof(float);
    const size_t v0 = vbytes * size_t(j0) / size_t(nks) / 64 * 64, v1 = vbytes * size_t(j1) / size_t(nks);
    vbook = cpu::Slices(bytes_of(a.v_codebook) + v0, v1 - v0, n_hg * nj * std::min(KH, a.group) * (K / N));
  }
  int vstep = 0;
  for (int j = j0; j < (kpaced ? std::min(j0 + kLutBookAhead, j1) : j0 + 1); ++j)
    cpu::Slices(bytes_of(cbt + int64_t(j) * sd * K), kslice, 1)(0);
  // rows: [KH, K] f32, one head's table of sub-space j before interleaving; quads: [KH / 4][K][4]
  thread_local AlignedBuffer<float> rows_buf, quad_buf;
  if (rows_buf.size() < size_t(KH) * K) rows_buf.resize(size_t(KH) * K);
  if (KH != 4 && quad_buf.size() < size_t(KH) * K) quad_buf.resize(size_t(KH) * K);  // KH = 4 writes dst directly
  float* rows = rows_buf.data();
  for (int hg = 0; hg < n_hg; ++hg) {
    for (int j = j0; j < j1; ++j) {
      const float* bt = cbt + int64_t(a.k_books == 1 ? 0 : j) * sd * K;  // [sd][K]
      const int jn = hg * nj + (j - j0) + kLutBookAhead;  // the sub-space requested during this one
      const cpu::Slices knext(kpaced && jn < n_hg * nj ? bytes_of(cbt + int64_t(j0 + jn % nj) * sd * K) : nullptr,
                              kslice, std::min(KH, a.group - hg * KH) * (K / N));
      int kstep = 0;
      for (int h = 0; h < KH; ++h) {
        float* out = rows + int64_t(h) * K;
        const int g = hg * KH + h;
        if (g >= a.group) {
          std::fill(out, out + K, 0.0f);
          continue;
        }
        const float* qj = a.q + int64_t(g) * a.head_dim + j * sd;
        if (K % N == 0) {
          for (int c = 0; c < K; c += N) {
            auto acc = hn::Mul(hn::Set(df, qj[0]), hn::LoadU(df, bt + c));
            for (int e = 1; e < sd; ++e) acc = hn::MulAdd(hn::Set(df, qj[e]), hn::LoadU(df, bt + int64_t(e) * K + c), acc);
            hn::Store(acc, df, out + c);
            knext(kstep++);
            vbook.request<2>(vstep++);
          }
        } else {
          for (int c = 0; c < K; ++c) {
            float acc = qj[0] * bt[c];
            for (int e = 1; e < sd; ++e) acc += qj[e] * bt[int64_t(e) * K + c];
            out[c] = acc;
          }
        }
      }
      float* dst = lut + (int64_t(hg) * nks + j) * K * KH;  // [K][KH]
#if HWY_TARGET != HWY_SCALAR
      if (K % N == 0) {
        // four heads at a time into [K][4] quads, then the quads side by side per centroid
        float* quads = KH == 4 ? dst : quad_buf.data();
        for (int q4 = 0; q4 < KH / 4; ++q4) {
          const float* r = rows + int64_t(q4) * 4 * K;
          for (int c = 0; c < K; c += N)
            hn::StoreInterleaved4(hn::Load(df, r + c), hn::Load(df, r + K + c), hn::Load(df, r + 2 * K + c),
                                  hn::Load(df, r + 3 * K + c), df, quads + int64_t(q4) * 4 * K + int64_t(c) * 4);
        }
        if constexpr (KH != 4) {
          const hn::FixedTag<float, 4> d4;
          for (int c = 0; c < K; ++c)
            for (int q4 = 0; q4 < KH / 4; ++q4)
              hn::StoreU(hn::Load(d4, quads + int64_t(q4) * 4 * K + int64_t(c) * 4), d4, dst + int64_t(c) * KH + q4 * 4);
        }
        continue;
      }
#endif
      for (int c = 0; c < K; ++c)
        for (int h = 0; h < KH; ++h) dst[int64_t(c) * KH + h] = rows[int64_t(h) * K + c];
    }
  }
}

void BuildLut(const PQAttnArgs& a, const float* cbt, float* lut, int j0, int j1) {
  if (cpu::pq_lut_heads(a.group) == 8) BuildLutT<8>(a, cbt, lut, j0, j1);
  else BuildLutT<4>(a, cbt, lut, j0, j1);
}

// S[t][h] = sum_j LUT[j][code(t, j)][h] for t < nb; code(t, j) = rows[t][j].
// Lines to request during a pass over a block: the rows of next_rows (the next block's keys) and
// of cur_rows (this block's values), one of each per token, at the rate they are consumed (a
// burst of prefetches stalls on the miss buffers).
struct Prefetch {
  const uint8_t* const* next_rows = nullptr;
  int n_next = 0;
  const uint8_t* const* cur_rows = nullptr;
  int n_cur = 0;
  HWY_INLINE void token(int t) const {
    if (t < n_next) __builtin_prefetch(next_rows[t]);
    if (t < n_cur) __builtin_prefetch(cur_rows[t]);
  }
};

template <int KH, class CT>
HWY_INLINE void Scores(const float* lut, int nks, int K, const CT* const* rows, int nb, float* S, const Prefetch& pf) {
#if HWY_TARGET == HWY_SCALAR
  for (int t = 0; t < nb; ++t) {
    pf.token(t);
    float s[KH] = {};
    for (int j = 0; j < nks; ++j) {
      const float* e = lut + (int64_t(j) * K + rows[t][j]) * KH;
      for (int h = 0; h < KH; ++h) s[h] += e[h];
    }
    for (int h = 0; h < KH; ++h) S[t * KH + h] = s[h];
  }
#else
  const hn::CappedTag<float, KH> dc;  // one entry in NE vectors (NE = 1 unless the target is 128-bit and KH = 8)
  constexpr int NL = int(hn::MaxLanes(dc)), NE = KH / NL, KJ = kKJ;
  static_assert(kKJ == 4, "a pass adds four sub-spaces' tables pairwise");
  const int64_t L = int64_t(K) * KH;  // floats per sub-space table
  // one full pass of KJ sub-spaces from j0; the first pass stores, later ones add to S
  auto pass = [&](int j0, auto first) {
    const float* L0 = lut + j0 * L;
    for (int t = 0; t < nb; ++t) {
      const CT* c = rows[t] + j0;
      if constexpr (first) pf.token(t);
      for (int e = 0; e < NE; ++e) {
        const float* E = L0 + e * NL;
        auto s = hn::Add(hn::LoadU(dc, E + size_t(c[0]) * KH), hn::LoadU(dc, E + L + size_t(c[1]) * KH));
        s = hn::Add(s, hn::Add(hn::LoadU(dc, E + 2 * L + size_t(c[2]) * KH), hn::LoadU(dc, E + 3 * L + size_t(c[3]) * KH)));
        if constexpr (!first) s = hn::Add(hn::Load(dc, S + KH * t + e * NL), s);
        hn::Store(s, dc, S + KH * t + e * NL);
      }
    }
  };
  int j0 = 0;
  if (nks >= KJ) {
    pass(0, std::true_type{});
    for (j0 = KJ; j0 + KJ <= nks; j0 += KJ) pass(j0, std::false_type{});
  }
  if (j0 < nks) {  // the rest, fewer than KJ sub-spaces
    const int nj = nks - j0;
    const float* L0 = lut + j0 * L;
    for (int t = 0; t < nb; ++t) {
      const CT* c = rows[t] + j0;
      if (j0 == 0) pf.token(t);
      for (int e = 0; e < NE; ++e) {
        auto s = j0 == 0 ? hn::Zero(dc) : hn::Load(dc, S + KH * t + e * NL);
        for (int u = 0; u < nj; ++u) s = hn::Add(s, hn::LoadU(dc, L0 + u * L + size_t(c[u]) * KH + e * NL));
        hn::Store(s, dc, S + KH * t + e * NL);
      }
    }
  }
#endif
}

// Online softmax over the block's [nb][KH] scores: updates m, d of the ng real heads (lanes past
// ng are padding), turns S into weights P = exp(S - m_new) and writes the rescale factors alpha.
// S holds room for the block rounded up to a whole vector; the rounding rows are set to -inf.
template <int KH>
HWY_INLINE void SoftmaxBlock(float* S, int nb, int ng, float* m, float* d, float* alpha) {
  const hn::ScalableTag<float> df;
  const int N = int(hn::Lanes(df));
  // vectors of N lanes hold whole [KH] rows when N is a multiple of KH; otherwise (128-bit
  // targets with KH = 8, and the scalar target) the loops below run lane by lane
  const bool vec = HWY_TARGET != HWY_SCALAR && N % KH == 0;
  const int tpv = vec ? N / KH : 1;  // tokens per vector
  const int nbp = (nb + tpv - 1) / tpv * tpv;
  for (int i = nb * KH; i < nbp * KH; ++i) S[i] = -INFINITY;
  alignas(64) float lanes[64];  // lanes: [NL] a reduced vector, lane i belongs to head i % KH
  int NL = KH;
  if (vec) {
    NL = N;
    auto vmax = hn::Set(df, -INFINITY);
    for (int i = 0; i < nbp * KH; i += N) vmax = hn::Max(vmax, hn::Load(df, S + i));
    hn::Store(vmax, df, lanes);
  } else {
    for (int h = 0; h < KH; ++h) lanes[h] = -INFINITY;
    for (int i = 0; i < nbp * KH; ++i) lanes[i % KH] = std::max(lanes[i % KH], S[i]);
  }
  alignas(64) float mnew[64];  // mnew: [NL] the new running max of head i % KH
  for (int h = 0; h < KH; ++h) {
    float mx = lanes[h];
    for (int i = h + KH; i < NL; i += KH) mx = std::max(mx, lanes[i]);
    const float mo = h < ng ? m[h] : -INFINITY;
    mnew[h] = std::max(mo, mx);
    alpha[h] = mo == -INFINITY ? 0.0f : std::exp(mo - mnew[h]);
  }
  for (int i = KH; i < NL; ++i) mnew[i] = mnew[i % KH];
  float sums[KH] = {};
  if (vec) {
    const auto vm = hn::Load(df, mnew);
    auto vsum = hn::Zero(df);
    for (int i = 0; i < nbp * KH; i += N) {
      const auto p = hn::Exp(df, hn::Sub(hn::Load(df, S + i), vm));  // -inf rows -> 0
      hn::Store(p, df, S + i);
      vsum = hn::Add(vsum, p);
    }
    hn::Store(vsum, df, lanes);
    for (int i = 0; i < N; ++i) sums[i % KH] += lanes[i];
  } else {
    for (int i = 0; i < nbp * KH; ++i) {
      S[i] = std::exp(S[i] - mnew[i % KH]);
      sums[i % KH] += S[i];
    }
  }
  for (int h = 0; h < ng; ++h) {
    d[h] = d[h] * alpha[h] + sums[h];
    m[h] = mnew[h];
  }
}

#if HWY_TARGET != HWY_SCALAR
// One pass of VJ value sub-spaces j0.. over the block's tokens, accumulators in registers:
// vector k of sub-space u holds lanes [h][SD] flattened (k*N .. k*N+N-1); a token adds
// centroid (broadcast to the lanes of every head) x its KH weights (one permute per vector).
template <int KH, int SD, int VJ, class CT>
HWY_INLINE void ValuesPass(const float* cb, int64_t book_stride, int j0, const CT* const* rows, int nb,
                           const float* P, int D, float* acc) {
  const hn::ScalableTag<float> df;
  constexpr int N = int(hn::MaxLanes(df));
  constexpr int NV = KH * SD / N;  // vectors per sub-space
  using V = hn::Vec<decltype(df)>;
  alignas(64) int32_t idx_arr[NV][N];  // lane l of vector k belongs to head (k*N + l) / SD
  for (int k = 0; k < NV; ++k)
    for (int l = 0; l < N; ++l) idx_arr[k][l] = (k * N + l) / SD;
  V accv[VJ][NV];
  for (int u = 0; u < VJ; ++u)
    for (int k = 0; k < NV; ++k) accv[u][k] = hn::Zero(df);
  const float* book0 = cb + int64_t(j0) * book_stride;
  for (int t = 0; t < nb; ++t) {
    const CT* c = rows[t] + j0;
    V w[NV];
    if constexpr (N <= SD) {
      for (int k = 0; k < NV; ++k) w[k] = hn::Set(df, P[t * KH + (k * N) / SD]);
    } else {
      // the token's KH weights in the low lanes (KH = 8 reads the next token's too: S has room)
      const V p = KH == 4 ? hn::LoadDup128(df, P + t * KH) : hn::LoadU(df, P + t * KH);
      for (int k = 0; k < NV; ++k) w[k] = hn::TableLookupLanes(p, hn::SetTableIndices(df, idx_arr[k]));
    }
    for (int u = 0; u < VJ; ++u) {
      const float* cent = book0 + u * book_stride + size_t(c[u]) * SD;
      V cv;
      if constexpr (N <= SD) {
        for (int k = 0; k < NV; ++k) accv[u][k] = hn::MulAdd(hn::LoadU(df, cent + (k * N) % SD), w[k], accv[u][k]);
        continue;
      } else if constexpr (SD == 4) {
        cv = hn::LoadDup128(df, cent);
      } else {
        const hn::Half<decltype(df)> dh;
        const auto half = hn::LoadU(dh, cent);
        cv = hn::Combine(df, half, half);
      }
      for (int k = 0; k < NV; ++k) accv[u][k] = hn::MulAdd(cv, w[k], accv[u][k]);
    }
  }
  alignas(64) float tmp[KH * SD];  // tmp: [KH heads, SD] one sub-space of the accumulators
  for (int u = 0; u < VJ; ++u) {
    for (int k = 0; k < NV; ++k) hn::Store(accv[u][k], df, tmp + k * N);
    for (int h = 0; h < KH; ++h) {
      float* dst = acc + int64_t(h) * D + (j0 + u) * SD;
      for (int e = 0; e < SD; ++e) dst[e] += tmp[h * SD + e];
    }
  }
}

// The same pass with the heads in the lanes, for targets whose vector is exactly KH floats (KH = 8
// on AVX2): accumulator (u, e) holds dim e of sub-space j0 + u for the KH heads, so a token's
// weights are one load (no permutes) and each centroid element is a broadcast load, SD FMAs per
// sub-space.
template <int KH, int SD, int VJ, class CT>
HWY_INLINE void ValuesPassHeadLanes(const float* cb, int64_t book_stride, int j0, const CT* const* rows, int nb,
                                    const float* P, int D, float* acc) {
  const hn::FixedTag<float, KH> df;
  using V = hn::Vec<decltype(df)>;
  V accv[VJ][SD];
  for (int u = 0; u < VJ; ++u)
    for (int e = 0; e < SD; ++e) accv[u][e] = hn::Zero(df);
  const float* book0 = cb + int64_t(j0) * book_stride;
  for (int t = 0; t < nb; ++t) {
    const CT* c = rows[t] + j0;
    const V w = hn::Load(df, P + t * KH);
    for (int u = 0; u < VJ; ++u) {
      const float* cent = book0 + u * book_stride + size_t(c[u]) * SD;
      for (int e = 0; e < SD; ++e) accv[u][e] = hn::MulAdd(hn::Set(df, cent[e]), w, accv[u][e]);
    }
  }
  alignas(64) float tmp[SD][KH];  // tmp: [SD, KH heads] one sub-space of the accumulators
  for (int u = 0; u < VJ; ++u) {
    for (int e = 0; e < SD; ++e) hn::Store(accv[u][e], df, tmp[e]);
    for (int h = 0; h < KH; ++h) {
      float* dst = acc + int64_t(h) * D + (j0 + u) * SD;
      for (int e = 0; e < SD; ++e) dst[e] += tmp[e][h];
    }
  }
}

// The same sums with the dims in the lanes, for 8-lane targets and the NG = 5..8 heads of an 8-head
// entry (Qwen2.5-1.5B's 12/2 heads: NG = 6): a vector holds the 8 dims of two 4-dim sub-spaces of one
// head, so a token costs NG FMAs per sub-space pair (no lanes of absent heads) from one centroid pair
// load, and NG weight broadcasts per pass of two pairs, where the head lanes pay 8 FMAs and 8
// broadcasts per sub-space. (At NG = 7, 8 the 2 x NG accumulators spill one or two registers; one
// pair per pass measured no faster.)
template <int KH, int NG, int VP, class CT>
HWY_INLINE void ValuesPassDimLanes(const float* cb, int64_t book_stride, int j0, const CT* const* rows, int nb,
                                   const float* P, int D, float* acc) {
  constexpr int SD = 4;
  const hn::FixedTag<float, KH> df;  // KH = 8: two sub-spaces of 4 dims
  const hn::FixedTag<float, KH / 2> d4;
  using V = hn::Vec<decltype(df)>;
  V accv[VP][NG];
  for (int p = 0; p < VP; ++p)
    for (int g = 0; g < NG; ++g) accv[p][g] = hn::Zero(df);
  const float* book0 = cb + int64_t(j0) * book_stride;
  for (int t = 0; t < nb; ++t) {
    const CT* c = rows[t] + j0;
    V cv[VP];
    for (int p = 0; p < VP; ++p) {
      const auto lo = hn::LoadU(d4, book0 + (2 * p) * book_stride + size_t(c[2 * p]) * SD);
      const auto hi = hn::LoadU(d4, book0 + (2 * p + 1) * book_stride + size_t(c[2 * p + 1]) * SD);
      cv[p] = hn::Combine(df, hi, lo);
    }
    for (int g = 0; g < NG; ++g) {
      const V w = hn::Set(df, P[t * KH + g]);
      for (int p = 0; p < VP; ++p) accv[p][g] = hn::MulAdd(cv[p], w, accv[p][g]);
    }
  }
  for (int g = 0; g < NG; ++g)
    for (int p = 0; p < VP; ++p) {
      float* dst = acc + int64_t(g) * D + (j0 + 2 * p) * SD;
      hn::StoreU(hn::Add(hn::LoadU(df, dst), accv[p][g]), df, dst);
    }
}
#endif

// True when the register path covers this value sub-dim on this target.
template <int KH, int SD>
constexpr bool RegisterValues() {
#if HWY_TARGET == HWY_SCALAR
  return false;
#else
  constexpr int N = int(hn::MaxLanes(hn::ScalableTag<float>()));
  return (KH * SD) % N == 0 && (N <= SD || (N >= KH && (SD == 4 || N == 2 * SD)));
#endif
}

// acc[h][D] += sum_t P[t][h] * v_t for KH heads, v_t decoded from codes through the codebooks
// cb + j * book_stride ([2^bits][SD] each).
template <int KH, int SD, class CT>
HWY_INLINE void Values(const float* cb, int64_t book_stride, int nvs, const CT* const* rows, int nb, const float* P,
                       int D, float* acc, int ng) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (RegisterValues<KH, SD>()) {
    constexpr int N = int(hn::MaxLanes(hn::ScalableTag<float>()));
    if constexpr (N == 8 && KH == 8 && SD == 4) {
      if (ng >= 5) {  // dims in the lanes: passes of two sub-space pairs, then one pair
        auto run = [&](auto n) {
          constexpr int NG = decltype(n)::value;
          int j0 = 0;
          for (; j0 + 4 <= nvs; j0 += 4) ValuesPassDimLanes<KH, NG, 2>(cb, book_stride, j0, rows, nb, P, D, acc);
          for (; j0 + 2 <= nvs; j0 += 2) ValuesPassDimLanes<KH, NG, 1>(cb, book_stride, j0, rows, nb, P, D, acc);
          for (; j0 < nvs; ++j0) ValuesPassHeadLanes<KH, SD, 1>(cb, book_stride, j0, rows, nb, P, D, acc);
        };
        if (ng == 5) run(std::integral_constant<int, 5>{});
        else if (ng == 6) run(std::integral_constant<int, 6>{});
        else if (ng == 7) run(std::integral_constant<int, 7>{});
        else run(std::integral_constant<int, 8>{});
        return;
      }
    }
    // AVX2 with 8-head entries: heads in the lanes, 8 accumulators of 16 registers; otherwise heads
    // x dims in the lanes, <= ACC accumulators
    constexpr bool kHeadLanes = N == KH && KH == 8;
    constexpr int NV = KH * SD / N, ACC = KH == 4 ? 4 : 16;
    constexpr int VJ = kHeadLanes ? (SD >= 8 ? 1 : 8 / SD) : (NV >= ACC ? 1 : ACC / NV);  // sub-spaces per pass
    auto pass = [&](int j0, auto vj) {
      constexpr int J = decltype(vj)::value;
      if constexpr (kHeadLanes) ValuesPassHeadLanes<KH, SD, J>(cb, book_stride, j0, rows, nb, P, D, acc);
      else ValuesPass<KH, SD, J>(cb, book_stride, j0, rows, nb, P, D, acc);
    };
    int j0 = 0;
    for (; j0 + VJ <= nvs; j0 += VJ) pass(j0, std::integral_constant<int, VJ>{});
    for (; j0 < nvs; ++j0) pass(j0, std::integral_constant<int, 1>{});
  }
#else
  (void)cb, (void)book_stride, (void)nvs, (void)rows, (void)nb, (void)P, (void)D, (void)acc, (void)ng;
#endif
}

// Generic value decode (any sub_dim, any target).
template <int KH, class CT>
HWY_INLINE void ValuesGeneric(const float* cb, int64_t book_stride, int nvs, int sd, const CT* const* rows, int nb,
                              const float* P, int D, float* acc) {
  for (int j = 0; j < nvs; ++j) {
    const float* book = cb + int64_t(j) * book_stride;
    for (int t = 0; t < nb; ++t) {
      const float* cent = book + size_t(rows[t][j]) * sd;
      for (int h = 0; h < KH; ++h) {
        const float w = P[t * KH + h];
        float* dst = acc + int64_t(h) * D + j * sd;
        for (int e = 0; e < sd; ++e) dst[e] += w * cent[e];
      }
    }
  }
}

template <int KH, class KT, class VT>
void BlockHeads(const PQAttnArgs& a, const float* lut, const KT* const* kc, const VT* const* vc, int b0, int nb,
                float* S, float* acc, Prefetch pf) {
  const int D = a.head_dim, nks = D / a.k_sub_dim, nvs = D / a.v_sub_dim, K = 1 << a.k_bits;
  const int64_t vbook = a.v_books == 1 ? 0 : (int64_t(1) << a.v_bits) * a.v_sub_dim;
  const int n_hg = (a.group + KH - 1) / KH;
  for (int hg = 0; hg < n_hg; ++hg) {
    const int g0 = hg * KH, ng = std::min(KH, a.group - g0);
    Scores<KH>(lut + int64_t(hg) * nks * K * KH, nks, K, kc, nb, S, pf);
    pf = Prefetch{};  // the first head group's pass requested them
    if (a.seg_bias)  // the rotated key mean's score terms, one per segment of seg_tokens tokens
      for (int t = 0; t < nb; ++t) {
        const float* bias = a.seg_bias + size_t((a.seg_first + b0 + t) / a.seg_tokens) * a.group + g0;
        for (int h = 0; h < ng; ++h) S[t * KH + h] += bias[h];
      }
    float alpha[KH];  // alpha: [KH] rescale of the heads' running outputs
    SoftmaxBlock<KH>(S, nb, ng, a.m + g0, a.d + g0, alpha);
    std::fill(acc, acc + int64_t(KH) * D, 0.0f);
    switch (a.v_sub_dim) {
      case 4:
        if constexpr (RegisterValues<KH, 4>()) { Values<KH, 4>(a.v_codebook, vbook, nvs, vc, nb, S, D, acc, ng); break; }
        [[fallthrough]];
      case 8:
        if constexpr (RegisterValues<KH, 8>()) {
          if (a.v_sub_dim == 8) { Values<KH, 8>(a.v_codebook, vbook, nvs, vc, nb, S, D, acc, ng); break; }
        }
        [[fallthrough]];
      case 16:
        if constexpr (RegisterValues<KH, 16>()) {
          if (a.v_sub_dim == 16) { Values<KH, 16>(a.v_codebook, vbook, nvs, vc, nb, S, D, acc, ng); break; }
        }
        [[fallthrough]];
      default: ValuesGeneric<KH>(a.v_codebook, vbook, nvs, a.v_sub_dim, vc, nb, S, D, acc); break;
    }
    for (int h = 0; h < ng; ++h) {
      float* o = a.o + int64_t(g0 + h) * D;
      const float* s = acc + int64_t(h) * D;
      for (int e = 0; e < D; ++e) o[e] = o[e] * alpha[h] + s[e];
    }
  }
}

void Accumulate(const PQAttnArgs& a, const float* lut) {
  const int D = a.head_dim, nks = D / a.k_sub_dim, nvs = D / a.v_sub_dim;
  const size_t krow = packed_row_bytes(nks, a.k_bits), vrow = packed_row_bytes(nvs, a.v_bits);
  constexpr int kMaxHeads = 8;
  // S: [kBlock + 16, KH] scores then weights; acc: [KH, D] block output; k16/v16: [kBlock, n_sub]
  // unpacked codes when the width is not 8 bits; kr/vr: [2 * kBlock] row addresses of this block's
  // tokens and the next block's (contiguous or paged codes alike); k16r/v16r: [kBlock] rows of k16/v16
  thread_local AlignedBuffer<float> s_buf, acc_buf;
  thread_local AlignedBuffer<uint16_t> k16, v16;
  thread_local std::vector<const uint8_t*> kr, vr;
  thread_local std::vector<const uint16_t*> k16r, v16r;
  if (s_buf.size() < size_t(kBlock + 16) * kMaxHeads) s_buf.resize(size_t(kBlock + 16) * kMaxHeads);
  if (acc_buf.size() < size_t(kMaxHeads) * D) acc_buf.resize(size_t(kMaxHeads) * D);
  const bool k8 = a.k_bits == 8, v8 = a.v_bits == 8;
  if (!k8 && k16.size() < size_t(kBlock) * nks) k16.resize(size_t(kBlock) * nks);
  if (!v8 && v16.size() < size_t(kBlock) * nvs) v16.resize(size_t(kBlock) * nvs);
  kr.resize(2 * kBlock);
  vr.resize(kBlock);
  k16r.resize(kBlock);
  v16r.resize(kBlock);
  for (int t = 0; t < kBlock; ++t) {
    k16r[size_t(t)] = k16.data() + size_t(t) * nks;
    v16r[size_t(t)] = v16.data() + size_t(t) * nvs;
  }
  auto krow_at = [&](int t) {
    if (a.block_tokens <= 0) return a.k_codes + size_t(t) * krow;
    const int u = a.first + t;
    return a.k_blocks[u / a.block_tokens] + size_t(u % a.block_tokens) * krow;
  };
  auto vrow_at = [&](int t) {
    if (a.block_tokens <= 0) return a.v_codes + size_t(t) * vrow;
    const int u = a.first + t;
    return a.v_blocks[u / a.block_tokens] + size_t(u % a.block_tokens) * vrow;
  };
  const bool wide = cpu::pq_lut_heads(a.group) == 8;
  for (int t = 0; t < std::min(kBlock, a.n_tokens); ++t) kr[size_t(t)] = krow_at(t);
  for (int b0 = 0; b0 < a.n_tokens; b0 += kBlock) {
    const int nb = std::min(kBlock, a.n_tokens - b0);
    const int n_next = std::min(kBlock, a.n_tokens - b0 - nb);
    // this block's key rows are kr[0..nb); the next block's go to kr[kBlock..) then move down
    for (int t = 0; t < n_next; ++t) kr[size_t(kBlock + t)] = krow_at(b0 + nb + t);
    for (int t = 0; t < nb; ++t) vr[size_t(t)] = vrow_at(b0 + t);
    // Codes stream from memory (a 30-layer cache is far larger than L2): while the scores of this
    // block run, its value rows and the next block's key rows are requested.
    Prefetch pf{kr.data() + kBlock, n_next, vr.data(), nb};
    if (!k8)
      for (int t = 0; t < nb; ++t) unpack_codes(kr[size_t(t)], nks, a.k_bits, k16.data() + size_t(t) * nks);
    if (!v8)
      for (int t = 0; t < nb; ++t) unpack_codes(vr[size_t(t)], nvs, a.v_bits, v16.data() + size_t(t) * nvs);
    auto run = [&](auto kc, auto vc) {
      if (wide) BlockHeads<8>(a, lut, kc, vc, b0, nb, s_buf.data(), acc_buf.data(), pf);
      else BlockHeads<4>(a, lut, kc, vc, b0, nb, s_buf.data(), acc_buf.data(), pf);
    };
    const uint8_t* const* k8r = kr.data();
    const uint8_t* const* v8r = vr.data();
    const uint16_t* const* k16p = k16r.data();
    const uint16_t* const* v16p = v16r.data();
    if (k8 && v8) run(k8r, v8r);
    else if (k8) run(k8r, v16p);
    else if (v8) run(k16p, v8r);
    else run(k16p, v16p);
    std::copy(kr.begin() + kBlock, kr.begin() + kBlock + n_next, kr.begin());
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

int pq_lut_heads(int group) {
  const int r4 = (group + 3) / 4 * 4, r8 = (group + 7) / 8 * 8;
  return group > 4 && r8 <= r4 ? 8 : 4;
}

size_t pq_lut_floats(const PQAttnArgs& a) {
  const size_t kh = size_t(pq_lut_heads(a.group)), n_hg = (size_t(a.group) + kh - 1) / kh;
  return n_hg * kh * size_t(a.head_dim / a.k_sub_dim) * (size_t(1) << a.k_bits);
}

void pq_build_lut(const PQAttnArgs& a, const float* cbt, float* lut) {
  HWY_DYNAMIC_DISPATCH(BuildLut)(a, cbt, lut, 0, a.head_dim / a.k_sub_dim);
}

void pq_build_lut_part(const PQAttnArgs& a, const float* cbt, float* lut, int j0, int j1) {
  const int nks = a.head_dim / a.k_sub_dim;
  VQ_CHECK(0 <= j0 && j0 <= j1 && j1 <= nks, "pq_build_lut_part: sub-spaces [{}, {}) outside [0, {})", j0, j1, nks);
  HWY_DYNAMIC_DISPATCH(BuildLut)(a, cbt, lut, j0, j1);
}

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
