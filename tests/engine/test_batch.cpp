// The batched forward over the KV store: a mixed batch (prefill chunks and decode tokens of
// sequences of different lengths) gives each sequence what it gets alone; prefix sharing gives
// what no sharing gives; the pool's budget holds, and running out changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <random>

#include <sys/prctl.h>

#include "core/thread_pool.h"
#include "engine_fixture.h"

using namespace vq;
using vq::engine_test::Tiny;
using vq::engine_test::random_tokens;

namespace {

// max |a - b| over max |b|
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i]))), m = std::max(m, double(std::fabs(b[i])));
  return m > 0 ? d / m : d;
}

// All logits [n, V] of tokens run alone through a Session in steps of `chunk` tokens.
std::vector<float> alone(const KVSpec& spec, const std::vector<int32_t>& tokens, int chunk) {
  const Model& m = *Tiny::get().model;
  const int V = m.config().n_vocab, n = int(tokens.size());
  Session s(m, spec, n, chunk);
  std::vector<float> out(size_t(n) * V);
  s.forward(tokens.data(), n, out.data(), true);
  return out;
}

int argmax(const float* x, int n) { return int(std::max_element(x, x + n) - x); }

}  // namespace

TEST(Batch, MixedBatchEqualsEachSequenceAlone) {
  Tiny& t = Tiny::get();
  const Model& m = *t.model;
  const int V = m.config().n_vocab;
  // Three sequences; every step below mixes prefill chunks with single tokens, and puts the
  // sequences at different lengths (one crosses the fp16 window into codes, r=32, blocks of 32).
  const std::vector<int32_t> A = random_tokens(150, V, 1), B = random_tokens(9, V, 2), C = random_tokens(200, V, 3);
  // (sequence, tokens) per step
  const std::vector<std::vector<std::pair<int, int>>> plan = {
      {{0, 40}, {1, 5}, {2, 64}}, {{0, 1}, {1, 1}, {2, 70}}, {{0, 60}, {1, 3}, {2, 1}}, {{0, 49}, {2, 65}}};
  const std::vector<const std::vector<int32_t>*> seq_tokens = {&A, &B, &C};
  for (const std::string& method : engine_test::all_methods()) {
    const KVSpec spec = t.spec(method);
    auto store = make_kv_store(m, spec);
    Forward fwd(m, *store);
    std::vector<SeqKV> seqs;
    for (int i = 0; i < 3; ++i) seqs.push_back(store->new_sequence());
    std::vector<std::vector<float>> logits(3);
    for (int i = 0; i < 3; ++i) logits[size_t(i)].resize(seq_tokens[size_t(i)]->size() * size_t(V));
    for (const auto& step : plan) {
      std::vector<BatchEntry> entries;
      for (auto [i, n] : step) {
        SeqKV& s = seqs[size_t(i)];
        const int64_t p = s.size();
        entries.push_back({&s, seq_tokens[size_t(i)]->data() + p, n, LogitsWanted::all, logits[size_t(i)].data() + size_t(p) * V});
      }
      fwd.step(entries.data(), int(entries.size()));
    }
    for (int i = 0; i < 3; ++i) {
      const auto& toks = *seq_tokens[size_t(i)];
      ASSERT_EQ(seqs[size_t(i)].size(), int64_t(toks.size()));
      const auto one = alone(spec, toks, 16), other = alone(spec, toks, 1);
      // The single path's own rounding: the same sequence in steps of 16 and of 1 token.
      const double own = rel_diff(other, one);
      const double d = rel_diff(logits[size_t(i)], one);
      std::printf("  %-26s seq %d: batched vs alone %.2e (alone, chunk 1 vs 16: %.2e)\n", method.c_str(), i, d, own);
      EXPECT_LE(d, std::max(4 * own, 1e-5)) << method << " seq " << i;
      for (size_t p = 0; p < toks.size(); ++p) {
        const int a = argmax(logits[size_t(i)].data() + p * V, V), b = argmax(one.data() + p * V, V);
        EXPECT_EQ(a, b) << method << " seq " << i << " position " << p;
      }
    }
  }
}

