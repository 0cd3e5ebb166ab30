// Attention on VecInfer codes, CPU (Highway, runtime dispatch). Why this shape: see
// docs/CPU_KV_NOTES.md (counts per token, variants measured).
//
// - The LUT interleaves 4 heads of the GQA group per entry: LUT[hg][j][c][4]. One 16-byte load
//   brings the (sub-space j, centroid c) term of 4 heads, so the 16 table reads of a d4b8 token
//   serve 4 query heads; no gathers, no transposition of the codes (they are read where they lie).
// - Tokens go in blocks of kBlock; inside a block the sub-spaces are visited in passes of a few,
//   so the LUT slice (keys) and codebook slice (values) of a pass stay in L1 (a whole d4b8 LUT
//   for 4 heads is 64 KiB, twice L1).
// - Softmax is online per block on the [token][4 heads] score tile, vectorised 16 lanes wide.
// - Values are decoded in registers: per token, a centroid (broadcast) times the block's softmax
//   weights of the 4 heads (expanded by one permute) is one FMA per sub-space.
#include "ops/cpu/pq_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/bitpack.h"
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

constexpr int kHeads = 4;   // heads per LUT entry (lanes of one 128-bit vector)
constexpr int kBlock = 256; // tokens per softmax step
constexpr int kKJ = 4;      // key sub-spaces per pass over a block

void BuildLut(const PQAttnArgs& a, const float* cbt, float* lut) {
  const hn::ScalableTag<float> df;
  const int N = int(hn::Lanes(df));
  const int sd = a.k_sub_dim, nks = a.head_dim / sd, K = 1 << a.k_bits;
  const int n_hg = (a.group + kHeads - 1) / kHeads;
  // rows: [4, K] f32, one head's table of sub-space j before interleaving
  thread_local AlignedBuffer<float> rows_buf;
  if (rows_buf.size() < size_t(kHeads) * K) rows_buf.resize(size_t(kHeads) * K);
  float* rows = rows_buf.data();
  for (int hg = 0; hg < n_hg; ++hg) {
    for (int j = 0; j < nks; ++j) {
      const float* bt = cbt + int64_t(a.k_books == 1 ? 0 : j) * sd * K;  // [sd][K]
      for (int h = 0; h < kHeads; ++h) {
        float* out = rows + int64_t(h) * K;
        const int g = hg * kHeads + h;
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
          }
        } else {
          for (int c = 0; c < K; ++c) {
            float acc = qj[0] * bt[c];
            for (int e = 1; e < sd; ++e) acc += qj[e] * bt[int64_t(e) * K + c];
            out[c] = acc;
          }
        }
      }
      float* dst = lut + (int64_t(hg) * nks + j) * K * kHeads;  // [K][4]
      int c = 0;
      if (HWY_TARGET != HWY_SCALAR && K % N == 0) {
        for (; c < K; c += N)
          hn::StoreInterleaved4(hn::Load(df, rows + c), hn::Load(df, rows + K + c), hn::Load(df, rows + 2 * K + c),
                                hn::Load(df, rows + 3 * K + c), df, dst + int64_t(c) * kHeads);
      }
      for (; c < K; ++c)
        for (int h = 0; h < kHeads; ++h) dst[int64_t(c) * kHeads + h] = rows[int64_t(h) * K + c];
    }
  }
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

