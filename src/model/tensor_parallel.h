#pragma once
// Tensor parallelism of the llama-family forward (issue 25), as vLLM and SGLang split these
// models over `tp` ranks:
//   - attention by heads: rank r holds query heads [r H/tp, (r+1) H/tp) and the KV heads they
//     read; when tp > n_kv_heads every KV head is replicated on tp / n_kv_heads ranks. wq, wk,
//     wv (and the q/k/v biases) are split by output rows, wo by input columns;
//   - the MLP by the intermediate size: w_gate and w_up by output rows, w_down by input columns;
//   - after wo and after w_down each rank holds a partial [rows, n_embd]: an all-reduce (sum)
//     gives every rank the full output (then gemma3's post-norm and the residual add).
// Everything else (embeddings, norms, residual stream, output head) is replicated.
//
// Here the ranks are simulated in one process, on the CPU: TPForward runs each rank's share in
// turn with its own weight shards and its own KVStore (holding only that rank's KV heads), and
// a Communicator sums the partials. See docs/TENSOR_PARALLEL.md for the GPU / NCCL side.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "kvcache/kv_store.h"
#include "model/model.h"

namespace vq {

struct Calibration;
class TPForwardDevice;

// ---- The split plan: a pure function of the geometry.
struct TPRange {
  int begin = 0, count = 0;
  int end() const { return begin + count; }
};
struct TPRankPlan {
  TPRange q_heads;   // query heads of this rank
  TPRange kv_heads;  // KV heads it holds (a replica when kv_replicas > 1)
  TPRange ff;        // intermediate (MLP) columns
};
struct TPPlan {
  int tp = 1;
  int kv_replicas = 1;  // ranks holding each KV head: tp / n_kv_heads when tp > n_kv_heads, else 1
  std::vector<TPRankPlan> ranks;  // [tp]
};
// Throws vq::Error naming what does not divide: tp < 1, n_heads % tp, n_ff % tp, n_kv_heads % tp
// (tp <= n_kv_heads) or tp % n_kv_heads (tp > n_kv_heads), or inconsistent head counts.
TPPlan make_tp_plan(int n_heads, int n_kv_heads, int n_ff, int tp);
TPPlan make_tp_plan(const ModelConfig& cfg, int tp);
// The geometry rank `rank` computes: its query heads, KV heads and MLP columns; the rest as cfg.
ModelConfig tp_rank_config(const ModelConfig& cfg, const TPPlan& plan, int rank);

// ---- The communicator: an all-reduce over the ranks.
// One controller drives every rank (one process, one thread), so a call sees all ranks' buffers:
// bufs[r] is rank r's buffer of n floats (host memory here; device memory of rank r's GPU for an
// NCCL implementation, which would issue ncclAllReduce per rank inside ncclGroupStart/End on the
// ranks' streams). After the call every bufs[r] holds the elementwise sum over the ranks.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual std::string name() const = 0;
  virtual void all_reduce_sum(float* const* bufs, int64_t n) = 0;
};
// The CPU's: sums in rank order ((b0 + b1) + b2) + ..., so results are deterministic and do not
// depend on the thread count; then copies the sum to every rank.
class LocalCommunicator final : public Communicator {
 public:
  explicit LocalCommunicator(int size);
  int size() const override { return size_; }
  std::string name() const override { return "local"; }
  void all_reduce_sum(float* const* bufs, int64_t n) override;

 private:
  int size_;
};

// ---- Weight shards.
// One layer's weights as rank r sees them. Row splits (wq, wk, wv, w_gate, w_up) are views into
// the model's mapping (their own packed copy when not the whole matrix); column splits (wo,
// w_down) are copies of each row's byte range, which needs the split to fall on the type's block
// boundaries (32 elements for q4_0..q8_0, 256 for the K-quants, any for f32/f16/bf16): other
// splits are refused naming the tensor, the type and the offset.
struct TPLayerShard {
  WeightMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  std::vector<float> q_bias, k_bias, v_bias;  // this rank's slices; empty without biases
};
struct TPRankWeights {
  std::vector<TPLayerShard> layers;
  std::vector<std::unique_ptr<AlignedBuffer<uint8_t>>> owned;  // the column-split copies
};
TPRankWeights make_rank_weights(const Model& model, const TPPlan& plan, int rank);
// The plan for this model and tp, with every column split checked against the weights' blocks
// (what make_rank_weights would refuse), copying nothing. Throws vq::Error.
TPPlan check_tp(const Model& model, int tp);

