#pragma once
// Quality of a KV cache method on a text: perplexity, and against a reference method (fp16) the
// mean KL divergence of the next-token distributions and the top-1 agreement.
#include <cstdint>
#include <span>

#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"
#include "veloxquant/session.h"

namespace veloxquant {

struct PerplexityOptions {
  int n_ctx = 2048;     // tokens per window (each window starts from an empty cache)
  int chunk = 32;       // tokens per forward call: later chunks attend to earlier ones through the cache
  int max_windows = 1;
  Device device = Device::cpu;  // where the model runs and the caches live (runtime.h)
  int tp = 1;  // tensor-parallel ranks, simulated on the CPU (SessionOptions::tp)
};

struct PerplexityResult {
  int64_t n_scored = 0;    // predicted tokens
  double nll = 0;          // mean negative log-likelihood, nats
  double perplexity = 0;   // exp(nll)
  double kl = 0;           // mean KL(reference || method), nats (0 without a reference)
  double top1 = 0;         // fraction of positions where the argmax agrees with the reference's
  double ref_perplexity = 0;
  double seconds = 0;
  KVMemory memory;         // at the end of the last window
};

// tokens: the text's token ids (at least 2). reference: nullptr for perplexity alone.
PerplexityResult perplexity(const Model& model, std::span<const int32_t> tokens, const KVSpec& method,
                            const KVSpec* reference = nullptr, const PerplexityOptions& opt = {});

}  // namespace veloxquant
