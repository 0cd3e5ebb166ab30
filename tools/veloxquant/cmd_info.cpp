// veloxquant info: architecture, geometry, tensor types and KV-cache size per 1k tokens. On the
// public API alone (include/veloxquant: ModelInfo, Tokenizer).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "cli_checks.h"
#include "cli_model.h"
#include "commands.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"

namespace vq::cli {
namespace {

struct InfoOptions {
  std::string model;
  bool default_path = false;
};

void run_info(const InfoOptions& o) {
  if (o.default_path) {  // for scripts: the default model's path, fetched when absent
    std::printf("%s\n", default_model_path().c_str());
    return;
  }
  const std::string path = model_path_or_default(o.model);
  const veloxquant::Model model = veloxquant::Model::load(path);
  const veloxquant::ModelInfo& c = model.info();
  std::error_code ec;
  const auto file_size = std::filesystem::file_size(path, ec);
  // Strings from the file's metadata are printed escaped: a crafted name cannot drive the terminal.
  std::printf("file:          %s (%.1f MB, GGUF v%u)\n", printable(path).c_str(), ec ? 0.0 : double(file_size) / 1e6,
              c.gguf_version);
  if (!c.name.empty()) std::printf("name:          %s\n", printable(c.name).c_str());
  std::printf("architecture:  %s\n", printable(c.arch).c_str());
  std::printf("layers:        %d, embedding %d, feed-forward %d, vocabulary %d\n", c.n_layers, c.n_embd, c.n_ff,
              c.n_vocab);
  std::printf("attention:     %d query heads, %d KV heads (group %d), head_dim %d%s%s\n", c.n_heads, c.n_kv_heads,
              c.n_heads / c.n_kv_heads, c.head_dim, c.qkv_bias ? ", q/k/v bias" : "",
              c.qk_norm ? ", per-head q/k RMSNorm" : "");
  int n_sliding = 0;
  for (bool b : c.sliding_layers) n_sliding += b ? 1 : 0;
  if (n_sliding > 0) {
    std::string global;
    for (int l = 0; l < c.n_layers; ++l)
      if (!c.sliding_layers[size_t(l)]) global += fmt::format("{}{}", global.empty() ? "" : " ", l);
    std::printf("               sliding window %d on %d of %d layers (%s); global layers: %s\n", c.sliding_window,
                n_sliding, c.n_layers,
                c.sliding_pattern > 0 ? fmt::format("pattern: 1 global layer in every {}", c.sliding_pattern).c_str()
                                      : "per-layer pattern",
                global.empty() ? "none" : global.c_str());
  }
  std::printf("               score scale %.6g (1/sqrt(%.6g))\n", double(c.attn_scale),
              1.0 / (double(c.attn_scale) * double(c.attn_scale)));
  std::printf("rope:          %s pairs, theta %g%s, %d rotated dims, scaling %s", c.rope_layout.c_str(),
              double(c.rope_theta), n_sliding > 0 ? " (global layers)" : "", c.n_rot, c.rope_scaling.c_str());
  if (c.rope_scaling != "none") std::printf(" (factor %g)", double(c.rope_factor));
  if (c.rope_freqs_tensor) std::printf(", rope_freqs tensor");
  if (n_sliding > 0) std::printf("; sliding layers theta %g, unscaled", double(c.rope_theta_swa));
  std::printf("\ncontext:       %lld tokens (trained)\n", static_cast<long long>(c.n_ctx_train));
  std::printf("norm:          RMSNorm eps %g%s; embeddings %s%s\n", double(c.norm_eps),
              c.post_norms ? " (also after attention and MLP)" : "",
              c.tied_embeddings ? "tied (output head = token_embd)" : "separate output head",
              c.embd_scale != 1.0f ? fmt::format(", scaled by {:.6g}", double(c.embd_scale)).c_str() : "");
  std::printf("mlp:           %s-gated\n", c.ffn_activation.c_str());
  if (model.has_tokenizer()) {
    const veloxquant::Tokenizer t = model.tokenizer();
    std::printf("tokenizer:     %s (pre-tokenizer %s), %d tokens, bos %d, eos %d; chat format %s\n",
                printable(t.kind()).c_str(), printable(t.pre_tokenizer()).c_str(), t.n_vocab(), t.bos(), t.eos(),
                t.chat_format().c_str());
  } else {
    std::printf("tokenizer:     none\n");
  }
  std::string types;
  for (const auto& [name, n] : c.tensor_types) types += fmt::format("{}{} {}", types.empty() ? "" : ", ", n, name);
  std::printf("tensors:       %zu (%s), %.1f MB of weights\n", c.n_tensors, types.c_str(), double(c.weight_bytes) / 1e6);
  // KV elements per token: K and V, every layer and KV head.
  const double elems_per_token = 2.0 * c.n_layers * c.n_kv_heads * c.head_dim;
  std::printf("KV cache per 1k tokens (nominal bits/element; compressed caches add a %s window):\n",
              "recent-token fp16");
  for (const std::string& spec : veloxquant::kv_cache_methods()) {  // every registered method's presets
    const double bits = veloxquant::parse_kv_cache_config(spec).nominal_bits_per_element();
    std::printf("  %-24s %8.2f MB  (%5.2f bits/element)\n", spec.c_str(), 1000.0 * elems_per_token * bits / 8.0 / 1e6, bits);
  }
}

}  // namespace

void add_info(CLI::App& app) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* c = app.add_subcommand("info", "Describe a GGUF model: architecture, geometry, tensor types, KV-cache size");
  c->add_option("model", o->model, "GGUF model file or known model name (default: smollm2-135m)");
  c->add_option("-m,--model", o->model, model_help());
  c->add_flag("--default-model-path", o->default_path, "Print the default model's path (fetching it when absent)");
  c->callback([o] { run_info(*o); });
}

}  // namespace vq::cli
