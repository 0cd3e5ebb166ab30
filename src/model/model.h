#pragma once
// A loaded llama-family model (weights stay in the memory-mapped GGUF). The forward pass over
// it lives in model/session.h.
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <utility>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "model/gguf.h"
#include "model/matmul_packed.h"
#include "model/model_config.h"
#include "text/tokenizer.h"
#include "model/weight_formats.h"
#include "veloxquant/kv_cache.h"

namespace vq {

// A matrix W: [rows, cols] of `type`, row-major, rows packed back to back in the mapping.
struct WeightMatrix {
  std::string name;
  GGMLType type = GGMLType::F32;
  const void* data = nullptr;
  int64_t rows = 0, cols = 0;
  // Row-interleaved copy for the CPU products, made by Model::pack_for_cpu or on first use
  // (model/matmul_packed.h) and shared by the copies of this matrix; null when the type has no
  // packed layout.
  std::shared_ptr<PackedSlot> packed;
};

struct LayerWeights {
  std::vector<float> attn_norm, ffn_norm;    // [n_embd]
  std::vector<float> q_bias, k_bias, v_bias;  // [q_dim], [kv_dim], [kv_dim]; empty without biases
  std::vector<float> q_norm, k_norm;          // [head_dim]; empty without per-head q/k norm
  // gemma3: RMSNorm weights of the attention output and of the MLP output (before each residual
  // add); empty when the architecture has none.
  std::vector<float> post_attn_norm, post_ffn_norm;  // [n_embd]
  WeightMatrix wq, wk, wv, wo;                // [q_dim, n_embd], [kv_dim, n_embd] x2, [n_embd, q_dim]
  WeightMatrix w_gate, w_up, w_down;          // [n_ff, n_embd] x2, [n_embd, n_ff]
  // The seven products' matrices, in the order above.
  std::array<const WeightMatrix*, 7> matrices() const { return {&wq, &wk, &wv, &wo, &w_gate, &w_up, &w_down}; }
};

class Model {
 public:
  // Maps the file, reads the configuration and checks every tensor's presence, shape and type;
  // throws vq::Error naming the file and the tensor or key at fault.
  static std::unique_ptr<Model> load(const std::string& path);

  const ModelConfig& config() const { return cfg_; }
  const GGUFFile& gguf() const { return *gguf_; }
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  const Tokenizer& tokenizer() const;  // throws when the file has no tokenizer metadata

  const WeightMatrix& token_embd() const { return token_embd_; }  // [n_vocab, n_embd]
  const WeightMatrix& output() const { return output_; }          // [n_vocab, n_embd] (tied: token_embd)
  const std::vector<float>& output_norm() const { return output_norm_; }  // [n_embd]
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const std::vector<double>& rope_inv_freqs() const { return inv_freqs_; }  // [n_rot/2]
  // [n_rot/2] of the sliding-window layers (gemma3: their own base); empty without such layers.
  const std::vector<double>& rope_inv_freqs_swa() const { return inv_freqs_swa_; }
  // [n_rot/2] of the given layer.
  const std::vector<double>& rope_inv_freqs(int layer) const {
    return cfg_.is_sliding(layer) ? inv_freqs_swa_ : inv_freqs_;
  }
  KVGeometry kv_geometry() const { return {cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim}; }
  // Per-type tensor counts, e.g. {"q4_1": 210, "f32": 61, ...}.
  std::vector<std::pair<std::string, int>> tensor_type_counts() const;
  size_t weight_bytes() const;  // bytes of all tensor data
  // Every weight finite (find_non_finite over every supported tensor: the float values and the
  // block scales); throws naming the file, the tensor and the element. A NaN weight otherwise
  // yields garbage, and the attention's softmax can hide it from the logits. One pass over the
  // float tensors and a few bytes per quantized block, which the first forward pass reads anyway.
  void check_weights_finite() const;
  // Makes the packed copies (model/matmul_packed.h) of every weight the CPU products use, now
  // rather than at the first product that needs each: a model that runs on the CPU packs at
  // session creation, so the first prompt's prefill is not charged for it (a model run on the
  // device never calls this). Thread-safe and idempotent (the copies are made once).
  void pack_for_cpu() const;

 private:
  Model() = default;
  std::unique_ptr<GGUFFile> gguf_;
  ModelConfig cfg_;
  std::unique_ptr<Tokenizer> tokenizer_;
  WeightMatrix token_embd_, output_;
  std::vector<float> output_norm_;
  std::vector<LayerWeights> layers_;
  std::vector<double> inv_freqs_, inv_freqs_swa_;  // global layers, sliding-window layers
};

}  // namespace vq
