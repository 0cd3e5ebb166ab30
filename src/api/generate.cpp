// generate / generate_batch: requests through one Engine, tokens collected per sequence.
#include "core/error.h"
#include "veloxquant/generate.h"

namespace veloxquant {

static std::vector<int32_t> encode_prompt(const Model& model, const std::string& text) {
  std::vector<int32_t> ids = model.tokenizer().encode(text);
  VQ_CHECK(!ids.empty(), "generate: the prompt encodes to no tokens");
  return ids;
}

static std::string text_of(const Model& model, const std::vector<int32_t>& tokens, bool ignore_eos) {
  if (!model.has_tokenizer()) return "";
  const Tokenizer tok = model.tokenizer();
  std::string s;
  for (int32_t t : tokens)
    if (ignore_eos || !tok.is_end_of_generation(t)) s += tok.piece(t);
  return s;
}

// Submits every prompt (sequence i with seed + i), runs the engine, returns results in order.
static std::vector<Generation> run_all(const Model& model, const KVSpec& spec,
                                       const std::vector<std::span<const int32_t>>& prompts, const GenerateOptions& opt,
                                       const std::function<bool(int32_t)>& on_token) {
  Engine engine(model, spec, opt.engine);
  std::vector<Generation> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request r;
    r.prompt.assign(prompts[i].begin(), prompts[i].end());
    r.sampling = opt.sampling;
    r.sampling.seed = opt.sampling.seed + i;
    r.max_new_tokens = opt.max_new_tokens;
    r.ignore_eos = opt.ignore_eos;
    Generation* g = &out[i];
    r.on_token = [g, &on_token](int64_t, int32_t t) {
      g->tokens.push_back(t);
      return !on_token || on_token(t);
    };
    r.on_finish = [g](const SequenceResult& s) { g->result = s; };
    engine.submit(std::move(r));
  }
  engine.run();
  for (Generation& g : out) g.text = text_of(model, g.tokens, opt.ignore_eos);
  return out;
}

Generation generate(const Model& model, const KVSpec& spec, std::span<const int32_t> prompt, const GenerateOptions& opt,
                    const std::function<bool(int32_t)>& on_token) {
  return std::move(run_all(model, spec, {prompt}, opt, on_token)[0]);
}

Generation generate(const Model& model, const KVSpec& spec, const std::string& prompt, const GenerateOptions& opt,
                    const std::function<bool(int32_t)>& on_token) {
  const std::vector<int32_t> ids = encode_prompt(model, prompt);
  return generate(model, spec, std::span<const int32_t>(ids), opt, on_token);
}

std::vector<Generation> generate_batch(const Model& model, const KVSpec& spec,
                                       const std::vector<std::vector<int32_t>>& prompts, const GenerateOptions& opt) {
  std::vector<std::span<const int32_t>> spans(prompts.begin(), prompts.end());
  return run_all(model, spec, spans, opt, {});
}

std::vector<Generation> generate_batch(const Model& model, const KVSpec& spec, const std::vector<std::string>& prompts,
                                       const GenerateOptions& opt) {
  std::vector<std::vector<int32_t>> ids;
  ids.reserve(prompts.size());
  for (const std::string& p : prompts) ids.push_back(encode_prompt(model, p));
  return generate_batch(model, spec, ids, opt);
}

}  // namespace veloxquant
