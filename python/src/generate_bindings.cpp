// Model.generate / generate_batch / perplexity, with their result types.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common.h"
#include "veloxquant/generate.h"
#include "veloxquant/perplexity.h"

namespace vqpy {

using namespace veloxquant;

// A prompt or text given as a str (encoded with the model's BOS rule, optionally in its chat
// format) or as token ids.
using Text = std::variant<std::string, std::vector<int32_t>>;
using Spec = std::variant<std::string, KVSpec>;

static std::vector<int32_t> token_ids(const Model& model, const Text& text, bool chat, const std::optional<std::string>& system) {
  if (const auto* ids = std::get_if<std::vector<int32_t>>(&text)) {
    if (chat) throw Error("chat=True needs the prompt as text, not token ids");
    return *ids;
  }
  std::string s = std::get<std::string>(text);
  const Tokenizer tok = model.tokenizer();
  if (chat) {
    std::vector<ChatMessage> msgs;
    if (system) msgs.push_back({"system", *system});
    msgs.push_back({"user", s});
    s = tok.apply_chat_template(msgs, true);
  }
  return tok.encode(s);
}

// kv_cache given as a KVSpec, or as a spec string resolved for the model.
static KVSpec spec_of(const Model& model, const Spec& kv_cache, const std::optional<std::string>& calibration_file) {
  if (const auto* spec = std::get_if<KVSpec>(&kv_cache)) {
    if (calibration_file) throw Error("calibration_file applies to a spec string, not to a KVSpec");
    return *spec;
  }
  const std::string& s = std::get<std::string>(kv_cache);
  nb::gil_scoped_release nogil;  // the default model's first-use calibration takes a while
  return KVSpec::for_model(model, s, calibration_file.value_or(""));
}

struct GenArgs {
  int max_new_tokens = 128;
  double temperature = 0.8, top_p = 0.95, min_p = 0.05, repeat_penalty = 1.0;  // double: exact defaults in the stubs
  int top_k = 40;
  uint64_t seed = 0;
  bool ignore_eos = false;
  std::optional<size_t> kv_budget_bytes;
  GenerateOptions options(int max_sequences) const {
    GenerateOptions o;
    o.max_new_tokens = max_new_tokens;
    o.sampling = {float(temperature), top_k, float(top_p), float(min_p), float(repeat_penalty), 64, seed};
    o.ignore_eos = ignore_eos;
    o.engine.kv_budget_bytes = kv_budget_bytes.value_or(size_t(-1));
    o.engine.max_sequences = max_sequences;
    return o;
  }
};

static void bind_results(nb::module_& m) {
  nb::class_<Generation>(m, "Generation", "The result of one generated sequence.")
      .def_ro("tokens", &Generation::tokens, "Generated token ids (an end-of-generation token included).")
      .def_prop_ro("text", [](const Generation& g) { return utf8(g.text); },
                   "Their text, end-of-generation tokens left out (invalid UTF-8 replaced by U+FFFD).")
      .def_prop_ro("finish_reason", [](const Generation& g) { return std::string(finish_reason_name(g.result.finish)); },
                   "'length', 'eos', 'stop', 'cancelled', 'context' or 'error'.")
      .def_prop_ro("error", [](const Generation& g) { return g.result.error; })
      .def_prop_ro("n_prompt", [](const Generation& g) { return g.result.n_prompt; })
      .def_prop_ro("n_generated", [](const Generation& g) { return g.result.n_generated; })
      .def_prop_ro("memory", [](const Generation& g) { return g.result.memory; }, "KV memory at the end.")
      .def("__repr__", [](const Generation& g) {
        return "Generation(" + std::to_string(g.result.n_generated) + " tokens, " +
               finish_reason_name(g.result.finish) + ")";
      });
  nb::class_<PerplexityResult>(m, "PerplexityResult", "Quality of a KV cache on a text.")
      .def_ro("n_scored", &PerplexityResult::n_scored, "Predicted tokens.")
      .def_ro("nll", &PerplexityResult::nll, "Mean negative log-likelihood, nats.")
      .def_ro("perplexity", &PerplexityResult::perplexity)
      .def_ro("kl", &PerplexityResult::kl, "Mean KL(reference || method), nats (0 without a reference).")
      .def_ro("top1", &PerplexityResult::top1, "Share of positions whose argmax agrees with the reference's.")
      .def_ro("ref_perplexity", &PerplexityResult::ref_perplexity)
      .def_ro("seconds", &PerplexityResult::seconds)
      .def_ro("memory", &PerplexityResult::memory, "KV memory at the end of the last window.");
}

static void bind_sampler(nb::module_& m) {
  nb::class_<Sampler>(m, "Sampler",
                      "Token sampling with llama.cpp's order: repetition penalty, then greedy (temperature <= 0) or "
                      "top-k, top-p, min-p and one draw at the temperature from a generator seeded with seed.")
      .def(
          "__init__",
          [](Sampler* self, double temperature, int top_k, double top_p, double min_p, double repeat_penalty,
             int repeat_last_n, uint64_t seed) {
            new (self) Sampler(
                {float(temperature), top_k, float(top_p), float(min_p), float(repeat_penalty), repeat_last_n, seed});
          },
          nb::kw_only(), nb::arg("temperature") = 0.8, nb::arg("top_k") = 40, nb::arg("top_p") = 0.95,
          nb::arg("min_p") = 0.05, nb::arg("repeat_penalty") = 1.0, nb::arg("repeat_last_n") = 64, nb::arg("seed") = 0)
      .def(
          "sample",
          [](Sampler& s, In<float, 1> logits) { return s.sample(logits.data(), int(logits.shape(0))); },
          nb::arg("logits"), "logits: float32 [n_vocab] -> a token id (not accepted: call accept()).")
      .def("accept", &Sampler::accept, nb::arg("token"), "Feeds the repetition penalty (prompt tokens too).")
      .def("reset", &Sampler::reset, "Forgets accepted tokens and re-seeds.");
}

void bind_generate(nb::module_& m, nb::class_<Model>& model) {
  bind_results(m);
  bind_sampler(m);
  model.def(
      "generate",
      [](const Model& self, const Text& prompt, int max_new_tokens, const Spec& kv_cache,
         std::optional<std::string> calibration_file, bool chat, std::optional<std::string> system, double temperature,
         int top_k, double top_p, double min_p, double repeat_penalty, uint64_t seed, bool ignore_eos,
         std::optional<size_t> kv_budget_bytes, std::optional<nb::callable> on_token) {
        const std::vector<int32_t> ids = token_ids(self, prompt, chat, system);
        const KVSpec spec = spec_of(self, kv_cache, calibration_file);
        const GenArgs a{max_new_tokens, temperature, top_p, min_p, repeat_penalty, top_k, seed, ignore_eos, kv_budget_bytes};
        std::function<bool(int32_t)> cb;
        if (on_token) cb = [f = on_token->ptr()](int32_t t) { return call_python(f, t); };
        nb::gil_scoped_release nogil;
        return generate(self, spec, std::span<const int32_t>(ids), a.options(1), cb);
      },
      nb::arg("prompt"), nb::kw_only(), nb::arg("max_new_tokens") = 128, nb::arg("kv_cache") = "fp16",
      nb::arg("calibration_file") = nb::none(), nb::arg("chat") = false, nb::arg("system") = nb::none(),
      nb::arg("temperature") = 0.8, nb::arg("top_k") = 40, nb::arg("top_p") = 0.95, nb::arg("min_p") = 0.05,
      nb::arg("repeat_penalty") = 1.0, nb::arg("seed") = 0, nb::arg("ignore_eos") = false,
      nb::arg("kv_budget_bytes") = nb::none(), nb::arg("on_token") = nb::none(),
      "Generates from a prompt (str, or a list of token ids). kv_cache: a spec string (see KVSpec) or a KVSpec; "
      "chat wraps the prompt in the model's chat format; temperature <= 0 is greedy; on_token(id) -> bool is "
      "called with each token (return False to stop; None goes on).");
  model.def(
      "generate_batch",
      [](const Model& self, const std::vector<Text>& prompts, int max_new_tokens, const Spec& kv_cache,
         std::optional<std::string> calibration_file, bool chat, std::optional<std::string> system, double temperature,
         int top_k, double top_p, double min_p, double repeat_penalty, uint64_t seed, bool ignore_eos,
         std::optional<size_t> kv_budget_bytes, int parallel) {
        std::vector<std::vector<int32_t>> ids;
        for (const Text& p : prompts) ids.push_back(token_ids(self, p, chat, system));
        const KVSpec spec = spec_of(self, kv_cache, calibration_file);
        const GenArgs a{max_new_tokens, temperature, top_p, min_p, repeat_penalty, top_k, seed, ignore_eos, kv_budget_bytes};
        nb::gil_scoped_release nogil;
        return generate_batch(self, spec, ids, a.options(parallel));
      },
      nb::arg("prompts"), nb::kw_only(), nb::arg("max_new_tokens") = 128, nb::arg("kv_cache") = "fp16",
      nb::arg("calibration_file") = nb::none(), nb::arg("chat") = false, nb::arg("system") = nb::none(),
      nb::arg("temperature") = 0.8, nb::arg("top_k") = 40, nb::arg("top_p") = 0.95, nb::arg("min_p") = 0.05,
      nb::arg("repeat_penalty") = 1.0, nb::arg("seed") = 0, nb::arg("ignore_eos") = false,
      nb::arg("kv_budget_bytes") = nb::none(), nb::arg("parallel") = 16,
      "Generates for every prompt through one continuous-batching engine, `parallel` sequences at once (each "
      "step reads the weights once for all of them). Sequence i samples with seed + i. Results in prompt order.");
  model.def(
      "perplexity",
      [](const Model& self, const Text& text, const Spec& kv_cache, const std::optional<Spec>& reference,
         std::optional<std::string> calibration_file, int n_ctx, int chunk, int max_windows) {
        const std::vector<int32_t> ids = token_ids(self, text, false, std::nullopt);
        const KVSpec spec = spec_of(self, kv_cache, calibration_file);
        std::optional<KVSpec> ref;
        if (reference) ref = spec_of(self, *reference, std::nullopt);
        nb::gil_scoped_release nogil;
        return perplexity(self, ids, spec, ref ? &*ref : nullptr, {n_ctx, chunk, max_windows});
      },
      nb::arg("text"), nb::kw_only(), nb::arg("kv_cache") = "fp16", nb::arg("reference").none() = "fp16",
      nb::arg("calibration_file") = nb::none(), nb::arg("n_ctx") = 2048, nb::arg("chunk") = 32,
      nb::arg("max_windows") = 1,
      "Perplexity of text (str or token ids) with kv_cache, and against reference (None: skip) the mean KL "
      "divergence and top-1 agreement. Windows of n_ctx tokens, fed chunk tokens at a time.");
}

}  // namespace vqpy
