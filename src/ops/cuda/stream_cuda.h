#pragma once
// Streams, pinned host staging, asynchronous copies, CUDA graphs and event timing for the
// device runtime (vq::cuda). No CUDA types here: a stream is a `void*` (cudaStream_t). Every
// call checks the CUDA status and throws vq::Error naming the call.
#include <cstddef>
#include <cstdint>

namespace vq::cuda {

// A non-blocking stream of its own (the runtime's work is ordered on it, not on the legacy
// default stream, so that it can be captured into a graph).
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  void* handle() const { return s_; }
  void synchronize() const;  // throws naming the first asynchronous error

 private:
  void* s_ = nullptr;
};

// Page-locked host memory (cudaHostAlloc): the source or destination of asynchronous copies.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* data() const { return p_; }
  template <class T>
  T* as() const { return static_cast<T*>(p_); }
  size_t size() const { return n_; }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

void copy_to_device_async(void* dst, const void* src, size_t bytes, void* stream);
void copy_to_host_async(void* dst, const void* src, size_t bytes, void* stream);
void copy_device_async(void* dst, const void* src, size_t bytes, void* stream);
void memset_device_async(void* dst, int value, size_t bytes, void* stream);

// One captured sequence of work on a stream, replayed with launch(). Capture uses the
// thread-local mode, so that other threads' CUDA calls are not refused meanwhile; anything that
// is not capture-safe (allocation, synchronisation) throws from the call that tried it.
class Graph {
 public:
  Graph() = default;
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;
  void begin_capture(void* stream);
  // Ends the capture and instantiates the graph; throws (and leaves the graph empty) when the
  // capture failed.
  void end_capture(void* stream);
  // Ends a capture that an exception interrupted (no-op when none is active).
  static void abort_capture(void* stream);
  void launch(void* stream) const;
  bool valid() const { return exec_ != nullptr; }
  void reset();

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
};

// An ordering point between streams (timing off): record() on one stream, wait() makes another
// stream's later work wait for what preceded the record. Both are capturable (a fork and a join
// of a graph's branches).
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(void* stream);
  void wait(void* stream) const;
  void synchronize() const;  // the host waits for what preceded the last record()
  void* handle() const { return e_; }

 private:
  void* e_ = nullptr;
};

// Device time between two points of a stream.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(void* stream);
  void stop(void* stream);
  float elapsed_ms() const;  // waits for the stop event

 private:
  void* a_ = nullptr;
  void* b_ = nullptr;
};

// cudaMemGetInfo of the current device: free bytes (and total in *total when given).
size_t device_free_bytes(size_t* total = nullptr);
int device_sm_count();
// Measured device-to-device copy bandwidth in GB/s (bytes read + written), over `bytes`.
double measure_copy_bandwidth(size_t bytes = size_t(1) << 30);

}  // namespace vq::cuda
