// Products on row-interleaved (packed) weights; the layouts are documented in matmul_packed.h.
// Per group of 8 weight rows and 32-element block: the codes of the 8 rows are 8 vectors of
// 32 bytes, each 32-bit lane one row's 4 consecutive codes; the matching 4 activation bytes are
// broadcast to all lanes, so u8 x s8 dot products (vpmaddubsw + vpmaddwd, or one AVX-512 VNNI
// vpdpbusd) leave row r's partial sum in lane r. The block scale of the 8 rows (d, or d * sc
// for the K-quants) is one float vector, the activation block's d_x a broadcast: 8 outputs per
// FMA, no horizontal sums; the offsets (mins, -8 d, ...) meet s_x = d_x * sum(q_x) likewise.
// Register tiles of up to 4 activation rows share each decoded weight vector; see the header
// for how tiles, column steps and activation panels are ordered for 1..16 rows and prefill.
// `pf` (CpuTuning::weight_prefetch): one-row tiles request the weight stream ahead in software
// too (tiles of 2+ rows of the K-quants always do); Intel parts need it, Zen 4 is faster without.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1  // the VNNI target, as in model/matmul_kernels.cpp
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/matmul_packed.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "model/matmul_packed.h"
#include "model/quant_blocks.h"
#include "ops/cpu/prefetch.h"

HWY_BEFORE_NAMESPACE();
namespace vq {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL

// sum + the dot products of 4 u8 weights and 4 s8 activations in each int32 lane.
HWY_INLINE __m256i AccDot(__m256i sum, __m256i u, __m256i s) {
#if HWY_TARGET == HWY_AVX3_DL
  // EVEX form forced: see Dpbusd in model/matmul_kernels.cpp (Highway 1.0's AVX3_DL enables
  // "avxvnni", whose VEX encoding Ice Lake and Zen 4 lack).
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(sum) : "v"(u), "v"(s));
  return sum;
#else
  return _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
#endif
}

HWY_INLINE __m256i Bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

HWY_INLINE __m256i Load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
HWY_INLINE __m256 H8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
HWY_INLINE __m256 U8x8ToFloat(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}
// 16 in the bytes of hb whose bit `bit` (0..7) is set (the fifth bit of a 5-bit code), else 0:
// one 16-bit shift that brings the bit to position 4 of its byte, then a mask. (Bit 4 of a byte
// only receives bits of the same byte: a left shift by s <= 4 moves bit 4 - s there, a right
// shift by s <= 3 bit 4 + s <= 7.)
template <class W>
HWY_INLINE typename W::I Fifth(typename W::I hb, int bit) {
  const typename W::I m16 = W::Set8(16);
  if (bit <= 4) return W::And(W::Sll16(hb, 4 - bit), m16);
  return W::And(W::Srl16(hb, bit - 4), m16);
}

// Bit `bit` (0..7) of each byte of hb moved to bit `pos` (0..4) of its byte, the others cleared
// (16-bit shifts: a left shift by s <= pos brings bit pos - s of the same byte, a right shift by
// s <= 7 - pos bit pos + s of the same byte).
template <class W>
HWY_INLINE typename W::I BitTo(typename W::I hb, int bit, int pos) {
  const typename W::I m = W::Set8(char(1 << pos));
  if (bit <= pos) return W::And(W::Sll16(hb, pos - bit), m);
  return W::And(W::Srl16(hb, bit - pos), m);
}
// Eight u8 at p as int32 lanes.
HWY_INLINE __m256i U8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
HWY_INLINE __m256 I8x8ToFloat(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Tiles: MT activation rows m0.., units [u0, u1) of one group G; io[2t], io[2t + 1]: the
// running sums (scaled dot products, offsets) of row m0 + t, read and written back. xs16:
// [X.M, X.cols / 16] sums of 16 activation codes (made only for the types that use them).
enum class K32 { Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 };

template <K32 K>
constexpr size_t Chunk32() {
  return K == K32::Q4_0 ? 144 : K == K32::Q4_1 ? 160 : K == K32::Q5_0 ? 176 : K == K32::Q5_1 ? 192 : 272;
}

// Bytes ahead of the current unit that the scalar-block tiles request when prefetching.
constexpr int64_t kAhead32 = 2048;

// The tiles are written once over a width W: W1 is one group of 8 rows in 256-bit vectors,
// W2 (AVX-512 targets) two groups side by side in 512-bit vectors, group G in the low half and
// G + gs in the high one. Every lane does the same integer sums and the same float steps in the
// same order in either width, so a row's output does not depend on which one ran it.
struct W1 {
  using I = __m256i;
  using F = __m256;
  static constexpr int kGroups = 1;
  static HWY_INLINE I Ld(const uint8_t* p, int64_t) { return Load32(p); }
  static HWY_INLINE F Half8(const uint8_t* p, int64_t) { return H8(p); }
  static HWY_INLINE I Set8(char v) { return _mm256_set1_epi8(v); }
  static HWY_INLINE I And(I a, I b) { return _mm256_and_si256(a, b); }
  static HWY_INLINE I Or(I a, I b) { return _mm256_or_si256(a, b); }
  static HWY_INLINE I Srl16(I a, int n) { return _mm256_srl_epi16(a, _mm_cvtsi32_si128(n)); }
  static HWY_INLINE I Sll16(I a, int n) { return _mm256_sll_epi16(a, _mm_cvtsi32_si128(n)); }
  static HWY_INLINE I Abs8(I a) { return _mm256_abs_epi8(a); }
  static HWY_INLINE I Sign8(I x, I w) { return _mm256_sign_epi8(x, w); }
  static HWY_INLINE I Xor(I a, I b) { return _mm256_xor_si256(a, b); }
  static HWY_INLINE I Bc4(const int8_t* p) { return Bcast4(p); }
  static HWY_INLINE I Dot(I sum, I u, I s) { return AccDot(sum, u, s); }
  static constexpr bool kVnni = HWY_TARGET == HWY_AVX3_DL;
  static HWY_INLINE I Pairs16(I u, I s) { return _mm256_maddubs_epi16(u, s); }
  static HWY_INLINE I Add16(I a, I b) { return _mm256_add_epi16(a, b); }
  static HWY_INLINE I Widen(I sum, I p) { return _mm256_add_epi32(sum, _mm256_madd_epi16(p, _mm256_set1_epi16(1))); }
  static HWY_INLINE I Zero() { return _mm256_setzero_si256(); }
  static HWY_INLINE F ZeroF() { return _mm256_setzero_ps(); }
  static HWY_INLINE F Cvt(I a) { return _mm256_cvtepi32_ps(a); }
  static HWY_INLINE F Set1(float v) { return _mm256_set1_ps(v); }
  static HWY_INLINE F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static HWY_INLINE F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static HWY_INLINE F Fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static HWY_INLINE F U8F(const uint8_t* p, int64_t) { return U8x8ToFloat(p); }
  static HWY_INLINE F I8F(const uint8_t* p, int64_t) { return I8x8ToFloat(p); }
  static HWY_INLINE I U8I(const uint8_t* p, int64_t) { return U8x8(p); }
  static HWY_INLINE I Set32(int32_t v) { return _mm256_set1_epi32(v); }
  static HWY_INLINE I Sub32(I a, I b) { return _mm256_sub_epi32(a, b); }
  static HWY_INLINE I Srl32(I a, int n) { return _mm256_srli_epi32(a, n); }
  static HWY_INLINE F In(const __m256* io0, const __m256*, int i) { return io0[i]; }
  static HWY_INLINE void Out(F v, __m256* io0, __m256*, int i) { io0[i] = v; }
};

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
HWY_INLINE __m512i Join(__m256i lo, __m256i hi) { return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1); }
HWY_INLINE __m512i AccDot512(__m512i sum, __m512i u, __m512i s) {
#if HWY_TARGET == HWY_AVX3_DL
  asm("vpdpbusd %2, %1, %0" : "+v"(sum) : "v"(u), "v"(s));  // as AccDot (the intrinsic needs avx512vnni)
  return sum;
#else
  return _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}