template <class CT>
HWY_INLINE void Scores(const float* lut, int nks, int K, const CT* const* rows, int nb, float* S, const Prefetch& pf) {
#if HWY_TARGET == HWY_SCALAR
  for (int t = 0; t < nb; ++t) {
    float s[kHeads] = {0, 0, 0, 0};
    for (int j = 0; j < nks; ++j) {
      const float* e = lut + (int64_t(j) * K + rows[t][j]) * kHeads;
      for (int h = 0; h < kHeads; ++h) s[h] += e[h];
    }
    for (int h = 0; h < kHeads; ++h) S[t * kHeads + h] = s[h];
  }
#else
  const hn::FixedTag<float, 4> d4;
  const int64_t L = int64_t(K) * kHeads;  // floats per sub-space table
  for (int j0 = 0; j0 < nks; j0 += kKJ) {
    const float* L0 = lut + j0 * L;
    if (nks - j0 >= 4) {
      const float *L1 = L0 + L, *L2 = L0 + 2 * L, *L3 = L0 + 3 * L;
      if (j0 == 0) {
        for (int t = 0; t < nb; ++t) {
          const CT* c = rows[t];
          pf.token(t);
          const auto s0 = hn::Add(hn::Load(d4, L0 + size_t(c[0]) * 4), hn::Load(d4, L1 + size_t(c[1]) * 4));
          const auto s1 = hn::Add(hn::Load(d4, L2 + size_t(c[2]) * 4), hn::Load(d4, L3 + size_t(c[3]) * 4));
          hn::Store(hn::Add(s0, s1), d4, S + 4 * t);
        }
      } else {
        for (int t = 0; t < nb; ++t) {
          const CT* c = rows[t] + j0;
          const auto s0 = hn::Add(hn::Load(d4, L0 + size_t(c[0]) * 4), hn::Load(d4, L1 + size_t(c[1]) * 4));
          const auto s1 = hn::Add(hn::Load(d4, L2 + size_t(c[2]) * 4), hn::Load(d4, L3 + size_t(c[3]) * 4));
          hn::Store(hn::Add(hn::Load(d4, S + 4 * t), hn::Add(s0, s1)), d4, S + 4 * t);
        }
      }
    } else {
      const int nj = nks - j0;
      for (int t = 0; t < nb; ++t) {
        const CT* c = rows[t] + j0;
        auto s = j0 == 0 ? hn::Zero(d4) : hn::Load(d4, S + 4 * t);
        for (int u = 0; u < nj; ++u) s = hn::Add(s, hn::Load(d4, L0 + u * L + size_t(c[u]) * 4));
        hn::Store(s, d4, S + 4 * t);
      }
    }
  }
#endif
}

// Online softmax over the block's [nb][4] scores: updates m, d of the ng real heads (lanes past
// ng are padding), turns S into weights P = exp(S - m_new) and writes the rescale factors alpha.
// S holds room for the block rounded up to a whole vector; the rounding rows are set to -inf.
HWY_INLINE void SoftmaxBlock(float* S, int nb, int ng, float* m, float* d, float* alpha) {
  const hn::ScalableTag<float> df;
  const int N = int(hn::Lanes(df));
  const int tpv = std::max(1, N / kHeads);  // tokens per vector
  const int nbp = (nb + tpv - 1) / tpv * tpv;
  for (int i = nb * kHeads; i < nbp * kHeads; ++i) S[i] = -INFINITY;
  alignas(64) float lanes[64];  // lanes: [N] a reduced vector, lane i belongs to head i % 4
#if HWY_TARGET == HWY_SCALAR
  const int NL = kHeads;
  for (int h = 0; h < kHeads; ++h) lanes[h] = -INFINITY;
  for (int i = 0; i < nbp * kHeads; ++i) lanes[i % kHeads] = std::max(lanes[i % kHeads], S[i]);
#else
  const int NL = N;
  auto vmax = hn::Set(df, -INFINITY);
  for (int i = 0; i < nbp * kHeads; i += N) vmax = hn::Max(vmax, hn::Load(df, S + i));
  hn::Store(vmax, df, lanes);
#endif
  alignas(16) float mnew[kHeads];  // mnew: [4] the new running max per head
  for (int h = 0; h < kHeads; ++h) {
    float mx = lanes[h];
    for (int i = h + kHeads; i < NL; i += kHeads) mx = std::max(mx, lanes[i]);
    const float mo = h < ng ? m[h] : -INFINITY;
    mnew[h] = std::max(mo, mx);
    alpha[h] = mo == -INFINITY ? 0.0f : std::exp(mo - mnew[h]);
  }
#if HWY_TARGET == HWY_SCALAR
  float sums[kHeads] = {0, 0, 0, 0};
  for (int i = 0; i < nbp * kHeads; ++i) {
    S[i] = std::exp(S[i] - mnew[i % kHeads]);
    sums[i % kHeads] += S[i];
  }
  for (int h = 0; h < ng; ++h) {
    const float s = sums[h];
#else
  const auto vm = hn::LoadDup128(df, mnew);
  auto vsum = hn::Zero(df);
  for (int i = 0; i < nbp * kHeads; i += N) {
    const auto p = hn::Exp(df, hn::Sub(hn::Load(df, S + i), vm));  // -inf rows -> 0
    hn::Store(p, df, S + i);
    vsum = hn::Add(vsum, p);
  }
  hn::Store(vsum, df, lanes);
  for (int h = 0; h < ng; ++h) {
    float s = lanes[h];
    for (int i = h + kHeads; i < N; i += kHeads) s += lanes[i];
#endif
    d[h] = d[h] * alpha[h] + s;
    m[h] = mnew[h];
  }
}

#if HWY_TARGET != HWY_SCALAR
// One pass of VJ value sub-spaces j0.. over the block's tokens, accumulators in registers:
// vector k of sub-space u holds lanes [h][SD] flattened (k*N .. k*N+N-1); a token adds
// centroid (broadcast to the lanes of every head) x its 4 weights (one permute per token).
template <int SD, int VJ, class CT>
HWY_INLINE void ValuesPass(const float* cb, int64_t book_stride, int j0, const CT* const* rows, int nb,
                           const float* P, int D, float* acc) {
  const hn::ScalableTag<float> df;
  constexpr int N = int(hn::MaxLanes(df));
  constexpr int NV = kHeads * SD / N;  // vectors per sub-space
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
      for (int k = 0; k < NV; ++k) w[k] = hn::Set(df, P[t * kHeads + (k * N) / SD]);
    } else {
      const V p4 = hn::LoadDup128(df, P + t * kHeads);
      for (int k = 0; k < NV; ++k) w[k] = hn::TableLookupLanes(p4, hn::SetTableIndices(df, idx_arr[k]));
    }
    for (int u = 0; u < VJ; ++u) {
      const float* cent = book0 + u * book_stride + size_t(c[u]) * SD;
      for (int k = 0; k < NV; ++k) {
        V cv;
        if constexpr (N <= SD) {
          cv = hn::LoadU(df, cent + (k * N) % SD);
        } else if constexpr (SD == 4) {
          cv = hn::LoadDup128(df, cent);
        } else {
          const hn::Half<decltype(df)> dh;
          const auto half = hn::LoadU(dh, cent);
          cv = hn::Combine(df, half, half);
        }
        accv[u][k] = hn::MulAdd(cv, w[k], accv[u][k]);
      }
    }
  }
  alignas(64) float tmp[kHeads * SD];  // tmp: [4 heads, SD] one sub-space of the accumulators
  for (int u = 0; u < VJ; ++u) {
    for (int k = 0; k < NV; ++k) hn::Store(accv[u][k], df, tmp + k * N);
    for (int h = 0; h < kHeads; ++h) {
      float* dst = acc + int64_t(h) * D + (j0 + u) * SD;
      for (int e = 0; e < SD; ++e) dst[e] += tmp[h * SD + e];
    }
  }
}
#endif

