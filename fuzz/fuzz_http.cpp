// libFuzzer target: the server's HTTP request-head parser (src/server/http.cpp, parse_head) as
// the event thread drives it: every prefix-free split of a byte stream into pipelined requests.
// Contract, checked with abort(): any bytes give incomplete, complete or one error status in
// {400, 411, 413, 431, 501, 505} with a message; a complete head lies inside the input, its
// Content-Length is at most the body limit, its path is a prefix of its target starting with '/',
// header names are non-empty tokens and no name or value holds CR, LF or NUL; an incomplete head
// of more than the head limit is an error (431), never "wait for more" forever.
// Build and run: fuzz/run_fuzz.sh --target http (docs/FUZZING.md).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "server/http.h"

using vq::http::HeadResult;

static void check(bool ok) {
  if (!ok) std::abort();
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  vq::http::Limits lim;
  lim.max_head_bytes = 1024;  // small limits, so that the fuzzer reaches them
  lim.max_headers = 16;
  lim.max_body_bytes = 4096;
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  for (int n = 0; n < 64 && !rest.empty(); ++n) {
    vq::http::Request req;
    const HeadResult h = vq::http::parse_head(rest, req, lim);
    if (h.kind == HeadResult::incomplete) {
      // Waiting is only allowed while the head could still fit.
      size_t lead = 0;
      while (rest.size() - lead >= 2 && rest[lead] == '\r' && rest[lead + 1] == '\n') lead += 2;
      check(rest.size() - lead <= lim.max_head_bytes);
      break;
    }
    if (h.kind == HeadResult::error) {
      const int s = h.status;
      check(s == 400 || s == 411 || s == 413 || s == 431 || s == 501 || s == 505);
      check(!h.message.empty());
      break;
    }
    check(h.head_len >= 4 && h.head_len <= rest.size());
    check(req.content_length <= lim.max_body_bytes);
    check(!req.target.empty() && req.target[0] == '/' && req.target.compare(0, req.path.size(), req.path) == 0);
    check(req.minor_version == 0 || req.minor_version == 1);
    check(int(req.headers.size()) <= lim.max_headers);
    for (const auto& [k, v] : req.headers) {
      check(!k.empty());
      for (char c : k) check(c != '\r' && c != '\n' && c != '\0' && c != ':' && c != ' ');
      for (char c : v) check(c != '\r' && c != '\n' && c != '\0');
    }
    // The next pipelined request starts after this one's body.
    if (rest.size() - h.head_len < req.content_length) break;
    rest.remove_prefix(h.head_len + req.content_length);
  }
  return 0;
}
