// Continuous batching: requests join and leave between steps; greedy outputs equal each
// request run alone; a small pool preempts and recomputes without changing any output; a request
// that cannot fit alone ends with an error; cancellation frees blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine/engine.h"
#include "engine_fixture.h"
#include "gpu_test.h"

using namespace vq;
using vq::engine_test::Tiny;
using vq::engine_test::random_tokens;

namespace {

int argmax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

std::vector<int32_t> greedy_alone(const KVSpec& spec, const std::vector<int32_t>& prompt, int n) {
  const Model& m = *Tiny::get().model;
  const int V = m.config().n_vocab;
  Session s(m, spec, int(prompt.size()) + n);
  std::vector<float> lg(static_cast<size_t>(V));
  s.forward(prompt.data(), int(prompt.size()), lg.data());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(argmax(lg.data(), V));
    if (i + 1 < n) s.forward(&out.back(), 1, lg.data());
  }
  return out;
}

struct EngineRun {
  std::map<int64_t, std::vector<int32_t>> tokens;
  std::map<int64_t, SeqResult> results;
};

// Submits the prompts (greedy, n new tokens each) and runs the engine to the end.
EngineRun run_engine(Engine& eng, const std::vector<std::vector<int32_t>>& prompts, int n, std::vector<int64_t>* ids = nullptr) {
  EngineRun r;
  for (const auto& p : prompts) {
    Request q;
    q.prompt = p;
    q.sampling.temp = 0;
    q.max_new_tokens = n;
    q.on_token = [&r](int64_t id, int32_t t) {
      r.tokens[id].push_back(t);
      return true;
    };
    q.on_finish = [&r](const SeqResult& res) { r.results[res.id] = res; };
    const int64_t id = eng.submit(std::move(q));
    if (ids) ids->push_back(id);
  }
  eng.run();
  return r;
}

}  // namespace

TEST(Engine, ContinuousBatchingEqualsEachRequestAlone) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab, n = 24;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 7; ++i) prompts.push_back(random_tokens(5 + 23 * i, V, 200 + uint64_t(i)));
  for (const std::string& method : {std::string("fp16"), std::string("q8_0"), std::string("kivi4,r=32"),
                                    std::string("vecinfer:d4b8,r=32")}) {
    const KVSpec spec = t.spec(method);
    EngineOptions eo;
    eo.max_sequences = 3;     // requests wait, then join as others finish
    eo.max_step_tokens = 48;  // long prompts take several steps beside the others' decode tokens
    Engine eng(*t.model, spec, eo);
    std::vector<int64_t> ids;
    const EngineRun r = run_engine(eng, prompts, n, &ids);
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(r.tokens.at(ids[i]), greedy_alone(spec, prompts[i], n)) << method << " request " << i;
      EXPECT_EQ(r.results.at(ids[i]).why, FinishReason::length);
    }
    EXPECT_TRUE(eng.idle());
    EXPECT_EQ(eng.kv().pool().used_bytes(), 0u) << "every finished sequence gave its blocks back";
    EXPECT_GT(eng.stats().steps, 0);
  }
}

// Deterministic mode, on each device: every request's greedy tokens equal those it gets running
// alone through the same engine, while up to 6 others run beside it (prompts cut into chunks at
// fixed positions whatever the decode rows of the others leave; batch-invariant kernels on the GPU).
TEST(Engine, DeterministicModeGivesEachRequestItsTokensAloneOnEachDevice) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab, n = 20;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 7; ++i) prompts.push_back(random_tokens(9 + 37 * i, V, 500 + uint64_t(i)));
  std::string why;
  for (const KVDevice dev : {KVDevice::cpu, KVDevice::cuda}) {
    if (dev == KVDevice::cuda && !vq::test::gpu_usable(&why)) {
      std::printf("  (cuda part skipped: %s)\n", why.c_str());
      continue;
    }
    for (const std::string& method : {std::string("fp16"), std::string("vecinfer:d4b8,r=32")}) {
      if (dev == KVDevice::cpu && method != "fp16") continue;  // the cpu's methods: ContinuousBatching above
      const KVSpec spec = t.spec(method);
      EngineOptions eo;
      eo.device = dev;
      eo.kv_budget_bytes = size_t(256) << 20;
      eo.max_sequences = 7;
      eo.max_step_tokens = 48;
      eo.deterministic = true;
      Engine eng(*t.model, spec, eo);
      std::vector<int64_t> ids;
      const EngineRun r = run_engine(eng, prompts, n, &ids);
      for (size_t i = 0; i < prompts.size(); ++i) {
        Engine alone(*t.model, spec, eo);
        std::vector<int64_t> one;
        const EngineRun a = run_engine(alone, {prompts[i]}, n, &one);
        EXPECT_EQ(r.tokens.at(ids[i]), a.tokens.at(one[0]))
            << (dev == KVDevice::cuda ? "cuda " : "cpu ") << method << " request " << i;
      }
    }
  }
}

