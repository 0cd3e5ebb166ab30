#pragma once
// Token sampler with llama.cpp's semantics and default order:
//   1. repetition penalty on each distinct token among the last repeat_last_n accepted ones
//      (positive logits divided by the penalty, negative ones multiplied);
//   2. temp <= 0 (or top_k == 1): greedy argmax, lowest id on ties;
//   3. top-k (k <= 0 or k >= n_vocab: all tokens);
//   4. top-p: the smallest prefix of the descending-sorted softmax (at temperature 1, as llama.cpp)
//      whose mass reaches top_p (top_p >= 1: off);
//   5. min-p: drop tokens whose probability is below min_p * p_max (min_p <= 0: off);
//   6. softmax of logit / temp over the survivors and one draw from a std::mt19937_64 seeded with
//      `seed` (uniforms from its 53 high bits, so a seed gives the same tokens on every platform).
// Cost on a 49152 vocabulary: one pass for top-k (a k-heap), min-p as a threshold before any
// sorting (top-p and min-p both keep a prefix of the sorted order, so their intersection does not
// depend on the order they run in), and top-p sorts only as long a prefix as it needs.
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
  std::vector<float> penalised_; // [n_vocab] logits after the repetition penalty (when active)
  std::vector<Cand> cands_;      // [<= n_vocab] surviving candidates
  std::vector<double> probs_;    // [n_kept] scratch: unnormalised probabilities
};

}  // namespace vq