// Batch invariance past one attention unit (256 tokens, kv_store.cpp): a sequence's logits are
// bit-identical alone in chunks of 1 and of 64 tokens, on 1 and 2 threads, and decoded in a batch
// beside another sequence of another length. The keys are split over threads only in some of
// these runs (few entries and heads), never in others, so this also checks that the split and
// the unsplit walks merge the units by the same operations.
TEST(Batch, LongSequencesAreBatchInvariantAcrossUnitsThreadsAndChunks) {
  Tiny& t = Tiny::get();
  const Model& m = *t.model;
  const int V = m.config().n_vocab, n = 600, n_other = 300, steps = 6;
  const std::vector<int32_t> A = random_tokens(n + steps, V, 21), O = random_tokens(n_other + steps, V, 22);
  const int saved = num_threads();
  for (const std::string& method : {std::string("fp16"), std::string("q8_0"), std::string("kivi2,r=32"),
                                    std::string("vecinfer:d4b8,r=32")}) {
    const KVSpec spec = t.spec(method);
    std::vector<std::vector<float>> runs;
    for (int threads : {1, 2}) {
      set_num_threads(threads);
      for (int chunk : {1, 64}) runs.push_back(alone(spec, A, chunk));
    }
    set_num_threads(saved);
    for (size_t r = 1; r < runs.size(); ++r) EXPECT_EQ(runs[r], runs[0]) << method << " run " << r;
    // Batched: A's prompt and O's prompt prefilled together, then both decoded together.
    auto store = make_kv_store(m, spec);
    Forward fwd(m, *store);
    SeqKV a = store->new_sequence(), o = store->new_sequence();
    std::vector<float> la(size_t(n + steps) * V), lo(size_t(n_other + steps) * V);
    BatchEntry pre[2] = {{&a, A.data(), n, LogitsWanted::all, la.data()},
                         {&o, O.data(), n_other, LogitsWanted::all, lo.data()}};
    fwd.step(pre, 2);
    for (int s = 0; s < steps; ++s) {
      BatchEntry dec[2] = {{&a, A.data() + n + s, 1, LogitsWanted::all, la.data() + size_t(n + s) * V},
                           {&o, O.data() + n_other + s, 1, LogitsWanted::all, lo.data() + size_t(n_other + s) * V}};
      fwd.step(dec, 2);
    }
    EXPECT_EQ(la, runs[0]) << method << ": batched differs from alone";
  }
}

