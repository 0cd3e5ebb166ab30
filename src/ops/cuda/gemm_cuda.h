#pragma once
// Dense products on the GPU through cuBLAS (vq::cuda), for prefill and batched decode:
//   y[m, n] (+)= x[m, k] . W[n, k]^T      (row-major; W as the GGUF stores it: one row per output)
// with fp16 (or bf16) weights and activations and fp32 accumulation; y in f32, f16 or bf16.
// No CUDA types here: GemmHandle hides the cuBLAS handle; streams are `void*` (cudaStream_t).
#include <cstdint>
#include <memory>

#include "ops/cuda/elem_type.h"

namespace vq::cuda {

// One cuBLAS handle with its own device workspace (so that cuBLAS allocates nothing during a
// call and the products can be captured into a CUDA graph). Not thread-safe: one handle per
// host thread (it may serve several streams from that thread). Create it outside graph capture.
class GemmHandle {
 public:
  explicit GemmHandle(size_t workspace_bytes = size_t(32) << 20);
  ~GemmHandle();
  GemmHandle(const GemmHandle&) = delete;
  GemmHandle& operator=(const GemmHandle&) = delete;
  struct Impl;
  Impl* impl() const { return impl_.get(); }

 private:
  std::unique_ptr<Impl> impl_;
};

struct GemmParams {
  int64_t m = 0;               // activation rows (tokens)
  int64_t n = 0;               // output features = weight rows
  int64_t k = 0;               // input features
  ElemType ab_type = ElemType::f16;  // f16 or bf16: weights and activations
  const void* w = nullptr;     // [n, k] row-major, row stride ldw elements (device)
  int64_t ldw = 0;             // 0: k
  const void* x = nullptr;     // [m, k] row-major, row stride ldx (device)
  int64_t ldx = 0;             // 0: k
  ElemType y_type = ElemType::f32;
  void* y = nullptr;           // [m, n] row-major, row stride ldy (device)
  int64_t ldy = 0;             // 0: n
  bool accumulate = false;     // y += x W^T (beta = 1): fuses the residual add after wo / w_down
};
// Asynchronous on `stream`; throws vq::Error naming the shape when cuBLAS refuses it.
void gemm_device(GemmHandle& h, const GemmParams& p, void* stream = nullptr);

// The batch-invariant product of the deterministic mode (EngineOptions::deterministic): the same
// y (f16 weights and activations, y f32 or f16, accumulate as above), but each element is one
// fixed chain of fp16 tensor-core steps over k (16 at a time, ascending, fp32 accumulator from 0,
// then added to y when accumulating), whatever m is and wherever its row falls: a row's result
// is bit-identical whether it is computed alone or beside any other rows. Needs k, ldw and ldx
// multiples of 8 and 16-byte aligned w and x (throws naming what is not). No handle: our own
// kernel (gemm_invariant.cu says why not cuBLAS).
void gemm_invariant_device(const GemmParams& p, void* stream = nullptr);
// Rows per block tile it uses for m rows (16, 64 or 128; the tests cover each).
int gemm_invariant_tile_rows(int64_t m);

}  // namespace vq::cuda
