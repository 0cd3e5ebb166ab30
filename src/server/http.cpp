#include "server/http.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

namespace vq::http {
namespace {

using Clock = std::chrono::steady_clock;

char lower(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (lower(a[i]) != lower(b[i])) return false;
  return true;
}

bool is_tchar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return std::strchr("!#$%&'*+-.^_`|~", c) != nullptr && c != '\0';
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Whether a comma-separated header value holds token (case-insensitive).
bool has_token(std::string_view v, std::string_view token) {
  while (!v.empty()) {
    const size_t c = v.find(',');
    if (iequals(trim(v.substr(0, c)), token)) return true;
    if (c == std::string_view::npos) break;
    v.remove_prefix(c + 1);
  }
  return false;
}

HeadResult fail(int status, std::string msg) {
  HeadResult r;
  r.kind = HeadResult::error;
  r.status = status;
  r.message = std::move(msg);
  return r;
}

}  // namespace

const std::string* Request::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return &v;
  return nullptr;
}

const char* status_text(int s) {
  switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 415: return "Unsupported Media Type";
    case 422: return "Unprocessable Entity";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Status";
  }
}

HeadResult parse_head(std::string_view buf, Request& req, const Limits& lim) {
  size_t start = 0;
  while (buf.size() - start >= 2 && buf[start] == '\r' && buf[start + 1] == '\n') start += 2;
  const size_t end = buf.find("\r\n\r\n", start);
  if (end == std::string_view::npos) {
    if (buf.size() - start > lim.max_head_bytes)
      return fail(431, "the request head (request line and headers) is larger than " +
                           std::to_string(lim.max_head_bytes) + " bytes");
    return {};
  }
  if (end + 4 - start > lim.max_head_bytes)
    return fail(431, "the request head (request line and headers) is larger than " +
                         std::to_string(lim.max_head_bytes) + " bytes");
  std::string_view head = buf.substr(start, end + 2 - start);  // each line ends with CRLF
  for (char c : head)
    if (c == '\0') return fail(400, "malformed HTTP: NUL byte in the request head");
  auto next_line = [&](std::string_view& line) {
    const size_t e = head.find("\r\n");
    line = head.substr(0, e);
    head.remove_prefix(e + 2);
  };
  std::string_view line;
  next_line(line);
  if (line.find('\n') != std::string_view::npos || line.find('\r') != std::string_view::npos)
    return fail(400, "malformed HTTP: a bare CR or LF in the request line");
  // METHOD SP target SP HTTP/1.x
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == 0 || sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos || sp2 == sp1 + 1)
    return fail(400, "malformed HTTP: the request line is not 'METHOD target HTTP/1.1'");
  const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                         version = line.substr(sp2 + 1);
  for (char c : method)
    if (!is_tchar(c)) return fail(400, "malformed HTTP: bad method");
  if (target[0] != '/') return fail(400, "malformed HTTP: the target must start with '/'");
  for (char c : target)
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return fail(400, "malformed HTTP: a control byte in the target");
  if (version.size() != 8 || version.substr(0, 7) != "HTTP/1." || (version[7] != '0' && version[7] != '1'))
    return version.substr(0, 5) == "HTTP/" ? fail(505, "only HTTP/1.0 and HTTP/1.1 are served")
                                           : fail(400, "malformed HTTP: bad version in the request line");
  req.method.assign(method);
  req.target.assign(target);
  req.path.assign(target.substr(0, target.find('?')));
  req.minor_version = version[7] - '0';
  req.headers.clear();
  req.content_length = 0;
  req.expect_continue = false;
  int n_cl = 0;
  bool te = false;
  std::string_view conn;
  while (!head.empty()) {
    next_line(line);
    if (line.empty()) break;
    if (line[0] == ' ' || line[0] == '\t') return fail(400, "malformed HTTP: folded header lines are not accepted");
    if (int(req.headers.size()) >= lim.max_headers)
      return fail(431, "more than " + std::to_string(lim.max_headers) + " header lines");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || colon == 0) return fail(400, "malformed HTTP: a header line without 'name:'");
    const std::string_view name = line.substr(0, colon), value = trim(line.substr(colon + 1));
    for (char c : name)
      if (!is_tchar(c)) return fail(400, "malformed HTTP: bad character in a header name");
    for (char c : value)
      if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f)
        return fail(400, "malformed HTTP: a control byte in a header value");
    if (iequals(name, "content-length")) {
      if (++n_cl > 1) return fail(400, "more than one Content-Length header");
      if (value.empty() || value.size() > 15) return fail(400, "Content-Length must be a non-negative decimal integer");
      size_t n = 0;
      for (char c : value) {
        if (c < '0' || c > '9') return fail(400, "Content-Length must be a non-negative decimal integer");
        n = n * 10 + size_t(c - '0');
      }
      req.content_length = n;
    } else if (iequals(name, "transfer-encoding")) {
      te = true;
    } else if (iequals(name, "connection")) {
      conn = value;
    } else if (iequals(name, "expect")) {
      if (!iequals(value, "100-continue")) return fail(400, "unsupported Expect header (only 100-continue)");
      req.expect_continue = true;
    }
    req.headers.emplace_back(std::string(name), std::string(value));
  }
  if (te && n_cl) return fail(400, "both Transfer-Encoding and Content-Length");
  if (te) return fail(411, "chunked request bodies are not accepted: send Content-Length");
  if (req.content_length > lim.max_body_bytes)
    return fail(413, "the request body is too large (" + std::to_string(req.content_length) + " bytes; the limit is " +
                         std::to_string(lim.max_body_bytes) + ")");
  req.keep_alive = req.minor_version == 1 ? !has_token(conn, "close") : has_token(conn, "keep-alive");
  HeadResult r;
  r.kind = HeadResult::complete;
  r.head_len = end + 4;
  return r;
}

