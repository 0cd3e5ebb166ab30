#pragma once
// KV events in vLLM's published format (issue 24), for routers and indexers that follow which
// replica holds which prefix blocks (llm-d's prefix-cache scorer and the like).
//
// Wire format, as vLLM's ZmqEventPublisher (vllm/distributed/kv_events.py, the msgspec structs
// with array_like=True and tag=True) sends it:
//   PUB message: [topic bytes, u64 sequence number big-endian, msgpack payload]
//   payload: KVEventBatch = [ts (float64 seconds since the epoch), [event...], data_parallel_rank]
//   event:   ["BlockStored", [block_hash...], parent_block_hash | nil, [token_id...], block_size,
//             lora_id (nil), medium]
//            ["BlockRemoved", [block_hash...], medium]
//            ["AllBlocksCleared"]
// Replay (ROUTER, always bound): a client (REQ or DEALER) sends the first sequence number it wants
// as 8 bytes big-endian; it gets [seq, payload] for every batch still in the ring (the last
// `buffer_batches`) from that number on, then [-1 as 8 bytes big-endian, empty] to end.
//
// Blocks are the prefix cache's hash-chain nodes (kvcache/prefix_cache.h): a block hash is the
// node's key (XXH64 of its 32 token ids seeded with the parent's key; the first block's parent is
// the KV identity, so hashes differ across model, spec and calibration), the first block of a
// prompt has parent nil. A node appears when a prefix point is cached through it and goes when no
// point needs it; the cache's clear is AllBlocksCleared.
//
// Threads: the listener calls (engine thread) only queue events; one publisher thread owns the
// sockets (ZMQ sockets are not thread-safe), sends a batch of what was queued every few
// milliseconds and answers replay requests.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/prefix_cache.h"

namespace vq {

struct KVEventsOptions {
  // PUB endpoint: bound when it holds '*' or "::" or is ipc:// or inproc:// (e.g. tcp://*:5557),
  // else connected (e.g. tcp://127.0.0.1:5557 to an indexer that binds), as vLLM does.
  std::string endpoint;
  std::string replay_endpoint;  // ROUTER endpoint, bound (e.g. tcp://127.0.0.1:5558); empty: none
  std::string topic;            // first frame of every message (vLLM's default: empty)
  int buffer_batches = 10000;   // batches kept for replay
  int data_parallel_rank = 0;
  std::string medium = "CPU";   // where the blocks live
  int hwm = 100000;             // PUB high-water mark (messages)
};

// One clear error for a bad endpoint string, before anything binds (the CLI's check).
void check_kv_events_endpoint(const std::string& endpoint, const char* flag);

class KVEventPublisher : public PrefixCacheListener {
 public:
  // Binds / connects the sockets (vq::Error naming the endpoint on failure) and starts the thread.
  explicit KVEventPublisher(const KVEventsOptions& opt);
  ~KVEventPublisher() override;  // sends what is queued, then closes
  KVEventPublisher(const KVEventPublisher&) = delete;
  KVEventPublisher& operator=(const KVEventPublisher&) = delete;

  void blocks_stored(uint64_t parent, bool parent_is_root, const std::vector<uint64_t>& keys,
                     const std::vector<int32_t>& tokens, int block_tokens) override;
  void blocks_removed(const std::vector<uint64_t>& keys) override;
  void all_cleared() override;

  int64_t batches_sent() const { return batches_.load(); }
  int64_t events_sent() const { return events_.load(); }

 private:
  void push(std::string event);  // one msgpack-encoded event
  void loop();
  void publish(std::vector<std::string> events);
  void serve_replay();

  KVEventsOptions opt_;
  void* ctx_ = nullptr;
  void* pub_ = nullptr;
  void* replay_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> pending_;
  bool stop_ = false;
  uint64_t next_seq_ = 0;                             // publisher thread only
  std::deque<std::pair<uint64_t, std::string>> ring_;  // publisher thread only
  std::atomic<int64_t> batches_{0}, events_{0};
  std::thread thread_;
};

// Forwards node changes to several listeners (KV events and the shared prefix store).
class PrefixCacheFanout : public PrefixCacheListener {
 public:
  void add(PrefixCacheListener* l) {
    if (l) to_.push_back(l);
  }
  bool empty() const { return to_.empty(); }
  void blocks_stored(uint64_t parent, bool parent_is_root, const std::vector<uint64_t>& keys,
                     const std::vector<int32_t>& tokens, int block_tokens) override {
    for (auto* l : to_) l->blocks_stored(parent, parent_is_root, keys, tokens, block_tokens);
  }
  void blocks_removed(const std::vector<uint64_t>& keys) override {
    for (auto* l : to_) l->blocks_removed(keys);
  }
  void all_cleared() override {
    for (auto* l : to_) l->all_cleared();
  }

 private:
  std::vector<PrefixCacheListener*> to_;
};

}  // namespace vq
