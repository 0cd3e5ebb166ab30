// Per-target kernels of the weight products (Highway, runtime dispatch). Quantized weights meet
// activations quantized to int8 blocks of 32 (|q| <= 127): each 32-element weight block is
// decoded in registers to 8-bit codes w with w_true = a * w + b, and
//   dot(block) = a * d_x * sum(w * q_x) + b * s_x        (s_x = d_x * sum(q_x))
// where sum(w * q_x) is exact in int32. The float
// weights (f32, f16, bf16) use the float activations and fused multiply-adds.
// AVX3_DL (Ice Lake / Zen 4 and later: AVX-512 VNNI) is compiled here too, for its int8 dot
// product instruction (vpdpbusd); Highway leaves it out unless asked. Only this file's dispatch
// table (and its test) includes it, so the other files keep their target set.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1
#endif
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

void QuantizeRowsImpl(const float* x, int64_t M, int64_t cols, int8_t* q, float* d, float* s) {
#if HWY_TARGET == HWY_SCALAR
  quantize_rows_scalar(x, M, cols, q, d, s);
#else
  const hn::FixedTag<float, 4> df;
  const hn::FixedTag<int32_t, 4> di;
  const hn::FixedTag<int8_t, 4> d8;
  const int64_t nb = cols / 32;
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + m * cols + b * 32;
      int8_t* qb = q + m * cols + b * 32;
      auto vmax = hn::Zero(df);
      for (int i = 0; i < 32; i += 4) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + i)));
      const float amax = hn::GetLane(hn::MaxOfLanes(df, vmax));
      // The rounding of quantize_int8_block (codec/scalar_blocks.h, llama.cpp's q8_0): the f32
      // reciprocal of d = amax/127, then roundf (half away from zero; NearestInt would round
      // half to even). t + sign where |frac| >= 0.5 is exact, unlike trunc(v + copysign(0.5, v)).
      const float db = amax / 127.0f;
      const float id = db != 0.0f ? 1.0f / db : 0.0f;
      const auto vid = hn::Set(df, id), half = hn::Set(df, 0.5f), one = hn::Set(df, 1.0f);
      auto vsum = hn::Zero(di);
      for (int i = 0; i < 32; i += 4) {
        const auto v = hn::Mul(hn::LoadU(df, xb + i), vid);
        const auto t = hn::Trunc(v);
        const auto away = hn::Ge(hn::Abs(hn::Sub(v, t)), half);
        const auto qi = hn::ConvertTo(di, hn::Add(t, hn::IfThenElseZero(away, hn::CopySign(one, v))));
        vsum = hn::Add(vsum, qi);
        hn::StoreU(hn::DemoteTo(d8, qi), d8, qb + i);
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
// x86 (AVX2 and up): a 32-element block is one 256-bit vector of 8-bit lanes. Unsigned weight
// codes (0..63) meet the signed activations (|q| <= 127) in vpmaddubsw (u8 x s8 -> pairwise
// int16 sums, at most 2*63*127 < 2^15, no saturation), then vpmaddwd against ones (or against
// the Q6_K sub-block scales) gives int32 sums. Signed weights (Q8_0, Q6_K) use |w| and
// sign(x, w): |w| <= 128, 2*128*127 < 2^15.
using DF = hn::FixedTag<float, 8>;
using VF = hn::Vec<DF>;

struct Decoded {
  __m256i w;   // 32 weight codes, u8 (or s8 for the signed types)
  float a, b;  // weight = a * code + b
  __m256i sc;  // Q6_K, Q3_K, Q2_K: int16 scales of the two 16-element halves, broadcast 8 lanes each
  __m256i w2;  // Q2_K only: int16 mins of the two halves (weight = a * sc * code + a2 * min)
  float a2;
};

HWY_INLINE Decoded Mk(__m256i w, float a, float b) {
  Decoded o;
  o.w = w, o.a = a, o.b = b, o.sc = _mm256_setzero_si256(), o.w2 = o.sc, o.a2 = 0.0f;
  return o;
}
HWY_INLINE __m256i Ones16() { return _mm256_set1_epi16(1); }
#if HWY_TARGET == HWY_AVX3_DL
// acc + the sums over groups of 4 of u8 u times s8 s, in int32 lanes: AVX-512 VNNI's vpdpbusd on
// 256-bit registers. Written as assembly with the EVEX encoding forced: Highway 1.0's AVX3_DL
// target enables "avxvnni", with which the compiler may emit the VEX form (AVX-VNNI), an
// instruction that Ice Lake and Zen 4 (AVX-512 VNNI, no AVX-VNNI) do not have.
HWY_INLINE __m256i Dpbusd(__m256i acc, __m256i u, __m256i s) {
  asm("%{evex%} vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}
#endif
// sum over groups of 4 of u8 w times s8 x, as int32 lanes (no saturation in our ranges: every
// caller keeps 2 * max|w| * 127 < 2^15). One vpdpbusd with VNNI, maddubs + madd without.
HWY_INLINE __m256i DotU8S8(__m256i w, __m256i x) {
#if HWY_TARGET == HWY_AVX3_DL
  return Dpbusd(_mm256_setzero_si256(), w, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), Ones16());
#endif
}
// As DotU8S8 with the int32 lane sums of each 16-byte half multiplied by the int16 scale of that
// half (sc: 8 equal int16 lanes per 128-bit half): maddubs then vpmaddwd against the scales,
// on every target (with VNNI, vpdpbusd plus a 32-bit multiply would cost more).
HWY_INLINE __m256i DotU8S8Scaled(__m256i w, __m256i x, __m256i sc) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), sc);
}
HWY_INLINE __m256i Nibbles(const uint8_t* qs) {  // 16 bytes -> low nibbles | high nibbles
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
}
// Fifth bits of Q5_0/Q5_1: byte i = 16 when bit i of qh is set.
HWY_INLINE __m256i FifthBits(uint32_t qh) {
  // Spread qh so byte i holds the byte of qh that contains bit i, then test bit (i % 8).
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(int(qh)),
                                            _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                              0x0101010101010101, 0x0000000000000000));
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}
// Two scalars from two adjacent fp16 values (d and m) with the F16C instruction.
HWY_INLINE void H2F2(const uint8_t* p, float* lo, float* hi) {
  const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128(int(ld32(p))));
  *lo = _mm_cvtss_f32(f);
  *hi = _mm_cvtss_f32(_mm_shuffle_ps(f, f, 1));
}
HWY_INLINE float H2F(const uint8_t* p) { return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(ld16(p)))); }

