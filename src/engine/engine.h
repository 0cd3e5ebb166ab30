#pragma once
// Engine: continuous batching over one model and one KV pool. Requests wait in a queue; every
// step runs all active sequences together (one decode token each, then prefill chunks in
// arrival order up to a token budget) through Forward::step, samples each sequence's next token
// and reports it. A finished or cancelled sequence gives its blocks back at once and the next
// waiting request starts.
//
// Memory: the pool's budget bounds everything. A step that would not fit drops prefill chunks
// first, then preempts the most recently started sequence (its blocks are freed and it waits at
// the head of the queue to be recomputed: prompt + the tokens generated so far); a sequence that
// cannot fit even alone finishes with an error. Nothing running is ever corrupted.
//
// Prefix sharing: a request may name an earlier request (`fork_of`) with the same first prompt
// tokens; it starts by sharing that sequence's blocks once its prompt is processed (N samples of
// one prompt prefill it once).
//
// Prefix cache (EngineOptions::prefix_cache, kvcache/prefix_cache.h): a starting sequence forks
// from the longest cached point its tokens extend and feeds only the rest. Points are cached at
// block-aligned ends of prefill chunks (a prefill chunk also ends where the cached chain it
// extends ends, and at the last full block before the prompt's end, so that the next request
// sharing that prefix finds a point there), at block boundaries of decoding (only the latest per
// sequence) and where a sequence ends. Cached points are evicted (least recently used) before any
// prefill is delayed or any sequence preempted.
//
// Threading: submit() and cancel() may be called from any thread; step() and run() from one.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kvcache/kv_store.h"
#include "kvcache/prefix_cache.h"
#include "kvcache/seq_file.h"
#include "model/sampler.h"
#include "model/session.h"
#include "model/tensor_parallel.h"

namespace vq {

enum class FinishReason { length, eos, stop, cancelled, context, error };
const char* finish_reason_name(FinishReason r);

struct EngineOptions {
  size_t kv_budget_bytes = size_t(-1);
  int max_sequences = 16;     // running at once
  int max_step_tokens = 512;  // rows per step (decode tokens + prefill chunk tokens)
  int n_ctx = 0;              // positions per sequence (0: the model's context length)
  bool prefix_cache = false;  // cache prefixes' KV for later requests (see above)
  uint64_t kv_identity = 0;   // root of the prefix cache's hash chains (kv_identity.h)
  KVDevice device = KVDevice::cpu;  // where the pool lives and the steps run
  // Tensor-parallel ranks (model/tensor_parallel.h): every sequence's KV split by heads over tp
  // stores (each kv_budget_bytes / tp), the steps run by TPForward; scheduling, forks and the
  // prefix cache act on every rank alike. Not with `deterministic` or a shared prefix store.
  int tp = 1;
  // Batch-invariant mode: a sequence's tokens do not depend on what else runs beside it. Prefill
  // chunks are cut at fixed positions (multiples of max_step_tokens, and the prefix cache's cuts),
  // never by what budget the other sequences leave: the first prefill chunk of a step is taken
  // whole even when the decode rows leave less than it (a step then runs up to max_step_tokens +
  // max_sequences rows); and the forward runs its batch-invariant kernels
  // (Forward::set_deterministic). Costs: docs/BENCHMARKS.md "Deterministic mode".
  bool deterministic = false;
  // With the prefix cache: called (engine thread) with each new point cached at a prefill cut (the
  // end of the cached chain the prompt extends, the prompt's last full block), tokens[0, n) its
  // tokens (the shared prefix store writes it through).
  std::function<void(const int32_t* tokens, int64_t n, const SeqKV& s)> on_prefill_point;
};

// What a sequence ended with (passed to Request::on_finish).
struct SeqResult {
  int64_t id = 0;
  FinishReason why = FinishReason::length;
  std::string error;  // for FinishReason::error
  int64_t n_prompt = 0, n_generated = 0;
  // KV memory at the end (kvcache/kv_store.h): payload of the tokens, blocks allocated (shared
  // ones in full), and an fp16 cache for the same tokens.
  size_t kv_token_bytes = 0, kv_allocated_bytes = 0, kv_fp16_bytes = 0;
};

struct Request {
  std::vector<int32_t> prompt;  // at least one token
  SamplerParams sampling;
  int max_new_tokens = 128;
  bool ignore_eos = false;
  int64_t fork_of = -1;  // an earlier request whose prompt starts with this one's prompt tokens (or -1)
  // Called with each new token (from the engine's thread); return false to stop the sequence.
  std::function<bool(int64_t id, int32_t token)> on_token;
  // Called once when the sequence ends.
  std::function<void(const SeqResult&)> on_finish;
  // Optional: the logits [n_vocab] the next token is sampled from, just before its on_token (the
  // server's logprobs); valid during this call and that on_token.
  std::function<void(int64_t id, const float* logits, int n_vocab)> on_logits;
  // Optional (prefix cache on): a point fetched from the shared prefix store for this prompt
  // (checked already: identity, content hash, finite values). At admission, when it covers more
  // of the prompt than the local cache, its blocks are copied into the pool and cached as a point.
  std::shared_ptr<const StoredPrefix> stored_prefix;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0, decode_tokens = 0;
  int64_t preemptions = 0;
  double step_seconds = 0;      // total time in Forward::step
  double last_step_ms = 0;
  int running = 0, waiting = 0;
  // Copied at the end of each step, so that other threads can read them (server metrics).
  PrefixCacheStats prefix;
  // Points of the shared prefix store taken into the pool / their tokens / ones not taken (the
  // pool had no room, or their tokens were not the prompt's).
  int64_t store_adopted = 0, store_adopted_tokens = 0, store_not_adopted = 0;
  size_t pool_used_bytes = 0, pool_budget_bytes = 0;
};

class Engine {
 public:
  Engine(const Model& model, const KVSpec& spec, const EngineOptions& opt = {});
  ~Engine();

