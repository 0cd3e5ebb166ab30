#pragma once
// A GGUF (v2/v3) writer for tests: arbitrary metadata (every value type, nested arrays) and
// tensors of any type, from raw bytes or from floats encoded with vq::quantize_row. Written
// from the GGUF specification, independently of the reader (it shares only the value structs).
//
//   vq::test::GGUFWriter w;
//   w.add_string("general.architecture", "llama");
//   w.add_uint32("llama.block_count", 2);
//   w.add_tensor_f32("blk.0.attn_q.weight", {64, 64}, vq::GGMLType::Q4_1, values);  // dims: ne0 first
//   w.write(path);   // or w.bytes()
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "model/gguf.h"

namespace vq::test {

// Value builders.
GGUFValue gguf_uint(GGUFValueType t, uint64_t v);   // UINT8/16/32/64
GGUFValue gguf_int(GGUFValueType t, int64_t v);     // INT8/16/32/64
GGUFValue gguf_float(GGUFValueType t, double v);    // FLOAT32/64
GGUFValue gguf_bool(bool v);
GGUFValue gguf_string(const std::string& v);
GGUFValue gguf_array(GGUFValueType elem_type, std::vector<GGUFValue> items);  // items of elem_type

class GGUFWriter {
 public:
  explicit GGUFWriter(uint32_t version = 3) : version_(version) {}

  // Metadata in insertion order. A key added twice is written twice (to test the reader).
  void add(const std::string& key, GGUFValue v);
  void add_uint32(const std::string& key, uint32_t v) { add(key, gguf_uint(GGUFValueType::UINT32, v)); }
  void add_int32(const std::string& key, int32_t v) { add(key, gguf_int(GGUFValueType::INT32, v)); }
  void add_uint64(const std::string& key, uint64_t v) { add(key, gguf_uint(GGUFValueType::UINT64, v)); }
  void add_float32(const std::string& key, float v) { add(key, gguf_float(GGUFValueType::FLOAT32, v)); }
  void add_bool(const std::string& key, bool v) { add(key, gguf_bool(v)); }
  void add_string(const std::string& key, const std::string& v) { add(key, gguf_string(v)); }
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_int32_array(const std::string& key, const std::vector<int32_t>& v);
  void add_float32_array(const std::string& key, const std::vector<float>& v);
  // Sets general.alignment (uint32) and aligns the tensor data to it.
  void set_alignment(uint32_t a);

  // A tensor from raw bytes in its type (any type id; the size is checked when the type's
  // block layout is known). dims: ne[0] (contiguous) first.
  void add_tensor(const std::string& name, const std::vector<int64_t>& dims, GGMLType type,
                  std::vector<uint8_t> data);
  // A tensor from float values [numel] (rows of dims[0]) encoded into `type`.
  void add_tensor_f32(const std::string& name, const std::vector<int64_t>& dims, GGMLType type,
                      const std::vector<float>& values);

  std::vector<uint8_t> bytes() const;
  void write(const std::string& path) const;  // atomic (temporary name, then rename)

  uint64_t alignment() const { return alignment_; }

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> dims;
    GGMLType type;
    std::vector<uint8_t> data;
  };
  uint32_t version_;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::vector<Tensor> tensors_;
};

// n floats ~ N(0, scale^2) with occasional outliers (|x| up to 8 scale), deterministic per seed.
std::vector<float> random_weights(size_t n, uint64_t seed, float scale = 1.0f);

// One random block of a quantized type: random quant bits with finite, moderate fp16 scales
// (so every bit pattern of the quant fields is exercised). Float types: random finite values.
std::vector<uint8_t> random_blocks(GGMLType t, int64_t n_elems, std::mt19937_64& rng);

// The supported weight types, for loops in tests.
const std::vector<GGMLType>& supported_types();

}  // namespace vq::test
