// Forward pass on tiny random models of every supported variant: a batched prefill (one chunk
// or many) equals token-by-token decode, an fp16 cache stays close to an fp32 one, threads do
// not change results beyond rounding, and misuse throws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/thread_pool.h"
#include "kvcache/factory.h"
#include "model/model.h"
#include "model/session.h"
#include "model/test_forward_tiny.h"
#include "veloxquant/status.h"

namespace {
using vq::test::TinySpec;

struct Variant {
  std::string name;
  TinySpec spec;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  v.push_back({"llama_gqa_q8_0", TinySpec{}});
  TinySpec hd;
  hd.n_heads = 2, hd.n_kv_heads = 1, hd.head_dim = 256, hd.write_key_length = true, hd.wtype = vq::GGMLType::Q4_0;
  v.push_back({"llama_hd256_q4_0", hd});
  TinySpec q2;
  q2.arch = "qwen2", q2.bias = true, q2.wtype = vq::GGMLType::Q4_1, q2.n_kv_heads = 1;
  v.push_back({"qwen2_bias_q4_1", q2});
  TinySpec q3;
  q3.arch = "qwen3", q3.qk_norm = true, q3.wtype = vq::GGMLType::F16, q3.n_heads = 4, q3.n_kv_heads = 4;
  v.push_back({"qwen3_qknorm_f16", q3});
  TinySpec tied;
  tied.tied = true, tied.wtype = vq::GGMLType::Q5_0;
  v.push_back({"llama_tied_q5_0", tied});
  TinySpec l3;
  l3.rope_scaling = "llama3", l3.wtype = vq::GGMLType::F32;
  v.push_back({"llama3_rope_f32", l3});
  // gemma3: 6 layers with the default pattern (layers 0-4 local, 5 global), window 8 < the
  // 29-37 test tokens, head_dim 32 != n_embd / n_heads, one KV head, tied output.
  TinySpec g3;
  g3.arch = "gemma3", g3.n_layers = 6, g3.n_kv_heads = 1, g3.head_dim = 32, g3.write_key_length = true;
  g3.tied = true, g3.wtype = vq::GGMLType::Q8_0;
  v.push_back({"gemma3_q8_0", g3});
  TinySpec g3f;
  g3f.arch = "gemma3", g3f.n_layers = 3, g3f.sliding_window = 5, g3f.swa_pattern = 2, g3f.wtype = vq::GGMLType::F32;
  v.push_back({"gemma3_window5_f32", g3f});
  // q4_K and q6_K weights (widths multiples of 256): the products run on the packed (8-row
  // interleaved) copies of model/matmul_packed.h, with 97 vocabulary rows (a partial group of 8)
  // in the output.
  TinySpec k4;
  k4.n_embd = 256, k4.head_dim = 64, k4.n_ff = 512, k4.wtype = vq::GGMLType::Q4_K;
  v.push_back({"llama_q4_K_packed", k4});
  TinySpec k6 = k4;  // q6_K, tied output (97 rows through the packed product)
  k6.wtype = vq::GGMLType::Q6_K, k6.tied = true;
  v.push_back({"llama_tied_q6_K_packed", k6});
  TinySpec k3 = k4;  // q3_K and q2_K: the packed 2-bit layouts (16-element activation sums)
  k3.wtype = vq::GGMLType::Q3_K;
  v.push_back({"llama_q3_K_packed", k3});
  TinySpec k2 = k4;
  k2.wtype = vq::GGMLType::Q2_K, k2.tied = true;
  v.push_back({"llama_tied_q2_K_packed", k2});
  return v;
}

vq::KVSpec cache(const std::string& spec) { return vq::make_kv_spec(vq::parse_kv_cache_spec(spec), ""); }

std::vector<int32_t> random_tokens(int n, int n_vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint64_t(n_vocab));
  return t;
}

// All logits [n, n_vocab] of `tokens` fed in pieces of `step` tokens per forward call.
std::vector<float> run(const vq::Model& m, const std::string& kv, const std::vector<int32_t>& tokens, int step,
                       int max_chunk = vq::Session::kDefaultChunk) {
  const int V = m.config().n_vocab, n = int(tokens.size());
  vq::Session s(m, cache(kv), n, max_chunk);
  std::vector<float> out(size_t(n) * V);
  for (int i = 0; i < n; i += step) {
    const int k = std::min(step, n - i);
    s.forward(tokens.data() + i, k, out.data() + size_t(i) * V, true);
  }
  EXPECT_EQ(s.pos(), n);
  return out;
}

// max |a - b| / max |b|
double rel_max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_TRUE(std::isfinite(a[i]));
    d = std::max(d, double(std::fabs(a[i] - b[i])));
    m = std::max(m, double(std::fabs(b[i])));
  }
  return d / std::max(m, 1e-30);
}

// ||a - b|| / ||b|| over all elements.
double rel_rms_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += double(a[i] - b[i]) * (a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / std::max(den, 1e-30));
}

