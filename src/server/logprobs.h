#pragma once
// Log-probabilities of generated tokens (OpenAI's `logprobs`), from the logits each token was
// sampled from: log_softmax of the raw logits (before temperature and penalties, as OpenAI
// reports the model's distribution).
#include <cstdint>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace vq {

class Tokenizer;

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;  // the top_n most likely tokens, most likely first
};

// logits: [n_vocab] f32.
TokenLogprob token_logprob(const float* logits, int n_vocab, int32_t token, int top_n);

// Entries [from, to) in OpenAI's shape: chat {"content": [{token, logprob, bytes, top_logprobs}]};
// completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (offsets start at
// text_offset0, in bytes of the generated text).
nlohmann::json logprobs_json(const std::vector<TokenLogprob>& lp, size_t from, size_t to, const Tokenizer& tok,
                             bool chat, size_t text_offset0);

}  // namespace vq
