// GGUF weight types on the device: type table, decode to f32 / f16 / bf16, upload (weights_cuda.h).
#include <cuda_runtime.h>

#include <algorithm>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/ggml_decode.cuh"
#include "ops/cuda/weights_cuda.h"

namespace vq::cuda {
namespace {

struct TypeRow {
  uint32_t id;
  const char* name;
  int block_elems;
  size_t block_bytes;
};
constexpr TypeRow kTypes[] = {
    {ggml::F32, "f32", 1, 4},      {ggml::F16, "f16", 1, 2},      {ggml::BF16, "bf16", 1, 2},
    {ggml::Q4_0, "q4_0", 32, 18},  {ggml::Q4_1, "q4_1", 32, 20},  {ggml::Q5_0, "q5_0", 32, 22},
    {ggml::Q5_1, "q5_1", 32, 24},  {ggml::Q8_0, "q8_0", 32, 34},  {ggml::Q4_K, "q4_K", 256, 144},
    {ggml::Q5_K, "q5_K", 256, 176}, {ggml::Q6_K, "q6_K", 256, 210},
};
const TypeRow* find_type(uint32_t t) {
  for (const TypeRow& r : kTypes)
    if (r.id == t) return &r;
  return nullptr;
}

constexpr int kThreads = 256;

unsigned grid_for(int64_t work) { return unsigned(std::clamp<int64_t>((work + kThreads - 1) / kThreads, 1, 1 << 20)); }

// One thread per group of 32 output elements (gi over rows * cols/32).
template <uint32_t T, int E>
__global__ void dequant_blocks_kernel(const uint8_t* __restrict__ src, int64_t rows, int64_t cols, size_t row_bytes,
                                      void* __restrict__ out, int* overflow) {
  const int64_t gpr = cols / 32, total = rows * gpr;
  bool over = false;
  for (int64_t gi = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; gi < total; gi += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = gi / gpr, jr = gi % gpr;
    const uint8_t* blk = src + r * row_bytes + (jr / detail::kGroupsPerBlock<T>) * detail::kBlockBytes<T>;
    float y[32];
    detail::decode_group<T>(blk, int(jr % detail::kGroupsPerBlock<T>), y);
    const int64_t o = r * cols + jr * 32;
    if (E == 1) {
#pragma unroll
      for (int i = 0; i < 32; ++i) over |= fabsf(y[i]) >= 65520.f && isfinite(y[i]);
    }
    detail::store_group<E>(out, o, y);
  }
  if (over && overflow) atomicOr(overflow, 1);
}

// Float source types: one element per thread.
template <uint32_t T, int E>
__global__ void dequant_float_kernel(const uint8_t* __restrict__ src, int64_t n, void* __restrict__ out, int* overflow) {
  bool over = false;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = detail::decode_float_elem<T>(src, i);
    if (E == 1) over |= fabsf(v) >= 65520.f && isfinite(v);
    detail::store_elem<E>(out, i, v);
  }
  if (over && overflow) atomicOr(overflow, 1);
}

template <class F>
void dispatch_elem(ElemType e, F&& f) {
  if (e == ElemType::f32) f(std::integral_constant<int, 0>{});
  else if (e == ElemType::f16) f(std::integral_constant<int, 1>{});
  else f(std::integral_constant<int, 2>{});
}

}  // namespace

bool weight_type_supported(uint32_t type) { return find_type(type) != nullptr; }
const char* weight_type_name(uint32_t type) {
  const TypeRow* r = find_type(type);
  return r ? r->name : "unsupported";
}
int weight_block_elems(uint32_t type) {
  const TypeRow* r = find_type(type);
  return r ? r->block_elems : 0;
}
size_t weight_block_bytes(uint32_t type) {
  const TypeRow* r = find_type(type);
  return r ? r->block_bytes : 0;
}
size_t weight_row_bytes(uint32_t type, int64_t cols) {
  const TypeRow* r = find_type(type);
  VQ_CHECK(r, "cuda weights: GGUF type id {} is not supported (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, "
           "q5_K, q6_K are)", type);
  VQ_CHECK(cols > 0 && cols % r->block_elems == 0, "cuda weights: a {} row of {} elements is not a positive multiple "
           "of the block size {}", r->name, cols, r->block_elems);
  return size_t(cols / r->block_elems) * r->block_bytes;
}

