// q8_0 / q4_0 partial attention (ops/cpu/scalar_attention.h). Per tile of 64 tokens: each key
// row is decoded once into f32 (scale folded in) and dotted with every head of the group; the
// softmax step is vectorised; values go channel-chunk by channel-chunk with the heads'
// accumulators in registers, each value chunk decoded once per token for all heads, its block
// scales converted once per tile (fp16 by the F16C instruction where the target has it). The next
// call's rows are requested during the scores, one key and one value row per token.
#include "ops/cpu/scalar_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/buffer.h"
#include "core/error.h"
#include "core/fp16.h"
#include "ops/cpu/prefetch.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "ops/cpu/scalar_attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

#include "ops/cpu/softmax_tile-inl.h"

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;


// x[0..32) = decoded block (f32), for N-lane vectors (N divides 16).
template <bool Q4, class DF>
HWY_INLINE void DecodeBlock(DF df, const uint8_t* blk, float* x) {
  const int N = int(hn::Lanes(df));
  const auto vd = hn::Set(df, LoadF16Scalar(blk));
  const hn::RebindToSigned<DF> di;
  if constexpr (Q4) {
    const hn::Rebind<uint8_t, DF> du8;
    const auto eight = hn::Set(di, 8), mask = hn::Set(di, 15);
    for (int j = 0; j < 16; j += N) {
      const auto b = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(), hn::LoadU(du8, blk + 2 + j)));
      const auto lo = hn::Sub(hn::And(b, mask), eight);
      const auto hi = hn::Sub(hn::ShiftRight<4>(b), eight);
      hn::Store(hn::Mul(hn::ConvertTo(df, lo), vd), df, x + j);
      hn::Store(hn::Mul(hn::ConvertTo(df, hi), vd), df, x + 16 + j);
    }
  } else {
    const hn::Rebind<int8_t, DF> di8;
    for (int j = 0; j < 32; j += N)
      hn::Store(hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(blk) + 2 + j))), vd),
                df, x + j);
  }
}

