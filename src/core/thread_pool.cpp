#include "core/thread_pool.h"

#include <algorithm>
#include <memory>

#include "core/error.h"

namespace vq {

namespace {
thread_local bool tl_inside_pool = false;
}

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads) {
  VQ_CHECK(n_threads >= 1 && n_threads <= 1024, "thread count {} must be in 1..1024", n_threads);
  for (int i = 1; i < n_threads_; ++i) threads_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_work_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  tl_inside_pool = true;
  for (;;) {
    const std::function<void(size_t, size_t, int)>* job;
    size_t begin, end;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_work_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= job_parts_) continue;
      job = job_;
      begin = std::min(job_n_, size_t(index) * job_chunk_);
      end = std::min(job_n_, begin + job_chunk_);
    }
    std::exception_ptr err;
    try {
      if (begin < end) (*job)(begin, end, index);
    } catch (...) {
      err = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) cv_done_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t grain) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t max_parts = std::max<size_t>(1, n / grain);
  const int parts = int(std::min<size_t>(size_t(n_threads_), max_parts));
  if (parts <= 1 || tl_inside_pool) {
    fn(0, n, 0);
    return;
  }
  const size_t chunk = (n + parts - 1) / parts;
  {
    std::lock_guard<std::mutex> lk(mu_);
    job_ = &fn;
    job_n_ = n;
    job_chunk_ = chunk;
    job_parts_ = parts;
    pending_ = parts - 1;
    error_ = nullptr;
    ++generation_;
  }
  cv_work_.notify_all();
  std::exception_ptr err;
  tl_inside_pool = true;
  try {
    fn(0, std::min(n, chunk), 0);
  } catch (...) {
    err = std::current_exception();
  }
  tl_inside_pool = false;
  std::unique_lock<std::mutex> lk(mu_);
  cv_done_.wait(lk, [&] { return pending_ == 0; });
  if (!err) err = error_;
  error_ = nullptr;
  job_ = nullptr;
  if (err) std::rethrow_exception(err);
}

namespace {
std::mutex g_pool_mu;
std::unique_ptr<ThreadPool> g_pool;
int g_requested = 0;
}  // namespace

ThreadPool& default_pool() {
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (!g_pool) {
    int n = g_requested > 0 ? g_requested : int(std::max(1u, std::thread::hardware_concurrency()));
    g_pool = std::make_unique<ThreadPool>(n);
  }
  return *g_pool;
}

void set_num_threads(int n) {
  VQ_CHECK(n >= 1 && n <= 1024, "threads: {} must be in 1..1024", n);
  std::lock_guard<std::mutex> lk(g_pool_mu);
  if (g_pool && g_pool->size() == n) return;
  g_pool.reset();
  g_requested = n;
}

int num_threads() { return default_pool().size(); }

}  // namespace vq
