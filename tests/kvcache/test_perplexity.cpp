// Perplexity with the fp16 cache equals a full-precision recomputation (fp32 cache) on real text,
// through the quality harness (evaluate_perplexity: the text goes in chunks, so every chunk
// attends to the earlier ones through the cache under test).
#include <gtest/gtest.h>

#include <cmath>

#include "kvcache/factory.h"
#include "eval/perplexity.h"
#include "model_fixture.h"

using namespace vq;

TEST(Perplexity, Fp16CacheEqualsFp32Recomputation) {
  VQ_SKIP_UNDER_SANITIZER();
  VQ_REQUIRE_MODEL(model);
  const std::string text = model_test::eval_text();
  if (text.size() < 4000) GTEST_SKIP() << "python3-doc is not installed (scripts/setup.sh installs it)";
  const auto tokens = model_test::first_tokens(*model, text, 384);
  ASSERT_EQ(tokens.size(), 384u);
  const KVSpec f16 = make_kv_spec(parse_kv_cache_spec("fp16"));
  const KVSpec f32 = make_kv_spec(parse_kv_cache_spec("fp32"));
  PerplexityOptions opt;
  opt.n_ctx = 384;
  opt.chunk = 48;
  const PerplexityResult r = evaluate_perplexity(*model, tokens, f16, &f32, opt);
  ASSERT_EQ(r.n_scored, 383);
  // Feeding the text in chunks through the cache equals recomputing everything in one pass
  // (same per-row arithmetic), for both caches: the cache carries the past exactly.
  PerplexityOptions whole = opt;
  whole.chunk = 384;
  const PerplexityResult w = evaluate_perplexity(*model, tokens, f16, &f32, whole);
  EXPECT_NEAR(w.perplexity / r.perplexity, 1.0, 1e-6);
  EXPECT_NEAR(w.ref_perplexity / r.ref_perplexity, 1.0, 1e-6);
  // fp16 vs fp32 storage. Each K/V element is rounded by at most 2^-11 relative; on these real
  // activations that gives an attention-output NMSE of ~2e-7 per layer (RealActivations test).
  // The runtime quantizes every matmul input to int8 per row (Q4_1 x int8 products), so that
  // 5e-4 perturbation flips some int8 roundings and grows through 30 layers to the size of the
  // activation-quantization noise itself: measured here, perplexity +0.69%, KL 0.0037 nats,
  // top-1 agreement 96.3% (the same order as q8_0 vs fp16 in docs/BENCHMARKS.md). Bounds at
  // ~3x those numbers; an indexing or scale bug moves perplexity by tens of percent.
  EXPECT_NEAR(r.perplexity / r.ref_perplexity, 1.0, 0.02) << r.perplexity << " vs fp32 " << r.ref_perplexity;
  EXPECT_LT(r.kl, 0.012);
  EXPECT_GT(r.top1, 0.9);
  EXPECT_GT(r.perplexity, 1.5);  // a real text, not a degenerate one
  EXPECT_LT(r.perplexity, 200.0);
}
