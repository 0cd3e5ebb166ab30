#pragma once
// Online-softmax partial state for one query head, shared by the CPU and CUDA backends.
// A partial over a set of keys holds m = max score, d = sum exp(s - m), o[] = sum exp(s - m) v.
// Two partials over disjoint key sets merge exactly (log-sum-exp), in any order.
#include <cmath>

#if defined(__CUDACC__)
#define VQ_HD __host__ __device__ __forceinline__
#else
#define VQ_HD inline
#endif

namespace vq {

struct SoftmaxState {
  float m;  // running max of scores (-inf when empty)
  float d;  // running denominator
};

VQ_HD SoftmaxState softmax_empty() { return {-INFINITY, 0.0f}; }

// Adds one score s; returns the factor by which the existing output accumulator must be
// rescaled (alpha) and writes the weight (p) of the new value.
VQ_HD void softmax_push(SoftmaxState& st, float s, float& alpha, float& p) {
  const float m_new = fmaxf(st.m, s);
  alpha = (st.m == -INFINITY) ? 0.0f : expf(st.m - m_new);
  p = expf(s - m_new);
  st.d = st.d * alpha + p;
  st.m = m_new;
}

// Merges partial b into a: afterwards (a.m, a.d) describe both; the caller rescales its output
// accumulators by wa (for a's) and wb (for b's) and adds them.
VQ_HD void softmax_merge(SoftmaxState& a, const SoftmaxState& b, float& wa, float& wb) {
  if (b.m == -INFINITY) { wa = 1.0f; wb = 0.0f; return; }
  if (a.m == -INFINITY) { a = b; wa = 0.0f; wb = 1.0f; return; }
  const float m = fmaxf(a.m, b.m);
  wa = expf(a.m - m);
  wb = expf(b.m - m);
  a.d = a.d * wa + b.d * wb;
  a.m = m;
}

}  // namespace vq
