#pragma once
// Text generation in one call: one prompt, or many prompts batched through the Engine.
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "veloxquant/engine.h"

namespace veloxquant {

struct GenerateOptions {
  int max_new_tokens = 128;
  SamplingParams sampling;
  bool ignore_eos = false;
  EngineOptions engine;  // budget, batch width (max_sequences), context
};

struct Generation {
  std::vector<int32_t> tokens;  // generated ids (an end-of-generation token included)
  std::string text;             // their text, end-of-generation tokens left out
  SequenceResult result;        // why it ended, token counts, KV memory
};

// on_token: each new token as it comes; return false to stop.
Generation generate(const Model& model, const KVSpec& spec, std::span<const int32_t> prompt,
                    const GenerateOptions& opt = {}, const std::function<bool(int32_t)>& on_token = {});
// The prompt text is encoded with the model's BOS rule (apply_chat_template first for a chat).
Generation generate(const Model& model, const KVSpec& spec, const std::string& prompt, const GenerateOptions& opt = {},
                    const std::function<bool(int32_t)>& on_token = {});
// All prompts through one engine (opt.engine.max_sequences at once); sequence i samples with seed
// opt.sampling.seed + i. Results in prompt order.
std::vector<Generation> generate_batch(const Model& model, const KVSpec& spec,
                                       const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opt = {});
std::vector<Generation> generate_batch(const Model& model, const KVSpec& spec, const std::vector<std::string>& prompts,
                                       const GenerateOptions& opt = {});

}  // namespace veloxquant
