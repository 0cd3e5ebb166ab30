// The prefix cache on the compressed blocks: a request that starts from a cached point gives the
// same tokens as one that computes everything (every KV method), cached points are evicted before
// any running sequence is preempted, pinned points survive eviction, and the cache's bookkeeping
// (max_n, chain matching, pruning) holds.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <map>
#include <string>

#include "engine/engine.h"
#include "engine_fixture.h"
#include "gpu_test.h"

using namespace vq;
using vq::engine_test::Tiny;
using vq::engine_test::random_tokens;

namespace {

std::vector<int32_t> cat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Runs one request to its end (greedy, n new tokens); *hit: prompt tokens it took from the cache.
std::vector<int32_t> run_one(Engine& eng, const std::vector<int32_t>& prompt, int n, int64_t* hit = nullptr) {
  const int64_t before = eng.stats().prefix.hit_tokens;
  std::vector<int32_t> got;
  FinishReason why = FinishReason::error;
  Request q;
  q.prompt = prompt;
  q.sampling.temp = 0;
  q.max_new_tokens = n;
  q.on_token = [&got](int64_t, int32_t t) {
    got.push_back(t);
    return true;
  };
  q.on_finish = [&why](const SeqResult& r) { why = r.why; };
  eng.submit(std::move(q));
  eng.run();
  EXPECT_EQ(why, FinishReason::length);
  if (hit) *hit = eng.stats().prefix.hit_tokens - before;
  return got;
}

// The hit/miss scenario shared by the CPU and device tests: prompt a (100 shared + 50 tokens), b
// (the same 100 + 40), a again, then a's next turn. a is a miss, cached at its block-aligned chunk
// end 96, at 128 (its last full block before the prompt's end) and at its end (150 + 11 fed
// tokens); b shares 96 tokens of full blocks with a; a again starts from 128; a's next turn from
// a's end. Every request's tokens equal the cache-less engine's.
void expect_hits_equal_misses(Engine& warm, Engine& cold, const std::string& method) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab, n = 12;
  const auto shared = random_tokens(100, V, 500);
  const auto a = cat(shared, random_tokens(50, V, 501));
  const auto b = cat(shared, random_tokens(40, V, 502));
  std::vector<std::vector<int32_t>> prompts = {a, b, a};
  std::vector<int64_t> hits;
  for (size_t i = 0; i < prompts.size(); ++i) {
    int64_t hit = 0;
    const auto got = run_one(warm, prompts[i], n, &hit);
    hits.push_back(hit);
    EXPECT_EQ(got, run_one(cold, prompts[i], n)) << method << " request " << i;
    if (i == 0) prompts.push_back(cat(cat(a, got), random_tokens(20, V, 504)));
  }
  EXPECT_EQ(hits, (std::vector<int64_t>{0, 96, 128, 150 + n - 1})) << method;
  EXPECT_EQ(cold.stats().prefix.hits, 0);
  EXPECT_EQ(warm.stats().prefill_tokens + 96 + 128 + 150 + n - 1, cold.stats().prefill_tokens)
      << "a hit recomputes nothing it took from the cache";
}

}  // namespace

TEST(PrefixCache, HitGivesTheSameTokensAsAMissForEveryMethod) {
  Tiny& t = Tiny::get();
  for (const std::string& method : engine_test::all_methods()) {
    const KVSpec spec = t.spec(method);
    ASSERT_EQ(make_kv_store(*t.model, spec)->block_tokens(), 32) << "the expected hits below assume 32";
    EngineOptions eo;
    eo.max_step_tokens = 48;  // prompts take several chunks, as long prompts do in a server
    Engine cold(*t.model, spec, eo);
    eo.prefix_cache = true;
    Engine warm(*t.model, spec, eo);
    expect_hits_equal_misses(warm, cold, method);
  }
}