TEST(Batch, GreedyDecodeBatchedEqualsAlone) {
  Tiny& t = Tiny::get();
  const Model& m = *t.model;
  const int V = m.config().n_vocab, steps = 40;
  const std::vector<std::vector<int32_t>> prompts = {random_tokens(70, V, 4), random_tokens(3, V, 5),
                                                     random_tokens(120, V, 6)};
  for (const std::string& method : engine_test::all_methods()) {
    const KVSpec spec = t.spec(method);
    // alone
    std::vector<std::vector<int32_t>> want;
    for (const auto& p : prompts) {
      Session s(m, spec, int(p.size()) + steps);
      std::vector<float> lg(static_cast<size_t>(V));
      s.forward(p.data(), int(p.size()), lg.data());
      std::vector<int32_t> out;
      for (int i = 0; i < steps; ++i) {
        out.push_back(argmax(lg.data(), V));
        s.forward(&out.back(), 1, lg.data());
      }
      want.push_back(out);
    }
    // batched: all three prefill together, then decode together
    auto store = make_kv_store(m, spec);
    Forward fwd(m, *store);
    std::vector<SeqKV> seqs;
    std::vector<std::vector<float>> lg(3, std::vector<float>(static_cast<size_t>(V)));
    std::vector<BatchEntry> e;
    for (int i = 0; i < 3; ++i) seqs.push_back(store->new_sequence());
    for (int i = 0; i < 3; ++i)
      e.push_back({&seqs[size_t(i)], prompts[size_t(i)].data(), int(prompts[size_t(i)].size()), LogitsWanted::last,
                   lg[size_t(i)].data()});
    fwd.step(e.data(), 3);
    std::vector<std::vector<int32_t>> got(3);
    for (int s = 0; s < steps; ++s) {
      e.clear();
      for (int i = 0; i < 3; ++i) {
        got[size_t(i)].push_back(argmax(lg[size_t(i)].data(), V));
        e.push_back({&seqs[size_t(i)], &got[size_t(i)].back(), 1, LogitsWanted::last, lg[size_t(i)].data()});
      }
      fwd.step(e.data(), 3);
    }
    for (int i = 0; i < 3; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << method << " sequence " << i;
  }
}

TEST(Batch, PrefixSharingGivesTheSameLogits) {
  Tiny& t = Tiny::get();
  const Model& m = *t.model;
  const int V = m.config().n_vocab;
  const auto prefix = random_tokens(100, V, 7), s1 = random_tokens(60, V, 8), s2 = random_tokens(45, V, 9);
  for (const std::string& method : engine_test::all_methods()) {
    const KVSpec spec = t.spec(method);
    auto store = make_kv_store(m, spec);
    Forward fwd(m, *store);
    SeqKV a = store->new_sequence();
    std::vector<float> tmp(static_cast<size_t>(V));
    BatchEntry e{&a, prefix.data(), int(prefix.size()), LogitsWanted::last, tmp.data()};
    fwd.step(&e, 1);
    const size_t before = store->pool().used_bytes();
    SeqKV b = store->fork(a);  // shares every block of the prefix
    EXPECT_EQ(store->pool().used_bytes(), before) << method;
    // a continues with s1, b with s2, in the same steps
    std::vector<float> la(s1.size() * size_t(V)), lb(s2.size() * size_t(V));
    BatchEntry both[2] = {{&a, s1.data(), int(s1.size()), LogitsWanted::all, la.data()},
                          {&b, s2.data(), int(s2.size()), LogitsWanted::all, lb.data()}};
    fwd.step(both, 2);
    // reference: no sharing, each whole sequence alone
    auto full = [&](const std::vector<int32_t>& suf) {
      std::vector<int32_t> all = prefix;
      all.insert(all.end(), suf.begin(), suf.end());
      auto lg = alone(spec, all, 64);
      return std::vector<float>(lg.begin() + prefix.size() * size_t(V), lg.end());
    };
    const auto ra = full(s1), rb = full(s2);
    const auto own = full(s1);
    EXPECT_LE(rel_diff(la, ra), 1e-5) << method;
    EXPECT_LE(rel_diff(lb, rb), 1e-5) << method;
    // The shared blocks are stored once: less than two independent copies of the prefix.
    SeqKV c = store->new_sequence();
    BatchEntry ec{&c, prefix.data(), int(prefix.size()), LogitsWanted::none, nullptr};
    const size_t before_c = store->pool().used_bytes();
    fwd.step(&ec, 1);
    EXPECT_GT(store->pool().used_bytes() - before_c, 0u);
    (void)own;
  }
}

TEST(Batch, ForkRefusesAPointWhoseWindowIsGone) {
  Tiny& t = Tiny::get();
  const Model& m = *t.model;
  const KVSpec spec = t.spec("vecinfer:d4b8,r=32");
  auto store = make_kv_store(m, spec);
  Forward fwd(m, *store);
  SeqKV a = store->new_sequence();
  const auto toks = random_tokens(200, m.config().n_vocab, 10);
  BatchEntry e{&a, toks.data(), 200, LogitsWanted::none, nullptr};
  fwd.step(&e, 1);
  EXPECT_NO_THROW(store->fork(a, 200));
  // query 195 reads codes below 160 and fp16 from there: still held (the step's last query, 199,
  // read the same); query 190 would read fp16 from 128, released once 199 read those as codes
  EXPECT_NO_THROW(store->fork(a, 195));
  EXPECT_THROW(store->fork(a, 190), Error);
  try {
    store->fork(a, 40);  // its fp16 window was released when the sequence moved on
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("no longer holds the fp16 form"), std::string::npos) << err.what();
  }
}