// The two fp16 values at p + k * stride and p + k * stride + 2 (k = 0..7) as two float vectors,
// with one gather (every 4-byte read lies inside its block: the fp16 fields start the block).
HWY_INLINE void HalfPairs8(const uint8_t* p, int stride, __m256* lo, __m256* hi) {
  const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(stride));
  const __m256i v = _mm256_i32gather_epi32(reinterpret_cast<const int*>(p), idx, 1);
  const __m256i l = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
  const __m256i h = _mm256_srli_epi32(v, 16);
  // packus: [l0-3 h0-3 | l4-7 h4-7] as u16; permute the 64-bit quarters to [l0-7 | h0-7].
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(l, h), 0xD8);
  *lo = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
  *hi = _mm256_cvtph_ps(_mm256_extracti128_si256(packed, 1));
}

// Eight int32x8 block sums -> one int32x8 whose lane k is the total of s[k].
HWY_INLINE __m256i Reduce8(const __m256i* s) {
  const __m256i t01 = _mm256_hadd_epi32(s[0], s[1]), t23 = _mm256_hadd_epi32(s[2], s[3]);
  const __m256i t45 = _mm256_hadd_epi32(s[4], s[5]), t67 = _mm256_hadd_epi32(s[6], s[7]);
  const __m256i a = _mm256_hadd_epi32(t01, t23), b = _mm256_hadd_epi32(t45, t67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

struct DecQ8_0 {
  static constexpr bool kOffset = false;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 34;
    return Mk(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2)), H2F(p), 0.0f);
  }
  // a and b of blocks b0..b0+7.
  HWY_INLINE void Scales8(int64_t b0, __m256* a, __m256* b) const {
    __m256 unused;
    HalfPairs8(row + b0 * 34, 34, a, &unused);
    *b = _mm256_setzero_ps();
  }
  static HWY_INLINE __m256i Dot(const Decoded& w, __m256i x) {
    return DotU8S8(_mm256_abs_epi8(w.w), _mm256_sign_epi8(x, w.w));
  }
};
struct DecU8 {  // shared Dot for the unsigned codes
  static HWY_INLINE __m256i Dot(const Decoded& w, __m256i x) { return DotU8S8(w.w, x); }
};
struct DecQ4_0 : DecU8 {
  static constexpr bool kOffset = true;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 18;
    const float d = H2F(p);
    return Mk(Nibbles(p + 2), d, -8.0f * d);
  }
  HWY_INLINE void Scales8(int64_t b0, __m256* a, __m256* b) const {
    __m256 unused;
    HalfPairs8(row + b0 * 18, 18, a, &unused);
    *b = _mm256_mul_ps(*a, _mm256_set1_ps(-8.0f));
  }
};
struct DecQ4_1 : DecU8 {
  static constexpr bool kOffset = true;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 20;
    float d, m;
    H2F2(p, &d, &m);
    return Mk(Nibbles(p + 4), d, m);
  }
  HWY_INLINE void Scales8(int64_t b0, __m256* a, __m256* b) const { HalfPairs8(row + b0 * 20, 20, a, b); }
};
struct DecQ5_0 : DecU8 {
  static constexpr bool kOffset = true;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 22;
    const float d = H2F(p);
    return Mk(_mm256_or_si256(Nibbles(p + 6), FifthBits(ld32(p + 2))), d, -16.0f * d);
  }
  HWY_INLINE void Scales8(int64_t b0, __m256* a, __m256* b) const {
    __m256 unused;
    HalfPairs8(row + b0 * 22, 22, a, &unused);
    *b = _mm256_mul_ps(*a, _mm256_set1_ps(-16.0f));
  }
};
struct DecQ5_1 : DecU8 {
  static constexpr bool kOffset = true;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + b * 24;
    float d, m;
    H2F2(p, &d, &m);
    return Mk(_mm256_or_si256(Nibbles(p + 8), FifthBits(ld32(p + 4))), d, m);
  }
  HWY_INLINE void Scales8(int64_t b0, __m256* a, __m256* b) const { HalfPairs8(row + b0 * 24, 24, a, b); }
};
// Q4_K / Q5_K: activation block b is sub-block j = b % 8 of super-block b / 8.
template <bool kFive>
struct DecQK : DecU8 {
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
      float d, dmin;
      H2F2(p, &d, &dmin);
      for (int k = 0; k < 8; ++k) {
        int sc, m;
        blocks::k_scale_min(p + 4, k, &sc, &m);
        a[k] = d * float(sc);
        off[k] = -(dmin * float(m));
      }
    }
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + (kFive ? 48 : 16) + 32 * (j >> 1)));
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256i w = (j & 1) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m15) : _mm256_and_si256(v, m15);
    if constexpr (kFive) {
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16));
      const __m256i bit = _mm256_set1_epi8(char(1u << j));
      const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit);
      w = _mm256_or_si256(w, _mm256_and_si256(set, _mm256_set1_epi8(16)));
    }
    return Mk(w, a[j], off[j]);
  }
  // Blocks b0..b0+7 are the 8 sub-blocks of one super-block (b0 % 8 == 0), decoded by Block().
  HWY_INLINE void Scales8(int64_t, __m256* av, __m256* bv) const {
    *av = _mm256_loadu_ps(a);
    *bv = _mm256_loadu_ps(off);
  }
};
// Q6_K: activation block b is quarter k = b % 4 of half n = (b / 4) % 2 of super-block b / 8.
// Codes are made signed (q - 32); vpmaddwd multiplies the int16 pair sums by the two
// 16-element scales (|pair| <= 2*32*127, times |scale| <= 128: fits int32).
struct DecQ6_K {
  static constexpr bool kOffset = false;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + (b >> 3) * 210;
    const int n = int((b >> 2) & 1), k = int(b & 3);
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 64 * n + 32 * (k & 1)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + 32 * n));
    const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    const __m256i lo = (k >> 1) ? _mm256_and_si256(_mm256_srli_epi16(ql, 4), m15) : _mm256_and_si256(ql, m15);
    const __m256i hi = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * k)), m3);
    const __m256i q = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));  // 0..63 (no bits cross bytes)
    const int8_t* sc = reinterpret_cast<const int8_t*>(p + 192) + 8 * n + 2 * k;
    Decoded o;
    o.w = _mm256_sub_epi8(q, _mm256_set1_epi8(32));
    o.a = H2F(p + 208);
    o.b = 0.0f;
    o.sc = _mm256_set_m128i(_mm_set1_epi16(sc[1]), _mm_set1_epi16(sc[0]));
    o.w2 = _mm256_setzero_si256();
    o.a2 = 0.0f;
    return o;
  }
  // Blocks b0..b0+7 form one super-block (b0 % 8 == 0): one d for all, no offset.
  HWY_INLINE void Scales8(int64_t b0, __m256* a, __m256* b) const {
    *a = _mm256_set1_ps(H2F(row + (b0 >> 3) * 210 + 208));
    *b = _mm256_setzero_ps();
  }
  static HWY_INLINE __m256i Dot(const Decoded& w, __m256i x) {
    return DotU8S8Scaled(_mm256_abs_epi8(w.w), _mm256_sign_epi8(x, w.w), w.sc);
  }
};
// Q3_K: as Q6_K with codes -4..3 (low 2 bits in qs, the third in hmask) and 6-bit scales
// (s - 32), decoded once per super-block.
struct DecQ3_K {
  static constexpr bool kOffset = false;
  const uint8_t* row;
  mutable int64_t cur = -1;
  mutable int16_t sc[16];
  HWY_INLINE void Begin(const uint8_t* r) {
    row = r;
    cur = -1;
  }
  HWY_INLINE Decoded Block(int64_t b) const {
    const int64_t sb = b >> 3;
    const uint8_t* p = row + sb * 110;
    if (sb != cur) {
      cur = sb;
      for (int i = 0; i < 16; ++i) sc[i] = int16_t(blocks::q3k_scale(p + 96, i));
    }
    const int n = int((b >> 2) & 1), k = int(b & 3);
    const __m256i qs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 + 32 * n));
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    const __m256i lo = _mm256_and_si256(_mm256_srl_epi16(qs, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
    const __m256i bit = _mm256_set1_epi8(static_cast<char>(1u << (4 * n + k)));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
    Decoded o;
    o.w = _mm256_sub_epi8(lo, _mm256_andnot_si256(set, _mm256_set1_epi8(4)));  // -4..3
    o.a = H2F(p + 108);
    o.b = 0.0f;
    o.sc = _mm256_set_m128i(_mm_set1_epi16(sc[8 * n + 2 * k + 1]), _mm_set1_epi16(sc[8 * n + 2 * k]));
    o.w2 = _mm256_setzero_si256();
    o.a2 = 0.0f;
    return o;
  }
  HWY_INLINE void Scales8(int64_t b0, __m256* a, __m256* b) const {
    *a = _mm256_set1_ps(H2F(row + (b0 >> 3) * 110 + 108));
    *b = _mm256_setzero_ps();
  }
  static HWY_INLINE __m256i Dot(const Decoded& w, __m256i x) {
    return DotU8S8Scaled(_mm256_abs_epi8(w.w), _mm256_sign_epi8(x, w.w), w.sc);
  }
};
// Q2_K: codes 0..3 times the 4-bit scale of their 16-element half (Dot, times d) and the 4-bit
// mins of the halves against the activation sums (Dot2, times -dmin). Scales8 returns d and
// -dmin of the super-block.
struct DecQ2_K {
  static constexpr bool kOffset = false;
  static constexpr bool kTwo = true;
  const uint8_t* row;
  HWY_INLINE void Begin(const uint8_t* r) { row = r; }
  HWY_INLINE Decoded Block(int64_t b) const {
    const uint8_t* p = row + (b >> 3) * 84;
    const int n = int((b >> 2) & 1), k = int(b & 3);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 + 32 * n));
    const int s0 = p[8 * n + 2 * k], s1 = p[8 * n + 2 * k + 1];
    Decoded o;
    o.w = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
    o.sc = _mm256_set_m128i(_mm_set1_epi16(int16_t(s1 & 15)), _mm_set1_epi16(int16_t(s0 & 15)));
    o.w2 = _mm256_set_m128i(_mm_set1_epi16(int16_t(s1 >> 4)), _mm_set1_epi16(int16_t(s0 >> 4)));
    float d, dmin;
    H2F2(p + 80, &d, &dmin);
    o.a = d, o.b = 0.0f, o.a2 = -dmin;
    return o;
  }
  HWY_INLINE void Scales8(int64_t b0, __m256* a, __m256* b) const {
    float d, dmin;
    H2F2(row + (b0 >> 3) * 84 + 80, &d, &dmin);
    *a = _mm256_set1_ps(d);
    *b = _mm256_set1_ps(-dmin);
  }
  static HWY_INLINE __m256i Dot(const Decoded& w, __m256i x) { return DotU8S8Scaled(w.w, x, w.sc); }
  static HWY_INLINE __m256i Dot2(const Decoded& w, __m256i x) {
    return DotU8S8Scaled(_mm256_set1_epi8(1), x, w.w2);
  }
};
template <class Dec>
constexpr bool HasTwo() {
  if constexpr (requires { Dec::kTwo; }) {
    return Dec::kTwo;
  } else {
    return false;
  }
}