void dequantize_device(const DequantParams& p, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::dequantize: {}", cuda_unavailable_reason());
  const size_t rb = weight_row_bytes(p.type, p.cols);
  const char* tn = weight_type_name(p.type);
  VQ_CHECK(p.rows >= 0, "cuda::dequantize({} [{}, {}]): negative rows", tn, p.rows, p.cols);
  if (p.rows == 0) return;
  VQ_CHECK(p.src && p.out, "cuda::dequantize({} [{}, {}]): null src or out", tn, p.rows, p.cols);
  const uint8_t* src = static_cast<const uint8_t*>(p.src);
  VQ_CHECK(weight_block_elems(p.type) == 1 || reinterpret_cast<uintptr_t>(p.out) % 16 == 0,
           "cuda::dequantize({} [{}, {}]): out must be 16-byte aligned", tn, p.rows, p.cols);
  cudaStream_t st = as_stream(stream);
  bool ok = false;
  if (weight_block_elems(p.type) == 1) {
    const int64_t n = p.rows * p.cols;
    ok = detail::dispatch_float_type(p.type, [&](auto tt) {
      dispatch_elem(p.out_type, [&](auto e) {
        dequant_float_kernel<decltype(tt)::value, decltype(e)::value><<<grid_for(n), kThreads, 0, st>>>(src, n, p.out, p.overflow);
      });
    });
  } else {
    const int64_t groups = p.rows * (p.cols / 32);
    ok = detail::dispatch_block_type(p.type, [&](auto tt) {
      dispatch_elem(p.out_type, [&](auto e) {
        dequant_blocks_kernel<decltype(tt)::value, decltype(e)::value>
            <<<grid_for(groups), kThreads, 0, st>>>(src, p.rows, p.cols, rb, p.out, p.overflow);
      });
    });
  }
  VQ_CHECK(ok, "cuda::dequantize: no decoder for {}", tn);
  VQ_CUDA_LAUNCHED("dequantize");
}

void upload_dequantized(const UploadParams& p, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::upload_dequantized({}): {}", p.name, cuda_unavailable_reason());
  const size_t bytes = size_t(std::max<int64_t>(p.rows, 0)) * weight_row_bytes(p.type, p.cols);
  VQ_CHECK(p.host && p.staging && p.overflow_flag, "cuda::upload_dequantized({}): null host, staging or overflow flag",
           p.name);
  VQ_CHECK(p.staging_bytes >= bytes, "cuda::upload_dequantized({} {} [{}, {}]): staging of {} bytes < {} needed", p.name,
           weight_type_name(p.type), p.rows, p.cols, p.staging_bytes, bytes);
  cudaStream_t st = as_stream(stream);
  VQ_CUDA_CHECK(cudaMemsetAsync(p.overflow_flag, 0, sizeof(int), st));
  VQ_CUDA_CHECK(cudaMemcpyAsync(p.staging, p.host, bytes, cudaMemcpyHostToDevice, st));
  DequantParams d;
  d.type = p.type, d.src = p.staging, d.rows = p.rows, d.cols = p.cols;
  d.out_type = p.out_type, d.out = p.out, d.overflow = p.overflow_flag;
  dequantize_device(d, stream);
  int over = 0;
  VQ_CUDA_CHECK(cudaMemcpyAsync(&over, p.overflow_flag, sizeof(int), cudaMemcpyDeviceToHost, st));
  VQ_CUDA_CHECK(cudaStreamSynchronize(st));
  VQ_CHECK(!over, "cuda::upload_dequantized({} {} [{}, {}]): values beyond the f16 range (|x| >= 65520); upload this "
           "tensor as bf16 or f32", p.name, weight_type_name(p.type), p.rows, p.cols);
}

}  // namespace vq::cuda
