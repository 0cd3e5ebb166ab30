// Sliding-window layers in the KV store (gemma3's local layers): a query at position p attends to
// keys [p - W + 1, p] for every method, and the layer holds only the blocks the window needs, so
// its memory stays bounded at any context.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/kv_store.h"
#include "ops/ref/attention.h"
#include "test_util.h"
#include "trained_spec.h"

using namespace vq;

namespace {

KVSpec spec_for(const std::string& s, const KVGeometry& g, std::mt19937& rng, int n_layers = 1) {
  return trained_spec(s, g, rng, n_layers, 4);
}

}  // namespace

TEST(SlidingWindow, EveryMethodAttendsToTheWindowOnly) {
  std::mt19937 rng(31);
  const KVGeometry g{4, 2, 64};
  // NMSE bounds vs exact attention over each query's window on N(0,1) data (as in the other cache
  // tests: ~3-5x the quantization error; a wrong window gives O(1)).
  const std::pair<const char*, double> methods[] = {{"fp32", 1e-10},          {"fp16", 1e-5},
                                                    {"q8_0", 2e-4},           {"q4_0", 0.05},
                                                    {"kivi4,r=16", 0.05},     {"kivi2,r=16", 0.6},
                                                    {"vecinfer:d4b8,r=16", 0.4}, {"vecinfer:d8b8,r=16,sink=0", 0.6}};
  for (auto [method, bound] : methods)
    for (int W : {1, 40, 100}) {
      KVStoreOptions opt;
      opt.sliding_window = {W};
      KVStore store(g, 1, spec_for(method, g, rng), opt);
      SeqKV s = store.new_sequence();
      const int total = 420;
      const size_t row = size_t(g.n_kv_heads) * g.head_dim;
      auto k = randn(size_t(total) * row, rng), v = randn(size_t(total) * row, rng);
      int pos = 0;
      size_t peak_blocks = 0;
      for (int chunk : {1, 50, 7, 130, 1, 1, 64, 100, 66}) {
        store.append(s, 0, k.data() + size_t(pos) * row, v.data() + size_t(pos) * row, chunk);
        pos += chunk;
        auto q = randn(size_t(chunk) * g.n_heads * g.head_dim, rng, 0.5f);
        std::vector<float> out(q.size(), 1e30f), ref_out(q.size());
        const AttnEntry e{&s, pos - chunk, chunk, q.data(), out.data()};
        store.attend(0, &e, 1, 0.125f);
        for (int i = 0; i < chunk; ++i) {
          const int p = pos - chunk + i, lo = std::max(0, p - W + 1);
          ref::attention(q.data() + size_t(i) * g.n_heads * g.head_dim, 1, k.data() + size_t(lo) * row,
                         v.data() + size_t(lo) * row, p - lo + 1, g.n_heads, g.n_kv_heads, g.head_dim, 0.125f,
                         ref_out.data() + size_t(i) * g.n_heads * g.head_dim);
        }
        EXPECT_LT(nmse(out, ref_out), bound) << method << " W=" << W << " pos=" << pos;
        store.trim(s);
        peak_blocks = std::max<size_t>(peak_blocks, size_t(store.blocks_held(s, 0, false) + store.blocks_held(s, 0, true)));
      }
      ASSERT_EQ(pos, total);
      // After each step only the window's blocks remain (both forms of at most the blocks the
      // window and the block being filled touch), whatever the context.
      const int B = store.block_tokens();
      EXPECT_LE(peak_blocks, size_t(2 * ((W + B - 1) / B + 1))) << method << " W=" << W;
    }
}

TEST(SlidingWindow, MemoryStaysBoundedAtLongContext) {
  std::mt19937 rng(32);
  const KVGeometry g{4, 1, 64};
  KVStoreOptions opt;
  opt.sliding_window = {64, 0};  // layer 0 local, layer 1 global
  KVStore store(g, 2, spec_for("vecinfer:d4b8", g, rng, 2), opt);
  SeqKV s = store.new_sequence();
  const size_t row = size_t(g.n_kv_heads) * g.head_dim;
  auto k = randn(256 * row, rng), v = randn(256 * row, rng);
  for (int t = 0; t < 4096; t += 256) {
    for (int l = 0; l < 2; ++l) store.append(s, l, k.data(), v.data(), 256);
    store.trim(s);
  }
  EXPECT_EQ(s.size(), 4096);
  const int B = store.block_tokens();
  EXPECT_LE(store.blocks_held(s, 0, false) + store.blocks_held(s, 0, true), 2 * (64 / B + 1));
  EXPECT_GE(store.blocks_held(s, 1, true), (4096 - 128 - 32) / B);  // the global layer keeps everything
}
