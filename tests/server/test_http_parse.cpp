// The server's HTTP request-head parser (src/server/http.h): strict Content-Length, bounded head
// size and header count, no request Transfer-Encoding, pipelined requests split where they end.
#include <gtest/gtest.h>

#include <string>

#include "server/http.h"

namespace vq::http {
namespace {

HeadResult parse(const std::string& s, Request& r, Limits lim = {}) { return parse_head(s, r, lim); }

int status_of(const std::string& s) {
  Request r;
  const HeadResult h = parse(s, r);
  return h.kind == HeadResult::complete ? 0 : h.kind == HeadResult::incomplete ? -1 : h.status;
}

TEST(HttpParse, CompleteHeadAndFields) {
  Request r;
  const std::string s = "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
                        "content-length:  12 \r\n\r\n{\"prompt\":1}";
  const HeadResult h = parse(s, r);
  ASSERT_EQ(h.kind, HeadResult::complete) << h.message;
  EXPECT_EQ(h.head_len, s.size() - 12);
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.path, "/v1/completions");
  EXPECT_EQ(r.target, "/v1/completions?x=1");
  EXPECT_EQ(r.content_length, 12u);
  EXPECT_TRUE(r.keep_alive);
  ASSERT_NE(r.header("CONTENT-TYPE"), nullptr);
  EXPECT_EQ(*r.header("content-type"), "application/json");
}

TEST(HttpParse, IncompleteUntilTheEmptyLine) {
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\n"), -1);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\n\r"), -1);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nHost: a\r\n\r\n"), 0);
}

TEST(HttpParse, StrictContentLength) {
  const std::string pre = "POST / HTTP/1.1\r\nHost: a\r\n";
  EXPECT_EQ(status_of(pre + "Content-Length: -1\r\n\r\n"), 400);
  EXPECT_EQ(status_of(pre + "Content-Length: abc\r\n\r\n"), 400);
  EXPECT_EQ(status_of(pre + "Content-Length: +5\r\n\r\n"), 400);
  EXPECT_EQ(status_of(pre + "Content-Length: 5, 5\r\n\r\n"), 400);
  EXPECT_EQ(status_of(pre + "Content-Length:\r\n\r\n"), 400);
  EXPECT_EQ(status_of(pre + "Content-Length: 5\r\nContent-Length: 5\r\n\r\n"), 400);
  EXPECT_EQ(status_of(pre + "Content-Length: 1\r\nContent-Length: 5\r\n\r\n"), 400);
  EXPECT_EQ(status_of(pre + "Content-Length: 99999999999999999999\r\n\r\n"), 400);  // past 15 digits
  EXPECT_EQ(status_of(pre + "Content-Length: 999999999999\r\n\r\n"), 413);
  EXPECT_EQ(status_of(pre + "Transfer-Encoding: chunked\r\n\r\n"), 411);
  EXPECT_EQ(status_of(pre + "Transfer-Encoding: chunked\r\nContent-Length: 2\r\n\r\n"), 400);
  EXPECT_EQ(status_of(pre + "Content-Length: 0\r\n\r\n"), 0);
}

TEST(HttpParse, MalformedHeads) {
  EXPECT_EQ(status_of("GET /\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET  / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET x HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(status_of("GET / FOO/1.1\r\n\r\n"), 400);
  EXPECT_EQ(status_of("G(T / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nNoColon\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nA: b\nC: d\r\n\r\n"), 400);  // a bare LF
  EXPECT_EQ(status_of(std::string("GET / HTTP/1.1\r\nA: b\0c\r\n\r\n", 26)), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nBad Name: b\r\n\r\n"), 400);
  EXPECT_EQ(status_of("GET / HTTP/1.1\r\nExpect: something\r\n\r\n"), 400);
}

TEST(HttpParse, HeadSizeAndHeaderCountAreBounded) {
  Limits lim;
  lim.max_head_bytes = 256;
  lim.max_headers = 4;
  Request r;
  // An endless head is refused once past the limit, not waited for.
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nX: " + std::string(300, 'a'), r, lim).status, 431);
  EXPECT_EQ(parse("GET / HTTP/1.1\r\nX: " + std::string(200, 'a'), r, lim).kind, HeadResult::incomplete);
  std::string many = "GET / HTTP/1.1\r\n";
  for (char c = 'a'; c < 'f'; ++c) {
    many += c;
    many += ": v\r\n";
  }
  EXPECT_EQ(parse(many + "\r\n", r, lim).status, 431);
}

TEST(HttpParse, KeepAliveRules) {
  Request r;
  ASSERT_EQ(parse("GET / HTTP/1.1\r\nConnection: close\r\n\r\n", r).kind, HeadResult::complete);
  EXPECT_FALSE(r.keep_alive);
  ASSERT_EQ(parse("GET / HTTP/1.0\r\n\r\n", r).kind, HeadResult::complete);
  EXPECT_FALSE(r.keep_alive);
  ASSERT_EQ(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", r).kind, HeadResult::complete);
  EXPECT_TRUE(r.keep_alive);
  ASSERT_EQ(parse("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n", r).kind, HeadResult::complete);
  EXPECT_TRUE(r.expect_continue);
}

TEST(HttpParse, PipelinedRequestsSplitWhereTheyEnd) {
  const std::string a = "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nxyz";
  const std::string b = "\r\nGET /b HTTP/1.1\r\n\r\n";  // a stray CRLF between requests is skipped
  std::string buf = a + b;
  Request r;
  HeadResult h = parse(buf, r);
  ASSERT_EQ(h.kind, HeadResult::complete);
  EXPECT_EQ(r.path, "/a");
  buf.erase(0, h.head_len + r.content_length);
  h = parse(buf, r);
  ASSERT_EQ(h.kind, HeadResult::complete);
  EXPECT_EQ(r.path, "/b");
  EXPECT_EQ(h.head_len, buf.size());
}

}  // namespace
}  // namespace vq::http