TEST(Engine, SmallPoolPreemptsWithoutChangingOutputs) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab, n = 40;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 5; ++i) prompts.push_back(random_tokens(60 + 10 * i, V, 300 + uint64_t(i)));
  const KVSpec spec = t.spec("fp16");
  // fp16 block: 32 tokens x 2 heads x 64 x 2 (K, V) x 2 bytes = 16 KiB, two layers: 32 KiB per 32
  // tokens; the five sequences end at 100..140 tokens (4-5 blocks, up to 160 KiB): 500 KiB holds
  // about three.
  EngineOptions eo;
  eo.kv_budget_bytes = 500 << 10;
  eo.max_sequences = 5;
  Engine eng(*t.model, spec, eo);
  std::vector<int64_t> ids;
  const EngineRun r = run_engine(eng, prompts, n, &ids);
  EXPECT_GT(eng.stats().preemptions, 0) << "the budget should have forced preemptions";
  EXPECT_LE(eng.kv().pool().peak_bytes(), eo.kv_budget_bytes);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(r.results.at(ids[i]).why, FinishReason::length) << r.results.at(ids[i]).error;
    EXPECT_EQ(r.tokens.at(ids[i]), greedy_alone(spec, prompts[i], n)) << "request " << i;
  }
}

TEST(Engine, RequestThatCannotFitAloneEndsWithAnError) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab;
  EngineOptions eo;
  eo.kv_budget_bytes = 100 << 10;  // ~3 fp16 blocks
  Engine eng(*t.model, t.spec("fp16"), eo);
  std::vector<int64_t> ids;
  const EngineRun r = run_engine(eng, {random_tokens(200, V, 1), random_tokens(10, V, 2)}, 4, &ids);
  EXPECT_EQ(r.results.at(ids[0]).why, FinishReason::error);
  EXPECT_NE(r.results.at(ids[0]).error.find("budget"), std::string::npos) << r.results.at(ids[0]).error;
  EXPECT_EQ(r.results.at(ids[1]).why, FinishReason::length) << "the small request still runs";
  EXPECT_EQ(eng.kv().pool().used_bytes(), 0u);
}

TEST(Engine, ForkedSamplesShareThePromptAndMatchUnsharedRuns) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab, n = 20;
  const auto prompt = random_tokens(150, V, 7);
  const KVSpec spec = t.spec("vecinfer:d4b8,r=32");
  auto sample_run = [&](bool share) {
    Engine eng(*t.model, spec);
    std::map<int64_t, std::vector<int32_t>> out;
    std::vector<int64_t> ids;
    for (int i = 0; i < 4; ++i) {
      Request q;
      q.prompt = prompt;
      q.sampling.temp = 0.9f;
      q.sampling.seed = 40 + uint64_t(i);
      q.max_new_tokens = n;
      if (share && i > 0) q.fork_of = ids[0];
      q.on_token = [&out](int64_t id, int32_t tok) {
        out[id].push_back(tok);
        return true;
      };
      ids.push_back(eng.submit(std::move(q)));
    }
    eng.run();
    std::vector<std::vector<int32_t>> r;
    for (int64_t id : ids) r.push_back(out[id]);
    return std::make_pair(r, eng.stats().prefill_tokens);
  };
  const auto [shared, pre_shared] = sample_run(true);
  const auto [separate, pre_separate] = sample_run(false);
  EXPECT_EQ(shared, separate);
  // the prompt is prefilled once (plus one token per forked sample) instead of four times
  EXPECT_EQ(pre_shared, int64_t(prompt.size()) + 3);
  EXPECT_EQ(pre_separate, 4 * int64_t(prompt.size()));
}

TEST(Engine, CancelFreesBlocksAndBadRequestsAreRefused) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab;
  Engine eng(*t.model, t.spec("fp16"));
  Request q;
  q.prompt = random_tokens(50, V, 3);
  q.max_new_tokens = 1000;
  bool cancelled = false;
  q.on_finish = [&](const SeqResult& r) { cancelled = r.why == FinishReason::cancelled; };
  const int64_t id = eng.submit(std::move(q));
  for (int i = 0; i < 3; ++i) eng.step();
  EXPECT_GT(eng.kv().pool().used_bytes(), 0u);
  eng.cancel(id);
  eng.step();
  EXPECT_TRUE(cancelled);
  EXPECT_EQ(eng.kv().pool().used_bytes(), 0u);
  EXPECT_TRUE(eng.idle());
  Request empty;
  EXPECT_THROW(eng.submit(empty), Error);
  Request bad;
  bad.prompt = {1, V};  // id == n_vocab
  EXPECT_THROW(eng.submit(bad), Error);
  Request toolong;
  toolong.prompt = random_tokens(300, V, 4);  // the tiny model's context is 256
  EXPECT_THROW(eng.submit(toolong), Error);
}

