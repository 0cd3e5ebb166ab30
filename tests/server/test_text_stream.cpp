// TextStream: every emitted string is valid UTF-8 even when tokens split characters; broken bytes
// become U+FFFD; stop strings that span tokens end the stream without being emitted, and text that
// only looked like the start of one is released. On the real tokenizer, streaming token by token
// gives the same text as decoding all ids at once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "model_fetch/model_fetch.h"
#include "model/model.h"
#include "text/tokenizer.h"
#include "server/text_stream.h"

using namespace vq;

namespace {

const Tokenizer& tiny_tokenizer() {
  static const Tokenizer t = [] {
    TokenizerData d;
    d.model = "gpt2";
    d.tokens = {"a", "b"};
    return Tokenizer(d);
  }();
  return t;
}

bool valid_utf8(const std::string& s) {
  std::string bytes = s, out;
  take_utf8(bytes, out, true);
  return out == s;  // nothing replaced, nothing held
}

// Feeds `pieces` one by one; returns what was emitted piece by piece, then the flush.
std::vector<std::string> feed(TextStream& ts, const std::vector<std::string>& pieces) {
  std::vector<std::string> out;
  for (const auto& p : pieces) out.push_back(ts.push_bytes(p));
  out.push_back(ts.finish());
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += x;
  return s;
}

}  // namespace

TEST(Utf8, CharactersSplitAcrossPiecesWaitUntilComplete) {
  TextStream ts(tiny_tokenizer(), {});
  const std::string crab = "\xF0\x9F\xA6\x80";  // U+1F980, 4 bytes
  const auto out = feed(ts, {"x" + crab.substr(0, 1), crab.substr(1, 2), crab.substr(3) + "\xC3", "\xA9!"});
  EXPECT_EQ(out, (std::vector<std::string>{"x", "", crab, "\xC3\xA9!", ""}));
}

TEST(Utf8, InvalidBytesBecomeReplacementCharacters) {
  const std::string R = "\xEF\xBF\xBD";
  auto clean = [](std::string s, bool flush) {
    std::string out;
    take_utf8(s, out, flush);
    return out + "|" + s;  // emitted | held
  };
  EXPECT_EQ(clean("a\xFF" "b", false), "a" + R + "b|");            // never a lead byte
  EXPECT_EQ(clean("\xC0\xAF", false), R + R + "|");                 // overlong '/'
  EXPECT_EQ(clean("\xED\xA0\x80", false), R + R + R + "|");         // a UTF-16 surrogate
  EXPECT_EQ(clean("\xE2\x82" "x", false), R + "x|");                // a character cut short by 'x'
  EXPECT_EQ(clean("ok\xE2\x82", false), "ok|\xE2\x82");             // incomplete at the end: held
  EXPECT_EQ(clean("ok\xE2\x82", true), "ok" + R + "|");             // ... until the flush
  EXPECT_EQ(clean("\xF4\x90\x80\x80", false), R + R + R + R + "|");  // past U+10FFFF
  EXPECT_TRUE(valid_utf8("caf\xC3\xA9 \xF0\x9F\xA6\x80"));
}

TEST(StopStrings, SpanningPiecesEndTheStreamUnemitted) {
  TextStream ts(tiny_tokenizer(), {"END", "\n\n"});
  const auto out = feed(ts, {"Hello E", "N", "D and more"});
  EXPECT_EQ(out, (std::vector<std::string>{"Hello ", "", "", ""}));
  EXPECT_TRUE(ts.stopped());
  EXPECT_EQ(ts.push_bytes("late"), "") << "nothing after the stop";
}

TEST(StopStrings, FalseStartsAreReleasedAndTheEarliestStopWins) {
  TextStream a(tiny_tokenizer(), {"stop here"});
  const auto out = feed(a, {"sto", "p the", "re"});
  EXPECT_EQ(join(out), "stop there");
  EXPECT_EQ(out[0], "") << "'sto' may start the stop string";
  EXPECT_FALSE(a.stopped());
  TextStream b(tiny_tokenizer(), {"cd", "bcx", "b"});
  EXPECT_EQ(b.push_bytes("abcd"), "a") << "'b' appears first";
  EXPECT_TRUE(b.stopped());
  TextStream c(tiny_tokenizer(), {"\xC3\xA9t\xC3\xA9"});  // a stop string with multi-byte characters
  EXPECT_EQ(join(feed(c, {"l'\xC3", "\xA9t", "\xC3\xA9 !"})), "l'");
}

TEST(TextStreamRealTokenizer, TokenByTokenEqualsDecodingAtOnce) {
  if (!default_model_present()) GTEST_SKIP() << "the default model is absent: run scripts/setup.sh";
  const auto model = Model::load(default_model_location());
  const Tokenizer& tok = model->tokenizer();
  const std::string text = "Crabs \xF0\x9F\xA6\x80\xF0\x9F\xA6\x80, caf\xC3\xA9s, \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E and \xD0\x9C\xD0\xBE\xD1\x81\xD0\xBA\xD0\xB2\xD0\xB0.";
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  int split = 0;  // tokens whose piece alone is not valid UTF-8
  for (int32_t id : ids) split += valid_utf8(tok.piece(id)) ? 0 : 1;
  EXPECT_GT(split, 0) << "the text should make the tokenizer split characters";
  TextStream ts(tok, {});
  std::string streamed;
  for (int32_t id : ids) {
    const std::string d = ts.push(id);
    EXPECT_TRUE(valid_utf8(d)) << "token " << id;
    streamed += d;
  }
  streamed += ts.finish();
  EXPECT_EQ(streamed, tok.decode(ids));
  EXPECT_EQ(streamed, text);
}
