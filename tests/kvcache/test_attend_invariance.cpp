// Batch invariance of the CPU attention (kv_store.cpp, docs/DETERMINISM.md) on a grid of
// geometries: GQA groups 1, 4, 6 and 16, head_dim 64, 128 and 256, one or two KV heads, with and
// without a sliding window, for a dense, a scalar-coded and a VecInfer cache. A query's output is
// bit-identical whether its keys were appended in one chunk or token by token, whether it is
// attended alone in a block of 8 queries or as the only query of its step beside another
// sequence (the keys split over threads then), and on 1 or 2 threads.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/kv_store.h"
#include "test_util.h"
#include "trained_spec.h"

using namespace vq;

namespace {

KVSpec spec_for(const std::string& s, const KVGeometry& g, std::mt19937& rng) { return trained_spec(s, g, rng, 1, 2); }

}  // namespace

TEST(AttendInvariance, GridOfGeometriesChunksBatchesAndThreads) {
  std::mt19937 rng(77);
  const KVGeometry geos[] = {{1, 1, 64}, {4, 1, 256}, {12, 2, 128}, {16, 1, 64}, {32, 2, 128}};
  const int n = 600, n_q = 8, n_other = 300;  // the queries: positions n - n_q .. n - 1
  const int saved = num_threads();
  for (const KVGeometry& g : geos)
    for (const char* method : {"fp16", "q8_0", "vecinfer:d4b8,r=32"})
      for (int window : {0, 100}) {
        const KVSpec spec = spec_for(method, g, rng);
        KVStoreOptions opt;
        if (window) opt.sliding_window = {window};
        const size_t row = size_t(g.n_kv_heads) * g.head_dim, qrow = size_t(g.n_heads) * g.head_dim;
        const auto k = randn(size_t(n) * row, rng), v = randn(size_t(n) * row, rng);
        const auto ko = randn(size_t(n_other) * row, rng), vo = randn(size_t(n_other) * row, rng);
        const auto q = randn(size_t(n_q) * qrow, rng, 0.5f), qo = randn(qrow, rng, 0.5f);
        const float scale = 0.125f;
        const std::string what = std::string(method) + " heads " + std::to_string(g.n_heads) + "/" +
                                 std::to_string(g.n_kv_heads) + " d" + std::to_string(g.head_dim) + " window " +
                                 std::to_string(window);
        // Reference: every key in one chunk, the 8 queries in one entry (prefill: no split).
        std::vector<float> ref(size_t(n_q) * qrow);
        {
          KVStore store(g, 1, spec, opt);
          SeqKV s = store.new_sequence();
          store.append(s, 0, k.data(), v.data(), n - n_q);
          store.append(s, 0, k.data() + size_t(n - n_q) * row, v.data() + size_t(n - n_q) * row, n_q);
          const AttnEntry e{&s, n - n_q, n_q, q.data(), ref.data()};
          store.attend(0, &e, 1, scale);
        }
        for (int threads : {1, 2}) {
          set_num_threads(threads);
          // Token by token, each query attended as it arrives, beside another sequence's decode row.
          KVStore store(g, 1, spec, opt);
          SeqKV s = store.new_sequence(), o = store.new_sequence();
          store.append(o, 0, ko.data(), vo.data(), n_other);
          std::vector<float> got(size_t(n_q) * qrow), other(qrow);
          for (int p = 0; p < n; ++p) {
            store.append(s, 0, k.data() + size_t(p) * row, v.data() + size_t(p) * row, 1);
            if (p < n - n_q) continue;
            const int i = p - (n - n_q);
            const AttnEntry es[2] = {{&s, p, 1, q.data() + size_t(i) * qrow, got.data() + size_t(i) * qrow},
                                     {&o, n_other - 1, 1, qo.data(), other.data()}};
            store.attend(0, es, 2, scale);
          }
          EXPECT_EQ(got, ref) << what << ", " << threads << " threads";
        }
        set_num_threads(saved);
      }
}