struct W2 {
  using I = __m512i;
  using F = __m512;
  static constexpr int kGroups = 2;
  static HWY_INLINE I Ld(const uint8_t* p, int64_t gs) { return Join(Load32(p), Load32(p + gs)); }
  static HWY_INLINE F Half8(const uint8_t* p, int64_t gs) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + gs));
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
  }
  static HWY_INLINE I Set8(char v) { return _mm512_set1_epi8(v); }
  static HWY_INLINE I And(I a, I b) { return _mm512_and_si512(a, b); }
  static HWY_INLINE I Or(I a, I b) { return _mm512_or_si512(a, b); }
  static HWY_INLINE I Srl16(I a, int n) { return _mm512_srl_epi16(a, _mm_cvtsi32_si128(n)); }
  static HWY_INLINE I Sll16(I a, int n) { return _mm512_sll_epi16(a, _mm_cvtsi32_si128(n)); }
  static HWY_INLINE I Xor(I a, I b) { return _mm512_xor_si512(a, b); }
  static HWY_INLINE I Bc4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
  }
  static HWY_INLINE I Dot(I sum, I u, I s) { return AccDot512(sum, u, s); }
  static constexpr bool kVnni = HWY_TARGET == HWY_AVX3_DL;
  static HWY_INLINE I Pairs16(I u, I s) { return _mm512_maddubs_epi16(u, s); }
  static HWY_INLINE I Add16(I a, I b) { return _mm512_add_epi16(a, b); }
  static HWY_INLINE I Widen(I sum, I p) { return _mm512_add_epi32(sum, _mm512_madd_epi16(p, _mm512_set1_epi16(1))); }
  static HWY_INLINE I Zero() { return _mm512_setzero_si512(); }
  static HWY_INLINE F ZeroF() { return _mm512_setzero_ps(); }
  static HWY_INLINE F Cvt(I a) { return _mm512_cvtepi32_ps(a); }
  static HWY_INLINE F Set1(float v) { return _mm512_set1_ps(v); }
  static HWY_INLINE F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static HWY_INLINE F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static HWY_INLINE F Fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  // Eight bytes of each group (p, p + gs) in one 128-bit vector.
  static HWY_INLINE __m128i Bytes8x2(const uint8_t* p, int64_t gs) {
    return _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)),
                              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + gs)));
  }
  static HWY_INLINE F U8F(const uint8_t* p, int64_t gs) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(Bytes8x2(p, gs))); }
  static HWY_INLINE F I8F(const uint8_t* p, int64_t gs) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(Bytes8x2(p, gs))); }
  static HWY_INLINE I U8I(const uint8_t* p, int64_t gs) { return _mm512_cvtepu8_epi32(Bytes8x2(p, gs)); }
  static HWY_INLINE I Set32(int32_t v) { return _mm512_set1_epi32(v); }
  static HWY_INLINE I Sub32(I a, I b) { return _mm512_sub_epi32(a, b); }
  static HWY_INLINE I Srl32(I a, int n) { return _mm512_srli_epi32(a, unsigned(n)); }
  static HWY_INLINE F In(const __m256* io0, const __m256* io1, int i) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(io0[i]), io1[i], 1);
  }
  static HWY_INLINE void Out(F v, __m256* io0, __m256* io1, int i) {
    io0[i] = _mm512_castps512_ps256(v);
    io1[i] = _mm512_extractf32x8_ps(v, 1);
  }
};
#endif

// sum + the u8 x s8 dot products of the kN pairs (u, s) = pair(k), k < kN. With VNNI, one vpdpbusd
// per pair. Without (AVX2, AVX-512 without VNNI) each pair's products are summed in pairs
// (vpmaddubsw) and kRun such results added in 16 bits before one widening (vpmaddwd) into sum:
// the same integers while kRun * 2 * max(u) * 128 < 32768 (the caller's bound: kRun 8 for 4-bit
// codes, 4 for 5-bit, 2 for 6-bit, 1 for 8-bit), and a third of the multiply-port work for kRun 8.
template <class W, int kN, int kRun, class Pair>
HWY_INLINE typename W::I DotRun(typename W::I sum, Pair&& pair) {
  static_assert(kN % kRun == 0, "runs of equal length");
  if constexpr (W::kVnni || kRun == 1) {
    for (int k = 0; k < kN; ++k) {
      const auto [u, x] = pair(k);
      sum = W::Dot(sum, u, x);
    }
  } else {
    for (int k0 = 0; k0 < kN; k0 += kRun) {
      const auto [u0, x0] = pair(k0);
      typename W::I p = W::Pairs16(u0, x0);
      for (int k = k0 + 1; k < k0 + kRun; ++k) {
        const auto [u, x] = pair(k);
        p = W::Add16(p, W::Pairs16(u, x));
      }
      sum = W::Widen(sum, p);
    }
  }
  return sum;
}

template <class W, K32 K, int MT>
HWY_INLINE void Tile32(const uint8_t* G, int64_t gs, int64_t u0, int64_t u1, const QuantizedRows& X, int64_t m0,
                       __m256* io0, __m256* io1, bool pf) {
  using I = typename W::I;
  using F = typename W::F;
  constexpr bool kFive = K == K32::Q5_0 || K == K32::Q5_1;
  constexpr bool kMin = K == K32::Q4_1 || K == K32::Q5_1;
  constexpr bool kOffset = K != K32::Q8_0;
  constexpr size_t kD = K == K32::Q8_0 ? 256 : kFive ? 160 : 128;  // offset of d[8]
  const int64_t nb = X.cols / 32;
  F acc[MT], accm[MT];
  for (int t = 0; t < MT; ++t) acc[t] = W::In(io0, io1, 2 * t), accm[t] = W::In(io0, io1, 2 * t + 1);
  const I m15 = W::Set8(15);
  for (int64_t u = u0; u < u1; ++u) {
    const uint8_t* C = G + u * int64_t(Chunk32<K>());
    if (MT == 1 && pf)  // one-row tiles only, as the K-quants' (tiles of 2+ rows: not measured faster)
      for (int q = 0; q < W::kGroups; ++q)
        for (int64_t k = 0; k < int64_t(Chunk32<K>()); k += 64)
          _mm_prefetch(reinterpret_cast<const char*>(C + q * gs + kAhead32 + k), _MM_HINT_T0);
    I w[8];  // vector k: elements 4k..4k+3 of the 8 rows (of each group)
    if constexpr (K == K32::Q8_0) {
      for (int k = 0; k < 8; ++k) w[k] = W::Ld(C + 32 * k, gs);
    } else {
      const I hb = kFive ? W::Ld(C + 128, gs) : W::Zero();
      for (int c = 0; c < 4; ++c) {
        const I v = W::Ld(C + 32 * c, gs);
        w[2 * c] = W::And(v, m15);
        w[2 * c + 1] = W::And(W::Srl16(v, 4), m15);
        if constexpr (kFive) {
          w[2 * c] = W::Or(w[2 * c], Fifth<W>(hb, 2 * c));
          w[2 * c + 1] = W::Or(w[2 * c + 1], Fifth<W>(hb, 2 * c + 1));
        }
      }
    }
    const F a8 = W::Half8(C + kD, gs);
    F b8 = W::ZeroF();
    if constexpr (kMin) b8 = W::Half8(C + kD + 16, gs);
    if constexpr (K == K32::Q4_0) b8 = W::Mul(a8, W::Set1(-8.0f));
    if constexpr (K == K32::Q5_0) b8 = W::Mul(a8, W::Set1(-16.0f));
    // Q8_0 (signed weights) in 256 bits: |w| (u8) meets sign(x, w). In 512 bits, which have no
    // vpsignb: the activations biased to u8 (x + 128; |x| <= 127) meet w, and the block's
    // 128 * sum(w), made once per unit, is taken off each row's sum (the same integer).
    constexpr bool kBiased = K == K32::Q8_0 && W::kGroups == 2;
    I aw[8], corr = W::Zero();
    if constexpr (kBiased)
      for (int k = 0; k < 8; ++k) corr = W::Dot(corr, W::Set8(char(0x80)), w[k]);
    else if constexpr (K == K32::Q8_0)
      for (int k = 0; k < 8; ++k) aw[k] = W::Abs8(w[k]);
    for (int t = 0; t < MT; ++t) {
      const int8_t* xb = X.q + (m0 + t) * X.cols + 32 * u;
      I sum = W::Zero();
      if constexpr (kBiased)
        sum = DotRun<W, 8, 1>(sum, [&](int k) { return std::pair{W::Xor(W::Bc4(xb + 4 * k), W::Set8(char(0x80))), w[k]}; });
      else if constexpr (K == K32::Q8_0)
        sum = DotRun<W, 8, 1>(sum, [&](int k) { return std::pair{aw[k], W::Sign8(W::Bc4(xb + 4 * k), w[k])}; });
      else  // codes 0..15 (0..31 with the fifth bit)
        sum = DotRun<W, 8, kFive ? 4 : 8>(sum, [&](int k) { return std::pair{w[k], W::Bc4(xb + 4 * k)}; });
      if constexpr (kBiased) sum = W::Sub32(sum, corr);
      const int64_t bi = (m0 + t) * nb + u;
      acc[t] = W::Fma(W::Cvt(sum), W::Mul(a8, W::Set1(X.d[bi])), acc[t]);
      if constexpr (kOffset) accm[t] = W::Fma(b8, W::Set1(X.s[bi]), accm[t]);
    }
  }
  for (int t = 0; t < MT; ++t) W::Out(acc[t], io0, io1, 2 * t), W::Out(accm[t], io0, io1, 2 * t + 1);
}

