// Per-target kernels of the weight products (Highway, runtime dispatch). Quantized weights meet
// activations quantized to int16 blocks of 32 (|q| <= 127): each 32-element weight block is
// decoded in registers to int16 lanes w with w_true = a * w + b, and
//   dot(block) = a * d_x * sum(w * q_x) + b * s_x        (s_x = d_x * sum(q_x))
// where sum(w * q_x) is exact in int32 (pairwise multiply-add of int16 lanes). The float
// weights (f32, f16, bf16) use the float activations and fused multiply-adds.
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/matmul_kernels.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <cmath>
#include <cstring>

#include "core/fp16.h"
#include "model/matmul_kernels.h"
#include "model/quant_blocks.h"

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

inline uint16_t ld16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t ld32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// ------------------------------------------------------------------ activation quantization

void QuantizeRowsImpl(const float* x, int64_t M, int64_t cols, int16_t* q, float* d, float* s) {
#if HWY_TARGET == HWY_SCALAR
  quantize_rows_scalar(x, M, cols, q, d, s);
#else
  const hn::FixedTag<float, 4> df;
  const hn::FixedTag<int32_t, 4> di;
  const hn::FixedTag<int16_t, 4> d16;
  const int64_t nb = cols / 32;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * cols + b * 32;
      int16_t* qb = q + m * cols + b * 32;
      auto vmax = hn::Zero(df);
      for (int i = 0; i < 32; i += 4) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + i)));
      const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
      const float db = amax / 127.0f;
      const float id = db != 0.0f ? 127.0f / amax : 0.0f;
      auto vid = hn::Set(df, id);
      auto vsum = hn::Zero(di);
      for (int i = 0; i < 32; i += 4) {
        const auto qi = hn::NearestInt(hn::Mul(hn::LoadU(df, xb + i), vid));
        vsum = hn::Add(vsum, qi);
        hn::StoreU(hn::DemoteTo(d16, qi), d16, qb + i);
      }
      const int32_t sum = hn::GetLane(hn::SumOfLanes(di, vsum));
      d[m * nb + b] = db;
      s[m * nb + b] = db * float(sum);
    }
  }
#endif
}

#undef VQ_MATMUL_SIMD
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
#define VQ_MATMUL_SIMD 1
#else
#define VQ_MATMUL_SIMD 0
#endif

#if VQ_MATMUL_SIMD
// 256-bit vectors: one 32-element block = two int16 vectors (elements 0..15 and 16..31).
using D8 = hn::FixedTag<uint8_t, 16>;
using DI8 = hn::FixedTag<int8_t, 16>;
using DU16 = hn::FixedTag<uint16_t, 16>;
using D16 = hn::FixedTag<int16_t, 16>;
using D32 = hn::FixedTag<int32_t, 8>;
using DF = hn::FixedTag<float, 8>;
using V16 = hn::Vec<D16>;
using V8 = hn::Vec<D8>;
using VF = hn::Vec<DF>;

struct Decoded {
  V16 lo, hi;  // int16 lanes: elements 0..15 and 16..31 of the block
  float a, b;  // weight = a * lane + b
};

HWY_INLINE V16 U8ToI16(V8 v) { return hn::BitCast(D16(), hn::PromoteTo(DU16(), v)); }
HWY_INLINE V8 LowNib(V8 v) { return hn::And(v, hn::Set(D8(), 15)); }
HWY_INLINE V8 HighNib(V8 v) { return hn::ShiftRight<4>(v); }
HWY_INLINE float H2F(const uint8_t* p) { return f16_to_f32(ld16(p)); }

// Fifth bits of Q5_0/Q5_1: lane i of the result is 16 when bit i of `bits` is set.
HWY_INLINE hn::Vec<DU16> FifthBits(uint32_t bits16) {
  alignas(32) static constexpr uint16_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                                   8192, 16384, 32768};
  const DU16 du;
  const auto m = hn::TestBit(hn::Set(du, uint16_t(bits16)), hn::Load(du, kBit));
  return hn::IfThenElseZero(m, hn::Set(du, 16));
}

