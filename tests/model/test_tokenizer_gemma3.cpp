// The Gemma 3 tokenizer from the real GGUF (SentencePiece "llama" model, 262k pieces, no dummy
// prefix, user-defined newline runs, <start_of_turn>/<end_of_turn> control tokens, byte
// fallback) and its chat format (the GGUF ships no template). Expected ids are llama.cpp's
// tokenization of the same strings (llama-cpp-python 0.3.16); tests/python/
// test_llamacpp_parity.py compares whole prompts when llama.cpp is installed.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "text/chat_template.h"
#include "model/gguf.h"
#include "model/text_gguf.h"
#include "text/tokenizer.h"
#include "model_fetch/model_fetch.h"

namespace vq {
namespace {

std::string gemma3_path() {
  if (const char* p = std::getenv("VQ_GEMMA3_GGUF")) return p;
  return model_location(*find_known_model("gemma3-270m"));
}

#define VQ_REQUIRE_GEMMA3(path)                      \
  const std::string path = gemma3_path();            \
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "Gemma 3 GGUF not found at " << path << " (scripts/setup.sh fetches it)"

TEST(TokenizerGemma3, MatchesLlamaCppOnPiecesSpecialsAndBytes) {
  VQ_REQUIRE_GEMMA3(path);
  GGUFFile g(path);
  const Tokenizer t = tokenizer_from_gguf(g);
  EXPECT_EQ(t.n_vocab(), 262144);
  EXPECT_EQ(t.bos(), 2);
  EXPECT_EQ(t.eos(), 1);
  EXPECT_TRUE(t.add_bos_default());
  using V = std::vector<int32_t>;
  EXPECT_EQ(t.encode("Hello world", false), (V{9259, 1902}));  // no dummy prefix space
  EXPECT_EQ(t.encode("\n\n", false), (V{108}));                // user-defined newline run
  EXPECT_EQ(t.encode("  x", false), (V{138, 236781}));
  EXPECT_EQ(t.encode("a\x01" "b", false), (V{236746, 249732, 236763}));
  EXPECT_EQ(t.encode("\xF0\x93\x80\x80", false), (V{478, 385, 366, 366}));  // U+13000: byte fallback
  const V chat = t.encode("<start_of_turn>user\nHi<end_of_turn>\n", true);
  ASSERT_GE(chat.size(), 5u);
  EXPECT_EQ(chat[0], 2);
  EXPECT_EQ(chat[1], 105);
  EXPECT_EQ(chat[chat.size() - 2], 106);
  EXPECT_TRUE(t.is_eog(106));  // <end_of_turn> ends a reply
  EXPECT_TRUE(t.is_eog(1));
  EXPECT_FALSE(t.is_eog(105));
  EXPECT_EQ(t.decode(chat), "user\nHi\n");
  const std::string mixed = "Ünïcödé 日本語 🤖  two  spaces\n\n\tend \xF0\x93\x80\x80.";
  EXPECT_EQ(t.decode(t.encode(mixed, false)), mixed);
}

TEST(TokenizerGemma3, TemplateLessGgufGetsTheGemmaChatFormat) {
  VQ_REQUIRE_GEMMA3(path);
  GGUFFile g(path);
  EXPECT_FALSE(g.has("tokenizer.chat_template"));
  EXPECT_EQ(detect_chat_format(model_chat_template(g)), ChatFormat::Gemma);
  const std::string want = "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n";
  EXPECT_EQ(apply_chat_template(g, {{"user", "Hi"}}, true), want);
  EXPECT_EQ(apply_chat_template(tokenizer_from_gguf(g), {{"user", "Hi"}}, true), want);
}

}  // namespace
}  // namespace vq
