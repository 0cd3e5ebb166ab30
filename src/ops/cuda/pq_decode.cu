// Code -> vector gathers (see pq.h): plain uint16 codes to f32, and packed rows to f16/bf16/f32.
// One thread per (row, sub-vector): the sub-vector's code is read once, its sub_dim elements
// are written contiguously. Memory-bound; codebooks stay in L1/L2.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_decode.cuh"
#include "ops/cuda/stream_cuda.h"

namespace vq::cuda {
namespace {

// The vectorised kernel's shipped configuration (bench/cuda/pq_decode_variants.cu times the others).
// Runs 15-16 (BENCHMARKS.md (c)): 4 chunks per thread, streaming stores; shared books ~16 blocks
// per SM; per-sub-space books: row groups of 4 chunks (a block stages only their 8 or 4 books, 16 or
// 8 KiB) and ~2 blocks per SM in total (more blocks re-stage the books more often: measured slower).
constexpr int kDecItems = 4;
constexpr bool kDecStream = true;
constexpr int kDecWavesShared = 16;
constexpr int kDecWavesPer = 2;
constexpr int kDecGroupChunks = 4;

__global__ void pq_decode_kernel(int64_t total, int n_sub, int DS, int K, int books, const uint16_t* codes,
                                 const float* codebooks, float* out) {
  for (int64_t it = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; it < total; it += int64_t(gridDim.x) * blockDim.x) {
    const int sub = int(it % n_sub);
    const uint32_t c = codes[it] % uint32_t(K);
    const float* src = codebooks + ((books > 1 ? int64_t(sub) * K : 0) + c) * DS;
    for (int e = 0; e < DS; ++e) out[it * DS + e] = __ldg(src + e);
  }
}

__device__ __forceinline__ uint32_t read_packed(const uint8_t* row, int i, int bits) {
  if (bits == 8) return row[i];
  const int64_t bit = int64_t(i) * bits;
  const uint8_t* q = row + (bit >> 3);
  const unsigned shift = unsigned(bit & 7);
  const unsigned need = shift + unsigned(bits);
  uint32_t v = q[0];
  if (need > 8) v |= uint32_t(q[1]) << 8;
  if (need > 16) v |= uint32_t(q[2]) << 16;
  return (v >> shift) & ((1u << bits) - 1u);
}

__device__ __forceinline__ void store_elem(void* out, int64_t i, float v, int type) {
  if (type == 0) static_cast<float*>(out)[i] = v;
  else if (type == 1) static_cast<__half*>(out)[i] = __float2half_rn(v);
  else static_cast<__nv_bfloat16*>(out)[i] = __float2bfloat16_rn(v);
}

__global__ void decode_codes_kernel(CodeDecodeArgs a, int n_sub, int K, int books, int type) {
  const int h = blockIdx.y;
  const int64_t total = a.n_tokens * n_sub;
  for (int64_t it = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; it < total; it += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = it / n_sub;
    const int sub = int(it - t * n_sub);
    const uint8_t* row = a.codes + int64_t(h) * a.code_head_stride + t * a.code_token_stride;
    const uint32_t c = read_packed(row, sub, a.bits);
    const float* src = a.codebooks + ((int64_t(h) * books + (books > 1 ? sub : 0)) * K + c) * a.sub_dim;
    const int64_t o = int64_t(h) * a.out_head_stride + t * a.out_token_stride + int64_t(sub) * a.sub_dim;
    for (int e = 0; e < a.sub_dim; ++e) store_elem(a.out, o + e, __ldg(src + e), type);
  }
}

unsigned grid_for(int64_t total, int threads) {
  return unsigned(std::max<int64_t>(1, std::min<int64_t>((total + threads - 1) / threads, 65535)));
}

}  // namespace

void pq_decode_device(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out, void* stream) {
  check_pq_shape(s, "cuda::pq_decode");
  VQ_CHECK(cuda_device_available(), "cuda::pq_decode: {}", cuda_unavailable_reason());
  const int64_t total = s.n * s.n_sub;
  if (total == 0) return;
  pq_decode_kernel<<<grid_for(total, 256), 256, 0, as_stream(stream)>>>(total, s.n_sub, s.sub_dim, s.n_centroids,
                                                                          pq_n_books(s), codes, codebooks, out);
  VQ_CUDA_LAUNCHED("pq_decode_kernel");
}

void pq_decode(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out) {
  check_pq_shape(s, "cuda::pq_decode");
  const int64_t total = s.n * s.n_sub;
  for (int64_t i = 0; i < total; ++i)
    VQ_CHECK(codes[i] < s.n_centroids, "cuda::pq_decode: code {} at [{}, {}] >= n_centroids {}", codes[i],
             i / s.n_sub, i % s.n_sub, s.n_centroids);
  const size_t cb = size_t(pq_n_books(s)) * s.n_centroids * s.sub_dim * 4;
  const size_t ob = size_t(total) * s.sub_dim * 4;
  DeviceBuffer dcodes = to_device(codes, size_t(total) * 2), dbook = to_device(codebooks, cb), dout(ob);
  pq_decode_device(s, dcodes.as<uint16_t>(), dbook.as<float>(), dout.as<float>());
  device_synchronize();
  dout.download(out, ob);
}

void decode_codes_device(const CodeDecodeArgs& a, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::decode_codes: {}", cuda_unavailable_reason());
  VQ_CHECK(a.sub_dim >= 1 && a.head_dim % a.sub_dim == 0, "cuda::decode_codes: head_dim {} vs sub_dim {}",
           a.head_dim, a.sub_dim);
  VQ_CHECK(a.bits >= 1 && a.bits <= 16, "cuda::decode_codes: bits = {} must be in 1..16", a.bits);
  VQ_CHECK(a.n_heads >= 1 && a.n_heads <= 65535, "cuda::decode_codes: n_heads = {}", a.n_heads);
  const int n_sub = a.head_dim / a.sub_dim;
  const int64_t total = a.n_tokens * n_sub;
  if (total == 0) return;
  if (detail::decode_codes_vec_ok(a)) {
    const cudaStream_t s = as_stream(stream);
    const bool bf = a.out_type == ElemType::bf16;
    const int w = a.per_subspace ? kDecWavesPer : kDecWavesShared, gc = kDecGroupChunks;
    if (a.sub_dim == 4) {
      if (bf) detail::launch_decode_vec<4, true, kDecItems, kDecStream>(a, w, s, gc);
      else detail::launch_decode_vec<4, false, kDecItems, kDecStream>(a, w, s, gc);
    } else {
      if (bf) detail::launch_decode_vec<8, true, kDecItems, kDecStream>(a, w, s, gc);
      else detail::launch_decode_vec<8, false, kDecItems, kDecStream>(a, w, s, gc);
    }
    VQ_CUDA_LAUNCHED("decode_codes_vec_kernel");
    return;
  }
  const int type = a.out_type == ElemType::f32 ? 0 : a.out_type == ElemType::f16 ? 1 : 2;
  decode_codes_kernel<<<dim3(grid_for(total, 256), unsigned(a.n_heads)), 256, 0, as_stream(stream)>>>(
      a, n_sub, 1 << a.bits, a.per_subspace ? n_sub : 1, type);
  VQ_CUDA_LAUNCHED("decode_codes_kernel");
}

}  // namespace vq::cuda
