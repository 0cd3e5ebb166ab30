// veloxquant serve: an OpenAI-compatible HTTP server over the continuous-batching engine, with
// the budgeted compressed KV pool, the prefix cache on the codes and sessions saved to disk. On the
// public API: veloxquant::Server (include/veloxquant/server.h) assembles the engine and the server
// (src/server); this file turns flags into its options and handles the signals. SIGINT/SIGTERM: stop accepting, let requests in flight finish (cancel those still
// running after --shutdown-grace seconds, or at a second signal), exit 0.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <memory>
#include <string>
#include <thread>

#include "cli_checks.h"
#include "cli_device.h"
#include "cli_kv.h"
#include "cli_model.h"
#include "commands.h"
#include "core/error.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"
#include "veloxquant/server.h"
#include "veloxquant/session.h"

namespace vq::cli {
namespace {

namespace vx = veloxquant;

struct ServeOptions {
  std::string model, kv_cache = "fp16", calib, host = "127.0.0.1", device = "cpu", alias, session_dir = "sessions";
  std::string api_key, api_key_file, allow_origin;
  int max_connections = 4096, max_per_client = 256, header_timeout_s = 10, body_timeout_s = 60;
  int port = 8080, parallel = 8, batch = 512, n_ctx = 0, threads = 0, max_queue = 64, max_sessions = 64;
  double kv_budget_mib = 0, max_body_mib = 4, grace_s = 30;
  bool no_prefix_cache = false;
  std::string kv_events, kv_events_replay, kv_events_topic;  // issue 24: vLLM-format KV events
  int kv_events_buffer = 10000;
  std::string prefix_store;  // redis://HOST:PORT: the shared compressed prefix store
  bool allow_longer_context = false;  // -c past the model's trained context
  bool session_dir_given = false;     // --session-dir on the command line (the default may be absent)
  bool deterministic = false;         // batch-invariant mode
  int tp = 1;                         // tensor-parallel ranks
};

// Signals arrive in this thread only (blocked everywhere else). The first INT/TERM drains the
// server: new requests get 503, those in flight finish; a second signal, or the grace running
// out, cancels them. Once no response is active the socket closes and run() returns. USR1 (sent by
// the main thread at the end) ends this thread.
void signal_loop(vx::Server& server, double grace_s) {
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
      std::fprintf(stderr, "veloxquant serve: cancelling %lld requests\n", (long long)server.in_flight());
      server.cancel_all();
      cancelled = true;
    }
  }
  server.stop();
  sigwait(&set, &sig);  // the end (USR1); further INT/TERM change nothing now
  while (sig != SIGUSR1) sigwait(&set, &sig);
}

