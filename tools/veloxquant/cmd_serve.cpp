// veloxquant serve: an OpenAI-compatible HTTP server over the continuous-batching engine, with
// the budgeted compressed KV pool, the prefix cache on the codes and sessions saved to disk
// (src/server). SIGINT/SIGTERM: stop accepting, let requests in flight finish (cancel those still
// running after --shutdown-grace seconds, or at a second signal), exit 0.
#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "cli_checks.h"
#include "cli_device.h"
#include "cli_kv.h"
#include "cli_model.h"
#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "kvcache/factory.h"
#include "kvcache/kv_identity.h"
#include "kvcache/spec_syntax.h"
#include "model/calibrate.h"
#include "model/model.h"
#include "server/server.h"

namespace vq::cli {
namespace {

struct ServeOptions {
  std::string model, kv_cache = "fp16", calib, host = "127.0.0.1", device = "cpu", alias, session_dir = "sessions";
  int port = 8080, parallel = 8, batch = 512, n_ctx = 0, threads = 0, max_queue = 64, max_sessions = 64;
  double kv_budget_mib = 0, max_body_mib = 4, grace_s = 30;
  bool no_prefix_cache = false;
};

// Signals arrive in this thread only (blocked everywhere else). The first INT/TERM drains the
// server: new requests get 503, those in flight finish; a second signal, or the grace running
// out, cancels them. Once no response is active the socket closes and run() returns. USR1 (sent by
// the main thread at the end) ends this thread.
void signal_loop(HttpServer& server, Runner& runner, double grace_s) {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&set, s);
  int sig = 0;
  sigwait(&set, &sig);
  if (sig == SIGUSR1) return;
  std::fprintf(stderr, "veloxquant serve: %s: stopping (requests in flight finish; a second signal cancels them)\n",
               sig == SIGINT ? "SIGINT" : "SIGTERM");
  server.drain();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  const timespec tick{0, 50 * 1000 * 1000};
  bool cancelled = false;
  while (server.active() > 0) {
    const int s = sigtimedwait(&set, nullptr, &tick);
    if (s == SIGUSR1) return;
    if (!cancelled && (s == SIGINT || s == SIGTERM || std::chrono::steady_clock::now() > deadline)) {
      std::fprintf(stderr, "veloxquant serve: cancelling %lld requests\n", (long long)runner.in_flight());
      runner.cancel_all();
      cancelled = true;
    }
  }
  server.stop();
  sigwait(&set, &sig);  // the end (USR1); further INT/TERM change nothing now
  while (sig != SIGUSR1) sigwait(&set, &sig);
}

void run_serve(const ServeOptions& o) {
  VQ_CHECK(o.parallel >= 1 && o.parallel <= 1024, "--parallel: {} must be in 1..1024", o.parallel);
  VQ_CHECK(o.batch >= 1, "--batch-size: {} must be >= 1", o.batch);
  VQ_CHECK(o.max_queue >= 0, "--max-queue: {} must be >= 0", o.max_queue);
  VQ_CHECK(o.port >= 0 && o.port <= 65535, "--port: {} must be in 0..65535", o.port);
  VQ_CHECK(o.max_body_mib > 0, "--max-body: {} MiB must be > 0", o.max_body_mib);
  VQ_CHECK(o.max_sessions >= 0, "--max-sessions: {} must be >= 0", o.max_sessions);
  // Signals go to the signal thread only: block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a vanished client is a failed write, not the end of the process
  vq::set_num_threads(o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())));

  const KVCacheConfig kv_config = parse_kv_cache_spec(o.kv_cache);
  check_cache_flags(kv_config, o.calib);
  bool is_default = false;
  const std::string path = model_path_or_default(o.model, &is_default);
  const auto model = Model::load(path);
  VQ_CHECK(model->has_tokenizer(), "{}: the model has no tokenizer metadata; the server needs one", path);
  check_cache_fits_model(kv_config, *model, path);
  check_weights_finite(*model, path);
  const std::string calib = resolve_calibration(*model, path, is_default, kv_config, o.calib,
                                                [](const char* stage, int d, int t) {
                                                  std::fprintf(stderr, "\rcalibrating (first use): %s %d/%d   ", stage, d, t);
                                                  if (d == t) std::fprintf(stderr, "\n");
                                                });
  const KVSpec spec = make_checked_spec(kv_config, *model, calib, o.calib.empty());
  EngineOptions eo;
  eo.device = resolve_device(o.device);
  eo.kv_budget_bytes = eo.device == KVDevice::cuda
                           ? device_kv_budget_bytes(o.kv_budget_mib, device_weight_bytes_estimate(*model))
                           : kv_budget_bytes(o.kv_budget_mib);
  const bool prefix_cache = !o.no_prefix_cache && eo.device == KVDevice::cpu;
  if (eo.device == KVDevice::cuda && !o.no_prefix_cache)
    std::fprintf(stderr, "serve: the prefix cache and sessions work on the cpu's KV pool only: off on the device\n");
  eo.max_sequences = o.parallel;
  eo.max_step_tokens = o.batch;
  eo.n_ctx = o.n_ctx;
  eo.prefix_cache = prefix_cache;
  // The identity (model file, spec, calibration) roots the prefix cache's hash chains and names
  // session files; a store of the same spec without blocks gives the spec's shape.
  auto probe = make_kv_store(*model, spec, 0);
  const KVIdentity identity = kv_identity(*probe, path);
  probe.reset();
  eo.kv_identity = identity.combined();
  Engine engine(*model, spec, eo);
  Metrics metrics;
  Runner runner(engine, metrics, identity, o.session_dir, o.max_sessions);
  ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.max_queue = o.max_queue;
  so.max_body_bytes = size_t(o.max_body_mib * 1048576.0);
  std::string name = o.alias;
  if (name.empty()) {
    name = path.substr(path.find_last_of('/') + 1);
    if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  }
  so.model_name = name;
  HttpServer server(engine, runner, metrics, so);
  const int port = server.bind();
  std::thread signals([&] { signal_loop(server, runner, o.grace_s); });
  std::fprintf(stderr,
               "veloxquant serve: model %s, kv cache %s, budget %s, up to %d sequences, context %d, prefix cache %s\n"
               "veloxquant serve: listening on http://%s:%d\n",
               name.c_str(), spec.name().c_str(), mb(eo.kv_budget_bytes).c_str(), o.parallel, engine.options().n_ctx,
               eo.prefix_cache ? "on" : "off", o.host.c_str(), port);
  std::fflush(stderr);
  server.run();
  pthread_kill(signals.native_handle(), SIGUSR1);
  signals.join();
  std::fprintf(stderr, "veloxquant serve: stopped\n");
}

}  // namespace

