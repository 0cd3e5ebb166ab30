#include "server/logprobs.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

namespace vq {

TokenLogprob token_logprob(const float* x, int n, int32_t token, int top_n) {
  const float mx = *std::max_element(x, x + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const double lse = double(mx) + std::log(sum);
  TokenLogprob r;
  r.token = token;
  r.logprob = float(double(x[token]) - lse);
  if (top_n > 0) {
    std::vector<int32_t> idx(static_cast<size_t>(n));
    std::iota(idx.begin(), idx.end(), 0);
    const int k = std::min(top_n, n);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [x](int32_t a, int32_t b) { return x[a] > x[b] || (x[a] == x[b] && a < b); });
    for (int i = 0; i < k; ++i) r.top.emplace_back(idx[size_t(i)], float(double(x[idx[size_t(i)]]) - lse));
  }
  return r;
}

nlohmann::json logprobs_json(const std::vector<TokenLogprob>& lp, size_t from, size_t to, const Tokenizer& tok,
                             bool chat, size_t text_offset0) {
  using nlohmann::json;
  // A token's text may be part of a UTF-8 character: the JSON string gets U+FFFD for it (dump's
  // replace handler), chat entries also carry the exact bytes.
  auto bytes = [](const std::string& s) {
    json b = json::array();
    for (unsigned char c : s) b.push_back(int(c));
    return b;
  };
  if (chat) {
    json content = json::array();
    for (size_t i = from; i < to && i < lp.size(); ++i) {
      const std::string t = tok.piece(lp[i].token);
      json top = json::array();
      for (const auto& [id, l] : lp[i].top) {
        const std::string s = tok.piece(id);
        top.push_back({{"token", s}, {"logprob", l}, {"bytes", bytes(s)}});
      }
      content.push_back({{"token", t}, {"logprob", lp[i].logprob}, {"bytes", bytes(t)}, {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t off = text_offset0;
  for (size_t i = from; i < to && i < lp.size(); ++i) {
    const std::string t = tok.piece(lp[i].token);
    tokens.push_back(t);
    lps.push_back(lp[i].logprob);
    json top = json::object();
    for (const auto& [id, l] : lp[i].top) top[tok.piece(id)] = l;
    tops.push_back(top);
    offsets.push_back(off);
    off += t.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace vq
