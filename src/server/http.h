#pragma once
// A small HTTP/1.1 server of our own under the OpenAI endpoints (server.cpp).
//
// Why not cpp-httplib (Debian's 0.11): it gives every accepted socket a pool thread that blocks
// reading the header line by line with a per-read timeout, so N idle sockets with a partial header
// hold N threads (1000 of them stalled the server past 120 s), one header line per second never
// hits a deadline, its listen backlog is a compile-time 5, and it has no per-client connection
// cap nor strict Content-Length handling. Here:
//   - one event thread accepts and reads every connection's request (head and body) with poll(),
//     under total deadlines (an idle keep-alive wait, the whole head, the whole body), so idle or
//     slow sockets cost a file descriptor and a buffer, never a worker thread;
//   - a complete request goes to a worker pool; the connection comes back to the event thread
//     once its response is written, so pipelined requests are answered one after the other, in
//     order, on the same connection;
//   - caps on connections in total and per client address (past them: 503 and close at accept),
//     and on the request bodies being received at once (503 past it), so memory stays bounded;
//   - strict parsing (parse_head, fuzzed by fuzz/fuzz_http.cpp): one Content-Length of digits
//     only, no request Transfer-Encoding, CRLF line ends, bounded head size and header count.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace vq::http {

struct Request {
  std::string method, target, path;  // path: target without its query
  int minor_version = 1;             // HTTP/1.<minor>
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  std::string peer;  // client address
  bool keep_alive = true;
  size_t content_length = 0;
  bool expect_continue = false;
  const std::string* header(std::string_view name) const;  // case-insensitive; the first one
};

// What a streaming response writes into; write returns false once the client is gone.
struct Sink {
  std::function<bool(const char*, size_t)> write;
  bool done = false;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // Connection: close after this response
  // Streaming (chunked): step is called until it returns false (cut) or sets sink.done; release
  // is called once at the end with whether it completed.
  std::function<bool(Sink&)> step;
  std::function<void(bool)> release;
  void set_content(std::string b, std::string type) {
    body = std::move(b);
    content_type = std::move(type);
  }
  void set_header(std::string k, std::string v) { headers.emplace_back(std::move(k), std::move(v)); }
};

struct Limits {
  size_t max_head_bytes = 16 << 10;  // request line + headers
  int max_headers = 100;
  size_t max_body_bytes = size_t(4) << 20;
};

// Parses a request head at the start of buf (leading empty lines skipped). complete: req's
// method/target/path/version/headers/keep_alive/content_length are set and head_len is the bytes
// up to and including the empty line. error: status (400, 411, 413, 431, 501, 505) and message.
struct HeadResult {
  enum Kind { incomplete, complete, error } kind = incomplete;
  int status = 0;
  std::string message;
  size_t head_len = 0;
};
HeadResult parse_head(std::string_view buf, Request& req, const Limits& lim);

struct ServerLimits {
  Limits request;
  int keep_alive_s = 5;       // an idle connection waits this long for its next request
  int head_timeout_s = 10;    // the whole head must arrive within this (from its first byte)
  int body_timeout_s = 60;    // the whole body, from the end of the head
  int write_timeout_s = 10;   // each write of a response may block this long
  int max_connections = 4096;  // open at once, in total
  int max_per_client = 256;    // open at once from one address
  int backlog = 4096;          // listen(2)'s backlog (capped by the kernel's somaxconn)
  int workers = 8;             // threads running handlers (streams hold theirs to the end)
  size_t max_buffered_bytes = size_t(256) << 20;  // bodies being received at once, in total (503 past it)
};

class Server {
 public:
  using Handler = std::function<void(const Request&, Response&)>;
  // on_done(req or nullptr, status): after every response (nullptr: a request refused while
  // reading it, e.g. 400 for a bad head or 408 at a deadline).
  using Logger = std::function<void(const Request*, int status)>;
  Server(ServerLimits lim, Handler handler, Logger logger);
  ~Server();
  int bind(const std::string& host, int port);  // returns the port; -1 on failure (errno kept)
  void run();   // serves until stop(); returns when every worker is done
  void stop();  // from any thread: closes the listener and every connection (streams are cut)

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

const char* status_text(int status);

}  // namespace vq::http
