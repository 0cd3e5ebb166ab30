// Tokenizer construction, special-token partition of the input, decode and accessors.
#include "text/tokenizer.h"

#include <algorithm>

#include "core/error.h"
#include "text/tokenizer_impl.h"
#include "text/unicode.h"

namespace vq {

namespace {

// Parses "<0xXX>"; -1 when s is not a byte token text.
int parse_byte_token(std::string_view s) {
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = s[i];
    int h;
    if (c >= '0' && c <= '9') h = c - '0';
    else if (c >= 'A' && c <= 'F') h = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f') h = c - 'a' + 10;
    else return -1;
    v = v * 16 + h;
  }
  return v;
}

// The bytes a byte-level BPE token stands for: each code point mapped back to its byte; a code
// point outside the map (text added verbatim) is kept as its UTF-8.
std::string bpe_token_bytes(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    int len = 1;
    const uint32_t cp = unicode::decode_utf8(text, i, &len);
    const int b = codepoint_to_byte(cp);
    if (b >= 0) out.push_back(static_cast<char>(b));
    else out.append(text.substr(i, static_cast<size_t>(len)));
    i += static_cast<size_t>(len);
  }
  return out;
}

std::string spm_token_bytes(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    if (text.compare(i, 3, "\xE2\x96\x81") == 0) { out.push_back(' '); i += 3; }
    else out.push_back(text[i++]);
  }
  return out;
}

}  // namespace

Tokenizer::Tokenizer(const TokenizerData& data) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.d = data;
  TokenizerData& d = m.d;
  const size_t n = d.tokens.size();
  VQ_CHECK(n > 0, "tokenizer: tokenizer.ggml.tokens is empty");
  VQ_CHECK(n < (1u << 31), "tokenizer: tokenizer.ggml.tokens has {} entries (too many)", n);
  if (d.model == "llama") m.spm = true;
  else VQ_CHECK(d.model == "gpt2", "tokenizer: tokenizer.ggml.model '{}' is not supported (expected 'gpt2' or 'llama')", d.model);
  VQ_CHECK(d.scores.empty() || d.scores.size() == n,
           "tokenizer: tokenizer.ggml.scores has {} entries, tokenizer.ggml.tokens has {}", d.scores.size(), n);
  VQ_CHECK(d.token_types.empty() || d.token_types.size() == n,
           "tokenizer: tokenizer.ggml.token_type has {} entries, tokenizer.ggml.tokens has {}", d.token_types.size(), n);
  if (d.token_types.empty()) d.token_types.assign(n, static_cast<int32_t>(TokenType::Normal));
  for (size_t i = 0; i < n; ++i) {
    VQ_CHECK(d.token_types[i] >= 0 && d.token_types[i] <= 6, "tokenizer: tokenizer.ggml.token_type[{}] = {} is not a token type (0..6)", i, d.token_types[i]);
  }
  auto check_id = [&](int32_t id, const char* field) {
    VQ_CHECK(id >= -1 && id < static_cast<int64_t>(n), "tokenizer: {} = {} is outside the vocabulary of {} tokens", field, id, n);
  };
  check_id(d.bos, "tokenizer.ggml.bos_token_id");
  check_id(d.eos, "tokenizer.ggml.eos_token_id");
  check_id(d.eot, "tokenizer.ggml.eot_token_id");
  check_id(d.pad, "tokenizer.ggml.padding_token_id");
  check_id(d.unk, "tokenizer.ggml.unknown_token_id");
  VQ_CHECK(!d.add_bos || d.bos >= 0, "tokenizer: tokenizer.ggml.add_bos_token is set but there is no bos_token_id");

  m.text_to_id.reserve(n * 2);
  for (size_t i = 0; i < n; ++i) m.text_to_id.emplace(std::string_view(d.tokens[i]), static_cast<int32_t>(i));  // first wins on duplicates

  m.byte_token.fill(-1);
  m.byte_fallback.fill(-1);
  if (m.spm) {
    for (size_t i = 0; i < n; ++i) {
      if (static_cast<TokenType>(d.token_types[i]) != TokenType::Byte) continue;
      const int b = parse_byte_token(d.tokens[i]);
      if (b >= 0 && m.byte_fallback[static_cast<size_t>(b)] < 0) m.byte_fallback[static_cast<size_t>(b)] = static_cast<int32_t>(i);
    }
  } else {
    bool known = true;
    m.pretok = detail::pretok_from_name(d.pre, &known);  // unknown names: GPT-2 pattern (documented)
    m.ignore_merges = m.pretok == detail::PreTokKind::Llama3;
    for (int b = 0; b < 256; ++b) {
      std::string s;
      unicode::append_utf8(s, byte_to_codepoint(static_cast<uint8_t>(b)));
      m.byte_token[static_cast<size_t>(b)] = m.lookup(s);
      m.byte_char[static_cast<size_t>(b)] = std::move(s);
    }
    m.merges.reserve(d.merges.size() * 2);
    for (size_t r = 0; r < d.merges.size(); ++r) {
      const std::string& mg = d.merges[r];
      const size_t sp = mg.find(' ', 1);
      VQ_CHECK(sp != std::string::npos && sp + 1 < mg.size(), "tokenizer: tokenizer.ggml.merges[{}] = '{}' is not 'left right'", r, mg);
      const std::string_view left(mg.data(), sp), right(mg.data() + sp + 1, mg.size() - sp - 1);
      const int32_t a = m.lookup(left), b = m.lookup(right);
      const int32_t c = m.lookup(std::string(left) + std::string(right));
      VQ_CHECK(a >= 0 && b >= 0 && c >= 0, "tokenizer: tokenizer.ggml.merges[{}] = '{}' names a token not in the vocabulary", r, mg);
      m.merges.emplace((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b),
                       Impl::Merge{static_cast<int32_t>(r), c});  // first (lowest rank) wins
    }
  }

  m.pieces.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = static_cast<TokenType>(d.token_types[i]);
    const std::string& s = d.tokens[i];
    if (t == TokenType::Control || t == TokenType::Unknown || t == TokenType::Unused) {
      m.pieces[i] = s;  // rendered only on request (special = true)
    } else if (t == TokenType::Byte) {
      const int b = parse_byte_token(s);
      m.pieces[i] = b >= 0 ? std::string(1, static_cast<char>(b)) : s;
    } else if (t == TokenType::UserDefined) {
      m.pieces[i] = m.spm ? spm_token_bytes(s) : s;
    } else {
      m.pieces[i] = m.spm ? spm_token_bytes(s) : bpe_token_bytes(s);
    }
  }

  // Special tokens matched in text: control and unknown (only with parse_special) and
  // user-defined (always), longest first.
  std::vector<int32_t> special;
  for (size_t i = 0; i < n; ++i) {
    const TokenType t = static_cast<TokenType>(d.token_types[i]);
    if ((t == TokenType::Control || t == TokenType::UserDefined || t == TokenType::Unknown) && !d.tokens[i].empty())
      special.push_back(static_cast<int32_t>(i));
  }
  std::stable_sort(special.begin(), special.end(), [&](int32_t a, int32_t b) {
    return d.tokens[static_cast<size_t>(a)].size() > d.tokens[static_cast<size_t>(b)].size();
  });
  for (int32_t id : special) m.special_by_byte[static_cast<uint8_t>(d.tokens[static_cast<size_t>(id)][0])].push_back(id);

  m.eog.assign(n, 0);
  for (int32_t id : {d.eos, d.eot}) if (id >= 0) m.eog[static_cast<size_t>(id)] = 1;
  static const char* kEndTexts[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|endoftext|>",
                                    "<end_of_turn>", "</s>", "<|end_of_text|>"};
  for (const char* t : kEndTexts) {
    const int32_t id = m.lookup(t);
    if (id >= 0 && m.type(id) == TokenType::Control) m.eog[static_cast<size_t>(id)] = 1;
  }
}

Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  if (add_bos && m.d.bos >= 0) out.push_back(m.d.bos);
  bool after_special = true;  // SentencePiece: a dummy prefix at the start and after each special token
  auto encode_text = [&](std::string_view frag) {
    if (frag.empty()) return;
    if (m.spm) m.encode_spm(frag, m.d.add_space_prefix && after_special, out);
    else m.encode_bpe(frag, out);
    after_special = false;
  };
  size_t start = 0;  // start of the pending plain-text fragment
  for (size_t i = 0; i < text.size();) {
    int32_t hit = -1;
    for (int32_t id : m.special_by_byte[static_cast<uint8_t>(text[i])]) {
      const TokenType t = m.type(id);
      if (!parse_special && t != TokenType::UserDefined) continue;
      const std::string& s = m.d.tokens[static_cast<size_t>(id)];
      if (text.compare(i, s.size(), s) == 0) { hit = id; break; }
    }
    if (hit < 0) { ++i; continue; }
    encode_text(text.substr(start, i - start));
    out.push_back(hit);
    after_special = true;
    i += m.d.tokens[static_cast<size_t>(hit)].size();
    start = i;
  }
  encode_text(text.substr(start));
  return out;
}

