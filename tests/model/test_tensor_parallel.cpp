// Tensor parallelism (issue 25, model/tensor_parallel.h) on the CPU's simulated ranks: the split
// plan and its refusals, the in-order all-reduce, the calibration slice, and the split forward's
// logits against the unsplit forward's on tiny random models (llama with GQA, qwen2 with q/k/v
// biases, gemma3 with post-norms and sliding windows) at tp = 1 (bit for bit), 2 and a tp that
// replicates KV heads, with fp32, fp16 and VecInfer caches; greedy tokens at tp 2 equal tp 1's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "codec/calibration_file.h"
#include "core/error.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "model/model.h"
#include "model/session.h"
#include "model/tensor_parallel.h"
#include "model/test_forward_tiny.h"
#include "model/test_tp_util.h"
#include "kvcache/kv_identity.h"
#include "kvcache/seq_file.h"

namespace vq::test {
namespace {


TEST(TPPlan, SplitsHeadsAndColumns) {
  // Llama-3.1-8B's geometry at tp 2: 16 query heads, 4 KV heads, 7168 MLP columns per rank.
  const TPPlan p = make_tp_plan(32, 8, 14336, 2);
  ASSERT_EQ(p.ranks.size(), 2u);
  EXPECT_EQ(p.kv_replicas, 1);
  EXPECT_EQ(p.ranks[1].q_heads.begin, 16);
  EXPECT_EQ(p.ranks[1].q_heads.count, 16);
  EXPECT_EQ(p.ranks[1].kv_heads.begin, 4);
  EXPECT_EQ(p.ranks[1].kv_heads.count, 4);
  EXPECT_EQ(p.ranks[1].ff.begin, 7168);
  EXPECT_EQ(p.ranks[1].ff.count, 7168);
  // tp 16 > 8 KV heads: each KV head on 2 ranks, each rank 2 query heads of its group.
  const TPPlan r = make_tp_plan(32, 8, 14336, 16);
  EXPECT_EQ(r.kv_replicas, 2);
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(r.ranks[size_t(i)].kv_heads.begin, i / 2);
    EXPECT_EQ(r.ranks[size_t(i)].kv_heads.count, 1);
    EXPECT_EQ(r.ranks[size_t(i)].q_heads.begin, 2 * i);
  }
  // tp 1: everything on rank 0.
  const TPPlan one = make_tp_plan(6, 2, 96, 1);
  EXPECT_EQ(one.ranks[0].q_heads.count, 6);
  EXPECT_EQ(one.ranks[0].kv_heads.count, 2);
  EXPECT_EQ(one.ranks[0].ff.count, 96);
}

TEST(TPPlan, ImpossibleSplitsNameWhatDoesNotDivide) {
  EXPECT_NE(error_of([] { make_tp_plan(32, 8, 14336, 0); }).find("--tp: 0 must be >= 1"), std::string::npos);
  EXPECT_NE(error_of([] { make_tp_plan(32, 8, 14336, -2); }).find("must be >= 1"), std::string::npos);
  EXPECT_NE(error_of([] { make_tp_plan(32, 8, 14336, 3); }).find("32 attention heads"), std::string::npos);
  EXPECT_NE(error_of([] { make_tp_plan(32, 8, 100, 8); }).find("intermediate size 100"), std::string::npos);
  // 12 query heads, 6 KV heads over 4 ranks: the heads divide, the KV heads do not.
  EXPECT_NE(error_of([] { make_tp_plan(12, 6, 96, 4); }).find("6 KV heads"), std::string::npos);
  // 6 query heads, 2 KV heads over 3 ranks: more ranks than KV heads, not a multiple.
  EXPECT_NE(error_of([] { make_tp_plan(6, 2, 96, 3); }).find("not a multiple of 2"), std::string::npos);
  EXPECT_NE(error_of([] { make_tp_plan(6, 4, 96, 2); }).find("grouped-query"), std::string::npos);
}

TEST(TPCommunicator, SumsInRankOrderOnEveryRank) {
  LocalCommunicator c(3);
  // (1e8 + 1) - 1e8 in float: 0 in rank order (1e8 + 1 rounds to 1e8); another order gives 1.
  std::vector<float> a = {1e8f, 2.0f}, b = {1.0f, 3.0f}, d = {-1e8f, -4.0f};
  float* bufs[3] = {a.data(), b.data(), d.data()};
  c.all_reduce_sum(bufs, 2);
  for (const auto* v : {&a, &b, &d}) {
    EXPECT_EQ((*v)[0], 0.0f);
    EXPECT_EQ((*v)[1], 1.0f);
  }
  EXPECT_THROW(LocalCommunicator(0), Error);
}

TEST(TPCalibration, SliceKeepsTheHeadsArrays) {
  const KVCacheConfig cfg = parse_kv_cache_spec("vecinfer:d4b8");
  const Calibration c = random_calibration(cfg, 2, 4, 16, 5);
  const Calibration s = slice_calibration(c, 1, 2);
  EXPECT_EQ(s.n_kv_heads, 2);
  for (int l = 0; l < 2; ++l) {
    const auto& a = c.layers[size_t(l)].key_codebooks;
    const auto& b = s.layers[size_t(l)].key_codebooks;
    const size_t per = a.size() / 4;
    ASSERT_EQ(b.size(), 2 * per);
    EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin() + ptrdiff_t(per)));
    const auto& sa = c.layers[size_t(l)].smoothing;
    const auto& sb = s.layers[size_t(l)].smoothing;
    EXPECT_TRUE(std::equal(sb.begin(), sb.end(), sa.begin() + 16));
  }
  EXPECT_THROW(slice_calibration(c, 3, 2), Error);
}

