// Tokenizer unit tests on tiny hand-made vocabularies: byte-level BPE merges by rank, special
// tokens, SentencePiece merges by score with byte fallback, round trips on arbitrary bytes, the
// pre-tokenizer scanners against their regexes on hand-worked strings, bad data.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "text/tokenizer.h"
#include "text/tokenizer_impl.h"
#include "text/tokenizer_pretok.h"
#include "text/unicode.h"

namespace vq {
namespace {

std::string bl(std::string_view bytes) {  // bytes in the byte-level BPE alphabet
  std::string s;
  for (char c : bytes) unicode::append_utf8(s, byte_to_codepoint(static_cast<uint8_t>(c)));
  return s;
}

// 256 one-byte tokens (ids = byte values + 2), then merged tokens and specials.
TokenizerData tiny_bpe() {
  TokenizerData d;
  d.model = "gpt2";
  d.pre = "gpt2";
  d.tokens = {"<|endoftext|>", "<tool>"};
  d.token_types = {3, 4};
  for (int b = 0; b < 256; ++b) {
    d.tokens.push_back(bl(std::string(1, static_cast<char>(b))));
    d.token_types.push_back(1);
  }
  for (const char* t : {"ll", "he", "hell", "hello", " w", "or", " wor", " world", "bc", "ab"}) {
    d.tokens.push_back(bl(t));
    d.token_types.push_back(1);
  }
  // Ranks: "l l" first; "h e" before "he ll"; "b c" (rank 7) before "a b" (rank 8).
  d.merges = {bl("l") + " " + bl("l"), bl("h") + " " + bl("e"), bl("he") + " " + bl("ll"),
              bl("hell") + " " + bl("o"), bl(" ") + " " + bl("w"), bl("o") + " " + bl("r"),
              bl(" w") + " " + bl("or"), bl("b") + " " + bl("c"), bl("a") + " " + bl("b"),
              bl(" wor") + " " + bl("l"), bl(" worl") + " " + bl("d")};
  d.eos = 0;
  return d;
}

int32_t id_of(const Tokenizer& t, std::string_view bytes) { return t.find_token(bl(bytes)); }

TEST(TokenizerBPE, MergesApplyByRank) {
  TokenizerData d = tiny_bpe();
  d.merges.resize(9);  // drop the " worl"/" world" merges (their tokens don't exist)
  const Tokenizer t(d);
  // "hello": l+l (rank 0), h+e (1), he+ll (2), hell+o (3) -> one token.
  EXPECT_EQ(t.encode("hello", false), (std::vector<int32_t>{id_of(t, "hello")}));
  // " world": " w", "or" then " wor"; "l", "d" have no merge.
  EXPECT_EQ(t.encode(" world", false),
            (std::vector<int32_t>{id_of(t, " wor"), id_of(t, "l"), id_of(t, "d")}));
  // "abc": "b c" has the lower rank, so "a" + "bc", not "ab" + "c".
  EXPECT_EQ(t.encode("abc", false), (std::vector<int32_t>{id_of(t, "a"), id_of(t, "bc")}));
  // Merges stay inside pre-tokenizer pieces: " hello" is one piece whose pair " h" has no merge,
  // so it becomes " " + "hello".
  EXPECT_EQ(t.encode("hello hello", false),
            (std::vector<int32_t>{id_of(t, "hello"), id_of(t, " "), id_of(t, "hello")}));
}

TEST(TokenizerBPE, UnknownMergeTokenIsAnError) {
  TokenizerData d = tiny_bpe();  // includes " worl" which is not a token
  try {
    Tokenizer t(d);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer.ggml.merges[9]"), std::string::npos) << e.what();
  }
}

TEST(TokenizerBPE, RoundTripsEveryByte) {
  TokenizerData d = tiny_bpe();
  d.merges.resize(9);
  const Tokenizer t(d);
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  for (const std::string& s : {all, std::string("\xC3\x28 invalid \xED\xA0\x80 utf8 \xF0\x9F"), std::string("caf\xC3\xA9  \n\n x")}) {
    const auto ids = t.encode(s, false);
    EXPECT_EQ(t.decode(ids), s);
    std::string streamed;
    for (int32_t id : ids) streamed += t.piece(id);
    EXPECT_EQ(streamed, s);
  }
}

TEST(TokenizerBPE, SpecialTokens) {
  TokenizerData d = tiny_bpe();
  d.merges.resize(9);
  const Tokenizer t(d);
  const auto ids = t.encode("hello<|endoftext|><tool>hello", false);
  EXPECT_EQ(ids, (std::vector<int32_t>{id_of(t, "hello"), 0, 1, id_of(t, "hello")}));
  // Without parse_special the control token is text; the user-defined one still matches.
  const auto plain = t.encode("<|endoftext|><tool>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 0), 0);
  EXPECT_EQ(plain.back(), 1);
  EXPECT_EQ(t.decode(plain), "<|endoftext|><tool>");
  // Control tokens decode to nothing unless asked for.
  EXPECT_EQ(t.decode(ids), "hello<tool>hello");
  EXPECT_EQ(t.decode(ids, true), "hello<|endoftext|><tool>hello");
  EXPECT_TRUE(t.is_eog(0));
  EXPECT_FALSE(t.is_eog(1));
  EXPECT_THROW(t.piece(t.n_vocab()), Error);
  EXPECT_THROW(t.piece(-1), Error);
}

TEST(TokenizerData, InconsistentDataIsAnError) {
  TokenizerData d = tiny_bpe();
  d.merges.resize(9);
  d.scores = {1.0f};
  EXPECT_THROW(Tokenizer{d}, Error);
  d = tiny_bpe();
  d.merges.resize(9);
  d.eos = static_cast<int32_t>(d.tokens.size());
  EXPECT_THROW(Tokenizer{d}, Error);
  d.eos = 0;
  d.model = "bert";
  EXPECT_THROW(Tokenizer{d}, Error);
  d.model = "gpt2";
  d.merges.push_back("nospace");
  EXPECT_THROW(Tokenizer{d}, Error);
}

// SentencePiece: <unk> <s> </s>, byte tokens, then pieces with scores (higher merges first).
TokenizerData tiny_spm() {
  TokenizerData d;
  d.model = "llama";
  d.tokens = {"<unk>", "<s>", "</s>"};
  d.token_types = {2, 3, 3};
  d.scores = {0, 0, 0};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    d.tokens.push_back(buf);
    d.token_types.push_back(6);
    d.scores.push_back(0);
  }
  const std::pair<const char*, float> pieces[] = {
      {"\xE2\x96\x81", -1}, {"h", -2}, {"e", -2}, {"l", -2}, {"o", -2}, {"w", -2}, {"r", -2}, {"d", -2},
      {"ll", -3}, {"\xE2\x96\x81h", -4}, {"el", -3.5f}, {"he", -5}, {"\xE2\x96\x81he", -6}, {"llo", -7},
      {"\xE2\x96\x81hello", -8}, {"or", -9}, {"\xE2\x96\x81w", -9}, {"ld", -10},
  };
  for (const auto& [p, s] : pieces) {
    d.tokens.push_back(p);
    d.token_types.push_back(1);
    d.scores.push_back(s);
  }
  d.bos = 1;
  d.eos = 2;
  d.unk = 0;
  d.add_bos = true;
  d.add_space_prefix = true;
  return d;
}

TEST(TokenizerSPM, MergesByScoreWithDummyPrefix) {
  const Tokenizer t(tiny_spm());
  auto id = [&](const char* s) { return t.find_token(s); };
  // "▁hello": ll (-3) first, then ▁h (-4) — "el" (-3.5) is blocked since "l" is taken by "ll" —
  // then llo (-7) then ▁hello (-8).
  EXPECT_EQ(t.encode("hello", false), (std::vector<int32_t>{id("\xE2\x96\x81hello")}));
  // "▁hello▁world": ▁hello as above, then "▁w" and "or" (both -9, leftmost first), then "ld".
  EXPECT_EQ(t.encode("hello world", true),
            (std::vector<int32_t>{1, id("\xE2\x96\x81hello"), id("\xE2\x96\x81w"), id("or"), id("ld")}));
  // "é" has no piece: byte fallback to <0xC3><0xA9>.
  EXPECT_EQ(t.encode("\xC3\xA9", false),
            (std::vector<int32_t>{id("\xE2\x96\x81"), id("<0xC3>"), id("<0xA9>")}));
}

TEST(TokenizerSPM, RoundTripAndSpecials) {
  const Tokenizer t(tiny_spm());
  for (const std::string s : {"hello world", "  two leading spaces", "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC \xF0\x9F\x99\x82",
                              "tabs\tand\nnewlines\n\n", "trailing  "}) {
    EXPECT_EQ(t.decode(t.encode(s, true)), s) << s;
  }
  // </s> is matched as one control token; the text after it gets a dummy prefix again.
  const auto ids = t.encode("hello</s>hello", true);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, t.find_token("\xE2\x96\x81hello"), 2, t.find_token("\xE2\x96\x81hello")}));
  EXPECT_EQ(t.piece(t.find_token("<0x41>")), "A");
  EXPECT_EQ(t.piece(t.find_token("\xE2\x96\x81hello")), " hello");
  EXPECT_EQ(t.piece(1), "");
  EXPECT_EQ(t.piece(1, true), "<s>");
  EXPECT_TRUE(t.is_eog(2));
  EXPECT_TRUE(t.add_bos_default());
}

