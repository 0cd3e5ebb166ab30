#pragma once
// A fixed pool of worker threads and parallel_for over it. The calling thread takes part,
// so a pool of n threads runs n-1 workers. Workers spin briefly after each job before
// sleeping: a decode step issues hundreds of small parallel_for calls, and waking a sleeping
// thread costs 10-20 us each time.
//
// Threading contract (tests/core/test_thread_pool.cpp checks it under load, and it is clean
// under ThreadSanitizer):
//  - parallel_for may be called from any number of threads at once. Calls from outside the
//    pool take the pool one at a time (a second caller waits until the running job ends), so
//    two sessions on two threads both work; they share the cores instead of splitting them.
//  - A parallel_for called from inside a job (on the caller or a worker, of this pool or any
//    other) runs serially on the calling thread.
//  - resize() / set_num_threads() may also be called from any thread: it waits for the running
//    job to end, then replaces the workers. Called from inside a job it throws vq::Error (it
//    would wait for itself). The pool object itself is never replaced, so references to
//    default_pool() stay valid.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
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

  int size() const { return n_threads_.load(std::memory_order_relaxed); }
  // Splits [0, n) into at most size() contiguous ranges of at least `grain` items and calls
  // fn(begin, end, thread_index) for each; returns when all are done. Exceptions thrown by fn
  // are rethrown (the first one) on the calling thread.
  void parallel_for(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t grain = 1);
  // The same split handed out on demand: [0, n) in pieces of `chunk` items (the last one
  // shorter), each taken by the next thread that is free, so a thread slowed down (preempted,
  // or on a busier core) takes fewer pieces instead of holding up the job. The pieces a thread
  // gets are not contiguous; fn(begin, end, thread_index) is called once per piece.
  void parallel_for_dynamic(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t chunk);
  // Changes the thread count (1..1024) once no job is running; see the contract above.
  void resize(int n_threads);

 private:
  void start_workers();
  void stop_workers();
  void worker(int index, uint64_t seen);
  void run_part(int index);
  // Held by an outside caller for the whole of one job (and by resize): one job at a time.
  std::mutex submit_mu_;
  std::atomic<int> n_threads_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_work_, cv_done_;
  // The current job; written by parallel_for before generation_ is bumped (release) and read
  // by workers after they see the new generation (acquire).
  const std::function<void(size_t, size_t, int)>* job_ = nullptr;
  size_t job_n_ = 0, job_chunk_ = 0;
  std::atomic<int> pending_{0};  // parts of the current job not finished yet
  // (job number << 16) | the number of parts of the job (threads 0..parts-1 take part).
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::mutex err_mu_;
  std::exception_ptr error_;
};

// The process-wide pool. Its size is hardware_concurrency() until set_num_threads() changes it.
ThreadPool& default_pool();
void set_num_threads(int n);  // default_pool().resize(n), or the size of the pool made on first use
int num_threads();

// parallel_for on the default pool.
inline void parallel_for(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t grain = 1) {
  default_pool().parallel_for(n, fn, grain);
}

inline void parallel_for_dynamic(size_t n, const std::function<void(size_t, size_t, int)>& fn, size_t chunk) {
  default_pool().parallel_for_dynamic(n, fn, chunk);
}

}  // namespace vq
