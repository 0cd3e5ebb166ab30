// Tensor-parallel split of the forward (tensor_parallel.h): the plan, the CPU communicator, the
// weight shards and the split forward over simulated ranks. The per-rank steps mirror
// Forward::attention_block / mlp_block (forward.cpp) on a rank's shard and store; at tp = 1 the
// shards are the model's own matrices and the result equals Forward's bit for bit.
#include "model/tensor_parallel.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <unordered_set>

#include "codec/calibration_file.h"
#include "core/error.h"
#include "model/layers.h"
#include "model/device_model.h"
#include "model/forward_device.h"
#include "model/session.h"
#include "ops/cuda/collective_cuda.h"  // declarations only (no CUDA types)
#include "ops/cuda/device.h"

namespace vq {

// ---- plan

TPPlan make_tp_plan(int n_heads, int n_kv_heads, int n_ff, int tp) {
  VQ_CHECK(tp >= 1, "--tp: {} must be >= 1", tp);
  VQ_CHECK(n_heads >= 1 && n_kv_heads >= 1 && n_heads % n_kv_heads == 0,
           "tp: {} query heads and {} KV heads are not a grouped-query geometry", n_heads, n_kv_heads);
  VQ_CHECK(n_heads % tp == 0, "--tp {}: the model's {} attention heads do not split evenly over {} ranks", tp, n_heads,
           tp);
  VQ_CHECK(n_ff >= 1 && n_ff % tp == 0, "--tp {}: the MLP's intermediate size {} does not split evenly over {} ranks",
           tp, n_ff, tp);
  if (tp <= n_kv_heads)
    VQ_CHECK(n_kv_heads % tp == 0, "--tp {}: the model's {} KV heads do not split evenly over {} ranks", tp,
             n_kv_heads, tp);
  else
    VQ_CHECK(tp % n_kv_heads == 0,
             "--tp {}: more ranks than the model's {} KV heads, and {} is not a multiple of {} (each KV head must be "
             "replicated on the same number of ranks)",
             tp, n_kv_heads, tp, n_kv_heads);
  TPPlan p;
  p.tp = tp;
  p.kv_replicas = tp > n_kv_heads ? tp / n_kv_heads : 1;
  const int hq = n_heads / tp, hkv = tp > n_kv_heads ? 1 : n_kv_heads / tp, ff = n_ff / tp;
  const int group = n_heads / n_kv_heads;
  for (int r = 0; r < tp; ++r) {
    TPRankPlan rp;
    rp.q_heads = {r * hq, hq};
    rp.kv_heads = {tp > n_kv_heads ? r / p.kv_replicas : r * hkv, hkv};
    rp.ff = {r * ff, ff};
    // The rank's query heads read exactly its KV heads.
    VQ_CHECK(rp.q_heads.begin / group == rp.kv_heads.begin && (rp.q_heads.end() - 1) / group == rp.kv_heads.end() - 1,
             "tp: internal: rank {}'s query heads [{}, {}) do not map onto its KV heads [{}, {})", r, rp.q_heads.begin,
             rp.q_heads.end(), rp.kv_heads.begin, rp.kv_heads.end());
    p.ranks.push_back(rp);
  }
  return p;
}

TPPlan make_tp_plan(const ModelConfig& cfg, int tp) { return make_tp_plan(cfg.n_heads, cfg.n_kv_heads, cfg.n_ff, tp); }

ModelConfig tp_rank_config(const ModelConfig& cfg, const TPPlan& plan, int rank) {
  VQ_CHECK(rank >= 0 && rank < plan.tp, "tp: rank {} of {}", rank, plan.tp);
  const TPRankPlan& p = plan.ranks[size_t(rank)];
  ModelConfig c = cfg;
  c.n_heads = p.q_heads.count;
  c.n_kv_heads = p.kv_heads.count;
  c.n_ff = p.ff.count;
  return c;
}

// ---- communicator

LocalCommunicator::LocalCommunicator(int size) : size_(size) {
  VQ_CHECK(size >= 1, "communicator: {} ranks", size);
}

void LocalCommunicator::all_reduce_sum(float* const* bufs, int64_t n) {
  if (size_ == 1) return;
  float* acc = bufs[0];
  for (int r = 1; r < size_; ++r) add_inplace(acc, bufs[r], n);
  for (int r = 1; r < size_; ++r) std::memcpy(bufs[r], acc, size_t(n) * sizeof(float));
}

// ---- weight shards

namespace {

WeightMatrix whole_or_rows(const WeightMatrix& w, int64_t r0, int64_t n) {
  if (r0 == 0 && n == w.rows) return w;  // the model's matrix, its packed copy shared
  WeightMatrix s;
  s.name = w.name;
  s.type = w.type;
  s.data = static_cast<const uint8_t*>(w.data) + size_t(r0) * ggml_row_bytes(w.type, w.cols);
  s.rows = n;
  s.cols = w.cols;
  s.packed = packable(w.type, w.cols) ? std::make_shared<PackedSlot>() : nullptr;
  return s;
}

void check_col_split(const WeightMatrix& w, int64_t c0, int64_t n, int tp) {
  const int64_t blk = ggml_block_elems(w.type);
  VQ_CHECK(c0 % blk == 0 && n % blk == 0,
           "--tp {}: tensor '{}' ({}, blocks of {} elements) would be split by columns at {} ({} of its {} columns per "
           "rank): a column split must fall on block boundaries; use a smaller --tp",
           tp, w.name, ggml_type_name(w.type), blk, c0 % blk ? c0 : c0 + n, n, w.cols);
}

WeightMatrix cols_copy(const WeightMatrix& w, int64_t c0, int64_t n, int tp, TPRankWeights& out) {
  if (c0 == 0 && n == w.cols) return w;
  check_col_split(w, c0, n, tp);
  const size_t rb = ggml_row_bytes(w.type, w.cols), nb = ggml_row_bytes(w.type, n),
               ob = ggml_row_bytes(w.type, c0);
  auto buf = std::make_unique<AlignedBuffer<uint8_t>>(nb * size_t(w.rows));
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) std::memcpy(buf->data() + size_t(r) * nb, src + size_t(r) * rb + ob, nb);
  WeightMatrix s;
  s.name = w.name;
  s.type = w.type;
  s.data = buf->data();
  s.rows = w.rows;
  s.cols = n;
  s.packed = packable(w.type, n) ? std::make_shared<PackedSlot>() : nullptr;
  out.owned.push_back(std::move(buf));
  return s;
}

std::vector<float> slice(const std::vector<float>& v, size_t begin, size_t n) {
  if (v.empty()) return {};
  return std::vector<float>(v.begin() + ptrdiff_t(begin), v.begin() + ptrdiff_t(begin + n));
}

}  // namespace

