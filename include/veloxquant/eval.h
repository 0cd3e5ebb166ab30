#pragma once
// The evaluation suite (`veloxquant eval`): for a list of KV caches on one model, the quality of
// next-token predictions on several texts at several context lengths (perplexity, KL and top-1
// agreement against a reference cache, fp16) and long-context retrieval (a pass key hidden at
// several depths of a distractor text), scored against the key and against the reference cache's
// own answer; the report as one JSON document (schema "veloxquant-eval-1").
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"

namespace veloxquant {

struct EvalText {
  std::string name;  // short label ("classes", "GPL-3")
  std::string path;
  std::string text;
};

struct EvalOptions {
  std::vector<int> contexts{512, 2048};  // quality: the first n tokens of each text, one window each
  int chunk = 32;                        // quality: tokens per forward call
  // Retrieval (skipped when empty): prompts of each context length, the key at each depth,
  // `trials` prompts per (context, depth).
  std::vector<int> retrieval_contexts;
  std::vector<double> depths{0.0, 0.25, 0.5, 0.75, 1.0};
  int trials = 2;
  int answer_tokens = 8;  // greedy tokens generated per prompt
  int retrieval_chunk = 512;
  uint64_t seed = 20261201;
  Device device = Device::cpu;  // where the model runs and the caches live
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

struct EvalPrompt {
  int n_ctx = 0;
  double depth = 0;
  int trial = 0;
  std::string key;
  std::vector<int32_t> ids;
};

struct EvalReport {
  std::string reference;  // the reference cache's name
  std::vector<EvalQualityRow> quality;
  std::vector<EvalRetrievalRow> retrieval;
  // The inputs, so another engine can score the same token ids: each text's first max(contexts)
  // tokens, and every retrieval prompt.
  std::vector<std::vector<int32_t>> text_ids;
  std::vector<EvalPrompt> prompts;
  double seconds = 0;
};

// Progress: (what, done, total).
using EvalProgress = std::function<void(const std::string& what, int done, int total)>;

// methods: the caches to evaluate (the reference too when listed, as a row of exact agreement);
// filler: the retrieval distractor text. Throws when a text or the filler is too short for the
// largest context.
EvalReport run_eval(const Model& model, const std::vector<KVSpec>& methods, const KVSpec& reference,
                    const std::vector<EvalText>& texts, const std::string& filler, const EvalOptions& opt,
                    const EvalProgress& progress = {});

// The report as JSON; meta_json, a JSON object, is merged in at the top level (model, machine,
// date, command). The prompts' token ids are left out unless with_inputs. Throws when meta_json
// is not a JSON object.
std::string eval_report_json(const EvalReport& report, const EvalOptions& opt, const std::vector<EvalText>& texts,
                             const std::string& meta_json, bool with_inputs);

// The presets `veloxquant eval` evaluates by default: every registered method's evaluated ones.
std::vector<std::string> kv_cache_evaluated_methods();

}  // namespace veloxquant
