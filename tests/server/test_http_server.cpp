// The HTTP layer (src/server/http.h) with a trivial handler, no model: pipelined requests answered
// in order, a total head deadline (slowloris), the per-client cap, and 1000 idle half-headers
// that do not starve a normal request (answered within 1 s).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server/http.h"

namespace vq::http {
namespace {

using Clock = std::chrono::steady_clock;

struct Running {
  Server server;
  int port = 0;
  std::thread thread;
  explicit Running(ServerLimits lim)
      : server(
            lim,
            [](const Request& q, Response& r) { r.set_content("{\"path\":\"" + q.path + "\"}", "application/json"); },
            nullptr) {
    port = server.bind("127.0.0.1", 0);
    thread = std::thread([this] { server.run(); });
  }
  ~Running() {
    server.stop();
    thread.join();
  }
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void send_all(int fd, const std::string& s) { ASSERT_EQ(::send(fd, s.data(), s.size(), MSG_NOSIGNAL), ssize_t(s.size())); }

// Reads until the peer closes or `timeout_ms` passes; returns what arrived.
std::string read_until_close(int fd, int timeout_ms) {
  std::string out;
  const auto end = Clock::now() + std::chrono::milliseconds(timeout_ms);
  char buf[4096];
  for (;;) {
    const int left = int(std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count());
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, left) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

TEST(HttpServer, PipelinedRequestsAreAnsweredInOrder) {
  Running s(ServerLimits{});
  ASSERT_GT(s.port, 0);
  const int fd = connect_to(s.port);
  send_all(fd, "GET /a HTTP/1.1\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}GET /c HTTP/1.1\r\n"
               "Connection: close\r\n\r\n");
  const std::string out = read_until_close(fd, 5000);
  ::close(fd);
  const size_t a = out.find("{\"path\":\"/a\"}"), b = out.find("{\"path\":\"/b\"}"), c = out.find("{\"path\":\"/c\"}");
  ASSERT_NE(a, std::string::npos) << out;
  ASSERT_NE(b, std::string::npos) << out;
  ASSERT_NE(c, std::string::npos) << out;
  EXPECT_LT(a, b);
  EXPECT_LT(b, c);
  EXPECT_NE(out.rfind("Connection: close"), std::string::npos);
}

TEST(HttpServer, SlowHeadIsCutByATotalDeadline) {
  ServerLimits lim;
  lim.head_timeout_s = 1;
  Running s(lim);
  const int fd = connect_to(s.port);
  send_all(fd, "GET / HTTP/1.1\r\n");
  const auto t0 = Clock::now();
  std::string out;
  for (int i = 0; i < 30 && out.empty(); ++i) {  // one header line per 100 ms, for up to 3 s
    if (::send(fd, "X: y\r\n", 6, MSG_NOSIGNAL) != 6) break;
    out = read_until_close(fd, 100);
  }
  const double s_taken = std::chrono::duration<double>(Clock::now() - t0).count();
  ::close(fd);
  EXPECT_LT(s_taken, 2.5);
  EXPECT_EQ(out.rfind("HTTP/1.1 408", 0), 0u) << out;
}

TEST(HttpServer, PerClientCap) {
  ServerLimits lim;
  lim.max_per_client = 2;
  Running s(lim);
  const int a = connect_to(s.port), b = connect_to(s.port);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int c = connect_to(s.port);
  const std::string out = read_until_close(c, 3000);
  EXPECT_EQ(out.rfind("HTTP/1.1 503", 0), 0u) << out;
  ::close(a);
  ::close(b);
  ::close(c);
}

TEST(HttpServer, ThousandIdleHalfHeadersDoNotStarveAClient) {
  rlimit rl{};
  getrlimit(RLIMIT_NOFILE, &rl);
  if (rl.rlim_cur < 2200) {
    rl.rlim_cur = std::min<rlim_t>(rl.rlim_max, 4096);
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  if (rl.rlim_cur < 2200) GTEST_SKIP() << "needs 2200 descriptors";
  ServerLimits lim;
  lim.max_per_client = 2000;
  lim.workers = 4;
  Running s(lim);
  std::vector<int> flood;
  for (int i = 0; i < 1000; ++i) {
    const int fd = connect_to(s.port);
    ASSERT_GE(fd, 0);
    send_all(fd, "POST / HTTP/1.1\r\nHost: x\r\nContent-Le");
    flood.push_back(fd);
  }
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    const int fd = connect_to(s.port);
    send_all(fd, "GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n");
    const std::string out = read_until_close(fd, 2000);
    ::close(fd);
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 1.0);
    EXPECT_NE(out.find("{\"path\":\"/ok\"}"), std::string::npos) << out;
  }
  for (int fd : flood) ::close(fd);
}

}  // namespace
}  // namespace vq::http
