#pragma once
// Internal to src/ops/cuda: the PTX wrappers the tensor-core attention kernels share (the dense
// split kernel of paged_attention.cu, the prefill kernel of paged_prefill.cu, the coded split
// kernels of pq_attention.cu and pq_attention_lut.cu). One definition each, so that a fix or a
// precision change reaches every kernel. sm_80+ instructions (the build targets sm_90).
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace vq::cuda::ptx {

// A generic pointer into shared memory as the 32-bit shared-window address PTX takes.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, asynchronously (L2 only, .cg); valid == false reads nothing and fills
// the 16 bytes with zeros (src-size 0), so a masked slot never carries stale or NaN data.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
// Closes the group of cp.async issued since the previous commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N committed groups of this thread are still in flight (N = 0: all landed).
// Each thread sees only its own copies: a barrier must follow before other threads read them.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Four 8x8 fp16 matrices from shared memory into mma fragments; lane l gives the row address of
// matrix l/8, row l%8. The .trans form transposes each matrix (column-major sources).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}

// c += A (16x16, row-major fragments a0..a3) * B (16x8, column-major fragments b0, b1); fp16
// inputs, fp32 accumulators in place.
__device__ __forceinline__ void mma16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  mma16816(c, a[0], a[1], a[2], a[3], b0, b1);
}

// (a, b) rounded to fp16 as one half2 register (a in the low half).
__device__ __forceinline__ uint32_t pack_half2(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
// (a, b) as fp16 pairs hi + lo with hi + lo = (a, b) to ~22 bits: two products carry fp32-like
// precision through fp16 tensor cores.
__device__ __forceinline__ void split_half2(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __half2 h = __floats2half2_rn(a, b);
  const float2 f = __half22float2(h);
  const __half2 l = __floats2half2_rn(a - f.x, b - f.y);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}

// 2^x on the special-function unit with results below 2^-126 flushed to zero (ex2.approx.ftz):
// exp2f adds a range test and two predicated multiplies per call to produce such denormals, which
// softmax weights never need (they round to 0 in the fp16 P and vanish beside the sums).
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// How far a score may pass the running reference max before the reference moves (base 2): P stays
// <= 2^8, exact enough in fp16 (relative rounding unchanged) and in the fp32 sums, and the rescale
// of the accumulated output is skipped in almost every pass. The partial (m, l, o) stays exact since
// m is whatever reference was used.
constexpr float kSoftmaxSlack = 8.f;

// One step of the online softmax (base 2) over S's NS column chunks of 8 (m16n8 accumulator
// layout: this thread's rows g and g + 8, element 2h + c of a chunk is row h's column 2t + c; the
// four threads of a row meet by shuffles): S becomes P = exp2(S - reference), the running reference
// and sum advance and alpha[h] is the factor row h's accumulated output must take (1 unless the
// reference moved: callers skip the rescale when no row of the warp moved, `any_rescale`). A row
// with nothing visible yet (reference -inf) keeps P = 0 and alpha = 1.
template <int NS>
__device__ __forceinline__ void online_softmax_step(float (&s)[NS][4], float (&m_run)[2], float (&l_run)[2],
                                                    float (&alpha)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < NS; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const bool move = mx > m_run[h] + kSoftmaxSlack;  // any finite mx when the reference is -inf
    const float m_new = move ? mx : m_run[h];
    const float mref = m_new == -INFINITY ? 0.f : m_new;
    alpha[h] = move ? exp2_ftz(m_run[h] - mref) : 1.f;
    float sum = 0.f;
#pragma unroll
    for (int n = 0; n < NS; ++n) {
      s[n][2 * h] = exp2_ftz(s[n][2 * h] - mref);
      s[n][2 * h + 1] = exp2_ftz(s[n][2 * h + 1] - mref);
      sum += s[n][2 * h] + s[n][2 * h + 1];
    }
    l_run[h] = l_run[h] * alpha[h] + sum;
    m_run[h] = m_new;
  }
}
// Whether some row of this warp must rescale its output (warp-uniform, so the rescale is skipped
// without divergence).
__device__ __forceinline__ bool any_rescale(const float (&alpha)[2]) {
  return __any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f);
}

}  // namespace vq::cuda::ptx