class ForwardVariants : public ::testing::TestWithParam<Variant> {};

TEST_P(ForwardVariants, BatchPrefillEqualsTokenByToken) {
  const Variant& v = GetParam();
  const auto m = vq::Model::load(vq::test::write_tiny_model(v.spec, vq::test::tiny_path("fwd_" + v.name)));
  const auto tokens = random_tokens(37, m->config().n_vocab, 7);
  const auto batch = run(*m, "fp32", tokens, 37);
  const auto chunked = run(*m, "fp32", tokens, 37, 8);  // 5 internal chunks of <= 8
  const auto mixed = run(*m, "fp32", tokens, 5);        // prefill pieces after cached tokens
  const auto single = run(*m, "fp32", tokens, 1);
  // Same products and an fp32 cache: only the summation order differs (and an int8 activation
  // code may round the other way after a last-bit change), so agreement is far below 1%.
  const double d_chunk = rel_max_diff(chunked, batch), d_mixed = rel_max_diff(mixed, batch),
               d_single = rel_max_diff(single, batch);
  std::printf("[ %s ] rel. max diff vs one batch: chunked %.2e, pieces of 5 %.2e, token by token %.2e\n",
              v.name.c_str(), d_chunk, d_mixed, d_single);
  EXPECT_LT(d_chunk, 5e-3);
  EXPECT_LT(d_mixed, 5e-3);
  EXPECT_LT(d_single, 5e-3);
  // The logits depend on the tokens: a random model still gives distinct rows.
  EXPECT_GT(rel_max_diff(std::vector<float>(batch.begin(), batch.begin() + m->config().n_vocab),
                         std::vector<float>(batch.begin() + m->config().n_vocab,
                                            batch.begin() + 2 * m->config().n_vocab)),
            1e-2);
}

TEST_P(ForwardVariants, Fp16CacheCloseToFp32) {
  const Variant& v = GetParam();
  const auto m = vq::Model::load(vq::test::write_tiny_model(v.spec, vq::test::tiny_path("fp16_" + v.name)));
  const auto tokens = random_tokens(29, m->config().n_vocab, 11);
  const auto f32 = run(*m, "fp32", tokens, 29);
  const auto f16 = run(*m, "fp16", tokens, 1);
  // fp16 K/V carry 11 significant bits (relative error <= 2^-11 = 5e-4 per element). With float
  // weights that is all that differs (measured ~3e-4 of the logit range). With quantized weights
  // the products quantize their input rows to int8 (step = row block max / 127), and a 5e-4
  // change in the attention output flips some of those roundings: each flip moves a product by
  // up to 0.8% of its block (random weights with 8x outliers make blocks wide), and the changes
  // compound through the layers: measured ~1.5% (max and RMS). A broken cache gives O(1).
  const bool float_weights = v.spec.wtype == vq::GGMLType::F32 || v.spec.wtype == vq::GGMLType::F16;
  const double tol = float_weights ? 2e-3 : 5e-2;
  const double d = rel_max_diff(f16, f32), r = rel_rms_diff(f16, f32);
  std::printf("[ %s ] fp16 vs fp32 cache: rel. max diff %.2e, rel. RMS diff %.2e\n", v.name.c_str(), d, r);
  EXPECT_LT(d, tol);
  EXPECT_LT(r, tol);
}

INSTANTIATE_TEST_SUITE_P(Tiny, ForwardVariants, ::testing::ValuesIn(variants()),
                         [](const auto& info) { return info.param.name; });

TEST(Forward, LastLogitsAndResetAndThreads) {
  TinySpec s;
  const auto m = vq::Model::load(vq::test::write_tiny_model(s, vq::test::tiny_path("fwd_misc")));
  const int V = m->config().n_vocab;
  const auto tokens = random_tokens(20, V, 3);
  const auto all = run(*m, "fp32", tokens, 20);
  vq::Session sess(*m, cache("fp32"), 64);
  std::vector<float> last(static_cast<size_t>(V));
  sess.forward(tokens.data(), 20, last.data());
  const std::vector<float> ref_last(all.end() - V, all.end());
  EXPECT_LT(rel_max_diff(last, ref_last), 1e-6);
  EXPECT_EQ(sess.kv_fp16_bytes(), size_t(20) * 2 * 2 * 16 * 2 * 2);  // tokens, layers, kv heads, dim, K+V, 2 B
  EXPECT_GT(sess.kv_bytes(), 0u);
  sess.reset();
  EXPECT_EQ(sess.pos(), 0);
  std::vector<float> again(static_cast<size_t>(V));
  sess.forward(tokens.data(), 20, again.data());
  EXPECT_EQ(again, last);  // deterministic after reset
  const int saved = vq::num_threads();
  vq::set_num_threads(1);
  const auto one = run(*m, "fp32", tokens, 20);
  vq::set_num_threads(2);
  const auto two = run(*m, "fp32", tokens, 20);
  vq::set_num_threads(saved);
  EXPECT_LT(rel_max_diff(one, two), 1e-5);
}