TEST(TokenizerSPM, UnknownWithoutByteTokens) {
  TokenizerData d = tiny_spm();
  for (int b = 0; b < 256; ++b) d.token_types[3 + static_cast<size_t>(b)] = 5;  // unused, not bytes
  const Tokenizer t(d);
  EXPECT_EQ(t.encode("\xC3\xA9", false), (std::vector<int32_t>{t.find_token("\xE2\x96\x81"), 0, 0}));
}

// Pre-tokenizers on hand-worked strings (expected pieces derived from the regexes by hand).
std::vector<std::string> split(detail::PreTokKind k, std::string_view s) {
  std::vector<detail::Span> spans;
  detail::pre_tokenize(k, s, spans);
  std::vector<std::string> out;
  size_t pos = 0;
  for (const auto& sp : spans) {
    EXPECT_EQ(sp.off, pos);  // contiguous, covering every byte
    out.emplace_back(s.substr(sp.off, sp.len));
    pos = sp.off + sp.len;
  }
  EXPECT_EQ(pos, s.size());
  return out;
}

using V = std::vector<std::string>;

TEST(PreTokenizer, Gpt2) {
  using detail::PreTokKind;
  EXPECT_EQ(split(PreTokKind::Gpt2, "Hello world's  end 123!?\n\nx "),
            (V{"Hello", " world", "'s", " ", " end", " 123", "!?", "\n", "\n", "x", " "}));
  EXPECT_EQ(split(PreTokKind::Gpt2, "DON'T (x) a\tb"), (V{"DON", "'", "T", " (", "x", ")", " a", "\t", "b"}));
  EXPECT_EQ(split(PreTokKind::Gpt2, "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC"), (V{"caf\xC3\xA9", " \xE6\x97\xA5\xE6\x9C\xAC"}));
}

