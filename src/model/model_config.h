#pragma once
// The geometry and hyper-parameters of a llama-family model, read from GGUF metadata
// ("<arch>.block_count", "<arch>.attention.head_count", ...) and the tensor shapes.
#include <cstdint>
#include <string>
#include <vector>

namespace vq {

class GGUFFile;

// How rotary dimensions pair up. Normal: (2i, 2i+1) rotate together (llama GGUFs, whose
// converter permutes the q/k rows into this order). NeoX: (i, i + n_rot/2) (qwen2, qwen3).
enum class RopeLayout { Normal, NeoX };

enum class RopeScaling { None, Linear, Llama3 };

// The gate activation of the gated MLP: down(act(gate(x)) * up(x)).
enum class FfnActivation { SiLU, GeluTanh };

struct ModelConfig {
  std::string arch;          // "llama", "qwen2", "qwen3", "gemma3"
  std::string name;          // general.name, or "" when absent
  int n_layers = 0;
  int n_embd = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;          // <arch>.attention.key_length, else n_embd / n_heads
  int n_ff = 0;
  int n_vocab = 0;           // rows of token_embd
  int64_t n_ctx_train = 0;
  float rope_theta = 10000.0f;
  int n_rot = 0;             // rotated dims per head (<arch>.rope.dimension_count, else head_dim)
  RopeLayout rope_layout = RopeLayout::Normal;
  RopeScaling rope_scaling = RopeScaling::None;
  float rope_factor = 1.0f;  // linear / llama3 scale factor
  float rope_low_freq_factor = 1.0f, rope_high_freq_factor = 4.0f;  // llama3
  int64_t rope_orig_ctx = 8192;                                      // llama3
  float norm_eps = 1e-5f;
  bool qkv_bias = false;      // qwen2: attn_q/k/v.bias
  bool qk_norm = false;       // qwen3: per-head attn_q_norm / attn_k_norm
  bool tied_embeddings = false;  // no output.weight: the head reuses token_embd
  FfnActivation ffn_act = FfnActivation::SiLU;  // gemma3: GELU (tanh approximation)

  // Gemma 3 (defaults leave llama-family models unchanged):
  float attn_scale = 0.0f;   // scores = attn_scale * q.k (set by read_model_config: 1/sqrt(head_dim) default)
  float embd_scale = 1.0f;   // token embeddings are multiplied by it (gemma3: sqrt(n_embd))
  bool post_norms = false;   // RMSNorm of the attention and MLP outputs before each residual add
  // Sliding-window layers: query at position p sees keys [p - sliding_window + 1, p]. Global layers
  // see every earlier key. layer_sliding: [n_layers], 1 for a sliding-window layer; empty: none.
  int sliding_window = 0;
  std::vector<uint8_t> layer_sliding;
  int sliding_pattern = 0;          // period N when every Nth layer is global (for display), else 0
  float rope_theta_swa = 10000.0f;  // rope base of the sliding-window layers (no rope scaling)

  int q_dim() const { return n_heads * head_dim; }
  int kv_dim() const { return n_kv_heads * head_dim; }
  bool is_sliding(int layer) const { return !layer_sliding.empty() && layer_sliding[size_t(layer)] != 0; }
  int n_sliding_layers() const;
};

// Reads and validates the configuration; throws vq::Error naming the key or tensor at fault
// (unknown architecture, missing key, inconsistent head counts, unsupported rope scaling).
ModelConfig read_model_config(const GGUFFile& gguf);

// Rotary inverse frequencies [n_rot / 2]: theta^(-2i/n_rot), adjusted by the rope_freqs tensor
// (Llama 3.1 GGUFs store per-frequency divisors) or by the configured scaling. sliding: the
// frequencies of the sliding-window layers (base rope_theta_swa, never scaled: Gemma 3 applies
// its long-context scaling to the global layers only).
std::vector<double> rope_inv_freqs(const ModelConfig& cfg, const GGUFFile& gguf, bool sliding = false);

const char* rope_layout_name(RopeLayout l);
const char* rope_scaling_name(RopeScaling s);
const char* ffn_activation_name(FfnActivation a);

}  // namespace vq
