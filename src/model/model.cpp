#include "model/model.h"

#include <map>

#include "core/error.h"
#include "model/text_gguf.h"

namespace vq {
namespace {

// Finds a 2-D tensor of shape [rows, cols] (GGUF dims: ne0 = cols, ne1 = rows) of a type the
// products support; names the tensor, shape and type when not.
WeightMatrix matrix(const GGUFFile& g, const std::string& name, int64_t rows, int64_t cols) {
  const GGUFTensorInfo* t = g.find_tensor(name);
  VQ_CHECK(t != nullptr, "{}: missing tensor '{}'", g.path(), name);
  const bool shape_ok = (t->dims.size() == 2 && t->dims[0] == cols && t->dims[1] == rows) ||
                        (t->dims.size() == 3 && t->dims[0] == cols && t->dims[1] == rows && t->dims[2] == 1);
  VQ_CHECK(shape_ok, "{}: tensor '{}': shape [{}], expected ne = [{}, {}]", g.path(), name,
           fmt::join(t->dims, ", "), cols, rows);
  VQ_CHECK(ggml_type_supported(t->type), "{}: tensor '{}': unsupported type {}", g.path(), name,
           ggml_type_name(t->type));
  const size_t need = ggml_row_bytes(t->type, cols) * size_t(rows);
  VQ_CHECK(t->nbytes >= need, "{}: tensor '{}': {} bytes of data, expected {}", g.path(), name, t->nbytes, need);
  return WeightMatrix{name, t->type, t->data, rows, cols,
                      packable(t->type, cols) ? std::make_shared<PackedSlot>() : nullptr};
}

// A 1-D tensor of n elements decoded to float32 (norm weights and biases).
std::vector<float> vector_f32(const GGUFFile& g, const std::string& name, int64_t n) {
  const GGUFTensorInfo* t = g.find_tensor(name);
  VQ_CHECK(t != nullptr, "{}: missing tensor '{}'", g.path(), name);
  VQ_CHECK(t->numel() == n, "{}: tensor '{}': {} elements, expected {}", g.path(), name, t->numel(), n);
  VQ_CHECK(ggml_type_supported(t->type), "{}: tensor '{}': unsupported type {}", g.path(), name,
           ggml_type_name(t->type));
  VQ_CHECK(n % ggml_block_elems(t->type) == 0, "{}: tensor '{}': {} elements not a multiple of the {} block",
           g.path(), name, n, ggml_type_name(t->type));
  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(t->type, t->data, out.data(), n);
  return out;
}

}  // namespace

std::unique_ptr<Model> Model::load(const std::string& path) {
  std::unique_ptr<Model> m(new Model());
  m->gguf_ = std::make_unique<GGUFFile>(path);
  const GGUFFile& g = *m->gguf_;
  m->cfg_ = read_model_config(g);
  const ModelConfig& c = m->cfg_;
  m->token_embd_ = matrix(g, "token_embd.weight", c.n_vocab, c.n_embd);
  m->output_ = c.tied_embeddings ? m->token_embd_ : matrix(g, "output.weight", c.n_vocab, c.n_embd);
  m->output_norm_ = vector_f32(g, "output_norm.weight", c.n_embd);
  m->layers_.resize(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    LayerWeights& L = m->layers_[static_cast<size_t>(l)];
    L.attn_norm = vector_f32(g, p + "attn_norm.weight", c.n_embd);
    L.ffn_norm = vector_f32(g, p + "ffn_norm.weight", c.n_embd);
    L.wq = matrix(g, p + "attn_q.weight", c.q_dim(), c.n_embd);
    L.wk = matrix(g, p + "attn_k.weight", c.kv_dim(), c.n_embd);
    L.wv = matrix(g, p + "attn_v.weight", c.kv_dim(), c.n_embd);
    L.wo = matrix(g, p + "attn_output.weight", c.n_embd, c.q_dim());
    L.w_gate = matrix(g, p + "ffn_gate.weight", c.n_ff, c.n_embd);
    L.w_up = matrix(g, p + "ffn_up.weight", c.n_ff, c.n_embd);
    L.w_down = matrix(g, p + "ffn_down.weight", c.n_embd, c.n_ff);
    if (c.qkv_bias) {
      L.q_bias = vector_f32(g, p + "attn_q.bias", c.q_dim());
      L.k_bias = vector_f32(g, p + "attn_k.bias", c.kv_dim());
      L.v_bias = vector_f32(g, p + "attn_v.bias", c.kv_dim());
    }
    if (c.qk_norm) {
      L.q_norm = vector_f32(g, p + "attn_q_norm.weight", c.head_dim);
      L.k_norm = vector_f32(g, p + "attn_k_norm.weight", c.head_dim);
    }
    if (c.post_norms) {
      L.post_attn_norm = vector_f32(g, p + "post_attention_norm.weight", c.n_embd);
      L.post_ffn_norm = vector_f32(g, p + "post_ffw_norm.weight", c.n_embd);
    }
  }
  m->inv_freqs_ = vq::rope_inv_freqs(c, g);
  if (c.n_sliding_layers() > 0) m->inv_freqs_swa_ = vq::rope_inv_freqs(c, g, true);
  if (g.has("tokenizer.ggml.model")) m->tokenizer_ = std::make_unique<Tokenizer>(tokenizer_from_gguf(g));
  return m;
}

const Tokenizer& Model::tokenizer() const {
  VQ_CHECK(tokenizer_ != nullptr, "{}: no tokenizer (tokenizer.ggml.model is absent)", gguf_->path());
  return *tokenizer_;
}

std::vector<std::pair<std::string, int>> Model::tensor_type_counts() const {
  std::map<std::string, int> counts;
  for (const auto& t : gguf_->tensors()) ++counts[ggml_type_name(t.type)];
  return {counts.begin(), counts.end()};
}

size_t Model::weight_bytes() const {
  size_t b = 0;
  for (const auto& t : gguf_->tensors()) b += t.nbytes;
  return b;
}

void Model::check_weights_finite() const {
  for (const GGUFTensorInfo& t : gguf_->tensors()) {
    if (!ggml_type_supported(t.type) || t.dims.empty()) continue;  // unused, or refused where used
    const int64_t at = find_non_finite(t.type, t.data, t.numel());
    VQ_CHECK(at < 0, "{}: tensor '{}' ({}) holds a NaN or inf {} at element {}", gguf_->path(), t.name,
             ggml_type_name(t.type), ggml_block_elems(t.type) == 1 ? "value" : "block scale", at);
  }
}

void Model::pack_for_cpu() const {
  auto pack = [](const WeightMatrix& w) {
    if (w.packed) packed_weight(*w.packed, w.type, w.data, w.rows, w.cols);
  };
  for (const LayerWeights& L : layers_)
    for (const WeightMatrix* w : L.matrices()) pack(*w);
  pack(output_);
}

}  // namespace vq