// One decoder per type: Begin(row) once per row, Block(b) for the b-th 32-element block.
struct DecQ8_0 {
  static constexpr bool kOffset = false;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 34;
    const DI8 di8;
    const D16 d16;
    return {hn::PromoteTo(d16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p + 2))),
            hn::PromoteTo(d16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p + 18))), H2F(p), 0.0f};
  }
};
struct DecQ4_0 {
  static constexpr bool kOffset = true;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 18;
    const V8 v = hn::LoadU(D8(), p + 2);
    const float d = H2F(p);
    return {U8ToI16(LowNib(v)), U8ToI16(HighNib(v)), d, -8.0f * d};
  }
};
struct DecQ4_1 {
  static constexpr bool kOffset = true;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 20;
    const V8 v = hn::LoadU(D8(), p + 4);
    return {U8ToI16(LowNib(v)), U8ToI16(HighNib(v)), H2F(p), H2F(p + 2)};
  }
};
struct DecQ5_0 {
  static constexpr bool kOffset = true;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 22;
    const uint32_t qh = ld32(p + 2);
    const V8 v = hn::LoadU(D8(), p + 6);
    const DU16 du;
    const D16 d16;
    const auto lo = hn::Or(hn::PromoteTo(du, LowNib(v)), FifthBits(qh & 0xffff));
    const auto hi = hn::Or(hn::PromoteTo(du, HighNib(v)), FifthBits(qh >> 16));
    const float d = H2F(p);
    return {hn::BitCast(d16, lo), hn::BitCast(d16, hi), d, -16.0f * d};
  }
};
struct DecQ5_1 {
  static constexpr bool kOffset = true;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 24;
    const uint32_t qh = ld32(p + 4);
    const V8 v = hn::LoadU(D8(), p + 8);
    const DU16 du;
    const D16 d16;
    const auto lo = hn::Or(hn::PromoteTo(du, LowNib(v)), FifthBits(qh & 0xffff));
    const auto hi = hn::Or(hn::PromoteTo(du, HighNib(v)), FifthBits(qh >> 16));
    return {hn::BitCast(d16, lo), hn::BitCast(d16, hi), H2F(p), H2F(p + 2)};
  }
};
// Q4_K / Q5_K: activation block b is sub-block j = b % 8 of super-block b / 8.
template <bool kFive>
struct DecQK {
  static constexpr bool kOffset = true;
  static constexpr int kBytes = kFive ? 176 : 144;
  const uint8_t* row;
  mutable int64_t cur = -1;
  mutable float a[8], off[8];
  HWY_INLINE void Begin(const uint8_t* r) {
    row = r;
    cur = -1;
  }
  HWY_INLINE Decoded Block(int64_t b) const {
    const int64_t sb = b >> 3;
    const int j = int(b & 7);
    const uint8_t* p = row + sb * kBytes;
    if (sb != cur) {
      cur = sb;
      const float d = H2F(p), dmin = H2F(p + 2);
      for (int k = 0; k < 8; ++k) {
        int sc, m;
        blocks::k_scale_min(p + 4, k, &sc, &m);
        a[k] = d * float(sc);
        off[k] = -(dmin * float(m));
      }
    }
    const uint8_t* qs = p + (kFive ? 48 : 16) + 32 * (j >> 1);
    const D8 d8;
    V8 lo = hn::LoadU(d8, qs), hi = hn::LoadU(d8, qs + 16);
    if (j & 1) {
      lo = HighNib(lo);
      hi = HighNib(hi);
    } else {
      lo = LowNib(lo);
      hi = LowNib(hi);
    }
    if constexpr (kFive) {
      const uint8_t* qh = p + 16;
      const auto bit = hn::Set(d8, uint8_t(1u << j));
      const auto sixteen = hn::Set(d8, 16);
      lo = hn::Or(lo, hn::IfThenElseZero(hn::TestBit(hn::LoadU(d8, qh), bit), sixteen));
      hi = hn::Or(hi, hn::IfThenElseZero(hn::TestBit(hn::LoadU(d8, qh + 16), bit), sixteen));
    }
    return {U8ToI16(lo), U8ToI16(hi), a[j], off[j]};
  }
};
// Q6_K: activation block b is quarter k = b % 4 of half n = (b / 4) % 2 of super-block b / 8;
// the two 16-element scales are multiplied into the int16 lanes (|q * sc| <= 32 * 128).
struct DecQ6_K {
  static constexpr bool kOffset = false;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + (b >> 3) * 210;
    const int n = int((b >> 2) & 1), k = int(b & 3);
    const D8 d8;
    const uint8_t* ql = p + 64 * n + 32 * (k & 1);
    const uint8_t* qh = p + 128 + 32 * n;
    V8 l0 = hn::LoadU(d8, ql), l1 = hn::LoadU(d8, ql + 16);
    V8 h0 = hn::LoadU(d8, qh), h1 = hn::LoadU(d8, qh + 16);
    if (k >> 1) {
      l0 = HighNib(l0);
      l1 = HighNib(l1);
    } else {
      l0 = LowNib(l0);
      l1 = LowNib(l1);
    }
    const auto three = hn::Set(d8, 3);
    switch (k) {
      case 1: h0 = hn::ShiftRight<2>(h0), h1 = hn::ShiftRight<2>(h1); break;
      case 2: h0 = hn::ShiftRight<4>(h0), h1 = hn::ShiftRight<4>(h1); break;
      case 3: h0 = hn::ShiftRight<6>(h0), h1 = hn::ShiftRight<6>(h1); break;
      default: break;
    }
    const V8 q0 = hn::Or(l0, hn::ShiftLeft<4>(hn::And(h0, three)));
    const V8 q1 = hn::Or(l1, hn::ShiftLeft<4>(hn::And(h1, three)));
    const D16 d16;
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192) + 8 * n + 2 * k;
    const auto v32 = hn::Set(d16, 32);
    const V16 w0 = hn::Mul(hn::Sub(U8ToI16(q0), v32), hn::Set(d16, int16_t(sc[0])));
    const V16 w1 = hn::Mul(hn::Sub(U8ToI16(q1), v32), hn::Set(d16, int16_t(sc[1])));
    return {w0, w1, H2F(p + 208), 0.0f};
  }
};

