// ModelConfig from GGUF metadata: geometry, rope variants, detection of biases / q-k norm /
// tied embeddings, and one clear error per kind of bad metadata.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/model.h"
#include "model/test_forward_tiny.h"
#include "veloxquant/status.h"

namespace {
using vq::test::TinySpec;

std::unique_ptr<vq::Model> load(const TinySpec& s, const std::string& tag) {
  return vq::Model::load(vq::test::write_tiny_model(s, vq::test::tiny_path(tag)));
}

// Runs the load and returns the error message ("" when it loads).
std::string load_error(const TinySpec& s, const std::string& tag) {
  try {
    load(s, tag);
  } catch (const vq::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, LlamaGeometryFromMetadata) {
  TinySpec s;
  const auto m = load(s, "cfg_llama");
  const auto& c = m->config();
  EXPECT_EQ(c.arch, "llama");
  EXPECT_EQ(c.n_layers, 2);
  EXPECT_EQ(c.n_embd, 64);
  EXPECT_EQ(c.n_heads, 4);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);  // n_embd / n_heads without key_length
  EXPECT_EQ(c.n_ff, 96);
  EXPECT_EQ(c.n_vocab, 97);
  EXPECT_EQ(c.n_ctx_train, 256);
  EXPECT_EQ(c.n_rot, 16);
  EXPECT_FLOAT_EQ(c.norm_eps, 1e-6f);
  EXPECT_EQ(c.rope_layout, vq::RopeLayout::Normal);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(m->has_tokenizer());
  EXPECT_THROW(m->tokenizer(), vq::Error);
  // Plain rope: theta^(-2i/n_rot).
  const auto& f = m->rope_inv_freqs();
  ASSERT_EQ(f.size(), 8u);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(f[i], std::pow(10000.0, -2.0 * i / 16.0), 1e-12);
}

TEST(ModelConfig, HeadDimFromKeyLengthAndTiedEmbeddings) {
  TinySpec s;
  s.n_heads = 2;
  s.n_kv_heads = 1;
  s.head_dim = 256;
  s.write_key_length = true;
  s.tied = true;
  const auto m = load(s, "cfg_hd256");
  EXPECT_EQ(m->config().head_dim, 256);
  EXPECT_EQ(m->config().q_dim(), 512);
  EXPECT_TRUE(m->config().tied_embeddings);
  EXPECT_EQ(m->output().data, m->token_embd().data);
}

TEST(ModelConfig, Qwen2AndQwen3) {
  TinySpec s;
  s.arch = "qwen2";
  s.bias = true;
  auto m = load(s, "cfg_qwen2");
  EXPECT_EQ(m->config().rope_layout, vq::RopeLayout::NeoX);
  EXPECT_TRUE(m->config().qkv_bias);
  EXPECT_EQ(m->layers()[1].k_bias.size(), 32u);
  s = TinySpec{};
  s.arch = "qwen3";
  s.qk_norm = true;
  m = load(s, "cfg_qwen3");
  EXPECT_EQ(m->config().rope_layout, vq::RopeLayout::NeoX);
  EXPECT_TRUE(m->config().qk_norm);
  EXPECT_EQ(m->layers()[0].q_norm.size(), 16u);
}

TEST(ModelConfig, Llama3RopeScaling) {
  TinySpec s;
  s.rope_scaling = "llama3";
  s.rope_factor = 8.0f;
  s.head_dim = 32;
  s.n_heads = 2;
  s.n_kv_heads = 2;
  const auto m = load(s, "cfg_llama3");
  const auto& c = m->config();
  EXPECT_EQ(c.rope_scaling, vq::RopeScaling::Llama3);
  EXPECT_EQ(c.rope_orig_ctx, 64);
  const auto& f = m->rope_inv_freqs();
  // Original context 64, low/high factors 1/4: wavelengths < 16 keep their frequency,
  // > 64 are divided by 8, between interpolate; so frequencies never increase and the
  // ratio to the plain frequency lies in [1/8, 1].
  int kept = 0, divided = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const double plain = std::pow(10000.0, -2.0 * i / 32.0);
    const double wavelen = 2 * M_PI / plain;
    const double r = f[i] / plain;
    if (wavelen < 16) { EXPECT_NEAR(r, 1.0, 1e-12); ++kept; }
    else if (wavelen > 64) { EXPECT_NEAR(r, 1.0 / 8, 1e-12); ++divided; }
    else { EXPECT_GT(r, 1.0 / 8); EXPECT_LT(r, 1.0); }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
}

TEST(ModelConfig, LinearScalingAndRopeFreqsTensor) {
  TinySpec s;
  s.rope_scaling = "linear";
  s.rope_factor = 4.0f;
  auto m = load(s, "cfg_linear");
  EXPECT_NEAR(m->rope_inv_freqs()[3], std::pow(10000.0, -6.0 / 16.0) / 4.0, 1e-9);
  s = TinySpec{};
  s.rope_freqs_tensor = true;  // divisors 1, 2, 3, 1, 2, ...
  m = load(s, "cfg_ropefreqs");
  EXPECT_NEAR(m->rope_inv_freqs()[2], std::pow(10000.0, -4.0 / 16.0) / 3.0, 1e-9);
}

TEST(ModelConfig, Gemma3DefaultsAndOverrides) {
  TinySpec s;
  s.arch = "gemma3";
  s.n_layers = 7;
  s.head_dim = 32;
  s.write_key_length = true;
  s.rope_theta = 1e6f;
  auto m = load(s, "cfg_gemma3");
  const auto& c = m->config();
  EXPECT_EQ(c.rope_layout, vq::RopeLayout::NeoX);
  EXPECT_EQ(c.ffn_act, vq::FfnActivation::GeluTanh);
  EXPECT_TRUE(c.post_norms && c.qk_norm);
  EXPECT_FLOAT_EQ(c.embd_scale, 8.0f);                 // sqrt(64)
  EXPECT_FLOAT_EQ(c.attn_scale, 1.0f / std::sqrt(32.0f));  // query_pre_attn_scalar = head_dim
  EXPECT_EQ(c.sliding_window, 8);
  EXPECT_EQ(c.sliding_pattern, 6);  // the architecture's default: every 6th layer global
  for (int l = 0; l < 7; ++l) EXPECT_EQ(c.is_sliding(l), l != 5) << l;
  EXPECT_EQ(c.n_sliding_layers(), 6);
  EXPECT_EQ(m->layers()[3].post_ffn_norm.size(), 64u);
  // rope: global layers base 1e6, local ones the default 10000
  EXPECT_NEAR(m->rope_inv_freqs(5)[1], std::pow(1e6, -2.0 / 32.0), 1e-12);
  EXPECT_NEAR(m->rope_inv_freqs(0)[1], std::pow(1e4, -2.0 / 32.0), 1e-12);
  // Overrides from the optional keys: a per-layer bool pattern, the local base, the scale.
  s.extra = [](vq::test::GGUFWriter& w) {
    std::vector<vq::GGUFValue> pat;
    for (bool b : {false, true, true, false, true, true, true}) pat.push_back(vq::test::gguf_bool(b));
    w.add("gemma3.attention.sliding_window_pattern", vq::test::gguf_array(vq::GGUFValueType::BOOL, pat));
    w.add_float32("gemma3.rope.freq_base_swa", 500.0f);
    w.add_float32("gemma3.attention.scale", 0.25f);
  };
  m = load(s, "cfg_gemma3_keys");
  EXPECT_FALSE(m->config().is_sliding(0));
  EXPECT_TRUE(m->config().is_sliding(1));
  EXPECT_FALSE(m->config().is_sliding(3));
  EXPECT_FLOAT_EQ(m->config().attn_scale, 0.25f);
  EXPECT_NEAR(m->rope_inv_freqs(1)[1], std::pow(500.0, -2.0 / 32.0), 1e-12);
}

TEST(ModelConfig, BadMetadataGivesClearErrors) {
  struct Case {
    std::string tag, expect;
    std::function<void(TinySpec&)> edit;
  };
  const std::vector<Case> cases = {
      {"arch", "unsupported architecture 'gpt2'", [](TinySpec& s) { s.arch = "gpt2"; }},
      {"nolayers", "llama.block_count",
       [](TinySpec& s) { s.drop_key = [](const std::string& k) { return k == "llama.block_count"; }; }},
      {"gqa", "not a multiple", [](TinySpec& s) { s.n_kv_heads = 3; }},
      {"zeroheads", "attention.head_count: value 0",
       [](TinySpec& s) {
         s.drop_key = [](const std::string& k) { return k == "llama.attention.head_count"; };
         s.extra = [](vq::test::GGUFWriter& w) { w.add_uint32("llama.attention.head_count", 0); };
       }},
      {"yarn", "unsupported rope scaling 'yarn'", [](TinySpec& s) { s.rope_scaling = "yarn"; }},
      {"badtype", "llama.block_count",
       [](TinySpec& s) {
         s.drop_key = [](const std::string& k) { return k == "llama.block_count"; };
         s.extra = [](vq::test::GGUFWriter& w) { w.add_string("llama.block_count", "two"); };
       }},
      {"missing", "missing tensor 'blk.1.ffn_up.weight'",
       [](TinySpec& s) { s.drop_tensor = [](const std::string& n) { return n == "blk.1.ffn_up.weight"; }; }},
      {"shape", "blk.0.ffn_gate.weight",
       [](TinySpec& s) {
         s.drop_key = [](const std::string& k) { return k == "llama.feed_forward_length"; };
         s.extra = [](vq::test::GGUFWriter& w) { w.add_uint32("llama.feed_forward_length", 128); };
       }},
      {"qtype", "unsupported type",
       [](TinySpec& s) {
         s.drop_tensor = [](const std::string& n) { return n == "blk.0.attn_q.weight"; };
         s.extra = [](vq::test::GGUFWriter& w) {
           w.add_tensor("blk.0.attn_q.weight", {64, 64}, vq::GGMLType::I8, std::vector<uint8_t>(64 * 64, 1));
         };
       }},
      {"qwen3norm", "attn_q_norm", [](TinySpec& s) { s.arch = "qwen3"; }},
      {"g3window", "gemma3.attention.sliding_window: missing",
       [](TinySpec& s) {
         s.arch = "gemma3";
         s.drop_key = [](const std::string& k) { return k == "gemma3.attention.sliding_window"; };
       }},
      {"g3postnorm", "missing tensor 'blk.1.post_ffw_norm.weight'",
       [](TinySpec& s) {
         s.arch = "gemma3";
         s.drop_tensor = [](const std::string& n) { return n == "blk.1.post_ffw_norm.weight"; };
       }},
      {"g3softcap", "gemma3.final_logit_softcapping",
       [](TinySpec& s) {
         s.arch = "gemma3";
         s.extra = [](vq::test::GGUFWriter& w) { w.add_float32("gemma3.final_logit_softcapping", 30.0f); };
       }},
      {"g3pattern", "gemma3.attention.sliding_window_pattern: 1 entries",
       [](TinySpec& s) {
         s.arch = "gemma3";
         s.extra = [](vq::test::GGUFWriter& w) {
           w.add("gemma3.attention.sliding_window_pattern",
                 vq::test::gguf_array(vq::GGUFValueType::BOOL, {vq::test::gguf_bool(true)}));
         };
       }},
      {"g3pattern0", "sliding_window_pattern: value 0",
       [](TinySpec& s) {
         s.arch = "gemma3";
         s.extra = [](vq::test::GGUFWriter& w) { w.add_uint32("gemma3.attention.sliding_window_pattern", 0); };
       }},
  };
  for (const auto& c : cases) {
    TinySpec s;
    c.edit(s);
    const std::string err = load_error(s, "bad_" + c.tag);
    EXPECT_NE(err.find(c.expect), std::string::npos) << c.tag << ": got '" << err << "'";
    EXPECT_EQ(err.find('\n'), std::string::npos) << c.tag << ": one line";
  }
}

}  // namespace