template <class W, bool kFive, int MT>
HWY_INLINE void TileQ4K(const uint8_t* G, int64_t gs, int64_t u0, int64_t u1, const QuantizedRows& X, int64_t m0,
                        __m256* io0, __m256* io1, bool pf) {
  using I = typename W::I;
  using F = typename W::F;
  constexpr int64_t kChunk = kFive ? int64_t(kQ5KChunk) : int64_t(kQ4KChunk);
  const int64_t nb = X.cols / 32;
  F acc[MT], accm[MT];
  for (int t = 0; t < MT; ++t) acc[t] = W::In(io0, io1, 2 * t), accm[t] = W::In(io0, io1, 2 * t + 1);
  const I m15 = W::Set8(15);
  for (int64_t s = u0; s < u1; ++s) {
    const uint8_t* C = G + s * kChunk;
    // Tiles of 2+ rows fetch the chunk two ahead in software; one row when pf (see TileQ6K).
    if (MT > 1 || pf)
      for (int q = 0; q < W::kGroups; ++q)
        for (int64_t k = 0; k < kChunk; k += 64)
          _mm_prefetch(reinterpret_cast<const char*>(C + q * gs + 2 * kChunk + k), _MM_HINT_T0);
    const F d8 = W::Half8(C + 1152, gs), dm8 = W::Half8(C + 1168, gs);
    for (int j = 0; j < 8; ++j) {
      const F a8 = W::Mul(d8, W::U8F(C + 1024 + 8 * j, gs));
      const F b8 = W::Mul(dm8, W::U8F(C + 1088 + 8 * j, gs));
      I lo[4], hi[4];
      const I hb = kFive ? W::Ld(C + 1184 + 32 * j, gs) : W::Zero();
      for (int c = 0; c < 4; ++c) {
        const I v = W::Ld(C + 128 * j + 32 * c, gs);
        lo[c] = W::And(v, m15);
        hi[c] = W::And(W::Srl16(v, 4), m15);
        if constexpr (kFive) {
          lo[c] = W::Or(lo[c], Fifth<W>(hb, 2 * c));
          hi[c] = W::Or(hi[c], Fifth<W>(hb, 2 * c + 1));
        }
      }
      for (int t = 0; t < MT; ++t) {
        const int8_t* xb = X.q + (m0 + t) * X.cols + s * 256 + 32 * j;
        const I sum = DotRun<W, 8, kFive ? 4 : 8>(W::Zero(), [&](int k) {  // codes 0..15 (0..31: Q5_K)
          return std::pair{(k & 1) ? hi[k >> 1] : lo[k >> 1], W::Bc4(xb + 4 * k)};
        });
        const int64_t bi = (m0 + t) * nb + 8 * s + j;
        acc[t] = W::Fma(W::Cvt(sum), W::Mul(a8, W::Set1(X.d[bi])), acc[t]);
        accm[t] = W::Fnma(b8, W::Set1(X.s[bi]), accm[t]);
      }
    }
  }
  for (int t = 0; t < MT; ++t) W::Out(acc[t], io0, io1, 2 * t), W::Out(accm[t], io0, io1, 2 * t + 1);
}

// Q6_K: the unsigned codes u (0..63) meet the activations in the u8 x s8 products, and each
// 16-element half's sum less 32 * its activation sum is sum((u - 32) * x), exactly; the two
// halves of each 32-element block keep separate sums (their scales differ).
template <class W, int MT>
HWY_INLINE void TileQ6K(const uint8_t* G, int64_t gs, int64_t u0, int64_t u1, const QuantizedRows& X,
                        const int32_t* xs16, int64_t m0, __m256* io0, __m256* io1, bool pf) {
  using I = typename W::I;
  using F = typename W::F;
  const int64_t nb = X.cols / 32, n16 = X.cols / 16;
  F acc[MT];
  for (int t = 0; t < MT; ++t) acc[t] = W::In(io0, io1, 2 * t);
  const I m15 = W::Set8(15), m48 = W::Set8(48);
  for (int64_t s = u0; s < u1; ++s) {
    const uint8_t* C = G + s * int64_t(kQ6KChunk);
    // Tiles of 2+ rows fetch the chunk two ahead in software. One row does when pf: on Zen 4
    // the hardware prefetchers do better alone (weights from memory, 1 thread: q6_K M=1 59-72
    // GFLOP/s without, 33-40 with; M=4 98-104 with, 77-80 without; q4_K likewise), on Intel Xeon
    // (Emerald Rapids) they do not (Qwen2.5-1.5B's q4_K/q6_K layer, M=1: 6.6 GB/s per thread
    // without, 11.9 with). (The codes and high bits of a block are contiguous: with the planes
    // apart, two interleaved streams, M=1 ran at 12-13 GFLOP/s, stalled on each chunk's first load.)
    if (MT > 1 || pf)
      for (int q = 0; q < W::kGroups; ++q)
        for (int64_t k = 0; k < int64_t(kQ6KChunk); k += 64)
          _mm_prefetch(reinterpret_cast<const char*>(C + q * gs + 2 * int64_t(kQ6KChunk) + k), _MM_HINT_T0);
    const F d8 = W::Half8(C + 1664, gs);
    for (int j = 0; j < 8; ++j) {
      const F a0 = W::Mul(d8, W::I8F(C + 1536 + 16 * j, gs));
      const F a1 = W::Mul(d8, W::I8F(C + 1544 + 16 * j, gs));
      I w[8];  // w[2c]: elements 8c + 0..3 of each row, w[2c + 1]: 8c + 4..7; 0..63
      for (int c = 0; c < 4; ++c) {
        const I v = W::Ld(C + 192 * j + 32 * c, gs);
        const I hb = W::Ld(C + 192 * j + 128 + 32 * (c >> 1), gs);
        // The 2 high bits of element p (0..3) of each 4-byte lane group sit at bits 2p, 2p+1 of
        // hb's byte: one 16-bit shift brings them to bits 4, 5 (no bits cross a byte).
        const int sh = 4 * (c & 1);  // p = 2 (c & 1) for the low half-block, + 1 for the high
        const I hlo = sh == 0 ? W::And(W::Sll16(hb, 4), m48) : W::And(hb, m48);
        const I hhi = sh == 0 ? W::And(W::Sll16(hb, 2), m48) : W::And(W::Srl16(hb, 2), m48);
        w[2 * c] = W::Or(W::And(v, m15), hlo);
        w[2 * c + 1] = W::Or(W::And(W::Srl16(v, 4), m15), hhi);
      }
      for (int t = 0; t < MT; ++t) {
        const int8_t* xb = X.q + (m0 + t) * X.cols + s * 256 + 32 * j;
        const int32_t* xs = xs16 + (m0 + t) * n16 + s * 16 + 2 * j;
        // codes 0..63: runs of 2
        I sum0 = DotRun<W, 4, 2>(W::Zero(), [&](int k) { return std::pair{w[k], W::Bc4(xb + 4 * k)}; });
        I sum1 = DotRun<W, 4, 2>(W::Zero(), [&](int k) { return std::pair{w[k + 4], W::Bc4(xb + 16 + 4 * k)}; });
        sum0 = W::Sub32(sum0, W::Set32(32 * xs[0]));
        sum1 = W::Sub32(sum1, W::Set32(32 * xs[1]));
        const F dx = W::Set1(X.d[(m0 + t) * nb + 8 * s + j]);
        acc[t] = W::Fma(W::Cvt(sum0), W::Mul(a0, dx), acc[t]);
        acc[t] = W::Fma(W::Cvt(sum1), W::Mul(a1, dx), acc[t]);
      }
    }
  }
  for (int t = 0; t < MT; ++t) W::Out(acc[t], io0, io1, 2 * t);
}

// Q2_K and Q3_K (codes2 layout): per 32-element block, the two 16-element halves keep separate
// sums (their scales differ). Q2_K: w = q (0..3), offsets -dmin * m * (16-element activation
// sums). Q3_K: w = u (0..7) and the sum of each half less 4 * its activation sum (exact in int32).
template <class W, bool kThree, int MT>
HWY_INLINE void TileQ23K(const uint8_t* G, int64_t gs, int64_t u0, int64_t u1, const QuantizedRows& X,
                         const int32_t* xs16, int64_t m0, __m256* io0, __m256* io1, bool pf) {
  using I = typename W::I;
  using F = typename W::F;
  constexpr int64_t kChunk = kThree ? int64_t(kQ3KChunk) : int64_t(kQ2KChunk);
  const int64_t nb = X.cols / 32, n16 = X.cols / 16;
  F acc[MT], accm[MT];
  for (int t = 0; t < MT; ++t) acc[t] = W::In(io0, io1, 2 * t), accm[t] = W::In(io0, io1, 2 * t + 1);
  const I m3 = W::Set8(3);
  for (int64_t s = u0; s < u1; ++s) {
    const uint8_t* C = G + s * kChunk;
    if (MT == 1 && pf)  // as TileQ4K's one-row tiles
      for (int q = 0; q < W::kGroups; ++q)
        for (int64_t k = 0; k < kChunk; k += 64)
          _mm_prefetch(reinterpret_cast<const char*>(C + q * gs + 2 * kChunk + k), _MM_HINT_T0);
    const F d8 = W::Half8(C + (kThree ? 896 : 640), gs);
    const F dm8 = kThree ? W::ZeroF() : W::Half8(C + 656, gs);
    for (int j = 0; j < 8; ++j) {
      F a[2], b[2];
      for (int h = 0; h < 2; ++h) {
        if constexpr (kThree) {
          a[h] = W::Mul(d8, W::I8F(C + 768 + 8 * (2 * j + h), gs));
          b[h] = W::ZeroF();
        } else {
          const I sc = W::U8I(C + 512 + 8 * (2 * j + h), gs);
          a[h] = W::Mul(d8, W::Cvt(W::And(sc, W::Set32(15))));
          b[h] = W::Mul(dm8, W::Cvt(W::Srl32(sc, 4)));
        }
      }
      I w[8];  // w[4h + p]: elements 16h + 4p + 0..3 of each row
      const I hb = kThree ? W::Ld(C + 512 + 32 * j, gs) : W::Zero();
      for (int h = 0; h < 2; ++h) {
        const I v = W::Ld(C + 64 * j + 32 * h, gs);
        for (int p = 0; p < 4; ++p) {
          w[4 * h + p] = W::And(W::Srl16(v, 2 * p), m3);
          if constexpr (kThree) w[4 * h + p] = W::Or(w[4 * h + p], BitTo<W>(hb, 4 * h + p, 2));
        }
      }
      for (int t = 0; t < MT; ++t) {
        const int8_t* xb = X.q + (m0 + t) * X.cols + s * 256 + 32 * j;
        const int32_t* xs = xs16 + (m0 + t) * n16 + s * 16 + 2 * j;
        const F dx = W::Set1(X.d[(m0 + t) * nb + 8 * s + j]);
        for (int h = 0; h < 2; ++h) {
          I sum = DotRun<W, 4, 4>(W::Zero(), [&](int p) {  // codes 0..3 (0..7: Q3_K)
            return std::pair{w[4 * h + p], W::Bc4(xb + 16 * h + 4 * p)};
          });
          if constexpr (kThree) sum = W::Sub32(sum, W::Set32(4 * xs[h]));
          acc[t] = W::Fma(W::Cvt(sum), W::Mul(a[h], dx), acc[t]);
          if constexpr (!kThree) accm[t] = W::Fnma(b[h], W::Mul(dx, W::Set1(float(xs[h]))), accm[t]);
        }
      }
    }
  }
  for (int t = 0; t < MT; ++t) W::Out(acc[t], io0, io1, 2 * t), W::Out(accm[t], io0, io1, 2 * t + 1);
}