template <bool Q4, class DF>
void BlockAttnImpl(DF df, const cpu::BlockQuantAttnArgs& a) {
  const int N = int(hn::Lanes(df));
  const int D = a.head_dim, G = a.group, nb = D / 32;
  const size_t bb = Q4 ? 18 : 34;
  // s: [G, kTile] scores/weights; x: [D] one decoded row; alpha: [G]; vsc: [kTile, nb] value scales
  thread_local AlignedBuffer<float> s_buf, x_buf, al_buf, vsc_buf;
  if (s_buf.size() < size_t(G) * kTile) s_buf.resize(size_t(G) * kTile);
  if (x_buf.size() < size_t(D)) x_buf.resize(size_t(D));
  if (al_buf.size() < size_t(G)) al_buf.resize(size_t(G));
  if (vsc_buf.size() < size_t(kTile) * nb) vsc_buf.resize(size_t(kTile) * nb);
  float *s = s_buf.data(), *x = x_buf.data(), *alpha = al_buf.data(), *vsc = vsc_buf.data();
  // The next call's rows, a slice per token of this one's scores.
  const size_t next_bytes = a.next_tokens > 0 ? size_t(a.next_tokens) * a.row_stride : 0;
  const cpu::Slices pf_k(next_bytes ? a.next_k_rows : nullptr, next_bytes, a.n_tokens);
  const cpu::Slices pf_v(next_bytes ? a.next_v_rows : nullptr, next_bytes, a.n_tokens);
  for (int t0 = 0; t0 < a.n_tokens; t0 += kTile) {
    const int nt = std::min(kTile, a.n_tokens - t0);
    for (int t = 0; t < nt; ++t) {
      pf_k(t0 + t);
      pf_v(t0 + t);
      const uint8_t* row = a.k_rows + size_t(t0 + t) * a.row_stride;
      for (int b = 0; b < nb; ++b) DecodeBlock<Q4>(df, row + size_t(b) * bb, x + b * 32);
      for (int g = 0; g < G; ++g) {
        const float* qg = a.q + int64_t(g) * D;
        auto acc0 = hn::Zero(df), acc1 = hn::Zero(df);
        int c = 0;
        for (; c + 2 * N <= D; c += 2 * N) {
          acc0 = hn::MulAdd(hn::Load(df, x + c), hn::LoadU(df, qg + c), acc0);
          acc1 = hn::MulAdd(hn::Load(df, x + c + N), hn::LoadU(df, qg + c + N), acc1);
        }
        if (c < D) acc0 = hn::MulAdd(hn::Load(df, x + c), hn::LoadU(df, qg + c), acc0);
        s[g * kTile + t] = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc0, acc1)));
      }
    }
    SoftmaxTile(df, s, G, nt, a.m, a.d, alpha);
    for (int t = 0; t < nt; ++t)
      for (int b = 0; b < nb; ++b) vsc[t * nb + b] = LoadF16Scalar(a.v_rows + size_t(t0 + t) * a.row_stride + size_t(b) * bb);
    // values: channel chunks of N (inside one block), up to 4 heads in registers
    for (int g0 = 0; g0 < G; g0 += 4) {
      const int ng = std::min(4, G - g0);
      for (int c = 0; c < D; c += N) {
        const int b = c / 32, e = c % 32;  // block, element offset in the block
        float* o0 = a.o + int64_t(g0) * D + c;
        auto v0 = hn::Mul(hn::LoadU(df, o0), hn::Set(df, alpha[g0]));
        auto v1 = ng > 1 ? hn::Mul(hn::LoadU(df, o0 + D), hn::Set(df, alpha[g0 + 1])) : hn::Zero(df);
        auto v2 = ng > 2 ? hn::Mul(hn::LoadU(df, o0 + 2 * D), hn::Set(df, alpha[g0 + 2])) : hn::Zero(df);
        auto v3 = ng > 3 ? hn::Mul(hn::LoadU(df, o0 + 3 * D), hn::Set(df, alpha[g0 + 3])) : hn::Zero(df);
        const float* sg = s + g0 * kTile;
        for (int t = 0; t < nt; ++t) {
          const uint8_t* blk = a.v_rows + size_t(t0 + t) * a.row_stride + size_t(b) * bb;
          const float dv = vsc[t * nb + b];
          hn::Vec<DF> xv;
          const hn::RebindToSigned<DF> di;
          if constexpr (Q4) {
            const hn::Rebind<uint8_t, DF> du8;
            const auto by = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(), hn::LoadU(du8, blk + 2 + (e % 16))));
            const auto nib = e < 16 ? hn::And(by, hn::Set(di, 15)) : hn::ShiftRight<4>(by);
            xv = hn::ConvertTo(df, hn::Sub(nib, hn::Set(di, 8)));
          } else {
            const hn::Rebind<int8_t, DF> di8;
            xv = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(di8, reinterpret_cast<const int8_t*>(blk) + 2 + e)));
          }
          v0 = hn::MulAdd(hn::Set(df, sg[t] * dv), xv, v0);
          if (ng > 1) v1 = hn::MulAdd(hn::Set(df, sg[kTile + t] * dv), xv, v1);
          if (ng > 2) v2 = hn::MulAdd(hn::Set(df, sg[2 * kTile + t] * dv), xv, v2);
          if (ng > 3) v3 = hn::MulAdd(hn::Set(df, sg[3 * kTile + t] * dv), xv, v3);
        }
        hn::StoreU(v0, df, o0);
        if (ng > 1) hn::StoreU(v1, df, o0 + D);
        if (ng > 2) hn::StoreU(v2, df, o0 + 2 * D);
        if (ng > 3) hn::StoreU(v3, df, o0 + 3 * D);
      }
    }
  }
}

void BlockQuantAttention(const cpu::BlockQuantAttnArgs& a) {
  // Chunks of N lanes must stay inside a block's half (q4: low/high nibbles): N <= 16.
  const hn::CappedTag<float, 16> df;
  if (a.q4) BlockAttnImpl<true>(df, a);
  else BlockAttnImpl<false>(df, a);
}

}  // namespace HWY_NAMESPACE
}  // namespace vq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace vq::cpu {
HWY_EXPORT(BlockQuantAttention);

void block_quant_attention(const BlockQuantAttnArgs& a) {
  VQ_CHECK(a.head_dim > 0 && a.head_dim % 32 == 0 && a.group > 0 && a.n_tokens >= 0,
           "cpu::block_quant_attention: head_dim {} (multiple of 32), group {}, n_tokens {}", a.head_dim, a.group,
           a.n_tokens);
  if (a.n_tokens > 0) HWY_DYNAMIC_DISPATCH(BlockQuantAttention)(a);
}
}  // namespace vq::cpu
#endif
