// Server: the OpenAI-compatible HTTP server (what `veloxquant serve` runs) from Python.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <optional>
#include <string>

#include "common.h"
#include "veloxquant/server.h"

namespace vqpy {

using namespace veloxquant;

// The server keeps a reference to its model: the Python object holds a copy of the handle (it
// shares the loaded weights) so that the model outlives the server whatever Python does.
struct PyServer {
  Model model;
  std::unique_ptr<Server> server;
  int port = -1;
};

void bind_server(nb::module_& m) {
  nb::class_<PyServer>(m, "Server",
                       "The OpenAI-compatible HTTP server (completions, chat, streaming, named sessions, "
                       "metrics), as `veloxquant serve` runs it, over one model and KV cache. bind() "
                       "listens, run() serves until stop() (it releases the GIL: run it in a thread "
                       "and call stop() from another). Every option is checked at construction, the "
                       "error naming it.")
      .def(
          "__init__",
          [](PyServer* self, const Model& model, const KVSpec& kv_cache, const std::string& host, int port,
             const std::string& device, std::optional<size_t> kv_budget_bytes, int max_sequences,
             int max_step_tokens, int n_ctx, bool deterministic, bool prefix_cache, const std::string& session_dir,
             int max_queue, const std::string& api_key, const std::string& model_name) {
            ServerOptions o;
            o.device = parse_device(device);
            o.kv_budget_bytes = kv_budget_bytes.value_or(0);
            o.max_sequences = max_sequences;
            o.max_step_tokens = max_step_tokens;
            o.n_ctx = n_ctx;
            o.deterministic = deterministic;
            o.prefix_cache = prefix_cache;
            o.session_dir = session_dir;
            o.max_queue = max_queue;
            o.api_key = api_key;
            o.model_name = model_name;
            o.host = host;
            o.port = port;
            new (self) PyServer{model, nullptr, -1};
            self->server = std::make_unique<Server>(self->model, kv_cache, o);
          },
          nb::arg("model"), nb::arg("kv_cache"), nb::kw_only(), nb::arg("host") = "127.0.0.1", nb::arg("port") = 8080,
          nb::arg("device") = "cpu", nb::arg("kv_budget_bytes") = nb::none(), nb::arg("max_sequences") = 8,
          nb::arg("max_step_tokens") = 512, nb::arg("n_ctx") = 0, nb::arg("deterministic") = false,
          nb::arg("prefix_cache") = true, nb::arg("session_dir") = "sessions", nb::arg("max_queue") = 64,
          nb::arg("api_key") = "", nb::arg("model_name") = "")
      .def(
          "bind",
          [](PyServer& s) {
            s.port = s.server->bind();
            return s.port;
          },
          "Binds host:port and returns the port (the chosen one for port=0).")
      .def(
          "run",
          [](PyServer& s) {
            if (s.port < 0) s.port = s.server->bind();
            s.server->run();
          },
          nb::call_guard<nb::gil_scoped_release>(),
          "Serves until stop(); returns once every connection has ended. Binds first if bind() was not called.")
      .def("stop", [](PyServer& s) { s.server->stop(); }, nb::call_guard<nb::gil_scoped_release>(),
           "Closes the socket; run() returns.")
      .def("drain", [](PyServer& s) { s.server->drain(); }, nb::call_guard<nb::gil_scoped_release>(),
           "New generation requests get 503 from now on; those in flight go on.")
      .def("cancel_all", [](PyServer& s) { s.server->cancel_all(); }, nb::call_guard<nb::gil_scoped_release>(),
           "Ends every running and waiting generation.")
      .def_prop_ro("port", [](const PyServer& s) { return s.port; }, "The bound port (-1 before bind()).")
      .def_prop_ro("active", [](const PyServer& s) { return s.server->active(); },
                   "Generation requests whose HTTP response has not ended.")
      .def_prop_ro("in_flight", [](const PyServer& s) { return s.server->in_flight(); },
                   "Generations in the engine (running or waiting).")
      .def_prop_ro("model_name", [](const PyServer& s) { return s.server->model_name(); })
      .def_prop_ro("kv_budget_bytes", [](const PyServer& s) { return s.server->kv_budget_bytes(); })
      .def_prop_ro("n_ctx", [](const PyServer& s) { return s.server->n_ctx(); });
}

}  // namespace vqpy