TEST(PreTokenizer, Llama3AndQwen2) {
  using detail::PreTokKind;
  EXPECT_EQ(split(PreTokKind::Llama3, "DON'T (hello) 12345 x\n\n  y.\n"),
            (V{"DON", "'T", " (", "hello", ")", " ", "123", "45", " x", "\n\n", " ", " y", ".\n"}));
  EXPECT_EQ(split(PreTokKind::Qwen2, "a 123"), (V{"a", " ", "1", "2", "3"}));
  EXPECT_EQ(split(PreTokKind::Llama3, "\tword  \n"), (V{"\tword", "  \n"}));
}

TEST(PreTokenizer, SmolLMDigitsAreIsolated) {
  EXPECT_EQ(split(detail::PreTokKind::SmolLM, "abc 123x  4"), (V{"abc", " ", "1", "2", "3", "x", "  ", "4"}));
}

TEST(PreTokenizer, NamesMapToScanners) {
  bool known = false;
  EXPECT_EQ(detail::pretok_from_name("smollm", &known), detail::PreTokKind::SmolLM);
  EXPECT_TRUE(known);
  EXPECT_EQ(detail::pretok_from_name("llama-bpe"), detail::PreTokKind::Llama3);
  EXPECT_EQ(detail::pretok_from_name("qwen2"), detail::PreTokKind::Qwen2);
  EXPECT_EQ(detail::pretok_from_name("something-new", &known), detail::PreTokKind::Gpt2);
  EXPECT_FALSE(known);
}

TEST(Unicode, Classes) {
  using namespace unicode;
  EXPECT_EQ(char_class(0xE9), kLetter);     // é
  EXPECT_EQ(char_class(0x65E5), kLetter);   // 日
  EXPECT_EQ(char_class(0x0663), kNumber);   // Arabic-Indic three
  EXPECT_EQ(char_class(0x216B), kNumber);   // Roman numeral twelve (Nl)
  EXPECT_EQ(char_class(0xB2), kNumber);     // superscript two (No)
  EXPECT_EQ(char_class(0x3000), kSpace);
  EXPECT_EQ(char_class(0xA0), kSpace);
  EXPECT_EQ(char_class(0x200B), kOther);    // zero width space is not White_Space
  EXPECT_EQ(char_class(0x0301), kOther);    // combining acute (Mn)
  EXPECT_EQ(char_class(0x1F642), kOther);   // emoji
  EXPECT_EQ(char_class(0x2014), kOther);    // em dash
}

TEST(Unicode, DecodeRejectsInvalidSequences) {
  int len = 0;
  for (const char* bad : {"\xC0\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xE2\x82", "\x80"}) {
    const uint32_t cp = unicode::decode_utf8(bad, 0, &len);
    EXPECT_EQ(len, 1) << bad;
    EXPECT_EQ(unicode::char_class(cp), unicode::kOther);
  }
  EXPECT_EQ(unicode::decode_utf8("\xF0\x9F\x99\x82", 0, &len), 0x1F642u);
  EXPECT_EQ(len, 4);
}

}  // namespace
}  // namespace vq
