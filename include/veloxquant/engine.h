#pragma once
// Engine: continuous batching of many sequences over one model and one KV pool. Requests wait in
// a queue; each step() runs one decode token of every running sequence plus prefill chunks
// (every weight read once for the whole batch), samples each sequence's next token and reports
// it through the request's callbacks. A finished sequence gives its blocks back at once.
// Memory: kv_budget_bytes bounds the pool; a step that would not fit drops prefill chunks, then
// preempts the newest sequence (recomputed later, same output), and a sequence that cannot fit
// alone ends with FinishReason::error. Prefix sharing: Request::fork_of.
// Threading: submit() and cancel() from any thread; step() and run() from one.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/sampling.h"
#include "veloxquant/session.h"

namespace veloxquant {

enum class FinishReason { length, eos, stop, cancelled, context, error };
const char* finish_reason_name(FinishReason r);  // "length", "eos", ...

struct EngineOptions {
  size_t kv_budget_bytes = size_t(-1);  // the KV pool's budget (all sequences, all layers)
  int max_sequences = 16;               // running at once
  int max_step_tokens = 512;            // rows per step: decode tokens + prefill chunk tokens
  int n_ctx = 0;                        // positions per sequence (0: the model's training context)
  Device device = Device::cpu;          // where the steps run and the pool lives (runtime.h)
  // Batch-invariant mode: a sequence's tokens do not depend on the other sequences running beside
  // it (prefill cut at fixed positions; on the GPU, batch-invariant kernels). docs/DETERMINISM.md.
  bool deterministic = false;
  // A prefix cache on the compressed blocks: a request whose prompt starts with tokens an earlier
  // request computed takes their KV instead of recomputing it (either device).
  bool prefix_cache = false;
  // Tensor-parallel ranks (SessionOptions::tp): every sequence's KV split by heads over tp pools of
  // kv_budget_bytes / tp each, on the device's GPUs (docs/TENSOR_PARALLEL.md). Not with
  // deterministic.
  int tp = 1;
};

struct SequenceResult {
  int64_t id = 0;
  FinishReason finish = FinishReason::length;
  std::string error;  // for FinishReason::error
  int64_t n_prompt = 0, n_generated = 0;
  KVMemory memory;    // at the end (codebook_bytes: the cache's, once)
};

struct Request {
  std::vector<int32_t> prompt;  // at least one token id
  SamplingParams sampling;
  int max_new_tokens = 128;
  bool ignore_eos = false;
  // An earlier request whose prompt starts with this one's tokens: this one shares its blocks
  // (N samples of one prompt prefill it once). -1: none.
  int64_t fork_of = -1;
  // Each new token, from the thread running step(); return false to stop the sequence (an
  // end-of-generation token is reported too, then the sequence ends).
  std::function<bool(int64_t id, int32_t token)> on_token;
  std::function<void(const SequenceResult&)> on_finish;  // once, at the end
};

struct EngineStats {
  int64_t steps = 0, prefill_tokens = 0, decode_tokens = 0, preemptions = 0;
  double step_seconds = 0;  // total time in the batched forward steps
  int running = 0, waiting = 0;
  int64_t prefix_hits = 0, prefix_hit_tokens = 0;  // requests that started from a cached prefix, tokens taken
};

struct PoolMemory {
  size_t used_bytes = 0, peak_bytes = 0, budget_bytes = 0, codebook_bytes = 0;
};

class Engine {
 public:
  Engine(const Model& model, const KVSpec& spec, const EngineOptions& opt = {});
  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  // Returns the request id (>= 0). Throws vq::Error for an empty prompt, a token id out of range
  // or a prompt longer than the context.
  int64_t submit(Request r);
  void cancel(int64_t id);  // ends it at the next step
  bool step();              // one step; false when there was nothing to do
  void run();               // steps until every request has finished
  bool idle() const;
  EngineStats stats() const;
  PoolMemory memory() const;
  // One block of every form in every layer: the least kv_budget_bytes with which anything runs.
  size_t min_budget_bytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace veloxquant
