// Vectorised decode of 8-bit codes to fp16 / bf16 (issue 10 item 4; CUDA_NOTES.md section 2).
// Shared by pq_decode.cu (the shipped configuration) and bench/cuda/pq_decode_variants.cu (the
// other configurations, timed against it).
//
// One block per (head, slice of the head's tokens): the head's codebook(s) are converted to 16-bit
// once into shared memory; then each thread writes 16-byte chunks of the output (8 elements =
// 8 / SD sub-vectors): the chunk's 1 or 2 codes come from global memory (coalesced byte loads: a
// warp reads 32 consecutive chunks' codes), the centroids from shared memory (8- or 16-byte
// loads), one 16-byte store. ITEMS chunks per thread per round, all code loads issued before the
// first lookup, so that ITEMS loads per thread are in flight. Grid: ~`waves` blocks per SM in
// total, grid-stride over the rest.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "ops/cuda/pq.h"
#include "ops/cuda/smem_attr.cuh"
#include "ops/cuda/stream_cuda.h"

namespace vq::cuda::detail {

template <bool BF16>
__device__ __forceinline__ uint16_t to_16(float v) {
  if constexpr (BF16) return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  else return __half_as_ushort(__float2half_rn(v));
}

// SD: sub_dim (4 or 8). A block covers 1 << chunk_shift chunks of each token row, starting at
// chunk blockIdx.z << chunk_shift (per-sub-space books: the grid splits the row into z groups so
// that a block stages only its group's books; shared books: one group = the whole row).
// Shared memory: stage_books * 256 * SD * 2 bytes (dynamic).
template <int SD, bool BF16, int ITEMS, bool STREAM>
__global__ void __launch_bounds__(256) decode_codes_vec_kernel(CodeDecodeArgs a, int chunk_shift, int books,
                                                               int total) {
  extern __shared__ uint4 dec_smem[];
  uint16_t* book = reinterpret_cast<uint16_t*>(dec_smem);
  const int h = blockIdx.y;
  const int cbase = int(blockIdx.z) << chunk_shift;  // first chunk of this block's group
  constexpr int SPC = 8 / SD;                          // sub-spaces per chunk
  const int sb = books > 1 ? SPC << chunk_shift : 1;   // books staged
  const int nb = sb * 256 * SD;
  const float* src = a.codebooks + (int64_t(h) * books + (books > 1 ? cbase * SPC : 0)) * 256 * SD;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) book[i] = to_16<BF16>(__ldg(src + i));
  __syncthreads();
  const uint8_t* codes_h = a.codes + int64_t(h) * a.code_head_stride;
  uint16_t* out_h = static_cast<uint16_t*>(a.out) + int64_t(h) * a.out_head_stride;
  constexpr int CPC = 8 / SD;  // codes per 16-byte chunk
  const int chunk_mask = (1 << chunk_shift) - 1;
  const int tile = ITEMS * int(blockDim.x);
  for (int base = int(blockIdx.x) * tile; base < total; base += int(gridDim.x) * tile) {
    uint32_t code[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int it = base + k * int(blockDim.x) + int(threadIdx.x);
      code[k] = 0;
      if (it < total) {
        const int t = it >> chunk_shift, c = it & chunk_mask;
        const uint8_t* p = codes_h + int64_t(t) * a.code_token_stride + (cbase + c) * CPC;
        code[k] = __ldg(p);
        if constexpr (CPC == 2) code[k] |= uint32_t(__ldg(p + 1)) << 8;
      }
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int it = base + k * int(blockDim.x) + int(threadIdx.x);
      if (it >= total) continue;
      const int t = it >> chunk_shift, c = it & chunk_mask;  // c: chunk within the group
      uint4 v;
      if constexpr (SD == 8) {
        v = reinterpret_cast<const uint4*>(book)[(books > 1 ? c * 256 : 0) + int(code[k])];
      } else {
        const uint2* b2 = reinterpret_cast<const uint2*>(book);
        const uint2 lo = b2[(books > 1 ? (2 * c) * 256 : 0) + int(code[k] & 255u)];
        const uint2 hi = b2[(books > 1 ? (2 * c + 1) * 256 : 0) + int(code[k] >> 8)];
        v = make_uint4(lo.x, lo.y, hi.x, hi.y);
      }
      uint4* dst = reinterpret_cast<uint4*>(out_h + int64_t(t) * a.out_token_stride) + cbase + c;
      if constexpr (STREAM) __stcs(dst, v);
      else *dst = v;
    }
  }
}

// Whether the vectorised kernel takes these arguments (else the generic kernel runs).
inline bool decode_codes_vec_ok(const CodeDecodeArgs& a) {
  const int chunks = a.head_dim / 8;
  const int books = a.per_subspace ? a.head_dim / a.sub_dim : 1;
  return a.bits == 8 && (a.sub_dim == 4 || a.sub_dim == 8) && a.head_dim % 8 == 0 && chunks > 0 &&
         (chunks & (chunks - 1)) == 0 && (a.out_type == ElemType::f16 || a.out_type == ElemType::bf16) &&
         reinterpret_cast<uintptr_t>(a.out) % 16 == 0 && a.out_head_stride % 8 == 0 && a.out_token_stride % 8 == 0 &&
         int64_t(books) * 256 * a.sub_dim * 2 <= 96 * 1024 && a.n_tokens * chunks < (int64_t(1) << 31) - 4096 &&
         a.n_heads <= 65535;
}

// Launches decode_codes_vec_kernel<SD, BF16, ITEMS, STREAM> with ~`waves` 256-thread blocks per SM
// in total. The caller has checked decode_codes_vec_ok(a).
// static: each translation unit has its own copy of the kernel, so its own attribute flag.
// group_chunks: chunks per block group for per-sub-space books (a power of two <= head_dim/8;
// 0: the whole row); shared books always take the whole row.
template <int SD, bool BF16, int ITEMS, bool STREAM>
static void launch_decode_vec(const CodeDecodeArgs& a, int waves, cudaStream_t stream, int group_chunks = 0) {
  const int chunks = a.head_dim / 8;
  const int books = a.per_subspace ? a.head_dim / a.sub_dim : 1;
  const int gc = books > 1 && group_chunks > 0 && group_chunks < chunks ? group_chunks : chunks;
  const int groups = chunks / gc;
  int shift = 0;
  while ((1 << shift) < gc) ++shift;
  const int total = int(a.n_tokens) * gc;  // items per (head, group)
  const size_t smem = size_t(books > 1 ? gc * (8 / SD) : 1) * 256 * SD * 2;
  // > 48 KiB of dynamic shared memory needs the attribute (per device)
  if (smem > 48 * 1024) detail::ensure_smem_attr(decode_codes_vec_kernel<SD, BF16, ITEMS, STREAM>, 96 * 1024);
  const int tile = ITEMS * 256;
  const int tiles = (total + tile - 1) / tile;
  const int want = (device_sm_count() * waves + a.n_heads * groups - 1) / (a.n_heads * groups);
  const unsigned gx = unsigned(std::max(1, std::min(tiles, want)));
  decode_codes_vec_kernel<SD, BF16, ITEMS, STREAM>
      <<<dim3(gx, unsigned(a.n_heads), unsigned(groups)), 256, smem, stream>>>(a, shift, books, total);
}

}  // namespace vq::cuda::detail