// True when the register path covers this value sub-dim on this target.
template <int SD>
constexpr bool RegisterValues() {
#if HWY_TARGET == HWY_SCALAR
  return false;
#else
  constexpr int N = int(hn::MaxLanes(hn::ScalableTag<float>()));
  return N >= kHeads && (kHeads * SD) % N == 0 && (N <= SD || SD == 4 || N == 2 * SD);
#endif
}

// acc[h][D] += sum_t P[t][h] * v_t for 4 heads, v_t decoded from codes through the codebooks
// cb + j * book_stride ([2^bits][SD] each).
template <int SD, class CT>
HWY_INLINE void Values(const float* cb, int64_t book_stride, int nvs, const CT* const* rows, int nb, const float* P,
                       int D, float* acc) {
#if HWY_TARGET != HWY_SCALAR
  if constexpr (RegisterValues<SD>()) {
    constexpr int N = int(hn::MaxLanes(hn::ScalableTag<float>()));
    constexpr int NV = kHeads * SD / N;
    constexpr int VJ = NV >= 4 ? 1 : (NV >= 2 ? 2 : 4);  // sub-spaces per pass: <= 4 accumulators
    int j0 = 0;
    for (; j0 + VJ <= nvs; j0 += VJ) ValuesPass<SD, VJ>(cb, book_stride, j0, rows, nb, P, D, acc);
    for (; j0 < nvs; ++j0) ValuesPass<SD, 1>(cb, book_stride, j0, rows, nb, P, D, acc);
  }
#else
  (void)cb, (void)book_stride, (void)nvs, (void)rows, (void)nb, (void)P, (void)D, (void)acc;
#endif
}

// Generic value decode (any sub_dim, any target).
template <class CT>
HWY_INLINE void ValuesGeneric(const float* cb, int64_t book_stride, int nvs, int sd, const CT* const* rows, int nb,
                              const float* P, int D, float* acc) {
  for (int j = 0; j < nvs; ++j) {
    const float* book = cb + int64_t(j) * book_stride;
    for (int t = 0; t < nb; ++t) {
      const float* cent = book + size_t(rows[t][j]) * sd;
      for (int h = 0; h < kHeads; ++h) {
        const float w = P[t * kHeads + h];
        float* dst = acc + int64_t(h) * D + j * sd;
        for (int e = 0; e < sd; ++e) dst[e] += w * cent[e];
      }
    }
  }
}