// Float weights (kE: 0 f32, 1 f16, 2 bf16) on the float activations X.x. Per unit of 32 columns
// and activation row, 2 partial sums (columns c % 2: shorter FMA chains) added into the total.
template <int kE>
HWY_INLINE __m256 LoadF8(const uint8_t* p) {
  if constexpr (kE == 0) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  } else if constexpr (kE == 1) {
    return H8(p);
  } else {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
}

// NG (1 or 2) adjacent groups (G, G + gstride) at once: each broadcast activation serves both
// groups' weight vectors. io0/io1: the totals of rows m0.. of each group.
template <int kE, int MT, int NG>
HWY_INLINE void TileF(const uint8_t* G, int64_t gstride, int64_t u0, int64_t u1, const QuantizedRows& X, int64_t m0,
                      __m256* io0, __m256* io1) {
  constexpr int64_t kEs = kE == 0 ? 4 : 2, kChunk = 32 * 8 * kEs;
  __m256 acc[NG][MT];
  for (int t = 0; t < MT; ++t) {
    acc[0][t] = io0[t];
    if constexpr (NG == 2) acc[NG - 1][t] = io1[t];
  }
  for (int64_t u = u0; u < u1; ++u) {
    const uint8_t* C = G + u * kChunk;
    // Two streams (one per group) of 2-4 KB a unit: fetched 4 units ahead in software, which
    // the hardware prefetchers did not do well enough (Zen 4, f16 from memory: 11 -> 16+ GFLOP/s).
    for (int q = 0; q < NG; ++q)
      for (int64_t k = 0; k < kChunk; k += 64)
        _mm_prefetch(reinterpret_cast<const char*>(C + q * gstride + 4 * kChunk + k), _MM_HINT_T0);
    __m256 part[NG][MT][2];
    for (int q = 0; q < NG; ++q)
      for (int t = 0; t < MT; ++t) part[q][t][0] = part[q][t][1] = _mm256_setzero_ps();
    for (int c0 = 0; c0 < 32; c0 += 2) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {  // constant indices: the partial sums stay in registers
        __m256 w[NG];
#pragma GCC unroll 2
        for (int q = 0; q < NG; ++q) w[q] = LoadF8<kE>(C + q * gstride + (c0 + h) * 8 * kEs);
#pragma GCC unroll 4
        for (int t = 0; t < MT; ++t) {
          const __m256 xv = _mm256_broadcast_ss(X.x + (m0 + t) * X.cols + 32 * u + c0 + h);
#pragma GCC unroll 2
          for (int q = 0; q < NG; ++q) part[q][t][h] = _mm256_fmadd_ps(w[q], xv, part[q][t][h]);
        }
      }
    }
    for (int q = 0; q < NG; ++q)
      for (int t = 0; t < MT; ++t) acc[q][t] = _mm256_add_ps(acc[q][t], _mm256_add_ps(part[q][t][0], part[q][t][1]));
  }
  for (int t = 0; t < MT; ++t) {
    io0[t] = acc[0][t];
    if constexpr (NG == 2) io1[t] = acc[NG - 1][t];
  }
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// Eight values of each of two groups (p, p + gs) in one 512-bit vector (group p low).
template <int kE>
HWY_INLINE __m512 LoadF8x2(const uint8_t* p, int64_t gs) {
  if constexpr (kE == 0) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(reinterpret_cast<const float*>(p))),
                              _mm256_loadu_ps(reinterpret_cast<const float*>(p + gs)), 1);
  } else if constexpr (kE == 1) {
    return W2::Half8(p, gs);
  } else {
    const __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
                                              _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + gs)), 1);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  }
}

// TileF<kE, MT, 2> with both groups in one 512-bit vector: each lane does what TileF's does (the
// same FMAs into the same two partial sums, added into the total in the same order).
template <int kE, int MT>
HWY_INLINE void TileF2(const uint8_t* G, int64_t gstride, int64_t u0, int64_t u1, const QuantizedRows& X, int64_t m0,
                       __m256* io0, __m256* io1) {
  constexpr int64_t kEs = kE == 0 ? 4 : 2, kChunk = 32 * 8 * kEs;
  __m512 acc[MT];
  for (int t = 0; t < MT; ++t) acc[t] = W2::In(io0, io1, t);
  for (int64_t u = u0; u < u1; ++u) {
    const uint8_t* C = G + u * kChunk;
    for (int q = 0; q < 2; ++q)
      for (int64_t k = 0; k < kChunk; k += 64)
        _mm_prefetch(reinterpret_cast<const char*>(C + q * gstride + 4 * kChunk + k), _MM_HINT_T0);
    __m512 part[MT][2];
    for (int t = 0; t < MT; ++t) part[t][0] = part[t][1] = _mm512_setzero_ps();
    for (int c0 = 0; c0 < 32; c0 += 2) {
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512 w = LoadF8x2<kE>(C + (c0 + h) * 8 * kEs, gstride);
#pragma GCC unroll 4
        for (int t = 0; t < MT; ++t)
          part[t][h] = _mm512_fmadd_ps(w, _mm512_set1_ps(X.x[(m0 + t) * X.cols + 32 * u + c0 + h]), part[t][h]);
      }
    }
    for (int t = 0; t < MT; ++t) acc[t] = _mm512_add_ps(acc[t], _mm512_add_ps(part[t][0], part[t][1]));
  }
  for (int t = 0; t < MT; ++t) W2::Out(acc[t], io0, io1, t);
}
#endif

template <int kE, int NG>
HWY_INLINE void TileFN(int64_t mt, const uint8_t* G, int64_t gstride, int64_t u0, int64_t u1, const QuantizedRows& X,
                       int64_t m0, __m256* io0, __m256* io1) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (NG == 2) {
    switch (mt) {
      case 4: return TileF2<kE, 4>(G, gstride, u0, u1, X, m0, io0, io1);
      case 3: return TileF2<kE, 3>(G, gstride, u0, u1, X, m0, io0, io1);
      case 2: return TileF2<kE, 2>(G, gstride, u0, u1, X, m0, io0, io1);
      default: return TileF2<kE, 1>(G, gstride, u0, u1, X, m0, io0, io1);
    }
  }
#endif
  switch (mt) {
    case 4: return TileF<kE, 4, NG>(G, gstride, u0, u1, X, m0, io0, io1);
    case 3: return TileF<kE, 3, NG>(G, gstride, u0, u1, X, m0, io0, io1);
    case 2: return TileF<kE, 2, NG>(G, gstride, u0, u1, X, m0, io0, io1);
    default: return TileF<kE, 1, NG>(G, gstride, u0, u1, X, m0, io0, io1);
  }
}

// Decode reads a thread's part group by group. Two groups at a time (W2, the float tiles) are two
// streams, one per group, and where a pair ends the first stream jumps past the second: with
// short rows (640 columns of Q8_0 are 5.4 KB per group) the hardware prefetchers lost the streams
// at every pair, and a thread read its weights at 14 GB/s where a plain read of the same bytes
// reaches 33 (Zen 4, 1 thread). So while a step of a pair's columns is multiplied, the same share
// of the part's next pair (the bytes it reads next) is requested into L2: when the next pair
// starts, its bytes are in flight or there, whatever the row length. The requests go out about
// 1 KB per group at a time (DecodeStepUnits): bursts of 4 KB and more overflowed the miss queues
// and lost most of the gain. One group at a time (W1) is a single stream the hardware follows;
// requesting ahead there was slower (AVX2, q5_0: 73 -> 52 GFLOP/s), so it does not.
// docs/BENCHMARKS.md, "the weights requested a pair ahead". `cpu::Slices` (ops/cpu/prefetch.h)
// spreads the next pair's lines over the steps, slice s before step s.
// Units of `chunk` bytes per decode step of 1..4 rows: about 1 KB of each group.
constexpr int64_t DecodeStepUnits(int64_t chunk) { return std::max<int64_t>(1, (1024 + chunk / 2) / chunk); }

