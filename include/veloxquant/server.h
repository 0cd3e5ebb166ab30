#pragma once
// Server: the OpenAI-compatible HTTP server (completions, chat, streaming, named sessions,
// metrics) over one model and KV spec, as `veloxquant serve` runs it. It assembles what the
// internals need: a continuous-batching engine on the chosen device, its prefix cache on the codes
// with sessions saved to disk, the identity (model file, spec, calibration) that roots the prefix
// cache's hashes and names session files, and, when asked, vLLM-format KV events and a shared
// compressed prefix store (docs/SERVER.md). The server code itself stays internal (src/server).
// Threads: construct, bind() and run() on one thread; drain(), stop(), cancel_all(), active()
// and in_flight() from any other (e.g. a signal-handling thread). Every error is a vq::Error.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"

namespace veloxquant {

struct ServerOptions {
  // The engine.
  Device device = Device::cpu;   // where the model runs and the KV pool lives
  size_t kv_budget_bytes = 0;    // the pool's budget; 0: default_kv_budget_bytes(model, device)
  int max_sequences = 8;         // running at once
  int max_step_tokens = 512;     // rows per engine step (decode tokens + prefill chunks)
  int n_ctx = 0;                 // positions per sequence; 0: the model's training context
  bool deterministic = false;    // batch-invariant mode (EngineOptions::deterministic)
  int tp = 1;                    // tensor-parallel ranks (EngineOptions::tp); not with prefix_store
  // The prefix cache and the named sessions (on either device's pool).
  bool prefix_cache = true;
  std::string session_dir = "sessions";  // made at the first save when absent
  int max_sessions = 64;                 // named sessions kept in memory at once
  // KV events (vLLM's format, ZMQ PUB of msgpack batches) of the prefix cache's blocks; "": none.
  std::string kv_events;         // tcp://*:PORT binds, tcp://HOST:PORT connects
  std::string kv_events_replay;  // a ROUTER endpoint answering replay requests (needs kv_events)
  std::string kv_events_topic;
  int kv_events_buffer = 10000;  // event batches kept for replay
  std::string prefix_store;      // redis://HOST[:PORT]: the shared compressed prefix store; "": none
  // HTTP.
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free one (bind() returns it)
  int max_queue = 64;            // requests waiting beyond the running ones before 429
  size_t max_body_bytes = size_t(4) << 20;
  std::string api_key;           // "": none; else `Authorization: Bearer KEY` (all but /health)
  std::string allow_origin;      // CORS origin; "": off
  int max_connections = 4096, max_per_client = 256;
  int header_timeout_s = 10, body_timeout_s = 60;
  std::string model_name;        // the model id in the API; "": the file's name without ".gguf"
};

// Checks of the endpoint strings without any work, for a caller to fail before loading a model;
// `what` names the option in the message ("<what>: 'foo' is not a ZMQ endpoint ...").
void check_kv_events_endpoint(const std::string& endpoint, const std::string& what);
void check_prefix_store_url(const std::string& url, const std::string& what);

class Server {
 public:
  // Checks the options (each error naming the ServerOptions field), builds the engine and what
  // hangs on it, and removes temporary files of session saves a killed server left in session_dir.
  // Nothing listens yet.
  Server(const Model& model, const KVSpec& spec, const ServerOptions& opt);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int bind();               // binds host:port; returns the port; throws naming them on failure
  void run();               // serves until stop(); returns once every connection has ended
  void drain();             // new generation requests get 503 from now on; those in flight go on
  void stop();              // closes the socket; run() returns
  void cancel_all();        // ends every running and waiting generation
  int64_t active() const;   // generation requests whose HTTP response has not ended
  int64_t in_flight() const;  // generations in the engine (running or waiting)

  // What it runs with (for a start-up banner).
  const std::string& model_name() const;
  size_t kv_budget_bytes() const;
  size_t min_budget_bytes() const;  // one block of every form per layer: less and nothing runs
  int n_ctx() const;
  bool prefix_cache() const;         // on (ServerOptions::prefix_cache)
  bool kv_events() const;            // publishing
  bool prefix_store() const;         // writing through to a shared store
  int removed_stale_session_files() const;  // at construction

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace veloxquant