struct TPCase {
  std::string name;
  TinySpec spec;
  std::vector<int> tps;  // besides 1; the last replicates KV heads
};

std::vector<TPCase> cases() {
  std::vector<TPCase> v;
  TinySpec l;  // llama, GQA 4 query / 2 KV heads; q8_0 (blocks of 32 = one head, a quarter of the MLP)
  l.n_embd = 128, l.n_heads = 4, l.n_kv_heads = 2, l.head_dim = 32, l.n_ff = 128, l.n_vocab = 97;
  l.write_key_length = true, l.wtype = GGMLType::Q8_0, l.seed = 3;
  v.push_back({"llama_q8_0", l, {2, 4}});
  TinySpec q = l;  // qwen2 with q/k/v biases, q4_0 weights
  q.arch = "qwen2", q.bias = true, q.wtype = GGMLType::Q4_0, q.seed = 4;
  v.push_back({"qwen2_bias_q4_0", q, {2, 4}});
  TinySpec g;  // gemma3: post-norms, sliding-window layers, one KV head (tp 2 replicates it); f32
  g.arch = "gemma3", g.n_layers = 3, g.n_embd = 64, g.n_heads = 4, g.n_kv_heads = 1, g.head_dim = 16, g.n_ff = 96;
  g.write_key_length = true, g.sliding_window = 8, g.swa_pattern = 2, g.tied = true, g.wtype = GGMLType::F32;
  v.push_back({"gemma3_f32", g, {2}});
  TinySpec k;  // q4_K (packed 256-column units), one KV head: tp 2 replicates it and splits wo at 256
  k.n_embd = 256, k.n_heads = 4, k.n_kv_heads = 1, k.head_dim = 128, k.n_ff = 512, k.n_vocab = 97;
  k.write_key_length = true, k.wtype = GGMLType::Q4_K, k.seed = 6;
  v.push_back({"llama_q4_K", k, {2}});
  TinySpec q3;  // qwen3: per-head q/k norms; f16 weights
  q3.arch = "qwen3", q3.qk_norm = true, q3.n_embd = 64, q3.n_heads = 4, q3.n_kv_heads = 2, q3.head_dim = 16;
  q3.n_ff = 96, q3.wtype = GGMLType::F16, q3.seed = 7;
  v.push_back({"qwen3_qknorm_f16", q3, {2, 4}});
  return v;
}

