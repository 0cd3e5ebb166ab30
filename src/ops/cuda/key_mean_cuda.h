#pragma once
// VecInfer's rotated key mean on the device (codec/key_mean.h; docs/QUALITY.md "Rotated key mean"):
// the encoder codes k - R(p_b) mu (KVEncodeParams::key_mean), and before a coded layer's attention
// key_bias_device writes the score terms scale * q . R(p_b) mu per (row, query head, segment) that
// the attention kernels add back (PagedAttnParams::key_bias). p_b is the key's position rounded
// down to a multiple of 16 (kKeyMeanSegmentLog2); only the rotary pairs some head's mean covers take
// part. The angles come from a host-built table (cos, sin of s * 16 * freq per segment s and pair,
// computed in double), so the encoder and the score terms use the same rotated mean.
// No CUDA types here; all pointers are device pointers.
#include <cstdint>

#include "ops/cuda/paged_attention_cuda.h"

namespace vq::cuda {

// One layer's rotated key mean.
struct KeyMeanDevice {
  int n_pairs = 0;                 // pairs carrying the mean (0: none)
  const int32_t* pairs = nullptr;  // [n_pairs][2] channels (a, b) of each pair
  const int32_t* chan = nullptr;   // [head_dim]: 0 (no pair), 2j + 1 (channel a of pair j) or 2j + 2 (its b)
  const float* mu = nullptr;       // [n_kv_heads][head_dim] the pre-RoPE mean (zero outside the pairs)
  const float* cs = nullptr;       // [cs_segs][n_pairs][2] cos, sin of (s << kKeyMeanSegmentLog2) * freq_j
  int64_t cs_segs = 0;             // segments the table covers (positions < cs_segs << kKeyMeanSegmentLog2)
};

struct KeyBiasParams {
  int rows = 0, n_kv_heads = 0, group = 1, head_dim = 0;
  PagedRule rule;                 // the layer's window rule: a row's terms cover its coded range
  const int32_t* pos = nullptr;   // [rows]
  const float* q = nullptr;       // row r at q + r*q_stride: [n_kv_heads*group][head_dim] f32 after RoPE
  int64_t q_stride = 0;           // 0: packed
  float scale = 1.0f;
  KeyMeanDevice km;
  PagedKeyBias out;               // values written: PagedKeyBias's layout
};

// Asynchronous on `stream`, no allocation (capturable). The grid depends on rows and heads only.
void key_bias_device(const KeyBiasParams& p, void* stream = nullptr);

#if defined(__CUDACC__)
// (R(p_b) mu_h)_e: what the encoder subtracts from channel e of head h's key at position pos.
__device__ __forceinline__ float key_mean_offset(const KeyMeanDevice& km, int h, int head_dim, int64_t pos, int e) {
  const int c = km.chan[e];
  if (c == 0) return 0.f;
  const int j = (c - 1) >> 1;
  const int a = km.pairs[2 * j], b = km.pairs[2 * j + 1];
  const float2 v = reinterpret_cast<const float2*>(km.cs)[(pos >> kKeyMeanSegmentLog2) * km.n_pairs + j];
  const float ma = km.mu[int64_t(h) * head_dim + a], mb = km.mu[int64_t(h) * head_dim + b];
  return ((c - 1) & 1) ? ma * v.y + mb * v.x : ma * v.x - mb * v.y;
}
#endif

}  // namespace vq::cuda
