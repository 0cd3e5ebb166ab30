#pragma once
// The HTTP side of `veloxquant serve`: OpenAI-compatible endpoints over a Runner.
//   POST /v1/completions, /v1/chat/completions   (stream: true -> server-sent events)
//   GET  /v1/models, /health, /metrics           (Prometheus text)
//   GET  /v1/sessions; POST /v1/sessions/{id}/save, /v1/sessions/{id}/restore; DELETE /v1/sessions/{id}
// Every bad input is a 4xx with OpenAI's JSON error body; the server never exits on input.
// HTTP itself (deadlines, connection caps, pipelining, strict heads): server/http.h.
// Security: with an API key every endpoint but /health needs `Authorization: Bearer <key>` (401
// otherwise, compared in constant time); every POST needs `Content-Type: application/json` (415
// otherwise: a cross-site HTML form or a no-cors fetch cannot send it without a CORS preflight);
// CORS headers only with allow_origin; client-facing errors name sessions, never server paths.
// A request whose prompt + max_tokens cannot fit the KV pool's budget even alone gets 400 before
// anything runs.
// Requests past --parallel + --max-queue in flight get 429 with Retry-After. A streaming client
// that goes away is cancelled at its next write (tokens or a keep-alive comment each second), so
// its blocks are freed; a non-streaming one runs to its end (max_tokens bounds it).
// Shutdown: drain() answers new requests 503 while those in flight finish (active() counts them,
// streams until their last byte); stop() then closes the socket and run() returns.
#include <memory>
#include <string>

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/runner.h"

namespace vq {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;          // 0: any free port (bind() says which)
  std::string model_name;   // the id /v1/models lists and responses carry
  int max_queue = 64;       // requests waiting beyond the running ones before 429
  size_t max_body_bytes = size_t(4) << 20;
  int keep_alive_s = 5;
  std::string api_key;       // non-empty: every endpoint but /health needs `Authorization: Bearer <key>`
  std::string allow_origin;  // non-empty: CORS for this origin ("*": any); empty: no CORS headers
  int max_connections = 4096, max_per_client = 256;  // open connections in total / per client address
  int head_timeout_s = 10, body_timeout_s = 60;      // the whole request head / body must arrive in this
};

class HttpServer {
 public:
  HttpServer(Engine& engine, Runner& runner, Metrics& metrics, const ServerOptions& opt);
  ~HttpServer();
  int bind();  // binds host:port; returns the port; throws vq::Error naming them on failure
  void run();  // serves until stop(); returns once every connection's handler has returned
  void drain();            // from another thread: new generation requests get 503 from now on
  int64_t active() const;  // generation requests whose HTTP response has not ended
  // From another thread: closes the listening socket and ends every connection's loop (a stream
  // still running is cut: drain first and wait for active() == 0).
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace vq
