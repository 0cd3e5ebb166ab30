#include "server/server.h"

#include <httplib.h>

#include <atomic>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "model/model.h"
#include "server/logprobs.h"

namespace vq {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, int status, const std::string& msg, const std::string& type = "",
                const std::string& param = "") {
  res.status = status;
  res.set_content(error_body(status, msg, type, param), "application/json");
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Metrics label of a path: its route, without ids.
std::string endpoint_of(const std::string& path) {
  for (const char* p : {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics"})
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
  httplib::Server svr;
  std::atomic<bool> draining{false};
  std::atomic<int64_t> active{0};  // generation responses not ended yet
  std::atomic<int64_t> next_id{0};
  int n_ctx = 0;

  Impl(Engine& e, Runner& r, Metrics& m, const ServerOptions& o) : engine(e), runner(r), metrics(m), opt(o) {
    n_ctx = e.options().n_ctx;
    routes();
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

  void generate(const httplib::Request& req, httplib::Response& res, bool chat) {
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
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, ch, id, created, st](size_t, httplib::DataSink& sink) {
          return stream_step(*ch, sink, id, created, *st);
        },
        [this, ch](bool) {
          bool done;
          {
            std::lock_guard<std::mutex> lock(ch->mu);
            done = ch->done;
          }
          if (!done) runner.cancel(*ch);  // the client went away
          --active;
        });
  }

  struct StreamState {
    bool first = true;
    size_t lp_sent = 0, text_bytes = 0;  // logprob entries and text bytes sent so far
  };

  // Waits for news (up to 1 s), sends it; false ends the response (and cancels an unfinished one).
  bool stream_step(Channel& c, httplib::DataSink& sink, const std::string& id, int64_t created, StreamState& st) {
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
    sink.done();
    return true;
  }

  void finish_plain(httplib::Response& res, Channel& c, const std::string& id, int64_t created) {
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

  void session_op(const httplib::Request& req, httplib::Response& res, const std::string& op) {
    const std::string name = req.matches[1];
    if (!valid_session_name(name))
      return send_error(res, 400, "session ids are 1..64 characters of [A-Za-z0-9_.-], not starting with '.'", "", "id");
    try {
      if (op == "delete") {
        runner.delete_session(name);
        return res.set_content(dump({{"id", name}, {"deleted", true}}), "application/json");
      }
      const SessionInfo s = op == "save" ? runner.save_session(name) : runner.restore_session(name);
      res.set_content(dump({{"id", s.name}, {"n_tokens", s.n_tokens}, {"n_kv", s.n_kv}, {op == "save" ? "saved" : "restored", true}}),
                      "application/json");
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what(), e.type, e.param);
    } catch (const std::exception& e) {
      send_error(res, 500, e.what());
    }
  }

  void routes() {
    svr.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, false); });
    svr.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& r) { generate(q, r, true); });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& r) {
      const json m = {{"id", opt.model_name}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "veloxquant"}};
      r.set_content(dump({{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& r) {
      r.status = draining ? 503 : 200;
      r.set_content(dump({{"status", draining ? "stopping" : "ok"}}), "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& r) {
      r.set_content(metrics.render(engine.stats()), "text/plain; version=0.0.4");
    });
    svr.Get("/v1/sessions", [this](const httplib::Request&, httplib::Response& r) {
      json list = json::array();
      for (const SessionInfo& s : runner.sessions()) list.push_back({{"id", s.name}, {"n_tokens", s.n_tokens}, {"n_kv", s.n_kv}});
      r.set_content(dump({{"object", "list"}, {"data", list}}), "application/json");
    });
    svr.Post(R"(/v1/sessions/([^/]+)/save)", [this](const httplib::Request& q, httplib::Response& r) { session_op(q, r, "save"); });
    svr.Post(R"(/v1/sessions/([^/]+)/restore)",
             [this](const httplib::Request& q, httplib::Response& r) { session_op(q, r, "restore"); });
    svr.Delete(R"(/v1/sessions/([^/]+))", [this](const httplib::Request& q, httplib::Response& r) { session_op(q, r, "delete"); });
    // Whatever httplib answers by itself (404, 413, 400 on a broken request line) gets a JSON body.
    svr.set_error_handler([](const httplib::Request&, httplib::Response& r) {
      if (!r.body.empty()) return;
      const char* msg = r.status == 404   ? "no such endpoint"
                        : r.status == 413 ? "the request body is too large"
                                          : "bad request (malformed HTTP, or a POST without a body or Content-Length: "
                                            "send one, e.g. curl -d '')";
      r.set_content(error_body(r.status, msg), "application/json");
    });
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& r, std::exception_ptr ep) {
      std::string what = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = std::string("internal error: ") + e.what();
      } catch (...) {
      }
      send_error(r, 500, what);
    });
    svr.set_logger([this](const httplib::Request& q, const httplib::Response& r) {
      metrics.count_response(endpoint_of(q.path), r.status);
    });
    svr.set_payload_max_length(opt.max_body_bytes);
    svr.set_keep_alive_timeout(opt.keep_alive_s);
    svr.set_read_timeout(10);
    svr.set_write_timeout(10);
    // A thread per connection up to every request that may be in flight, plus a few for 429s,
    // health and metrics; streaming responses hold theirs for their whole length.
    const size_t threads = size_t(engine.options().max_sequences + opt.max_queue + 4);
    svr.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  }
};

HttpServer::HttpServer(Engine& engine, Runner& runner, Metrics& metrics, const ServerOptions& opt)
    : impl_(std::make_unique<Impl>(engine, runner, metrics, opt)) {}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  const ServerOptions& o = impl_->opt;
  const int port = o.port == 0 ? impl_->svr.bind_to_any_port(o.host) : (impl_->svr.bind_to_port(o.host, o.port) ? o.port : -1);
  VQ_CHECK(port > 0, "cannot listen on {}:{} (in use, or not an address of this machine)", o.host, o.port);
  return port;
}

void HttpServer::run() { impl_->svr.listen_after_bind(); }

void HttpServer::drain() { impl_->draining = true; }

int64_t HttpServer::active() const { return impl_->active; }

void HttpServer::stop() {
  impl_->draining = true;
  impl_->svr.stop();
}

}  // namespace vq
