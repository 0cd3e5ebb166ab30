#pragma once
// Splits one attend() call into work items (KV head x query block x key range), runs them on
// the thread pool and merges the online-softmax partials by log-sum-exp. Shared by all caches.
#include <cstdint>
#include <functional>

namespace vq {

struct AttnProblem {
  int n_q = 0;
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t n_keys = 0;      // keys held; the queries are the last n_q of them (causal)
  int64_t split_unit = 0;  // key ranges given to the kernel start at multiples of this (> 0)
};

// Accumulates keys [t0, t1) into the state of queries [q0, q1) of KV head kvh; query i sees keys
// below causal_limit(i) = n_keys - n_q + i + 1. The state starts empty (m = -inf, d = 0, o = 0):
// m, d: [q1 - q0, group]; o: [q1 - q0, group, head_dim].
using AttnRangeFn =
    std::function<void(int kvh, int q0, int q1, int64_t t0, int64_t t1, float* m, float* d, float* o)>;

// out: [n_q, n_heads, head_dim] f32, the normalised attention output.
void run_attention(const AttnProblem& p, const AttnRangeFn& fn, float* out);

}  // namespace vq
