// Streams, pinned buffers, graphs, events (stream_cuda.h).
#include <algorithm>
#include <vector>

#include "core/env.h"
#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/stream_cuda.h"

namespace vq::cuda {

bool pdl_enabled() {
  static const bool on = gpu_tuning().pdl;
  return on;
}

Stream::Stream() {
  VQ_CHECK(cuda_device_available(), "CUDA stream: {}", cuda_unavailable_reason());
  cudaStream_t s = nullptr;
  VQ_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  s_ = s;
}

Stream::~Stream() {
  if (s_) cudaStreamDestroy(static_cast<cudaStream_t>(s_));
}

void Stream::synchronize() const { VQ_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s_))); }

PinnedBuffer::PinnedBuffer(size_t bytes) : n_(bytes) {
  VQ_CHECK(cuda_device_available(), "CUDA pinned buffer of {} bytes: {}", bytes, cuda_unavailable_reason());
  if (bytes) VQ_CUDA_CHECK(cudaHostAlloc(&p_, bytes, cudaHostAllocDefault));
}

PinnedBuffer::~PinnedBuffer() {
  if (p_) cudaFreeHost(p_);
}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& o) noexcept {
  if (this != &o) {
    if (p_) cudaFreeHost(p_);
    p_ = o.p_, n_ = o.n_;
    o.p_ = nullptr, o.n_ = 0;
  }
  return *this;
}

void copy_to_device_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes) VQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, as_stream(stream)));
}
void copy_to_host_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes) VQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, as_stream(stream)));
}
void copy_device_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes) VQ_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, as_stream(stream)));
}
void memset_device_async(void* dst, int value, size_t bytes, void* stream) {
  if (bytes) VQ_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, as_stream(stream)));
}

Graph::~Graph() { reset(); }

void Graph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  exec_ = nullptr;
}

void Graph::begin_capture(void* stream) {
  reset();
  VQ_CUDA_CHECK(cudaStreamBeginCapture(as_stream(stream), cudaStreamCaptureModeThreadLocal));
}

void Graph::end_capture(void* stream) {
  cudaGraph_t g = nullptr;
  const cudaError_t e = cudaStreamEndCapture(as_stream(stream), &g);
  if (e != cudaSuccess) {
    cudaGetLastError();
    if (g) cudaGraphDestroy(g);
    VQ_FAIL("CUDA graph: capture failed: {}", cudaGetErrorString(e));
  }
  cudaGraphExec_t ex = nullptr;
  const cudaError_t e2 = cudaGraphInstantiate(&ex, g, 0);
  cudaGraphDestroy(g);
  if (e2 != cudaSuccess) {
    cudaGetLastError();
    VQ_FAIL("CUDA graph: instantiation failed: {}", cudaGetErrorString(e2));
  }
  exec_ = ex;
}

void Graph::abort_capture(void* stream) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(as_stream(stream), &st) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  if (st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(as_stream(stream), &g);
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();
  }
}

void Graph::launch(void* stream) const {
  VQ_CHECK(exec_ != nullptr, "CUDA graph: launch of an empty graph");
  VQ_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), as_stream(stream)));
}

Event::Event() {
  VQ_CHECK(cuda_device_available(), "CUDA event: {}", cuda_unavailable_reason());
  cudaEvent_t e = nullptr;
  VQ_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  e_ = e;
}

Event::~Event() {
  if (e_) cudaEventDestroy(static_cast<cudaEvent_t>(e_));
}

void Event::record(void* stream) { VQ_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(e_), as_stream(stream))); }
void Event::synchronize() const { VQ_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(e_))); }
void Event::wait(void* stream) const {
  VQ_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), static_cast<cudaEvent_t>(e_), 0));
}

EventTimer::EventTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  VQ_CUDA_CHECK(cudaEventCreate(&a));
  VQ_CUDA_CHECK(cudaEventCreate(&b));
  a_ = a, b_ = b;
}
EventTimer::~EventTimer() {
  if (a_) cudaEventDestroy(static_cast<cudaEvent_t>(a_));
  if (b_) cudaEventDestroy(static_cast<cudaEvent_t>(b_));
}
void EventTimer::start(void* stream) { VQ_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(a_), as_stream(stream))); }
void EventTimer::stop(void* stream) { VQ_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(b_), as_stream(stream))); }
float EventTimer::elapsed_ms() const {
  VQ_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(b_)));
  float ms = 0;
  VQ_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a_), static_cast<cudaEvent_t>(b_)));
  return ms;
}

size_t device_free_bytes(size_t* total) {
  VQ_CHECK(cuda_device_available(), "CUDA memory info: {}", cuda_unavailable_reason());
  size_t f = 0, t = 0;
  VQ_CUDA_CHECK(cudaMemGetInfo(&f, &t));
  if (total) *total = t;
  return f;
}

int device_sm_count() {
  static int v = [] {
    int dev = 0, n = 0;
    VQ_CUDA_CHECK(cudaGetDevice(&dev));
    VQ_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return v;
}

double measure_copy_bandwidth(size_t bytes) {
  bytes = bytes / 2 / 256 * 256;
  DeviceBuffer a(bytes), b(bytes);
  a.fill_bytes(1);
  Stream s;
  EventTimer t;
  for (int i = 0; i < 2; ++i) copy_device_async(b.data(), a.data(), bytes, s.handle());
  std::vector<float> ms;
  for (int i = 0; i < 10; ++i) {
    t.start(s.handle());
    copy_device_async(b.data(), a.data(), bytes, s.handle());
    t.stop(s.handle());
    ms.push_back(t.elapsed_ms());
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * double(bytes) / (double(ms[ms.size() / 2]) * 1e6);
}

}  // namespace vq::cuda
