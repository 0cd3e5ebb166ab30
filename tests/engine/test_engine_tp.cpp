// The engine over tensor-parallel ranks (EngineOptions::tp, CPU ranks simulated in turn): with
// float weights every request's greedy tokens equal the unsplit engine's (only the order of the
// sums differs), through continuous batching, the prefix cache (hits across ranks), forks of one
// prompt, a pool small enough to evict and preempt, and a tp that replicates the KV heads; every
// rank's pool is empty at the end; tp with the deterministic mode is refused.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine_fixture.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "model/test_forward_tiny.h"

using namespace vq;
using vq::engine_test::random_tokens;

namespace {

const Model& f32_model() {
  static const std::unique_ptr<Model> m = [] {
    test::TinySpec s;  // 4 query / 2 KV heads of 64, f32 weights: tp 2 splits, tp 4 replicates the KV heads
    s.n_layers = 2, s.n_embd = 128, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 64, s.n_ff = 160, s.n_vocab = 97;
    s.write_key_length = true, s.wtype = GGMLType::F32, s.seed = 21;
    return Model::load(test::write_tiny_model(s, test::tiny_path("engine_tp")));
  }();
  return *m;
}

KVSpec spec_of(const std::string& name) {
  KVSpec s{parse_kv_cache_spec(name), nullptr};
  const ModelConfig& c = f32_model().config();
  if (s.config.method == KVMethod::vecinfer)
    s.calibration = std::make_shared<const Calibration>(random_calibration(s.config, c.n_layers, c.n_kv_heads,
                                                                           c.head_dim, 5));
  return s;
}

struct TPRun {
  std::vector<std::vector<int32_t>> tokens;  // per request, in submit order
  EngineStats stats;
};

// Prompts sharing prefixes (so the cache hits), forks of the first, greedy, n new tokens each.
TPRun run_tp(const KVSpec& spec, int tp, size_t budget, int n) {
  const int V = f32_model().config().n_vocab;
  EngineOptions eo;
  eo.tp = tp;
  eo.max_sequences = 3;
  eo.max_step_tokens = 40;
  eo.prefix_cache = true;
  eo.kv_identity = 7;
  eo.kv_budget_bytes = budget;
  Engine eng(f32_model(), spec, eo);
  EXPECT_EQ(eng.tp(), tp);
  const std::vector<int32_t> shared = random_tokens(70, V, 5);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = i % 2 ? shared : random_tokens(20 + 9 * i, V, 40 + uint64_t(i));
    const auto tail = random_tokens(3 + i, V, 90 + uint64_t(i));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  TPRun r;
  r.tokens.resize(prompts.size() + 2);
  std::map<int64_t, size_t> slot;
  int64_t first = -1;
  for (size_t i = 0; i < prompts.size() + 2; ++i) {
    Request q;
    q.prompt = i < prompts.size() ? prompts[i] : prompts[0];
    q.sampling.temp = 0;
    q.max_new_tokens = n;
    if (i >= prompts.size()) q.fork_of = first;  // two samples sharing the first prompt's blocks
    q.on_token = [&r, &slot](int64_t id, int32_t t) {
      r.tokens[slot.at(id)].push_back(t);
      return true;
    };
    const int64_t id = eng.submit(std::move(q));
    slot[id] = i;
    if (i == 0) first = id;
  }
  eng.run();
  r.stats = eng.stats();
  // Every sequence gave its blocks back (the prefix cache's points keep theirs: they are dropped here).
  eng.prefix_cache()->clear();
  for (int rk = 0; rk < tp; ++rk) EXPECT_EQ(eng.kv(rk).pool().used_bytes(), 0u) << "rank " << rk;
  return r;
}

}  // namespace

TEST(EngineTP, SplitEngineGivesTheUnsplitEnginesTokens) {
  for (const char* kv : {"fp16", "vecinfer:d4b8,r=32", "q8_0"}) {
    const KVSpec spec = spec_of(kv);
    const TPRun one = run_tp(spec, 1, size_t(-1), 16);
    EXPECT_GT(one.stats.prefix.hits, 0) << kv << ": the prompts share prefixes";
    for (int tp : {2, 4}) {
      const TPRun split = run_tp(spec, tp, size_t(-1), 16);
      EXPECT_EQ(split.tokens, one.tokens) << kv << " tp " << tp;
      EXPECT_EQ(split.stats.prefix.hits, one.stats.prefix.hits) << kv << " tp " << tp;
      EXPECT_EQ(split.stats.prefix.hit_tokens, one.stats.prefix.hit_tokens) << kv << " tp " << tp;
    }
  }
}

TEST(EngineTP, SmallPoolEvictsAndPreemptsWithoutChangingTokens) {
  const KVSpec spec = spec_of("fp16");
  const TPRun free_run = run_tp(spec, 1, size_t(-1), 12);
  // A pool of a few blocks per sequence: cached prefixes are evicted and sequences preempted; the
  // budget splits over the ranks (each rank's blocks are that much smaller).
  const size_t budget = size_t(96) << 10;
  const TPRun one = run_tp(spec, 1, budget, 12), two = run_tp(spec, 2, budget, 12);
  EXPECT_EQ(one.tokens, free_run.tokens);
  EXPECT_EQ(two.tokens, free_run.tokens);
  EXPECT_GT(two.stats.preemptions + two.stats.prefix.evicted, 0) << "the budget should squeeze";
  EXPECT_EQ(two.stats.preemptions, one.stats.preemptions);
  EXPECT_LE(two.stats.pool_budget_bytes, one.stats.pool_budget_bytes) << "the ranks' pools share the budget";
}

TEST(EngineTP, RefusesTheDeterministicModeAndBadRankCounts) {
  const KVSpec spec = spec_of("fp16");
  EngineOptions eo;
  eo.tp = 2;
  eo.deterministic = true;
  try {
    Engine e(f32_model(), spec, eo);
    ADD_FAILURE() << "tp 2 with the deterministic mode was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("deterministic"), std::string::npos) << e.what();
  }
  eo.deterministic = false;
  eo.tp = 3;  // 4 query heads do not split over 3 ranks
  try {
    Engine e(f32_model(), spec, eo);
    ADD_FAILURE() << "tp 3 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("4 attention heads"), std::string::npos) << e.what();
  }
}
