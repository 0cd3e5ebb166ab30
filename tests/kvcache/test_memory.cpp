// The process's resident memory really drops with the compressed caches at long context:
// fill 30 layers' caches (SmolLM2 geometry: 9 query / 3 KV heads, head_dim 64) with 16k tokens
// each and measure the growth of the resident set (/proc/self/statm), not just computed bytes.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <fstream>
#include <random>

#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "test_util.h"

using namespace vq;

namespace {

constexpr int kLayers = 30, kTokens = 16384, kChunk = 512;
const KVGeometry kGeo{9, 3, 64};

// Base-page granularity: with transparent huge pages "always", one touched byte makes 2 MiB
// resident, so the measuring process opts out of them.
int64_t rss_bytes() {
  static const bool thp_off = prctl(PR_SET_THP_DISABLE, 1, 0, 0, 0) == 0;
  (void)thp_off;
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

struct Measured {
  int64_t rss_growth = 0;  // resident bytes added by filling the caches
  int64_t reported = 0;    // sum of bytes() over the layers
  int64_t fp16 = 0;        // sum of fp16_bytes()
};

// Fills kLayers caches with kTokens random tokens. The caches stay alive in `keep`, so memory
// freed by one measurement is never reused by the next (which would hide growth).
Measured measure(const KVCacheFactory& fac, std::vector<std::unique_ptr<KVCache>>& keep) {
  Measured r;
  std::mt19937 rng(5);
  // one chunk of random keys/values reused for every append: [kChunk, 3, 64] f32
  const auto k = randn(size_t(kChunk) * 3 * 64, rng), v = randn(size_t(kChunk) * 3 * 64, rng);
  std::vector<KVCache*> caches;
  for (int l = 0; l < kLayers; ++l) {
    keep.push_back(fac(l, kGeo));
    caches.push_back(keep.back().get());
  }
  // warm the allocator and the code paths (scratch of the encoder), then start empty
  for (auto* c : caches) c->append(k.data(), v.data(), kChunk);
  for (auto* c : caches) c->append(k.data(), v.data(), kChunk);
  for (auto* c : caches) c->clear();
  const int64_t before = rss_bytes();
  for (auto* c : caches)
    for (int t = 0; t < kTokens; t += kChunk) c->append(k.data(), v.data(), kChunk);
  r.rss_growth = rss_bytes() - before;
  for (auto* c : caches) {
    r.reported += int64_t(c->bytes());
    r.fp16 += int64_t(c->fp16_bytes());
  }
  return r;
}

}  // namespace

TEST(Memory, ResidentSetFollowsReportedBytesAtLongContext) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer the resident set also holds shadow memory (1/8 of every "
                  "allocation) and the quarantine of freed scratch; the release build checks RSS";
#endif
  // VecInfer needs codebooks; trained here on random data (only the sizes matter).
  KVCacheConfig vi = parse_kv_cache_spec("vecinfer:d4b8");
  {
    std::mt19937 rng(9);
    const int n = 512;
    std::vector<std::vector<float>> ks, vs;
    std::vector<const float*> kp, vp;
    for (int l = 0; l < kLayers; ++l) {
      ks.push_back(randn(size_t(n) * 3 * 64, rng));
      vs.push_back(randn(size_t(n) * 3 * 64, rng));
      kp.push_back(ks.back().data());
      vp.push_back(vs.back().data());
    }
    CalibTrainOptions opt;
    opt.kmeans_iters = 2;
    vi.calibration = std::make_shared<Calibration>(train_calibration(vi, 3, 64, kp, vp, n, opt, "random"));
  }
  std::vector<std::unique_ptr<KVCache>> keep;
  const Measured v = measure(make_kv_cache_factory(vi), keep);
  const Measured k2 = measure(make_kv_cache_factory(parse_kv_cache_spec("kivi2")), keep);
  const Measured q4 = measure(make_kv_cache_factory(parse_kv_cache_spec("q4_0")), keep);
  const Measured f16 = measure(make_kv_cache_factory(parse_kv_cache_spec("fp16")), keep);
  const double MiB = 1048576.0;
  for (auto [name, m] : {std::pair{"fp16", f16}, {"vecinfer:d4b8", v}, {"kivi2", k2}, {"q4_0", q4}})
    std::printf("  %-14s RSS growth %7.1f MiB, reported %7.1f MiB, fp16 equivalent %7.1f MiB\n", name,
                m.rss_growth / MiB, m.reported / MiB, m.fp16 / MiB);
  ASSERT_GT(f16.reported, 0);
  ASSERT_GT(v.reported, 0);
  // fp16 at 16k tokens x 30 layers is 360 MiB of K/V: it must be resident.
  EXPECT_EQ(f16.fp16, int64_t(kLayers) * kTokens * 3 * 64 * 4);
  // Resident growth matches the reported bytes: pages are touched as tokens arrive, so the
  // growth is the allocated bytes give or take allocator slack and the last partial pages
  // (a few MiB over 30 layers), plus the encoder's short-lived scratch.
  for (const Measured* m : {&f16, &v, &k2, &q4}) {
    // (freed warm-up blocks are reused, so growth may fall short of the reported bytes a little)
    EXPECT_GT(m->rss_growth, m->reported * 8 / 10 - 8 * int64_t(MiB));
    EXPECT_LT(m->rss_growth, m->reported * 11 / 10 + 16 * int64_t(MiB));
  }
  // And the compressed caches really are smaller in memory: vecinfer d4b8 holds 2 bits per
  // element (+ the fp16 window of <= 128 + 32 tokens per layer), 1/8 of fp16 nominal.
  EXPECT_LT(v.rss_growth, f16.rss_growth / 5);
  EXPECT_LT(k2.rss_growth, f16.rss_growth / 3);
  EXPECT_LT(q4.rss_growth, f16.rss_growth / 3);
}