void add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* c = app.add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, streaming, sessions)");
  c->add_option("-m,--model", o->model, "GGUF model file (default: SmolLM2-135M-Instruct, fetched on first use)");
  c->add_option("--kv-cache", o->kv_cache, cli::kv_cache_option_help())->capture_default_str();
  c->footer(kv_cache_spec_syntax());
  c->add_option("--calib", o->calib, "Calibration file for vecinfer (from `veloxquant calibrate`)");
  c->add_option("--kv-budget", o->kv_budget_mib, "KV pool budget in MiB (0: half of the available memory)")->capture_default_str();
  c->add_option("--parallel", o->parallel, "Sequences running at once")->capture_default_str();
  c->add_option("--max-queue", o->max_queue, "Requests waiting beyond the running ones before 429")->capture_default_str();
  c->add_option("-b,--batch-size", o->batch, "Tokens per engine step (decode tokens + prefill chunks)")->capture_default_str();
  c->add_option("-c,--ctx-size", o->n_ctx, "Context per sequence in tokens (0: the model's)")->capture_default_str();
  c->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  c->add_option("--host", o->host, "Address to listen on (loopback by default)")->capture_default_str();
  c->add_option("--port", o->port, "Port (0: any free one, printed at start)")->capture_default_str();
  c->add_option("--alias", o->alias, "Model id in the API (default: the file name)");
  c->add_option("--session-dir", o->session_dir, "Folder of saved sessions")->capture_default_str();
  c->add_option("--max-sessions", o->max_sessions, "Named sessions kept in memory at once")->capture_default_str();
  c->add_option("--max-body", o->max_body_mib, "Largest request body in MiB")->capture_default_str();
  c->add_option("--shutdown-grace", o->grace_s, "Seconds requests in flight get to finish at SIGINT/SIGTERM")->capture_default_str();
  add_device_option(c, o->device);
  c->add_flag("--no-prefix-cache", o->no_prefix_cache, "Do not cache prompt prefixes (nor keep sessions)");
  c->callback([o] { run_serve(*o); });
}

}  // namespace vq::cli