TPRankWeights make_rank_weights(const Model& model, const TPPlan& plan, int rank) {
  VQ_CHECK(rank >= 0 && rank < plan.tp, "tp: rank {} of {}", rank, plan.tp);
  const ModelConfig& c = model.config();
  const TPRankPlan& p = plan.ranks[size_t(rank)];
  const int64_t D = c.head_dim;
  TPRankWeights out;
  out.layers.reserve(model.layers().size());
  for (const LayerWeights& L : model.layers()) {
    TPLayerShard s;
    s.wq = whole_or_rows(L.wq, p.q_heads.begin * D, p.q_heads.count * D);
    s.wk = whole_or_rows(L.wk, p.kv_heads.begin * D, p.kv_heads.count * D);
    s.wv = whole_or_rows(L.wv, p.kv_heads.begin * D, p.kv_heads.count * D);
    s.wo = cols_copy(L.wo, p.q_heads.begin * D, p.q_heads.count * D, plan.tp, out);
    s.w_gate = whole_or_rows(L.w_gate, p.ff.begin, p.ff.count);
    s.w_up = whole_or_rows(L.w_up, p.ff.begin, p.ff.count);
    s.w_down = cols_copy(L.w_down, p.ff.begin, p.ff.count, plan.tp, out);
    s.q_bias = slice(L.q_bias, size_t(p.q_heads.begin * D), size_t(p.q_heads.count * D));
    s.k_bias = slice(L.k_bias, size_t(p.kv_heads.begin * D), size_t(p.kv_heads.count * D));
    s.v_bias = slice(L.v_bias, size_t(p.kv_heads.begin * D), size_t(p.kv_heads.count * D));
    out.layers.push_back(std::move(s));
  }
  return out;
}