// The float types' groups, two at a time (a thread's part starts at an even group), with the
// same three row regimes as Groups below: 1..4 rows one tile, 5..16 column steps, panels.
template <int kE>
void GroupsF(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y, int64_t ldy) {
  constexpr int64_t kChunk = 32 * 8 * (kE == 0 ? 4 : 2), kStepUnits = 8;
  const int64_t nu = P.cols / 32, M = X.M, gstride = nu * kChunk;
  const uint8_t* base = P.data.data();
  __m256 io[2][kPackedPanelRows];
  auto tile = [&](int64_t ng, int64_t mt, const uint8_t* G, int64_t u0, int64_t u1, int64_t m0) {
    if (ng == 2)
      TileFN<kE, 2>(mt, G, gstride, u0, u1, X, m0, io[0] + (m0 % kPackedPanelRows), io[1] + (m0 % kPackedPanelRows));
    else
      TileFN<kE, 1>(mt, G, gstride, u0, u1, X, m0, io[0] + (m0 % kPackedPanelRows), io[1]);
  };
  auto store = [&](int64_t g, int64_t ng, int64_t m0, int64_t m1) {
    for (int64_t q = 0; q < ng; ++q) {
      const int64_t nr = std::min<int64_t>(8, P.rows - 8 * (g + q));
      for (int64_t m = m0; m < m1; ++m) {
        alignas(32) float out[8];
        _mm256_store_ps(out, io[q][m % kPackedPanelRows]);
        std::memcpy(y + m * ldy + 8 * (g + q), out, size_t(nr) * sizeof(float));
      }
    }
  };
  for (int64_t p0 = 0; p0 < M; p0 += kPackedPanelRows) {
    const int64_t p1 = std::min(M, p0 + kPackedPanelRows);
    for (int64_t g = g0; g < g1; g += 2) {
      const int64_t ng = std::min<int64_t>(2, g1 - g);
      const uint8_t* G = base + g * gstride;
      for (int64_t q = 0; q < 2; ++q)
        for (int64_t m = p0; m < p1; ++m) io[q][m % kPackedPanelRows] = _mm256_setzero_ps();
      if (M <= kPackedDecodeRows) {
        // Decode: the groups' columns in steps (1..4 rows: one tile per step; batched decode: a
        // step is read from memory once, then from L1 by each 4-row tile), each step requesting
        // the same share of the part's next two groups into L2 first (see DecodeStepUnits).
        const int64_t step = M <= 4 ? DecodeStepUnits(kChunk) : kStepUnits;
        const cpu::Slices ahead(g + 2 < g1 ? G + 2 * gstride : nullptr, size_t(2 * gstride), int((nu + step - 1) / step));
        for (int64_t u0 = 0, s = 0; u0 < nu; u0 += step, ++s) {
          const int64_t u1 = std::min(nu, u0 + step);
          ahead.request<2>(int(s));
          for (int64_t m0 = p0; m0 < p1; m0 += 4) tile(ng, std::min<int64_t>(4, p1 - m0), G, u0, u1, m0);
        }
      } else {
        for (int64_t m0 = p0; m0 < p1; m0 += 4) tile(ng, std::min<int64_t>(4, p1 - m0), G, 0, nu, m0);
      }
      store(g, ng, p0, p1);
    }
  }
}

// The formats: chunk bytes, units per column step (256 columns) and the tile for 1..4 rows of
// one group (W1) or, where kWide, of two (W2). kSums16: whether the tiles read the 16-element
// activation sums.
template <K32 K>
struct Fmt32 {
  static constexpr int64_t kChunk = int64_t(Chunk32<K>()), kStep = 8;
  // q8_0 in 512 bits needs VNNI: its biased activations (up to 255) would saturate vpmaddubsw.
  static constexpr bool kSums16 = false, kWide = K != K32::Q8_0 || HWY_TARGET == HWY_AVX3_DL;
  template <class W, int MT>
  static HWY_INLINE void Tile(const uint8_t* G, int64_t gs, int64_t u0, int64_t u1, const QuantizedRows& X,
                              const int32_t*, int64_t m0, __m256* io0, __m256* io1, bool pf) {
    Tile32<W, K, MT>(G, gs, u0, u1, X, m0, io0, io1, pf);
  }
};
template <bool kFive>
struct FmtQ4K {
  static constexpr int64_t kChunk = kFive ? int64_t(kQ5KChunk) : int64_t(kQ4KChunk), kStep = 1;
  static constexpr bool kSums16 = false, kWide = true;
  template <class W, int MT>
  static HWY_INLINE void Tile(const uint8_t* G, int64_t gs, int64_t u0, int64_t u1, const QuantizedRows& X,
                              const int32_t*, int64_t m0, __m256* io0, __m256* io1, bool pf) {
    TileQ4K<W, kFive, MT>(G, gs, u0, u1, X, m0, io0, io1, pf);
  }
};
struct FmtQ6K {
  static constexpr int64_t kChunk = int64_t(kQ6KChunk), kStep = 1;
  static constexpr bool kSums16 = true, kWide = true;
  template <class W, int MT>
  static HWY_INLINE void Tile(const uint8_t* G, int64_t gs, int64_t u0, int64_t u1, const QuantizedRows& X,
                              const int32_t* xs16, int64_t m0, __m256* io0, __m256* io1, bool pf) {
    TileQ6K<W, MT>(G, gs, u0, u1, X, xs16, m0, io0, io1, pf);
  }
};
template <bool kThree>
struct FmtQ23K {
  static constexpr int64_t kChunk = kThree ? int64_t(kQ3KChunk) : int64_t(kQ2KChunk), kStep = 1;
  static constexpr bool kSums16 = true, kWide = true;
  template <class W, int MT>
  static HWY_INLINE void Tile(const uint8_t* G, int64_t gs, int64_t u0, int64_t u1, const QuantizedRows& X,
                              const int32_t* xs16, int64_t m0, __m256* io0, __m256* io1, bool pf) {
    TileQ23K<W, kThree, MT>(G, gs, u0, u1, X, xs16, m0, io0, io1, pf);
  }
};
template <class F, class W>
HWY_INLINE void TileN(int64_t mt, const uint8_t* G, int64_t gs, int64_t u0, int64_t u1, const QuantizedRows& X,
                      const int32_t* xs16, int64_t m0, __m256* io0, __m256* io1, bool pf) {
  switch (mt) {
    case 4: return F::template Tile<W, 4>(G, gs, u0, u1, X, xs16, m0, io0, io1, pf);
    case 3: return F::template Tile<W, 3>(G, gs, u0, u1, X, xs16, m0, io0, io1, pf);
    case 2: return F::template Tile<W, 2>(G, gs, u0, u1, X, xs16, m0, io0, io1, pf);
    default: return F::template Tile<W, 1>(G, gs, u0, u1, X, xs16, m0, io0, io1, pf);
  }
}

// xs[m * cols / 16 + k] = the sum of activation codes 16k..16k+15 of row m (|sum| <= 2032).
HWY_INLINE void Sums16(const QuantizedRows& X, int32_t* xs) {
  const int64_t n = X.M * X.cols;
  const __m256i bias = _mm256_set1_epi8(char(0x80));
  for (int64_t i = 0; i < n; i += 32) {
    // Biased to u8 (x + 128), then sums of 8 bytes per 64-bit lane.
    const __m256i v = _mm256_xor_si256(Load32(reinterpret_cast<const uint8_t*>(X.q + i)), bias);
    alignas(32) int64_t q[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), _mm256_sad_epu8(v, _mm256_setzero_si256()));
    xs[i / 16] = int32_t(q[0] + q[1]) - 16 * 128;
    xs[i / 16 + 1] = int32_t(q[2] + q[3]) - 16 * 128;
  }
}

// y rows m0..m0+n-1, outputs 8g.. (those below `rows`) from the sums io.
HWY_INLINE void StoreRows(const __m256* io, int64_t n, int64_t m0, int64_t g, int64_t rows, float* y, int64_t ldy) {
  const int64_t nr = std::min<int64_t>(8, rows - 8 * g);
  for (int64_t t = 0; t < n; ++t) {
    alignas(32) float out[8];
    _mm256_store_ps(out, _mm256_add_ps(io[2 * t], io[2 * t + 1]));
    float* yr = y + (m0 + t) * ldy + 8 * g;
    if (nr == 8)
      std::memcpy(yr, out, sizeof out);
    else
      for (int64_t r = 0; r < nr; ++r) yr[r] = out[r];
  }
}

