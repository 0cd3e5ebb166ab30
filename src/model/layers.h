#pragma once
// Element-wise pieces of the transformer block (SIMD through Highway, runtime dispatch).
#include <cstdint>

namespace vq {

// y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i], i < n. y may alias x.
void rms_norm(const float* x, const float* w, float* y, int n, float eps);

// out[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up. out may alias gate or up.
void silu_mul(const float* gate, const float* up, float* out, int64_t n);

// out[i] = gelu_tanh(gate[i]) * up[i], the GELU of Gemma's MLP (tanh approximation):
// gelu_tanh(g) = 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3). out may alias gate or up.
void gelu_tanh_mul(const float* gate, const float* up, float* out, int64_t n);

// x[i] *= s
void scale_inplace(float* x, float s, int64_t n);

// x[i] += y[i]
void add_inplace(float* x, const float* y, int64_t n);

// Rotary embedding of n_heads heads of one token, in place.
// x: [n_heads, head_dim]; rotates the first n_rot dims of each head by cos/sin: [n_rot/2].
// neox: pairs (i, i + n_rot/2); otherwise adjacent pairs (2i, 2i+1).
void rope_apply(float* x, int n_heads, int head_dim, int n_rot, const float* cos, const float* sin, bool neox);

}  // namespace vq