TPPlan check_tp(const Model& model, int tp) {
  TPPlan plan = make_tp_plan(model.config(), tp);
  if (tp == 1) return plan;
  const int64_t D = model.config().head_dim;
  for (const LayerWeights& L : model.layers())
    for (const TPRankPlan& p : plan.ranks) {
      check_col_split(L.wo, p.q_heads.begin * D, p.q_heads.count * D, tp);
      check_col_split(L.w_down, p.ff.begin, p.ff.count, tp);
    }
  return plan;
}

Calibration slice_calibration(const Calibration& c, int kv0, int n) {
  VQ_CHECK(kv0 >= 0 && n >= 1 && kv0 + n <= c.n_kv_heads, "tp: KV heads [{}, {}) of a calibration of {} heads", kv0,
           kv0 + n, c.n_kv_heads);
  Calibration s = c;
  s.n_kv_heads = n;
  auto cut = [&](const std::vector<float>& v) {
    const size_t per = v.size() / size_t(c.n_kv_heads);
    return std::vector<float>(v.begin() + ptrdiff_t(per * size_t(kv0)), v.begin() + ptrdiff_t(per * size_t(kv0 + n)));
  };
  for (size_t l = 0; l < c.layers.size(); ++l) {
    s.layers[l].smoothing = cut(c.layers[l].smoothing);
    s.layers[l].key_codebooks = cut(c.layers[l].key_codebooks);
    s.layers[l].value_codebooks = cut(c.layers[l].value_codebooks);
    if (c.has_key_mean()) s.layers[l].key_mean = cut(c.layers[l].key_mean);
    if (c.learned_keys()) s.layers[l].key_map = cut(c.layers[l].key_map);
  }
  s.validate();
  return s;
}

// ---- the split forward

struct TPForward::Rank {
  TPRankWeights w;
  int hq = 0, hkv = 0;  // heads held
  AlignedBuffer<float> q, k, v, attn, proj, gate, up;
  ActivationBuffer act;
  std::vector<AttnEntry> attn_entries;
};

TPForward::TPForward(const Model& model, const KVSpec& spec, int tp, size_t budget_bytes,
                     std::unique_ptr<Communicator> comm, KVDevice device, const TPDeviceOptions& dev_opt)
    : model_(model), cfg_(model.config()), plan_(check_tp(model, tp)), device_(device), comm_(std::move(comm)) {
  if (!comm_) comm_ = std::make_unique<LocalCommunicator>(tp);
  VQ_CHECK(comm_->size() == tp, "tp: a communicator of {} ranks for tp {}", comm_->size(), tp);
  const KVStoreOptions opt =
      kv_store_options(model, budget_bytes == size_t(-1) ? budget_bytes : budget_bytes / size_t(tp), device);
  auto rank_spec = [&](int r) {
    KVSpec s = spec;
    const TPRankPlan& p = plan_.ranks[size_t(r)];
    if (spec.calibration && tp > 1)
      s.calibration =
          std::make_shared<const Calibration>(slice_calibration(*spec.calibration, p.kv_heads.begin, p.kv_heads.count));
    return s;
  };
  if (device == KVDevice::cuda) {
    init_device(rank_spec, opt, dev_opt);
    parts_.resize(size_t(tp));
    return;
  }
  VQ_CHECK(dev_opt.devices.empty(), "tp: devices are named for ranks on the cpu");
  for (int r = 0; r < tp; ++r) {
    const TPRankPlan& p = plan_.ranks[size_t(r)];
    auto R = std::make_unique<Rank>();
    R->w = make_rank_weights(model, plan_, r);
    R->hq = p.q_heads.count;
    R->hkv = p.kv_heads.count;
    stores_.push_back(std::make_unique<KVStore>(KVGeometry{R->hq, R->hkv, cfg_.head_dim}, cfg_.n_layers, rank_spec(r), opt));
    ranks_.push_back(std::move(R));
  }
  parts_.resize(size_t(tp));
}

