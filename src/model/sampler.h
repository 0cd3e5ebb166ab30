#pragma once
// Token sampler with llama.cpp-compatible semantics:
//   repetition penalty over the last repeat_last_n accepted tokens (positive logits divided by the
//   penalty, negative ones multiplied), then temp <= 0 -> greedy argmax; otherwise top-k (k <= 0:
//   all), softmax at temperature, top-p (smallest prefix of the sorted distribution whose mass
//   reaches p), min-p (drop tokens with p < min_p * p_max), renormalise, draw with a seeded
//   std::mt19937_64. Same seed and same inputs -> same tokens.
#include <cstdint>
#include <deque>
#include <random>
#include <vector>

namespace vq {

struct SamplerParams {
  float temp = 0.8f;
  int top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int repeat_last_n = 64;
  uint64_t seed = 0;
};  // temp <= 0: greedy

class Sampler {
 public:
  explicit Sampler(const SamplerParams& params);
  // logits: [n_vocab] f32 (not modified). Applies penalties from accepted tokens.
  int32_t sample(const float* logits, int n_vocab);
  void accept(int32_t token);
  void reset();  // forgets accepted tokens and re-seeds the RNG
  const SamplerParams& params() const { return params_; }

 private:
  struct Cand { float logit; int32_t id; };
  SamplerParams params_;
  std::mt19937_64 rng_;
  std::deque<int32_t> history_;  // last repeat_last_n accepted tokens, oldest first
  std::vector<Cand> cands_;      // [n_vocab] scratch
  std::vector<float> probs_;     // [n_kept] scratch
};

}  // namespace vq
