#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"

namespace vq {
namespace {

TEST(ThreadPool, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (size_t n : {size_t(0), size_t(1), size_t(2), size_t(7), size_t(64), size_t(1001)})
      for (size_t grain : {size_t(1), size_t(3), size_t(100), size_t(5000)}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> bad_index{0};
        pool.parallel_for(n, [&](size_t b, size_t e, int t) {
          if (t < 0 || t >= threads || b >= e) ++bad_index;
          for (size_t i = b; i < e; ++i) ++hits[i];
        }, grain);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << grain << " " << i;
        EXPECT_EQ(bad_index.load(), 0);
      }
  }
}

TEST(ThreadPool, ExceptionsPropagateAndPoolStaysUsable) {
  ThreadPool pool(3);
  for (int round = 0; round < 3; ++round) {
    // The throwing range belongs to a worker (not the caller) in some rounds.
    const size_t throw_at = size_t(round) * 400;
    EXPECT_THROW(pool.parallel_for(1200, [&](size_t b, size_t e, int) {
      if (throw_at >= b && throw_at < e) throw Error("boom at " + std::to_string(throw_at));
    }), Error);
    std::atomic<size_t> sum{0};
    pool.parallel_for(1200, [&](size_t b, size_t e, int) {
      for (size_t i = b; i < e; ++i) sum += i;
    });
    EXPECT_EQ(sum.load(), 1200u * 1199u / 2);
  }
  EXPECT_THROW(pool.parallel_for(10, [](size_t, size_t, int) { throw std::runtime_error("x"); }),
               std::runtime_error);
}

TEST(ThreadPool, NestedCallsRunSeriallyAndCoverAll) {
  ThreadPool pool(2);
  std::vector<std::atomic<int>> hits(40 * 30);
  pool.parallel_for(40, [&](size_t b, size_t e, int) {
    for (size_t i = b; i < e; ++i)
      pool.parallel_for(30, [&](size_t b2, size_t e2, int t2) {
        EXPECT_EQ(t2, 0);  // nested: runs on the calling thread
        for (size_t j = b2; j < e2; ++j) ++hits[i * 30 + j];
      });
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

TEST(ThreadPool, DefaultPoolSize) {
  set_num_threads(3);
  EXPECT_EQ(num_threads(), 3);
  set_num_threads(1);
  EXPECT_EQ(num_threads(), 1);
  EXPECT_THROW(set_num_threads(0), Error);
  EXPECT_THROW(ThreadPool(0), Error);
  set_num_threads(2);
}

}  // namespace
}  // namespace vq