namespace {
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUnderAddressSanitizer = true;
#else
constexpr bool kUnderAddressSanitizer = false;
#endif

// Resident bytes at base-page granularity: where transparent huge pages are "always" (a
// machine setting), one touched byte of a heap region makes 2 MiB resident and the resident set says
// nothing about the pool, so the measuring process opts out of them (PR_SET_THP_DISABLE).
int64_t rss_bytes() {
  static const bool thp_off = prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0;
  (void)thp_off;
  std::ifstream f("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  f >> pages >> resident;
  return resident * 4096;
}
}  // namespace

TEST(Pool, NeverExceedsItsBudgetAndRunningOutChangesNothing) {
  Tiny& t = Tiny::get();
  const Model& m = *t.model;
  const int V = m.config().n_vocab;
  for (const std::string& method : {std::string("fp16"), std::string("vecinfer:d4b8,r=32"), std::string("q4_0")}) {
    const KVSpec spec = t.spec(method);
    const size_t budget = size_t(2) << 20;  // 2 MiB
    auto store = make_kv_store(m, spec, budget);
    Forward fwd(m, *store);
    // Sequences of 240 tokens until the pool refuses one; the refused step changes nothing.
    std::vector<SeqKV> seqs;
    const auto toks = random_tokens(240, V, 12);
    std::vector<float> lg(static_cast<size_t>(V));
    const int64_t rss0 = rss_bytes();
    bool refused = false;
    for (int i = 0; i < 200 && !refused; ++i) {
      seqs.push_back(store->new_sequence());
      for (int p = 0; p < 240 && !refused; p += 60) {
        BatchEntry e{&seqs.back(), toks.data() + p, 60, LogitsWanted::last, lg.data()};
        const size_t used = store->pool().used_bytes();
        try {
          fwd.step(&e, 1);
        } catch (const KVPoolExhausted& err) {
          refused = true;
          EXPECT_EQ(store->pool().used_bytes(), used) << method;
          EXPECT_EQ(seqs.back().size(), p) << method;
          EXPECT_NE(std::string(err.what()).find("budget"), std::string::npos);
        }
        EXPECT_LE(store->pool().used_bytes(), budget) << method;
      }
    }
    ASSERT_TRUE(refused) << method << ": 2 MiB never ran out";
    EXPECT_LE(store->pool().peak_bytes(), budget);
    // resident memory follows the pool (allocator slack and the step's scratch aside); not under
    // AddressSanitizer, whose quarantine of freed memory and shadow pages grow the resident set
    // by tens of MiB whatever the program holds (the pool accounting above is checked there too)
    if (!kUnderAddressSanitizer) {
      EXPECT_LT(rss_bytes() - rss0, int64_t(budget) + (int64_t(6) << 20)) << method;
    }
    // the other sequences go on as if nothing happened: the first one's next token matches a
    // fresh run of the same tokens
    std::vector<float> l1(static_cast<size_t>(V));
    const int32_t next = 5;
    BatchEntry e{&seqs[0], &next, 1, LogitsWanted::last, l1.data()};
    store->release(seqs.back());
    fwd.step(&e, 1);
    std::vector<int32_t> all(toks);
    all.push_back(next);
    const auto ref = alone(spec, all, 60);
    EXPECT_LE(rel_diff(l1, std::vector<float>(ref.end() - V, ref.end())), 1e-5) << method;
  }
}

TEST(Pool, BlockTablesSurviveSequencesEndingInAnyOrder) {
  Tiny& t = Tiny::get();
  const Model& m = *t.model;
  const int V = m.config().n_vocab;
  const KVSpec spec = t.spec("vecinfer:d4b8,r=32");
  std::mt19937 rng(13);
  for (int round = 0; round < 3; ++round) {
    auto store = make_kv_store(m, spec);
    Forward fwd(m, *store);
    const int N = 6;
    std::vector<SeqKV> seqs;
    std::vector<std::vector<int32_t>> toks;
    std::vector<BatchEntry> e;
    for (int i = 0; i < N; ++i) {
      seqs.push_back(store->new_sequence());
      toks.push_back(random_tokens(20 + 37 * i, V, 100 + uint64_t(i)));
    }
    if (round == 1) seqs.push_back(store->fork(seqs[0]));  // an empty fork
    for (int i = 0; i < N; ++i) e.push_back({&seqs[size_t(i)], toks[size_t(i)].data(), int(toks[size_t(i)].size()), LogitsWanted::none, nullptr});
    fwd.step(e.data(), N);
    std::vector<int> order(N);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<bool> alive(N, true);
    for (int k = 0; k < N; ++k) {
      store->release(seqs[size_t(order[size_t(k)])]);
      alive[size_t(order[size_t(k)])] = false;
      // every survivor takes one more token; its logits match the same tokens run alone
      std::vector<BatchEntry> step;
      std::vector<std::vector<float>> lg;
      const int32_t next = int32_t(k + 1);
      for (int i = 0; i < N; ++i)
        if (alive[size_t(i)]) lg.emplace_back(size_t(V));
      size_t j = 0;
      for (int i = 0; i < N; ++i)
        if (alive[size_t(i)]) step.push_back({&seqs[size_t(i)], &next, 1, LogitsWanted::last, lg[j++].data()});
      if (!step.empty()) fwd.step(step.data(), int(step.size()));
      j = 0;
      for (int i = 0; i < N; ++i) {
        if (!alive[size_t(i)]) continue;
        toks[size_t(i)].push_back(next);
        const auto ref = alone(spec, toks[size_t(i)], 64);
        EXPECT_LE(rel_diff(lg[j++], std::vector<float>(ref.end() - V, ref.end())), 1e-5) << "round " << round << " seq " << i;
      }
    }
    seqs.clear();
    EXPECT_EQ(store->pool().used_bytes(), 0u);
  }
}
