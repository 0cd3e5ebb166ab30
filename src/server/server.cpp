#include "server/server.h"

#include <atomic>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/model.h"
#include "server/http.h"
#include "server/logprobs.h"

namespace vq {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(http::Response& res, int status, const std::string& msg, const std::string& type = "",
                const std::string& param = "") {
  res.status = status;
  res.set_content(error_body(status, msg, type, param), "application/json");
}

// Equal strings, in time that depends on their lengths only (an API key check).
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// The media type of a Content-Type value (before any parameter), lowercased and trimmed.
std::string media_type(const std::string* v) {
  if (!v) return "";
  std::string t = v->substr(0, v->find(';'));
  while (!t.empty() && (t.back() == ' ' || t.back() == '\t')) t.pop_back();
  size_t i = 0;
  while (i < t.size() && (t[i] == ' ' || t[i] == '\t')) ++i;
  t.erase(0, i);
  for (char& c : t) c = char(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

// A message for clients: every occurrence of a server-side folder replaced by nothing, so that
// "cannot open /srv/x/sessions/a.vqkv" reads "cannot open a.vqkv".
std::string without_dir(std::string msg, const std::string& dir) {
  if (dir.empty()) return msg;
  for (const std::string& d : {dir + "/", dir}) {
    for (size_t at = msg.find(d); at != std::string::npos; at = msg.find(d, at)) msg.erase(at, d.size());
  }
  // Any other absolute path (a word starting with '/' holding another '/'): its last part only.
  std::string out;
  for (size_t i = 0; i < msg.size();) {
    const bool word_start = i == 0 || msg[i - 1] == ' ' || msg[i - 1] == '\'' || msg[i - 1] == '"' || msg[i - 1] == '(';
    if (msg[i] == '/' && word_start) {
      size_t e = i;
      while (e < msg.size() && msg[e] != ' ' && msg[e] != '\'' && msg[e] != '"' && msg[e] != ':' && msg[e] != ')' &&
             msg[e] != ',')
        ++e;
      const std::string w = msg.substr(i, e - i);
      const size_t last = w.find_last_of('/');
      out += last > 0 ? w.substr(last + 1) : w;
      i = e;
    } else {
      out += msg[i++];
    }
  }
  return out;
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Metrics label of a path: its route, without ids.
std::string endpoint_of(const std::string& path) {
  for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics", "/model_info",
                        "/get_model_info", "/server_info", "/get_server_info"})
    if (path == p) return p;
  if (path.rfind("/v1/sessions", 0) == 0) return "/v1/sessions";
  return "other";
}

}  // namespace

struct HttpServer::Impl {
  Engine& engine;
  Runner& runner;
  Metrics& metrics;
  ServerOptions opt;
  std::unique_ptr<http::Server> svr;
  int64_t max_fit_tokens = 0;  // the most tokens one sequence's KV can hold within the pool's budget
  std::atomic<bool> draining{false};
  std::atomic<int64_t> active{0};  // generation responses not ended yet
  std::atomic<int64_t> next_id{0};
  int n_ctx = 0;

  Impl(Engine& e, Runner& r, Metrics& m, const ServerOptions& o) : engine(e), runner(r), metrics(m), opt(o) {
    metrics.set_model_name(opt.model_name);
    n_ctx = e.options().n_ctx;
    max_fit_tokens = fit_tokens();
    svr = make_http();
  }

  // The most tokens a lone sequence's KV can take within the pool's budget (the engine ends a
  // sequence that outgrows the whole pool with an error mid-stream: refuse those up front).
  int64_t fit_tokens() {
    int64_t best = 0;
    runner.call([&] {
      KVStore& kv = engine.kv();
      const size_t budget = kv.pool().budget_bytes();
      SeqKV s = kv.new_sequence();
      auto bytes = [&](int64_t n) {
        std::vector<int64_t> counts(size_t(kv.pool().n_arenas()), 0);
        kv.blocks_for_append(s, n, counts);
        return kv.pool().bytes_of(counts);
      };
      int64_t lo = 0, hi = std::max<int64_t>(1, n_ctx);
      if (bytes(hi) <= budget) {
        lo = hi;
      } else {
        while (hi - lo > 1) {  // bytes(lo) fits, bytes(hi) does not
          const int64_t mid = lo + (hi - lo) / 2;
          (bytes(mid) <= budget ? lo : hi) = mid;
        }
      }
      kv.release(s);
      best = lo;
    });
    return best;
  }

