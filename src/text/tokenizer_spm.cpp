// SentencePiece-style tokenization (the "llama" GGUF tokenizer model): spaces become U+2581
// ("▁"), an optional dummy "▁" prefix, then the text is split into characters and adjacent
// symbols are merged greedily, highest vocabulary score first (leftmost on ties), as long as the
// concatenation is a piece of the vocabulary. A character without a piece falls back to its
// bytes' <0xXX> tokens (or the unknown token when the vocabulary has no byte tokens).
#include <queue>

#include "text/tokenizer_impl.h"
#include "text/unicode.h"

namespace vq {

namespace {
constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581
}

void Tokenizer::Impl::encode_spm(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const {
  std::string norm;  // the text with spaces replaced by the marker, plus the optional prefix
  norm.reserve(text.size() + 16);
  if (prefix_space) norm += kSpaceMarker;
  for (char ch : text) {
    if (ch == ' ') norm += kSpaceMarker;
    else norm.push_back(ch);
  }
  if (norm.empty()) return;

  struct Sym { uint32_t off, len; int32_t prev, next; };
  std::vector<Sym> sym;  // [n_chars] linked list over norm
  for (size_t i = 0; i < norm.size();) {
    int len = 1;
    unicode::decode_utf8(norm, i, &len);
    const auto n = static_cast<int32_t>(sym.size());
    sym.push_back(Sym{static_cast<uint32_t>(i), static_cast<uint32_t>(len), n - 1, -1});
    if (n > 0) sym[static_cast<size_t>(n - 1)].next = n;
    i += static_cast<size_t>(len);
  }
  struct Cand { float score; int32_t left, right; uint32_t len; };
  auto worse = [](const Cand& a, const Cand& b) { return a.score != b.score ? a.score < b.score : a.left > b.left; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  const std::string_view nv(norm);
  auto consider = [&](int32_t l) {
    if (l < 0) return;
    const Sym& a = sym[static_cast<size_t>(l)];
    if (a.next < 0) return;
    const Sym& b = sym[static_cast<size_t>(a.next)];
    const int32_t id = lookup(nv.substr(a.off, a.len + b.len));
    if (id < 0) return;
    const TokenType t = type(id);
    if (t != TokenType::Normal && t != TokenType::UserDefined && t != TokenType::Undefined) return;
    const float score = d.scores.empty() ? 0.0f : d.scores[static_cast<size_t>(id)];
    heap.push(Cand{score, l, a.next, a.len + b.len});
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(sym.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = sym[static_cast<size_t>(c.left)];
    if (l.len == 0 || l.next != c.right) continue;
    Sym& r = sym[static_cast<size_t>(c.right)];
    if (l.len + r.len != c.len) continue;  // stale: a side has grown since
    l.len += r.len;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.left;
    r.len = 0;
    consider(l.prev);
    consider(c.left);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const Sym& s = sym[static_cast<size_t>(i)];
    const std::string_view piece = nv.substr(s.off, s.len);
    const int32_t id = lookup(piece);
    if (id >= 0 && s.len > 0) { out.push_back(id); continue; }
    for (char ch : piece) {
      const int32_t b = byte_fallback[static_cast<uint8_t>(ch)];
      if (b >= 0) out.push_back(b);
      else if (d.unk >= 0) out.push_back(d.unk);
    }
  }
}

}  // namespace vq
