#pragma once
// VecInfer key transform (API.md): per-channel smoothing then an orthonormal Walsh-Hadamard
// rotation.  lambda[h][c] = max(sqrt(max_t |K[t][h][c]|), kMinLambda);
// k~ = H (k / lambda), q~ = H (q * lambda), so q~ . k~ = q . k (H is orthonormal and symmetric).
//
// head_dim that is not a power of two: H is block-diagonal ("block-Hadamard"), one orthonormal
// Walsh-Hadamard block per run of B channels, B = the largest power of two dividing head_dim
// (96 -> 3 blocks of 32, 80 -> 5 of 16). Still orthonormal and self-inverse, so q~ . k~ = q . k;
// outliers only spread within a block. B < 8 (e.g. head_dim 36 or odd) is rejected with an
// error, as the rotation would barely mix channels.
#include <cstdint>
#include <vector>

namespace vq {

inline constexpr float kMinLambda = 1e-3f;

// Walsh-Hadamard block size used for head_dim (see above); throws vq::Error if unsupported.
int hadamard_block(int head_dim);

// In place, v: [n] f32. Orthonormal (scaled by 1/sqrt(B)) block Walsh-Hadamard, B = hadamard_block(n).
void fwht_inplace(float* v, int n);

// Running per-channel absolute maximum for smoothing factors.
// k: [n_tokens, n_heads, head_dim] f32 row-major; absmax: [n_heads, head_dim] f32, updated.
// Throws naming token/head/channel if k holds NaN or Inf.
void update_abs_max(const float* k, int64_t n_tokens, int n_heads, int head_dim, float* absmax);
// lambda: [n_heads*head_dim] = max(sqrt(absmax), kMinLambda).
std::vector<float> smoothing_from_abs_max(const std::vector<float>& absmax);
// Query-aware smoothing (issue 18, docs/QUALITY.md): lambda[h][c] = (V[h][c] / Q[h][c])^(1/4), where
// V is the variance of key channel c of KV head h over the calibration tokens and Q the mean square of
// query channel c over those tokens and the query heads of KV head h. With codes whose error is
// spread evenly over channels by the rotation, this minimises the expected squared score error
// E[(q . dk)^2] (by Cauchy-Schwarz), where max-based smoothing ignores the queries: on Qwen2.5, whose
// key biases make some channels large where queries are small, it cuts the attention-output error
// of layer 0 170-fold. Normalised to geometric mean 1 per head, clamped to [kMinLambda, 65504] (what a calibration file holds);
// key_var and query_energy: [n_heads * head_dim]; a channel with no key variance gets the head's
// smallest lambda of the others.
std::vector<float> smoothing_from_energy(const std::vector<double>& key_var, const std::vector<double>& query_energy,
                                         int n_heads, int head_dim);
// Convenience: both steps over one batch of keys. Returns lambda: [n_heads, head_dim].
std::vector<float> smoothing_factors(const float* k, int64_t n_tokens, int n_heads, int head_dim);

// In place. k: [n_tokens, n_heads, head_dim] f32; lambda: [n_heads, head_dim]. k <- H(k / lambda).
void transform_keys(float* k, int64_t n_tokens, int n_heads, int head_dim, const float* lambda);
// In place. q: [n_tokens, n_q_heads, head_dim] f32; lambda: [n_kv_heads, head_dim]; query head h
// uses KV head h / (n_q_heads / n_kv_heads) (grouped-query attention). q <- H(q * lambda).
void transform_queries(float* q, int64_t n_tokens, int n_q_heads, int n_kv_heads, int head_dim,
                       const float* lambda);

}  // namespace vq