namespace {

struct Conn {
  int fd = -1;
  std::string peer;
  std::string buf;  // received, not yet consumed
  enum Phase { idle, head, body, linger } phase = idle;  // linger: refused, reading what is left to drop it
  size_t dropped = 0;
  size_t reserved = 0;  // of Impl::body_reserved
  Clock::time_point deadline;
  Request req;
  size_t head_len = 0;
  bool continue_sent = false;
};


// Writes all of [p, p+n) to a non-blocking socket, waiting up to timeout_s for each chunk's room.
bool write_all(int fd, const char* p, size_t n, int timeout_s) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= size_t(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd pf{fd, POLLOUT, 0};
      const int r = ::poll(&pf, 1, timeout_s * 1000);
      if (r <= 0 || (pf.revents & (POLLERR | POLLHUP | POLLNVAL))) return false;
      continue;
    }
    return false;
  }
  return true;
}

std::string head_of(const Response& res, bool keep_alive, bool chunked, size_t content_length) {
  std::string h = "HTTP/1.1 " + std::to_string(res.status) + " " + status_text(res.status) + "\r\n";
  if (!res.content_type.empty()) h += "Content-Type: " + res.content_type + "\r\n";
  for (const auto& [k, v] : res.headers) h += k + ": " + v + "\r\n";
  if (chunked) h += "Transfer-Encoding: chunked\r\n";
  else if (content_length != size_t(-1) && res.status != 204) h += "Content-Length: " + std::to_string(content_length) + "\r\n";
  h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
  return h;
}

}  // namespace

struct Server::Impl {
  ServerLimits lim;
  Handler handler;
  Logger logger;
  int listen_fd = -1;
  int wake[2] = {-1, -1};  // a pipe that wakes the event thread (a connection back, or stop)
  std::atomic<bool> stopping{false};
  Clock::time_point accept_paused_until{};  // event thread only
  size_t body_reserved = 0;                  // event thread only: bodies announced, not yet complete

  std::mutex mu;  // guards what follows
  std::condition_variable cv;
  std::deque<std::unique_ptr<Conn>> jobs;      // complete requests for the workers
  std::vector<std::unique_ptr<Conn>> back;     // connections returned by workers
  std::map<int, int> busy_fds;                 // fd -> 1 while a worker holds it (for stop)
  std::map<std::string, int> per_client;       // open connections per address
  int n_open = 0;

  void poke() {
    const char c = 1;
    [[maybe_unused]] ssize_t r = ::write(wake[1], &c, 1);
  }