  int64_t submit(Request r);  // returns the request id (>= 0)
  void cancel(int64_t id);    // ends it at the next step (its blocks are freed then)
  // One step; false when there was nothing to do.
  bool step();
  void run();  // steps until no request is left
  bool idle() const;

  EngineStats stats() const;
  // Rank 0's store (the only one at tp = 1); kv(r) rank r's.
  const KVStore& kv() const { return *stores_[0]; }
  KVStore& kv() { return *stores_[0]; }
  KVStore& kv(int rank) { return *stores_[size_t(rank)]; }
  const KVStore& kv(int rank) const { return *stores_[size_t(rank)]; }
  int tp() const { return int(stores_.size()); }
  TPForward* tensor_parallel() { return tp_.get(); }  // null at tp = 1
  const Model& model() const { return model_; }
  const EngineOptions& options() const { return opt_; }
  // The prefix cache (nullptr when off); the engine's thread only, between steps.
  PrefixCache* prefix_cache() { return cache_.get(); }

 private:
  struct Seq;
  void admit();
  void finish(Seq& s, FinishReason why, const std::string& error = "");
  bool fork_children(Seq& parent);
  void preempt(Seq& s);
  void attach_cached_prefix(Seq& s);
  void adopt_stored_prefix(Seq& s);  // s.req.stored_prefix into the prefix cache, when it helps
  void cache_points(const BatchEntry& e, Seq& s);
  void publish_stats();  // copies what other threads may read into stats_
  // A sequence's KV over every rank's store (ranks[0] alone at tp = 1).
  TPSequence new_seq();
  void release_seq(TPSequence& s);
  // Forks of r0 (rank 0) and extra (ranks 1..) at n tokens: all or none (throws vq::Error).
  TPSequence fork_seq(const SeqKV& r0, const SeqKV* extra, int64_t n);
  size_t seq_bytes(const TPSequence& s, size_t (KVStore::*f)(const SeqKV&) const) const;

  const Model& model_;
  EngineOptions opt_;
  std::unique_ptr<KVStore> kv_;    // tp = 1
  std::unique_ptr<Forward> fwd_;   // tp = 1
  std::unique_ptr<TPForward> tp_;  // tp > 1: its stores
  std::vector<KVStore*> stores_;   // every rank's store
  std::unique_ptr<PrefixCache> cache_;  // after the stores: its points go back to them first
  mutable std::mutex mu_;  // guards waiting_, cancelled_, next_id_
  std::deque<std::unique_ptr<Seq>> waiting_;
  std::vector<int64_t> cancelled_;
  int64_t next_id_ = 0;
  std::vector<std::unique_ptr<Seq>> running_;  // in start order
  std::map<int64_t, std::vector<std::unique_ptr<Seq>>> forks_;  // parent id -> children waiting for it
  EngineStats stats_;
  // step scratch
  std::vector<TPBatchEntry> tp_entries_;
  std::vector<BatchEntry> entries_;
  std::vector<Seq*> entry_seq_;
};

}  // namespace vq
