#include "core/thread_pool.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "core/error.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define VQ_CPU_RELAX() _mm_pause()
#else
#define VQ_CPU_RELAX() std::this_thread::yield()
#endif

namespace vq {

namespace {
thread_local bool tl_inside_pool = false;
// generation_ holds (job number << kPartsBits) | the job's part count.
constexpr int kPartsBits = 16;
constexpr uint64_t kPartsMask = (uint64_t(1) << kPartsBits) - 1;
// How long an idle worker (or the caller waiting for workers) spins before sleeping.
constexpr auto kSpin = std::chrono::microseconds(200);

// Spins until pred() holds or kSpin passes; returns pred().
template <typename Pred>
bool spin_until(Pred pred) {
  if (pred()) return true;
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 0;; ++i) {
    for (int k = 0; k < 32; ++k) {
      if (pred()) return true;
      VQ_CPU_RELAX();
    }
    std::this_thread::yield();  // lets a preempted peer run when the cores are oversubscribed
    if (std::chrono::steady_clock::now() > deadline) return pred();
  }
}

void check_thread_count(int n) { VQ_CHECK(n >= 1 && n <= 1024, "thread count {} must be in 1..1024", n); }
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  check_thread_count(n_threads);
  start_workers();
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::start_workers() {
  // New workers must not mistake the last finished job for a new one.
  const uint64_t seen = generation_.load(std::memory_order_acquire);
  for (int i = 1; i < n_threads_.load(); ++i) threads_.emplace_back([this, i, seen] { worker(i, seen); });
}

void ThreadPool::stop_workers() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_.store(true);
  }
  cv_work_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
  stop_.store(false);
}

void ThreadPool::resize(int n_threads) {
  check_thread_count(n_threads);
  VQ_CHECK(!tl_inside_pool, "thread pool: cannot change the thread count to {} from inside a parallel_for job",
           n_threads);
  std::lock_guard<std::mutex> submit(submit_mu_);  // waits for the running job
  if (n_threads == n_threads_.load()) return;
  stop_workers();
  n_threads_.store(n_threads);
  start_workers();
}

void ThreadPool::run_part(int index) {
  const size_t begin = std::min(job_n_, size_t(index) * job_chunk_);
  const size_t end = std::min(job_n_, begin + job_chunk_);
  try {
    if (begin < end) (*job_)(begin, end, index);
  } catch (...) {
    std::lock_guard<std::mutex> lk(err_mu_);
    if (!error_) error_ = std::current_exception();
  }
  if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lk(mu_);  // pairs with the caller's sleep on cv_done_
    cv_done_.notify_one();
  }
}

void ThreadPool::worker(int index, uint64_t seen) {
  tl_inside_pool = true;
  for (;;) {
    auto has_work = [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    };
    if (!spin_until(has_work)) {
      std::unique_lock<std::mutex> lk(mu_);
      sleepers_.fetch_add(1);
      cv_work_.wait(lk, has_work);
      sleepers_.fetch_sub(1);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    // Only the first `parts` threads take part (the caller is part 0); the others neither run
    // nor count down, so a small job does not wait for every worker to notice it (a sleeping
    // worker takes 10-20 us to wake). parts comes from the same word as the generation: a
    // worker that is late for this job cannot pick up the next job's count.
    if (index < int(seen & kPartsMask)) run_part(index);
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t grain) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t max_parts = std::max<size_t>(1, n / grain);
  if (max_parts <= 1 || size() <= 1 || tl_inside_pool) {
    fn(0, n, 0);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mu_);  // one outside caller's job at a time
  const int n_threads = n_threads_.load();
  const int parts = int(std::min<size_t>(size_t(n_threads), max_parts));
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = (n + parts - 1) / parts;
    error_ = nullptr;
    pending_.store(parts, std::memory_order_relaxed);
    const uint64_t gen = (generation_.load(std::memory_order_relaxed) >> kPartsBits) + 1;
    generation_.store(gen << kPartsBits | uint64_t(parts), std::memory_order_release);
  }
  if (sleepers_.load() > 0) cv_work_.notify_all();
  tl_inside_pool = true;
  run_part(0);
  tl_inside_pool = false;
  auto done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
  if (!spin_until(done)) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_done_.wait(lk, done);
  }
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lk(err_mu_);
    err = error_;
    error_ = nullptr;
  }
  job_ = nullptr;
  if (err) std::rethrow_exception(err);
}

void ThreadPool::parallel_for_dynamic(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t chunk) {
  if (n == 0) return;
  chunk = std::max<size_t>(chunk, 1);
  const size_t pieces = (n + chunk - 1) / chunk;
  if (pieces <= 1 || size() <= 1 || tl_inside_pool) {
    fn(0, n, 0);
    return;
  }
  std::atomic<size_t> next{0};
  parallel_for(
      std::min<size_t>(pieces, size_t(size())),
      [&](size_t, size_t, int index) {
        for (size_t p = next.fetch_add(1, std::memory_order_relaxed); p < pieces;
             p = next.fetch_add(1, std::memory_order_relaxed))
          fn(p * chunk, std::min(n, (p + 1) * chunk), index);
      },
      1);
}

namespace {
std::mutex g_pool_mu;
std::atomic<ThreadPool*> g_pool{nullptr};  // made on first use, never destroyed before exit
int g_requested = 0;
}  // namespace

ThreadPool& default_pool() {
  if (ThreadPool* p = g_pool.load(std::memory_order_acquire)) return *p;
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool.load()) {
    static std::unique_ptr<ThreadPool> owner;  // joins the workers at exit
    const int n = g_requested > 0 ? g_requested : int(std::max(1u, std::thread::hardware_concurrency()));
    owner = std::make_unique<ThreadPool>(n);
    g_pool.store(owner.get(), std::memory_order_release);
  }
  return *g_pool.load();
}

void set_num_threads(int n) {
  VQ_CHECK(n >= 1 && n <= 1024, "threads: {} must be in 1..1024", n);
  ThreadPool* p = nullptr;
  {
    std::lock_guard<std::mutex> lk(g_pool_mu);
    p = g_pool.load();
    if (!p) {
      g_requested = n;
      return;
    }
  }
  // Outside g_pool_mu: resize waits for a running job, whose threads may call default_pool().
  p->resize(n);
}

int num_threads() { return default_pool().size(); }

}  // namespace vq