// A CPU session packs every weight the products use when it is made (Model::pack_for_cpu), so
// the first prompt is not charged for it; a model nobody runs packs nothing.
TEST(Forward, CpuSessionPacksTheWeightsUpFront) {
  TinySpec s;
  const auto m = vq::Model::load(vq::test::write_tiny_model(s, vq::test::tiny_path("fwd_pack")));
  std::vector<const vq::WeightMatrix*> ws{&m->output()};
  for (const auto& L : m->layers())
    for (const vq::WeightMatrix* w : L.matrices()) ws.push_back(w);
  int slots = 0;
  for (const vq::WeightMatrix* w : ws)
    if (w->packed) {
      ++slots;
      EXPECT_TRUE(w->packed->w.data.empty()) << w->name;
    }
  ASSERT_GT(slots, 0) << "the tiny model has no packable weight";
  vq::Session sess(*m, cache("fp32"), 16);
  for (const vq::WeightMatrix* w : ws)
    if (w->packed) {
      EXPECT_EQ(w->packed->w.rows, w->rows) << w->name;
      EXPECT_EQ(w->packed->w.cols, w->cols) << w->name;
      EXPECT_FALSE(w->packed->w.data.empty()) << w->name;
    }
}

// gemma3: the window of the local layers changes exactly the positions past it. Same weights
// with window 8 and with a window longer than the sequence: logits agree at positions 0..7
// (every window still holds all keys), differ after. A cache without windowed attention works
// within the window and refuses past it.
TEST(Forward, Gemma3SlidingWindowOnlyActsPastTheWindow) {
  TinySpec s;
  s.arch = "gemma3", s.n_layers = 3, s.swa_pattern = 3, s.wtype = vq::GGMLType::F32;
  s.head_dim = 32, s.write_key_length = true;  // q8_0 blocks of 32
  const auto m8 = vq::Model::load(vq::test::write_tiny_model(s, vq::test::tiny_path("g3_w8")));
  s.sliding_window = 1000;
  const auto mall = vq::Model::load(vq::test::write_tiny_model(s, vq::test::tiny_path("g3_wall")));
  ASSERT_TRUE(m8->config().is_sliding(0) && m8->config().is_sliding(1) && !m8->config().is_sliding(2));
  const int V = m8->config().n_vocab, n = 24;
  const auto tokens = random_tokens(n, V, 5);
  const auto a = run(*m8, "fp32", tokens, n), b = run(*mall, "fp32", tokens, n);
  auto rows = [&](const std::vector<float>& x, int r0, int r1) {
    return std::vector<float>(x.begin() + size_t(r0) * V, x.begin() + size_t(r1) * V);
  };
  EXPECT_LT(rel_max_diff(rows(a, 0, 8), rows(b, 0, 8)), 1e-6);
  EXPECT_GT(rel_max_diff(rows(a, 8, n), rows(b, 8, n)), 1e-3);
  // token by token through the window equals one batch (windowed decode = windowed prefill)
  EXPECT_LT(rel_max_diff(run(*m8, "fp32", tokens, 1), a), 1e-5);

  // Every method runs past the window (the KV store's per-layer window): q8_0 stays within its
  // quantization error of fp32; before the window is exceeded both equal their global versions.
  const auto q8 = run(*m8, "q8_0", tokens, n), q8all = run(*mall, "q8_0", tokens, n);
  EXPECT_LT(rel_max_diff(q8, a), 0.05);
  EXPECT_LT(rel_max_diff(rows(q8, 0, 8), rows(q8all, 0, 8)), 1e-6);
  EXPECT_GT(rel_max_diff(rows(q8, 8, n), rows(q8all, 8, n)), 1e-3);
}

TEST(Forward, MisuseThrows) {
  TinySpec s;
  const auto m = vq::Model::load(vq::test::write_tiny_model(s, vq::test::tiny_path("fwd_misuse")));
  vq::Session sess(*m, cache("fp16"), 8);
  std::vector<float> logits(size_t(m->config().n_vocab));
  const int32_t bad[2] = {1, 97};
  EXPECT_THROW(sess.forward(bad, 2, logits.data()), vq::Error);  // id == n_vocab
  const int32_t neg = -1;
  EXPECT_THROW(sess.forward(&neg, 1, logits.data()), vq::Error);
  EXPECT_EQ(sess.pos(), 0);
  const std::vector<int32_t> nine(9, 3);
  EXPECT_THROW(sess.forward(nine.data(), 9, logits.data()), vq::Error);  // exceeds n_ctx 8
  sess.forward(nine.data(), 8, logits.data());
  EXPECT_EQ(sess.pos(), 8);
  EXPECT_THROW(sess.forward(nine.data(), 1, logits.data()), vq::Error);  // full
  EXPECT_THROW(vq::Session(*m, cache("fp16"), 0), vq::Error);
  EXPECT_THROW(vq::Model::load("/nonexistent/model.gguf"), vq::Error);
}

}  // namespace
