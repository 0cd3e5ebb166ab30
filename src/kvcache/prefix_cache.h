#pragma once
// PrefixCache: KV of token prefixes kept in the pool for later requests, on the compressed blocks.
//
// A cached "point" is a sequence of n tokens forked (KVStore::fork) from a running sequence at a
// moment when it held exactly n tokens, so it references every block, in every form, that a query
// at position n reads: the codes of the old blocks and the fp16 sinks and window. A request whose
// tokens start with a point's tokens forks from it and feeds only the rest: nothing is recomputed
// or re-encoded, and since which form a query reads depends on positions only (kv_store.h) the
// request sees exactly the cache a fresh run would build: a hit gives the same tokens as a miss.
//
// Points are found through a hash chain of full blocks: node m covers tokens [0, m*B) and is keyed
// by XXH64(tokens of block m-1, seed = key of node m-1), the root by the KV identity (model, spec,
// calibration: kv_identity.h). Nodes store their block's tokens, so a hash collision is a miss,
// never a wrong hit. A point of n tokens hangs on node floor(n / B) with its last n mod B tokens.
//
// Memory: a point owns nothing but references; blocks shared with running sequences or other
// points are counted once by the pool. Unpinned points are evicted least recently used first
// (evict_one) when the engine needs room; pinned ones (named sessions) stay until unpinned.
// Not thread-safe: the engine's thread uses it, like the KVStore.
#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "kvcache/kv_store.h"

namespace vq {

// What happens to the hash chain's nodes (full blocks), for observers such as the server's KV
// events (vLLM's BlockStored / BlockRemoved / AllBlocksCleared) and its shared prefix store.
// Called on the cache's thread, inside insert / erase / evict_one / clear.
class PrefixCacheListener {
 public:
  virtual ~PrefixCacheListener() = default;
  // New nodes keys[i] (in chain order), the first a child of `parent` (parent_is_root: the first
  // block of a prompt); tokens: their blocks' tokens, block_tokens each, concatenated.
  virtual void blocks_stored(uint64_t parent, bool parent_is_root, const std::vector<uint64_t>& keys,
                             const std::vector<int32_t>& tokens, int block_tokens) = 0;
  virtual void blocks_removed(const std::vector<uint64_t>& keys) = 0;
  virtual void all_cleared() = 0;
};

struct PrefixCacheStats {
  int64_t lookups = 0, hits = 0, hit_tokens = 0;  // hit_tokens: prompt tokens not recomputed
  int64_t lookup_tokens = 0;                       // prompt tokens of every lookup (vLLM's queried tokens)
  int64_t inserted = 0, evicted = 0;
  int64_t points = 0, pinned = 0, nodes = 0;
};

class PrefixCache {
 public:
  PrefixCache(KVStore& kv, uint64_t identity);
  // A cache over tensor-parallel ranks: kv holds rank 0's blocks, extra[r - 1] rank r's. Every
  // point then holds one sequence per rank (the same tokens: the ranks' stores receive the same
  // appends), forked and released together; lookups and eviction are decided once, on the tokens.
  PrefixCache(KVStore& kv, std::vector<KVStore*> extra, uint64_t identity);
  ~PrefixCache();
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  struct Hit {
    int64_t point = -1;          // -1: no cached point fits
    const SeqKV* seq = nullptr;  // the point's sequence (fork it to use it); rank 0's with ranks
    const SeqKV* extra = nullptr;  // ranks 1.. (point_extra's array), or nullptr
    int64_t n = 0;               // tokens it holds
    int64_t matched = 0;         // tokens of the longest chain of cached full blocks the tokens extend
  };
  // The longest point whose tokens are tokens[0, n) with n <= max_n (a request feeds at least its
  // last token itself: max_n = n_tokens - 1). Marks it used.
  Hit lookup(const int32_t* tokens, int64_t n_tokens, int64_t max_n);
  // The same without marking it used or counting a lookup (bookkeeping, e.g. naming a session).
  Hit find(const int32_t* tokens, int64_t n_tokens, int64_t max_n) const;

  struct Inserted {
    int64_t point = -1;  // -1: not cached (s does not hold the forms of position n, or a collision)
    bool created = false;
  };
  // Caches s at n tokens; tokens[0, n) are its tokens. An existing identical point is marked used.
  // With ranks: extra[r - 1] is rank r's sequence (all ranks are forked, or none).
  Inserted insert(const int32_t* tokens, int64_t n, const SeqKV& s, const SeqKV* extra = nullptr);
  bool erase(int64_t point);  // false when absent
  void pin(int64_t point, bool on);
  bool pinned(int64_t point) const;
  const SeqKV* point_sequence(int64_t point) const;  // nullptr when absent
  // Ranks 1.. of a point ([extra_ranks()] sequences), nullptr when absent or without ranks.
  const SeqKV* point_extra(int64_t point) const;
  int extra_ranks() const { return int(extra_.size()); }
  // Drops the least recently used unpinned point; false when there is none.
  bool evict_one();
  void clear();  // every point, pinned ones too

  PrefixCacheStats stats() const;
  int block_tokens() const { return B_; }
  // Observer of node changes (nullptr: none); not owned, must outlive its registration.
  void set_listener(PrefixCacheListener* l) { listener_ = l; }
  // The key of the node covering one more block under `parent` (the root's key is the KV identity),
  // as the cache computes it: XXH64 of the block's block_tokens token ids seeded with the parent.
  static uint64_t chain_key(uint64_t parent, const int32_t* block, int block_tokens);

 private:
  struct Node {
    uint64_t parent = 0;
    int64_t depth = 0;            // full blocks covered
    std::vector<int32_t> tokens;  // [B] the last block's tokens (empty at the root)
    int children = 0;
    std::vector<int64_t> points;
  };
  struct Point {
    uint64_t node = 0;
    int64_t n = 0;
    std::vector<int32_t> tail;  // tokens[depth * B, n)
    SeqKV seq;
    std::vector<SeqKV> extra;  // ranks 1..
    uint64_t last_used = 0;
    bool pinned = false;
  };
  uint64_t child_key(uint64_t parent, const int32_t* block) const;
  // The node of tokens' block m under `parent`, or nullptr (absent or a hash collision).
  const Node* child(uint64_t parent_key, uint64_t key, const int32_t* block) const;
  void prune(uint64_t key);

  KVStore& kv_;
  std::vector<KVStore*> extra_;
  int B_;
  uint64_t root_;
  std::unordered_map<uint64_t, Node> nodes_;
  std::map<int64_t, Point> points_;
  int64_t next_point_ = 0;
  uint64_t clock_ = 0;
  PrefixCacheStats stats_;
  PrefixCacheListener* listener_ = nullptr;
};

}  // namespace vq
