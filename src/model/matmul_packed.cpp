// Products on row-interleaved (packed) weights; the layout is documented in matmul_packed.h.
// Per group of 8 weight rows and 32-element sub-block: the 4-bit codes of the 8 rows are 4
// vectors of 32 bytes, each 32-bit lane one row's 4 (low nibbles) or 4 more (high nibbles)
// consecutive codes; the matching 4 activation bytes are broadcast to all lanes, so u8 x s8
// dot products (vpmaddubsw + vpmaddwd, or one AVX-512 VNNI vpdpbusd) leave row r's partial sum
// in lane r. The sub-block scale d * sc (and min dmin * m) of the 8 rows is one float vector,
// the activation block's d_x (and s_x) a broadcast: 8 outputs per FMA, no horizontal sums.
// Up to 4 activation rows share each decoded weight vector.
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1  // the VNNI target, as in model/matmul_kernels.cpp
#endif
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "model/matmul_packed.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "model/matmul_packed.h"
#include "model/quant_blocks.h"

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

HWY_INLINE __m256 U8x8ToFloat(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

// Rows [row0, row0 + 8) (those below `rows`) of y for activation rows m0..m0+MT-1, from the
// chunks of one group G (nsb super-blocks).
template <int MT>
HWY_INLINE void GroupQ4K(const uint8_t* G, int64_t nsb, const QuantizedRows& X, int64_t m0, int64_t row0,
                         int64_t rows, float* y, int64_t ldy) {
  const int64_t nb = X.cols / 32;
  __m256 acc[MT], accm[MT];
  for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_ps(), accm[t] = _mm256_setzero_ps();
  const __m256i m15 = _mm256_set1_epi8(15);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* C = G + s * int64_t(kQ4KChunk);
    const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(C + 1152)));
    const __m256 dm8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(C + 1168)));
    for (int j = 0; j < 8; ++j) {
      const __m256 a8 = _mm256_mul_ps(d8, U8x8ToFloat(C + 1024 + 8 * j));
      const __m256 b8 = _mm256_mul_ps(dm8, U8x8ToFloat(C + 1088 + 8 * j));
      __m256i lo[4], hi[4];
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(C + 128 * j + 32 * c));
        lo[c] = _mm256_and_si256(v, m15);
        hi[c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
      }
      for (int t = 0; t < MT; ++t) {
        const int8_t* xb = X.q + (m0 + t) * X.cols + s * 256 + 32 * j;
        __m256i sum = _mm256_setzero_si256();
        for (int c = 0; c < 4; ++c) {
          sum = AccDot(sum, lo[c], Bcast4(xb + 8 * c));
          sum = AccDot(sum, hi[c], Bcast4(xb + 8 * c + 4));
        }
        const int64_t bi = (m0 + t) * nb + 8 * s + j;
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(a8, _mm256_set1_ps(X.d[bi])), acc[t]);
        accm[t] = _mm256_fnmadd_ps(b8, _mm256_set1_ps(X.s[bi]), accm[t]);
      }
    }
  }
  const int64_t nr = std::min<int64_t>(8, rows - row0);
  for (int t = 0; t < MT; ++t) {
    alignas(32) float out[8];
    _mm256_store_ps(out, _mm256_add_ps(acc[t], accm[t]));
    for (int64_t r = 0; r < nr; ++r) y[(m0 + t) * ldy + row0 + r] = out[r];
  }
}

