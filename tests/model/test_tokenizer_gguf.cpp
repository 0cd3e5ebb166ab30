// tokenizer_from_gguf: a tiny SentencePiece vocabulary written with the test GGUF writer, bad
// tokenizer metadata, and the real SmolLM2 GGUF (round trips on real text, special tokens, every
// vocabulary entry re-encodes to itself, chat template). The id-level comparison with an
// independent implementation is tests/python/test_tokenizer_reference.py.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "text/chat_template.h"
#include "model/gguf.h"
#include "model/text_gguf.h"
#include "model/gguf_writer.h"
#include "text/tokenizer.h"

namespace vq {
namespace {

std::vector<uint8_t> spm_gguf(bool with_model = true, int64_t bos = 1) {
  test::GGUFWriter w;
  w.add_string("general.architecture", "llama");
  if (with_model) w.add_string("tokenizer.ggml.model", "llama");
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    tokens.push_back(buf);
    types.push_back(6);
    scores.push_back(0);
  }
  for (const char* p : {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "\xE2\x96\x81" "ab"}) {
    tokens.push_back(p);
    types.push_back(1);
    scores.push_back(-static_cast<float>(tokens.size()));
  }
  w.add_string_array("tokenizer.ggml.tokens", tokens);
  w.add_int32_array("tokenizer.ggml.token_type", types);
  w.add_float32_array("tokenizer.ggml.scores", scores);
  w.add_uint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(bos));
  w.add_uint32("tokenizer.ggml.eos_token_id", 2);
  w.add_bool("tokenizer.ggml.add_bos_token", true);
  w.add_string("tokenizer.chat_template", "{{ '[INST] ' + content + ' [/INST]' }}");
  return w.bytes();
}

TEST(TokenizerGGUF, FromMetadata) {
  const auto bytes = spm_gguf();
  auto g = GGUFFile::from_memory(bytes.data(), bytes.size(), "tiny.gguf");
  const Tokenizer t = tokenizer_from_gguf(*g);
  EXPECT_EQ(t.model(), "llama");
  EXPECT_EQ(t.n_vocab(), 3 + 256 + 6);
  EXPECT_EQ(t.bos(), 1);
  EXPECT_EQ(t.eos(), 2);
  EXPECT_TRUE(t.add_bos_default());
  const auto ids = t.encode("ab ab", t.add_bos_default());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, t.find_token("\xE2\x96\x81" "ab"), t.find_token("\xE2\x96\x81" "ab")}));
  EXPECT_EQ(t.decode(ids), "ab ab");
  EXPECT_EQ(detect_chat_format(t.chat_template()), ChatFormat::Llama2);
  EXPECT_EQ(apply_chat_template(*g, {{"user", "x"}, {"assistant", "y"}, {"user", "z"}}, true),
            "[INST] x [/INST] y </s><s>[INST] z [/INST]");
}

TEST(TokenizerGGUF, BadMetadataNamesTheKey) {
  auto expect_error = [](const std::vector<uint8_t>& bytes, const char* key) {
    auto g = GGUFFile::from_memory(bytes.data(), bytes.size(), "bad.gguf");
    try {
      tokenizer_from_gguf(*g);
      ADD_FAILURE() << "expected an error naming " << key;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("bad.gguf"), std::string::npos) << e.what();
    }
  };
  expect_error(spm_gguf(false), "tokenizer.ggml.model");
  expect_error(spm_gguf(true, 100000), "tokenizer.ggml.bos_token_id");
}

std::string smollm2_path() {
  if (const char* p = std::getenv("VQ_SMOLLM2_GGUF")) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/veloxquant/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

TEST(TokenizerSmolLM2, RoundTripsRealTextAndSpecials) {
  const std::string path = smollm2_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SmolLM2 GGUF not found at " << path << " (scripts/setup.sh fetches it)";
  GGUFFile g(path);
  const Tokenizer t = tokenizer_from_gguf(g);
  EXPECT_EQ(t.model(), "gpt2");
  EXPECT_EQ(t.pre(), "smollm");
  EXPECT_EQ(t.n_vocab(), 49152);
  EXPECT_FALSE(t.add_bos_default());

  std::string text = read_file("/usr/share/doc/python3-doc/html/_sources/tutorial/controlflow.rst.txt");
  if (text.empty()) text = read_file(std::string(VQ_SOURCE_DIR) + "/docs/BENCHMARKS.md");
  ASSERT_GT(text.size(), 1000u) << "no real text found";
  text += "\ncaf\xC3\xA9 na\xC3\xAFve \xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E \xF0\x9F\x99\x82  x = [1, 22, 333]\n\n\t end";
  const auto ids = t.encode(text, false);
  EXPECT_LT(ids.size(), text.size() / 2);  // real BPE compression (English is ~4 bytes/token)
  EXPECT_EQ(t.decode(ids), text);
  std::string streamed;
  for (int32_t id : ids) streamed += t.piece(id);
  EXPECT_EQ(streamed, text);

  const int32_t im_start = t.find_token("<|im_start|>"), im_end = t.find_token("<|im_end|>");
  ASSERT_GE(im_start, 0);
  const auto chat = t.encode("<|im_start|>user\nHi<|im_end|>", false);
  EXPECT_EQ(chat.front(), im_start);
  EXPECT_EQ(chat.back(), im_end);
  EXPECT_EQ(t.decode(chat, true), "<|im_start|>user\nHi<|im_end|>");
  EXPECT_EQ(t.decode(chat), "user\nHi");
  EXPECT_TRUE(t.is_eog(t.eos()));
  EXPECT_TRUE(t.is_eog(im_end));
  EXPECT_TRUE(t.is_eog(t.find_token("<|endoftext|>")));
  EXPECT_FALSE(t.is_eog(im_start));

  const std::string prompt = apply_chat_template(g, {{"user", "Hi"}}, true);
  EXPECT_EQ(prompt, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(apply_chat_template(t, {{"user", "Hi"}}, true), prompt);
}

TEST(TokenizerSmolLM2, EveryNormalTokenReencodesToItself) {
  const std::string path = smollm2_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SmolLM2 GGUF not found at " << path;
  GGUFFile g(path);
  const Tokenizer t = tokenizer_from_gguf(g);
  // A token's bytes, encoded alone, must decode back to the same bytes (and usually be the token
  // itself; BPE may legitimately pick another split for a few, so only the bytes are required).
  int same = 0, normal = 0;
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    if (t.is_control(id)) continue;
    ++normal;
    const std::string p = t.piece(id);
    const auto ids = t.encode(p, false, false);
    ASSERT_EQ(t.decode(ids), p) << "token " << id;
    same += ids.size() == 1 && ids[0] == id;
  }
  EXPECT_GT(same, normal * 9 / 10) << same << " of " << normal;
}

}  // namespace
}  // namespace vq
