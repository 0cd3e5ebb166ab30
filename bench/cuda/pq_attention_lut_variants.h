#pragma once
// Losing variants of the LUT decode-attention split kernel (pq_attention_lut_variants.cu), for
// bench_cuda_ops: each matches detail::SplitLauncher and runs through
// detail::pq_attention_device_with_split (the shipped plan and merge around it).
#include <cuda_runtime.h>

#include "ops/cuda/pq_attention_cuda.h"

namespace vq::cuda::bench_variants {

// v3b: fp32 LUT (16-byte entries), 16 warps (docs/CUDA_NOTES.md section 3a, "v3b").
void launch_v3b(const PQAttnBatchArgs& a, int head_tiles8, int chunk, int n_splits, float* part, cudaStream_t st);
// v5: the v4 loop with 20 warps of 96 registers (docs/CUDA_NOTES.md section 3a, "v5").
void launch_v5(const PQAttnBatchArgs& a, int head_tiles8, int chunk, int n_splits, float* part, cudaStream_t st);

}  // namespace vq::cuda::bench_variants
