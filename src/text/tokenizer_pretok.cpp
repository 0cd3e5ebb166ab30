#include "text/tokenizer_pretok.h"

#include "text/unicode.h"

namespace vq::detail {

namespace {

using unicode::CharClass;

// One decoded code point of the input: [n+1] entries, the last a sentinel at text.size().
struct CP {
  uint32_t cp;
  uint32_t off;
  CharClass cls;
};

constexpr CharClass kNone = static_cast<CharClass>(255);  // past the end of the scanned range

class Scanner {
 public:
  Scanner(const std::vector<CP>& c, size_t b, size_t e, std::vector<Span>& out) : c_(c), b_(b), e_(e), out_(out) {}

  void gpt2() {
    size_t i = b_;
    while (i < e_) {
      const uint32_t ch = c_[i].cp;
      const CharClass cl = c_[i].cls;
      size_t n;
      if (ch == '\'' && (n = contraction(i, false)) != 0) { i = emit(i, i + n); continue; }
      const bool sp = ch == ' ';
      if (cl == unicode::kLetter || (sp && cls(i + 1) == unicode::kLetter)) { i = emit(i, run(sp ? i + 1 : i, unicode::kLetter)); continue; }
      if (cl == unicode::kNumber || (sp && cls(i + 1) == unicode::kNumber)) { i = emit(i, run(sp ? i + 1 : i, unicode::kNumber)); continue; }
      if (cl == unicode::kOther || (sp && cls(i + 1) == unicode::kOther)) { i = emit(i, run(sp ? i + 1 : i, unicode::kOther)); continue; }
      i = emit(i, space_tail(i, run(i, unicode::kSpace)));
    }
  }

  void llama3(size_t max_digits) {
    size_t i = b_;
    while (i < e_) {
      const uint32_t ch = c_[i].cp;
      const CharClass cl = c_[i].cls;
      size_t n;
      if (ch == '\'' && (n = contraction(i, true)) != 0) { i = emit(i, i + n); continue; }
      const bool crlf = ch == '\r' || ch == '\n';
      // [^\r\n\p{L}\p{N}]?\p{L}+
      if (cl == unicode::kLetter) { i = emit(i, run(i, unicode::kLetter)); continue; }
      if (!crlf && cl != unicode::kNumber && cls(i + 1) == unicode::kLetter) { i = emit(i, run(i + 1, unicode::kLetter)); continue; }
      // \p{N}{1,max}
      if (cl == unicode::kNumber) {
        size_t k = i;
        while (k < e_ && k - i < max_digits && c_[k].cls == unicode::kNumber) ++k;
        i = emit(i, k);
        continue;
      }
      //  ?[^\s\p{L}\p{N}]+[\r\n]*
      if (cl == unicode::kOther || (ch == ' ' && cls(i + 1) == unicode::kOther)) {
        size_t k = run(ch == ' ' ? i + 1 : i, unicode::kOther);
        while (k < e_ && (c_[k].cp == '\r' || c_[k].cp == '\n')) ++k;
        i = emit(i, k);
        continue;
      }
      // \s*[\r\n]+ : up to and including the last \r or \n of the whitespace run
      const size_t k = run(i, unicode::kSpace);
      size_t last_nl = k;
      for (size_t p = k; p > i; --p) {
        if (c_[p - 1].cp == '\r' || c_[p - 1].cp == '\n') { last_nl = p - 1; break; }
      }
      if (last_nl < k) { i = emit(i, last_nl + 1); continue; }
      i = emit(i, space_tail(i, k));
    }
  }

 private:
  CharClass cls(size_t i) const { return i < e_ ? c_[i].cls : kNone; }
  size_t run(size_t i, CharClass cl) const {
    while (i < e_ && c_[i].cls == cl) ++i;
    return i;
  }
  // \s+(?!\S)|\s+ on the whitespace run [i, k): the whole run at the end of the range or when it
  // is one character; otherwise all but its last character (which joins the next piece).
  size_t space_tail(size_t i, size_t k) const { return (k == e_ || k - i == 1) ? k : k - 1; }
  size_t emit(size_t i, size_t k) {
    out_.push_back(Span{c_[i].off, c_[k].off - c_[i].off});
    return k;
  }
  uint32_t lower(size_t i, bool fold) const {
    if (i >= e_) return 0;
    const uint32_t ch = c_[i].cp;
    return (fold && ch >= 'A' && ch <= 'Z') ? ch + 32 : ch;
  }
  // 's 't 're 've 'm 'll 'd at i (an apostrophe): returns the length in code points or 0.
  size_t contraction(size_t i, bool fold) const {
    const uint32_t a = lower(i + 1, fold);
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    const uint32_t b = lower(i + 2, fold);
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
  }

  const std::vector<CP>& c_;
  size_t b_, e_;
  std::vector<Span>& out_;
};

}  // namespace

PreTokKind pretok_from_name(const std::string& name, bool* known) {
  if (known) *known = true;
  if (name == "llama-bpe" || name == "llama3" || name == "smaug-bpe" || name == "falcon3" ||
      name == "dbrx")
    return PreTokKind::Llama3;
  if (name == "qwen2" || name == "deepseek-r1-qwen") return PreTokKind::Qwen2;
  if (name == "smollm" || name == "starcoder" || name == "refact" || name == "codeshell" ||
      name == "command-r")
    return PreTokKind::SmolLM;
  if (name == "default" || name == "gpt2" || name == "gpt-2" || name.empty()) return PreTokKind::Gpt2;
  if (known) *known = false;
  return PreTokKind::Gpt2;
}

const char* pretok_name(PreTokKind k) {
  switch (k) {
    case PreTokKind::Gpt2: return "gpt2";
    case PreTokKind::Llama3: return "llama-bpe";
    case PreTokKind::Qwen2: return "qwen2";
    case PreTokKind::SmolLM: return "smollm";
  }
  return "?";
}

void pre_tokenize(PreTokKind kind, std::string_view text, std::vector<Span>& out) {
  if (text.empty()) return;
  std::vector<CP> c;  // [n_codepoints + 1] decoded input plus sentinel
  c.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    int len = 1;
    const uint32_t cp = unicode::decode_utf8(text, i, &len);
    c.push_back(CP{cp, static_cast<uint32_t>(i), unicode::char_class(cp)});
    i += static_cast<size_t>(len);
  }
  const size_t n = c.size();
  c.push_back(CP{0, static_cast<uint32_t>(text.size()), unicode::kOther});

  switch (kind) {
    case PreTokKind::Gpt2: Scanner(c, 0, n, out).gpt2(); break;
    case PreTokKind::Llama3: Scanner(c, 0, n, out).llama3(3); break;
    case PreTokKind::Qwen2: Scanner(c, 0, n, out).llama3(1); break;
    case PreTokKind::SmolLM: {
      size_t b = 0;
      for (size_t i = 0; i <= n; ++i) {
        if (i < n && c[i].cls != unicode::kNumber) continue;
        if (i > b) Scanner(c, b, i, out).gpt2();
        if (i < n) out.push_back(Span{c[i].off, c[i + 1].off - c[i].off});
        b = i + 1;
      }
      break;
    }
  }
}

}  // namespace vq::detail
