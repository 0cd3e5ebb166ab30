// veloxquant::Server over src/server: the engine, its prefix cache, the KV identity, the KV events
// publisher, the shared prefix store, the request runner and the HTTP server, assembled in one
// place (what `veloxquant serve` used to put together itself).
#include <cmath>

#include "api/impl.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/session.h"
#include "kvcache/kv_identity.h"
#include "kvcache/seq_file_format.h"
#include "server/kv_events.h"
#include "server/prefix_store.h"
#include "server/server.h"
#include "veloxquant/server.h"
#include "veloxquant/session.h"

namespace veloxquant {

void check_kv_events_endpoint(const std::string& endpoint, const std::string& what) {
  vq::check_kv_events_endpoint(endpoint, what.c_str());
}

void check_prefix_store_url(const std::string& url, const std::string& what) {
  vq::PrefixStoreOptions o;
  vq::parse_prefix_store_url(url, o, what.c_str());
}

namespace {

void check_options(const ServerOptions& o) {
  VQ_CHECK(o.max_sequences >= 1 && o.max_sequences <= 1024, "server: max_sequences {} must be in 1..1024",
           o.max_sequences);
  VQ_CHECK(o.max_step_tokens >= 1, "server: max_step_tokens {} must be >= 1", o.max_step_tokens);
  VQ_CHECK(o.n_ctx >= 0, "server: n_ctx {} must be >= 0", o.n_ctx);
  VQ_CHECK(o.max_queue >= 0, "server: max_queue {} must be >= 0", o.max_queue);
  VQ_CHECK(o.port >= 0 && o.port <= 65535, "server: port {} must be in 0..65535", o.port);
  VQ_CHECK(o.max_body_bytes > 0, "server: max_body_bytes must be > 0");
  VQ_CHECK(o.max_sessions >= 1 && o.max_sessions <= 1000000, "server: max_sessions {} must be in 1..1000000",
           o.max_sessions);
  VQ_CHECK(o.max_connections >= 1 && o.max_per_client >= 1,
           "server: max_connections {} and max_per_client {} must be >= 1", o.max_connections, o.max_per_client);
  VQ_CHECK(o.header_timeout_s >= 1 && o.header_timeout_s <= 3600 && o.body_timeout_s >= 1 && o.body_timeout_s <= 3600,
           "server: header_timeout_s {} and body_timeout_s {} must be in 1..3600", o.header_timeout_s,
           o.body_timeout_s);
  VQ_CHECK(o.allow_origin.find_first_of("\r\n") == std::string::npos, "server: allow_origin holds a line break");
  for (char c : o.api_key) VQ_CHECK(c > 0x20 && c < 0x7f, "server: the api_key must be printable ASCII without spaces");
  if (!o.kv_events.empty()) {
    VQ_CHECK(o.prefix_cache, "server: kv_events are the prefix cache's blocks; prefix_cache is off");
    check_kv_events_endpoint(o.kv_events, "server: kv_events");
    VQ_CHECK(o.kv_events_buffer >= 1 && o.kv_events_buffer <= 10000000,
             "server: kv_events_buffer {} must be in 1..10000000", o.kv_events_buffer);
  }
  VQ_CHECK(o.kv_events_replay.empty() || !o.kv_events.empty(), "server: kv_events_replay needs kv_events");
  if (!o.kv_events_replay.empty()) check_kv_events_endpoint(o.kv_events_replay, "server: kv_events_replay");
  if (!o.prefix_store.empty()) {
    VQ_CHECK(o.prefix_cache, "server: the prefix_store holds the prefix cache's points; prefix_cache is off");
    check_prefix_store_url(o.prefix_store, "server: prefix_store");
  }
  VQ_CHECK(o.tp >= 1 && o.tp <= 1024, "server: tp {} must be in 1..1024", o.tp);
  VQ_CHECK(o.tp == 1 || o.prefix_store.empty(),
           "server: tp {}: the shared prefix store holds unsplit points; it is not available with tensor parallelism",
           o.tp);
  VQ_CHECK(o.tp == 1 || !o.deterministic,
           "server: tp {}: the deterministic mode is not available with tensor parallelism", o.tp);
}

std::string model_name_of(const ServerOptions& o, const std::string& path) {
  if (!o.model_name.empty()) return o.model_name;
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.substr(name.size() - 5) == ".gguf") name.resize(name.size() - 5);
  return name;
}

}  // namespace

// Members in the order they are built; destroyed in reverse: the HTTP server and the runner go
// before the prefix cache's observers, which go before the engine (and its cache).
struct Server::Impl {
  Impl(const Model& m, const KVSpec& s) : model(m), spec(s) {}
  Model model;
  KVSpec spec;
  std::string name;
  size_t min_budget = 0;
  int removed_temps = 0;
  vq::PrefixStore* store_ptr = nullptr;  // the write-through hook reaches the store through this
  std::unique_ptr<vq::Engine> engine;
  vq::Metrics metrics;
  std::unique_ptr<vq::KVEventPublisher> kv_events;
  vq::PrefixCacheFanout prefix_listeners;
  std::unique_ptr<vq::PrefixStore> store;
  std::unique_ptr<vq::Runner> runner;
  std::unique_ptr<vq::HttpServer> http;
};