  json usage(const Channel& c) const {
    const int64_t p = int64_t(c.params.prompt.size()), g = int64_t(c.tokens.size());
    return {{"prompt_tokens", p}, {"completion_tokens", g}, {"total_tokens", p + g}};
  }

  // One streamed chunk's JSON (completion or chat), with text and an optional finish reason.
  json chunk(const Channel& c, const std::string& id, int64_t created, const std::string& text, bool first,
             const char* finish, json logprobs = nullptr) const {
    json choice = {{"index", 0}, {"finish_reason", finish ? json(finish) : json()}};
    if (c.params.chat) {
      json delta = json::object();
      if (first) delta["role"] = "assistant";
      if (!text.empty() || first) delta["content"] = text;
      choice["delta"] = delta;
    } else {
      choice["text"] = text;
    }
    choice["logprobs"] = std::move(logprobs);
    return {{"id", id},
            {"object", c.params.chat ? "chat.completion.chunk" : "text_completion"},
            {"created", created},
            {"model", opt.model_name},
            {"choices", json::array({choice})}};
  }

  // Counts a generation response as active until it ends (a stream: its releaser, called when
  // httplib drops the response).
  struct ActiveGuard {
    std::atomic<int64_t>& n;
    bool armed = true;
    explicit ActiveGuard(std::atomic<int64_t>& c) : n(c) { ++n; }
    ~ActiveGuard() {
      if (armed) --n;
    }
  };