// Q6_K: signed codes w = u - 32 (|w| <= 32) meet the activations as |w| and sign(x, w); the
// two 16-element halves of each 32-element block keep separate sums (their scales differ).
template <int MT>
HWY_INLINE void GroupQ6K(const uint8_t* G, int64_t nsb, const QuantizedRows& X, int64_t m0, int64_t row0,
                         int64_t rows, float* y, int64_t ldy) {
  const int64_t nb = X.cols / 32;
  __m256 acc[MT];
  for (int t = 0; t < MT; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3), k32 = _mm256_set1_epi8(32);
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* C = G + s * int64_t(kQ6KChunk);
    const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(C + 1664)));
    for (int j = 0; j < 8; ++j) {
      const __m256 a0 = _mm256_mul_ps(
          d8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(C + 1536 + 16 * j)))));
      const __m256 a1 = _mm256_mul_ps(
          d8, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(C + 1544 + 16 * j)))));
      __m256i w[8];  // w[2c]: elements 8c + 0..3 of each row, w[2c + 1]: 8c + 4..7; signed
      for (int c = 0; c < 4; ++c) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(C + 128 * j + 32 * c));
        const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(C + 1024 + 64 * j + 32 * (c >> 1)));
        const int sh = 4 * (c & 1);
        const __m256i hlo = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(sh)), m3);
        const __m256i hhi = _mm256_and_si256(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(sh + 2)), m3);
        w[2 * c] = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(v, m15), _mm256_slli_epi16(hlo, 4)), k32);
        w[2 * c + 1] = _mm256_sub_epi8(
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m15), _mm256_slli_epi16(hhi, 4)), k32);
      }
      __m256i aw[8];
      for (int k = 0; k < 8; ++k) aw[k] = _mm256_abs_epi8(w[k]);
      for (int t = 0; t < MT; ++t) {
        const int8_t* xb = X.q + (m0 + t) * X.cols + s * 256 + 32 * j;
        __m256i sum0 = _mm256_setzero_si256(), sum1 = _mm256_setzero_si256();
        for (int c = 0; c < 2; ++c) {
          sum0 = AccDot(sum0, aw[2 * c], _mm256_sign_epi8(Bcast4(xb + 8 * c), w[2 * c]));
          sum0 = AccDot(sum0, aw[2 * c + 1], _mm256_sign_epi8(Bcast4(xb + 8 * c + 4), w[2 * c + 1]));
          sum1 = AccDot(sum1, aw[2 * c + 4], _mm256_sign_epi8(Bcast4(xb + 8 * c + 16), w[2 * c + 4]));
          sum1 = AccDot(sum1, aw[2 * c + 5], _mm256_sign_epi8(Bcast4(xb + 8 * c + 20), w[2 * c + 5]));
        }
        const __m256 dx = _mm256_set1_ps(X.d[(m0 + t) * nb + 8 * s + j]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum0), _mm256_mul_ps(a0, dx), acc[t]);
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum1), _mm256_mul_ps(a1, dx), acc[t]);
      }
    }
  }
  const int64_t nr = std::min<int64_t>(8, rows - row0);
  for (int t = 0; t < MT; ++t) {
    alignas(32) float out[8];
    _mm256_store_ps(out, acc[t]);
    for (int64_t r = 0; r < nr; ++r) y[(m0 + t) * ldy + row0 + r] = out[r];
  }
}

#define VQ_PACKED_GROUPS(KERNEL, CHUNK)                                                  \
  for (int64_t g = g0; g < g1; ++g) {                                                    \
    const uint8_t* G = P.data.data() + size_t(g * nsb) * (CHUNK);                        \
    int64_t m = 0;                                                                       \
    for (; m + 4 <= X.M; m += 4) KERNEL<4>(G, nsb, X, m, 8 * g, P.rows, y, ldy);         \
    switch (X.M - m) {                                                                   \
      case 3: KERNEL<3>(G, nsb, X, m, 8 * g, P.rows, y, ldy); break;                     \
      case 2: KERNEL<2>(G, nsb, X, m, 8 * g, P.rows, y, ldy); break;                     \
      case 1: KERNEL<1>(G, nsb, X, m, 8 * g, P.rows, y, ldy); break;                     \
      default: break;                                                                    \
    }                                                                                    \
  }

void PackedGroupsImpl(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y, int64_t ldy) {
  const int64_t nsb = P.cols / 256;
  if (P.type == GGMLType::Q6_K) {
    VQ_PACKED_GROUPS(GroupQ6K, kQ6KChunk)
  } else {
    VQ_PACKED_GROUPS(GroupQ4K, kQ4KChunk)
  }
}
#undef VQ_PACKED_GROUPS

#else  // other targets (NEON, SVE, SSE4, scalar, ...): the portable kernel

void PackedGroupsImpl(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y, int64_t ldy) {
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
  HWY_DYNAMIC_DISPATCH(PackedGroupsImpl)(P, g0, g1, X, y, ldy);
}

namespace {
inline uint16_t ld16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
// Code of element e (0..255) of a GGUF Q4_K super-block (quant_blocks.h).
inline int q4k_code(const uint8_t* blk, int e) {
  const uint8_t byte = blk[16 + 32 * (e / 64) + e % 32];
  return (e % 64) < 32 ? byte & 15 : byte >> 4;
}
// 6-bit code u (0..63) of element e (0..255) of a GGUF Q6_K super-block (quant_blocks.h).
inline int q6k_code(const uint8_t* blk, int e) {
  const int n = e / 128, k = (e % 128) / 32, l = e % 32;
  const int lo = (blk[64 * n + l + 32 * (k & 1)] >> (4 * (k >> 1))) & 15;
  const int hi = (blk[128 + 32 * n + l] >> (2 * k)) & 3;
  return lo | hi << 4;
}

void pack_q6k_chunk(const uint8_t* blk, int r, uint8_t* C) {
  std::memcpy(C + 1664 + 2 * r, blk + 208, 2);  // d
  for (int k = 0; k < 16; ++k) C[1536 + 8 * k + r] = blk[192 + k];
  for (int j = 0; j < 8; ++j) {
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 4; ++i)
        C[128 * j + 32 * c + 4 * r + i] =
            uint8_t((q6k_code(blk, 32 * j + 8 * c + i) & 15) | (q6k_code(blk, 32 * j + 8 * c + 4 + i) & 15) << 4);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 4; ++i) {
        int v = 0;
        for (int p = 0; p < 4; ++p) v |= (q6k_code(blk, 32 * j + 16 * h + 4 * p + i) >> 4) << (2 * p);
        C[1024 + 64 * j + 32 * h + 4 * r + i] = uint8_t(v);
      }
  }
}

