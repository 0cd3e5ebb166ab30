#pragma once
// Weights repacked at load into a row-interleaved layout for the int8 products (issue 22):
// 8 weight rows side by side, so one SIMD pass over an activation block produces 8 outputs
// (one int32 lane per weight row, no horizontal sums), and the K-quant sub-block scales
// unpacked from their 6-bit encoding once, at pack time, instead of at every product.
// Every layout is cut into "units" of columns (32 for the 32-element block types, 256 for the
// K-quants); rows are padded to a multiple of 8 with zero rows, and for each group of 8 rows
// the units follow in column order, one chunk of chunk_bytes(type) each.
//
// The 4-bit code layout shared by several types ("codes4"): for each 32-element block,
// 4 vectors c (0..3) of 32 bytes; byte 4r + i (row r, i 0..3) = q(8c + i) | q(8c + 4 + i) << 4.
// The fifth-bit layout ("hi5") of the 5-bit types: 32 bytes per 32-element block, byte
// 4r + i holds bit 2c = bit 4 of q(8c + i) and bit 2c + 1 = bit 4 of q(8c + 4 + i).
//
// 32-element types (unit 32; same bytes as the GGUF rows):
//   q4_0 x8 (144): codes4 | fp16 d[8]                         w = d * (q - 8)
//   q4_1 x8 (160): codes4 | fp16 d[8] | fp16 m[8]             w = d * q + m
//   q5_0 x8 (176): codes4 | hi5 | fp16 d[8]                   w = d * (q - 16)
//   q5_1 x8 (192): codes4 | hi5 | fp16 d[8] | fp16 m[8]       w = d * q + m
//   q8_0 x8 (272): int8 codes, vector k (0..7) of 32 bytes, byte 4r + i = q(4k + i) | fp16 d[8]
//
// Packed Q4_K ("q4_K x8", unit 256), chunks of kQ4KChunk bytes:
//   [0, 1024)     codes4 of the 8 sub-blocks j (sub-block j at 128 j)
//   [1024, 1088)  u8 sc[j][r]: 6-bit sub-block scales
//   [1088, 1152)  u8 m[j][r]:  6-bit sub-block mins
//   [1152, 1168)  fp16 d[r]; [1168, 1184) fp16 dmin[r] (the rows' own bits: exact)
// Weight element (r, 32j + e) = (d[r] * sc[j][r]) * q - (dmin[r] * m[j][r]), as in the GGUF layout.
// Packed Q5_K ("q5_K x8"): the Q4_K chunk, then [1184, 1440) hi5 of sub-block j at 1184 + 32 j.
//
// Packed Q6_K ("q6_K x8"): the same grouping, chunks of kQ6KChunk bytes:
//   [0, 1536)     32-element block j at 192j (one sequential stream: the hardware prefetchers
//                 follow it): 128 bytes of the low 4 bits of the 6-bit codes u (0..63),
//                 arranged as the Q4_K codes above, then the high 2 bits: half h (0..1) at
//                 192j + 128 + 32h, byte 4r + i = sum over p (0..3) of hi(32j + 16h + 4p + i) << 2p
//   [1536, 1664)  int8 sc[k][r]: the scale of 16-element sub-block k (0..15) of row r
//   [1664, 1680)  fp16 d[r]
// Weight element (r, 16k + e) = (d[r] * sc[k][r]) * (u - 32), as in the GGUF layout.
//
// The 2-bit code layout ("codes2") of Q2_K and Q3_K: 32-element block j, half h (0..1): 32
// bytes at 64j + 32h, byte 4r + i = sum over p (0..3) of q(32j + 16h + 4p + i) << 2p (as the
// Q6_K high bits above), so a shift by 2p and a mask give elements 16h + 4p + 0..3 of the rows.
// Packed Q2_K ("q2_K x8", unit 256), chunks of kQ2KChunk bytes:
//   [0, 512)      codes2 (0..3)
//   [512, 640)    u8 sc[k][r]: the GGUF byte of 16-element sub-block k: scale | min << 4
//   [640, 656)    fp16 d[r]; [656, 672) fp16 dmin[r]
// Weight element (r, 16k + e) = (d[r] * (sc & 15)) * q - dmin[r] * (sc >> 4), as in the GGUF layout.
// Packed Q3_K ("q3_K x8"), chunks of kQ3KChunk bytes:
//   [0, 512)      codes2 of the low 2 bits
//   [512, 768)    high bit: block j's 32 bytes at 512 + 32j, bit p (0..7) of byte 4r + i = the high
//                 bit of element 32j + 4p + i
//   [768, 896)    int8 sc[k][r]: the signed 6-bit scale (s - 32) of sub-block k
//   [896, 912)    fp16 d[r]
// Weight element (r, 16k + e) = (d[r] * sc[k][r]) * (u - 4), u = low | high << 2 (0..7): the
// kernels take the dot products with u and subtract 4 * (sum of the 16 activations).
// The 16-element sums of the activations are made once per product (Q2_K's mins need them too).
//
// Float types (unit 32): "f16 x8" / "bf16 x8" (512 bytes), "f32 x8" (1024): column c (0..31)
// of the unit is the 8 rows' values side by side (8 * element size bytes at c * 8 * size). They
// meet the float activations (QuantizedRows::x): per column one broadcast for two groups of 8
// rows and an FMA for each (one 512-bit FMA for both on AVX-512); per unit and activation row 2 partial sums (columns c % 2), added
// into the row's total.
//
// Sizes: Q6_K x8, Q2_K x8 and the float types take as many bytes as the GGUF rows, Q4_K x8 2.8%
// more (1184 per 8 x 144: the 6-bit scales and mins in whole bytes), Q5_K x8 2.3% more, Q3_K x8
// 3.6% more (912 per 8 x 110), plus the padding rows.
//
// Products (matmul_packed): the rows of each thread are whole groups, in pairs (16 outputs, 64
// bytes of y: no cache line of y written by two threads but at the ends of a part). On AVX-512
// the quantized types run the two groups of a pair together, in 512-bit vectors (one per half;
// each activation broadcast and scale step serves 16 rows: 1.2-1.6x the 256-bit kernels at 4+
// activation rows on an Intel Xeon, 1 thread); an odd last group of a part runs alone in 256
// bits. Per group (or pair):
//  - M <= 4 activation rows: one register tile of M rows, the columns in steps of ~1 KB of
//    each group's weights;
//  - M 5..16 (batched decode): the columns in steps (256 of them), each step's weights decoded
//    from L1 for every tile of 4 activation rows in turn, so the weights stream from memory
//    once per product for all rows (the tiles' accumulators stay in L1 between steps);
//  - in both, a pair's step first requests the same share of the thread's next pair into L2
//    (`DecodeStepUnits` in matmul_packed.cpp: the pair's two streams lost the hardware prefetchers);
//  - M > 16 (prefill): tiled GEMM: activation panels of 64 rows (in L2), and per panel each
//    8-row group (in L1/L2) against every 4-row tile.
// Every activation row's sums are made in the same order in all three, so a row's output does
// not depend on M, on the tile it falls in, on the thread count or on the x86 target.
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/buffer.h"
#include "model/weight_formats.h"

