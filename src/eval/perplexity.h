#pragma once
// Quality harness: perplexity of a text with a given KV cache, and the mean KL divergence and
// top-1 agreement of its next-token distributions against a reference cache (fp16).
// The text is fed in chunks: each chunk attends to the earlier ones through the cache.
#include <cstdint>
#include <vector>

#include "kvcache/kv_store.h"
#include "model/model.h"

namespace vq {

struct PerplexityOptions {
  int n_ctx = 2048;  // tokens per window (each window starts from an empty cache)
  int chunk = 32;    // tokens per forward call
  int max_windows = 1;
  KVDevice device = KVDevice::cpu;  // where the model runs and the caches live
  int tp = 1;  // tensor-parallel ranks (Session's tp: simulated on the CPU)
};

struct PerplexityResult {
  int64_t n_scored = 0;      // predicted tokens
  double nll = 0;            // mean negative log-likelihood (nats)
  double perplexity = 0;     // exp(nll)
  double kl = 0;             // mean KL(reference || method), nats (0 without a reference)
  double top1 = 0;           // fraction of positions where the argmax agrees with the reference's
  double ref_perplexity = 0;
  double seconds = 0;
  // At the end of the last window: bytes the tokens take (payload), bytes the blocks allocate,
  // and what an fp16 cache takes; bits/element from the first.
  size_t kv_bytes = 0, kv_allocated_bytes = 0, kv_fp16_bytes = 0;
  double bits_per_element = 0;
};

// tokens: the text; reference may be null (no KL / agreement).
PerplexityResult evaluate_perplexity(const Model& model, const std::vector<int32_t>& tokens,
                                     const KVSpec& method, const KVSpec* reference,
                                     const PerplexityOptions& opt);

// Several methods against one reference in lock-step: every chunk runs through the reference once
// and through each method, so the reference's logits are computed once for all (result i is
// methods[i]'s; each result's `seconds` is the whole call's).
std::vector<PerplexityResult> evaluate_perplexity(const Model& model, const std::vector<int32_t>& tokens,
                                                  const std::vector<KVSpec>& methods, const KVSpec* reference,
                                                  const PerplexityOptions& opt);

}  // namespace vq