  void close_conn(Conn& c) {
    if (c.reserved) {  // only in the event thread (a body phase cut short); workers get 0
      body_reserved -= c.reserved;
      c.reserved = 0;
    }
    ::close(c.fd);
    std::lock_guard<std::mutex> lock(mu);
    if (--per_client[c.peer] <= 0) per_client.erase(c.peer);
    --n_open;
  }

  // Refuses a connection or request with a small JSON error and closes (best effort, non-blocking).
  void refuse(int fd, int status, const std::string& msg) {
    Response r;
    r.status = status;
    r.body = "{\"error\":{\"message\":\"" + msg + "\",\"type\":\"" +
             (status == 503 ? "server_busy" : "invalid_request_error") + "\",\"param\":null,\"code\":" +
             std::to_string(status) + "}}";
    const std::string out = head_of(r, false, false, r.body.size()) + r.body;
    [[maybe_unused]] ssize_t w = ::send(fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    // No more from us; what the client still sends is read and dropped (a lingering close), so
    // that closing does not reset the connection (a reset may discard the answer unread).
    ::shutdown(fd, SHUT_WR);
    char sink[4096];
    for (int i = 0; i < 16 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
    }
  }

  // Makes a connection wait for a request (again): idle with its keep-alive deadline, or at once
  // in the head phase when bytes of the next request are already buffered.
  void arm(Conn& c, bool fresh) {
    c.phase = Conn::idle;
    c.continue_sent = false;
    c.deadline = Clock::now() + std::chrono::seconds(fresh ? lim.head_timeout_s : lim.keep_alive_s);
    if (!c.buf.empty()) {
      c.phase = Conn::head;
      c.deadline = Clock::now() + std::chrono::seconds(lim.head_timeout_s);
    }
  }

  // Advances a connection with what its buffer holds. Returns false when it was closed or handed
  // to a worker (the caller drops it from its list).
  bool advance(std::unique_ptr<Conn>& cp) {
    Conn& c = *cp;
    if (c.phase == Conn::linger) {
      if (c.dropped <= 4 * lim.request.max_body_bytes + (1 << 20)) return true;
      close_conn(c);
      return false;
    }
    if (c.phase == Conn::idle || c.phase == Conn::head) {
      if (c.buf.empty()) return true;
      if (c.phase == Conn::idle) {
        c.phase = Conn::head;
        c.deadline = Clock::now() + std::chrono::seconds(lim.head_timeout_s);
      }
      const HeadResult h = parse_head(c.buf, c.req, lim.request);
      if (h.kind == HeadResult::incomplete) return true;
      if (h.kind == HeadResult::error) {
        refuse(c.fd, h.status, h.message);
        if (logger) logger(nullptr, h.status);
        // Linger: drop what the client still sends (e.g. the rest of a too-large body) until it
        // closes, for at most the head deadline and 4 x the body limit.
        c.phase = Conn::linger;
        c.buf.clear();
        c.deadline = Clock::now() + std::chrono::seconds(lim.head_timeout_s);
        return true;
      }
      // Bodies being received are buffered whole: their total is bounded, beyond it 503.
      if (body_reserved + c.req.content_length > lim.max_buffered_bytes) {
        refuse(c.fd, 503, "the server is receiving too many request bodies; retry later");
        if (logger) logger(nullptr, 503);
        c.phase = Conn::linger;
        c.buf.clear();
        c.deadline = Clock::now() + std::chrono::seconds(lim.head_timeout_s);
        return true;
      }
      body_reserved += c.req.content_length;
      c.reserved = c.req.content_length;
      c.head_len = h.head_len;
      c.req.peer = c.peer;
      c.phase = Conn::body;
      c.deadline = Clock::now() + std::chrono::seconds(lim.body_timeout_s);
    }
    if (c.buf.size() - c.head_len < c.req.content_length) {
      if (c.req.expect_continue && !c.continue_sent) {
        static const char k100[] = "HTTP/1.1 100 Continue\r\n\r\n";
        [[maybe_unused]] ssize_t w = ::send(c.fd, k100, sizeof k100 - 1, MSG_NOSIGNAL | MSG_DONTWAIT);
        c.continue_sent = true;
      }
      return true;
    }
    body_reserved -= c.reserved;
    c.reserved = 0;
    c.req.body = c.buf.substr(c.head_len, c.req.content_length);
    c.buf.erase(0, c.head_len + c.req.content_length);
    {
      std::lock_guard<std::mutex> lock(mu);
      busy_fds[c.fd] = 1;
      jobs.push_back(std::move(cp));
    }
    cv.notify_one();
    return false;
  }

  void accept_all(std::vector<std::unique_ptr<Conn>>& conns) {
    for (;;) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        // Out of descriptors: the listener stays readable, so leave it out of poll for a moment
        // instead of spinning (the connections waiting stay in the backlog).
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
          accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
        return;
      }
      char host[NI_MAXHOST] = "?";
      getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, nullptr, 0, NI_NUMERICHOST);
      std::string peer = host;
      bool over_total, over_client;
      {
        std::lock_guard<std::mutex> lock(mu);
        over_total = n_open >= lim.max_connections;
        auto it = per_client.find(peer);
        over_client = it != per_client.end() && it->second >= lim.max_per_client;
        if (!over_total && !over_client) {
          ++per_client[peer];
          ++n_open;
        }
      }
      if (over_total || over_client) {
        refuse(fd, 503, over_total ? "too many connections to the server" : "too many connections from your address");
        if (logger) logger(nullptr, 503);
        ::close(fd);
        continue;
      }
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->peer = std::move(peer);
      arm(*c, true);
      conns.push_back(std::move(c));
    }
  }

  void event_loop() {
    std::vector<std::unique_ptr<Conn>> conns;
    std::vector<pollfd> pfds;
    std::vector<char> rbuf(64 << 10);
    const size_t read_cap = lim.request.max_head_bytes + lim.request.max_body_bytes + rbuf.size();
    while (!stopping) {
      std::vector<std::unique_ptr<Conn>> returned;
      {
        std::lock_guard<std::mutex> lock(mu);
        returned.swap(back);
      }
      // A returned connection may hold its next (pipelined) request already.
      for (auto& c : returned)
        if (advance(c)) conns.push_back(std::move(c));
      auto now = Clock::now();
      pfds.assign({{now < accept_paused_until ? -1 : listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}});
      auto next = now + std::chrono::seconds(1);
      if (now < accept_paused_until) next = std::min(next, accept_paused_until);
      for (auto& c : conns) {
        pfds.push_back({c->fd, POLLIN, 0});
        next = std::min(next, c->deadline);
      }
      const int ms = int(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count() + 1));
      const int n = ::poll(pfds.data(), nfds_t(pfds.size()), ms);
      if (n < 0 && errno != EINTR) break;
      if (stopping) break;
      if (pfds[1].revents & POLLIN) {
        char tmp[256];
        while (::read(wake[0], tmp, sizeof tmp) > 0) {
        }
      }
      now = Clock::now();
      std::vector<std::unique_ptr<Conn>> keep;
      keep.reserve(conns.size());
      for (size_t i = 0; i < conns.size(); ++i) {
        std::unique_ptr<Conn>& c = conns[i];
        const short ev = pfds[i + 2].revents;
        bool alive = true;
        if (ev & (POLLIN | POLLHUP | POLLERR)) {
          for (;;) {
            const ssize_t r = ::recv(c->fd, rbuf.data(), rbuf.size(), 0);
            if (r > 0) {
              if (c->phase == Conn::linger) c->dropped += size_t(r);
              else c->buf.append(rbuf.data(), size_t(r));
              // At most one request's worth per turn (the rest waits in the kernel).
              if (size_t(r) < rbuf.size() || c->buf.size() > read_cap || c->phase == Conn::linger) break;
              continue;
            }
            if (r < 0 && errno == EINTR) continue;
            if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
            close_conn(*c);  // closed by the client (or an error)
            alive = false;
            break;
          }
          if (alive) alive = advance(c);
        }
        if (alive && c->deadline <= now) {
          if (c->phase == Conn::head || c->phase == Conn::body) {
            refuse(c->fd, 408,
                   c->phase == Conn::head ? "the request head did not arrive in time" : "the request body did not arrive in time");
            if (logger) logger(nullptr, 408);
          }
          close_conn(*c);
          alive = false;
        }
        if (alive) keep.push_back(std::move(c));
      }
      conns.swap(keep);
      if (pfds[0].revents & POLLIN) accept_all(conns);
    }
    for (auto& c : conns) close_conn(*c);
  }

  void worker() {
    for (;;) {
      std::unique_ptr<Conn> c;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return stopping || !jobs.empty(); });
        if (jobs.empty()) return;
        c = std::move(jobs.front());
        jobs.pop_front();
      }
      const bool keep = serve(*c);
      {
        std::lock_guard<std::mutex> lock(mu);
        busy_fds.erase(c->fd);
        if (keep && !stopping) {
          arm(*c, false);
          back.push_back(std::move(c));
        }
      }
      if (c) close_conn(*c);
      else poke();
    }
  }

  // Runs the handler and writes its response; whether the connection stays open.
  bool serve(Conn& c) {
    Response res;
    try {
      handler(c.req, res);
    } catch (...) {
      res = Response();
      res.status = 500;
      res.body = "{\"error\":{\"message\":\"internal error\",\"type\":\"server_error\",\"param\":null,\"code\":500}}";
    }
    bool keep = c.req.keep_alive && !res.close && !stopping;
    const int fd = c.fd;
    const int to = lim.write_timeout_s;
    bool ok;
    if (!res.step) {
      const std::string out = head_of(res, keep, false, res.body.size());
      ok = write_all(fd, out.data(), out.size(), to) && write_all(fd, res.body.data(), res.body.size(), to);
    } else {
      const bool chunked = c.req.minor_version == 1;
      if (!chunked) keep = false;  // HTTP/1.0: the end of the body is the end of the connection
      const std::string out = head_of(res, keep, chunked, size_t(-1));
      ok = write_all(fd, out.data(), out.size(), to);
      Sink sink;
      sink.write = [&](const char* p, size_t n) {
        if (!ok) return false;
        if (n == 0) return true;
        if (chunked) {
          char hex[32];
          const int k = std::snprintf(hex, sizeof hex, "%zx\r\n", n);
          ok = write_all(fd, hex, size_t(k), to) && write_all(fd, p, n, to) && write_all(fd, "\r\n", 2, to);
        } else {
          ok = write_all(fd, p, n, to);
        }
        return ok;
      };
      while (ok && !sink.done && !stopping)
        if (!res.step(sink)) ok = false;
      if (ok && sink.done && chunked) ok = write_all(fd, "0\r\n\r\n", 5, to);
      ok = ok && sink.done;
      if (res.release) res.release(ok);
    }
    if (logger) logger(&c.req, res.status);
    return ok && keep;
  }
};