// Groups [g0, g1) of one part, one at a time (W1) or two at a time (W2: a part starts at an even
// group; an odd last one runs alone).
template <class F, class W>
void GroupsW(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, const int32_t* xs16, float* y,
             int64_t ldy, bool pf) {
  const int64_t nu = P.cols / unit_cols(P.type), M = X.M, gs = nu * F::kChunk;
  const uint8_t* base = P.data.data();
  __m256 io[2][2 * kPackedDecodeRows];
  for (int64_t g = g0; g < g1;) {
    if (W::kGroups == 2 && g + 1 == g1) return GroupsW<F, W1>(P, g, g1, X, xs16, y, ldy, pf);
    const uint8_t* G = base + g * gs;
    if (M <= kPackedDecodeRows) {
      for (int q = 0; q < W::kGroups; ++q)
        for (int64_t i = 0; i < 2 * M; ++i) io[q][i] = _mm256_setzero_ps();
      // The groups' columns in steps. 1..4 rows: one tile per step. 5..16 rows (batched decode):
      // a step of F::kStep units is read from memory once, then from L1 by each 4-row tile.
      // Two groups at a time, each step first requests the same share of the part's next two
      // into L2 (see DecodeStepUnits).
      const int64_t step = M <= 4 ? DecodeStepUnits(F::kChunk) : F::kStep;
      const cpu::Slices ahead(W::kGroups == 2 && g + 2 < g1 ? G + 2 * gs : nullptr, size_t(2 * gs),
                              int((nu + step - 1) / step));
      for (int64_t u0 = 0, s = 0; u0 < nu; u0 += step, ++s) {
        const int64_t u1 = std::min(nu, u0 + step);
        ahead.request<2>(int(s));
        for (int64_t m0 = 0; m0 < M; m0 += 4)
          TileN<F, W>(std::min<int64_t>(4, M - m0), G, gs, u0, u1, X, xs16, m0, io[0] + 2 * m0, io[1] + 2 * m0, pf);
      }
      for (int q = 0; q < W::kGroups; ++q) StoreRows(io[q], M, 0, g + q, P.rows, y, ldy);
    } else {
      // Prefill: panels of activation rows, each against the groups of this part in turn.
      for (int64_t p0 = 0; p0 < M; p0 += kPackedPanelRows) {
        const int64_t p1 = std::min(M, p0 + kPackedPanelRows);
        for (int64_t m0 = p0; m0 < p1; m0 += 4) {
          const int64_t mt = std::min<int64_t>(4, p1 - m0);
          for (int q = 0; q < W::kGroups; ++q)
            for (int64_t i = 0; i < 2 * mt; ++i) io[q][i] = _mm256_setzero_ps();
          TileN<F, W>(mt, G, gs, 0, nu, X, xs16, m0, io[0], io[1], pf);
          for (int q = 0; q < W::kGroups; ++q) StoreRows(io[q], mt, m0, g + q, P.rows, y, ldy);
        }
      }
    }
    g += W::kGroups;
  }
}

template <class F>
void Groups(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y, int64_t ldy, bool pf) {
  const int32_t* xs16 = nullptr;
  if constexpr (F::kSums16) {
    thread_local std::vector<int32_t> sums;  // [M, cols / 16], reused across calls of this thread
    sums.resize(size_t(X.M * (X.cols / 16)));
    Sums16(X, sums.data());
    xs16 = sums.data();
  }
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  if constexpr (F::kWide) return GroupsW<F, W2>(P, g0, g1, X, xs16, y, ldy, pf);
#endif
  GroupsW<F, W1>(P, g0, g1, X, xs16, y, ldy, pf);
}

void PackedGroupsImpl(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y, int64_t ldy,
                      bool pf) {
  switch (P.type) {
    case GGMLType::Q4_0: return Groups<Fmt32<K32::Q4_0>>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::Q4_1: return Groups<Fmt32<K32::Q4_1>>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::Q5_0: return Groups<Fmt32<K32::Q5_0>>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::Q5_1: return Groups<Fmt32<K32::Q5_1>>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::Q8_0: return Groups<Fmt32<K32::Q8_0>>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::Q4_K: return Groups<FmtQ4K<false>>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::Q5_K: return Groups<FmtQ4K<true>>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::Q6_K: return Groups<FmtQ6K>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::Q2_K: return Groups<FmtQ23K<false>>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::Q3_K: return Groups<FmtQ23K<true>>(P, g0, g1, X, y, ldy, pf);
    case GGMLType::F32: return GroupsF<0>(P, g0, g1, X, y, ldy);
    case GGMLType::F16: return GroupsF<1>(P, g0, g1, X, y, ldy);
    case GGMLType::BF16: return GroupsF<2>(P, g0, g1, X, y, ldy);
    default: return packed_groups_scalar(P, g0, g1, X, y, ldy);
  }
}

#else  // other targets (NEON, SVE, SSE4, scalar, ...): the portable kernel

void PackedGroupsImpl(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y, int64_t ldy,
                      bool /*pf*/) {
  packed_groups_scalar(P, g0, g1, X, y, ldy);
}

#endif

}  // namespace HWY_NAMESPACE
}  // namespace vq
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace vq {
HWY_EXPORT(PackedGroupsImpl);

void packed_groups_kernel(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                          int64_t ldy) {
  HWY_DYNAMIC_DISPATCH(PackedGroupsImpl)(P, g0, g1, X, y, ldy, cpu_tuning().weight_prefetch);
}

namespace {
inline uint16_t ld16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline float h2f(const uint8_t* p) { return f16_to_f32(ld16(p)); }

bool is_five(GGMLType t) { return t == GGMLType::Q5_0 || t == GGMLType::Q5_1; }
bool has_min(GGMLType t) { return t == GGMLType::Q4_1 || t == GGMLType::Q5_1; }

// The codes of one GGUF block of a 32-element type (quant_blocks.h) into q[32]: 0..15 (q4),
// 0..31 (q5), -128..127 (q8_0).
void codes32(GGMLType t, const uint8_t* blk, int* q) {
  if (t == GGMLType::Q8_0) {
    for (int e = 0; e < 32; ++e) q[e] = int8_t(blk[2 + e]);
    return;
  }
  const int hdr = t == GGMLType::Q4_0 ? 2 : t == GGMLType::Q4_1 ? 4 : t == GGMLType::Q5_0 ? 6 : 8;
  const uint8_t* qs = blk + hdr;
  for (int i = 0; i < 16; ++i) q[i] = qs[i] & 15, q[i + 16] = qs[i] >> 4;
  if (is_five(t)) {
    uint32_t qh;
    std::memcpy(&qh, blk + hdr - 4, 4);
    for (int e = 0; e < 32; ++e) q[e] |= int((qh >> e) & 1) << 4;
  }
}
// The codes (0..31) of a GGUF Q4_K (five false) or Q5_K super-block into q[256].
void codesk(const uint8_t* blk, bool five, int* q) {
  const uint8_t* qs = blk + (five ? 48 : 16);
  for (int g = 0; g < 4; ++g)
    for (int l = 0; l < 32; ++l) {
      const uint8_t byte = qs[32 * g + l];
      q[64 * g + l] = byte & 15;
      q[64 * g + 32 + l] = byte >> 4;
      if (five) {
        q[64 * g + l] |= ((blk[16 + l] >> (2 * g)) & 1) << 4;
        q[64 * g + 32 + l] |= ((blk[16 + l] >> (2 * g + 1)) & 1) << 4;
      }
    }
}
// The 6-bit codes u (0..63) of a GGUF Q6_K super-block (quant_blocks.h) into q[256].
void codes6k(const uint8_t* blk, int* q) {
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        const int lo = (blk[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
        const int hi = (blk[128 + 32 * n + l] >> (2 * k)) & 3;
        q[128 * n + 32 * k + l] = lo | hi << 4;
      }
}

// codes4 (and hi5 when H is not null) of one 32-element block q[32] of row r, at C (and H).
void put_codes4(const int* q, int r, uint8_t* C, uint8_t* H) {
  for (int c = 0; c < 4; ++c)
    for (int i = 0; i < 4; ++i) {
      const int a = q[8 * c + i], b = q[8 * c + 4 + i];
      C[32 * c + 4 * r + i] = uint8_t((a & 15) | (b & 15) << 4);
      if (H) H[4 * r + i] = uint8_t(H[4 * r + i] | ((a >> 4) & 1) << (2 * c) | ((b >> 4) & 1) << (2 * c + 1));
    }
}

void pack_32_chunk(GGMLType t, const uint8_t* blk, int r, uint8_t* C) {
  if (t == GGMLType::Q8_0) {
    for (int k = 0; k < 8; ++k) std::memcpy(C + 32 * k + 4 * r, blk + 2 + 4 * k, 4);
    std::memcpy(C + 256 + 2 * r, blk, 2);
    return;
  }
  const bool five = is_five(t);
  int q[32];
  codes32(t, blk, q);
  put_codes4(q, r, C, five ? C + 128 : nullptr);
  const size_t dof = five ? 160 : 128;
  std::memcpy(C + dof + 2 * r, blk, 2);
  if (has_min(t)) std::memcpy(C + dof + 16 + 2 * r, blk + 2, 2);
}

void pack_q4k_chunk(const uint8_t* blk, int r, uint8_t* C, bool five) {
  std::memcpy(C + 1152 + 2 * r, blk, 2);      // d
  std::memcpy(C + 1168 + 2 * r, blk + 2, 2);  // dmin
  int q[256];
  codesk(blk, five, q);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    blocks::k_scale_min(blk + 4, j, &sc, &m);
    C[1024 + 8 * j + r] = uint8_t(sc);
    C[1088 + 8 * j + r] = uint8_t(m);
    put_codes4(q + 32 * j, r, C + 128 * j, five ? C + 1184 + 32 * j : nullptr);
  }
}

void pack_q6k_chunk(const uint8_t* blk, int r, uint8_t* C) {
  std::memcpy(C + 1664 + 2 * r, blk + 208, 2);  // d
  for (int k = 0; k < 16; ++k) C[1536 + 8 * k + r] = blk[192 + k];
  int q[256];
  codes6k(blk, q);
  for (int j = 0; j < 8; ++j) {
    const int* qj = q + 32 * j;
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 4; ++i)
        C[192 * j + 32 * c + 4 * r + i] = uint8_t((qj[8 * c + i] & 15) | (qj[8 * c + 4 + i] & 15) << 4);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 4; ++i) {
        int v = 0;
        for (int p = 0; p < 4; ++p) v |= (qj[16 * h + 4 * p + i] >> 4) << (2 * p);
        C[192 * j + 128 + 32 * h + 4 * r + i] = uint8_t(v);
      }
  }
}

