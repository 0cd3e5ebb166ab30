#pragma once
// CUDA product-quantization ops (vq::cuda), same contracts as vq::ref (ops/ref/pq.h), plus the
// fused key/value encoder of the VecInfer cache and a packed-code decoder. No CUDA types here:
// device pointers are plain pointers, streams are `void*` (a cudaStream_t; nullptr = default).
// Every function throws vq::Error when no CUDA device can be used (see device.h) or a shape is
// unsupported, naming the field.
#include <cstddef>
#include <cstdint>

#include "ops/cuda/elem_type.h"
#include "ops/pq_shape.h"

namespace vq::cuda {

// ---- Host-memory versions (copy in, run, copy out): drop-in for vq::ref / vq::cpu. ----
// x: [n, n_sub*sub_dim] f32; codebooks: [pq_n_books, n_centroids, sub_dim] f32;
// codes: [n, n_sub] uint16, nearest centroid by squared L2 (fp32; ties may pick either; a
// sub-vector with NaN gets code 0).
void pq_encode(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes);
// out: [n, n_sub*sub_dim] f32. Codes >= n_centroids throw (checked on the host).
void pq_decode(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out);

// ---- Device-pointer versions, asynchronous on `stream`. ----
void pq_encode_device(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes,
                      void* stream = nullptr);
// Codes must be < n_centroids (not checked on the device: an out-of-range code reads centroid
// code % n_centroids).
void pq_decode_device(const PQShape& s, const uint16_t* codes, const float* codebooks, float* out,
                      void* stream = nullptr);

// ---- Tensor-core nearest-centroid search (pq_encode_mma.cu), NOT exact: |c|^2 - 2 x.c on
// mma.sync with x split into fp16 hi + lo parts (~fp32) but the centroids rounded to fp16, and
// distances compared at 2^-15 relative resolution. Each distance is off by at most ~5.5e-4 of
// |x|^2 + |c|^2, so near-ties may pick a centroid whose true distance is above the minimum by up
// to twice that (tests/ops/test_cuda_encode_mma.cpp states the parity rule). Inputs must be in
// fp16 range. Takes one shared codebook (per_subspace false), sub_dim 4 or 8, n_centroids a power
// of two in 8..256; pq_encode_mma_supported() says whether a shape qualifies. The caches keep
// the exact encoder (pq_encode / fused_encode_device).
bool pq_encode_mma_supported(const PQShape& s);
void pq_encode_mma_device(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes,
                          void* stream = nullptr);
namespace detail {
// bench/cuda only: the tensor-core encoder with 1 or 2 row tiles of 16 sub-vectors per warp
// iteration (the shipped pq_encode_mma_device uses the winner; the codes are the same).
void pq_encode_mma_device_rt(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes, int row_tiles,
                             void* stream = nullptr);
}  // namespace detail
void pq_encode_mma(const PQShape& s, const float* x, const float* codebooks, uint16_t* codes);

// ---- Fused encode: [smoothing] -> [Walsh-Hadamard] -> nearest centroid -> bit-packing. ----
// One kernel, no scratch memory: codebooks are staged in shared memory, the running argmin
// lives in registers, packed rows are written directly. Matches vq::transform_keys +
// pq_encode + pack_codes (API.md): k~ = H(k / lambda), H the orthonormal block Walsh-Hadamard
// of codec/key_transform.h.

struct FusedEncodeArgs {
  int64_t n_tokens = 0;
  int n_heads = 1;
  int head_dim = 0;          // = n_sub * sub_dim
  int sub_dim = 0;           // 4, 8 or 16 on the fast path; others take a slower generic kernel
  int bits = 8;              // 1..16; n_centroids = 2^bits
  bool per_subspace = false; // books per head = per_subspace ? head_dim/sub_dim : 1
  ElemType in_type = ElemType::f32;
  const void* x = nullptr;         // [n_tokens, n_heads, head_dim] in_type (device)
  int64_t x_token_stride = 0;      // elements between tokens (0: n_heads*head_dim)
  const float* lambda = nullptr;   // [n_heads, head_dim] smoothing (device); nullptr: none
  bool hadamard = false;           // rotate by H after smoothing (head_dim % 32 == 0, <= 256)
  const float* codebooks = nullptr;  // [n_heads, books, 2^bits, sub_dim] f32 (device)
  // Packed rows of code_row_bytes(head_dim/sub_dim, bits) bytes; row (h, t) starts at
  // codes + h*code_head_stride + t*code_token_stride (bytes). Head-major cache layout:
  // head_stride = capacity*row_bytes, token_stride = row_bytes.
  uint8_t* codes = nullptr;
  int64_t code_head_stride = 0;
  int64_t code_token_stride = 0;
};
void fused_encode_device(const FusedEncodeArgs& a, void* stream = nullptr);

// Bytes of one packed row of n codes of `bits` bits (API.md; same as vq::packed_row_bytes).
inline size_t code_row_bytes(int n, int bits) { return (size_t(n) * size_t(bits) + 7) / 8; }

// ---- Decode packed codes to dense vectors (the "dequantise" gather). ----
struct CodeDecodeArgs {
  int64_t n_tokens = 0;
  int n_heads = 1;
  int head_dim = 0;
  int sub_dim = 0;
  int bits = 8;
  bool per_subspace = false;
  const uint8_t* codes = nullptr;  // packed rows, strides in bytes as in FusedEncodeArgs
  int64_t code_head_stride = 0;
  int64_t code_token_stride = 0;
  const float* codebooks = nullptr;  // [n_heads, books, 2^bits, sub_dim] f32 (device)
  ElemType out_type = ElemType::f16;
  void* out = nullptr;               // element (h, t, c) at out + h*out_head_stride + t*out_token_stride + c
  int64_t out_head_stride = 0;       // elements
  int64_t out_token_stride = 0;      // elements
};
void decode_codes_device(const CodeDecodeArgs& a, void* stream = nullptr);

}  // namespace vq::cuda