// The same on the device pool (the methods with device kernels), in the batch-invariant mode: a hit
// changes where the prompt's chunks are cut, and only that mode makes the rest of the computation
// independent of the cuts' neighbours, so hit and miss give the same tokens.
TEST(PrefixCache, HitGivesTheSameTokensAsAMissOnTheDevice) {
  VQ_SKIP_WITHOUT_GPU();
  Tiny& t = Tiny::get();
  for (const std::string method : {"fp16", "vecinfer:d4b8,r=32"}) {
    const KVSpec spec = t.spec(method);
    EngineOptions eo;
    eo.device = KVDevice::cuda;
    eo.kv_budget_bytes = size_t(256) << 20;
    eo.max_step_tokens = 48;
    eo.deterministic = true;
    Engine cold(*t.model, spec, eo);
    eo.prefix_cache = true;
    Engine warm(*t.model, spec, eo);
    expect_hits_equal_misses(warm, cold, method);
  }
}

TEST(PrefixCache, CachedPointsAreEvictedBeforeAnySequenceIsPreempted) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab, n = 8;
  const KVSpec spec = t.spec("fp16");
  // fp16: 32 KiB per 32 tokens (both layers). 300 KiB: one 150-token sequence (5 blocks) alone
  // fits several times, but the points of earlier requests fill the rest.
  EngineOptions eo;
  eo.kv_budget_bytes = 300 << 10;
  eo.prefix_cache = true;
  Engine eng(*t.model, spec, eo);
  EngineOptions cold_opt = eo;
  cold_opt.prefix_cache = false;
  cold_opt.kv_budget_bytes = size_t(-1);
  Engine cold(*t.model, spec, cold_opt);
  for (int i = 0; i < 6; ++i) {
    const auto p = random_tokens(150, V, 600 + uint64_t(i));
    EXPECT_EQ(run_one(eng, p, n), run_one(cold, p, n)) << "request " << i;
  }
  const EngineStats st = eng.stats();
  EXPECT_GT(st.prefix.evicted, 0) << "the budget should have forced evictions";
  EXPECT_EQ(st.preemptions, 0) << "cached points go before running sequences";
  EXPECT_LE(eng.kv().pool().peak_bytes(), eo.kv_budget_bytes);
  EXPECT_GT(eng.kv().pool().used_bytes(), 0u) << "what fits stays cached";
}

TEST(PrefixCache, LookupPinningAndPruning) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab;
  const KVSpec spec = t.spec("kivi2,r=32");
  Session s(*t.model, spec, 200);
  PrefixCache cache(s.store(), 1234);
  const auto toks = random_tokens(100, V, 700);
  s.forward(toks.data(), 64, nullptr);
  const auto p64 = cache.insert(toks.data(), 64, s.sequence());
  s.forward(toks.data() + 64, 6, nullptr);
  const auto p70 = cache.insert(toks.data(), 70, s.sequence());
  ASSERT_TRUE(p64.created && p70.created);
  EXPECT_FALSE(cache.insert(toks.data(), 70, s.sequence()).created) << "an identical point is reused";
  // max_n bounds the point; the tail of an unaligned point must match exactly.
  EXPECT_EQ(cache.lookup(toks.data(), 100, 99).n, 70);
  EXPECT_EQ(cache.lookup(toks.data(), 100, 69).n, 64);
  auto other = toks;
  other[66] = (other[66] + 1) % V;
  const PrefixCache::Hit h = cache.lookup(other.data(), 100, 99);
  EXPECT_EQ(h.n, 64);
  EXPECT_EQ(h.matched, 64) << "block 2 (64..95) is not cached";
  other[3] = (other[3] + 1) % V;
  EXPECT_EQ(cache.lookup(other.data(), 100, 99).point, -1);
  EXPECT_EQ(cache.lookup(other.data(), 100, 99).matched, 0);
  // The point forks into a sequence at its position.
  SeqKV f = s.store().fork(*cache.point_sequence(p70.point));
  EXPECT_EQ(f.size(), 70);
  {
    s.forward(toks.data() + 70, 30, nullptr);  // at 100 the fp16 form of block 1 is gone
    PrefixCache late(s.store(), 99);
    EXPECT_EQ(late.insert(toks.data(), 64, s.sequence()).point, -1)
        << "a sequence past position 64 no longer holds what a query at 64 reads";
    EXPECT_EQ(late.stats().nodes, 1) << "nothing is left of the refused insert";
  }
  // Eviction: least recently used first, pinned points never; erasing prunes the chain.
  cache.pin(p70.point, true);
  EXPECT_TRUE(cache.evict_one());
  EXPECT_FALSE(cache.evict_one()) << "only the pinned point is left";
  EXPECT_EQ(cache.stats().points, 1);
  EXPECT_EQ(cache.stats().nodes, 3) << "root and the two full blocks under the pinned point";
  cache.pin(p70.point, false);
  EXPECT_TRUE(cache.erase(p70.point));
  EXPECT_EQ(cache.stats().nodes, 1);
  f = SeqKV();
  s.reset();
  EXPECT_EQ(s.store().pool().used_bytes(), 0u) << "the cache holds nothing once its points are gone";
}