// codes2 of 256 2-bit codes q (0..3) of row r at C (matmul_packed.h).
void put_codes2(const int* q, int r, uint8_t* C) {
  for (int j = 0; j < 8; ++j)
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 4; ++i) {
        int v = 0;
        for (int p = 0; p < 4; ++p) v |= q[32 * j + 16 * h + 4 * p + i] << (2 * p);
        C[64 * j + 32 * h + 4 * r + i] = uint8_t(v);
      }
}

void pack_q2k_chunk(const uint8_t* blk, int r, uint8_t* C) {
  int q[256];
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) q[128 * n + 32 * k + l] = (blk[16 + 32 * n + l] >> (2 * k)) & 3;
  put_codes2(q, r, C);
  for (int k = 0; k < 16; ++k) C[512 + 8 * k + r] = blk[k];
  std::memcpy(C + 640 + 2 * r, blk + 80, 2);  // d
  std::memcpy(C + 656 + 2 * r, blk + 82, 2);  // dmin
}

void pack_q3k_chunk(const uint8_t* blk, int r, uint8_t* C) {
  int lo[256], hi[256];
  for (int n = 0; n < 2; ++n)
    for (int k = 0; k < 4; ++k)
      for (int l = 0; l < 32; ++l) {
        lo[128 * n + 32 * k + l] = (blk[32 + 32 * n + l] >> (2 * k)) & 3;
        hi[128 * n + 32 * k + l] = (blk[l] >> (4 * n + k)) & 1;
      }
  put_codes2(lo, r, C);
  for (int j = 0; j < 8; ++j)
    for (int i = 0; i < 4; ++i) {
      int v = 0;
      for (int p = 0; p < 8; ++p) v |= hi[32 * j + 4 * p + i] << p;
      C[512 + 32 * j + 4 * r + i] = uint8_t(v);
    }
  for (int k = 0; k < 16; ++k) C[768 + 8 * k + r] = uint8_t(int8_t(blocks::q3k_scale(blk + 96, k)));
  std::memcpy(C + 896 + 2 * r, blk + 108, 2);  // d
}

// One unit (32 values) of a float row into column-interleaved position r of C.
void pack_float_chunk(const uint8_t* src, size_t es, int r, uint8_t* C) {
  for (int c = 0; c < 32; ++c) std::memcpy(C + (size_t(c) * 8 + size_t(r)) * es, src + size_t(c) * es, es);
}

// Block j (0..unit/32 - 1) of row r of a packed chunk C of a quantized type: codes w[32], scales
// a[0] (elements 0..15) and a[1] (16..31), offsets b[0], b[1] likewise: weight = a * w + b
// (a[0] == a[1] and b[0] == b[1] but for the K-quants with 16-element sub-blocks).
void unpack_block(GGMLType t, const uint8_t* C, int r, int j, int* w, float* a, float* b) {
  auto codes4 = [&](const uint8_t* V, const uint8_t* H) {
    for (int e = 0; e < 32; ++e) {
      const int c = e / 8, i = e % 4, hn = (e % 8) / 4;
      w[e] = (V[32 * c + 4 * r + i] >> (4 * hn)) & 15;
      if (H) w[e] |= ((H[4 * r + i] >> (2 * c + hn)) & 1) << 4;
    }
  };
  b[0] = b[1] = 0;
  switch (t) {
    case GGMLType::Q8_0:
      for (int e = 0; e < 32; ++e) w[e] = int8_t(C[32 * (e / 4) + 4 * r + e % 4]);
      a[0] = a[1] = h2f(C + 256 + 2 * r);
      return;
    case GGMLType::Q4_0:
    case GGMLType::Q4_1:
    case GGMLType::Q5_0:
    case GGMLType::Q5_1: {
      const bool five = is_five(t);
      codes4(C, five ? C + 128 : nullptr);
      const size_t dof = five ? 160 : 128;
      a[0] = a[1] = h2f(C + dof + 2 * r);
      b[0] = b[1] = has_min(t) ? h2f(C + dof + 16 + 2 * r) : a[0] * (five ? -16.0f : -8.0f);
      return;
    }
    case GGMLType::Q4_K:
    case GGMLType::Q5_K: {
      const bool five = t == GGMLType::Q5_K;
      codes4(C + 128 * j, five ? C + 1184 + 32 * j : nullptr);
      a[0] = a[1] = h2f(C + 1152 + 2 * r) * float(C[1024 + 8 * j + r]);
      b[0] = b[1] = -(h2f(C + 1168 + 2 * r) * float(C[1088 + 8 * j + r]));
      return;
    }
    case GGMLType::Q6_K: {
      for (int e = 0; e < 32; ++e) {
        const int c = e / 8, i = e % 4, hn = (e % 8) / 4;
        const int lo = (C[192 * j + 32 * c + 4 * r + i] >> (4 * hn)) & 15;
        const int h = e / 16, p = (e % 16) / 4;
        const int hi = (C[192 * j + 128 + 32 * h + 4 * r + i] >> (2 * p)) & 3;
        w[e] = (lo | hi << 4) - 32;
      }
      const float d = h2f(C + 1664 + 2 * r);
      for (int h = 0; h < 2; ++h) a[h] = d * float(int8_t(C[1536 + 8 * (2 * j + h) + r]));
      return;
    }
    case GGMLType::Q2_K:
    case GGMLType::Q3_K: {
      const bool three = t == GGMLType::Q3_K;
      for (int e = 0; e < 32; ++e) {
        const int h = e / 16, p = (e % 16) / 4, i = e % 4;
        w[e] = (C[64 * j + 32 * h + 4 * r + i] >> (2 * p)) & 3;
        if (three) w[e] += 4 * ((C[512 + 32 * j + 4 * r + i] >> (e / 4)) & 1) - 4;
      }
      const float d = h2f(C + (three ? 896 : 640) + 2 * r);
      for (int h = 0; h < 2; ++h) {
        const uint8_t sc = C[(three ? 768 : 512) + 8 * (2 * j + h) + r];
        a[h] = three ? d * float(int8_t(sc)) : d * float(sc & 15);
        if (!three) b[h] = -(h2f(C + 656 + 2 * r) * float(sc >> 4));
      }
      return;
    }
    default: VQ_FAIL("packed weights: no packed layout for {}", ggml_type_name(t));
  }
}

}  // namespace

// Same sums as the SIMD kernels: int32 block dot products (per 16-element half where the scales
// are per half), then a * d_x and b * s_x in float; float types: 2 partial sums per unit.
void packed_groups_scalar(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                          int64_t ldy) {
  const int64_t uc = unit_cols(P.type), nu = P.cols / uc, nb = X.cols / 32, bpu = uc / 32;
  const size_t chunk = chunk_bytes(P.type);
  if (packed_is_float(P.type)) {
    const size_t es = P.type == GGMLType::F32 ? 4 : 2;
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t* G = P.data.data() + size_t(g * nu) * chunk;
      for (int r = 0; r < 8 && 8 * g + r < P.rows; ++r)
        for (int64_t m = 0; m < X.M; ++m) {
          float acc = 0;
          for (int64_t u = 0; u < nu; ++u) {
            float part[2] = {0, 0};
            for (int c = 0; c < 32; ++c) {
              const uint8_t* wp = G + size_t(u) * chunk + (size_t(c) * 8 + size_t(r)) * es;
              float wv;
              if (P.type == GGMLType::F32)
                std::memcpy(&wv, wp, 4);
              else
                wv = P.type == GGMLType::F16 ? f16_to_f32(ld16(wp)) : bf16_to_f32(ld16(wp));
              part[c & 1] = std::fma(wv, X.x[m * X.cols + u * 32 + c], part[c & 1]);
            }
            acc += part[0] + part[1];
          }
          y[m * ldy + 8 * g + r] = acc;
        }
    }
    return;
  }
  const bool halves = P.type == GGMLType::Q6_K || P.type == GGMLType::Q2_K || P.type == GGMLType::Q3_K;
  int w[32];
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* G = P.data.data() + size_t(g * nu) * chunk;
    for (int r = 0; r < 8 && 8 * g + r < P.rows; ++r)
      for (int64_t m = 0; m < X.M; ++m) {
        float acc = 0, accm = 0;
        for (int64_t u = 0; u < nu; ++u)
          for (int j = 0; j < bpu; ++j) {
            float a[2], b[2];
            unpack_block(P.type, G + size_t(u) * chunk, r, j, w, a, b);
            const int8_t* xb = X.q + m * X.cols + u * uc + 32 * j;
            int32_t sum[2] = {0, 0}, xsum[2] = {0, 0};
            for (int e = 0; e < 32; ++e) sum[e / 16] += w[e] * xb[e], xsum[e / 16] += xb[e];
            const int64_t bi = m * nb + u * bpu + j;
            if (halves) {
              acc += float(sum[0]) * (a[0] * X.d[bi]) + float(sum[1]) * (a[1] * X.d[bi]);
              accm += b[0] * (X.d[bi] * float(xsum[0])) + b[1] * (X.d[bi] * float(xsum[1]));
            } else {
              acc += float(sum[0] + sum[1]) * (a[0] * X.d[bi]);
              accm += b[0] * X.s[bi];
            }
          }
        y[m * ldy + 8 * g + r] = acc + accm;
      }
  }
}

