// The learned key maps applied (codec/learned_key_map.h): keys at encode, queries at attention.
// Apart from the maps' training and checks (learned_key_map.cpp, Eigen), so that the readers that
// only check a calibration file (the fuzzers) do not link the SIMD kernels.
#include "codec/learned_key_map.h"

#include "core/error.h"
#include "ops/cpu/map_rows.h"

namespace vq {

void apply_key_map(const float* M, float* x, int64_t n, int D, int64_t stride) {
  // Not a BLAS-style product: its summation order follows the sizes, so a query mapped alone (decode)
  // and in a chunk (prefill) differed in the last bits; cpu::map_rows gives every row the same bits.
  cpu::map_rows(M, x, n, D, stride);
}

void transform_keys_mapped(float* k, int64_t n_tokens, int n_heads, int head_dim, const float* lambda,
                           const float* maps) {
  const int64_t row = int64_t(n_heads) * head_dim;
  for (int h = 0; h < n_heads; ++h) {
    const float* l = lambda + int64_t(h) * head_dim;
    float* x = k + int64_t(h) * head_dim;
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int c = 0; c < head_dim; ++c) x[t * row + c] /= l[c];
    apply_key_map(maps + size_t(h) * head_dim * head_dim, x, n_tokens, head_dim, row);
  }
}

void transform_queries_mapped(float* q, int64_t n_tokens, int n_q_heads, int n_kv_heads, int head_dim,
                              const float* lambda, const float* query_maps) {
  VQ_CHECK(n_kv_heads >= 1 && n_q_heads % n_kv_heads == 0,
           "transform_queries: n_q_heads = {} is not a multiple of n_kv_heads = {}", n_q_heads, n_kv_heads);
  const int group = n_q_heads / n_kv_heads;
  const int64_t row = int64_t(n_q_heads) * head_dim;
  for (int h = 0; h < n_q_heads; ++h) {
    const int kv = h / group;
    const float* l = lambda + int64_t(kv) * head_dim;
    float* x = q + int64_t(h) * head_dim;
    for (int64_t t = 0; t < n_tokens; ++t)
      for (int c = 0; c < head_dim; ++c) x[t * row + c] *= l[c];
    apply_key_map(query_maps + size_t(kv) * head_dim * head_dim, x, n_tokens, head_dim, row);
  }
}

}  // namespace vq
