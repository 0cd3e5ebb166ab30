// Engine: continuous batching from Python, with token and finish callbacks.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common.h"
#include "veloxquant/engine.h"

namespace vqpy {

using namespace veloxquant;

// The engine plus the Python callables its requests call. Callbacks hold plain pointers into
// `callables`, so no Python reference count changes while the GIL is released; the list (and the
// engine) go away in the object's deallocation, with the GIL held.
struct PyEngine {
  Model model;
  Engine engine;
  std::vector<nb::object> callables;
};

void bind_engine(nb::module_& m) {
  nb::class_<SequenceResult>(m, "SequenceResult", "How a sequence of an Engine ended.")
      .def_ro("id", &SequenceResult::id)
      .def_prop_ro("finish_reason", [](const SequenceResult& r) { return std::string(finish_reason_name(r.finish)); })
      .def_ro("error", &SequenceResult::error)
      .def_ro("n_prompt", &SequenceResult::n_prompt)
      .def_ro("n_generated", &SequenceResult::n_generated)
      .def_ro("memory", &SequenceResult::memory);

  nb::class_<PyEngine>(m, "Engine",
                       "Continuous batching: submitted requests run together, one decode token each per step plus "
                       "prefill chunks, the weights read once per step. Callbacks run on the thread calling "
                       "step()/run(). The KV budget bounds memory: sequences that do not fit wait or are "
                       "recomputed later, with the same output.")
      .def(
          "__init__",
          [](PyEngine* self, const Model& model, const KVSpec& kv_cache, std::optional<size_t> kv_budget_bytes,
             int max_sequences, int max_step_tokens, int n_ctx, bool deterministic, bool prefix_cache) {
            EngineOptions o{kv_budget_bytes.value_or(size_t(-1)), max_sequences, max_step_tokens, n_ctx};
            o.deterministic = deterministic;
            o.prefix_cache = prefix_cache;
            new (self) PyEngine{model, Engine(model, kv_cache, o), {}};
          },
          nb::arg("model"), nb::arg("kv_cache"), nb::kw_only(), nb::arg("kv_budget_bytes") = nb::none(),
          nb::arg("max_sequences") = 16, nb::arg("max_step_tokens") = 512, nb::arg("n_ctx") = 0,
          nb::arg("deterministic") = false, nb::arg("prefix_cache") = false)
      .def(
          "submit",
          [](PyEngine& e, const std::vector<int32_t>& prompt, int max_new_tokens, double temperature, int top_k,
             double top_p, double min_p, double repeat_penalty, uint64_t seed, bool ignore_eos, int64_t fork_of,
             std::optional<nb::callable> on_token, std::optional<nb::callable> on_finish) {
            Request r;
            r.prompt = prompt;
            r.sampling = {float(temperature), top_k, float(top_p), float(min_p), float(repeat_penalty), 64, seed};
            r.max_new_tokens = max_new_tokens;
            r.ignore_eos = ignore_eos;
            r.fork_of = fork_of;
            if (on_token) {
              PyObject* f = e.callables.emplace_back(*on_token).ptr();
              r.on_token = [f](int64_t id, int32_t t) { return call_python(f, id, t); };
            }
            if (on_finish) {
              PyObject* f = e.callables.emplace_back(*on_finish).ptr();
              r.on_finish = [f](const SequenceResult& s) { call_python(f, s); };
            }
            return e.engine.submit(std::move(r));
          },
          nb::arg("prompt"), nb::kw_only(), nb::arg("max_new_tokens") = 128, nb::arg("temperature") = 0.8,
          nb::arg("top_k") = 40, nb::arg("top_p") = 0.95, nb::arg("min_p") = 0.05, nb::arg("repeat_penalty") = 1.0,
          nb::arg("seed") = 0, nb::arg("ignore_eos") = false, nb::arg("fork_of") = -1,
          nb::arg("on_token") = nb::none(), nb::arg("on_finish") = nb::none(),
          "Queues a request (prompt: token ids) and returns its id. on_token(id, token) -> bool | None: False "
          "stops the sequence. on_finish(SequenceResult) once at the end. fork_of: an earlier request whose "
          "prompt starts with this one's, whose KV blocks this one shares.")
      .def(
          "step", [](PyEngine& e) { return e.engine.step(); }, nb::call_guard<nb::gil_scoped_release>(),
          "One step; False when there was nothing to do.")
      .def(
          "run", [](PyEngine& e) { e.engine.run(); }, nb::call_guard<nb::gil_scoped_release>(),
          "Steps until every request has finished.")
      .def("cancel", [](PyEngine& e, int64_t id) { e.engine.cancel(id); }, nb::arg("id"), "Ends it at the next step.")
      .def_prop_ro("idle", [](const PyEngine& e) { return e.engine.idle(); })
      .def_prop_ro("memory_used_bytes", [](const PyEngine& e) { return e.engine.memory().used_bytes; })
      .def_prop_ro("memory_peak_bytes", [](const PyEngine& e) { return e.engine.memory().peak_bytes; })
      .def_prop_ro("preemptions", [](const PyEngine& e) { return e.engine.stats().preemptions; })
      .def_prop_ro("steps", [](const PyEngine& e) { return e.engine.stats().steps; })
      .def_prop_ro("prefix_hit_tokens", [](const PyEngine& e) { return e.engine.stats().prefix_hit_tokens; });
}

}  // namespace vqpy