KVSpec spec_of(const Model& m, const std::string& name) { return tp_spec_of(m, name); }

// All logits of a 40-token prompt in chunks of 16, then 24 single decode steps (64 positions: the
// VecInfer cache with r=0 codes the first blocks), through a session at the given tp.
std::vector<float> logits_at(const Model& m, const KVSpec& spec, int tp) {
  return tp_logits_at(m, spec, tp, KVDevice::cpu, 64, 40);
}

class TPForwardCases : public ::testing::TestWithParam<TPCase> {};

TEST_P(TPForwardCases, SplitLogitsEqualUnsplit) {
  const TPCase& c = GetParam();
  const auto m = Model::load(write_tiny_model(c.spec, tiny_path("tp_" + c.name)));
  const bool float_weights = c.spec.wtype == GGMLType::F32 || c.spec.wtype == GGMLType::F16;
  for (const char* kv : {"fp32", "fp16", "vecinfer:d4b8,r=0,sink=0"}) {
    const KVSpec spec = spec_of(*m, kv);
    const std::vector<float> ref = logits_at(*m, spec, 1);  // tp 1: the unsplit Forward
    {
      TPForward one(*m, spec, 1);  // the split path at tp 1: the model's own matrices
      TPSequence seq = one.new_sequence();
      const int V = m->config().n_vocab;
      std::mt19937_64 rng(17);
      std::vector<int32_t> toks(40);
      for (auto& t : toks) t = int32_t(rng() % uint64_t(V));
      std::vector<float> out(size_t(40) * V);
      for (int i = 0; i < 40; i += 16) {
        TPBatchEntry e{&seq, toks.data() + i, std::min(16, 40 - i), true, out.data() + size_t(i) * V};
        one.step(&e, 1);
      }
      EXPECT_EQ(std::memcmp(out.data(), ref.data(), out.size() * sizeof(float)), 0)
          << c.name << " " << kv << ": the split path at tp 1 differs from the unsplit forward";
    }
    for (int tp : c.tps) {
      const std::vector<float> got = logits_at(*m, spec, tp);
      // Per position: max |split - unsplit| over the vocabulary, relative to the largest logit.
      const int V = m->config().n_vocab, n = int(ref.size()) / V;
      double scale = 0, worst = 0;
      for (float x : ref) scale = std::max(scale, double(std::fabs(x)));
      int off = 0;  // positions beyond float rounding
      for (int r = 0; r < n; ++r) {
        double d = 0;
        for (int j = 0; j < V; ++j) {
          const size_t k = size_t(r) * V + size_t(j);
          ASSERT_TRUE(std::isfinite(got[k]));
          d = std::max(d, double(std::fabs(got[k] - ref[k])));
        }
        worst = std::max(worst, d / scale);
        off += d / scale > 1e-5;
      }
      std::printf("[ %s %s tp %d ] rel. max diff vs unsplit %.2e, %d of %d positions beyond 1e-5\n", c.name.c_str(),
                  kv, tp, worst, off, n);
      // Only the order of the sums differs (one dot product over all columns vs the ranks'
      // partial dots added in rank order): with float weights, float rounding at every position
      // (measured <= 3e-7), whatever the cache. With quantized weights each product quantizes its
      // input rows to int8, and a last-bit change can flip one code; a flip at position p of an
      // early layer changes the K/V that p writes to the later layers, which every later position
      // reads, whatever the cache. How many positions move is then a matter of where the first
      // flip lands (measured on q4_K: 1-2 of 64 on an AVX-512 host, 28 on an AVX2 host with an
      // fp32 cache; 12-48 with fp16 or VecInfer), so only the size is bounded: flips move logits
      // by up to ~1e-2 of the largest, a wrong split by O(1).
      if (float_weights) {
        EXPECT_EQ(off, 0) << c.name << " " << kv << " tp " << tp;
      }
      EXPECT_LT(worst, float_weights ? 1e-5 : 2e-2) << c.name << " " << kv << " tp " << tp;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Tiny, TPForwardCases, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

TEST(TPForward, GreedyTokensAtTp2EqualTp1) {
  const TPCase c = cases()[1];  // qwen2 with biases
  const auto m = Model::load(write_tiny_model(c.spec, tiny_path("tp_greedy")));
  const KVSpec spec = spec_of(*m, "fp16");
  const int V = m->config().n_vocab;
  auto greedy = [&](int tp) {
    Session s(*m, spec, 64, 16, size_t(-1), KVDevice::cpu, tp);
    std::vector<int32_t> ids = {1, 5, 9, 13, 17, 21, 25};
    std::vector<float> logits(static_cast<size_t>(V));
    s.forward(ids.data(), int(ids.size()), logits.data());
    for (int i = 0; i < 30; ++i) {
      const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ids.push_back(next);
      s.forward(&next, 1, logits.data());
    }
    return ids;
  };
  const auto a = greedy(1), b = greedy(2);
  EXPECT_EQ(a, b);
  // Not a constant sequence: the comparison means something.
  EXPECT_GT(std::set<int32_t>(a.begin() + 7, a.end()).size(), 3u);
}

TEST(TPForward, BatchedStepEqualsSingleSteps) {
  const TPCase c = cases()[0];  // llama q8_0 at tp 4 (KV heads replicated)
  const auto m = Model::load(write_tiny_model(c.spec, tiny_path("tp_batch")));
  const KVSpec spec = spec_of(*m, "fp32");
  const int V = m->config().n_vocab;
  const std::vector<int32_t> a = {3, 8, 13, 21, 34, 55, 89}, b = {2, 7, 1, 8, 28};
  // Both sequences in one step (7 + 5 rows), then each alone in its own forward.
  TPForward both(*m, spec, 4);
  TPSequence sa = both.new_sequence(), sb = both.new_sequence();
  std::vector<float> la(a.size() * size_t(V)), lb(b.size() * size_t(V));
  const TPBatchEntry e[2] = {{&sa, a.data(), int(a.size()), true, la.data()},
                             {&sb, b.data(), int(b.size()), false, lb.data()}};
  both.step(e, 2);
  EXPECT_EQ(sa.size(), 7);
  EXPECT_EQ(sb.size(), 5);
  TPForward one(*m, spec, 4);
  TPSequence s1 = one.new_sequence(), s2 = one.new_sequence();
  std::vector<float> ra(a.size() * size_t(V)), rb(static_cast<size_t>(V));
  TPBatchEntry x{&s1, a.data(), int(a.size()), true, ra.data()};
  one.step(&x, 1);
  TPBatchEntry y{&s2, b.data(), int(b.size()), false, rb.data()};
  one.step(&y, 1);
  // A row's products do not depend on the other rows of the step (model/matmul_packed.h).
  EXPECT_EQ(std::memcmp(la.data(), ra.data(), la.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(lb.data(), rb.data(), rb.size() * sizeof(float)), 0);
  // Misuse: a repeated sequence, a token out of range.
  const TPBatchEntry rep[2] = {{&sa, a.data(), 1, false, nullptr}, {&sa, a.data(), 1, false, nullptr}};
  EXPECT_THROW(both.step(rep, 2), Error);
  const int32_t bad = V;
  TPBatchEntry z{&sa, &bad, 1, false, nullptr};
  EXPECT_THROW(both.step(&z, 1), Error);
  EXPECT_EQ(sa.size(), 7);  // nothing changed
}

TEST(TPForward, RefusalsNameTheProblem) {
  TinySpec k;  // q4_K weights: blocks of 256 columns
  k.n_embd = 256, k.n_heads = 4, k.n_kv_heads = 2, k.head_dim = 128, k.n_ff = 512, k.write_key_length = true;
  k.wtype = GGMLType::Q4_K, k.n_layers = 1;
  const auto m = Model::load(write_tiny_model(k, tiny_path("tp_refuse")));
  const KVSpec spec = spec_of(*m, "fp16");
  // tp 2: attn_output splits at column 256 (one block), the MLP at 256: allowed.
  EXPECT_NO_THROW(Session(*m, spec, 8, 8, size_t(-1), KVDevice::cpu, 2));
  // tp 4: attn_output would split at column 128, inside a q4_K block.
  const std::string e4 = error_of([&] { Session(*m, spec, 8, 8, size_t(-1), KVDevice::cpu, 4); });
  EXPECT_NE(e4.find("attn_output.weight"), std::string::npos) << e4;
  EXPECT_NE(e4.find("block boundaries"), std::string::npos) << e4;
  EXPECT_NE(error_of([&] { Session(*m, spec, 8, 8, size_t(-1), KVDevice::cpu, 3); }).find("4 attention heads"),
            std::string::npos);
  EXPECT_NE(error_of([&] { Session(*m, spec, 8, 8, size_t(-1), KVDevice::cpu, 0); }).find("--tp: 0"),
            std::string::npos);
  // The device split: without a usable GPU one line saying so (tests/model/test_tensor_parallel_device.cpp
  // runs it on the GPU).
  const std::string ec = error_of([&] { Session(*m, spec, 8, 8, size_t(-1), KVDevice::cuda, 2); });
  if (!ec.empty()) {
    EXPECT_NE(ec.find("--tp 2 --device cuda"), std::string::npos) << ec;
  }
  // Session files and observers need the unsplit store.
  Session s(*m, spec, 8, 8, size_t(-1), KVDevice::cpu, 2);
  EXPECT_NE(error_of([&] { s.store(); }).find("tensor parallelism"), std::string::npos);
  EXPECT_THROW(s.forward_pass(), Error);
  // Each rank's store holds its own heads only.
  ASSERT_NE(s.tensor_parallel(), nullptr);
  EXPECT_EQ(s.tensor_parallel()->store(1).geometry().n_kv_heads, 1);
  EXPECT_EQ(s.tensor_parallel()->store(1).geometry().n_heads, 2);
}

// A split session file: saved at tp 2 and read back into fresh ranks, the continuation's logits
// equal an uninterrupted run's bit for bit; a file read with another rank count, a plain file, a
// flipped byte and a pool too small are refused, the last having taken no block of any rank.
TEST(TPForward, SessionFileOverRanksContinuesExactly) {
  const TPCase c = cases()[1];  // qwen2 with biases, 4 query / 2 KV heads
  const std::string model_path = write_tiny_model(c.spec, tiny_path("tp_session"));
  const auto m = Model::load(model_path);
  const KVSpec spec = spec_of(*m, "vecinfer:d4b8,r=0,sink=0");
  const int V = m->config().n_vocab;
  std::vector<int32_t> toks(48);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = int32_t((i * 29 + 3) % size_t(V));
  auto ids_of = [&](TPForward& f) {
    std::vector<KVIdentity> ids;
    for (int r = 0; r < f.tp(); ++r) ids.push_back(kv_identity(f.store(r), model_path));
    return ids;
  };
  auto stores_of = [](TPForward& f) {
    std::vector<KVStore*> v;
    for (int r = 0; r < f.tp(); ++r) v.push_back(&f.store(r));
    return v;
  };
  std::vector<float> whole(static_cast<size_t>(V)), cont(static_cast<size_t>(V));
  TPForward a(*m, spec, 2);
  TPSequence sa = a.new_sequence();
  TPBatchEntry e{&sa, toks.data(), 40, false, whole.data()};
  a.step(&e, 1);
  const std::string path = tiny_path("tp_session_file") + ".vqkv";
  {
    std::vector<const KVStore*> kv = {&a.store(0), &a.store(1)};
    std::vector<const SeqKV*> sq = {&sa.ranks[0], &sa.ranks[1]};
    save_tp_sequence(path, kv, sq, std::vector<int32_t>(toks.begin(), toks.begin() + 40), ids_of(a));
  }
  for (int i = 40; i < 48; ++i) {
    TPBatchEntry d{&sa, &toks[size_t(i)], 1, false, whole.data()};
    a.step(&d, 1);
  }
  TPForward b(*m, spec, 2);
  std::vector<LoadedSequence> ld = load_tp_sequence(path, stores_of(b), ids_of(b));
  ASSERT_EQ(ld.size(), 2u);
  EXPECT_EQ(ld[0].n_kv, 40);
  TPSequence sb;
  for (auto& l : ld) sb.ranks.push_back(std::move(l.seq));
  for (int i = 40; i < 48; ++i) {
    TPBatchEntry d{&sb, &toks[size_t(i)], 1, false, cont.data()};
    b.step(&d, 1);
  }
  EXPECT_EQ(std::memcmp(whole.data(), cont.data(), whole.size() * sizeof(float)), 0);
  // refusals
  TPForward four(*m, spec, 4);
  EXPECT_NE(error_of([&] { load_tp_sequence(path, stores_of(four), ids_of(four)); }).find("this session has 4"),
            std::string::npos);
  EXPECT_NE(error_of([&] { load_sequence(path, b.store(0), ids_of(b)[0]); }).find("load it with --tp 2"),
            std::string::npos);
  {
    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bytes[bytes.size() / 2] ^= 1;
    std::ofstream(path + ".bad", std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  }
  EXPECT_THROW(load_tp_sequence(path + ".bad", stores_of(b), ids_of(b)), SessionFileError);
  // A forged table (each field of the split header and part table), with the trailer rewritten or
  // not: refused with SessionFileError, nothing read past the file.
  {
    std::ifstream in(path, std::ios::binary);
    const std::vector<uint8_t> good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto forged = [&](size_t off, uint64_t value, int bytes) {
      std::vector<uint8_t> f = good;
      std::memcpy(f.data() + off, &value, size_t(bytes));
      std::ofstream(path + ".forged", std::ios::binary).write(reinterpret_cast<const char*>(f.data()),
                                                              std::streamsize(f.size()));
      return error_of([&] {
        try {
          load_tp_sequence(path + ".forged", stores_of(b), ids_of(b));
        } catch (const SessionFileError& e) {
          throw Error(e.what());
        }
      });
    };
    EXPECT_NE(forged(8, 7, 4).find("version 7"), std::string::npos);                  // version
    EXPECT_NE(forged(12, 3, 4).find("split over 3"), std::string::npos);              // tp
    EXPECT_NE(forged(16, good.size() + 1, 8).find("declares"), std::string::npos);    // file bytes
    EXPECT_NE(forged(24, uint64_t(1) << 62, 8).find("runs past"), std::string::npos);  // part 0 bytes
    EXPECT_NE(forged(24, 8, 8).find("runs past"), std::string::npos);                  // shorter than a header
    EXPECT_NE(forged(32, 100, 8).find("rank 1"), std::string::npos);                  // part 1 bytes
    EXPECT_NE(forged(0, 0, 8).find("bad magic"), std::string::npos);
  }
  TPForward tiny_pool(*m, spec, 2, size_t(1) << 10);
  const size_t used0 = tiny_pool.store(0).pool().used_bytes(), used1 = tiny_pool.store(1).pool().used_bytes();
  EXPECT_THROW(load_tp_sequence(path, stores_of(tiny_pool), ids_of(tiny_pool)), KVPoolExhausted);
  EXPECT_EQ(tiny_pool.store(0).pool().used_bytes(), used0);
  EXPECT_EQ(tiny_pool.store(1).pool().used_bytes(), used1);
  a.release(sa);
  b.release(sb);
}

}  // namespace
}  // namespace vq::test
