#pragma once
// The learned key transform of VecInfer (issue 18, docs/QUALITY.md "Learned key transform"): a
// dense map M per (layer, KV head) in place of the smoothing + Walsh-Hadamard rotation, so that
// product VQ's error in the coded space is the score error and its sub-spaces are balanced.
//
// A key error dk changes a score by q . dk, so its cost is E[(q . dk)^2] = dk' Sq dk with Sq the
// queries' second moment. Coding k~ = M k with codes whose error is spread evenly over the coded
// channels at a fixed total key energy, the cost is proportional to tr(Sk B) tr(Sq B^-1) with
// B = M'M and Sk the keys' covariance, smallest at the matrix geometric mean B = Sk^-1 # Sq
// (the diagonal case is the query-aware smoothing lambda_c = (Var k_c / E q_c^2)^(1/4)). So
// A = B^(1/2); then the product quantizer codes sub-vectors of sub_dim channels, and its error
// depends on how the energy of A k is spread over them: the eigen-directions of A Sk A are
// dealt into the sub-spaces so that each gets an equal product of variances (the sum of the
// sub-spaces' geometric-mean variances is smallest then). M = P A, P the eigenvectors in that
// order, scaled so that tr(M Sk M') = tr(Sk) (the coded keys keep the keys' magnitude).
// Queries take the inverse transpose: q~ = M^-T q, so q~ . k~ = q . k exactly.
//
// Measured per layer on recorded activations (bench/quality/kv_transform.py): score KL of d4b8
// keys 0.100 -> 0.046 on SmolLM2-135M, 0.035 -> 0.016 on Qwen2.5-Coder-1.5B against the
// query-aware smoothing + Hadamard.
#include <cstdint>
#include <vector>

namespace vq {

// key_cov, query_moment: [D, D] row-major, symmetric (the keys' covariance and the queries' second
// moment of one KV head). Returns M: [D, D] row-major f32 (k~ = M k). sub_dim divides D.
// Throws vq::Error naming what is wrong (shape, non-finite or non-symmetric input, no key variance).
std::vector<float> learned_key_map(const std::vector<double>& key_cov, const std::vector<double>& query_moment, int D,
                                   int sub_dim);

// The queries' side of a key map: N = M^-T, [D, D] row-major f32 (q~ = N q). Throws vq::Error
// naming `what` when M is singular or so ill-conditioned that q~ . k~ would not equal q . k to
// fp32 precision (a tampered file).
std::vector<float> key_map_query_side(const float* M, int D, const char* what);
// The same for n_heads maps [n_heads, D, D] (one layer's): [n_heads, D, D].
std::vector<float> key_maps_query_side(const float* maps, int n_heads, int D, const char* what);

// In place: x[t] <- M x[t] for n rows of D floats at a stride of `stride` floats; a row gets the same
// bits whatever n and the other rows are (cpu::map_rows), so queries are batch-invariant.
void apply_key_map(const float* M, float* x, int64_t n, int D, int64_t stride);

// The covariance of n rows of D floats (contiguous): [D, D] row-major, in double.
std::vector<double> covariance_of_rows(const float* x, int64_t n, int D);
// S += sum of x[t] x[t]' over n rows of D floats at a stride of `stride` floats; S: [D, D] row-major.
void add_second_moment(const float* x, int64_t n, int D, int64_t stride, double* S);

// The learned counterparts of key_transform.h's transform_keys / transform_queries. k: [n_tokens,
// n_heads, head_dim], k[t][h] <- M_h (k[t][h] / lambda_h); maps: [n_heads, head_dim, head_dim].
void transform_keys_mapped(float* k, int64_t n_tokens, int n_heads, int head_dim, const float* lambda,
                           const float* maps);
// q: [n_tokens, n_q_heads, head_dim]; query head h uses KV head h / (n_q_heads / n_kv_heads):
// q <- N (q * lambda), N that KV head's query side (key_map_query_side), query_maps: [n_kv_heads,
// head_dim, head_dim].
void transform_queries_mapped(float* q, int64_t n_tokens, int n_q_heads, int n_kv_heads, int head_dim,
                              const float* lambda, const float* query_maps);

}  // namespace vq
