#pragma once
// A fixed pool of worker threads and parallel_for over it. The calling thread takes part,
// so a pool of n threads runs n-1 workers. Nested parallel_for calls run serially.
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace vq {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }
  // Splits [0, n) into at most size() contiguous ranges of at least `grain` items and calls
  // fn(begin, end, thread_index) for each; returns when all are done. Exceptions thrown by fn
  // are rethrown (the first one) on the calling thread.
  void parallel_for(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t grain = 1);

 private:
  void worker(int index);
  int n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  const std::function<void(size_t, size_t, int)>* job_ = nullptr;
  size_t job_n_ = 0, job_chunk_ = 0;
  int job_parts_ = 0;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// The process-wide pool. Its size is hardware_concurrency() until set_num_threads() changes it.
ThreadPool& default_pool();
void set_num_threads(int n);
int num_threads();

// parallel_for on the default pool.
inline void parallel_for(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t grain = 1) {
  default_pool().parallel_for(n, fn, grain);
}

}  // namespace vq