bool packed_is_float(GGMLType t) { return t == GGMLType::F32 || t == GGMLType::F16 || t == GGMLType::BF16; }

int64_t unit_cols(GGMLType t) {
  switch (t) {
    case GGMLType::Q4_0:
    case GGMLType::Q4_1:
    case GGMLType::Q5_0:
    case GGMLType::Q5_1:
    case GGMLType::Q8_0:
    case GGMLType::F32:
    case GGMLType::F16:
    case GGMLType::BF16: return 32;
    case GGMLType::Q2_K:
    case GGMLType::Q3_K:
    case GGMLType::Q4_K:
    case GGMLType::Q5_K:
    case GGMLType::Q6_K: return 256;
    default: return 0;
  }
}

size_t chunk_bytes(GGMLType t) {
  switch (t) {
    case GGMLType::Q4_0: return 144;
    case GGMLType::Q4_1: return 160;
    case GGMLType::Q5_0: return 176;
    case GGMLType::Q5_1: return 192;
    case GGMLType::Q8_0: return 272;
    case GGMLType::Q4_K: return kQ4KChunk;
    case GGMLType::Q5_K: return kQ5KChunk;
    case GGMLType::Q6_K: return kQ6KChunk;
    case GGMLType::Q2_K: return kQ2KChunk;
    case GGMLType::Q3_K: return kQ3KChunk;
    case GGMLType::F32: return 32 * 8 * 4;
    case GGMLType::F16:
    case GGMLType::BF16: return 32 * 8 * 2;
    default: return 0;
  }
}

bool packable(GGMLType t, int64_t cols) {
  const int64_t uc = unit_cols(t);
  return uc != 0 && cols > 0 && cols % uc == 0;
}

PackedWeight pack_weight(GGMLType t, const void* W, int64_t rows, int64_t cols) {
  const size_t chunk = chunk_bytes(t);
  VQ_CHECK(chunk != 0, "pack_weight: weight type {} has no packed layout (q4_0, q4_1, q5_0, q5_1, q8_0, q2_K..q6_K, "
           "f32, f16 and bf16 have)", ggml_type_name(t));
  const int64_t uc = unit_cols(t);
  VQ_CHECK(rows >= 0 && cols > 0 && cols % uc == 0,
           "pack_weight: {} weight of shape {} x {}: cols must be a positive multiple of {}", ggml_type_name(t), rows,
           cols, uc);
  PackedWeight P;
  P.type = t, P.rows = rows, P.cols = cols;
  const int64_t ng = (rows + 7) / 8, nu = cols / uc;
  const size_t rb = ggml_row_bytes(t, cols);
  // Bytes of a unit's part of a row: one GGUF block, or 32 floats.
  const size_t bb = packed_is_float(t) ? ggml_row_bytes(t, uc) : ggml_block_bytes(t);
  P.data.resize(size_t(ng * nu) * chunk);  // zeroed: padding rows multiply to 0
  const uint8_t* src = static_cast<const uint8_t*>(W);
  parallel_for(
      size_t(ng),
      [&](size_t g0, size_t g1, int) {
        for (int64_t g = int64_t(g0); g < int64_t(g1); ++g)
          for (int64_t u = 0; u < nu; ++u) {
            uint8_t* C = P.data.data() + size_t(g * nu + u) * chunk;
            for (int r = 0; r < 8 && 8 * g + r < rows; ++r) {
              const uint8_t* blk = src + size_t(8 * g + r) * rb + size_t(u) * bb;
              if (packed_is_float(t))
                pack_float_chunk(blk, bb / 32, r, C);
              else if (t == GGMLType::Q2_K)
                pack_q2k_chunk(blk, r, C);
              else if (t == GGMLType::Q3_K)
                pack_q3k_chunk(blk, r, C);
              else if (t == GGMLType::Q6_K)
                pack_q6k_chunk(blk, r, C);
              else if (t == GGMLType::Q4_K || t == GGMLType::Q5_K)
                pack_q4k_chunk(blk, r, C, t == GGMLType::Q5_K);
              else
                pack_32_chunk(t, blk, r, C);
            }
          }
      },
      16);
  return P;
}

void matmul_packed_multi(const PackedJob* jobs, int n_jobs, const QuantizedRows& X) {
  VQ_CHECK(n_jobs >= 0, "matmul_packed: {} jobs", n_jobs);
  // The work is cut in pairs of 8-row groups (16 outputs: a 64-byte line of y per activation
  // row), numbered across the jobs.
  std::vector<int64_t> start(size_t(n_jobs) + 1, 0);  // start: [n_jobs + 1] first pair of each job
  size_t bytes = 0;
  for (int j = 0; j < n_jobs; ++j) {
    const PackedWeight& P = *jobs[j].P;
    VQ_CHECK(packable(P.type, P.cols), "matmul_packed: not a packed weight ({} {} x {})", ggml_type_name(P.type),
             P.rows, P.cols);
    VQ_CHECK(X.cols == P.cols, "matmul_packed: activations have {} columns, the weight has {}", X.cols, P.cols);
    VQ_CHECK(packed_is_float(P.type) ? X.x != nullptr || X.M == 0 : X.q != nullptr || X.M == 0,
             "matmul_packed: {} weights need the {} activations", ggml_type_name(P.type),
             packed_is_float(P.type) ? "float" : "quantized");
    start[size_t(j) + 1] = start[size_t(j)] + (P.rows + 15) / 16;
    bytes += P.data.size();
  }
  const int64_t pairs = start.back();
  if (pairs == 0 || X.M <= 0) return;
  // Waking a thread costs more than ~64 KB of weight work (see matmul.cpp's kMinBytesPerThread).
  const size_t pair_work = std::max<size_t>(1, bytes / size_t(pairs) * size_t(std::min<int64_t>(X.M, 16)));
  const size_t grain = std::max<size_t>(1, (size_t(64) * 1024 + pair_work - 1) / pair_work);
  auto run = [&](size_t a, size_t b, int) {
    for (int j = 0; j < n_jobs; ++j) {
      const int64_t lo = std::max<int64_t>(int64_t(a), start[size_t(j)]);
      const int64_t hi = std::min<int64_t>(int64_t(b), start[size_t(j) + 1]);
      if (lo >= hi) continue;
      const PackedWeight& P = *jobs[j].P;
      const int64_t ng = (P.rows + 7) / 8;
      const int64_t g0 = 2 * (lo - start[size_t(j)]), g1 = std::min(ng, 2 * (hi - start[size_t(j)]));
      packed_groups_kernel(P, g0, g1, X, jobs[j].y, P.rows);
    }
  };
  // Handed out in pieces (about 4 per thread), not one range per thread: the weight streams
  // are bound by memory bandwidth, and a thread that falls behind (preempted; its core's share
  // of the bandwidth) would otherwise hold up the whole product.
  const size_t per_thread = (size_t(pairs) + 4 * size_t(num_threads()) - 1) / (4 * size_t(num_threads()));
  parallel_for_dynamic(size_t(pairs), run, std::max(grain, per_thread));
}

void matmul_packed(const PackedWeight& P, const QuantizedRows& X, float* y) {
  const PackedJob job{&P, y};
  matmul_packed_multi(&job, 1, X);
}

void matmul_packed(const PackedWeight& P, const float* x, int64_t M, float* y) {
  VQ_CHECK(M >= 0, "matmul_packed: {} activation rows", M);
  if (P.rows == 0 || M == 0) return;
  if (packed_is_float(P.type)) {  // the float rows as they are
    QuantizedRows X;
    X.M = M, X.cols = P.cols, X.x = x;
    return matmul_packed(P, X, y);
  }
  thread_local ActivationBuffer buf;  // reused across calls of this thread
  matmul_packed(P, buf.quantize(x, M, P.cols), y);
}

const PackedWeight& packed_weight(PackedSlot& slot, GGMLType t, const void* W, int64_t rows, int64_t cols) {
  std::call_once(slot.once, [&] { slot.w = pack_weight(t, W, rows, cols); });
  VQ_CHECK(slot.w.type == t && slot.w.rows == rows && slot.w.cols == cols,
           "packed weight: slot holds {} {} x {}, asked for {} {} x {}", ggml_type_name(slot.w.type), slot.w.rows,
           slot.w.cols, ggml_type_name(t), rows, cols);
  return slot.w;
}

void matmul_maybe_packed(PackedSlot* slot, GGMLType t, const void* W, int64_t rows, int64_t cols, const float* x,
                         int64_t M, float* y) {
  if (!slot) return matmul(t, W, rows, cols, x, M, y);
  matmul_packed(packed_weight(*slot, t, W, rows, cols), x, M, y);
}

void matmul_maybe_packed(PackedSlot* slot, GGMLType t, const void* W, int64_t rows, int64_t cols,
                         const QuantizedRows& X, float* y) {
  if (!slot) return matmul_q(t, W, rows, cols, X, y);
  matmul_packed(packed_weight(*slot, t, W, rows, cols), X, y);
}

}  // namespace vq
#endif  // HWY_ONCE