// Groups of 8 blocks: the 8 int32 block sums are reduced into one vector (lane k = block k) and
// scaled with the 8 block scales at once, instead of a convert, a scale product, a broadcast and
// an FMA per block. Each group of weight blocks is decoded once for MT activation rows. Rows go
// one after the other (two rows interleaved measured 8% faster from cache but 2.5x slower from
// memory on rows of 960 bytes).
template <class Dec, int MT>
HWY_INLINE void RowsG8(const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X, int64_t m0,
                       float* y, int64_t ldy) {
  const int64_t nb = X.cols / 32, ng = nb / 8;
  const int8_t* xq[MT];
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
    __m256 acc[MT], accb[MT];
    for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_ps(), accb[t] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t b0 = 8 * g;
      Decoded wd[8];
      for (int k = 0; k < 8; ++k) wd[k] = dec.Block(b0 + k);
      __m256 a, b;
      dec.Scales8(b0, &a, &b);
      for (int t = 0; t < MT; ++t) {
        __m256i sums[8];
        for (int k = 0; k < 8; ++k)
          sums[k] = Dec::Dot(wd[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + (b0 + k) * 32)));
        const __m256 total = _mm256_cvtepi32_ps(Reduce8(sums));
        const __m256 dx = _mm256_loadu_ps(xd[t] + b0);
        acc[t] = _mm256_fmadd_ps(total, _mm256_mul_ps(a, dx), acc[t]);
        if constexpr (Dec::kOffset) accb[t] = _mm256_fmadd_ps(b, _mm256_loadu_ps(xs[t] + b0), accb[t]);
        if constexpr (HasTwo<Dec>()) {  // b is the scale of the second code vector
          for (int k = 0; k < 8; ++k)
            sums[k] = Dec::Dot2(wd[k], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + (b0 + k) * 32)));
          accb[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Reduce8(sums)), _mm256_mul_ps(b, dx), accb[t]);
        }
      }
    }
    float tail[MT] = {};
    for (int64_t b = 8 * ng; b < nb; ++b) {
      const Decoded w = dec.Block(b);
      for (int t = 0; t < MT; ++t) {
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t] + b * 32));
        const VF si{_mm256_cvtepi32_ps(Dec::Dot(w, x))};
        tail[t] += hn::GetLane(hn::SumOfLanes(DF(), si)) * (w.a * xd[t][b]);
        if constexpr (Dec::kOffset) tail[t] += w.b * xs[t][b];
        if constexpr (HasTwo<Dec>()) {
          const VF s2{_mm256_cvtepi32_ps(Dec::Dot2(w, x))};
          tail[t] += hn::GetLane(hn::SumOfLanes(DF(), s2)) * (w.a2 * xd[t][b]);
        }
      }
    }
    for (int t = 0; t < MT; ++t)
      y[(m0 + t) * ldy + r] = hn::GetLane(hn::SumOfLanes(DF(), VF{_mm256_add_ps(acc[t], accb[t])})) + tail[t];
  }
}

