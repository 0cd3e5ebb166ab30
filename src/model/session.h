#pragma once
// The forward pass of llama-family models over a KVStore, batched: one step runs any number of
// sequences' new tokens (prefill chunks and single decode tokens alike) through all layers as
// one stack of rows, so every weight is read once per step; attention runs per sequence over its
// block tables (kvcache/kv_store.h). Session is one sequence on that same path.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "core/buffer.h"
#include "kvcache/kv_store.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace vq {

enum class LogitsWanted { none, last, all };

// One sequence's part of a step: n new tokens at positions seq->size() .. + n - 1.
struct BatchEntry {
  SeqKV* seq = nullptr;
  const int32_t* tokens = nullptr;
  int n = 0;
  LogitsWanted logits = LogitsWanted::last;
  float* out = nullptr;  // [1 (last) or n (all), n_vocab] f32
};

// The KV geometry, layer count and per-layer sliding windows of a model, for its KVStore.
// device: where the pool's blocks live (cuda: the forward runs on the GPU, model/forward_device.h).
KVStoreOptions kv_store_options(const Model& model, size_t budget_bytes, KVDevice device = KVDevice::cpu);
std::unique_ptr<KVStore> make_kv_store(const Model& model, const KVSpec& spec, size_t budget_bytes = size_t(-1),
                                       KVDevice device = KVDevice::cpu);

class ForwardDevice;

// y_i = x @ W_i^T for weights sharing the input x [n, cols]: x is quantized once (into act).
void project_shared(ActivationBuffer& act, const float* x, int n,
                    std::initializer_list<std::pair<const WeightMatrix*, float*>> outs);
// The forward's row operations, shared by Forward and TPForward (tensor_parallel.h):
// y [m, rows of w] = x [m, cols] @ w^T (packed layout where the weight has one);
void matmul_w(const WeightMatrix& w, const float* x, int64_t m, float* y);
// y [n, b.size()] += b per row (nothing when b is empty);
void add_bias(float* y, const std::vector<float>& b, int n);
// RMSNorm in place of each of the n rows of y [n, w.size()] (gemma3's post-attention / post-MLP
// norms); nothing when the architecture has no such weights;
void post_norm(float* y, const std::vector<float>& w, int n, float eps);
// the per-head q/k RMS norms where the layer has them (qwen3, gemma3) and the rotary embedding of
// `rows` rows of hq query and hkv key heads ([rows][h][head_dim]), with the layer's tables (the
// sliding-window ones on sliding layers; rotary_tables).
void norm_rope_qk(const ModelConfig& cfg, const LayerWeights& L, int layer, const float* cos, const float* sin,
                  const float* cos_swa, const float* sin_swa, float* q, int hq, float* k, int hkv, int rows);
// Token `token`'s embedding row into dst [n_embd] (dequantized; not yet scaled).
void embed_token(const Model& model, int32_t token, float* dst);
// The rotary tables of `rows` positions: cos/sin [rows][n_rot/2] in double-precision angles (pos *
// freq reaches 1e5 radians); where the model has sliding-window layers (gemma3) also their tables
// with their own base (cos_swa/sin_swa, else unused).
void rotary_tables(const Model& model, const int64_t* pos, int rows, float* cos, float* sin, float* cos_swa,
                   float* sin_swa);

// Runs steps over one KVStore. Scratch grows to the largest step seen, then nothing is allocated
// per step. Not thread-safe. A store whose blocks live on the GPU runs every step there
// (ForwardDevice: the model's weights are uploaded once, at construction).
class Forward {
 public:
  Forward(const Model& model, KVStore& kv);
  ~Forward();

  // Checks every entry (token ids in range, distinct sequences of this store) and that the pool
  // can hold the step, then runs it; each entry's sequence grows by its n tokens and its logits
  // are written. Throws vq::Error (KVPoolExhausted when the pool cannot hold the step) before
  // changing anything.
  void step(const BatchEntry* entries, int n_entries);

  // Sees every layer's new queries and keys (after RoPE) and values of every entry, before they
  // are stored: q: [n, n_heads, head_dim], k, v: [n, n_kv_heads, head_dim] f32 (calibration
  // records real activations this way).
  using KVObserver =
      std::function<void(int layer, int entry, const float* q, const float* k, const float* v, int n)>;
  void set_kv_observer(KVObserver f);

  // Batch-invariant mode: an entry's logits are bit-identical whatever else the step holds, given
  // the same chunks of its own sequence. The CPU forward is so by construction (every row's
  // products and attention are computed alone, the same way for any batch: tests/engine); on the
  // GPU this switches ForwardDevice::set_deterministic.
  void set_deterministic(bool on);

  const Model& model() const { return model_; }
  KVStore& kv() { return kv_; }
  // The device forward when the store lives on the GPU (null otherwise).
  ForwardDevice* device() { return dev_.get(); }

