#include "model/model_config.h"

#include <cmath>

#include "core/error.h"
#include "model/gguf.h"

namespace vq {
namespace {

// A positive integer key within [lo, hi]; names the key and value when out of range.
int read_count(const GGUFFile& g, const std::string& key, int64_t lo, int64_t hi) {
  const int64_t v = g.get_int(key);
  VQ_CHECK(v >= lo && v <= hi, "{}: {}: value {} out of range [{}, {}]", g.path(), key, v, lo, hi);
  return static_cast<int>(v);
}

int read_count_or(const GGUFFile& g, const std::string& key, int64_t def, int64_t lo, int64_t hi) {
  return g.has(key) ? read_count(g, key, lo, hi) : static_cast<int>(def);
}

float read_positive_float_or(const GGUFFile& g, const std::string& key, double def) {
  const double v = g.get_float_or(key, def);
  VQ_CHECK(std::isfinite(v) && v > 0.0, "{}: {}: value {} must be finite and > 0", g.path(), key, v);
  return static_cast<float>(v);
}

// Gemma 3 (HF Gemma3ForCausalLM as converted by llama.cpp's convert_hf_to_gguf.py; the norm weights
// are stored with the converter's +1 already added, so they multiply like llama's). What the file
// gives: the window (<arch>.attention.sliding_window, required: 512 for 270M/1B, 1024 for 4B+).
// What the architecture fixes when the file is silent (Gemma 3 report; HF config defaults):
// every 6th layer global (layers 5, 11, ...), local rope base 10000, query_pre_attn_scalar =
// head_dim (1/sqrt(head_dim) scale), embeddings times sqrt(n_embd), GELU-tanh gated MLP,
// post-attention and post-MLP norms. Optional keys llama.cpp defines override the defaults:
// <arch>.attention.sliding_window_pattern (a period, or one bool per layer), <arch>.rope.freq_base_swa,
// <arch>.attention.scale.
void read_gemma3(const GGUFFile& g, ModelConfig& c) {
  const std::string a = c.arch + ".";
  for (const char* k : {"final_logit_softcapping", "attn_logit_softcapping"}) {
    VQ_CHECK(!g.has(a + k), "{}: {}{}: logit soft-capping is not supported (a Gemma 2 feature; Gemma 3 has none)",
             g.path(), a, k);
  }
  c.rope_layout = RopeLayout::NeoX;  // HF rotate_half layout, not permuted by the converter
  c.ffn_act = FfnActivation::GeluTanh;
  c.post_norms = true;
  c.embd_scale = std::sqrt(float(c.n_embd));
  VQ_CHECK(c.qk_norm, "{}: gemma3 model without blk.0.attn_q_norm.weight", g.path());
  VQ_CHECK(g.has(a + "attention.sliding_window"),
           "{}: {}attention.sliding_window: missing (gemma3 needs the window of its local layers)", g.path(), a);
  c.sliding_window = read_count(g, a + "attention.sliding_window", 1, int64_t(1) << 30);
  c.rope_theta_swa = read_positive_float_or(g, a + "rope.freq_base_swa", 10000.0);
  c.layer_sliding.assign(size_t(c.n_layers), 0);
  const std::string pk = a + "attention.sliding_window_pattern";
  const auto it = g.metadata().find(pk);
  if (it != g.metadata().end() && it->second.type == GGUFValueType::ARRAY) {
    const auto& arr = *std::get<std::shared_ptr<GGUFArray>>(it->second.v);
    VQ_CHECK(arr.items.size() == size_t(c.n_layers), "{}: {}: {} entries, expected one per layer ({})", g.path(), pk,
             arr.items.size(), c.n_layers);
    for (size_t l = 0; l < arr.items.size(); ++l) {
      const GGUFValue& v = arr.items[l];
      VQ_CHECK(v.type == GGUFValueType::BOOL, "{}: {}[{}]: expected bools (true: sliding-window layer)", g.path(), pk, l);
      c.layer_sliding[l] = std::get<bool>(v.v) ? 1 : 0;
    }
  } else {
    // Period N: layers with (l + 1) % N != 0 slide, every Nth is global; N = 1 means all global.
    c.sliding_pattern = read_count_or(g, pk, 6, 1, 4096);
    for (int l = 0; l < c.n_layers; ++l) c.layer_sliding[size_t(l)] = (l + 1) % c.sliding_pattern != 0;
  }
  // The 27B (62 layers, n_embd 5376) was trained with query_pre_attn_scalar = n_embd / n_heads;
  // every other size with head_dim. Its GGUFs carry no key for it.
  const float qpas = c.n_layers == 62 && c.n_embd == 5376 ? float(c.n_embd / c.n_heads) : float(c.head_dim);
  c.attn_scale = read_positive_float_or(g, a + "attention.scale", 1.0 / std::sqrt(double(qpas)));
}

}  // namespace

int ModelConfig::n_sliding_layers() const {
  int n = 0;
  for (uint8_t s : layer_sliding) n += s != 0;
  return n;
}

const char* ffn_activation_name(FfnActivation a) { return a == FfnActivation::GeluTanh ? "gelu-tanh" : "silu"; }

const char* rope_layout_name(RopeLayout l) { return l == RopeLayout::NeoX ? "neox" : "normal"; }

const char* rope_scaling_name(RopeScaling s) {
  switch (s) {
    case RopeScaling::Linear: return "linear";
    case RopeScaling::Llama3: return "llama3";
    default: return "none";
  }
}

ModelConfig read_model_config(const GGUFFile& g) {
  ModelConfig c;
  c.arch = g.get_string("general.architecture");
  VQ_CHECK(c.arch == "llama" || c.arch == "qwen2" || c.arch == "qwen3" || c.arch == "gemma3",
           "{}: general.architecture: unsupported architecture '{}' (supported: llama, qwen2, qwen3, gemma3)",
           g.path(), c.arch);
  c.name = g.get_string_or("general.name", "");
  const std::string a = c.arch + ".";
  constexpr int64_t kMaxDim = 1 << 20;
  c.n_layers = read_count(g, a + "block_count", 1, 4096);
  c.n_embd = read_count(g, a + "embedding_length", 1, kMaxDim);
  c.n_heads = read_count(g, a + "attention.head_count", 1, 4096);
  c.n_kv_heads = read_count_or(g, a + "attention.head_count_kv", c.n_heads, 1, 4096);
  VQ_CHECK(c.n_heads % c.n_kv_heads == 0,
           "{}: {}attention.head_count {} is not a multiple of {}attention.head_count_kv {}", g.path(), a,
           c.n_heads, a, c.n_kv_heads);
  if (g.has(a + "attention.key_length")) {
    c.head_dim = read_count(g, a + "attention.key_length", 2, 4096);
  } else {
    VQ_CHECK(c.n_embd % c.n_heads == 0, "{}: {}embedding_length {} is not a multiple of head_count {} "
             "and {}attention.key_length is absent", g.path(), a, c.n_embd, c.n_heads, a);
    c.head_dim = c.n_embd / c.n_heads;
  }
  if (g.has(a + "attention.value_length")) {
    const int vl = read_count(g, a + "attention.value_length", 1, 4096);
    VQ_CHECK(vl == c.head_dim, "{}: {}attention.value_length {} != key_length {} (unsupported)", g.path(), a,
             vl, c.head_dim);
  }
  VQ_CHECK(c.head_dim % 2 == 0, "{}: head_dim {} must be even (rotary pairs)", g.path(), c.head_dim);
  c.n_ff = read_count(g, a + "feed_forward_length", 1, 16 * kMaxDim);
  c.n_ctx_train = g.get_int_or(a + "context_length", 4096);
  VQ_CHECK(c.n_ctx_train > 0, "{}: {}context_length {} must be > 0", g.path(), a, c.n_ctx_train);
  c.rope_theta = read_positive_float_or(g, a + "rope.freq_base", 10000.0);
  c.n_rot = read_count_or(g, a + "rope.dimension_count", c.head_dim, 2, c.head_dim);
  VQ_CHECK(c.n_rot % 2 == 0, "{}: {}rope.dimension_count {} must be even", g.path(), a, c.n_rot);
  c.norm_eps = static_cast<float>(g.get_float_or(a + "attention.layer_norm_rms_epsilon", 1e-5));
  VQ_CHECK(std::isfinite(c.norm_eps) && c.norm_eps >= 0.0f,
           "{}: {}attention.layer_norm_rms_epsilon {} must be finite and >= 0", g.path(), a, c.norm_eps);
  c.rope_layout = c.arch == "llama" ? RopeLayout::Normal : RopeLayout::NeoX;

  const std::string scaling = g.get_string_or(a + "rope.scaling.type", "none");
  if (scaling == "none" || scaling.empty()) {
    c.rope_scaling = RopeScaling::None;
  } else if (scaling == "linear") {
    c.rope_scaling = RopeScaling::Linear;
    c.rope_factor = read_positive_float_or(g, a + "rope.scaling.factor", 1.0);
  } else if (scaling == "llama3") {
    c.rope_scaling = RopeScaling::Llama3;
    c.rope_factor = read_positive_float_or(g, a + "rope.scaling.factor", 8.0);
    c.rope_low_freq_factor = read_positive_float_or(g, a + "rope.scaling.low_freq_factor", 1.0);
    c.rope_high_freq_factor = read_positive_float_or(g, a + "rope.scaling.high_freq_factor", 4.0);
    VQ_CHECK(c.rope_high_freq_factor > c.rope_low_freq_factor,
             "{}: {}rope.scaling.high_freq_factor {} must exceed low_freq_factor {}", g.path(), a,
             c.rope_high_freq_factor, c.rope_low_freq_factor);
    c.rope_orig_ctx = g.get_int_or(a + "rope.scaling.original_context_length", 8192);
    VQ_CHECK(c.rope_orig_ctx > 0, "{}: {}rope.scaling.original_context_length {} must be > 0", g.path(), a,
             c.rope_orig_ctx);
  } else {
    VQ_FAIL("{}: {}rope.scaling.type: unsupported rope scaling '{}' (supported: none, linear, llama3)",
            g.path(), a, scaling);
  }

  const GGUFTensorInfo& emb = g.tensor("token_embd.weight");
  VQ_CHECK(emb.dims.size() == 2 && emb.dims[0] == c.n_embd && emb.dims[1] >= 1 && emb.dims[1] <= (1 << 24),
           "{}: token_embd.weight: shape must be [{}, n_vocab], got {} dims (ne0 {})", g.path(), c.n_embd,
           emb.dims.size(), emb.dims.empty() ? 0 : emb.dims[0]);
  c.n_vocab = static_cast<int>(emb.dims[1]);
  c.tied_embeddings = g.find_tensor("output.weight") == nullptr;
  c.qkv_bias = g.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = g.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  VQ_CHECK(c.arch != "qwen3" || c.qk_norm, "{}: qwen3 model without blk.0.attn_q_norm.weight", g.path());
  c.attn_scale = 1.0f / std::sqrt(float(c.head_dim));
  if (c.arch == "gemma3") read_gemma3(g, c);
  return c;
}

std::vector<double> rope_inv_freqs(const ModelConfig& c, const GGUFFile& g, bool sliding) {
  const int half = c.n_rot / 2;
  std::vector<double> f(half);  // [n_rot/2] radians per position
  const double theta = sliding ? c.rope_theta_swa : c.rope_theta;
  for (int i = 0; i < half; ++i) f[i] = std::pow(theta, -2.0 * i / double(c.n_rot));
  if (sliding) return f;
  if (const GGUFTensorInfo* t = g.find_tensor("rope_freqs.weight")) {
    VQ_CHECK(t->numel() == half, "{}: rope_freqs.weight: {} elements, expected n_rot/2 = {}", g.path(),
             t->numel(), half);
    std::vector<float> div(half);
    dequantize_row(t->type, t->data, div.data(), half);
    for (int i = 0; i < half; ++i) {
      VQ_CHECK(std::isfinite(div[i]) && div[i] > 0.0f, "{}: rope_freqs.weight[{}] = {} must be > 0", g.path(), i,
               div[i]);
      f[i] /= div[i];
    }
  } else if (c.rope_scaling == RopeScaling::Linear) {
    for (auto& x : f) x /= c.rope_factor;
  } else if (c.rope_scaling == RopeScaling::Llama3) {
    // Llama 3.1 frequency-dependent scaling: long wavelengths are stretched by the factor,
    // short ones kept, the band between interpolated smoothly.
    const double lo_wavelen = double(c.rope_orig_ctx) / c.rope_low_freq_factor;
    const double hi_wavelen = double(c.rope_orig_ctx) / c.rope_high_freq_factor;
    for (auto& x : f) {
      const double wavelen = 2.0 * M_PI / x;
      if (wavelen < hi_wavelen) continue;
      if (wavelen > lo_wavelen) {
        x /= c.rope_factor;
      } else {
        const double s = (double(c.rope_orig_ctx) / wavelen - c.rope_low_freq_factor) /
                         (c.rope_high_freq_factor - c.rope_low_freq_factor);
        x = (1.0 - s) * x / c.rope_factor + s * x;
      }
    }
  }
  return f;
}

}  // namespace vq