template <class KT, class VT>
void BlockHeads(const PQAttnArgs& a, const float* lut, const KT* const* kc, const VT* const* vc, int b0, int nb,
                float* S, float* acc, Prefetch pf) {
  const int D = a.head_dim, nks = D / a.k_sub_dim, nvs = D / a.v_sub_dim, K = 1 << a.k_bits;
  const int64_t vbook = a.v_books == 1 ? 0 : (int64_t(1) << a.v_bits) * a.v_sub_dim;
  const int n_hg = (a.group + kHeads - 1) / kHeads;
  for (int hg = 0; hg < n_hg; ++hg) {
    const int g0 = hg * kHeads, ng = std::min(kHeads, a.group - g0);
    Scores(lut + int64_t(hg) * nks * K * kHeads, nks, K, kc, nb, S, pf);
    pf = Prefetch{};  // the first head group's pass requested them
    if (a.seg_bias)  // the rotated key mean's score terms, one per segment of seg_tokens tokens
      for (int t = 0; t < nb; ++t) {
        const float* bias = a.seg_bias + size_t((a.seg_first + b0 + t) / a.seg_tokens) * a.group + g0;
        for (int h = 0; h < ng; ++h) S[t * kHeads + h] += bias[h];
      }
    float alpha[kHeads];  // alpha: [4] rescale of the heads' running outputs
    SoftmaxBlock(S, nb, ng, a.m + g0, a.d + g0, alpha);
    std::fill(acc, acc + int64_t(kHeads) * D, 0.0f);
    switch (a.v_sub_dim) {
      case 4:
        if constexpr (RegisterValues<4>()) { Values<4>(a.v_codebook, vbook, nvs, vc, nb, S, D, acc); break; }
        [[fallthrough]];
      case 8:
        if constexpr (RegisterValues<8>()) {
          if (a.v_sub_dim == 8) { Values<8>(a.v_codebook, vbook, nvs, vc, nb, S, D, acc); break; }
        }
        [[fallthrough]];
      case 16:
        if constexpr (RegisterValues<16>()) {
          if (a.v_sub_dim == 16) { Values<16>(a.v_codebook, vbook, nvs, vc, nb, S, D, acc); break; }
        }
        [[fallthrough]];
      default: ValuesGeneric(a.v_codebook, vbook, nvs, a.v_sub_dim, vc, nb, S, D, acc); break;
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
  // S: [kBlock + 16, 4] scores then weights; acc: [4, D] block output; k16/v16: [kBlock, n_sub]
  // unpacked codes when the width is not 8 bits; kr/vr: [2 * kBlock] row addresses of this block's
  // tokens and the next block's (contiguous or paged codes alike); k16r/v16r: [kBlock] rows of k16/v16
  thread_local AlignedBuffer<float> s_buf, acc_buf;
  thread_local AlignedBuffer<uint16_t> k16, v16;
  thread_local std::vector<const uint8_t*> kr, vr;
  thread_local std::vector<const uint16_t*> k16r, v16r;
  if (s_buf.size() < size_t(kBlock + 16) * kHeads) s_buf.resize(size_t(kBlock + 16) * kHeads);
  if (acc_buf.size() < size_t(kHeads) * D) acc_buf.resize(size_t(kHeads) * D);
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
    if (k8 && v8) BlockHeads(a, lut, kr.data(), vr.data(), b0, nb, s_buf.data(), acc_buf.data(), pf);
    else if (k8) BlockHeads(a, lut, kr.data(), v16r.data(), b0, nb, s_buf.data(), acc_buf.data(), pf);
    else if (v8) BlockHeads(a, lut, k16r.data(), vr.data(), b0, nb, s_buf.data(), acc_buf.data(), pf);
    else BlockHeads(a, lut, k16r.data(), v16r.data(), b0, nb, s_buf.data(), acc_buf.data(), pf);
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

size_t pq_lut_floats(const PQAttnArgs& a) {
  const size_t n_hg = size_t(a.group + 3) / 4;
  return n_hg * 4 * size_t(a.head_dim / a.k_sub_dim) * (size_t(1) << a.k_bits);
}

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