 private:
  void reserve(int rows);
  void attention_block(int layer, const BatchEntry* entries, int n_entries, int rows);
  void mlp_block(int layer, int rows);
  // y_i = x @ W_i^T for weights sharing the input x [n, cols]: x is quantized once.
  void project_shared(const float* x, int n, std::initializer_list<std::pair<const WeightMatrix*, float*>> outs);

  const Model& model_;
  const ModelConfig& cfg_;
  KVStore& kv_;
  KVObserver observer_;
  std::unique_ptr<ForwardDevice> dev_;
  int cap_ = 0;  // rows the scratch holds
  // Scratch for `cap_` stacked rows (all entries' tokens in entry order), all row-major:
  AlignedBuffer<float> x_;      // [rows, n_embd] residual stream
  AlignedBuffer<float> xn_;     // [rows, n_embd] normalised input of a block
  AlignedBuffer<float> q_;      // [rows, q_dim] queries
  AlignedBuffer<float> k_;      // [rows, kv_dim] keys
  AlignedBuffer<float> v_;      // [rows, kv_dim] values
  AlignedBuffer<float> attn_;   // [rows, q_dim] attention output
  AlignedBuffer<float> proj_;   // [rows, n_embd] output of wo / w_down before the residual add
  AlignedBuffer<float> gate_;   // [rows, n_ff]
  AlignedBuffer<float> up_;     // [rows, n_ff]
  AlignedBuffer<float> cos_;    // [rows, n_rot/2] rotary cos per row
  AlignedBuffer<float> sin_;    // [rows, n_rot/2] rotary sin per row
  AlignedBuffer<float> cos_swa_, sin_swa_;  // [rows, n_rot/2] of the sliding-window layers (else empty)
  AlignedBuffer<float> logits_; // [logit rows, n_vocab] when several entries want logits
  ActivationBuffer act_;        // xn_ quantized once for q/k/v and once for gate/up
  std::vector<int64_t> pos_;    // [rows] position of each row
  std::vector<AttnEntry> attn_entries_;
};

// One sequence through its own KVStore: the single-sequence API over the batched path.
// tp > 1: the forward split over tp ranks (TPForward, tensor_parallel.h: simulated on the CPU, or
// on the GPU), each rank's KV in its own store of budget_bytes / tp; store(), sequence() and
// forward_pass() are then refused (tensor_parallel() and tp_sequence() reach the ranks).
class Session {
 public:
  static constexpr int kDefaultChunk = 512;
  // n_ctx: the most positions this session holds. max_chunk: tokens per step of a prefill.
  // budget_bytes: the KV pool's budget. device: where the pool lives and the forward runs.
  Session(const Model& model, const KVSpec& spec, int n_ctx, int max_chunk = kDefaultChunk,
          size_t budget_bytes = size_t(-1), KVDevice device = KVDevice::cpu, int tp = 1);

  // Runs tokens at positions pos()..pos()+n-1 (in steps of max_chunk). logits: [n, n_vocab] when
  // all_logits, else [1, n_vocab] for the last token; nullptr skips the output head. Throws when
  // a token id is out of range or the context would exceed n_ctx.
  void forward(const int32_t* tokens, int n, float* logits, bool all_logits = false);

  int64_t pos() const { return tp_ ? tp_seq_.size() : seq_.size(); }
  int n_ctx() const { return n_ctx_; }
  int tp() const { return tp_ ? tp_->tp() : 1; }
  void reset();  // drops the sequence's KV, back to position 0
  const Model& model() const { return model_; }
  KVStore& store();
  const KVStore& store() const;
  SeqKV& sequence();
  const SeqKV& sequence() const;
  Forward& forward_pass();
  TPForward* tensor_parallel() { return tp_.get(); }  // null at tp = 1
  const TPForward* tensor_parallel() const { return tp_.get(); }
  TPSequence& tp_sequence();  // tp > 1: the sequence over the ranks (session files)
  const TPSequence& tp_sequence() const;
  // Memory (summed over the ranks at tp > 1):
  size_t kv_bytes() const;         // blocks allocated
  size_t kv_token_bytes() const;   // payload of the tokens held
  size_t kv_fp16_bytes() const;    // an fp16 cache for the same tokens
  size_t kv_codebook_bytes() const;

 private:
  // f(store, sequence) over the unsplit store or summed over the ranks' stores.
  template <class F>
  size_t sum_over_stores(F f) const;
  const Model& model_;
  int n_ctx_, max_chunk_;
  std::unique_ptr<KVStore> store_;  // null at tp > 1
  SeqKV seq_;
  std::unique_ptr<Forward> fwd_;    // null at tp > 1
  std::unique_ptr<TPForward> tp_;   // null at tp = 1
  TPSequence tp_seq_;
};

}  // namespace vq