template <class Dec>
void RowsQ(const uint8_t* W, size_t rb, int64_t r0, int64_t r1, const QuantizedRows& X, float* y, int64_t ldy) {
  if (X.M == 1) return RowsG8<Dec, 1>(W, rb, r0, r1, X, 0, y, ldy);
  // Row tiles keep a few weight rows in L1 while the activation rows stream past them.
  constexpr int64_t kTile = 16;
  for (int64_t rt = r0; rt < r1; rt += kTile) {
    const int64_t re = rt + kTile < r1 ? rt + kTile : r1;
    int64_t m = 0;
    for (; m + 4 <= X.M; m += 4) RowsG8<Dec, 4>(W, rb, rt, re, X, m, y, ldy);
    switch (X.M - m) {
      case 3: RowsG8<Dec, 3>(W, rb, rt, re, X, m, y, ldy); break;
      case 2: RowsG8<Dec, 2>(W, rb, rt, re, X, m, y, ldy); break;
      case 1: RowsG8<Dec, 1>(W, rb, rt, re, X, m, y, ldy); break;
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
    case GGMLType::Q3_K: return RowsQ<DecQ3_K>(W, rb, r0, r1, X, y, ldy);
    case GGMLType::Q2_K: return RowsQ<DecQ2_K>(W, rb, r0, r1, X, y, ldy);
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

void quantize_rows_kernel(const float* x, int64_t M, int64_t cols, int8_t* q, float* d, float* s) {
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