Server::Server(const Model& model, const KVSpec& spec, const ServerOptions& o) : impl_(new Impl(model, spec)) {
  check_options(o);
  VQ_CHECK(model.has_tokenizer(), "{}: the model has no tokenizer metadata; the server needs one", model.info().path);
  check_spec_fits(spec, model);
  Impl& m = *impl_;
  m.name = model_name_of(o, model.info().path);
  const vq::Model& vm = ApiAccess::model(model);
  const vq::KVSpec& vs = ApiAccess::spec(spec);
  vq::EngineOptions eo;
  eo.device = to_internal(o.device);
  eo.kv_budget_bytes = o.kv_budget_bytes > 0 ? o.kv_budget_bytes : default_kv_budget_bytes(model, o.device);
  eo.max_sequences = o.max_sequences;
  eo.max_step_tokens = o.max_step_tokens;
  eo.n_ctx = o.n_ctx;
  eo.deterministic = o.deterministic;
  eo.prefix_cache = o.prefix_cache;
  eo.tp = o.tp;
  if (o.tp > 1) check_tensor_parallel(model, o.tp, o.device);
  // The identity (model file, spec, calibration) roots the prefix cache's hash chains and names
  // session files; a store of the spec without blocks gives the spec's shape.
  vq::KVIdentity identity;
  {
    auto probe = vq::make_kv_store(vm, vs, 0);
    m.min_budget = veloxquant::min_budget_bytes(*probe);
    identity = vq::kv_identity(*probe, model.info().path);
  }
  VQ_CHECK(eo.kv_budget_bytes >= m.min_budget,
           "server: kv_budget_bytes {} cannot hold one block per layer of the {} cache ({} bytes)", eo.kv_budget_bytes,
           spec.name(), m.min_budget);
  eo.kv_identity = identity.combined();
  vq::PrefixStoreOptions store_opt;
  const bool with_store = !o.prefix_store.empty() && eo.prefix_cache;
  if (with_store) {
    vq::parse_prefix_store_url(o.prefix_store, store_opt, "server: prefix_store");
    eo.on_prefill_point = [&m](const int32_t* tokens, int64_t n, const vq::SeqKV& s) {
      if (m.store_ptr) m.store_ptr->offer(tokens, n, s);
    };
  }
  m.engine = std::make_unique<vq::Engine>(vm, vs, eo);
  if (!o.kv_events.empty() && m.engine->prefix_cache()) {
    vq::KVEventsOptions ko;
    ko.endpoint = o.kv_events;
    ko.replay_endpoint = o.kv_events_replay;
    ko.topic = o.kv_events_topic;
    ko.buffer_batches = o.kv_events_buffer;
    m.kv_events = std::make_unique<vq::KVEventPublisher>(ko);
    m.prefix_listeners.add(m.kv_events.get());
  }
  if (with_store && m.engine->prefix_cache()) {
    m.store = std::make_unique<vq::PrefixStore>(store_opt, m.engine->kv(), identity);
    m.store_ptr = m.store.get();
    m.prefix_listeners.add(m.store_ptr);
    m.metrics.set_extra([&m] { return m.store->render_metrics(); });
  }
  if (!m.prefix_listeners.empty()) m.engine->prefix_cache()->set_listener(&m.prefix_listeners);
  // Temporary files of saves a killed server left behind (their process is gone) go now.
  if (eo.prefix_cache) m.removed_temps = vq::remove_stale_session_temps(o.session_dir);
  m.runner = std::make_unique<vq::Runner>(*m.engine, m.metrics, identity, o.session_dir, o.max_sessions);
  m.runner->set_prefix_store(m.store_ptr);
  vq::ServerOptions so;
  so.host = o.host;
  so.port = o.port;
  so.max_queue = o.max_queue;
  so.max_body_bytes = o.max_body_bytes;
  so.api_key = o.api_key;
  so.allow_origin = o.allow_origin;
  so.max_connections = o.max_connections;
  so.max_per_client = o.max_per_client;
  so.head_timeout_s = o.header_timeout_s;
  so.body_timeout_s = o.body_timeout_s;
  so.model_name = m.name;
  m.http = std::make_unique<vq::HttpServer>(*m.engine, *m.runner, m.metrics, so);
}

Server::~Server() = default;

int Server::bind() { return impl_->http->bind(); }
void Server::run() { impl_->http->run(); }
void Server::drain() { impl_->http->drain(); }
void Server::stop() { impl_->http->stop(); }
void Server::cancel_all() { impl_->runner->cancel_all(); }
int64_t Server::active() const { return impl_->http->active(); }
int64_t Server::in_flight() const { return impl_->runner->in_flight(); }

const std::string& Server::model_name() const { return impl_->name; }
size_t Server::kv_budget_bytes() const { return impl_->engine->options().kv_budget_bytes; }
size_t Server::min_budget_bytes() const { return impl_->min_budget; }
int Server::n_ctx() const { return impl_->engine->options().n_ctx; }
bool Server::prefix_cache() const { return impl_->engine->prefix_cache() != nullptr; }
bool Server::kv_events() const { return impl_->kv_events != nullptr; }
bool Server::prefix_store() const { return impl_->store != nullptr; }
int Server::removed_stale_session_files() const { return impl_->removed_temps; }

}  // namespace veloxquant
