// Two sessions of one model on two threads at once (the thread pool's contract,
// core/thread_pool.h): both finish, and each produces exactly the logits it produces alone.
// The weights are large enough that the products split across the pool's threads.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_pool.h"
#include "kvcache/factory.h"
#include "model/model.h"
#include "model/session.h"
#include "model/test_forward_tiny.h"

namespace {

std::vector<float> run_session(const vq::Model& m, const std::string& spec, const std::vector<int32_t>& tokens) {
  vq::Session s(m, vq::make_kv_spec(vq::parse_kv_cache_spec(spec)), int(tokens.size()) + 1, 8);
  const int V = m.config().n_vocab;
  std::vector<float> out(tokens.size() * size_t(V));  // out: [n_tokens, n_vocab], prefill then decode rows
  s.forward(tokens.data(), 12, out.data(), true);
  for (size_t i = 12; i < tokens.size(); ++i) s.forward(&tokens[i], 1, out.data() + i * size_t(V));
  return out;
}

TEST(ConcurrentSessions, TwoThreadsGiveTheSameLogitsAsAlone) {
  vq::test::TinySpec s;
  s.n_embd = 256, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 64, s.n_ff = 1024, s.n_vocab = 512;
  const auto m = vq::Model::load(vq::test::write_tiny_model(s, vq::test::tiny_path("concurrent")));
  std::mt19937 rng(5);
  std::vector<int32_t> a(40), b(40);
  for (auto& t : a) t = int32_t(rng() % 512);
  for (auto& t : b) t = int32_t(rng() % 512);
  const int saved = vq::num_threads();
  vq::set_num_threads(2);
  const auto alone_a = run_session(*m, "fp16", a);
  const auto alone_b = run_session(*m, "q8_0", b);
  for (int round = 0; round < 3; ++round) {
    std::vector<float> got_a, got_b;
    std::thread ta([&] { got_a = run_session(*m, "fp16", a); });
    std::thread tb([&] { got_b = run_session(*m, "q8_0", b); });
    ta.join();
    tb.join();
    // Same pool size, same split of every product: bit-identical, not merely close.
    EXPECT_EQ(got_a, alone_a) << "round " << round;
    EXPECT_EQ(got_b, alone_b) << "round " << round;
  }
  vq::set_num_threads(saved);
}

}  // namespace
