#pragma once
// KVCacheConfig: how the KV cache of a model stores keys and values. Public API (no CUDA types,
// no internal headers). validate() throws vq::Error naming the field at fault; every cache
// constructor and the factory call it, so an invalid combination fails at construction.
#include <cstdint>
#include <memory>
#include <string>

namespace vq {

struct Calibration;  // src/codec/calibration_file.h: smoothing factors + codebooks per layer

// Each value is one registered method (src/kvcache/methods/, listed in methods/list.h). The
// numbers are part of the KV identity of session files: append new methods, never reorder.
enum class KVMethod { fp16, fp32, q8_0, q4_0, kivi, vecinfer, q4_0h, q5_0 };
// The spec's gpu= option. require: making the spec fails without a usable CUDA device; auto and
// forbid: no check. Where the KV blocks live is chosen by the engine's device (KVDevice, the CLI's
// --device); standalone per-layer caches (KVSpec::make_cache) run on the CPU since the per-layer
// GPU cache was retired (issue 19).
enum class GpuKernels { auto_select, require, forbid };
// shared: one codebook for every sub-space of a head; per_subspace: one per sub-space.
enum class CodebookGranularity { shared, per_subspace };

// One product-quantizer preset: sub-vectors of sub_dim elements, codebooks of 2^bits entries.
// d4b8 = 2 bits/element, d8b12 = 1.5, d8b8 = 1.
struct PQPreset {
  int sub_dim = 4;
  int bits = 8;
  double bits_per_element() const { return double(bits) / double(sub_dim); }
  std::string name() const;  // "d4b8"
  bool operator==(const PQPreset&) const = default;
};

struct KVCacheConfig {
  KVMethod method = KVMethod::fp16;
  // 0: take it from the model; otherwise must equal the model's head_dim (checked per cache).
  int head_dim = 0;
  // VecInfer key / value product quantizers.
  PQPreset key{4, 8};
  PQPreset value{4, 8};
  CodebookGranularity granularity = CodebookGranularity::per_subspace;
  // Most recent tokens kept in fp16 by kivi and vecinfer (q8_0/q4_0 have none, as llama.cpp).
  int residual_length = 128;
  // VecInfer: the first tokens of the sequence, kept in fp16 for good (our choice, measured; see
  // docs/BENCHMARKS.md). They are the "attention sinks" that take a large share of the softmax
  // mass in most heads, so any error in their keys or values moves every output; keeping 4 of
  // them exact took SmolLM2's d4b8 KL vs fp16 from 0.106 to 0.029 (context 1024). Counted in bytes().
  int sink_tokens = 4;
  // KIVI: bits per code (2 or 4) and group size G (tokens per key group = channels per value group).
  int kivi_bits = 2;
  int kivi_group = 32;
  // VecInfer calibration: either in memory or a file written by `veloxquant calibrate`.
  std::shared_ptr<const Calibration> calibration;
  std::string calibration_file;
  GpuKernels use_gpu_kernels = GpuKernels::auto_select;

  // Throws vq::Error naming the field ("kv_cache.key.sub_dim: 3 ..."). head_dim_model > 0 also
  // checks head_dim and the sub_dims against the model's head size.
  void validate(int head_dim_model = 0) const;
  // Canonical spec string: "fp16", "kivi2", "vecinfer:d4b8", "vecinfer:k=d4b8,v=d8b8,r=64".
  std::string name() const;
  // Nominal bits per element of the compressed part (16 for fp16, 8.5 for q8_0, ...), excluding
  // the fp16 residual window.
  double nominal_bits_per_element() const;
};

const char* method_name(KVMethod m);
const char* gpu_kernels_name(GpuKernels g);

}  // namespace vq

namespace veloxquant {
using vq::CodebookGranularity;
using vq::GpuKernels;
using vq::gpu_kernels_name;
using vq::KVCacheConfig;
using vq::KVMethod;
using vq::method_name;
using vq::PQPreset;
}  // namespace veloxquant