  void generate(const http::Request& req, http::Response& res, bool chat) {
    const auto arrived = Clock::now();
    ActiveGuard guard(active);
    if (draining) return send_error(res, 503, "the server is shutting down", "server_busy");
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::exception& e) {
      return send_error(res, 400, std::string("malformed JSON: ") + e.what());
    }
    GenParams p;
    try {
      ApiLimits lim;
      lim.n_ctx = n_ctx;
      p = parse_generation(body, chat, engine.model(), lim);
      if (!p.session.empty() && !engine.options().prefix_cache)
        throw ApiError(400, "'session' needs the prefix cache (the server runs with --no-prefix-cache)", "session");
    } catch (const ApiError& e) {
      return send_error(res, e.status, e.what(), e.type, e.param);
    } catch (const Error& e) {
      return send_error(res, 400, e.what());  // e.g. a tokenizer refusing the text
    }
    const int64_t need = int64_t(p.prompt.size()) + p.max_tokens;
    if (need > max_fit_tokens)
      return send_error(res, 400,
                        "this request needs the KV of " + std::to_string(need) + " tokens (prompt " +
                            std::to_string(p.prompt.size()) + " + max_tokens " + std::to_string(p.max_tokens) +
                            ") but the server's KV budget holds at most " + std::to_string(max_fit_tokens) +
                            " tokens for one sequence: shorten the prompt or lower max_tokens",
                        "", int64_t(p.prompt.size()) >= max_fit_tokens ? (chat ? "messages" : "prompt") : "max_tokens");
    if (runner.in_flight() >= int64_t(engine.options().max_sequences) + opt.max_queue) {
      res.set_header("Retry-After", "1");
      return send_error(res, 429, "too many requests in flight; retry later", "rate_limit_error");
    }
    const bool stream = p.stream;
    std::shared_ptr<Channel> ch = runner.submit(std::move(p), arrived);
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id++);
    const int64_t created = unix_now();
    if (!stream) return finish_plain(res, *ch, id, created);
    res.set_header("Cache-Control", "no-cache");
    auto st = std::make_shared<StreamState>();
    guard.armed = false;  // the releaser below ends it
    res.content_type = "text/event-stream";
    res.step = [this, ch, id, created, st](http::Sink& sink) { return stream_step(*ch, sink, id, created, *st); };
    res.release = [this, ch](bool) {
          bool done;
          {
            std::lock_guard<std::mutex> lock(ch->mu);
            done = ch->done;
          }
          if (!done) runner.cancel(*ch);  // the client went away
          --active;
        };
  }

  struct StreamState {
    bool first = true;
    size_t lp_sent = 0, text_bytes = 0;  // logprob entries and text bytes sent so far
  };

  // Waits for news (up to 1 s), sends it; false ends the response (and cancels an unfinished one).
  bool stream_step(Channel& c, http::Sink& sink, const std::string& id, int64_t created, StreamState& st) {
    std::string text;
    bool done;
    json lp;
    {
      std::unique_lock<std::mutex> lock(c.mu);
      c.cv.wait_for(lock, std::chrono::seconds(1), [&] { return c.done || !c.text.empty(); });
      text.swap(c.text);
      done = c.done;
      // The tokens generated since the last chunk (text may lag them: held-back bytes).
      if (c.params.logprobs >= 0 && (!text.empty() || done) && st.lp_sent < c.logprobs.size()) {
        lp = logprobs_json(c.logprobs, st.lp_sent, c.logprobs.size(), engine.model().tokenizer(), c.params.chat,
                           st.text_bytes);
        st.lp_sent = c.logprobs.size();
      }
    }
    st.text_bytes += text.size();
    auto send = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
    auto event = [&](const json& j) { return send("data: " + dump(j) + "\n\n"); };
    const bool first = st.first;
    if (!text.empty() || !lp.is_null() || (first && (done || c.params.chat))) {
      if (!event(chunk(c, id, created, text, first, nullptr, lp))) return false;
      st.first = false;
    } else if (!done) {
      return send(": keep-alive\n\n");  // finds a vanished client while waiting
    }
    if (!done) return true;
    if (c.finish_reason == "error" || c.finish_reason == "cancelled") {
      const std::string msg = c.finish_reason == "error" ? c.result.error : "the request was cancelled (server stopping)";
      event(json::parse(error_body(c.finish_reason == "error" ? 400 : 503, msg)));
    } else {
      if (!event(chunk(c, id, created, "", false, c.finish_reason.c_str()))) return false;
      if (c.params.include_usage) {
        json u = chunk(c, id, created, "", false, nullptr);
        u["choices"] = json::array();
        u["usage"] = usage(c);
        if (!event(u)) return false;
      }
    }
    send("data: [DONE]\n\n");
    sink.done = true;
    return true;
  }

  void finish_plain(http::Response& res, Channel& c, const std::string& id, int64_t created) {
    {
      std::unique_lock<std::mutex> lock(c.mu);
      c.cv.wait(lock, [&] { return c.done; });
    }
    if (c.finish_reason == "error") return send_error(res, 400, c.result.error);
    if (c.finish_reason == "cancelled") return send_error(res, 503, "the request was cancelled (server stopping)", "server_busy");
    json choice = {{"index", 0}, {"finish_reason", c.finish_reason}, {"logprobs", nullptr}};
    if (c.params.logprobs >= 0)
      choice["logprobs"] = logprobs_json(c.logprobs, 0, c.logprobs.size(), engine.model().tokenizer(), c.params.chat, 0);
    if (c.params.chat) choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    else choice["text"] = c.text;
    if (c.params.return_token_ids) choice["token_ids"] = c.tokens;
    const json out = {{"id", id},
                      {"object", c.params.chat ? "chat.completion" : "text_completion"},
                      {"created", created},
                      {"model", opt.model_name},
                      {"choices", json::array({choice})},
                      {"usage", usage(c)}};
    res.set_content(dump(out), "application/json");
  }

  void session_op(const std::string& name, http::Response& res, const std::string& op) {
    if (!valid_session_name(name))
      return send_error(res, 400, "session ids are 1..64 characters of [A-Za-z0-9_.-], not starting with '.'", "", "id");
    const std::string& dir = runner.session_dir();
    try {
      if (op == "delete") {
        runner.delete_session(name);
        return res.set_content(dump({{"id", name}, {"deleted", true}}), "application/json");
      }
      const SessionInfo s = op == "save" ? runner.save_session(name) : runner.restore_session(name);
      res.set_content(dump({{"id", s.name}, {"n_tokens", s.n_tokens}, {"n_kv", s.n_kv}, {op == "save" ? "saved" : "restored", true}}),
                      "application/json");
    } catch (const ApiError& e) {
      send_error(res, e.status, without_dir(e.what(), dir), e.type, e.param);
    } catch (const std::exception& e) {
      send_error(res, 500, "session '" + name + "': " + without_dir(e.what(), dir));
    }
  }

  // CORS: only with --allow-origin, and only for that origin (or any with "*").
  void cors(const http::Request& q, http::Response& r) const {
    if (opt.allow_origin.empty()) return;
    const std::string* origin = q.header("Origin");
    if (!origin) return;
    if (opt.allow_origin != "*" && *origin != opt.allow_origin) return;
    r.set_header("Access-Control-Allow-Origin", opt.allow_origin == "*" ? "*" : *origin);
    if (opt.allow_origin != "*") r.set_header("Vary", "Origin");
  }

  void handle(const http::Request& q, http::Response& r) {
    cors(q, r);
    const std::string& path = q.path;
    if (q.method == "OPTIONS") {
      if (opt.allow_origin.empty() || r.headers.empty())
        return send_error(r, 405, "OPTIONS: cross-origin requests are not enabled (start the server with --allow-origin)");
      r.status = 204;
      r.content_type.clear();
      r.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      r.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      r.set_header("Access-Control-Max-Age", "600");
      return;
    }
    if (!opt.api_key.empty() && path != "/health") {
      const std::string* auth = q.header("Authorization");
      const std::string prefix = "Bearer ";
      const bool ok = auth && auth->size() > prefix.size() && auth->compare(0, prefix.size(), prefix) == 0 &&
                      same_secret(auth->substr(prefix.size()), opt.api_key);
      if (!ok) {
        r.set_header("WWW-Authenticate", "Bearer");
        r.status = 401;
        r.set_content(dump({{"error",
                             {{"message", auth ? "invalid API key (send Authorization: Bearer <key>)"
                                               : "an API key is needed: send Authorization: Bearer <key>"},
                              {"type", "invalid_request_error"},
                              {"param", nullptr},
                              {"code", "invalid_api_key"}}}}),
                      "application/json");
        return;
      }
    }
    if (q.method == "POST" && media_type(q.header("Content-Type")) != "application/json")
      return send_error(r, 415, "POST bodies must be sent with Content-Type: application/json");
    auto method_is = [&](const char* m) {
      if (q.method == m) return true;
      send_error(r, 405, "method " + q.method + " is not allowed on " + path);
      return false;
    };
    if (path == "/v1/completions") {
      if (method_is("POST")) generate(q, r, false);
    } else if (path == "/v1/chat/completions") {
      if (method_is("POST")) generate(q, r, true);
    } else if (path == "/v1/models") {
      if (!method_is("GET")) return;
      const json m = {{"id", opt.model_name}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "veloxquant"}};
      r.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
    } else if (path == "/model_info" || path == "/get_model_info") {
      // What SGLang's router asks a worker at registration (issue 24), in SGLang's field names.
      if (!method_is("GET")) return;
      r.set_content(dump({{"model_path", opt.model_name}, {"is_generation", true}, {"has_image_understanding", false},
                          {"has_audio_understanding", false}}),
                    "application/json");
    } else if (path == "/server_info" || path == "/get_server_info") {
      if (!method_is("GET")) return;
      const EngineStats es = engine.stats();
      r.set_content(dump({{"served_model_name", opt.model_name},
                          {"dp_size", 1},
                          {"tp_size", 1},
                          {"context_length", n_ctx},
                          {"max_running_requests", engine.options().max_sequences},
                          {"kv_pool_budget_bytes", es.pool_budget_bytes},
                          {"kv_pool_used_bytes", es.pool_used_bytes},
                          {"engine", "veloxquant"}}),
                    "application/json");
    } else if (path == "/health") {
      if (!method_is("GET")) return;
      r.status = draining ? 503 : 200;
      r.set_content(dump({{"status", draining ? "stopping" : "ok"}}), "application/json");
    } else if (path == "/metrics") {
      if (!method_is("GET")) return;
      r.set_content(metrics.render(engine.stats()), "text/plain; version=0.0.4");
    } else if (path == "/v1/sessions") {
      if (!method_is("GET")) return;
      json list = json::array();
      for (const SessionInfo& s : runner.sessions()) list.push_back({{"id", s.name}, {"n_tokens", s.n_tokens}, {"n_kv", s.n_kv}});
      r.set_content(dump({{"object", "list"}, {"data", list}}), "application/json");
    } else if (path.rfind("/v1/sessions/", 0) == 0) {
      std::string rest = path.substr(13);
      const size_t slash = rest.find('/');
      const std::string id = rest.substr(0, slash), op = slash == std::string::npos ? "" : rest.substr(slash + 1);
      if (op.empty()) {
        if (method_is("DELETE")) session_op(id, r, "delete");
      } else if (op == "save" || op == "restore") {
        if (method_is("POST")) session_op(id, r, op);
      } else {
        send_error(r, 404, "no such endpoint");
      }
    } else {
      send_error(r, 404, "no such endpoint");
    }
  }

  http::ServerLimits limits() const {
    http::ServerLimits l;
    l.request.max_body_bytes = opt.max_body_bytes;
    l.keep_alive_s = opt.keep_alive_s;
    l.head_timeout_s = opt.head_timeout_s;
    l.body_timeout_s = opt.body_timeout_s;
    l.max_connections = opt.max_connections;
    l.max_per_client = opt.max_per_client;
    l.backlog = std::max(128, opt.max_connections);
    l.max_buffered_bytes = std::max(size_t(256) << 20, 4 * opt.max_body_bytes);
    // A thread per request that may be in flight, plus a few for 429s, health and metrics;
    // streaming responses hold theirs for their whole length.
    l.workers = engine.options().max_sequences + opt.max_queue + 4;
    return l;
  }

  std::unique_ptr<http::Server> make_http() {
    return std::make_unique<http::Server>(
        limits(),
        [this](const http::Request& q, http::Response& r) {
          try {
            handle(q, r);
          } catch (const std::exception& e) {
            r = http::Response();
            cors(q, r);
            send_error(r, 500, std::string("internal error: ") + without_dir(e.what(), runner.session_dir()));
          }
        },
        [this](const http::Request* q, int status) { metrics.count_response(q ? endpoint_of(q->path) : "other", status); });
  }
};

HttpServer::HttpServer(Engine& engine, Runner& runner, Metrics& metrics, const ServerOptions& opt)
    : impl_(std::make_unique<Impl>(engine, runner, metrics, opt)) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const ServerOptions& o = impl_->opt;
  const int port = impl_->svr->bind(o.host, o.port);
  VQ_CHECK(port > 0, "cannot listen on {}:{} (in use, or not an address of this machine)", o.host, o.port);
  return port;
}

void HttpServer::run() { impl_->svr->run(); }

void HttpServer::drain() { impl_->draining = true; }

int64_t HttpServer::active() const { return impl_->active; }

void HttpServer::stop() {
  impl_->draining = true;
  impl_->svr->stop();
}

}  // namespace vq
