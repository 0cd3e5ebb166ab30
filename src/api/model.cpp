// veloxquant::Model and Tokenizer over vq::Model / vq::Tokenizer (src/model).
#include <filesystem>
#include <memory>

#include "api/impl.h"
#include "core/error.h"
#include "text/chat_template.h"
#include "model/known_models.h"

namespace veloxquant {

static Model load_model(const std::string& path, bool is_default) {
  auto impl = std::make_shared<Model::Impl>();
  impl->model = vq::Model::load(path);
  impl->is_default = is_default;
  const vq::ModelConfig& c = impl->model->config();
  ModelInfo& i = impl->info;
  i.path = path;
  i.arch = c.arch;
  i.name = c.name;
  i.n_layers = c.n_layers;
  i.n_embd = c.n_embd;
  i.n_heads = c.n_heads;
  i.n_kv_heads = c.n_kv_heads;
  i.head_dim = c.head_dim;
  i.n_ff = c.n_ff;
  i.n_vocab = c.n_vocab;
  i.n_ctx_train = c.n_ctx_train;
  i.weight_bytes = impl->model->weight_bytes();
  const vq::GGUFFile& g = impl->model->gguf();
  i.gguf_version = g.version();
  i.n_tensors = g.tensors().size();
  i.tensor_types = impl->model->tensor_type_counts();
  i.qkv_bias = c.qkv_bias;
  i.qk_norm = c.qk_norm;
  i.post_norms = c.post_norms;
  i.tied_embeddings = c.tied_embeddings;
  i.attn_scale = c.attn_scale;
  i.embd_scale = c.embd_scale;
  i.norm_eps = c.norm_eps;
  i.ffn_activation = vq::ffn_activation_name(c.ffn_act);
  i.rope_layout = vq::rope_layout_name(c.rope_layout);
  i.rope_scaling = vq::rope_scaling_name(c.rope_scaling);
  i.rope_theta = c.rope_theta;
  i.rope_theta_swa = c.rope_theta_swa;
  i.rope_factor = c.rope_factor;
  i.n_rot = c.n_rot;
  i.rope_freqs_tensor = g.find_tensor("rope_freqs.weight") != nullptr;
  i.sliding_window = c.sliding_window;
  i.sliding_pattern = c.sliding_pattern;
  for (int l = 0; !c.layer_sliding.empty() && l < c.n_layers; ++l) i.sliding_layers.push_back(c.is_sliding(l));
  return ApiAccess::make_model(std::move(impl));
}

static bool is_known_model_file(const std::string& path) {
  std::error_code ec;
  for (const vq::KnownModel& k : vq::known_models()) {
    const std::string loc = vq::model_location(k);
    if (path == loc || (std::filesystem::exists(loc, ec) && std::filesystem::equivalent(path, loc, ec))) return true;
  }
  return false;
}

Model Model::load(const std::string& path) { return load_model(path, is_known_model_file(path)); }
Model Model::load_default() {
  // The library does not download: the CLI and scripts/setup.sh fetch the default model.
  const std::string path = vq::default_model_location();
  VQ_CHECK(vq::default_model_present(), "the default model is not at {}: run scripts/setup.sh, or any veloxquant "
           "command once, to fetch it (the library itself does not download)", path);
  return load_model(path, true);
}
std::string Model::default_path() { return vq::default_model_location(); }
bool Model::default_present() { return vq::default_model_present(); }

const ModelInfo& Model::info() const { return impl_->info; }
bool Model::is_default() const { return impl_->is_default; }
void Model::check_weights_finite() const { impl_->model->check_weights_finite(); }
bool Model::has_tokenizer() const { return impl_->model->has_tokenizer(); }
Tokenizer Model::tokenizer() const {
  (void)impl_->model->tokenizer();  // throws now, naming the file, when there is none
  return ApiAccess::make_tokenizer(*this);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  return ApiAccess::tokenizer(*this).encode(text, add_bos, parse_special);
}
std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  const vq::Tokenizer& t = ApiAccess::tokenizer(*this);
  return t.encode(text, t.add_bos_default(), true);
}
std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool special) const {
  return ApiAccess::tokenizer(*this).decode(ids, special);
}
std::string Tokenizer::piece(int32_t id, bool special) const { return ApiAccess::tokenizer(*this).piece(id, special); }
int32_t Tokenizer::bos() const { return ApiAccess::tokenizer(*this).bos(); }
int32_t Tokenizer::eos() const { return ApiAccess::tokenizer(*this).eos(); }
bool Tokenizer::is_end_of_generation(int32_t id) const { return ApiAccess::tokenizer(*this).is_eog(id); }
bool Tokenizer::add_bos_default() const { return ApiAccess::tokenizer(*this).add_bos_default(); }
int Tokenizer::n_vocab() const { return ApiAccess::tokenizer(*this).n_vocab(); }

std::string Tokenizer::apply_chat_template(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::vector<vq::ChatMessage> m;
  m.reserve(messages.size());
  for (const ChatMessage& x : messages) m.push_back({x.role, x.content});
  return vq::apply_chat_template(ApiAccess::tokenizer(*this), m, add_generation_prompt);
}

std::string Tokenizer::chat_format() const {
  const vq::Tokenizer& t = ApiAccess::tokenizer(*this);
  return vq::chat_format_name(vq::detect_chat_format(
      vq::chat_template_or_vocab_marker(t.chat_template(), t.find_token(vq::kGemmaTurnMarker) >= 0)));
}
std::string Tokenizer::kind() const { return ApiAccess::tokenizer(*this).model(); }
std::string Tokenizer::pre_tokenizer() const { return ApiAccess::tokenizer(*this).pre(); }

}  // namespace veloxquant
