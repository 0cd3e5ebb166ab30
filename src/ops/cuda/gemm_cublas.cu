// cuBLAS products for prefill and batched decode (gemm_cuda.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/gemm_cuda.h"

namespace vq::cuda {

struct GemmHandle::Impl {
  cublasHandle_t h = nullptr;
  void* ws = nullptr;
  size_t ws_bytes = 0;
  ~Impl() {
    if (h) cublasDestroy(h);
    if (ws) cudaFree(ws);
  }
};

namespace {

#define VQ_CUBLAS_CHECK(expr, ...)                                                                      \
  do {                                                                                                  \
    const cublasStatus_t vq_st_ = (expr);                                                               \
    if (vq_st_ != CUBLAS_STATUS_SUCCESS)                                                                \
      VQ_FAIL("cuBLAS: {} failed ({}): {}", #expr, cublasGetStatusString(vq_st_), fmt::format(__VA_ARGS__)); \
  } while (0)

cudaDataType_t cuda_type(ElemType t) {
  return t == ElemType::f32 ? CUDA_R_32F : t == ElemType::f16 ? CUDA_R_16F : CUDA_R_16BF;
}

}  // namespace

GemmHandle::GemmHandle(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  VQ_CHECK(cuda_device_available(), "cuda::GemmHandle: {}", cuda_unavailable_reason());
  VQ_CUBLAS_CHECK(cublasCreate(&impl_->h), "creating the handle");
  if (workspace_bytes) VQ_CUDA_CHECK(cudaMalloc(&impl_->ws, workspace_bytes));
  impl_->ws_bytes = workspace_bytes;
}

GemmHandle::~GemmHandle() = default;

void gemm_device(GemmHandle& handle, const GemmParams& p, void* stream) {
  GemmHandle::Impl& h = *handle.impl();
  const int64_t ldw = p.ldw ? p.ldw : p.k, ldx = p.ldx ? p.ldx : p.k, ldy = p.ldy ? p.ldy : p.n;
  VQ_CHECK(p.ab_type != ElemType::f32, "cuda::gemm([{}x{}] . [{}x{}]^T): weights and activations must be f16 or bf16",
           p.m, p.k, p.n, p.k);
  VQ_CHECK(p.m >= 0 && p.n >= 0 && p.k >= 1 && p.m < (int64_t(1) << 31) && p.n < (int64_t(1) << 31) &&
               p.k < (int64_t(1) << 31),
           "cuda::gemm: shape m={} n={} k={} out of range", p.m, p.n, p.k);
  VQ_CHECK(ldw >= p.k && ldx >= p.k && ldy >= p.n && ldw < (int64_t(1) << 31) && ldx < (int64_t(1) << 31) &&
               ldy < (int64_t(1) << 31),
           "cuda::gemm(m={} n={} k={}): strides ldw={} ldx={} ldy={} too small or too large", p.m, p.n, p.k, ldw, ldx,
           ldy);
  if (p.m == 0 || p.n == 0) return;
  VQ_CHECK(p.w && p.x && p.y, "cuda::gemm(m={} n={} k={}): null pointer", p.m, p.n, p.k);
  // cublasSetStream resets the workspace to cuBLAS's own pool: set ours again after it.
  VQ_CUBLAS_CHECK(cublasSetStream(h.h, as_stream(stream)), "m={} n={} k={}", p.m, p.n, p.k);
  if (h.ws) VQ_CUBLAS_CHECK(cublasSetWorkspace(h.h, h.ws, h.ws_bytes), "m={} n={} k={}", p.m, p.n, p.k);
  const float alpha = 1.0f, beta = p.accumulate ? 1.0f : 0.0f;
  // Row-major y[m, n] = x[m, k] W[n, k]^T is column-major y^T (n x m) = W^T' x^T', where the
  // row-major W is the column-major k x n matrix (op T) and x the column-major k x m one.
  VQ_CUBLAS_CHECK(cublasGemmEx(h.h, CUBLAS_OP_T, CUBLAS_OP_N, int(p.n), int(p.m), int(p.k), &alpha, p.w,
                               cuda_type(p.ab_type), int(ldw), p.x, cuda_type(p.ab_type), int(ldx), &beta, p.y,
                               cuda_type(p.y_type), int(ldy), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                  "y[{}, {}] {}= x[{}, {}] . W[{}, {}]^T ({} in, {} out)", p.m, p.n, p.accumulate ? "+" : "", p.m,
                  p.k, p.n, p.k, elem_type_name(p.ab_type), elem_type_name(p.y_type));
}

}  // namespace vq::cuda