// y[m, r] for rows [r0, r1) and all M activation rows, MT activation rows per weight decode.
template <class Dec, int MT>
HWY_INLINE void RowsMT(const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X, int64_t m0,
                       float* y, int64_t ldy) {
  const DF df;
  const D16 d16;
  const D32 d32;
  const int64_t nb = X.cols / 32;
  const int16_t* xq[MT];
  const float* xd[MT];
  const float* xs[MT];
  for (int t = 0; t < MT; ++t) {
    xq[t] = X.q + (m0 + t) * X.cols;
    xd[t] = X.d + (m0 + t) * nb;
    xs[t] = X.s + (m0 + t) * nb;
  }
  Dec dec;
  for (int64_t r = r0; r < r1; ++r) {
    dec.Begin(W + size_t(r) * rb);
    VF acc[MT];
    float accb[MT];
    for (int t = 0; t < MT; ++t) acc[t] = hn::Zero(df), accb[t] = 0.0f;
    for (int64_t b = 0; b < nb; ++b) {
      const Decoded w = dec.Block(b);
      for (int t = 0; t < MT; ++t) {
        const int16_t* xp = xq[t] + b * 32;
        auto s0 = hn::Zero(d32), s1 = hn::Zero(d32);
        s0 = hn::ReorderWidenMulAccumulate(d32, w.lo, hn::Load(d16, xp), s0, s1);
        s0 = hn::ReorderWidenMulAccumulate(d32, w.hi, hn::Load(d16, xp + 16), s0, s1);
        const auto si = hn::RearrangeToOddPlusEven(s0, s1);
        acc[t] = hn::MulAdd(hn::ConvertTo(df, si), hn::Set(df, w.a * xd[t][b]), acc[t]);
        if constexpr (Dec::kOffset) accb[t] += w.b * xs[t][b];
      }
    }
    for (int t = 0; t < MT; ++t) y[(m0 + t) * ldy + r] = hn::GetLane(hn::SumOfLanes(df, acc[t])) + accb[t];
  }
}

template <class Dec>
void RowsQ(const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X, float* y, int64_t ldy) {
  // Row tiles keep a few weight rows in L1 while the activation rows stream past them.
  constexpr int64_t kTile = 16;
  for (int64_t rt = r0; rt < r1; rt += kTile) {
    const int64_t re = rt + kTile < r1 ? rt + kTile : r1;
    int64_t m = 0;
    for (; m + 4 <= X.M; m += 4) RowsMT<Dec, 4>(W, rb, rt, re, X, m, y, ldy);
    switch (X.M - m) {
      case 3: RowsMT<Dec, 3>(W, rb, rt, re, X, m, y, ldy); break;
      case 2: RowsMT<Dec, 2>(W, rb, rt, re, X, m, y, ldy); break;
      case 1: RowsMT<Dec, 1>(W, rb, rt, re, X, m, y, ldy); break;
      default: break;
    }
  }
}

void QuantRowsImpl(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X,
                   float* y, int64_t ldy) {
  switch (GGMLType(type)) {
    case GGMLType::Q8_0: return RowsQ<DecQ8_0>(W, rb, r0, r1, X, y, ldy);
    case GGMLType::Q4_0: return RowsQ<DecQ4_0>(W, rb, r0, r1, X, y, ldy);
    case GGMLType::Q4_1: return RowsQ<DecQ4_1>(W, rb, r0, r1, X, y, ldy);
    case GGMLType::Q5_0: return RowsQ<DecQ5_0>(W, rb, r0, r1, X, y, ldy);
    case GGMLType::Q5_1: return RowsQ<DecQ5_1>(W, rb, r0, r1, X, y, ldy);
    case GGMLType::Q4_K: return RowsQ<DecQK<false>>(W, rb, r0, r1, X, y, ldy);
    case GGMLType::Q5_K: return RowsQ<DecQK<true>>(W, rb, r0, r1, X, y, ldy);
    case GGMLType::Q6_K: return RowsQ<DecQ6_K>(W, rb, r0, r1, X, y, ldy);
    default: return quant_rows_scalar(type, W, rb, r0, r1, X, y, ldy);
  }
}