// The listener (the server's KV events and shared store) sees every node the chain gains and loses,
// in chain order, with their blocks' tokens and the keys chain_key computes; clear is one event.
TEST(PrefixCache, ListenerSeesNodesStoredRemovedAndCleared) {
  struct Log : PrefixCacheListener {
    std::vector<std::string> ev;
    std::vector<uint64_t> stored, removed;
    std::vector<int32_t> tokens;
    uint64_t first_parent = 0;
    void blocks_stored(uint64_t parent, bool root, const std::vector<uint64_t>& keys, const std::vector<int32_t>& t,
                       int B) override {
      ev.push_back(fmt::format("stored {} root={} B={}", keys.size(), root, B));
      if (stored.empty()) first_parent = parent;
      stored.insert(stored.end(), keys.begin(), keys.end());
      tokens.insert(tokens.end(), t.begin(), t.end());
    }
    void blocks_removed(const std::vector<uint64_t>& keys) override {
      ev.push_back(fmt::format("removed {}", keys.size()));
      removed.insert(removed.end(), keys.begin(), keys.end());
    }
    void all_cleared() override { ev.push_back("cleared"); }
  } log;
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab;
  Session s(*t.model, t.spec("kivi2,r=32"), 200);
  PrefixCache cache(s.store(), 1234);
  cache.set_listener(&log);
  const auto toks = random_tokens(100, V, 701);
  s.forward(toks.data(), 64, nullptr);
  const auto p64 = cache.insert(toks.data(), 64, s.sequence());
  s.forward(toks.data() + 64, 32, nullptr);
  const auto p96 = cache.insert(toks.data(), 96, s.sequence());
  ASSERT_TRUE(p64.created && p96.created);
  ASSERT_EQ(log.ev, (std::vector<std::string>{"stored 2 root=true B=32", "stored 1 root=false B=32"}));
  EXPECT_EQ(log.first_parent, 1234u) << "the chain is rooted at the identity";
  EXPECT_EQ(log.tokens, std::vector<int32_t>(toks.begin(), toks.begin() + 96));
  uint64_t k = 1234;
  for (int m = 0; m < 3; ++m) {
    k = PrefixCache::chain_key(k, toks.data() + m * 32, 32);
    EXPECT_EQ(log.stored[size_t(m)], k) << "block " << m;
  }
  EXPECT_FALSE(cache.insert(toks.data(), 64, s.sequence()).created);
  EXPECT_EQ(log.ev.size(), 2u) << "an existing point adds no node";
  cache.erase(p96.point);
  ASSERT_EQ(log.ev.back(), "removed 1") << "only block 3 goes: p64 still needs blocks 1 and 2";
  EXPECT_EQ(log.removed, std::vector<uint64_t>{log.stored[2]});
  cache.clear();
  EXPECT_EQ(log.ev.back(), "cleared");
  cache.clear();
  EXPECT_EQ(log.ev.size(), 4u) << "clearing an empty cache says nothing";
  s.reset();
}
