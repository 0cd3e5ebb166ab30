#pragma once
// Element-wise and row-wise ops of a llama / gemma forward pass on the GPU (vq::cuda):
// embedding lookup from the quantized GGUF rows, RMSNorm (whole rows or per head, optional
// fused residual add, output f32 or fp16 for the next GEMM), RoPE (normal and NeoX pairs, one
// position per row), gated MLP activations (SwiGLU, tanh-GELU), residual add and casts.
// Each op takes one Params struct; all pointers are device pointers; `stream` is a cudaStream_t
// passed as void* (nullptr = default stream). Every op is asynchronous, allocates nothing and
// never synchronizes with the host, so a whole layer can be captured into a CUDA graph; shapes
// are checked on the host and errors throw vq::Error naming the op and the shape.
//
// Layout convention: a tensor of n_tokens rows is addressed as base + t*token_stride + i, with
// token_stride = 0 meaning "packed" (the row length); per-head tensors are [token][head][dim]
// with heads packed inside a token row (head h at + h*head_dim).
#include <cstddef>
#include <cstdint>

#include "ops/cuda/elem_type.h"

namespace vq::cuda {

// ---- Embedding: out[t] = decode(table row tokens[t]) * scale ----
// With scale = 1 the rows are bit-identical to vq::dequantize_row. A token id outside
// [0, n_vocab) gives a row of NaN (the host checks ids first; the NaN makes a miss visible).
struct EmbeddingParams {
  uint32_t type = 0;              // GGUF type id of the table (ggml:: in weights_cuda.h)
  const void* table = nullptr;    // [n_vocab] rows of weight_row_bytes(type, n_embd) bytes as in the GGUF
  int64_t n_vocab = 0;
  int n_embd = 0;                 // a multiple of the type's block
  const int32_t* tokens = nullptr;  // [n_tokens]
  int n_tokens = 0;
  float scale = 1.0f;             // gemma: sqrt(n_embd)
  float* out = nullptr;           // [n_tokens] rows of n_embd f32 (16-byte aligned rows for block types)
  int64_t out_stride = 0;         // elements; 0: n_embd
};
void embedding_device(const EmbeddingParams& p, void* stream = nullptr);

// ---- RMSNorm over rows of n: y = x / sqrt(mean(x^2) + eps) * w ----
// Whole rows (n_heads = 1, n = n_embd) or per head (q/k norms: n = head_dim, n_heads heads
// packed in each token row). Optional fused residual add: when `add` is set the normalised row
// is x + add, and that sum is also written to `sum_out` (may be x itself: the residual stream).
// out_type f16 / bf16 fuses the cast for the following GEMM. Matches vq::rms_norm (fp32 sum of
// squares, the scale in double) up to the order of the fp32 additions.
struct RmsNormParams {
  int n_tokens = 0;
  int n_heads = 1;
  int n = 0;                      // elements normalised together
  const float* x = nullptr;       // [n_tokens][n_heads][n] at x + t*x_stride + h*n
  int64_t x_stride = 0;           // 0: n_heads*n
  const float* add = nullptr;     // optional, same layout and stride as x
  float* sum_out = nullptr;       // where x + add goes (required with add; same layout as x)
  const float* w = nullptr;       // [n] f32 weight, the same for every head
  float eps = 1e-5f;
  ElemType out_type = ElemType::f32;
  void* out = nullptr;            // [n_tokens][n_heads][n] at out + t*out_stride + h*n; may alias x (f32)
  int64_t out_stride = 0;         // 0: n_heads*n
};
void rms_norm_device(const RmsNormParams& p, void* stream = nullptr);

// ---- RoPE, in place on q (and k) ----
// Angle of pair i at position p: p * inv_freq[i], computed in double (positions up to 2^31
// keep full precision), then cos/sin rounded to float (and times mscale), as the CPU forward
// does; the rotation itself is the CPU's rope_apply with the same fp32 operations.
// Normal layout pairs (2i, 2i+1); NeoX pairs (i, i + n_rot/2). Dims past n_rot are untouched.
struct RopeParams {
  int n_tokens = 0;
  int head_dim = 0;
  int n_rot = 0;                  // even, <= head_dim
  bool neox = false;
  const int32_t* pos = nullptr;   // [n_tokens] position of each row
  const double* inv_freq = nullptr;  // [n_rot/2]: Model::rope_inv_freqs() on the device (scalings included)
  float mscale = 1.0f;            // YaRN magnitude scale of cos/sin (1: none)
  float* q = nullptr;             // [n_tokens][n_q_heads][head_dim] at q + t*q_stride + h*head_dim
  int n_q_heads = 0;
  int64_t q_stride = 0;           // 0: n_q_heads*head_dim
  float* k = nullptr;             // optional second tensor at the same positions
  int n_k_heads = 0;
  int64_t k_stride = 0;           // 0: n_k_heads*head_dim
};
void rope_device(const RopeParams& p, void* stream = nullptr);

// ---- Gated activations: out = act(gate) * up ----
// swiglu: silu(g) = g / (1 + exp(-g)) (vq::silu_mul); gelu_tanh: 0.5 g (1 + tanh(sqrt(2/pi)
// (g + 0.044715 g^3))) (gemma3's GeGLU). gate and up may be two halves of one fused projection
// output (strides). out_type f16 / bf16 fuses the cast for the down projection.
enum class GluKind { swiglu, gelu_tanh };
struct GluParams {
  GluKind kind = GluKind::swiglu;
  int n_tokens = 0;
  int n = 0;                      // n_ff
  const float* gate = nullptr;    // row t at gate + t*gate_stride
  int64_t gate_stride = 0;        // 0: n
  const float* up = nullptr;
  int64_t up_stride = 0;          // 0: n
  ElemType out_type = ElemType::f32;
  void* out = nullptr;            // row t at out + t*out_stride; may alias gate or up when f32
  int64_t out_stride = 0;         // 0: n
};
void glu_device(const GluParams& p, void* stream = nullptr);

// ---- x += y (residual add) ----
struct AddParams {
  int n_tokens = 0;
  int n = 0;
  float* x = nullptr;
  int64_t x_stride = 0;           // 0: n
  const float* y = nullptr;
  int64_t y_stride = 0;           // 0: n
};
void add_device(const AddParams& p, void* stream = nullptr);

// ---- out = convert(x): f32 rows to f32 / f16 / bf16 (e.g. the attention output for wo) ----
struct CastParams {
  int n_tokens = 0;
  int n = 0;
  const float* x = nullptr;
  int64_t x_stride = 0;           // 0: n
  ElemType out_type = ElemType::f16;
  void* out = nullptr;
  int64_t out_stride = 0;         // 0: n
};
void cast_device(const CastParams& p, void* stream = nullptr);

}  // namespace vq::cuda