namespace vq {

// Activation rows up to which a product takes the decode path (column steps, the weights read
// from memory once for all rows), and the activation panel height of the prefill path.
constexpr int64_t kPackedDecodeRows = 16;
constexpr int64_t kPackedPanelRows = 64;

constexpr size_t kQ4KChunk = 1184;
constexpr size_t kQ5KChunk = 1440;
constexpr size_t kQ6KChunk = 1680;
constexpr size_t kQ2KChunk = 672;
constexpr size_t kQ3KChunk = 912;

struct PackedWeight {
  GGMLType type = GGMLType::F32;  // the GGUF type it was packed from
  int64_t rows = 0, cols = 0;     // the weight's shape (rows before padding)
  AlignedBuffer<uint8_t> data;    // data: [ceil(rows / 8), cols / unit_cols(type), chunk_bytes(type)] bytes
};

// Whether pack_weight supports type t at this column count (q4_0, q4_1, q5_0, q5_1, q8_0, f32,
// f16, bf16 with cols % 32 == 0; q2_K, q3_K, q4_K, q5_K, q6_K with cols % 256 == 0).
bool packable(GGMLType t, int64_t cols);
// Bytes of one chunk (8 rows x unit_cols(t) columns) of the packed layout of t (0 when t has none).
size_t chunk_bytes(GGMLType t);
// Columns of one chunk: 32 or 256 (0 when t has no packed layout).
int64_t unit_cols(GGMLType t);
// Packs W [rows, cols] (GGUF layout, ggml_row_bytes(t, cols) per row); throws naming the type
// or the shape when packable() is false.
PackedWeight pack_weight(GGMLType t, const void* W, int64_t rows, int64_t cols);
// y[M, P.rows] = X @ W^T (X quantized by ActivationBuffer, X.cols == P.cols; the float types
// use X.x only); threads over the groups of 8 rows; dispatches to the best Highway target (AVX2
// maddubs, AVX-512 VNNI vpdpbusd).
void matmul_packed(const PackedWeight& P, const QuantizedRows& X, float* y);
// The same from float rows x [M, P.cols] (quantized here unless P is a float type).
void matmul_packed(const PackedWeight& P, const float* x, int64_t M, float* y);
// Whether t is packed as floats (f32, f16, bf16: the products read QuantizedRows::x).
bool packed_is_float(GGMLType t);
// Several packed weights with the same input (q, k, v; gate, up) in one threaded pass: the
// groups of all of them are split over the threads together, so the pool is woken once.
struct PackedJob {
  const PackedWeight* P;
  float* y;  // [X.M, P->rows]
};
void matmul_packed_multi(const PackedJob* jobs, int n_jobs, const QuantizedRows& X);

// A weight's packed copy, made once (thread-safe) when a CPU session is created
// (Model::pack_for_cpu) or by the first product that needs it, so that a model loaded for another
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
// The packed copy held by slot (packed now if it is not yet); throws when the slot holds
// another weight's shape or type.
const PackedWeight& packed_weight(PackedSlot& slot, GGMLType t, const void* W, int64_t rows, int64_t cols);

// The per-target kernel (groups [g0, g1) of 8 rows; ldy: stride of y rows) and its portable
// scalar version, for tests.
void packed_groups_kernel(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                          int64_t ldy);
void packed_groups_scalar(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                          int64_t ldy);

}  // namespace vq