#ifdef VQ_HAVE_CUDA
template <class SpecOf>
void TPForward::init_device(SpecOf rank_spec, const KVStoreOptions& opt, const TPDeviceOptions& dev_opt) {
  const int tp = plan_.tp;
  VQ_CHECK(cuda::cuda_device_available(), "--tp {} --device cuda: {}", tp, cuda::cuda_unavailable_reason());
  std::vector<int> devs = dev_opt.devices;
  VQ_CHECK(devs.empty() || int(devs.size()) == tp, "tp: {} devices named for {} ranks", devs.size(), tp);
  if (devs.empty() && tp > 1 && cuda::device_count() >= tp)
    for (int r = 0; r < tp; ++r) devs.push_back(r);
  std::unique_ptr<cuda::DeviceCommunicator> dc;
  const bool one_device = devs.empty() || std::all_of(devs.begin(), devs.end(), [&](int d) { return d == devs[0]; });
  if (one_device) dc = cuda::make_local_communicator(tp, devs.empty() ? 0 : devs[0]);
  else dc = cuda::make_nccl_communicator(devs);
  std::vector<std::shared_ptr<const DeviceModel>> models;
  std::vector<KVStore*> stores;
  for (int r = 0; r < tp; ++r) {
    cuda::DeviceScope on(dc->device(r));
    const TPRankPlan& p = plan_.ranks[size_t(r)];
    models.push_back(DeviceModel::upload_shard(model_, plan_, r, r == 0));
    stores_.push_back(std::make_unique<KVStore>(KVGeometry{p.q_heads.count, p.kv_heads.count, cfg_.head_dim},
                                                cfg_.n_layers, rank_spec(r), opt));
    stores.push_back(stores_.back().get());
  }
  dev_ = std::make_unique<TPForwardDevice>(std::move(models), std::move(stores), std::move(dc));
}
#else
template <class SpecOf>
void TPForward::init_device(SpecOf, const KVStoreOptions&, const TPDeviceOptions&) {
  VQ_FAIL("--tp {} --device cuda: this build has no CUDA backend", plan_.tp);
}
#endif

std::string tp_placement(int tp, KVDevice device) {
  if (device == KVDevice::cpu) return "simulated in turn on the cpu";
#ifdef VQ_HAVE_CUDA
  const int n = cuda::device_count();
  VQ_CHECK(n > 0, "--tp {} --device cuda: {}", tp, cuda::cuda_unavailable_reason());
  if (tp == 1 || n < tp)
    return fmt::format("every rank on GPU 0 (this host has {} GPU{}: the split path, no speed-up)", n, n == 1 ? "" : "s");
  const std::string why = cuda::nccl_unavailable_reason();
  VQ_CHECK(why.empty(), "--tp {}: ranks on {} GPUs need NCCL: {}", tp, tp, why);
  return fmt::format("one rank per GPU (NCCL {}, GPUs 0..{})", cuda::nccl_version(), tp - 1);
#else
  VQ_FAIL("--tp {} --device cuda: this build has no CUDA backend", tp);
#endif
}

void TPForward::on_rank(int r, const std::function<void()>& f) const {
  VQ_CHECK(r >= 0 && r < plan_.tp, "tp: rank {} of {}", r, plan_.tp);
#ifdef VQ_HAVE_CUDA
  if (dev_) {
    cuda::DeviceScope on(dev_->communicator().device(r));
    f();
    return;
  }
#endif
  f();
}

std::string TPForward::describe_ranks() const {
  if (!dev_) return "simulated in turn on the cpu";
#ifdef VQ_HAVE_CUDA
  const cuda::DeviceCommunicator& c = dev_->communicator();
  if (c.name() == "local") return fmt::format("every rank on GPU {} (one-device communicator)", c.device(0));
  std::string d;
  for (int r = 0; r < c.size(); ++r) d += (r ? ", " : "") + std::to_string(c.device(r));
  return fmt::format("NCCL {} over GPUs {}", cuda::nccl_version(), d);
#else
  return "";  // no device split without CUDA (TPForward refuses it)
#endif
}

TPForward::~TPForward() {
  if (!dev_) return;
#ifdef VQ_HAVE_CUDA
  std::vector<int> devs;
  for (int r = 0; r < dev_->tp(); ++r) devs.push_back(dev_->communicator().device(r));
  dev_.reset();
  for (size_t r = 0; r < stores_.size(); ++r) {  // each rank's device memory freed on its device
    cuda::DeviceScope on(devs[r]);
    stores_[r].reset();
  }
#endif
}

TPSequence TPForward::new_sequence() {
  TPSequence s;
  for (auto& st : stores_) s.ranks.push_back(st->new_sequence());
  return s;
}

void TPForward::release(TPSequence& s) {
  for (size_t r = 0; r < s.ranks.size() && r < stores_.size(); ++r)
    if (s.ranks[r].valid()) stores_[r]->release(s.ranks[r]);
  s.ranks.clear();
}

