#pragma once
// The batched forward pass on the GPU over a device KV store (KVStoreOptions::device = cuda).
// Same contract as Forward::step (model/session.h), which routes here when its store lives on
// the device: one step runs every entry's new tokens as stacked rows through all layers, each
// weight read once per step (cuBLAS fp16 GEMM, or the native quantized GEMV where it wins for
// few rows: gemv_preferred), every row's K/V appended into its blocks, attention of every row
// through its sequence's block tables (codes + fp16 window and sinks), logits for the rows
// asked copied back. The host only does the pool's bookkeeping, uploads one descriptor block,
// launches, and copies logits back.
//
// Decode steps (every entry one token with LogitsWanted::last or none) are captured once per
// shape (rows, whether the step has table fix-ups / encodes) into a CUDA graph and replayed;
// the per-step data (tokens, positions, block tables, encode jobs) is read from fixed device
// buffers that are rewritten before each replay. Other steps (prefill) run eagerly.
// Out of device memory or pool budget throws before any sequence changes.
// No CUDA types here.
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "kvcache/kv_store.h"

namespace vq {
namespace cuda {
class DeviceCommunicator;
}

class DeviceModel;
struct BatchEntry;
struct TPBatchEntry;

struct ForwardDeviceStats {
  int64_t steps = 0, graph_replays = 0, graph_captures = 0, eager_steps = 0;
};

class ForwardDevice {
 public:
  ForwardDevice(std::shared_ptr<const DeviceModel> model, KVStore& kv);
  ~ForwardDevice();
  ForwardDevice(const ForwardDevice&) = delete;
  ForwardDevice& operator=(const ForwardDevice&) = delete;

  // Entries as Forward::step (checked there: distinct valid sequences, token ids in range, the
  // pool can hold the step). Throws KVPoolExhausted (budget or device memory) before changing
  // anything.
  void step(const BatchEntry* entries, int n_entries);

  // Sees every layer's q, k, v (after RoPE) of every entry, copied to the host (steps with an
  // observer run eagerly; calibration).
  using KVObserver = std::function<void(int layer, int entry, const float* q, const float* k, const float* v, int n)>;
  void set_kv_observer(KVObserver f) { observer_ = std::move(f); }
  // CUDA graphs for decode steps (default on; off: every step launches eagerly).
  void set_graphs(bool on) { graphs_ = on; }
  // Batch-invariant mode (default off): a row's logits are bit-identical whatever else the step
  // holds (other sequences' rows, how many), given the same chunks of its own sequence. Rows of
  // short entries take the GEMVs in row-invariant forms, rows of long chunks the batch-invariant
  // GEMM (cuda::gemm_invariant_device), and the attention's split counts stop depending on the
  // step's rows (KVStoreDevice::
  // set_deterministic). Costs: BENCHMARKS.md "Deterministic mode".
  void set_deterministic(bool on);
  bool deterministic() const;
  // Skips copying the logits back (benchmarks of the device step alone): entries' out untouched.
  void set_skip_logits_download(bool on) { skip_download_ = on; }
  const ForwardDeviceStats& stats() const { return stats_; }
  const DeviceModel& model() const { return *model_; }
  KVStore& kv() { return kv_; }

  struct Impl;

 private:
  std::shared_ptr<const DeviceModel> model_;
  KVStore& kv_;
  KVObserver observer_;
  bool graphs_ = true, skip_download_ = false;
  ForwardDeviceStats stats_;
  std::unique_ptr<Impl> impl_;
};

// The forward split over tensor-parallel ranks on the GPU (model/tensor_parallel.h has the split):
// rank r runs its model shard (DeviceModel::upload_shard: its query/KV heads, its MLP columns)
// over its own device KV store on comm->device(r), and the communicator sums the ranks' partial
// outputs of wo and w_down (cuda::DeviceCommunicator: NCCL across GPUs, or every rank on one GPU).
// One host thread drives every rank: each layer's launches go to each rank's stream in turn, the
// all-reduce joins them; rank 0 alone holds the output head. Steps run eagerly (no CUDA graphs).
// Entries as TPForward::step (checked there).
class TPForwardDevice {
 public:
  // models[r] / stores[r]: rank r's shard and store, built on comm->device(r).
  TPForwardDevice(std::vector<std::shared_ptr<const DeviceModel>> models, std::vector<KVStore*> stores,
                  std::unique_ptr<cuda::DeviceCommunicator> comm);
  ~TPForwardDevice();
  TPForwardDevice(const TPForwardDevice&) = delete;
  TPForwardDevice& operator=(const TPForwardDevice&) = delete;
  // Throws KVPoolExhausted (a rank's budget or device memory) before changing anything.
  void step(const TPBatchEntry* entries, int n_entries);
  int tp() const;
  const cuda::DeviceCommunicator& communicator() const { return *comm_; }
  int64_t steps() const { return steps_; }

 private:
  struct Rank;
  std::unique_ptr<cuda::DeviceCommunicator> comm_;
  std::vector<std::unique_ptr<Rank>> ranks_;
  int64_t steps_ = 0;
};

}  // namespace vq
