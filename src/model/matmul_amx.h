#pragma once
// Prefill weight products on Intel AMX tiles (issue 22): the int8 dot products of each 32-element
// block (16 activation rows x 8 weight rows) in one tile multiply instead of 8 AVX vpdpbusd per
// row. Highway has no AMX, so this file uses the compiler's AMX intrinsics directly (x86-64 only).
//
// Layout: the packed weights of matmul_packed.h are already AMX's "B" operand: per 32-element
// block, vector k (0..7) of 32 bytes holds elements 4k..4k+3 of each of the 8 rows side by side,
// i.e. 8 tile rows of 32 bytes (K/4 = 8, N = 8 columns of 4 bytes). 4- and 6-bit codes are
// unpacked to bytes once per 8-row group (for all blocks, into a per-thread buffer that every
// 16-row activation tile then reads); the activations (row-major int8) are the "A" operand as
// they lie. Per block the tile's int32 sums go through the same float steps, in the same order,
// as the AVX kernels' (acc += sum x (weight scale x activation scale); the offsets in a second
// accumulator), so a row's output is bit-identical on every path (PackedWeights tests).
//
// Types: q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K (the others keep the AVX kernels).
#include <cstdint>

#include "model/matmul_packed.h"

namespace vq {

// Whether this CPU has AMX-TILE and AMX-INT8 and the OS let this process use the tile state
// (Linux: arch_prctl ARCH_REQ_XCOMP_PERM; asked once). False on other architectures.
bool amx_available();
// Whether the AMX path takes weights of type t.
bool amx_supports(GGMLType t);
// y rows [0, X.M) x outputs of groups [g0, g1) (8 weight rows each; ldy: stride of y) on AMX
// tiles. Needs amx_available() and amx_supports(P.type) (throws otherwise).
void amx_groups(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y, int64_t ldy);
// The same through a scalar model of the tile instructions, on any x86-64 CPU with AVX2 and FMA
// (for tests on machines without AMX; slow).
void amx_groups_emulated(const PackedWeight& P, int64_t g0, int64_t g1, const QuantizedRows& X, float* y,
                         int64_t ldy);

}  // namespace vq

namespace vq::amx_detail {

// What the tile kernels (matmul_amx_hw.cpp, matmul_amx_emu.cpp: translation units compiled for
// AVX-512 + AMX and for AVX2, holding no inline library code) are given by matmul_amx.cpp.
struct Args {
  int type;                 // 0 q4_0, 1 q4_1, 2 q5_0, 3 q5_1, 4 q8_0, 5 q4_K, 6 q5_K, 7 q6_K
  const uint8_t* base;      // the packed data
  int64_t chunk, nu;        // bytes per chunk, chunks (units) per group
  int64_t rows, g0, g1;     // weight rows; groups [g0, g1)
  int64_t M, cols;          // activation rows (> 16), columns
  const int8_t* q;          // activations [M, cols]
  const float *d, *s;       // [M, cols / 32]
  const int32_t* xs16;      // q6_K: [M, cols / 16] sums of 16 codes; else null
  float* y;                 // [M, ldy]
  int64_t ldy;
  int8_t* bw;               // scratch: cols * 8 bytes (a group's unpacked codes), 64-byte aligned
  float* sc;                // scratch: (cols / 32) * 16 floats (a group's per-block scale vectors)
};
void run_hw(const Args& a);
void run_emu(const Args& a);

}  // namespace vq::amx_detail