// The API key: --api-key, else --api-key-file (its first line), else $VQ_API_KEY; "" for none.
std::string api_key_of(const ServeOptions& o) {
  VQ_CHECK(o.api_key.empty() || o.api_key_file.empty(), "--api-key and --api-key-file: give one of them");
  std::string key = o.api_key;
  if (!o.api_key_file.empty()) {
    std::ifstream f(o.api_key_file);
    VQ_CHECK(f.good(), "--api-key-file: cannot read {}", o.api_key_file);
    std::getline(f, key);
    while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t')) key.pop_back();
    VQ_CHECK(!key.empty(), "--api-key-file: {} holds no key on its first line", o.api_key_file);
  } else if (key.empty()) {
    if (const char* e = std::getenv("VQ_API_KEY")) key = e;
  }
  for (char c : key)
    VQ_CHECK(c > 0x20 && c < 0x7f, "the API key must be printable ASCII without spaces");
  return key;
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

void run_serve(const ServeOptions& o) {
  const std::string api_key = api_key_of(o);
  VQ_CHECK(o.max_connections >= 1, "--max-connections: {} must be >= 1", o.max_connections);
  VQ_CHECK(o.header_timeout_s >= 1 && o.header_timeout_s <= 3600, "--header-timeout: {} s must be in 1..3600",
           o.header_timeout_s);
  VQ_CHECK(o.body_timeout_s >= 1 && o.body_timeout_s <= 3600, "--body-timeout: {} s must be in 1..3600", o.body_timeout_s);
  VQ_CHECK(o.max_per_client >= 1, "--max-connections-per-client: {} must be >= 1", o.max_per_client);
  VQ_CHECK(o.allow_origin.find_first_of("\r\n") == std::string::npos, "--allow-origin: no line breaks");
  VQ_CHECK(o.parallel >= 1 && o.parallel <= 1024, "--parallel: {} must be in 1..1024", o.parallel);
  VQ_CHECK(o.batch >= 1, "--batch-size: {} must be >= 1", o.batch);
  VQ_CHECK(o.max_queue >= 0, "--max-queue: {} must be >= 0", o.max_queue);
  VQ_CHECK(o.port >= 0 && o.port <= 65535, "--port: {} must be in 0..65535", o.port);
  VQ_CHECK(o.max_body_mib > 0, "--max-body: {} MiB must be > 0", o.max_body_mib);
  VQ_CHECK(o.max_sessions >= 1 && o.max_sessions <= 1000000,
           "--max-sessions: {} must be in 1..1000000 (--no-prefix-cache keeps no sessions)", o.max_sessions);
  VQ_CHECK(std::isfinite(o.grace_s) && o.grace_s >= 0 && o.grace_s <= 86400,
           "--shutdown-grace: {} seconds must be in 0..86400", o.grace_s);
  VQ_CHECK(o.n_ctx >= 0 && o.n_ctx <= kMaxContextTokens, "-c: {} must be in 0..{} (0: the model's)", o.n_ctx,
           kMaxContextTokens);
  VQ_CHECK(o.threads >= 0 && o.threads <= 1024, "-t: {} must be in 0..1024", o.threads);
  VQ_CHECK(o.kv_budget_mib >= 0 && std::isfinite(o.kv_budget_mib), "--kv-budget: {} MiB must be >= 0",
           o.kv_budget_mib);
  if (!o.no_prefix_cache) check_session_dir(o.session_dir, o.session_dir_given);
  if (!o.kv_events.empty()) {
    VQ_CHECK(!o.no_prefix_cache, "--kv-events: the events are the prefix cache's blocks; --no-prefix-cache has none");
    vx::check_kv_events_endpoint(o.kv_events, "--kv-events");
    VQ_CHECK(o.kv_events_buffer >= 1 && o.kv_events_buffer <= 10000000, "--kv-events-buffer: {} must be in 1..10000000",
             o.kv_events_buffer);
  }
  VQ_CHECK(o.kv_events_replay.empty() || !o.kv_events.empty(), "--kv-events-replay needs --kv-events");
  if (!o.prefix_store.empty()) {
    VQ_CHECK(!o.no_prefix_cache, "--prefix-store: the store holds the prefix cache's points; --no-prefix-cache has none");
    vx::check_prefix_store_url(o.prefix_store, "--prefix-store");
  }
  if (!o.kv_events_replay.empty()) vx::check_kv_events_endpoint(o.kv_events_replay, "--kv-events-replay");
  VQ_CHECK(o.tp >= 1 && o.tp <= 1024, "--tp: {} must be in 1..1024", o.tp);
  VQ_CHECK(o.tp == 1 || o.prefix_store.empty(),
           "--tp {}: the shared prefix store (--prefix-store) holds unsplit points; not with tensor parallelism yet",
           o.tp);
  VQ_CHECK(o.tp == 1 || !o.deterministic, "--tp {}: --deterministic is not available with tensor parallelism", o.tp);
  // Signals go to the signal thread only: block them before any thread starts.
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGINT, SIGTERM, SIGUSR1}) sigaddset(&set, s);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Each connection is a descriptor: allow what --max-connections asks (up to the hard limit).
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rlim_t(o.max_connections) + 256) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, rlim_t(o.max_connections) + 256);
    setrlimit(RLIMIT_NOFILE, &rl);
  }  // a vanished client is a failed write, not the end of the process
  vx::set_num_threads(o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())));

  const KVCacheConfig kv_config = vx::parse_kv_cache_config(o.kv_cache);
  check_cache_flags(kv_config, o.calib);
  const std::string path = model_path_or_default(o.model);
  const vx::Model model = vx::Model::load(path);
  VQ_CHECK(model.has_tokenizer(), "{}: the model has no tokenizer metadata; the server needs one", path);
  check_cache_fits_model(kv_config, model.info().head_dim, path);
  model.check_weights_finite();
  if (o.n_ctx > 0) check_trained_context(o.n_ctx, model.info().n_ctx_train, o.allow_longer_context, "-c");
  const vx::KVSpec spec = kv_spec_for_model(model, kv_config, o.calib);
  warn_kv_quality(spec);
  if (o.tp > 1)
    std::fprintf(stderr, "tp %d: %s\n", o.tp, vx::check_tensor_parallel(model, o.tp, resolve_device(o.device)).c_str());
  vx::ServerOptions so;
  so.device = resolve_device(o.device);
  so.kv_budget_bytes = kv_budget_bytes(model, so.device, o.kv_budget_mib);
  check_kv_budget_holds_a_block(so.kv_budget_bytes, o.kv_budget_mib, vx::min_kv_budget_bytes(model, spec), spec.name());
  so.max_sequences = o.parallel;
  so.max_step_tokens = o.batch;
  so.n_ctx = o.n_ctx;
  so.deterministic = o.deterministic;
  so.tp = o.tp;
  so.prefix_cache = !o.no_prefix_cache;
  so.session_dir = o.session_dir;
  so.max_sessions = o.max_sessions;
  so.kv_events = o.kv_events;
  so.kv_events_replay = o.kv_events_replay;
  so.kv_events_topic = o.kv_events_topic;
  so.kv_events_buffer = o.kv_events_buffer;
  so.prefix_store = o.prefix_store;
  so.host = o.host;
  so.port = o.port;
  so.max_queue = o.max_queue;
  so.max_body_bytes = size_t(o.max_body_mib * 1048576.0);
  so.api_key = api_key;
  so.allow_origin = o.allow_origin;
  so.max_connections = o.max_connections;
  so.max_per_client = o.max_per_client;
  so.header_timeout_s = o.header_timeout_s;
  so.body_timeout_s = o.body_timeout_s;
  so.model_name = o.alias;
  vx::Server server(model, spec, so);
  if (server.removed_stale_session_files() > 0)
    std::fprintf(stderr, "veloxquant serve: removed %d temporary files of interrupted session saves\n",
                 server.removed_stale_session_files());
  const int port = server.bind();
  std::thread signals([&] { signal_loop(server, o.grace_s); });
  std::fprintf(stderr,
               "veloxquant serve: model %s, kv cache %s, budget %s, up to %d sequences, context %d, prefix cache %s\n"
               "veloxquant serve: listening on http://%s:%d\n",
               server.model_name().c_str(), spec.name().c_str(), mb(server.kv_budget_bytes()).c_str(), o.parallel,
               server.n_ctx(), server.prefix_cache() ? "on" : "off", o.host.c_str(), port);
  if (api_key.empty() && !is_loopback(o.host))
    std::fprintf(stderr,
                 "\n*** WARNING: veloxquant serve listens on %s, beyond this machine, WITHOUT an API key: anyone who\n"
                 "*** can reach port %d can run generations and save, restore or delete sessions. Give a key with\n"
                 "*** --api-key-file FILE (or --api-key KEY, or VQ_API_KEY) or listen on 127.0.0.1.\n\n",
                 o.host.c_str(), port);
  if (!api_key.empty()) std::fprintf(stderr, "veloxquant serve: API key required (all endpoints but /health)\n");
  if (server.prefix_store())
    std::fprintf(stderr, "veloxquant serve: shared prefix store %s (write-through of prefill points)\n",
                 o.prefix_store.c_str());
  if (server.kv_events())
    std::fprintf(stderr, "veloxquant serve: KV events on %s%s%s\n", o.kv_events.c_str(),
                 o.kv_events_replay.empty() ? "" : ", replay on ", o.kv_events_replay.c_str());
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
  c->footer(vx::kv_cache_spec_help());
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
  CLI::Option* session_dir = c->add_option("--session-dir", o->session_dir,
                                           "Folder of saved sessions (given: an existing writable directory)")
                                 ->capture_default_str();
  c->add_flag("--deterministic", o->deterministic,
              "Batch-invariant mode: a request's tokens do not depend on the requests running beside it "
              "(docs/DETERMINISM.md)");
  c->add_flag("--allow-longer-context", o->allow_longer_context,
              "-c past the model's trained context: a warning, not an error");
  c->add_option("--max-sessions", o->max_sessions, "Named sessions kept in memory at once")->capture_default_str();
  c->add_option("--max-body", o->max_body_mib, "Largest request body in MiB")->capture_default_str();
  c->add_option("--shutdown-grace", o->grace_s, "Seconds requests in flight get to finish at SIGINT/SIGTERM")->capture_default_str();
  c->add_option("--api-key", o->api_key, "Require `Authorization: Bearer KEY` (all endpoints but /health); also $VQ_API_KEY");
  c->add_option("--api-key-file", o->api_key_file, "Read the API key from the first line of this file");
  c->add_option("--allow-origin", o->allow_origin, "Enable CORS for this origin (e.g. https://app.example, or *); off by default");
  c->add_option("--max-connections", o->max_connections, "Open connections at once, in total")->capture_default_str();
  c->add_option("--max-connections-per-client", o->max_per_client, "Open connections at once from one address")
      ->capture_default_str();
  c->add_option("--header-timeout", o->header_timeout_s, "Seconds a request's whole head (line and headers) may take")
      ->capture_default_str();
  c->add_option("--body-timeout", o->body_timeout_s, "Seconds a request's whole body may take")->capture_default_str();
  add_device_option(c, o->device);
  c->add_option("--tp", o->tp,
                "Tensor-parallel ranks: the model and every sequence's KV split by attention heads and MLP columns "
                "(cpu: ranks simulated in turn; cuda: one rank per GPU over NCCL, or every rank on GPU 0 when the "
                "host has fewer GPUs; docs/TENSOR_PARALLEL.md)")
      ->capture_default_str();
  c->add_flag("--no-prefix-cache", o->no_prefix_cache, "Do not cache prompt prefixes (nor keep sessions)");
  c->add_option("--kv-events", o->kv_events,
                "Publish the prefix cache's block events in vLLM's format (ZMQ PUB of msgpack KVEventBatch) on this "
                "endpoint: tcp://*:5557 binds, tcp://HOST:PORT connects (as vLLM)");
  c->add_option("--kv-events-replay", o->kv_events_replay,
                "Bind a ROUTER socket answering replay requests (8-byte big-endian start sequence) here, e.g. "
                "tcp://127.0.0.1:5558");
  c->add_option("--kv-events-topic", o->kv_events_topic, "Topic frame of each KV event message (default: empty)");
  c->add_option("--kv-events-buffer", o->kv_events_buffer, "Event batches kept for replay")->capture_default_str();
  c->add_option("--prefix-store", o->prefix_store,
                "Shared compressed prefix store, redis://HOST:PORT: prefill points written through, fetched on a local "
                "miss (checked; a store that is down means local caching only)");
  c->callback([o, session_dir] {
    o->session_dir_given = session_dir->count() > 0;
    run_serve(*o);
  });
}

}  // namespace vq::cli