std::string Tokenizer::piece(int32_t id, bool special) const {
  const Impl& m = *impl_;
  VQ_CHECK(id >= 0 && id < n_vocab(), "tokenizer: token id {} is outside the vocabulary of {} tokens", id, n_vocab());
  const TokenType t = m.type(id);
  if (!special && (t == TokenType::Control || t == TokenType::Unknown || t == TokenType::Unused)) return {};
  return m.pieces[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  const Impl& m = *impl_;
  std::string out;
  bool strip = m.spm && m.d.add_space_prefix;  // drop the dummy prefix of the first text token
  for (int32_t id : ids) {
    std::string p = piece(id, special);
    const TokenType t = m.type(id);
    if (strip && t != TokenType::Control) {
      if (!p.empty() && p[0] == ' ') p.erase(0, 1);
      strip = false;
    }
    out += p;
  }
  return out;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  VQ_CHECK(id >= 0 && id < n_vocab(), "tokenizer: token id {} is outside the vocabulary of {} tokens", id, n_vocab());
  return impl_->d.tokens[static_cast<size_t>(id)];
}

int32_t Tokenizer::bos() const { return impl_->d.bos; }
int32_t Tokenizer::eos() const { return impl_->d.eos; }
int32_t Tokenizer::eot() const { return impl_->d.eot; }
bool Tokenizer::is_eog(int32_t id) const { return id >= 0 && id < n_vocab() && impl_->eog[static_cast<size_t>(id)] != 0; }
bool Tokenizer::is_control(int32_t id) const { return id >= 0 && id < n_vocab() && impl_->type(id) == TokenType::Control; }
int Tokenizer::n_vocab() const { return static_cast<int>(impl_->d.tokens.size()); }
bool Tokenizer::add_bos_default() const { return impl_->d.add_bos; }
const std::string& Tokenizer::model() const { return impl_->d.model; }
const std::string& Tokenizer::pre() const { return impl_->d.pre; }
const std::string& Tokenizer::chat_template() const { return impl_->d.chat_template; }
int32_t Tokenizer::find_token(std::string_view text) const { return impl_->lookup(text); }

}  // namespace vq