void pack_q4k_chunk(const uint8_t* blk, int r, uint8_t* C) {
  std::memcpy(C + 1152 + 2 * r, blk, 2);      // d
  std::memcpy(C + 1168 + 2 * r, blk + 2, 2);  // dmin
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    blocks::k_scale_min(blk + 4, j, &sc, &m);
    C[1024 + 8 * j + r] = uint8_t(sc);
    C[1088 + 8 * j + r] = uint8_t(m);
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 4; ++i)
        C[128 * j + 32 * c + 4 * r + i] =
            uint8_t(q4k_code(blk, 32 * j + 8 * c + i) | q4k_code(blk, 32 * j + 8 * c + 4 + i) << 4);
  }
}

}  // namespace

// Same sums as the SIMD kernel: int32 sub-block dot products, then (d * sc) * d_x and
// (dmin * m) * s_x in float.
void packed_groups_scalar(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                          int64_t ldy) {
  const int64_t nsb = P.cols / 256, nb = X.cols / 32;
  if (P.type == GGMLType::Q6_K) {
    for (int64_t g = g0; g < g1; ++g) {
      const uint8_t* G = P.data.data() + size_t(g * nsb) * kQ6KChunk;
      for (int r = 0; r < 8 && 8 * g + r < P.rows; ++r)
        for (int64_t m = 0; m < X.M; ++m) {
          float acc = 0;
          for (int64_t s = 0; s < nsb; ++s) {
            const uint8_t* C = G + s * int64_t(kQ6KChunk);
            const float d = f16_to_f32(ld16(C + 1664 + 2 * r));
            for (int j = 0; j < 8; ++j) {
              const int8_t* xb = X.q + m * X.cols + s * 256 + 32 * j;
              int32_t sum[2] = {0, 0};
              for (int e = 0; e < 32; ++e) {
                const int c = e / 8, i = e % 4, hi_nib = (e % 8) / 4;
                const int lo = (C[128 * j + 32 * c + 4 * r + i] >> (4 * hi_nib)) & 15;
                const int h = e / 16, p = (e % 16) / 4;
                const int hi = (C[1024 + 64 * j + 32 * h + 4 * r + i] >> (2 * p)) & 3;
                sum[h] += ((lo | hi << 4) - 32) * xb[e];
              }
              const float dx = X.d[m * nb + 8 * s + j];
              for (int h = 0; h < 2; ++h)
                acc += float(sum[h]) * ((d * float(int8_t(C[1536 + 8 * (2 * j + h) + r]))) * dx);
            }
          }
          y[m * ldy + 8 * g + r] = acc;
        }
    }
    return;
  }
  for (int64_t g = g0; g < g1; ++g) {
    const uint8_t* G = P.data.data() + size_t(g * nsb) * kQ4KChunk;
    for (int r = 0; r < 8 && 8 * g + r < P.rows; ++r) {
      for (int64_t m = 0; m < X.M; ++m) {
        float acc = 0, accm = 0;
        for (int64_t s = 0; s < nsb; ++s) {
          const uint8_t* C = G + s * int64_t(kQ4KChunk);
          const float d = f16_to_f32(ld16(C + 1152 + 2 * r)), dmin = f16_to_f32(ld16(C + 1168 + 2 * r));
          for (int j = 0; j < 8; ++j) {
            const int8_t* xb = X.q + m * X.cols + s * 256 + 32 * j;
            int32_t sum = 0;
            for (int c = 0; c < 4; ++c)
              for (int i = 0; i < 4; ++i) {
                const uint8_t byte = C[128 * j + 32 * c + 4 * r + i];
                sum += (byte & 15) * xb[8 * c + i] + (byte >> 4) * xb[8 * c + 4 + i];
              }
            const int64_t bi = m * nb + 8 * s + j;
            acc += float(sum) * ((d * float(C[1024 + 8 * j + r])) * X.d[bi]);
            accm -= (dmin * float(C[1088 + 8 * j + r])) * X.s[bi];
          }
        }
        y[m * ldy + 8 * g + r] = acc + accm;
      }
    }
  }
}

