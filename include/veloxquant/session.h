#pragma once
// Session: one sequence through a model with a KV cache method, token by token or in chunks,
// returning logits. The single-sequence path of the batched engine (engine.h): the same pool of
// blocks, the same attention, the same results.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"

namespace veloxquant {

// KV memory of a sequence (or a sum over sequences).
struct KVMemory {
  size_t token_bytes = 0;      // what the tokens take: codes + the fp16 window and sinks
  size_t allocated_bytes = 0;  // whole blocks allocated for them (block size granularity)
  size_t fp16_bytes = 0;       // what an fp16 cache takes for the same tokens
  size_t codebook_bytes = 0;   // shared read-only codebooks (VecInfer), once per cache
  double bits_per_element() const { return fp16_bytes ? 16.0 * double(token_bytes) / double(fp16_bytes) : 0.0; }
  // Fraction of the fp16 bytes saved (0.875 for 2 bits/element); negative when larger than fp16.
  double saved_fraction() const { return fp16_bytes ? 1.0 - double(token_bytes) / double(fp16_bytes) : 0.0; }
};

struct SessionOptions {
  int n_ctx = 0;                            // positions the session holds (0: the model's training context)
  int max_chunk = 0;                        // tokens per step of a long forward(); 0: default_max_chunk(device)
  size_t kv_budget_bytes = size_t(-1);      // the KV pool's budget; exceeding it throws
  Device device = Device::cpu;              // where the forward runs and the pool lives (runtime.h)
  // Tensor-parallel ranks (docs/TENSOR_PARALLEL.md): > 1 splits the forward by heads and MLP
  // columns over that many ranks, simulated in this process on the CPU (Device::cpu only), each
  // rank's KV pool holding its heads with kv_budget_bytes / tp. Session files need tp = 1.
  int tp = 1;
};

// Tokens per prefill step when none is given: 512 on the CPU; 2048 on the device, whose matrix units
// and attention tiles want long steps (a 32K prompt on the Qwen2.5-1.5B shape: chunks of 2048 take
// 1.06 s, of 8192 0.90 s; docs/BENCHMARKS.md (p)) while the activations of 2048 rows stay small.
int default_max_chunk(Device device);

// The KV budget a caller who gives none gets (what `veloxquant generate/serve` use without
// --kv-budget): on the CPU half of the memory available now (MemAvailable; 1 GiB when unknown), on
// the device 85% of its free memory less what the model's weights will take there.
size_t default_kv_budget_bytes(const Model& model, Device device);
// One block of every form in every layer of the spec's cache on this model: the least
// kv_budget_bytes with which a Session, an Engine or a Server runs anything (also
// Session::min_budget_bytes, Engine::min_budget_bytes). Allocates nothing.
size_t min_kv_budget_bytes(const Model& model, const KVSpec& spec);

// A session file read back (Session::load): every token id of the saved sequence, the first n_kv
// of them already in the KV (the rest, e.g. the last sampled token, are still to be fed).
struct LoadedSession {
  std::vector<int32_t> tokens;
  int64_t n_kv = 0;
};

// Whether a Session of this model can run split over tp tensor-parallel ranks on this device
// (SessionOptions::tp): throws vq::Error naming what does not divide (heads, KV heads, MLP
// columns, a quantized weight's blocks) or what the device lacks (NCCL for ranks on several GPUs);
// copies nothing. Returns where the ranks will run, e.g. "one rank per GPU (NCCL 2.28.9, GPUs
// 0, 1)" or "every rank on GPU 0 (this host has 1 GPU: the split path, no speed-up)".
std::string check_tensor_parallel(const Model& model, int tp, Device device);

class Session {
 public:
  Session(const Model& model, const KVSpec& spec, const SessionOptions& opt = {});
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // Runs tokens at positions pos() .. pos() + n - 1. logits: [n, n_vocab] float32 row-major when
  // all_logits, else [1, n_vocab] for the last token; nullptr skips the output head. Throws
  // vq::Error (nothing changed) when a token id is out of range or the context would overflow.
  void forward(std::span<const int32_t> tokens, float* logits, bool all_logits = false);

  int64_t pos() const;   // tokens held
  int n_ctx() const;
  int n_vocab() const;
  void reset();          // back to position 0, blocks freed
  KVMemory memory() const;
  const Model& model() const;
  const KVSpec& spec() const;
  // One block of every form in every layer: the least kv_budget_bytes with which anything runs.
  size_t min_budget_bytes() const;

  // Session files: the sequence's KV in the cache's native form plus its token ids, sealed with
  // SHA-256 and tied to the model file, the spec and its calibration (a file of another model or
  // spec is refused naming what differs). Written atomically. On the CPU's pool only: with
  // Device::cuda both throw vq::Error.
  // save: tokens are all the sequence's ids, the first pos() of them in the KV.
  void save(const std::string& path, const std::vector<int32_t>& tokens) const;
  // load: the sequence held so far is dropped and replaced by the file's; pos() becomes n_kv.
  LoadedSession load(const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace veloxquant
