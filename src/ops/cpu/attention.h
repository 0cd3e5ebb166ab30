#pragma once
// Fast dense partial attention (Highway SIMD, runtime dispatch). Same arguments and semantics
// as vq::ref::dense_attention (src/ops/ref/attention.h): accumulates into (m, d, o).
#include "ops/ref/attention.h"

namespace vq::cpu {
using ref::DenseAttnArgs;
void dense_attention(const DenseAttnArgs& a);
}  // namespace vq::cpu
