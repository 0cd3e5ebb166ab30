#pragma once
// VecInfer calibration data (API.md) and its versioned binary file.
//
// File layout (all integers and floats little-endian):
//   magic "VQCALIB\0" (8 bytes) | u32 version (=3) | u32 header_bytes (from file start)
//   u32 n_layers, n_kv_heads, head_dim | u32 key_sub_dim, key_bits, value_sub_dim, value_bits
//   u32 granularity (0 shared, 1 per_subspace) | u32 hadamard_block | u32 kmeans_iters
//   u64 seed | u64 n_calib_tokens
//   (version >= 2) u32 check_tokens | f64 check_kl, check_top1, check_ppl_ratio
//   (version >= 3) u32 key_mean_tokens | u32 rope_neox | u32 n_rot
//   (version >= 4) u32 key_transform (0 Walsh-Hadamard, 1 learned)
//   u32 model_len | model bytes (<= 1024)
//   then per layer: smoothing [n_kv_heads, head_dim] f32,
//                   key codebooks [n_kv_heads, k_books, 2^key_bits, key_sub_dim] f32,
//                   value codebooks [n_kv_heads, v_books, 2^value_bits, value_sub_dim] f32,
//                   (key_mean_tokens > 0) key mean [n_kv_heads, head_dim] f32, rope freqs [n_rot / 2] f64,
//                   (key_transform learned) key map [n_kv_heads, head_dim, head_dim] f32
//   then u64 xxh64 (seed 0) of every preceding byte.
// The file size must equal exactly what the header implies. Written atomically.
// Values: every codebook value finite with |x| <= kMaxCalibrationValue, every smoothing factor
// in [kMinLambda, kMaxCalibrationValue]; validate() checks them, so load and save refuse others.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace vq {

enum class Granularity : uint32_t { shared = 0, per_subspace = 1 };
const char* granularity_name(Granularity g);

// How keys are turned before product quantization (queries take the inverse transpose):
// hadamard: k~ = H (k / lambda), the smoothing then the block Walsh-Hadamard rotation (VecInfer's);
// learned: k~ = M (k / lambda) with a dense map M per (layer, KV head) trained on the calibration's
// keys and queries (codec/learned_key_map.h; its trainer leaves lambda at 1).
enum class KeyTransform : uint32_t { hadamard = 0, learned = 1 };
const char* key_transform_name(KeyTransform t);

// The largest fp16 value: keys and values pass through fp16 (the residual window, the GPU's
// fp16 codebooks), so no real codebook entry or smoothing factor exceeds it.
inline constexpr float kMaxCalibrationValue = 65504.0f;

struct CodecParams {
  int sub_dim = 4;  // floats per sub-vector: 2, 4, 8 or 16
  int bits = 8;     // log2 of the codebook size: 4..12
};

struct CalibrationLayer {
  std::vector<float> smoothing;        // [n_kv_heads, head_dim] f32 (lambda)
  std::vector<float> key_codebooks;    // [n_kv_heads, key_books, 2^key.bits, key.sub_dim] f32
  std::vector<float> value_codebooks;  // [n_kv_heads, value_books, 2^value.bits, value.sub_dim] f32
  // The rotated key mean (Calibration::key_mean_tokens > 0; docs/QUALITY.md "Rotated key mean"):
  // key_mean [n_kv_heads, head_dim], the pre-RoPE mean of the keys, zero outside the rotary pairs
  // it covers; rope_freqs [n_rot / 2], the layer's rotary frequencies (radians per position).
  std::vector<float> key_mean;
  std::vector<double> rope_freqs;
  // The learned key transform (Calibration::key_transform == learned): [n_kv_heads, head_dim,
  // head_dim] row-major, k~ = M (k / lambda); empty otherwise.
  std::vector<float> key_map;
};

// The calibration's own quality check (issue 18): the cache with these codebooks against an fp16
// cache on tokens of the calibration text that training did not see (the ones after it), measured
// when the file was made. tokens == 0: not measured (older files, or a text with nothing left).
struct CalibrationCheck {
  uint32_t tokens = 0;   // held-out tokens scored
  double kl = 0;         // mean KL(fp16 || this cache) of the next-token distributions, nats
  double top1 = 0;       // fraction of positions whose argmax agrees with fp16's
  double ppl_ratio = 0;  // perplexity with this cache / with fp16
};

struct Calibration {
  int n_layers = 0, n_kv_heads = 0, head_dim = 0;
  CodecParams key, value;
  Granularity granularity = Granularity::shared;
  // Method parameters, stored for provenance.
  int kmeans_iters = 0;
  uint64_t seed = 0;
  uint64_t n_calib_tokens = 0;
  std::string model;  // free text (model name / file), <= 1024 bytes
  CalibrationCheck check;  // stored from file version 2 on
  // Rotated key mean (file version 3; 0: none). A key at position p is coded as
  // k - R(p_b) mu with p_b = p rounded down to a multiple of key_mean_tokens and R the layer's RoPE
  // (rope_neox: pairs (i, i + n_rot/2), else (2i, 2i+1)); attention adds q . R(p_b) mu back to each
  // score, exactly. Keys of models with large k_proj biases (Qwen2.5) carry a big mean that RoPE
  // turns with position: removed, the codebooks need not follow it past the positions they saw.
  int key_mean_tokens = 0;
  bool rope_neox = false;
  int n_rot = 0;
  bool has_key_mean() const { return key_mean_tokens > 0; }
  // File version 4; older files are Walsh-Hadamard.
  KeyTransform key_transform = KeyTransform::hadamard;
  bool learned_keys() const { return key_transform == KeyTransform::learned; }
  std::vector<CalibrationLayer> layers;  // [n_layers]

  // Codebooks per KV head: 1 (shared) or head_dim / sub_dim (per_subspace).
  int key_books() const;
  int value_books() const;
  size_t key_codebook_floats() const;    // per layer
  size_t value_codebook_floats() const;  // per layer
  // Throws vq::Error naming the field at fault unless every parameter and array size is
  // consistent and every value is within the bounds above (a learned key map also invertible).
  void validate() const;
};

void save_calibration(const std::string& path, const Calibration& c);
// Throws vq::Error naming the path and the problem (truncated, bad magic, unsupported version,
// checksum mismatch, inconsistent header, trailing bytes).
Calibration load_calibration(const std::string& path);
// The same from an in-memory image (the fuzzer); `name` stands for the path in messages.
Calibration parse_calibration(const uint8_t* data, size_t size, const std::string& name);
// Throws vq::Error naming the mismatched field unless c fits a model of this geometry.
void check_calibration_geometry(const Calibration& c, int n_layers, int n_kv_heads, int head_dim);

}  // namespace vq
