#pragma once
// Prefill weight products on Intel AMX tiles (issue 22): the int8 dot products of each 32-element
// block (16 activation rows x 8 weight rows) in one tile multiply instead of 8 AVX vpdpbusd per
// row. Highway has no AMX, so this file uses the compiler's AMX intrinsics directly (x86-64 only).
//
// Only q8_0 takes it: the packed q8_0 layout is already AMX's "B" operand (per 32-element block,
// vector k of 32 bytes holds elements 4k..4k+3 of the 8 rows side by side: 8 tile rows of 32 bytes),
// and the activations (row-major int8) the "A" operand as they lie. Per block the tile's int32 sums
// go through the AVX kernel's float steps in the same order (acc += sum x (d x d_x)), so a row's
// output is bit-identical on every path (PackedWeights tests). Measured on a 16-core Intel Xeon
// with AMX (docs/BENCHMARKS.md, issue 22), 1 thread, M 64 / 512: q8_0 129 / 128 -> 185 / 182
// GFLOP/s. The same kernel on the other types (their 4- and 6-bit codes unpacked to bytes per
// group, the offsets in a second pass) lost to their AVX-512 VNNI kernels (q4_1 173 -> 137, q6_K
// 127 -> 105, Qwen2.5-1.5B's q4_K/q6_K layer 40.3 -> 46.7 ms at M 64): the per-block tile store
// and the 8-lane float fix-up of every 16 x 8 tile bound it; it is in git history (c1da3a5).
#include <cstdint>

#include "model/matmul_packed.h"

namespace vq {

// Whether this CPU has AMX-TILE and AMX-INT8 and the OS let this process use the tile state
// (Linux: arch_prctl ARCH_REQ_XCOMP_PERM; asked once). False on other architectures.
bool amx_available();
// Whether the AMX path takes weights of type t (q8_0).
bool amx_supports(GGMLType t);
// y rows [0, X.M) x outputs of groups [g0, g1) (8 weight rows each; ldy: stride of y) on AMX
// tiles; X.M > 16. Needs amx_available() and amx_supports(P.type) (throws otherwise).
void amx_groups(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y, int64_t ldy);
// The same through a scalar model of the tile instructions, on any x86-64 CPU with AVX2, FMA and
// F16C (for tests on machines without AMX; slow).
void amx_groups_emulated(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                         int64_t ldy);

}  // namespace vq

namespace vq::amx_detail {

// What the tile kernels (matmul_amx_hw.cpp, matmul_amx_emu.cpp: translation units compiled for
// AVX-512 + AMX and for AVX2, holding no inline library code) are given by matmul_amx.cpp.
struct Args {
  const uint8_t* base;      // the packed data
  int64_t chunk;            // bytes per chunk (one 32-column block of a group)
  int64_t rows, g0, g1;     // weight rows; groups [g0, g1)
  int64_t M, cols;          // activation rows (> 16), columns
  const int8_t* q;          // activations [M, cols]
  const float* d;           // [M, cols / 32]
  float* y;                 // [M, ldy]
  int64_t ldy;
};
void run_hw(const Args& a);
void run_emu(const Args& a);

}  // namespace vq::amx_detail
