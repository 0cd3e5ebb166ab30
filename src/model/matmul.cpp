// Threaded weight products: y = x @ W^T with W rows in a GGML type. Threads split the weight
// rows (each thread streams its own part of W once); the activation rows are quantized once
// per call (or once for several calls through ActivationBuffer).
#include <algorithm>
#include <vector>

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
// more than it saves: a parallel_for wake-up takes 5-20 us on the 2-core machine, and 64 KB of
// Q4_1 stream through the kernel in about 4 us. (k/v projections of SmolLM2, 69 KB, stay on
// one thread; q/o, 207 KB, split in two.)
constexpr size_t kMinBytesPerThread = 64 * 1024;

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
  if (n == 0) return rows_;
  // Prefill: rows in parallel (on 16 threads a serial quantization would take ~15% of a layer's
  // products); a few rows stay on the calling thread (a wake-up costs more).
  const size_t grain = std::max<size_t>(1, size_t(64 * 1024) / size_t(cols));
  parallel_for(
      size_t(M),
      [&](size_t m0, size_t m1, int) {
        quantize_rows_kernel(x + int64_t(m0) * cols, int64_t(m1 - m0), cols, rows_.q + int64_t(m0) * cols,
                             rows_.d + int64_t(m0) * (cols / 32), rows_.s + int64_t(m0) * (cols / 32));
      },
      grain);
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

void matmul_q_multi(const MatmulJob* jobs, int n_jobs, int64_t cols, const QuantizedRows& X) {
  VQ_CHECK(n_jobs >= 0, "matmul: {} jobs", n_jobs);
  std::vector<int64_t> start(static_cast<size_t>(n_jobs) + 1, 0);  // start: [n_jobs + 1] first row of each job
  std::vector<size_t> rbs(static_cast<size_t>(n_jobs));           // rbs: [n_jobs] row bytes
  size_t bytes = 0;
  for (int j = 0; j < n_jobs; ++j) {
    const MatmulJob& jb = jobs[j];
    check_args(jb.type, jb.rows, cols, X.M);
    VQ_CHECK(X.cols == cols, "matmul: activations have {} columns, the weight has {}", X.cols, cols);
    VQ_CHECK(!is_float_type(jb.type) || X.x != nullptr, "matmul: float weights need the float activations");
    rbs[size_t(j)] = ggml_row_bytes(jb.type, cols);
    start[size_t(j) + 1] = start[size_t(j)] + jb.rows;
    bytes += rbs[size_t(j)] * size_t(jb.rows);
  }
  const int64_t total = start.back();
  if (total == 0 || X.M == 0) return;
  parallel_for(
      size_t(total),
      [&](size_t a, size_t b, int) {
        for (int j = 0; j < n_jobs; ++j) {
          const int64_t lo = std::max<int64_t>(int64_t(a), start[size_t(j)]);
          const int64_t hi = std::min<int64_t>(int64_t(b), start[size_t(j) + 1]);
          if (lo >= hi) continue;
          const MatmulJob& jb = jobs[j];
          const uint8_t* w = static_cast<const uint8_t*>(jb.W);
          const int64_t r0 = lo - start[size_t(j)], r1 = hi - start[size_t(j)];
          if (is_float_type(jb.type))
            float_rows_kernel(uint32_t(jb.type), w, rbs[size_t(j)], r0, r1, X.x, X.M, cols, jb.y, jb.rows);
          else
            quant_rows_kernel(uint32_t(jb.type), w, rbs[size_t(j)], r0, r1, X, jb.y, jb.rows);
        }
      },
      grain_rows(std::max<size_t>(1, bytes / size_t(total)), X.M));
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

// (the tensor-level products are declared in gguf.h and live here so that the reader alone
// builds without the kernels, e.g. for fuzzing)
static void check_weight(const GGUFTensorInfo& w) {
  require_supported(w);
  VQ_CHECK(w.dims.size() == 2, "tensor '{}': matmul needs a 2-D weight, it has {} dims", w.name, w.dims.size());
}

void matmul(const GGUFTensorInfo& w, const float* x, int64_t M, float* y) {
  check_weight(w);
  matmul(w.type, w.data, w.dims[1], w.dims[0], x, M, y);
}

void matmul_multi(const std::vector<const GGUFTensorInfo*>& ws, const float* x, int64_t M,
                  const std::vector<float*>& ys) {
  VQ_CHECK(ws.size() == ys.size(), "matmul_multi: {} weights but {} outputs", ws.size(), ys.size());
  if (ws.empty()) return;
  std::vector<MatmulJob> jobs;
  for (size_t i = 0; i < ws.size(); ++i) {
    check_weight(*ws[i]);
    VQ_CHECK(ws[i]->dims[0] == ws[0]->dims[0], "matmul_multi: tensor '{}' has {} columns, tensor '{}' has {}",
             ws[i]->name, ws[i]->dims[0], ws[0]->name, ws[0]->dims[0]);
    jobs.push_back({ws[i]->type, ws[i]->data, ws[i]->dims[1], ys[i]});
  }
  const int64_t cols = ws[0]->dims[0];
  bool all_float = true;
  for (const auto& j : jobs) all_float = all_float && is_float_type(j.type);
  if (all_float || cols % 32 != 0) {  // nothing to quantize (or cannot): one product each
    for (size_t i = 0; i < ws.size(); ++i) matmul(*ws[i], x, M, ys[i]);
    return;
  }
  thread_local ActivationBuffer buf;
  matmul_q_multi(jobs.data(), int(jobs.size()), cols, buf.quantize(x, M, cols));
}

}  // namespace vq
