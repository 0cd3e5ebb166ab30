// The real default model parses; its tensor types are listed and can be used.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "model/gguf.h"

namespace {

std::string smollm2_path() {
  if (const char* p = std::getenv("VQ_SMOLLM2_GGUF")) return p;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : "") + "/.cache/veloxquant/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(GGUFSmolLM2, ParsesAndListsTensorTypes) {
  const std::string path = smollm2_path();
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "SmolLM2 GGUF not found at " << path;
  vq::GGUFFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  const int64_t n_layers = f.get_int("llama.block_count");
  const int64_t n_embd = f.get_int("llama.embedding_length");
  const int64_t n_ff = f.get_int("llama.feed_forward_length");
  EXPECT_EQ(n_layers, 30);
  EXPECT_EQ(n_embd, 576);
  EXPECT_EQ(n_ff, 1536);
  const auto tokens = f.get_string_array("tokenizer.ggml.tokens");
  EXPECT_EQ(tokens.size(), 49152u);
  EXPECT_EQ(f.get_int_array("tokenizer.ggml.token_type").size(), tokens.size());
  EXPECT_GT(f.get_string_array("tokenizer.ggml.merges").size(), 1000u);

  std::map<std::string, int> by_type;
  for (const auto& t : f.tensors()) {
    by_type[vq::ggml_type_name(t.type)]++;
    EXPECT_TRUE(vq::ggml_type_supported(t.type)) << t.name;
    EXPECT_EQ(t.nbytes, vq::ggml_row_bytes(t.type, t.dims[0]) * size_t(t.numel() / t.dims[0])) << t.name;
  }
  std::string listing;
  for (const auto& [name, n] : by_type) listing += name + ": " + std::to_string(n) + "  ";
  std::printf("[ SmolLM2 ] %zu tensors by type: %s\n", f.tensors().size(), listing.c_str());
  // 30 layers x 7 projections in Q4_1, the tied embedding in Q8_0, norms in F32.
  EXPECT_EQ(by_type["q4_1"], 7 * n_layers);
  EXPECT_EQ(by_type["q8_0"], 1);
  EXPECT_EQ(by_type["f32"], 2 * n_layers + 1);

  const auto& emb = f.tensor("token_embd.weight");
  ASSERT_EQ(emb.dims.size(), 2u);
  EXPECT_EQ(emb.dims[0], n_embd);
  EXPECT_EQ(emb.dims[1], int64_t(tokens.size()));
  const auto& q = f.tensor("blk.0.attn_q.weight");
  EXPECT_EQ(q.type, vq::GGMLType::Q4_1);

  // A decoded embedding row is finite and not all zero; a product runs and matches the reference.
  std::vector<float> row(static_cast<size_t>(n_embd));
  vq::dequantize_rows(emb, 42, 1, row.data());
  double norm = 0;
  for (float v : row) {
    ASSERT_TRUE(std::isfinite(v));
    norm += double(v) * v;
  }
  EXPECT_GT(norm, 0.0);
  std::vector<float> y(static_cast<size_t>(n_embd)), yr(static_cast<size_t>(n_embd));
  vq::matmul(q, row.data(), 1, y.data());
  vq::matmul_ref(q.type, q.data, q.dims[1], q.dims[0], row.data(), 1, yr.data());
  double num = 0, den = 0;
  for (size_t i = 0; i < y.size(); ++i) num += double(y[i] - yr[i]) * (y[i] - yr[i]), den += double(yr[i]) * yr[i];
  EXPECT_LT(std::sqrt(num / den), 0.02);  // int8 activations: ~0.5% relative error expected
}

}  // namespace