bool packable(GGMLType t, int64_t cols) { return chunk_bytes(t) != 0 && cols > 0 && cols % 256 == 0; }

size_t chunk_bytes(GGMLType t) {
  switch (t) {
    case GGMLType::Q4_K: return kQ4KChunk;
    case GGMLType::Q6_K: return kQ6KChunk;
    default: return 0;
  }
}

PackedWeight pack_weight(GGMLType t, const void* W, int64_t rows, int64_t cols) {
  const size_t chunk = chunk_bytes(t);
  VQ_CHECK(chunk != 0, "pack_weight: weight type {} has no packed layout (q4_K and q6_K have)", ggml_type_name(t));
  VQ_CHECK(rows >= 0 && cols > 0 && cols % 256 == 0,
           "pack_weight: {} weight of shape {} x {}: cols must be a positive multiple of 256", ggml_type_name(t), rows,
           cols);
  PackedWeight P;
  P.type = t, P.rows = rows, P.cols = cols;
  const int64_t ng = (rows + 7) / 8, nsb = cols / 256;
  const size_t rb = ggml_row_bytes(t, cols), bb = ggml_block_bytes(t);
  P.data.resize(size_t(ng * nsb) * chunk);  // zeroed: padding rows multiply to 0
  const uint8_t* src = static_cast<const uint8_t*>(W);
  parallel_for(
      size_t(ng),
      [&](size_t g0, size_t g1, int) {
        for (int64_t g = int64_t(g0); g < int64_t(g1); ++g)
          for (int64_t s = 0; s < nsb; ++s) {
            uint8_t* C = P.data.data() + size_t(g * nsb + s) * chunk;
            for (int r = 0; r < 8 && 8 * g + r < rows; ++r) {
              const uint8_t* blk = src + size_t(8 * g + r) * rb + size_t(s) * bb;
              if (t == GGMLType::Q6_K)
                pack_q6k_chunk(blk, r, C);
              else
                pack_q4k_chunk(blk, r, C);
            }
          }
      },
      16);
  return P;
}

void matmul_packed(const PackedWeight& P, const QuantizedRows& X, float* y) {
  VQ_CHECK(packable(P.type, P.cols), "matmul_packed: not a packed weight ({} {} x {})", ggml_type_name(P.type), P.rows,
           P.cols);
  VQ_CHECK(X.cols == P.cols, "matmul_packed: activations have {} columns, the weight has {}", X.cols, P.cols);
  if (P.rows == 0 || X.M == 0) return;
  const int64_t ng = (P.rows + 7) / 8;
  // Waking a thread costs more than ~64 KB of weight work (see matmul.cpp's kMinBytesPerThread).
  const size_t group_work = size_t(P.cols / 256) * chunk_bytes(P.type) * size_t(X.M);
  const size_t grain = std::max<size_t>(1, (size_t(64) * 1024 + group_work - 1) / group_work);
  parallel_for(
      size_t(ng), [&](size_t g0, size_t g1, int) { packed_groups_kernel(P, int64_t(g0), int64_t(g1), X, y, P.rows); },
      grain);
}

namespace {
const PackedWeight& packed_now(PackedSlot* slot, GGMLType t, const void* W, int64_t rows, int64_t cols) {
  std::call_once(slot->once, [&] { slot->w = pack_weight(t, W, rows, cols); });
  VQ_CHECK(slot->w.type == t && slot->w.rows == rows && slot->w.cols == cols,
           "packed weight: slot holds {} {} x {}, asked for {} {} x {}", ggml_type_name(slot->w.type), slot->w.rows,
           slot->w.cols, ggml_type_name(t), rows, cols);
  return slot->w;
}
}  // namespace

void matmul_maybe_packed(PackedSlot* slot, GGMLType t, const void* W, int64_t rows, int64_t cols, const float* x,
                         int64_t M, float* y) {
  if (!slot) return matmul(t, W, rows, cols, x, M, y);
  const PackedWeight& P = packed_now(slot, t, W, rows, cols);
  if (rows == 0 || M == 0) return;
  thread_local ActivationBuffer buf;  // reused across calls of this thread
  matmul_packed(P, buf.quantize(x, M, cols), y);
}

void matmul_maybe_packed(PackedSlot* slot, GGMLType t, const void* W, int64_t rows, int64_t cols,
                         const QuantizedRows& X, float* y) {
  if (!slot) return matmul_q(t, W, rows, cols, X, y);
  matmul_packed(packed_now(slot, t, W, rows, cols), X, y);
}

}  // namespace vq
#endif  // HWY_ONCE
