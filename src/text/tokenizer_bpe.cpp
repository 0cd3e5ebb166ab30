// Byte-level BPE (GPT-2 style): pre-tokenize, map each byte of a piece to its printable code
// point's one-character token, then merge adjacent pairs by rank (lowest rank first, leftmost on
// ties) until no listed merge applies.
#include <queue>

#include "text/tokenizer_impl.h"
#include "text/unicode.h"

namespace vq {

uint32_t byte_to_codepoint(uint8_t b) {
  auto printable = [](uint32_t c) {
    return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
  };
  if (printable(b)) return b;
  uint32_t n = 0;
  for (uint32_t c = 0; c < b; ++c) n += printable(c) ? 0 : 1;
  return 256 + n;
}

int codepoint_to_byte(uint32_t cp) {
  static const std::array<int16_t, 512> table = [] {
    std::array<int16_t, 512> t;
    t.fill(-1);
    for (int b = 0; b < 256; ++b) t[byte_to_codepoint(static_cast<uint8_t>(b))] = static_cast<int16_t>(b);
    return t;
  }();
  return cp < table.size() ? table[cp] : -1;
}

void Tokenizer::Impl::encode_bpe(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<detail::Span> spans;
  detail::pre_tokenize(pretok, text, spans);
  for (const auto& s : spans) encode_bpe_word(text.substr(s.off, s.len), out);
}

void Tokenizer::Impl::encode_bpe_word(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    std::string mapped;  // the word in the byte-level alphabet
    for (char ch : word) mapped += byte_char[static_cast<uint8_t>(ch)];
    const int32_t id = lookup(mapped);
    if (id >= 0) { out.push_back(id); return; }
  }
  if (word.size() == 1) {
    const int32_t id = byte_token[static_cast<uint8_t>(word[0])];
    if (id >= 0) out.push_back(id);
    else if (d.unk >= 0) out.push_back(d.unk);
    return;
  }
  struct Sym { int32_t id, prev, next; };
  std::vector<Sym> sym(word.size());  // [n_bytes] linked list of current symbols; id -1: no token
  for (size_t i = 0; i < word.size(); ++i) {
    sym[i] = Sym{byte_token[static_cast<uint8_t>(word[i])], static_cast<int32_t>(i) - 1,
                 i + 1 < word.size() ? static_cast<int32_t>(i + 1) : -1};
  }
  struct Cand { int32_t rank, pos, right, left_id, right_id, merged; };
  auto worse = [](const Cand& a, const Cand& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Cand, std::vector<Cand>, decltype(worse)> heap(worse);
  auto consider = [&](int32_t l) {
    if (l < 0) return;
    const int32_t r = sym[static_cast<size_t>(l)].next;
    if (r < 0) return;
    const int32_t a = sym[static_cast<size_t>(l)].id, b = sym[static_cast<size_t>(r)].id;
    if (a < 0 || b < 0) return;
    auto it = merges.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    if (it != merges.end()) heap.push(Cand{it->second.rank, l, r, a, b, it->second.merged});
  };
  for (size_t i = 0; i + 1 < word.size(); ++i) consider(static_cast<int32_t>(i));
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = sym[static_cast<size_t>(c.pos)];
    if (l.id != c.left_id || l.next != c.right) continue;  // stale: a side has been merged since
    Sym& r = sym[static_cast<size_t>(c.right)];
    if (r.id != c.right_id) continue;
    l.id = c.merged;
    l.next = r.next;
    if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.pos;
    r.id = -2;  // dead
    consider(l.prev);
    consider(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) {
    const int32_t id = sym[static_cast<size_t>(i)].id;
    if (id >= 0) out.push_back(id);
    else if (d.unk >= 0) out.push_back(d.unk);
  }
}

}  // namespace vq
