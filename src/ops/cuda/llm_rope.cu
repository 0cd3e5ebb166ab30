// RoPE and the embedding lookup (llm_ops_cuda.h).
#include <cuda_runtime.h>

#include <algorithm>

#include "ops/cuda/cuda_check.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/ggml_decode.cuh"
#include "ops/cuda/llm_ops_cuda.h"
#include "ops/cuda/pdl.cuh"
#include "ops/cuda/weights_cuda.h"

namespace vq::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxHalf = 256;  // n_rot/2 for head_dim up to 512
constexpr int kPairs = 256;    // rope: pairs (threads) per block

struct RopeK {
  int head_dim, half;
  bool neox;
  const int32_t* pos;
  const double* inv_freq;
  float mscale;
  float* q;
  int nq;
  int64_t qs;
  float* k;
  int nk;
  int64_t ks;
};

// Grid (tokens, pair chunks), kPairs threads: each block computes the token's cos/sin (double
// angle, as the CPU forward) for the `half` frequencies into shared memory, then each thread
// rotates one (head, pair) of q or k with the CPU's fp32 ops. One pair per thread keeps the
// decode step's launch (one token, (n_q + n_k) * half pairs) to one dependent load per thread.
__global__ void __launch_bounds__(kPairs) rope_kernel(RopeK p) {
  __shared__ float cs[kMaxHalf], sn[kMaxHalf];
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const double pos = double(p.pos[t]);
  for (int i = threadIdx.x; i < p.half; i += kPairs) {
    double s, c;
    sincos(__dmul_rn(pos, p.inv_freq[i]), &s, &c);
    cs[i] = __fmul_rn(float(c), p.mscale);
    sn[i] = __fmul_rn(float(s), p.mscale);
  }
  __syncthreads();
  const int pairs = (p.nq + p.nk) * p.half;
  const int j = blockIdx.y * kPairs + threadIdx.x;
  if (j >= pairs) return;
  const int h = j / p.half, i = j % p.half;
  float* v = h < p.nq ? p.q + t * p.qs + int64_t(h) * p.head_dim : p.k + t * p.ks + int64_t(h - p.nq) * p.head_dim;
  const int ia = p.neox ? i : 2 * i, ib = p.neox ? i + p.half : 2 * i + 1;
  const float a = v[ia], b = v[ib], c = cs[i], sv = sn[i];
  v[ia] = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sv));
  v[ib] = __fadd_rn(__fmul_rn(a, sv), __fmul_rn(b, c));
}

struct EmbK {
  const uint8_t* table;
  size_t row_bytes;
  int64_t n_vocab;
  int n_embd;
  const int32_t* tokens;
  float scale;
  float* out;
  int64_t os;
};

// One block per token; a thread decodes groups of 32 elements (block types) or single elements.
template <uint32_t T, bool kBlocks>
__global__ void __launch_bounds__(kThreads) embedding_kernel(EmbK p) {
  pdl_wait();  // launched with PDL (pdl.cuh)
  pdl_trigger();
  const int64_t t = blockIdx.x;
  const int32_t tok = p.tokens[t];
  float* out = p.out + t * p.os;
  if (tok < 0 || int64_t(tok) >= p.n_vocab) {
    for (int i = threadIdx.x; i < p.n_embd; i += kThreads) out[i] = __int_as_float(0x7fc00000);
    return;
  }
  const uint8_t* row = p.table + int64_t(tok) * p.row_bytes;
  if constexpr (kBlocks) {
    for (int g = threadIdx.x; g < p.n_embd / 32; g += kThreads) {
      float y[32];
      detail::decode_group<T>(row + (g / detail::kGroupsPerBlock<T>) * detail::kBlockBytes<T>, g % detail::kGroupsPerBlock<T>, y);
      if (p.scale != 1.0f) {
#pragma unroll
        for (int i = 0; i < 32; ++i) y[i] = __fmul_rn(y[i], p.scale);
      }
      detail::store_group<0>(out, int64_t(g) * 32, y);
    }
  } else {
    for (int i = threadIdx.x; i < p.n_embd; i += kThreads) {
      const float v = detail::decode_float_elem<T>(row, i);
      out[i] = p.scale != 1.0f ? __fmul_rn(v, p.scale) : v;
    }
  }
}

}  // namespace

