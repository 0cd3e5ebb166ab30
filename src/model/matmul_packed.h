#pragma once
// Weights repacked at load into a row-interleaved layout for the int8 products (issue 22):
// 8 weight rows side by side, so one SIMD pass over an activation block produces 8 outputs
// (one int32 lane per weight row, no horizontal sums), and the K-quant sub-block scales
// unpacked from their 6-bit encoding once, at pack time, instead of at every product.
//
// Packed Q4_K ("q4_K x8"): rows padded to a multiple of 8 with zero rows; for each group of 8
// rows and each 256-column super-block, one chunk of kQ4KChunk bytes:
//   [0, 1024)     codes: sub-block j (0..7), vector c (0..3): 32 bytes, byte 4r + i (row r, i 0..3)
//                 = q(32j + 8c + i) | q(32j + 8c + 4 + i) << 4 (q: the row's 4-bit code)
//   [1024, 1088)  u8 sc[j][r]: 6-bit sub-block scales
//   [1088, 1152)  u8 m[j][r]:  6-bit sub-block mins
//   [1152, 1168)  fp16 d[r]; [1168, 1184) fp16 dmin[r] (the rows' own bits: exact)
// Chunks are stored group after group, each group's super-blocks in column order. Weight
// element (r, 32j + e) = (d[r] * sc[j][r]) * q - (dmin[r] * m[j][r]), as in the GGUF layout.
//
// Packed Q6_K ("q6_K x8"): the same grouping, chunks of kQ6KChunk bytes:
//   [0, 1024)     low 4 bits of the 6-bit codes u (0..63), arranged as the Q4_K codes above
//   [1024, 1536)  high 2 bits: 32-element block j, half h (0..1): 32 bytes at 1024 + 64j + 32h,
//                 byte 4r + i = sum over p (0..3) of hi(32j + 16h + 4p + i) << 2p
//   [1536, 1664)  int8 sc[k][r]: the scale of 16-element sub-block k (0..15) of row r
//   [1664, 1680)  fp16 d[r]
// Weight element (r, 16k + e) = (d[r] * sc[k][r]) * (u - 32), as in the GGUF layout. Q6_K x8
// takes as many bytes as the GGUF rows, Q4_K x8 2.8% more (1184 per 8 x 144: the 6-bit scales
// and mins in whole bytes), plus the padding rows.
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/buffer.h"
#include "model/weight_formats.h"

namespace vq {

constexpr size_t kQ4KChunk = 1184;
constexpr size_t kQ6KChunk = 1680;

struct PackedWeight {
  GGMLType type = GGMLType::F32;  // the GGUF type it was packed from
  int64_t rows = 0, cols = 0;     // the weight's shape (rows before padding)
  AlignedBuffer<uint8_t> data;    // data: [ceil(rows / 8), cols / 256, chunk] bytes (chunk_bytes(type))
};

// Whether pack_weight supports type t at this column count (q4_K, q6_K; cols % 256 == 0).
bool packable(GGMLType t, int64_t cols);
// Bytes of one chunk (8 rows x 256 columns) of the packed layout of t (0 when t has none).
size_t chunk_bytes(GGMLType t);
// Packs W [rows, cols] (GGUF layout, ggml_row_bytes(t, cols) per row); throws naming the type
// or the shape when packable() is false.
PackedWeight pack_weight(GGMLType t, const void* W, int64_t rows, int64_t cols);
// y[M, P.rows] = X @ W^T (X quantized by ActivationBuffer, X.cols == P.cols); threads over the
// groups of 8 rows; dispatches to the best Highway target (AVX2 maddubs, AVX-512 VNNI vpdpbusd).
void matmul_packed(const PackedWeight& P, const QuantizedRows& X, float* y);

// A weight's packed copy made on first use (thread-safe), so that a model loaded for another
// device packs nothing. Held by WeightMatrix (model.h) for packable weights.
struct PackedSlot {
  std::once_flag once;
  PackedWeight w;
};
// y[M, rows] = x[M, cols] @ W^T: through the packed copy in `slot` (packed now if it is not
// yet) when slot is not null, else the plain products of weight_formats.h (matmul, matmul_q).
void matmul_maybe_packed(PackedSlot* slot, GGMLType t, const void* W, int64_t rows, int64_t cols, const float* x,
                         int64_t M, float* y);
void matmul_maybe_packed(PackedSlot* slot, GGMLType t, const void* W, int64_t rows, int64_t cols,
                         const QuantizedRows& X, float* y);

// The per-target kernel (groups [g0, g1) of 8 rows; ldy: stride of y rows) and its portable
// scalar version, for tests.
void packed_groups_kernel(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                          int64_t ldy);
void packed_groups_scalar(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                          int64_t ldy);

}  // namespace vq
