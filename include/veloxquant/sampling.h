#pragma once
// Token sampling with llama.cpp's semantics and order: repetition penalty over the last
// repeat_last_n accepted tokens, then greedy (temp <= 0 or top_k == 1), else top-k, top-p, min-p
// and one draw at temperature temp from a generator seeded with seed (the same tokens for a seed
// on every platform).
#include <cstdint>
#include <memory>

#include "veloxquant/status.h"

namespace veloxquant {

struct SamplingParams {
  float temperature = 0.8f;   // <= 0: greedy (lowest id on ties)
  int top_k = 40;             // <= 0: all tokens
  float top_p = 0.95f;        // >= 1: off
  float min_p = 0.05f;        // <= 0: off
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  uint64_t seed = 0;
  static SamplingParams greedy() { return SamplingParams{0.0f}; }
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params = {});
  ~Sampler();
  Sampler(Sampler&&) noexcept;
  Sampler& operator=(Sampler&&) noexcept;

  // logits: [n_vocab] float32 (not modified). Does not accept the token: call accept().
  int32_t sample(const float* logits, int n_vocab);
  void accept(int32_t token);  // feeds the repetition penalty (prompt tokens too)
  void reset();                // forgets accepted tokens and re-seeds

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace veloxquant
