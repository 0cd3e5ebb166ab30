#pragma once
// Tiny llama-family models with random weights, written as GGUF files for the runtime tests.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "model/gguf_writer.h"

namespace vq::test {

struct TinySpec {
  std::string arch = "llama";
  int n_layers = 2, n_embd = 64, n_heads = 4, n_kv_heads = 2, head_dim = 16, n_ff = 96, n_vocab = 97;
  bool write_key_length = false;  // <arch>.attention.key_length (needed when head_dim != n_embd/n_heads)
  bool tied = false;              // no output.weight
  bool bias = false;              // attn_q/k/v.bias (qwen2)
  bool qk_norm = false;           // attn_q_norm/attn_k_norm (qwen3)
  std::string rope_scaling;       // "", "linear", "llama3", or anything (bad-input tests)
  float rope_factor = 8.0f;
  bool rope_freqs_tensor = false;
  // gemma3 (arch "gemma3" also writes q/k norms and the post-norms): the window of the local
  // layers; swa_pattern > 0 writes <arch>.attention.sliding_window_pattern (else the default 6).
  int sliding_window = 8;
  int swa_pattern = 0;
  float rope_theta = 10000.0f;
  GGMLType wtype = GGMLType::Q8_0;
  uint64_t seed = 1;
  // Edits the writer before the tensors are added (bad-metadata tests); key filter drops keys.
  std::function<bool(const std::string&)> drop_key;
  std::function<void(GGUFWriter&)> extra;
  std::function<bool(const std::string&)> drop_tensor;
};

inline std::string write_tiny_model(const TinySpec& s, const std::string& path) {
  GGUFWriter w;
  auto keep = [&](const std::string& k) { return !s.drop_key || !s.drop_key(k); };
  const std::string a = s.arch + ".";
  if (keep("general.architecture")) w.add_string("general.architecture", s.arch);
  if (keep(a + "block_count")) w.add_uint32(a + "block_count", uint32_t(s.n_layers));
  if (keep(a + "embedding_length")) w.add_uint32(a + "embedding_length", uint32_t(s.n_embd));
  if (keep(a + "feed_forward_length")) w.add_uint32(a + "feed_forward_length", uint32_t(s.n_ff));
  if (keep(a + "attention.head_count")) w.add_uint32(a + "attention.head_count", uint32_t(s.n_heads));
  if (keep(a + "attention.head_count_kv")) w.add_uint32(a + "attention.head_count_kv", uint32_t(s.n_kv_heads));
  if (s.write_key_length) w.add_uint32(a + "attention.key_length", uint32_t(s.head_dim));
  w.add_float32(a + "rope.freq_base", s.rope_theta);
  w.add_float32(a + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.add_uint32(a + "context_length", 256);
  if (!s.rope_scaling.empty()) {
    w.add_string(a + "rope.scaling.type", s.rope_scaling);
    w.add_float32(a + "rope.scaling.factor", s.rope_factor);
    if (s.rope_scaling == "llama3") {
      w.add_float32(a + "rope.scaling.low_freq_factor", 1.0f);
      w.add_float32(a + "rope.scaling.high_freq_factor", 4.0f);
      w.add_uint32(a + "rope.scaling.original_context_length", 64);
    }
  }
  const bool gemma = s.arch == "gemma3";
  if (gemma) {
    if (keep(a + "attention.sliding_window")) w.add_uint32(a + "attention.sliding_window", uint32_t(s.sliding_window));
    if (s.swa_pattern > 0) w.add_uint32(a + "attention.sliding_window_pattern", uint32_t(s.swa_pattern));
  }
  if (s.extra) s.extra(w);
  uint64_t seed = s.seed * 1000;
  const int qd = s.n_heads * s.head_dim, kvd = s.n_kv_heads * s.head_dim;
  auto dropped = [&](const std::string& name) { return s.drop_tensor && s.drop_tensor(name); };
  auto mat = [&](const std::string& name, int rows, int cols) {
    if (dropped(name)) return;
    // Scale 1/sqrt(cols) keeps activations O(1) through the layers.
    w.add_tensor_f32(name, {cols, rows}, s.wtype, random_weights(size_t(rows) * cols, ++seed, 1.0f / std::sqrt(float(cols))));
  };
  auto vec = [&](const std::string& name, int n, float base, float scale) {
    auto v = random_weights(size_t(n), ++seed, scale);
    if (dropped(name)) return;
    for (auto& x : v) x += base;
    w.add_tensor_f32(name, {n}, GGMLType::F32, v);
  };
  w.add_tensor_f32("token_embd.weight", {s.n_embd, s.n_vocab}, s.wtype,
                   random_weights(size_t(s.n_vocab) * s.n_embd, ++seed, 1.0f));
  if (!s.tied) mat("output.weight", s.n_vocab, s.n_embd);
  vec("output_norm.weight", s.n_embd, 1.0f, 0.1f);
  if (s.rope_freqs_tensor) {
    std::vector<float> div(size_t(s.head_dim / 2));
    for (size_t i = 0; i < div.size(); ++i) div[i] = 1.0f + float(i % 3);
    w.add_tensor_f32("rope_freqs.weight", {s.head_dim / 2}, GGMLType::F32, div);
  }
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    vec(p + "attn_norm.weight", s.n_embd, 1.0f, 0.1f);
    vec(p + "ffn_norm.weight", s.n_embd, 1.0f, 0.1f);
    mat(p + "attn_q.weight", qd, s.n_embd);
    mat(p + "attn_k.weight", kvd, s.n_embd);
    mat(p + "attn_v.weight", kvd, s.n_embd);
    mat(p + "attn_output.weight", s.n_embd, qd);
    mat(p + "ffn_gate.weight", s.n_ff, s.n_embd);
    mat(p + "ffn_up.weight", s.n_ff, s.n_embd);
    mat(p + "ffn_down.weight", s.n_embd, s.n_ff);
    if (s.bias) {
      vec(p + "attn_q.bias", qd, 0.0f, 0.5f);
      vec(p + "attn_k.bias", kvd, 0.0f, 0.5f);
      vec(p + "attn_v.bias", kvd, 0.0f, 0.5f);
    }
    if (s.qk_norm || gemma) {
      vec(p + "attn_q_norm.weight", s.head_dim, 1.0f, 0.2f);
      vec(p + "attn_k_norm.weight", s.head_dim, 1.0f, 0.2f);
    }
    if (gemma) {
      vec(p + "post_attention_norm.weight", s.n_embd, 1.0f, 0.1f);
      vec(p + "post_ffw_norm.weight", s.n_embd, 1.0f, 0.1f);
    }
  }
  w.write(path);
  return path;
}

// A per-test temporary file path.
inline std::string tiny_path(const std::string& tag) {
  const auto dir = std::filesystem::temp_directory_path() / "vq_test_forward";
  std::filesystem::create_directories(dir);
  return (dir / (tag + "_" + std::to_string(::getpid()) + ".gguf")).string();
}

}  // namespace vq::test