// The calibration of KV heads [kv0, kv0 + n) (VecInfer codebooks and smoothing are per KV head).
Calibration slice_calibration(const Calibration& c, int kv0, int n);

// One sequence over the ranks: one SeqKV per rank's store.
struct TPSequence {
  std::vector<SeqKV> ranks;
  bool valid() const { return !ranks.empty() && ranks[0].valid(); }
  int64_t size() const { return ranks.empty() ? 0 : ranks[0].size(); }
};

struct TPBatchEntry {
  TPSequence* seq = nullptr;
  const int32_t* tokens = nullptr;
  int n = 0;
  bool all_logits = false;  // else the last token's only; out == nullptr: none
  float* out = nullptr;     // [1 or n, n_vocab]
};

// Where the ranks of a device split run (TPForward with KVDevice::cuda).
struct TPDeviceOptions {
  // Rank r runs on devices[r] (distinct devices: NCCL). Empty: devices 0..tp-1 when the host has
  // that many GPUs (NCCL), else every rank on device 0 (the one-device communicator: the split
  // path on a single GPU, for tests and for what one GPU allows).
  std::vector<int> devices;
};

// Where TPForward(device, {}) puts tp ranks, checked: "simulated in turn on the cpu", "every rank
// on GPU 0 (...)", "one rank per GPU (NCCL <version>, GPUs 0, 1)". Throws vq::Error when ranks on
// several GPUs need NCCL and it cannot be loaded, or device cuda has no GPU.
std::string tp_placement(int tp, KVDevice device);

// The split forward over tp ranks. Each rank owns a KVStore of its heads (geometry {H/tp, its KV
// heads, head_dim}, the budget budget_bytes / tp, VecInfer calibration sliced to its KV heads).
// device cpu: the ranks are simulated in turn on the CPU (comm sums host buffers). device cuda:
// each rank's shard and store live on its GPU and TPForwardDevice (model/forward_device.h) runs
// the step. Not thread-safe.
class TPForward {
 public:
  TPForward(const Model& model, const KVSpec& spec, int tp, size_t budget_bytes = size_t(-1),
            std::unique_ptr<Communicator> comm = nullptr, KVDevice device = KVDevice::cpu,
            const TPDeviceOptions& dev_opt = {});
  ~TPForward();
  KVDevice device() const { return device_; }
  // Runs f with rank r's GPU current (device cuda: its allocations, copies and launches go there);
  // on the CPU just f.
  void on_rank(int r, const std::function<void()>& f) const;
  // device cuda: "nccl over devices 0, 1" / "local (every rank on device 0)"; cpu: "local (cpu)".
  std::string describe_ranks() const;

  int tp() const { return plan_.tp; }
  const TPPlan& plan() const { return plan_; }
  KVStore& store(int rank) { return *stores_[size_t(rank)]; }
  const KVStore& store(int rank) const { return *stores_[size_t(rank)]; }
  const Model& model() const { return model_; }

  TPSequence new_sequence();
  void release(TPSequence& s);
  // Checks the entries (token ids in range, distinct valid sequences, every rank's pool able to
  // hold the step) before changing anything, then runs the step.
  void step(const TPBatchEntry* entries, int n_entries);

 private:
  struct Rank;
  template <class SpecOf>
  void init_device(SpecOf rank_spec, const KVStoreOptions& opt, const TPDeviceOptions& dev_opt);
  void attention_block(int layer, const TPBatchEntry* entries, int n_entries, int rows);
  void mlp_block(int layer, int rows);
  void reduce_into_residual(const std::vector<float>& post_norm, int rows);

  const Model& model_;
  const ModelConfig& cfg_;
  TPPlan plan_;
  KVDevice device_ = KVDevice::cpu;
  std::unique_ptr<Communicator> comm_;
  std::vector<std::unique_ptr<KVStore>> stores_;
  std::unique_ptr<TPForwardDevice> dev_;  // device cuda (holds the stores: released first)
  std::vector<std::unique_ptr<Rank>> ranks_;
  AlignedBuffer<float> x_, xn_, cos_, sin_, cos_swa_, sin_swa_;
  std::vector<int64_t> pos_;
  std::vector<float*> parts_;
  int cap_ = 0;
};

}  // namespace vq