void TPForward::step(const TPBatchEntry* entries, int n_entries) {
  VQ_CHECK(n_entries >= 0, "tp forward: {} batch entries", n_entries);
  const int tp = plan_.tp;
  int rows = 0;
  std::unordered_set<const TPSequence*> seen;
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(tp));
  for (int e = 0; e < n_entries; ++e) {
    const TPBatchEntry& E = entries[e];
    VQ_CHECK(E.seq && E.seq->valid() && int(E.seq->ranks.size()) == tp, "tp forward: batch entry {} has no sequence", e);
    VQ_CHECK(seen.insert(E.seq).second, "tp forward: batch entry {} repeats a sequence", e);
    VQ_CHECK(E.n >= 1, "tp forward: batch entry {} has {} tokens", e, E.n);
    for (int i = 0; i < E.n; ++i)
      VQ_CHECK(E.tokens[i] >= 0 && E.tokens[i] < cfg_.n_vocab,
               "tp forward: token id {} at index {} out of range [0, {})", E.tokens[i], i, cfg_.n_vocab);
    rows += E.n;
  }
  if (rows == 0) return;
  if (dev_) {
    dev_->step(entries, n_entries);  // measures and checks every rank's pool before changing anything
    return;
  }
  for (int e = 0; e < n_entries; ++e)
    for (int r = 0; r < tp; ++r)
      stores_[size_t(r)]->blocks_for_append(entries[e].seq->ranks[size_t(r)], entries[e].n, counts[size_t(r)]);
  for (int r = 0; r < tp; ++r) {
    const KVPool& pool = stores_[size_t(r)]->pool();
    if (!pool.can_allocate(counts[size_t(r)]))
      throw KVPoolExhausted(fmt::format(
          "kv pool of tp rank {}: a step of {} tokens needs up to {:.1f} MiB more, {:.1f} MiB of the rank's {:.1f} MiB "
          "budget are free",
          r, rows, double(pool.bytes_of(counts[size_t(r)])) / 1048576.0, double(pool.free_bytes()) / 1048576.0,
          double(pool.budget_bytes()) / 1048576.0));
  }
  const int E = cfg_.n_embd, half = cfg_.n_rot / 2;
  if (rows > cap_) {
    const size_t c = size_t(rows);
    x_.resize(c * E);
    xn_.resize(c * E);
    cos_.resize(c * half);
    sin_.resize(c * half);
    if (cfg_.n_sliding_layers() > 0) cos_swa_.resize(c * half), sin_swa_.resize(c * half);
    for (auto& R : ranks_) {
      const size_t qd = size_t(R->hq) * cfg_.head_dim, kvd = size_t(R->hkv) * cfg_.head_dim;
      const size_t ff = size_t(plan_.ranks[0].ff.count);
      R->q.resize(c * qd);
      R->k.resize(c * kvd);
      R->v.resize(c * kvd);
      R->attn.resize(c * qd);
      R->proj.resize(c * E);
      R->gate.resize(c * ff);
      R->up.resize(c * ff);
    }
    cap_ = rows;
  }
  pos_.resize(size_t(rows));
  // Embeddings and positions (replicated: computed once, read by every rank).
  for (int e = 0, r = 0; e < n_entries; ++e)
    for (int i = 0; i < entries[e].n; ++i, ++r) {
      embed_token(model_, entries[e].tokens[i], x_.data() + int64_t(r) * E);
      pos_[size_t(r)] = entries[e].seq->size() + i;
    }
  if (cfg_.embd_scale != 1.0f) scale_inplace(x_.data(), cfg_.embd_scale, int64_t(rows) * E);
  rotary_tables(model_, pos_.data(), rows, cos_.data(), sin_.data(), cos_swa_.data(), sin_swa_.data());
  for (int l = 0; l < cfg_.n_layers; ++l) {
    attention_block(l, entries, n_entries, rows);
    mlp_block(l, rows);
  }
  for (int e = 0; e < n_entries; ++e)
    for (int r = 0; r < tp; ++r) stores_[size_t(r)]->trim(entries[e].seq->ranks[size_t(r)]);
  // Output head (replicated; rank 0's copy of the residual stream).
  for (int e = 0, r = 0; e < n_entries; r += entries[e].n, ++e) {
    const TPBatchEntry& B = entries[e];
    if (!B.out) continue;
    const int first = B.all_logits ? 0 : B.n - 1;
    const int m = B.n - first;
    for (int t = 0; t < m; ++t)
      rms_norm(x_.data() + int64_t(r + first + t) * E, model_.output_norm().data(), xn_.data() + int64_t(t) * E, E,
               cfg_.norm_eps);
    const WeightMatrix& o = model_.output();
    matmul_maybe_packed(o.packed.get(), o.type, o.data, o.rows, o.cols, xn_.data(), m, B.out);
  }
}

