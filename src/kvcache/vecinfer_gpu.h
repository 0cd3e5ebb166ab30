#pragma once
// VecInfer cache with its codes, codebooks and fp16 residual window in GPU memory (the
// use_gpu_kernels = auto/require route of KVCacheConfig). Same algorithm and flush policy as
// VecInferCache (vecinfer_cache.h): the sequence's first sink_tokens tokens stay in fp16 for good
// (attention sinks); later tokens enter an fp16 window; before an append, whole blocks
// of kBlock tokens leave it while >= residual_length stay, and are encoded on the GPU by the
// fused encoder (smoothing + Walsh-Hadamard + nearest centroid + bit-packing, one kernel);
// attention runs on the codes with the batched split kernel and merges the window (fp16
// segment 0) and the sinks (fp16 segment 1) on the GPU.
// Host memory holds only the configuration. No CUDA types here; in a build without the CUDA
// backend make_vecinfer_gpu_cache() returns nullptr (or throws for `require`).
#include <memory>

#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"

namespace vq {

struct Calibration;

// The cache of one layer on the GPU, or nullptr when the CPU cache should be used:
// use_gpu_kernels == forbid, or auto with no usable device / no CUDA backend / a shape the CUDA
// kernels do not support. With `require`, those last cases throw vq::Error saying why.
std::unique_ptr<KVCache> make_vecinfer_gpu_cache(const KVGeometry& g, const KVCacheConfig& cfg,
                                                 std::shared_ptr<const Calibration> calib, int layer);

// Why the GPU route cannot serve this configuration ("" when it can). Never throws.
std::string vecinfer_gpu_unsupported_reason(const KVGeometry& g, const KVCacheConfig& cfg);

}  // namespace vq
