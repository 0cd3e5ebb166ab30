// The batched forward pass of llama-family models. Per step: the new tokens of every entry are
// stacked as rows; embeddings, then per layer [RMSNorm -> q,k,v products for all rows (+bias,
// per-head q/k norm) -> RoPE at each row's position -> each entry's k,v appended to its sequence
// -> attention of all entries over their block tables -> output product -> residual -> RMSNorm
// -> SiLU-gated MLP -> residual], then the final norm and the output head for the rows asked.
// gemma3 adds: embeddings * sqrt(n_embd), a RoPE base per layer kind (sliding-window layers:
// their own), the attention scale from the config, sliding-window attention (the KV store's
// per-layer window), RMSNorm of the attention and MLP outputs before each residual add, and a
// GELU-gated MLP.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "core/error.h"
#include "core/thread_pool.h"
#include "model/device_model.h"
#include "model/forward_device.h"
#include "model/layers.h"
#include "model/session.h"

namespace vq {

void matmul_w(const WeightMatrix& w, const float* x, int64_t m, float* y) {
  matmul_maybe_packed(w.packed.get(), w.type, w.data, w.rows, w.cols, x, m, y);
}

void add_bias(float* y, const std::vector<float>& b, int n) {
  if (b.empty()) return;
  const int64_t dim = static_cast<int64_t>(b.size());
  for (int t = 0; t < n; ++t) add_inplace(y + t * dim, b.data(), dim);
}

void post_norm(float* y, const std::vector<float>& w, int n, float eps) {
  if (w.empty()) return;
  const int dim = static_cast<int>(w.size());
  for (int t = 0; t < n; ++t) rms_norm(y + int64_t(t) * dim, w.data(), y + int64_t(t) * dim, dim, eps);
}

void norm_rope_qk(const ModelConfig& cfg, const LayerWeights& L, int layer, const float* cos, const float* sin,
                  const float* cos_swa, const float* sin_swa, float* q, int hq, float* k, int hkv, int rows) {
  const int D = cfg.head_dim, half = cfg.n_rot / 2;
  const bool neox = cfg.rope_layout == RopeLayout::NeoX;
  const bool sliding = cfg.is_sliding(layer);
  const float* cos_l = sliding ? cos_swa : cos;
  const float* sin_l = sliding ? sin_swa : sin;
  for (int t = 0; t < rows; ++t) {
    float* qt = q + int64_t(t) * hq * D;
    float* kt = k + int64_t(t) * hkv * D;
    if (!L.q_norm.empty()) {
      for (int h = 0; h < hq; ++h) rms_norm(qt + h * D, L.q_norm.data(), qt + h * D, D, cfg.norm_eps);
      for (int h = 0; h < hkv; ++h) rms_norm(kt + h * D, L.k_norm.data(), kt + h * D, D, cfg.norm_eps);
    }
    const float* c = cos_l + size_t(t) * half;
    const float* s = sin_l + size_t(t) * half;
    rope_apply(qt, hq, D, cfg.n_rot, c, s, neox);
    rope_apply(kt, hkv, D, cfg.n_rot, c, s, neox);
  }
}

KVStoreOptions kv_store_options(const Model& model, size_t budget_bytes, KVDevice device) {
  const ModelConfig& c = model.config();
  KVStoreOptions o;
  o.budget_bytes = budget_bytes;
  o.device = device;
  if (c.n_sliding_layers() > 0)
    for (int l = 0; l < c.n_layers; ++l) o.sliding_window.push_back(c.is_sliding(l) ? c.sliding_window : 0);
  return o;
}

std::unique_ptr<KVStore> make_kv_store(const Model& model, const KVSpec& spec, size_t budget_bytes, KVDevice device) {
  return std::make_unique<KVStore>(model.kv_geometry(), model.config().n_layers, spec,
                                   kv_store_options(model, budget_bytes, device));
}

Forward::Forward(const Model& model, KVStore& kv) : model_(model), cfg_(model.config()), kv_(kv) {
  VQ_CHECK(kv.n_layers() == cfg_.n_layers, "forward: the KV store has {} layers, the model {}", kv.n_layers(),
           cfg_.n_layers);
  const KVGeometry g = model.kv_geometry();
  VQ_CHECK(kv.geometry().n_heads == g.n_heads && kv.geometry().n_kv_heads == g.n_kv_heads &&
               kv.geometry().head_dim == g.head_dim,
           "forward: the KV store's geometry differs from the model's");
  if (kv.device_kind() == KVDevice::cuda) dev_ = std::make_unique<ForwardDevice>(DeviceModel::upload(model), kv);
  else model.pack_for_cpu();
}

Forward::~Forward() = default;

void Forward::set_kv_observer(KVObserver f) {
  observer_ = std::move(f);
  if (dev_) dev_->set_kv_observer(observer_);
}

void Forward::set_deterministic(bool on) {
  if (dev_) dev_->set_deterministic(on);
}

void Forward::reserve(int rows) {
  if (rows <= cap_) return;
  const size_t c = size_t(rows);
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
  if (cfg_.n_sliding_layers() > 0) {
    cos_swa_.resize(c * (cfg_.n_rot / 2));
    sin_swa_.resize(c * (cfg_.n_rot / 2));
  }
  cap_ = rows;
}

void Forward::step(const BatchEntry* entries, int n_entries) {
  VQ_CHECK(n_entries >= 0, "forward: {} batch entries", n_entries);
  int rows = 0, logit_rows = 0;
  std::unordered_set<const SeqKV*> seen;
  std::vector<int64_t> counts;
  for (int e = 0; e < n_entries; ++e) {
    const BatchEntry& E = entries[e];
    VQ_CHECK(E.seq && E.seq->valid(), "forward: batch entry {} has no sequence", e);
    VQ_CHECK(seen.insert(E.seq).second, "forward: batch entry {} repeats a sequence", e);
    VQ_CHECK(E.n >= 1, "forward: batch entry {} has {} tokens", e, E.n);
    VQ_CHECK(E.logits == LogitsWanted::none || E.out, "forward: batch entry {} asks for logits but gives no buffer", e);
    for (int i = 0; i < E.n; ++i)
      VQ_CHECK(E.tokens[i] >= 0 && E.tokens[i] < cfg_.n_vocab, "forward: token id {} at index {} out of range [0, {})",
               E.tokens[i], i, cfg_.n_vocab);
    rows += E.n;
    logit_rows += E.logits == LogitsWanted::all ? E.n : E.logits == LogitsWanted::last ? 1 : 0;
    kv_.blocks_for_append(*E.seq, E.n, counts);
  }
  if (rows == 0) return;
  if (!kv_.pool().can_allocate(counts)) {
    throw KVPoolExhausted(fmt::format("kv pool: a step of {} tokens needs up to {:.1f} MiB more, {:.1f} MiB of the "
                                      "{:.1f} MiB budget are free",
                                      rows, double(kv_.pool().bytes_of(counts)) / 1048576.0,
                                      double(kv_.pool().free_bytes()) / 1048576.0,
                                      double(kv_.pool().budget_bytes()) / 1048576.0));
  }
  if (dev_) return dev_->step(entries, n_entries);
  reserve(rows);
  pos_.resize(size_t(rows));
  const int E = cfg_.n_embd;
  // Embeddings and each row's position.
  for (int e = 0, r = 0; e < n_entries; ++e)
    for (int i = 0; i < entries[e].n; ++i, ++r) {
      embed_token(model_, entries[e].tokens[i], x_.data() + int64_t(r) * E);
      pos_[size_t(r)] = entries[e].seq->size() + i;
    }
  if (cfg_.embd_scale != 1.0f) scale_inplace(x_.data(), cfg_.embd_scale, int64_t(rows) * E);  // gemma3
  rotary_tables(model_, pos_.data(), rows, cos_.data(), sin_.data(), cos_swa_.data(), sin_swa_.data());
  for (int l = 0; l < cfg_.n_layers; ++l) {
    attention_block(l, entries, n_entries, rows);
    mlp_block(l, rows);
  }
  for (int e = 0; e < n_entries; ++e) kv_.trim(*entries[e].seq);
  if (logit_rows == 0) return;
  // Output head: the rows asked for, normalised into xn_ back to back, one product.
  std::vector<std::pair<float*, int>> outs;  // (destination, rows) per entry in order
  int lr = 0;
  for (int e = 0, r = 0; e < n_entries; r += entries[e].n, ++e) {
    const BatchEntry& B = entries[e];
    if (B.logits == LogitsWanted::none) continue;
    const int first = B.logits == LogitsWanted::all ? 0 : B.n - 1;
    for (int t = first; t < B.n; ++t, ++lr)
      rms_norm(x_.data() + int64_t(r + t) * E, model_.output_norm().data(), xn_.data() + int64_t(lr) * E, E,
               cfg_.norm_eps);
    outs.emplace_back(B.out, B.n - first);
  }
  const size_t V = size_t(cfg_.n_vocab);
  if (outs.size() == 1) {
    matmul_w(model_.output(), xn_.data(), lr, outs[0].first);
    return;
  }
  if (logits_.size() < size_t(lr) * V) logits_.resize(size_t(lr) * V);
  matmul_w(model_.output(), xn_.data(), lr, logits_.data());
  size_t off = 0;
  for (auto& [dst, n] : outs) {
    std::memcpy(dst, logits_.data() + off * V, size_t(n) * V * sizeof(float));
    off += size_t(n);
  }
}

void Forward::attention_block(int layer, const BatchEntry* entries, int n_entries, int rows) {
  const LayerWeights& L = model_.layers()[size_t(layer)];
  const int E = cfg_.n_embd, qd = cfg_.q_dim(), kvd = cfg_.kv_dim();
  for (int t = 0; t < rows; ++t)
    rms_norm(x_.data() + int64_t(t) * E, L.attn_norm.data(), xn_.data() + int64_t(t) * E, E, cfg_.norm_eps);
  project_shared(xn_.data(), rows, {{&L.wq, q_.data()}, {&L.wk, k_.data()}, {&L.wv, v_.data()}});
  add_bias(q_.data(), L.q_bias, rows);
  add_bias(k_.data(), L.k_bias, rows);
  add_bias(v_.data(), L.v_bias, rows);
  norm_rope_qk(cfg_, L, layer, cos_.data(), sin_.data(), cos_swa_.data(), sin_swa_.data(), q_.data(), cfg_.n_heads,
               k_.data(), cfg_.n_kv_heads, rows);
  attn_entries_.clear();
  for (int e = 0, r = 0; e < n_entries; r += entries[e].n, ++e) {
    const BatchEntry& B = entries[e];
    const float* kr = k_.data() + int64_t(r) * kvd;
    const float* vr = v_.data() + int64_t(r) * kvd;
    if (observer_) observer_(layer, e, q_.data() + int64_t(r) * qd, kr, vr, B.n);
    const int64_t pos0 = B.seq->layer_size(layer);
    kv_.append(*B.seq, layer, kr, vr, B.n);
    attn_entries_.push_back(AttnEntry{B.seq, pos0, B.n, q_.data() + int64_t(r) * qd, attn_.data() + int64_t(r) * qd});
  }
  kv_.attend(layer, attn_entries_.data(), int(attn_entries_.size()), cfg_.attn_scale);
  matmul_w(L.wo, attn_.data(), rows, proj_.data());
  post_norm(proj_.data(), L.post_attn_norm, rows, cfg_.norm_eps);
  add_inplace(x_.data(), proj_.data(), int64_t(rows) * E);
}

void Forward::project_shared(const float* x, int n, std::initializer_list<std::pair<const WeightMatrix*, float*>> outs) {
  vq::project_shared(act_, x, n, outs);
}

void embed_token(const Model& model, int32_t token, float* dst) {
  const WeightMatrix& emb = model.token_embd();
  const size_t row_bytes = ggml_row_bytes(emb.type, emb.cols);
  dequantize_row(emb.type, static_cast<const uint8_t*>(emb.data) + size_t(token) * row_bytes, dst, emb.cols);
}

void rotary_tables(const Model& model, const int64_t* pos, int rows, float* cos, float* sin, float* cos_swa,
                   float* sin_swa) {
  const int half = model.config().n_rot / 2;
  auto angles = [&](const std::vector<double>& f, float* cs, float* sn) {
    for (int r = 0; r < rows; ++r) {
      const double p = double(pos[r]);
      for (int i = 0; i < half; ++i) {
        cs[size_t(r) * half + i] = static_cast<float>(std::cos(p * f[i]));
        sn[size_t(r) * half + i] = static_cast<float>(std::sin(p * f[i]));
      }
    }
  };
  angles(model.rope_inv_freqs(), cos, sin);
  if (model.config().n_sliding_layers() > 0) angles(model.rope_inv_freqs_swa(), cos_swa, sin_swa);
}

void project_shared(ActivationBuffer& act, const float* x, int n,
                    std::initializer_list<std::pair<const WeightMatrix*, float*>> outs) {
  const int64_t cols = outs.begin()->first->cols;
  if (cols % 32 != 0) {  // only float weights allow such widths; they need no quantized input
    for (const auto& [w, y] : outs) matmul_w(*w, x, n, y);
    return;
  }
  const QuantizedRows& xq = act.quantize(x, n, cols);
  bool all_packed = true, any_packed = false;
  for (const auto& [w, y] : outs) {
    all_packed = all_packed && w->packed != nullptr;
    any_packed = any_packed || w->packed != nullptr;
  }
  if (all_packed && outs.size() > 1) {  // the groups of 8 rows of all of them in one dispatch
    PackedJob jobs[4];
    VQ_CHECK(outs.size() <= 4, "project_shared: {} products (at most 4)", outs.size());
    int nj = 0;
    for (const auto& [w, y] : outs) jobs[nj++] = {&packed_weight(*w->packed, w->type, w->data, w->rows, w->cols), y};
    matmul_packed_multi(jobs, nj, xq);
    return;
  }
  if (n > 1 || outs.size() == 1 || any_packed) {
    for (const auto& [w, y] : outs) matmul_maybe_packed(w->packed.get(), w->type, w->data, w->rows, w->cols, xq, y);
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

void Forward::mlp_block(int layer, int rows) {
  const LayerWeights& L = model_.layers()[size_t(layer)];
  const int E = cfg_.n_embd, F = cfg_.n_ff;
  for (int t = 0; t < rows; ++t)
    rms_norm(x_.data() + int64_t(t) * E, L.ffn_norm.data(), xn_.data() + int64_t(t) * E, E, cfg_.norm_eps);
  project_shared(xn_.data(), rows, {{&L.w_gate, gate_.data()}, {&L.w_up, up_.data()}});
  if (cfg_.ffn_act == FfnActivation::GeluTanh) gelu_tanh_mul(gate_.data(), up_.data(), gate_.data(), int64_t(rows) * F);
  else silu_mul(gate_.data(), up_.data(), gate_.data(), int64_t(rows) * F);
  matmul_w(L.w_down, gate_.data(), rows, proj_.data());
  post_norm(proj_.data(), L.post_ffn_norm, rows, cfg_.norm_eps);
  add_inplace(x_.data(), proj_.data(), int64_t(rows) * E);
}

Session::Session(const Model& model, const KVSpec& spec, int n_ctx, int max_chunk, size_t budget_bytes,
                 KVDevice device, int tp)
    : model_(model), n_ctx_(n_ctx), max_chunk_(std::min(max_chunk, std::max(n_ctx, 1))) {
  VQ_CHECK(n_ctx >= 1, "session: n_ctx {} must be >= 1", n_ctx);
  VQ_CHECK(max_chunk >= 1, "session: max_chunk {} must be >= 1", max_chunk);
  VQ_CHECK(tp >= 1, "--tp: {} must be >= 1", tp);
  if (tp > 1) {
    tp_ = std::make_unique<TPForward>(model, spec, tp, budget_bytes, nullptr, device);
    tp_seq_ = tp_->new_sequence();
    return;
  }
  store_ = make_kv_store(model, spec, budget_bytes, device);
  seq_ = store_->new_sequence();
  fwd_ = std::make_unique<Forward>(model, *store_);
}

void Session::reset() {
  if (tp_) {
    tp_->release(tp_seq_);
    tp_seq_ = tp_->new_sequence();
    return;
  }
  store_->release(seq_);
  seq_ = store_->new_sequence();
}

static void check_unsplit(bool split, const char* what) {
  VQ_CHECK(!split, "session: {} is not available with tensor parallelism (tp > 1)", what);
}
KVStore& Session::store() {
  check_unsplit(tp_ != nullptr, "the KV store (session files, block access)");
  return *store_;
}
const KVStore& Session::store() const {
  check_unsplit(tp_ != nullptr, "the KV store (session files, block access)");
  return *store_;
}
SeqKV& Session::sequence() {
  check_unsplit(tp_ != nullptr, "the KV sequence (session files)");
  return seq_;
}
const SeqKV& Session::sequence() const {
  check_unsplit(tp_ != nullptr, "the KV sequence (session files)");
  return seq_;
}
TPSequence& Session::tp_sequence() {
  VQ_CHECK(tp_ != nullptr, "session: tp_sequence() of an unsplit session");
  return tp_seq_;
}
const TPSequence& Session::tp_sequence() const {
  VQ_CHECK(tp_ != nullptr, "session: tp_sequence() of an unsplit session");
  return tp_seq_;
}
Forward& Session::forward_pass() {
  check_unsplit(tp_ != nullptr, "the unsplit forward (KV observers)");
  return *fwd_;
}

template <class F>
size_t Session::sum_over_stores(F f) const {
  if (!tp_) return f(*store_, seq_);
  size_t b = 0;
  for (int r = 0; r < tp_->tp(); ++r) b += f(tp_->store(r), tp_seq_.ranks[size_t(r)]);
  return b;
}
size_t Session::kv_bytes() const {
  return sum_over_stores([](const KVStore& s, const SeqKV& q) { return s.allocated_bytes(q); });
}
size_t Session::kv_token_bytes() const {
  return sum_over_stores([](const KVStore& s, const SeqKV& q) { return s.token_bytes(q); });
}
size_t Session::kv_fp16_bytes() const {
  return sum_over_stores([](const KVStore& s, const SeqKV& q) { return s.fp16_bytes(q); });
}
size_t Session::kv_codebook_bytes() const {
  return sum_over_stores([](const KVStore& s, const SeqKV&) { return s.codebook_bytes(); });
}

void Session::forward(const int32_t* tokens, int n, float* logits, bool all_logits) {
  const ModelConfig& cfg = model_.config();
  VQ_CHECK(n >= 1, "session: forward of {} tokens", n);
  VQ_CHECK(pos() + n <= n_ctx_, "session: context full: position {} + {} tokens exceeds n_ctx {}", pos(), n, n_ctx_);
  for (int i = 0; i < n; ++i) {
    VQ_CHECK(tokens[i] >= 0 && tokens[i] < cfg.n_vocab, "session: token id {} at index {} out of range [0, {})",
             tokens[i], i, cfg.n_vocab);
  }
  for (int done = 0; done < n;) {
    const int m = std::min(max_chunk_, n - done);
    const bool last = done + m == n;
    BatchEntry e;
    e.seq = &seq_;
    e.tokens = tokens + done;
    e.n = m;
    e.logits = LogitsWanted::none;
    if (logits && all_logits) {
      e.logits = LogitsWanted::all;
      e.out = logits + static_cast<int64_t>(done) * cfg.n_vocab;
    } else if (logits && last) {
      e.logits = LogitsWanted::last;
      e.out = logits;
    }
    if (tp_) {
      TPBatchEntry t;
      t.seq = &tp_seq_;
      t.tokens = e.tokens;
      t.n = m;
      t.all_logits = e.logits == LogitsWanted::all;
      t.out = e.logits == LogitsWanted::none ? nullptr : e.out;
      tp_->step(&t, 1);
    } else {
      fwd_->step(&e, 1);
    }
    done += m;
  }
}

}  // namespace vq