Server::Server(ServerLimits lim, Handler handler, Logger logger) : impl_(std::make_unique<Impl>()) {
  impl_->lim = lim;
  impl_->handler = std::move(handler);
  impl_->logger = std::move(logger);
  if (::pipe2(impl_->wake, O_NONBLOCK | O_CLOEXEC) != 0) impl_->wake[0] = impl_->wake[1] = -1;
}

Server::~Server() {
  if (impl_->listen_fd >= 0) ::close(impl_->listen_fd);
  for (int fd : impl_->wake)
    if (fd >= 0) ::close(fd);
}

int Server::bind(const std::string& host, int port) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  if (::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0 || !res) return -1;
  int fd = -1;
  for (addrinfo* a = res; a; a = a->ai_next) {
    fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, impl_->lim.backlog) == 0) break;
    ::close(fd);
    fd = -1;
  }
  ::freeaddrinfo(res);
  if (fd < 0) return -1;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  impl_->listen_fd = fd;
  return ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                  : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

void Server::run() {
  std::vector<std::thread> workers;
  for (int i = 0; i < std::max(1, impl_->lim.workers); ++i) workers.emplace_back([this] { impl_->worker(); });
  impl_->event_loop();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
    for (auto& [fd, _] : impl_->busy_fds) ::shutdown(fd, SHUT_RDWR);  // cuts streams still running
  }
  impl_->cv.notify_all();
  for (auto& t : workers) t.join();
  std::lock_guard<std::mutex> lock(impl_->mu);
  for (auto& c : impl_->jobs) ::close(c->fd);
  for (auto& c : impl_->back) ::close(c->fd);
  impl_->jobs.clear();
  impl_->back.clear();
}

void Server::stop() {
  impl_->stopping = true;
  impl_->poke();
  impl_->cv.notify_all();
}

}  // namespace vq::http
