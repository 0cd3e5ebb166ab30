#pragma once
// A model's weights in GPU memory for the device forward (model/forward_device.h): uploaded once
// from a GGUF model, or built with random values directly on the device for speed work on a
// real model's geometry (bench e2e --device cuda). No CUDA types here.
//
// Per projection: an fp16 copy [rows, cols] for cuBLAS (prefill, batched decode) and, where the
// GGUF type has a native quantized GEMV (Q8_0, Q4_1, Q4_K; ops/cuda/gemv_cuda.h), the packed
// quantized form for decode steps of few rows. q|k|v and gate|up are fused by rows (one product
// each, the input read once).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace vq {

class Model;
struct TPPlan;
struct TPLayerShard;

struct DeviceMatrix {
  int64_t rows = 0, cols = 0;
  void* f16 = nullptr;  // [rows, cols] fp16 (device)
  // Packed quantized parts, each [part_rows, cols] of one GGUF type, stacked by rows (empty: no
  // native product for this matrix).
  struct Part {
    uint32_t type = 0;
    int64_t row0 = 0, rows = 0;
    void* packed = nullptr;
  };
  std::vector<Part> parts;
  bool has_gemv() const { return !parts.empty(); }
  // The GGUF weights are block-quantized: the CPU multiplies them with int8-rounded activations,
  // so the device's float-activation products (cuBLAS, fp16 GEMV) take the same rounded rows.
  bool act_int8 = false;
};

struct DeviceLayer {
  float* attn_norm = nullptr;  // [n_embd]
  float* ffn_norm = nullptr;   // [n_embd]
  float* qkv_bias = nullptr;   // [q_dim + 2 kv_dim] or null
  float* q_norm = nullptr;     // [head_dim] or null
  float* k_norm = nullptr;
  float* post_attn_norm = nullptr;  // [n_embd] or null (gemma3: RMSNorm of the block outputs)
  float* post_ffn_norm = nullptr;
  DeviceMatrix wqkv;           // [q_dim + 2 kv_dim, n_embd]
  DeviceMatrix wo;             // [n_embd, q_dim]
  DeviceMatrix wgu;            // [2 n_ff, n_embd]: gate rows then up rows
  DeviceMatrix wdown;          // [n_embd, n_ff]
};

class DeviceModel {
 public:
  // Uploads every weight of `m` (one upload per Model object: later calls share it while alive).
  // Throws vq::Error naming the tensor (an unsupported type, an fp16 overflow) or "out of device
  // memory" with the bytes asked for.
  static std::shared_ptr<const DeviceModel> upload(const Model& m);
  // Random fp16 weights of this geometry (norm weights ~1, projections ~N(0, 1/cols)), an fp16
  // embedding table, no native quantized parts; built on the device in well under a second.
  // with_output false: no output head (a tensor-parallel rank other than 0).
  static std::shared_ptr<const DeviceModel> random(const ModelConfig& cfg, const std::vector<double>& inv_freqs,
                                                   uint64_t seed = 1, bool with_output = true);
  // Rank `rank`'s shard of `m` under `plan` (model/tensor_parallel.h) on the current device: its
  // query / KV heads' rows of wq, wk, wv (and biases), its columns of wo, its MLP columns of
  // w_gate, w_up (rows) and w_down (columns); norms and embeddings replicated; the output head
  // only with_output (rank 0). config() is the shard's geometry (tp_rank_config). Not cached.
  static std::shared_ptr<const DeviceModel> upload_shard(const Model& m, const TPPlan& plan, int rank,
                                                         bool with_output);
  ~DeviceModel();

  const ModelConfig& config() const { return cfg_; }
  uint32_t embd_type() const { return embd_type_; }
  const void* embd() const { return embd_; }    // [n_vocab] raw GGUF rows
  const float* output_norm() const { return out_norm_; }
  const DeviceMatrix& output() const { return output_; }
  const std::vector<DeviceLayer>& layers() const { return layers_; }
  const double* inv_freqs() const { return inv_freqs_; }  // [n_rot/2] (device)
  // The sliding-window layers' frequencies (gemma3), or null.
  const double* inv_freqs_swa() const { return inv_freqs_swa_; }
  // Bytes one decode step of m rows reads from the weights: the packed parts where the native
  // product is taken (gemv_preferred), else the fp16 copy.
  size_t step_weight_bytes(int m) const;
  size_t device_bytes() const { return bytes_; }
  std::string describe() const;  // "fp16 weights 16.1 GB, native q4_K parts 4.6 GB"

  struct Storage;

 private:
  DeviceModel();
  // upload / upload_shard: every weight of `m` (shards: rank's slices of each layer) on the device.
  static std::shared_ptr<DeviceModel> build(const Model& m, const ModelConfig& cfg,
                                            const std::vector<TPLayerShard>* shards, bool with_output);
  ModelConfig cfg_;
  uint32_t embd_type_ = 0;
  const void* embd_ = nullptr;
  float* out_norm_ = nullptr;
  DeviceMatrix output_;
  std::vector<DeviceLayer> layers_;
  double* inv_freqs_ = nullptr;
  double* inv_freqs_swa_ = nullptr;
  size_t bytes_ = 0;
  std::unique_ptr<Storage> st_;
};

}  // namespace vq