// Float weights: 8 lanes per step, MT activation rows per weight load.
template <int kType>
HWY_INLINE VF LoadW(const uint8_t* p, int64_t i) {
  const DF df;
  if constexpr (kType == 0) {
    return hn::LoadU(df, reinterpret_cast<const float*>(p) + i);
  } else if constexpr (kType == 1) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(p) + i));
  } else {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    return hn::PromoteTo(df, hn::LoadU(db, reinterpret_cast<const hwy::bfloat16_t*>(p) + i));
  }
}

template <int kType, int MT>
HWY_INLINE void FloatMT(const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const float* x, int64_t cols,
                        int64_t m0, float* y, int64_t ldy) {
  const DF df;
  const int64_t nv = cols / 8 * 8;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* wr = W + size_t(r) * rb;
    VF acc[MT];
    for (int t = 0; t < MT; ++t) acc[t] = hn::Zero(df);
    for (int64_t i = 0; i < nv; i += 8) {
      const VF w = LoadW<kType>(wr, i);
      for (int t = 0; t < MT; ++t) acc[t] = hn::MulAdd(w, hn::LoadU(df, x + (m0 + t) * cols + i), acc[t]);
    }
    for (int t = 0; t < MT; ++t) {
      float s = hn::GetLane(hn::SumOfLanes(df, acc[t]));
      for (int64_t i = nv; i < cols; ++i) {
        float wv;
        if constexpr (kType == 0) {
          std::memcpy(&wv, wr + 4 * i, 4);
        } else if constexpr (kType == 1) {
          wv = f16_to_f32(ld16(wr + 2 * i));
        } else {
          wv = bf16_to_f32(ld16(wr + 2 * i));
        }
        s += wv * x[(m0 + t) * cols + i];
      }
      y[(m0 + t) * ldy + r] = s;
    }
  }
}

template <int kType>
void RowsF(const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const float* x, int64_t M, int64_t cols, float* y,
           int64_t ldy) {
  constexpr int64_t kTile = 16;
  for (int64_t rt = r0; rt < r1; rt += kTile) {
    const int64_t re = rt + kTile < r1 ? rt + kTile : r1;
    int64_t m = 0;
    for (; m + 4 <= M; m += 4) FloatMT<kType, 4>(W, rb, rt, re, x, cols, m, y, ldy);
    for (; m < M; ++m) FloatMT<kType, 1>(W, rb, rt, re, x, cols, m, y, ldy);
  }
}

void FloatRowsImpl(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const float* x, int64_t M,
                   int64_t cols, float* y, int64_t ldy) {
  switch (GGMLType(type)) {
    case GGMLType::F32: return RowsF<0>(W, rb, r0, r1, x, M, cols, y, ldy);
    case GGMLType::F16: return RowsF<1>(W, rb, r0, r1, x, M, cols, y, ldy);
    case GGMLType::BF16: return RowsF<2>(W, rb, r0, r1, x, M, cols, y, ldy);
    default: return float_rows_scalar(type, W, rb, r0, r1, x, M, cols, y, ldy);
  }
}

#else  // targets without 256-bit integer vectors: the portable scalar kernels

void QuantRowsImpl(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X,
                   float* y, int64_t ldy) {
  quant_rows_scalar(type, W, rb, r0, r1, X, y, ldy);
}
void FloatRowsImpl(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const float* x, int64_t M,
                   int64_t cols, float* y, int64_t ldy) {
  float_rows_scalar(type, W, rb, r0, r1, x, M, cols, y, ldy);
}

#endif

}  // namespace HWY_NAMESPACE
}  // namespace vq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace vq {
HWY_EXPORT(QuantizeRowsImpl);
HWY_EXPORT(QuantRowsImpl);
HWY_EXPORT(FloatRowsImpl);

void quantize_rows_kernel(const float* x, int64_t M, int64_t cols, int16_t* q, float* d, float* s) {
  HWY_DYNAMIC_DISPATCH(QuantizeRowsImpl)(x, M, cols, q, d, s);
}
void quant_rows_kernel(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X,
                       float* y, int64_t ldy) {
  HWY_DYNAMIC_DISPATCH(QuantRowsImpl)(type, W, rb, r0, r1, X, y, ldy);
}
void float_rows_kernel(uint32_t type, const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const float* x, int64_t M,
                       int64_t cols, float* y, int64_t ldy) {
  HWY_DYNAMIC_DISPATCH(FloatRowsImpl)(type, W, rb, r0, r1, x, M, cols, y, ldy);
}
}  // namespace vq
#endif