void TPForward::reduce_into_residual(const std::vector<float>& post_norm, int rows) {
  const int E = cfg_.n_embd;
  for (size_t r = 0; r < ranks_.size(); ++r) parts_[r] = ranks_[r]->proj.data();
  comm_->all_reduce_sum(parts_.data(), int64_t(rows) * E);
  float* proj = ranks_[0]->proj.data();  // every rank holds the sum; the residual stream is replicated
  vq::post_norm(proj, post_norm, rows, cfg_.norm_eps);
  add_inplace(x_.data(), proj, int64_t(rows) * E);
}

void TPForward::attention_block(int layer, const TPBatchEntry* entries, int n_entries, int rows) {
  const LayerWeights& L = model_.layers()[size_t(layer)];
  const int E = cfg_.n_embd, D = cfg_.head_dim;
  for (int t = 0; t < rows; ++t)
    rms_norm(x_.data() + int64_t(t) * E, L.attn_norm.data(), xn_.data() + int64_t(t) * E, E, cfg_.norm_eps);
  for (size_t ri = 0; ri < ranks_.size(); ++ri) {
    Rank& R = *ranks_[ri];
    const TPLayerShard& S = R.w.layers[size_t(layer)];
    const int qd = R.hq * D, kvd = R.hkv * D;
    project_shared(R.act, xn_.data(), rows, {{&S.wq, R.q.data()}, {&S.wk, R.k.data()}, {&S.wv, R.v.data()}});
    add_bias(R.q.data(), S.q_bias, rows);
    add_bias(R.k.data(), S.k_bias, rows);
    add_bias(R.v.data(), S.v_bias, rows);
    norm_rope_qk(cfg_, L, layer, cos_.data(), sin_.data(), cos_swa_.data(), sin_swa_.data(), R.q.data(), R.hq,
                 R.k.data(), R.hkv, rows);
    KVStore& kv = *stores_[ri];
    R.attn_entries.clear();
    for (int e = 0, r = 0; e < n_entries; r += entries[e].n, ++e) {
      const TPBatchEntry& B = entries[e];
      SeqKV& seq = B.seq->ranks[ri];
      const int64_t pos0 = seq.layer_size(layer);
      kv.append(seq, layer, R.k.data() + int64_t(r) * kvd, R.v.data() + int64_t(r) * kvd, B.n);
      R.attn_entries.push_back(
          AttnEntry{&seq, pos0, B.n, R.q.data() + int64_t(r) * qd, R.attn.data() + int64_t(r) * qd});
    }
    kv.attend(layer, R.attn_entries.data(), int(R.attn_entries.size()), cfg_.attn_scale);
    matmul_w(S.wo, R.attn.data(), rows, R.proj.data());
  }
  reduce_into_residual(L.post_attn_norm, rows);
}

void TPForward::mlp_block(int layer, int rows) {
  const LayerWeights& L = model_.layers()[size_t(layer)];
  const int E = cfg_.n_embd;
  for (int t = 0; t < rows; ++t)
    rms_norm(x_.data() + int64_t(t) * E, L.ffn_norm.data(), xn_.data() + int64_t(t) * E, E, cfg_.norm_eps);
  for (size_t ri = 0; ri < ranks_.size(); ++ri) {
    Rank& R = *ranks_[ri];
    const TPLayerShard& S = R.w.layers[size_t(layer)];
    const int64_t F = S.w_gate.rows;
    project_shared(R.act, xn_.data(), rows, {{&S.w_gate, R.gate.data()}, {&S.w_up, R.up.data()}});
    if (cfg_.ffn_act == FfnActivation::GeluTanh) gelu_tanh_mul(R.gate.data(), R.up.data(), R.gate.data(), rows * F);
    else silu_mul(R.gate.data(), R.up.data(), R.gate.data(), rows * F);
    matmul_w(S.w_down, R.gate.data(), rows, R.proj.data());
  }
  reduce_into_residual(L.post_ffn_norm, rows);
}

}  // namespace vq
