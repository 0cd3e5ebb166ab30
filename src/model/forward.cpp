// Session: the forward pass of llama-family models. Per chunk of tokens: embeddings, then per
// layer [RMSNorm -> q,k,v products (+bias, per-head q/k norm) -> RoPE -> cache.append(k, v) ->
// cache.attend(q) -> output product -> residual -> RMSNorm -> SiLU-gated MLP -> residual], then
// the final norm and the output head. gemma3 additions are marked `// gemma3:` (embedding scale,
// per-layer rope base, attention scale, sliding window, post-norms, GELU-tanh MLP).
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/layers.h"
#include "model/model.h"

namespace vq {
namespace {

void matmul_w(const WeightMatrix& w, const float* x, int64_t m, float* y) {
  matmul(w.type, w.data, w.rows, w.cols, x, m, y);
}

void add_bias(float* y, const std::vector<float>& b, int n) {
  if (b.empty()) return;
  const int64_t dim = static_cast<int64_t>(b.size());
  for (int t = 0; t < n; ++t) add_inplace(y + t * dim, b.data(), dim);
}

// gemma3: RMSNorm in place of each of the n rows of y [n, dim] (the post-attention / post-MLP
// norms); nothing when the architecture has no such weights.
void post_norm(float* y, const std::vector<float>& w, int n, float eps) {
  if (w.empty()) return;
  const int dim = static_cast<int>(w.size());
  for (int t = 0; t < n; ++t) rms_norm(y + int64_t(t) * dim, w.data(), y + int64_t(t) * dim, dim, eps);
}

}  // namespace

Session::Session(const Model& model, const KVCacheFactory& factory, int n_ctx, int max_chunk)
    : model_(model), cfg_(model.config()), n_ctx_(n_ctx), max_chunk_(std::min(max_chunk, n_ctx)) {
  VQ_CHECK(n_ctx >= 1, "session: n_ctx {} must be >= 1", n_ctx);
  VQ_CHECK(max_chunk >= 1, "session: max_chunk {} must be >= 1", max_chunk);
  VQ_CHECK(static_cast<bool>(factory), "session: no KV-cache factory");
  const KVGeometry geo = model.kv_geometry();
  caches_.reserve(static_cast<size_t>(cfg_.n_layers));
  for (int l = 0; l < cfg_.n_layers; ++l) {
    caches_.push_back(factory(l, geo));
    VQ_CHECK(caches_.back() != nullptr, "session: KV-cache factory returned no cache for layer {}", l);
  }
  const size_t c = static_cast<size_t>(max_chunk_);
  x_.resize(c * cfg_.n_embd);
  xn_.resize(c * cfg_.n_embd);
  q_.resize(c * cfg_.q_dim());
  k_.resize(c * cfg_.kv_dim());
  v_.resize(c * cfg_.kv_dim());
  attn_.resize(c * cfg_.q_dim());
  proj_.resize(c * cfg_.n_embd);
  gate_.resize(c * cfg_.n_ff);
  up_.resize(c * cfg_.n_ff);
  cos_.resize(c * (cfg_.n_rot / 2));
  sin_.resize(c * (cfg_.n_rot / 2));
  if (cfg_.n_sliding_layers() > 0) {  // gemma3: the sliding-window layers' own rope base
    cos_swa_.resize(c * (cfg_.n_rot / 2));
    sin_swa_.resize(c * (cfg_.n_rot / 2));
  }
}

void Session::reset() {
  for (auto& kv : caches_) kv->clear();
  pos_ = 0;
}

size_t Session::kv_bytes() const {
  size_t b = 0;
  for (const auto& kv : caches_) b += kv->bytes();
  return b;
}
size_t Session::kv_fp16_bytes() const {
  size_t b = 0;
  for (const auto& kv : caches_) b += kv->fp16_bytes();
  return b;
}
size_t Session::kv_codebook_bytes() const {
  size_t b = 0;
  for (const auto& kv : caches_) b += kv->codebook_bytes();
  return b;
}

void Session::forward(const int32_t* tokens, int n, float* logits, bool all_logits) {
  VQ_CHECK(n >= 1, "session: forward of {} tokens", n);
  VQ_CHECK(pos_ + n <= n_ctx_, "session: context full: position {} + {} tokens exceeds n_ctx {}", pos_, n, n_ctx_);
  for (int i = 0; i < n; ++i) {
    VQ_CHECK(tokens[i] >= 0 && tokens[i] < cfg_.n_vocab, "session: token id {} at index {} out of range [0, {})",
             tokens[i], i, cfg_.n_vocab);
  }
  for (int done = 0; done < n;) {
    const int m = std::min(max_chunk_, n - done);
    const bool last = done + m == n;
    float* out = nullptr;
    if (logits && all_logits) out = logits + static_cast<int64_t>(done) * cfg_.n_vocab;
    if (logits && !all_logits && last) out = logits;
    forward_chunk(tokens + done, m, out, all_logits);
    done += m;
  }
}

void Session::forward_chunk(const int32_t* tokens, int n, float* logits, bool all_logits) {
  const int E = cfg_.n_embd;
  // Embeddings: one decoded row of token_embd per token.
  const WeightMatrix& emb = model_.token_embd();
  const size_t row_bytes = ggml_row_bytes(emb.type, emb.cols);
  for (int t = 0; t < n; ++t) {
    const auto* row = static_cast<const uint8_t*>(emb.data) + size_t(tokens[t]) * row_bytes;
    dequantize_row(emb.type, row, x_.data() + int64_t(t) * E, E);
  }
  if (cfg_.embd_scale != 1.0f) scale_inplace(x_.data(), cfg_.embd_scale, int64_t(n) * E);  // gemma3: * sqrt(n_embd)
  // Rotary angles of this chunk's positions, in double: pos * freq reaches 1e5 radians.
  const int half = cfg_.n_rot / 2;
  auto angles = [&](const std::vector<double>& f, float* cs, float* sn) {
    for (int t = 0; t < n; ++t) {
      const double p = double(pos_ + t);
      for (int i = 0; i < half; ++i) {
        cs[size_t(t) * half + i] = static_cast<float>(std::cos(p * f[i]));
        sn[size_t(t) * half + i] = static_cast<float>(std::sin(p * f[i]));
      }
    }
  };
  angles(model_.rope_inv_freqs(), cos_.data(), sin_.data());
  // gemma3: sliding-window layers rotate with their own base (10000)
  if (!cos_swa_.empty()) angles(model_.rope_inv_freqs_swa(), cos_swa_.data(), sin_swa_.data());
  for (int l = 0; l < cfg_.n_layers; ++l) {
    attention_block(l, n);
    mlp_block(l, n);
  }
  pos_ += n;
  if (!logits) return;
  // Output head: every row when all logits are asked for, else only the last token's.
  const int first = all_logits ? 0 : n - 1;
  const int rows = n - first;
  for (int t = first; t < n; ++t) {
    rms_norm(x_.data() + int64_t(t) * E, model_.output_norm().data(), xn_.data() + int64_t(t - first) * E, E,
             cfg_.norm_eps);
  }
  matmul_w(model_.output(), xn_.data(), rows, logits);
}

void Session::attention_block(int layer, int n) {
  const LayerWeights& L = model_.layers()[size_t(layer)];
  const int E = cfg_.n_embd, D = cfg_.head_dim, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  for (int t = 0; t < n; ++t) rms_norm(x_.data() + int64_t(t) * E, L.attn_norm.data(), xn_.data() + int64_t(t) * E, E, cfg_.norm_eps);
  project_shared(xn_.data(), n, {{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}});
  add_bias(q_.data(), L.q_bias, n);
  add_bias(k_.data(), L.k_bias, n);
  add_bias(v_.data(), L.v_bias, n);
  const bool neox = cfg_.rope_layout == RopeLayout::NeoX;
  const int half = cfg_.n_rot / 2;
  const bool sliding = cfg_.is_sliding(layer);  // gemma3: local layer
  const float* cos_l = sliding ? cos_swa_.data() : cos_.data();
  const float* sin_l = sliding ? sin_swa_.data() : sin_.data();
  for (int t = 0; t < n; ++t) {
    float* qt = q_.data() + int64_t(t) * qd;
    float* kt = k_.data() + int64_t(t) * kvd;
    if (!L.q_norm.empty()) {
      for (int h = 0; h < cfg_.n_heads; ++h) rms_norm(qt + h * D, L.q_norm.data(), qt + h * D, D, cfg_.norm_eps);
      for (int h = 0; h < cfg_.n_kv_heads; ++h) rms_norm(kt + h * D, L.k_norm.data(), kt + h * D, D, cfg_.norm_eps);
    }
    const float* c = cos_l + size_t(t) * half;
    const float* s = sin_l + size_t(t) * half;
    rope_apply(qt, cfg_.n_heads, D, cfg_.n_rot, c, s, neox);
    rope_apply(kt, cfg_.n_kv_heads, D, cfg_.n_rot, c, s, neox);
  }
  KVCache& kv = *caches_[size_t(layer)];
  kv.append(k_.data(), v_.data(), n);
  // gemma3: the scale comes from the config (query_pre_attn_scalar^-0.5; 1/sqrt(head_dim) elsewhere).
  // A sliding-window layer whose window holds every key so far attends as a global one.
  if (sliding && pos_ + n > cfg_.sliding_window) {
    kv.attend_window(q_.data(), n, cfg_.attn_scale, attn_.data(), cfg_.sliding_window);  // gemma3: TEMPORARY
  } else {
    kv.attend(q_.data(), n, cfg_.attn_scale, attn_.data());
  }
  matmul_w(L.wo, attn_.data(), n, proj_.data());
  post_norm(proj_.data(), L.post_attn_norm, n, cfg_.norm_eps);  // gemma3: norm before the residual add
  add_inplace(x_.data(), proj_.data(), int64_t(n) * E);
}

void Session::project_shared(const float* x, int n, std::initializer_list<std::pair<const WeightMatrix*, float*>> outs) {
  const int64_t cols = outs.begin()->first->cols;
  if (cols % 32 != 0) {  // only float weights allow such widths; they need no quantized input
    for (const auto& [w, y] : outs) matmul_w(*w, x, n, y);
    return;
  }
  const QuantizedRows& xq = act_.quantize(x, n, cols);
  if (n > 1 || outs.size() == 1) {
    for (const auto& [w, y] : outs) matmul_q(w->type, w->data, w->rows, w->cols, xq, y);
    return;
  }
  // One token: the weights' rows form one range split over the threads in a single dispatch
  // (a wake-up per product costs about as much as a small product). The products called
  // inside run serially on each thread's part; with one row of input, part of the rows of W
  // writes the matching part of y.
  int64_t total = 0;
  size_t bytes = 0;
  for (const auto& [w, y] : outs) total += w->rows, bytes += ggml_row_bytes(w->type, w->cols) * size_t(w->rows);
  const size_t grain = std::max<size_t>(16, size_t(total) * 32 * 1024 / std::max<size_t>(bytes, 1));
  parallel_for(
      size_t(total),
      [&](size_t r0, size_t r1, int) {
        int64_t base = 0;
        for (const auto& [w, y] : outs) {
          const int64_t a = std::max<int64_t>(int64_t(r0), base), b = std::min<int64_t>(int64_t(r1), base + w->rows);
          if (a < b) {
            const size_t rb = ggml_row_bytes(w->type, w->cols);
            matmul_q(w->type, static_cast<const uint8_t*>(w->data) + size_t(a - base) * rb, b - a, w->cols, xq,
                     y + (a - base));
          }
          base += w->rows;
        }
      },
      grain);
}

void Session::mlp_block(int layer, int n) {
  const LayerWeights& L = model_.layers()[size_t(layer)];
  const int E = cfg_.n_embd, F = cfg_.n_ff;
  for (int t = 0; t < n; ++t) rms_norm(x_.data() + int64_t(t) * E, L.ffn_norm.data(), xn_.data() + int64_t(t) * E, E, cfg_.norm_eps);
  project_shared(xn_.data(), n, {{&L.w_gate, gate_.data()}, {&L.w_up, up_.data()}});
  if (cfg_.ffn_act == FfnActivation::GeluTanh) {
    gelu_tanh_mul(gate_.data(), up_.data(), gate_.data(), int64_t(n) * F);  // gemma3
  } else {
    silu_mul(gate_.data(), up_.data(), gate_.data(), int64_t(n) * F);
  }
  matmul_w(L.w_down, gate_.data(), n, proj_.data());
  post_norm(proj_.data(), L.post_ffn_norm, n, cfg_.norm_eps);  // gemma3: norm before the residual add
  add_inplace(x_.data(), proj_.data(), int64_t(n) * E);
}

}  // namespace vq
