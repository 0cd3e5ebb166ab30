#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
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

// The on-demand split: every index once, pieces of exactly `chunk` items (the last shorter)
// starting at multiples of chunk, valid thread indices; a slowed thread takes fewer pieces;
// exceptions reach the caller; inside a job it runs serially.
TEST(ThreadPool, DynamicSplitCoversEveryIndexInWholePieces) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(64), size_t(1001)})
      for (size_t chunk : {size_t(0), size_t(1), size_t(3), size_t(100), size_t(5000)}) {
        std::vector<std::atomic<int>> hits(n);
        std::atomic<int> bad{0};
        const size_t c = std::max<size_t>(chunk, 1);
        pool.parallel_for_dynamic(n, [&](size_t b, size_t e, int t) {
          if (t < 0 || t >= threads || b >= e || b % c != 0 || (e - b != c && e != n)) ++bad;
          for (size_t i = b; i < e; ++i) ++hits[i];
        }, chunk);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << n << " " << chunk << " " << i;
        EXPECT_EQ(bad.load(), 0);
      }
  }
  ThreadPool pool(2);
  // Thread 0 (the caller) sleeps in its first piece: the worker takes the rest.
  std::vector<std::atomic<int>> owner(40);
  pool.parallel_for_dynamic(40, [&](size_t b, size_t, int t) {
    if (b == 0 && t == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    owner[b] = t + 1;
  }, 1);
  int by_worker = 0;
  for (auto& o : owner) by_worker += o.load() == 2;
  if (owner[0].load() == 1) {  // else the worker took piece 0 and slept
    EXPECT_GE(by_worker, 30);
  }
  EXPECT_THROW(pool.parallel_for_dynamic(100, [](size_t b, size_t, int) {
    if (b == 50) throw std::runtime_error("piece 50");
  }, 10), std::runtime_error);
  std::atomic<int> inner{0};
  pool.parallel_for(2, [&](size_t, size_t, int) {
    pool.parallel_for_dynamic(10, [&](size_t b, size_t e, int t) { inner += int(e - b) * (t == 0 && b == 0 && e == 10); }, 1);
  });
  EXPECT_EQ(inner.load(), 20);  // each nested call ran as one piece on its own thread
}

// Jobs of few parts on a large pool use only threads 0..parts-1 (the others neither run nor are
// waited for), and a quick run of jobs whose part counts change every time, some after the
// workers went to sleep, still covers every index exactly once.
TEST(ThreadPool, SmallJobsUseTheirPartsOnlyAndAlternateSafely) {
  ThreadPool pool(8);
  const size_t sizes[] = {2, 3, 5, 16, 1000, 2};
  for (int it = 0; it < 3000; ++it) {
    const size_t n = sizes[size_t(it) % 6];
    std::vector<std::atomic<int>> hits(n);
    std::atomic<int> max_index{-1};
    pool.parallel_for(n, [&](size_t b, size_t e, int t) {
      int m = max_index.load();
      while (t > m && !max_index.compare_exchange_weak(m, t)) {
      }
      for (size_t i = b; i < e; ++i) ++hits[i];
    });
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "iteration " << it << " n " << n << " i " << i;
    ASSERT_LT(max_index.load(), int(std::min<size_t>(n, 8))) << "iteration " << it;
    if (it % 500 == 499) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // let the workers sleep
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

// Sums i over [0, n) through the pool; every index must be visited once, by the right job.
uint64_t pooled_sum(ThreadPool& pool, size_t n, uint64_t salt, std::atomic<int>& wrong) {
  std::vector<uint64_t> part(1024, 0);  // part[thread index]: this call's own partial sums
  pool.parallel_for(n, [&](size_t b, size_t e, int t) {
    if (t < 0 || t >= 1024) { ++wrong; return; }
    for (size_t i = b; i < e; ++i) part[size_t(t)] += i ^ salt;
  }, 7);
  uint64_t s = 0;
  for (uint64_t p : part) s += p;
  return s;
}

// Two (and four) callers on their own threads share one pool at once: every job must see only
// its own function and ranges (before the contract, the second caller overwrote the first's
// job in flight). Run under TSan it is also race-free (docs/RELIABILITY.md).
TEST(ThreadPool, ConcurrentCallersEachGetTheirOwnJob) {
  for (int callers : {2, 4}) {
    ThreadPool pool(3);
    std::atomic<int> wrong{0}, bad_sum{0};
    std::vector<std::thread> ts;
    for (int c = 0; c < callers; ++c)
      ts.emplace_back([&, c] {
        for (int it = 0; it < 300; ++it) {
          const size_t n = size_t(50 + (it * 37 + c * 11) % 900);
          const uint64_t salt = uint64_t(c) << 40;
          uint64_t want = 0;
          for (size_t i = 0; i < n; ++i) want += i ^ salt;
          if (pooled_sum(pool, n, salt, wrong) != want) ++bad_sum;
        }
      });
    for (auto& t : ts) t.join();
    EXPECT_EQ(wrong.load(), 0) << callers;
    EXPECT_EQ(bad_sum.load(), 0) << callers;
  }
}

// set_num_threads from one thread while another runs jobs on the default pool: the running job
// finishes on the old workers, later ones use the new count, nothing is freed under a caller.
TEST(ThreadPool, ResizeWhileAnotherThreadRunsJobs) {
  set_num_threads(2);
  std::atomic<bool> done{false};
  std::atomic<int> wrong{0}, bad_sum{0};
  const size_t n = 500;
  uint64_t want = 0;
  for (size_t i = 0; i < n; ++i) want += i ^ 3;
  std::thread user([&] {
    for (int it = 0; it < 400; ++it)
      if (pooled_sum(default_pool(), n, 3, wrong) != want) ++bad_sum;
    done = true;
  });
  for (int k = 0; !done; ++k) set_num_threads(1 + k % 4);
  user.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(bad_sum.load(), 0);
  set_num_threads(2);
  EXPECT_EQ(num_threads(), 2);
}

TEST(ThreadPool, ResizeFromInsideAJobIsRefused) {
  ThreadPool pool(2);
  std::atomic<int> refused{0};
  pool.parallel_for(2, [&](size_t, size_t, int) {
    try {
      pool.resize(3);
    } catch (const Error& e) {
      if (std::string(e.what()).find("inside a parallel_for job") != std::string::npos) ++refused;
    }
  });
  EXPECT_EQ(refused.load(), 2);  // both parts (caller and worker) were refused
  EXPECT_EQ(pool.size(), 2);
  pool.resize(3);
  EXPECT_EQ(pool.size(), 3);
  std::vector<std::atomic<int>> hits(100);
  pool.parallel_for(100, [&](size_t b, size_t e, int) { for (size_t i = b; i < e; ++i) ++hits[i]; });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}

}  // namespace
}  // namespace vq
