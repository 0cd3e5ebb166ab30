#pragma once
// Long-context retrieval test: a pass key (a random 5-digit number) is hidden at a relative depth
// of a long distractor text, and the model is asked for it at the end; the answer is read from its
// greedy continuation. Run with each KV cache, the retrieval rate says whether the cache keeps a
// single fact from far back usable, which perplexity (dominated by nearby tokens) does not show.
#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/kv_store.h"
#include "model/model.h"

namespace vq {

struct PasskeyPrompt {
  std::vector<int32_t> ids;  // [n_tokens] the whole prompt, BOS first
  std::string key;           // the digits to retrieve
  int64_t needle_pos = 0;    // token index where the sentence with the key starts
};

// A prompt of exactly n_tokens tokens: an instruction, distractor tokens filler[offset ...] with
// the key sentence inserted after depth * (filler tokens used) of them (0: first, 1: last), and
// the question. The key is drawn from `seed`. Throws when filler has too few tokens from offset
// or n_tokens leaves no room for the distractor.
PasskeyPrompt make_passkey_prompt(const Tokenizer& tok, const std::vector<int32_t>& filler, int64_t offset,
                                  int n_tokens, double depth, uint64_t seed);

struct PasskeyAnswer {
  std::string text;    // the greedy continuation, decoded
  std::string digits;  // its first run of digits ("" when none)
  bool correct = false;
};

// The first run of ASCII digits in text ("" when none).
std::string first_digits(const std::string& text);

// Feeds the prompt (chunks of `chunk` tokens) through a session with the given cache and
// continues greedily for max_new tokens (stopping early once digits have started and ended).
// On `device`: where the model runs and the cache lives.
PasskeyAnswer answer_passkey(const Model& model, const KVSpec& spec, const PasskeyPrompt& p, int max_new = 8,
                             int chunk = 512, KVDevice device = KVDevice::cpu);

}  // namespace vq
