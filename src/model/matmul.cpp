// Threaded weight products: y = x @ W^T with W rows in a GGML type. Threads split the weight
// rows (each thread streams its own part of W once); the activation rows are quantized once
// per call (or once for several calls through ActivationBuffer).
#include <algorithm>

#include "core/buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/matmul_kernels.h"
#include "model/gguf.h"
#include "model/weight_formats.h"

namespace vq {

namespace {

bool is_float_type(GGMLType t) { return t == GGMLType::F32 || t == GGMLType::F16 || t == GGMLType::BF16; }

// Below this many weight bytes (times activation rows) per thread, waking another thread costs
// more than it saves (a wake-up is several microseconds; 32 KB stream in about 3 us).
constexpr size_t kMinBytesPerThread = 32 * 1024;

size_t grain_rows(size_t row_bytes, int64_t M) {
  const size_t work = std::max<size_t>(1, row_bytes * size_t(std::max<int64_t>(1, M)));
  return std::max<size_t>(1, (kMinBytesPerThread + work - 1) / work);
}

void check_args(GGMLType t, int64_t rows, int64_t cols, int64_t M) {
  if (!ggml_type_supported(t)) VQ_FAIL("matmul: weight type {} ({}) is not supported", ggml_type_name(t), uint32_t(t));
  VQ_CHECK(rows >= 0 && cols >= 0 && M >= 0, "matmul: bad shape rows={} cols={} M={}", rows, cols, M);
  VQ_CHECK(cols % ggml_block_elems(t) == 0, "matmul: cols {} is not a multiple of the {} block size {}", cols,
           ggml_type_name(t), ggml_block_elems(t));
}

}  // namespace

struct ActivationBuffer::Storage {
  AlignedBuffer<int8_t> q;   // q: [M, cols] int8
  AlignedBuffer<float> d;    // d: [M, cols/32] f32
  AlignedBuffer<float> s;    // s: [M, cols/32] f32
};

ActivationBuffer::ActivationBuffer() : st_(new Storage) {}
ActivationBuffer::~ActivationBuffer() { delete st_; }

const QuantizedRows& ActivationBuffer::quantize(const float* x, int64_t M, int64_t cols) {
  VQ_CHECK(M >= 0 && cols >= 0 && cols % 32 == 0, "quantize activations: cols {} must be a multiple of 32 (M={})",
           cols, M);
  const size_t n = size_t(M * cols), nb = size_t(M * (cols / 32));
  if (st_->q.size() < n) st_->q.resize(n);
  if (st_->d.size() < nb) st_->d.resize(nb), st_->s.resize(nb);
  rows_.M = M;
  rows_.cols = cols;
  rows_.q = st_->q.data();
  rows_.d = st_->d.data();
  rows_.s = st_->s.data();
  rows_.x = x;
  if (n) quantize_rows_kernel(x, M, cols, rows_.q, rows_.d, rows_.s);
  return rows_;
}

void matmul_q(GGMLType t, const void* W, int64_t rows, int64_t cols, const QuantizedRows& X, float* y) {
  check_args(t, rows, cols, X.M);
  VQ_CHECK(X.cols == cols, "matmul: activations have {} columns, the weight has {}", X.cols, cols);
  if (rows == 0 || X.M == 0) return;
  const uint8_t* w = static_cast<const uint8_t*>(W);
  const size_t rb = ggml_row_bytes(t, cols);
  if (is_float_type(t)) {
    VQ_CHECK(X.x != nullptr, "matmul: float weights need the float activations");
    parallel_for(
        size_t(rows),
        [&](size_t r0, size_t r1, int) { float_rows_kernel(uint32_t(t), w, rb, int64_t(r0), int64_t(r1), X.x, X.M, cols, y, rows); },
        grain_rows(rb, X.M));
    return;
  }
  parallel_for(
      size_t(rows),
      [&](size_t r0, size_t r1, int) { quant_rows_kernel(uint32_t(t), w, rb, int64_t(r0), int64_t(r1), X, y, rows); },
      grain_rows(rb, X.M));
}

void matmul(GGMLType t, const void* W, int64_t rows, int64_t cols, const float* x, int64_t M, float* y) {
  check_args(t, rows, cols, M);
  if (rows == 0 || M == 0) return;
  if (is_float_type(t)) {
    QuantizedRows X;
    X.M = M, X.cols = cols, X.x = x;
    matmul_q(t, W, rows, cols, X, y);
    return;
  }
  thread_local ActivationBuffer buf;  // reused across calls of this thread
  matmul_q(t, W, rows, cols, buf.quantize(x, M, cols), y);
}

// (declared in gguf.h; here so that the reader alone builds without the kernels, e.g. for fuzzing)
void matmul(const GGUFTensorInfo& w, const float* x, int64_t M, float* y) {
  require_supported(w);
  VQ_CHECK(w.dims.size() == 2, "tensor '{}': matmul needs a 2-D weight, it has {} dims", w.name, w.dims.size());
  matmul(w.type, w.data, w.dims[1], w.dims[0], x, M, y);
}

}  // namespace vq