void rope_device(const RopeParams& p, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::rope: {}", cuda_unavailable_reason());
  VQ_CHECK(p.n_tokens >= 0 && p.head_dim >= 2 && p.n_rot >= 2 && p.n_rot % 2 == 0 && p.n_rot <= p.head_dim &&
               p.n_rot / 2 <= kMaxHalf,
           "cuda::rope: head_dim {} / n_rot {} invalid (n_rot even, <= head_dim, <= {})", p.head_dim, p.n_rot,
           2 * kMaxHalf);
  VQ_CHECK(p.n_q_heads >= 0 && p.n_k_heads >= 0 && (p.k || p.n_k_heads == 0),
           "cuda::rope: heads q {} / k {} (k given: {})", p.n_q_heads, p.n_k_heads, p.k != nullptr);
  const int64_t qs = p.q_stride ? p.q_stride : int64_t(p.n_q_heads) * p.head_dim;
  const int64_t ks = p.k_stride ? p.k_stride : int64_t(p.n_k_heads) * p.head_dim;
  VQ_CHECK(qs >= int64_t(p.n_q_heads) * p.head_dim && ks >= int64_t(p.n_k_heads) * p.head_dim,
           "cuda::rope([{} tokens, q {} x {}, k {} x {}]): strides q {} / k {} too small", p.n_tokens, p.n_q_heads,
           p.head_dim, p.n_k_heads, p.head_dim, qs, ks);
  if (p.n_tokens == 0 || p.n_q_heads + p.n_k_heads == 0) return;
  VQ_CHECK(p.pos && p.inv_freq && (p.q || p.n_q_heads == 0), "cuda::rope([{} tokens]): null pos, inv_freq or q",
           p.n_tokens);
  const RopeK k{p.head_dim, p.n_rot / 2, p.neox, p.pos, p.inv_freq, p.mscale, p.q, p.n_q_heads, qs, p.k, p.n_k_heads, ks};
  const int pairs = (p.n_q_heads + p.n_k_heads) * (p.n_rot / 2);
  launch_pdl("rope", rope_kernel, dim3(unsigned(p.n_tokens), unsigned((pairs + kPairs - 1) / kPairs)), dim3(kPairs), 0,
             as_stream(stream), k);
}

void embedding_device(const EmbeddingParams& p, void* stream) {
  VQ_CHECK(cuda_device_available(), "cuda::embedding: {}", cuda_unavailable_reason());
  const size_t rb = weight_row_bytes(p.type, p.n_embd);
  const int64_t os = p.out_stride ? p.out_stride : p.n_embd;
  const char* tn = weight_type_name(p.type);
  VQ_CHECK(p.n_tokens >= 0 && p.n_vocab >= 1 && os >= p.n_embd,
           "cuda::embedding({} [{}, {}]): {} tokens, out_stride {} invalid", tn, p.n_vocab, p.n_embd, p.n_tokens, os);
  if (p.n_tokens == 0) return;
  VQ_CHECK(p.table && p.tokens && p.out, "cuda::embedding({} [{}, {}]): null table, tokens or out", tn, p.n_vocab,
           p.n_embd);
  const bool blocks = weight_block_elems(p.type) > 1;
  VQ_CHECK(!blocks || (reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && os % 4 == 0),
           "cuda::embedding({} [{}, {}]): out rows must be 16-byte aligned", tn, p.n_vocab, p.n_embd);
  const EmbK k{static_cast<const uint8_t*>(p.table), rb, p.n_vocab, p.n_embd, p.tokens, p.scale, p.out, os};
  cudaStream_t st = as_stream(stream);
  const unsigned grid = unsigned(p.n_tokens);
  if (blocks)
    detail::dispatch_block_type(p.type, [&](auto tt) {
      launch_pdl("embedding", embedding_kernel<decltype(tt)::value, true>, dim3(grid), dim3(kThreads), 0, st, k);
    });
  else
    detail::dispatch_float_type(p.type, [&](auto tt) {
      launch_pdl("embedding", embedding_kernel<decltype(tt)::value, false>, dim3(grid), dim3(kThreads), 0, st, k);
    });
}

}  // namespace vq::cuda
