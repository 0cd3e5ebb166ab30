#pragma once
// The evaluation suite behind `veloxquant eval`: for a list of KV caches on one model, the quality
// of next-token predictions on several texts at several context lengths (perplexity, KL and top-1
// agreement against the reference cache, fp16), and long-context retrieval (a pass key hidden at
// several depths of a distractor text, eval/passkey.h) scored against the key and against the
// reference cache's own answer. The report goes to one JSON document (eval_to_json).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvcache/kv_store.h"
#include "model/model.h"

namespace vq {

struct EvalText {
  std::string name;  // short label ("classes", "GPL-3")
  std::string path;
  std::string text;
};

struct EvalOptions {
  std::vector<int> contexts{512, 2048};  // quality: the first n tokens of each text, one window each
  int chunk = 32;                        // quality: tokens per forward call
  // Retrieval (skipped when contexts is empty): prompts of each context length, the key at each
  // depth, `trials` prompts per (context, depth) (each its own key and distractor offset).
  std::vector<int> retrieval_contexts;
  std::vector<double> depths{0.0, 0.25, 0.5, 0.75, 1.0};
  int trials = 2;
  int answer_tokens = 8;  // greedy tokens generated per prompt
  int retrieval_chunk = 512;
  uint64_t seed = 20261201;
  KVDevice device = KVDevice::cpu;  // where the model runs and the caches live
};

struct EvalQualityRow {
  std::string kv_cache, text;
  int n_ctx = 0;
  int64_t tokens_scored = 0;
  double perplexity = 0, ref_perplexity = 0, kl = 0, top1 = 0, bits_per_element = 0, bits_nominal = 0;
};

struct EvalRetrievalRow {
  std::string kv_cache;
  int n_ctx = 0;
  double depth = 0;
  int trials = 0, correct = 0, agree_ref = 0;  // key retrieved; same answer as the reference cache
  std::vector<std::string> answers;            // [trials] digits answered
};

struct EvalReport {
  std::string reference;  // the reference cache's name
  std::vector<EvalQualityRow> quality;
  std::vector<EvalRetrievalRow> retrieval;
  // Inputs, so another engine can score the same token ids: each text's first max(contexts)
  // tokens, and every retrieval prompt (context, depth, trial order).
  std::vector<std::vector<int32_t>> text_ids;
  struct Prompt {
    int n_ctx;
    double depth;
    int trial;
    std::string key;
    std::vector<int32_t> ids;
  };
  std::vector<Prompt> prompts;
  double seconds = 0;
};

// Progress: (what, done, total).
using EvalProgress = std::function<void(const std::string&, int, int)>;

// methods: the caches to evaluate (the reference is evaluated too when listed, as a row of
// exact agreement); filler: the retrieval distractor text. Throws when a text or the filler is
// too short for the largest context.
EvalReport run_eval(const Model& model, const std::vector<KVSpec>& methods, const KVSpec& reference,
                    const std::vector<EvalText>& texts, const std::string& filler, const EvalOptions& opt,
                    const EvalProgress& progress = {});

// The report as JSON (schema "veloxquant-eval-1"); `meta` is merged in at the top level (model,
// machine, date, command). Prompts' token ids are left out unless with_prompts.
nlohmann::json eval_to_json(const EvalReport& r, const EvalOptions& opt, const std::vector<EvalText>& texts,
                            const nlohmann::json& meta, bool with_prompts);

}  // namespace vq
