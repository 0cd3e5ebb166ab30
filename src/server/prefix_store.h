#pragma once
// The shared compressed prefix store (issue 24): prefix points written through to Redis, so that a
// replica that never saw a prefix (or one that restarted) starts from its KV instead of computing it.
//
// An entry is one block-aligned prefix point of n = d * 32 tokens: an envelope, then the
// session-file bytes (kvcache/seq_file.h) of the sequence up to the point, the blocks as they are in
// the pool (codes, scales, the fp16 sinks and window a query at n reads; nothing re-encoded), its
// token ids and the KV identity (model, spec, calibration checksums) in the header, and a SHA-256.
// Its key is the prefix cache's chain key of its d full blocks (kvcache/prefix_cache.h: XXH64 per
// block seeded by the parent, rooted at the identity): "vqkv:<identity>:<chain key>" in hex.
//
// Delta entries: a point whose ancestor point (a shorter prefix of the same tokens, dp blocks) this
// replica wrote holds only what differs from it: the new blocks, and of the ancestor's blocks those
// whose forms differ at the two points (its fp16 window encoded since, blocks that left a sliding
// window); the others are written with no form and marked as the ancestor's. The envelope:
//   "VQKVPFX\0" | u32 version (=1) | u32 n_layers | i64 dp (0: a whole entry)
//   | per layer, ceil(dp / 8) bytes: bit j set, block j is the ancestor's | SHA-256 of the envelope
//   | the session file
// A conversation's turns then write their new blocks and window, not their whole prefix again, and
// the store holds each shared prefix once. A reader assembles a point from its chain of entries
// (deepest first, one GET each), every link checked as below and its tokens the prompt's.
// Write-through: each new prefill point the engine caches (EngineOptions::on_prefill_point) is
// copied out on the engine's thread (memcpy only, of the blocks the entry holds) and queued; a
// writer thread seals it (SHA-256) and SETs it NX (an entry is never overwritten), unless it wrote
// that key already.
// Fetch: on an HTTP thread before a request goes to the engine, the deepest chain key of the prompt
// past what the local cache holds (its nodes, followed through PrefixCacheListener) is looked up
// (pipelined EXISTS, then a GET per link of its chain) and each entry parsed like a session file:
// wrong identity or geometry, a bad hash, truncation, trailing bytes, a non-finite value, a bad
// envelope, token ids that are not the prompt's: refused (counted, deleted from the store, never
// used). A chain whose ancestor is gone (evicted, or its write failed) is a miss at that depth: the
// next deepest stored point is tried. The engine takes a good one into its pool when it still beats
// the local cache (Engine::adopt_stored_prefix).
// Down: a store that does not answer (connect 200 ms, I/O 2 s) is left alone for a second, then
// retried; meanwhile requests run on the local cache, and no client sees an error.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvcache/kv_identity.h"
#include "kvcache/prefix_cache.h"
#include "kvcache/seq_file.h"

struct redisContext;

namespace vq {

struct PrefixStoreOptions {
  std::string host = "127.0.0.1";
  int port = 6379;
  int connect_timeout_ms = 200, io_timeout_ms = 2000;
  int retry_ms = 1000;                          // a failed store is left alone this long
  size_t max_queued_bytes = size_t(256) << 20;  // write-through backlog; past it, points are skipped
  int max_lookup_blocks = 1024;                 // chain keys looked up per request at most
};

// "redis://HOST:PORT" (or redis://HOST, port 6379) into o; vq::Error naming the flag otherwise.
void parse_prefix_store_url(const std::string& url, PrefixStoreOptions& o, const char* flag);

struct PrefixStoreStats {
  int64_t lookups = 0, hits = 0;            // fetches tried / entries returned (checked)
  int64_t fetched_bytes = 0;                // bytes of entries read
  int64_t written = 0, written_bytes = 0;   // entries SET (new in the store)
  int64_t skipped = 0;                      // points not queued (already written, or the backlog was full)
  int64_t refused = 0;                      // entries that failed a check
  int64_t errors = 0;                       // store commands that failed (store down, timeouts)
  bool up = false;                          // the last command reached the store
};

class PrefixStore : public PrefixCacheListener {
 public:
  // kv: the engine's store (its shape is what an entry must match; it must outlive this).
  PrefixStore(const PrefixStoreOptions& opt, const KVStore& kv, KVIdentity identity);
  ~PrefixStore() override;  // writes what is queued (bounded by the I/O timeout), then stops
  PrefixStore(const PrefixStore&) = delete;
  PrefixStore& operator=(const PrefixStore&) = delete;

  // Engine thread (EngineOptions::on_prefill_point): queues the point s of n tokens.
  void offer(const int32_t* tokens, int64_t n, const SeqKV& s);
  // Any thread: the deepest stored point of `prompt` (n <= prompt.size() - 1) that is deeper than
  // the local cache's chain, checked; nullptr when there is none (or the store is down).
  std::shared_ptr<const StoredPrefix> fetch(const std::vector<int32_t>& prompt);
  // The store's key of the chain of tokens' first n_blocks full blocks.
  std::string key_of(const int32_t* tokens, int64_t n_blocks) const;

  PrefixStoreStats stats() const;
  std::string render_metrics() const;  // Prometheus text of stats()
  // Blocks until the write-through queue is empty (tests, shutdown).
  void flush();

  // PrefixCacheListener: which chain nodes the local cache holds.
  void blocks_stored(uint64_t parent, bool parent_is_root, const std::vector<uint64_t>& keys,
                     const std::vector<int32_t>& tokens, int block_tokens) override;
  void blocks_removed(const std::vector<uint64_t>& keys) override;
  void all_cleared() override;

 private:
  struct Conn;  // one hiredis connection with its retry clock
  std::string key_hex(uint64_t chain_key) const;
  // keys[k - 1]: the chain key of tokens' first k full blocks, k = 1..n_blocks.
  std::vector<uint64_t> chain_keys(const int32_t* tokens, int64_t n_blocks) const;
  void writer();

  PrefixStoreOptions opt_;
  const KVStore& kv_;
  KVIdentity id_;
  SessionExpect expect_;
  int B_;
  std::unique_ptr<Conn> read_conn_, write_conn_;
  std::mutex read_mu_;  // read_conn_

  mutable std::mutex mu_;  // everything below
  std::condition_variable cv_, idle_cv_;
  struct Pending {
    uint64_t key = 0;
    std::vector<uint8_t> envelope;  // complete
    std::vector<uint8_t> bytes;     // the session bytes, unsealed
  };
  // The block forms (bit 0 dense, bit 1 coded) of a point this replica wrote, [n_layers][blocks]: what
  // a deeper point of the same chain leaves out of its delta entry.
  struct Forms {
    int64_t blocks = 0;
    std::vector<uint8_t> f;
  };
  std::deque<Pending> queue_;
  size_t queued_bytes_ = 0;
  bool writing_ = false, stop_ = false;
  bool connected_before_ = false;  // the writer reached the store once (a later connect is a reconnect)
  std::unordered_set<uint64_t> written_;  // chain keys written (or found present) since the last reconnect
  std::unordered_map<uint64_t, Forms> forms_;  // chain keys written (queued) since the last reconnect
  std::unordered_set<uint64_t> local_;    // chain keys of the local cache's nodes
  PrefixStoreStats stats_;
  std::thread thread_;
};

}  // namespace vq
