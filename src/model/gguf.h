#pragma once
// GGUF (versions 2 and 3) reader over a memory-mapped file. Every read is bounds-checked: a
// truncated or malformed file throws vq::Error naming the field and byte offset. Tensor data
// must tile the data section as the sizes of the tensors' types and shapes imply (no overlap,
// no gap, nothing after the last tensor but padding), so a changed type byte, shape or offset is
// refused at load naming the tensors.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "core/mmap_file.h"
#include "model/weight_formats.h"

namespace vq {

enum class GGUFValueType : uint32_t {
  UINT8 = 0, INT8 = 1, UINT16 = 2, INT16 = 3, UINT32 = 4, INT32 = 5, FLOAT32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, UINT64 = 10, INT64 = 11, FLOAT64 = 12,
};

struct GGUFValue;
struct GGUFArray {
  GGUFValueType type;
  std::vector<GGUFValue> items;  // strings and numbers decoded
};
struct GGUFValue {
  GGUFValueType type;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::shared_ptr<GGUFArray>> v;
};

struct GGUFTensorInfo {
  std::string name;
  std::vector<int64_t> dims;  // ne[0] first (the contiguous dimension), as GGUF stores them
  GGMLType type;
  uint64_t offset;            // relative to the data section
  const uint8_t* data;        // into the mapping, checked to lie inside the file
  size_t nbytes;
  int64_t numel() const;
};

class GGUFFile {
 public:
  explicit GGUFFile(const std::string& path);  // maps and parses; throws vq::Error on bad input
  // Parses an in-memory image (used by the fuzzer); the buffer must outlive the object.
  static std::unique_ptr<GGUFFile> from_memory(const uint8_t* data, size_t size, const std::string& name);

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }
  const std::map<std::string, GGUFValue>& metadata() const { return kv_; }
  const std::vector<GGUFTensorInfo>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  // Typed getters: throw naming the key when it is missing or of the wrong type.
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;     // any integer type
  double get_float(const std::string& key) const;    // any float or integer type
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_string_array(const std::string& key) const;
  std::vector<double> get_float_array(const std::string& key) const;  // numbers of any type
  std::vector<int64_t> get_int_array(const std::string& key) const;
  // With defaults when absent (still throws when present with the wrong type).
  int64_t get_int_or(const std::string& key, int64_t def) const;
  double get_float_or(const std::string& key, double def) const;
  std::string get_string_or(const std::string& key, const std::string& def) const;

  const GGUFTensorInfo* find_tensor(const std::string& name) const;  // nullptr when absent
  const GGUFTensorInfo& tensor(const std::string& name) const;       // throws naming it

 private:
  GGUFFile() = default;
  void parse(const uint8_t* data, size_t size);
  void check_data_layout(uint64_t data_bytes, uint64_t alignment) const;
  std::string path_;
  MappedFile map_;
  uint32_t version_ = 0;
  std::map<std::string, GGUFValue> kv_;
  std::vector<GGUFTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

// Products on a tensor of the file: each checks the type first and throws naming the tensor and
// its type when it cannot be decoded here (reading a file lists such tensors without error).
void require_supported(const GGUFTensorInfo& t);
// Rows [row0, row0+n_rows) of a tensor seen as [numel/dims[0], dims[0]] -> dst [n_rows, dims[0]] f32.
void dequantize_rows(const GGUFTensorInfo& t, int64_t row0, int64_t n_rows, float* dst);
// y[M, dims[1]] = x[M, dims[0]] @ W^T for a 2-D weight W (dims = {cols, rows}).
void matmul(const GGUFTensorInfo& w, const float* x, int64_t M, float* y);
// ys[i][M, ws[i]->dims[1]] = x @ ws[i]^T for weights with the same column count, in one threaded
// pass with the activations quantized once (q/k/v, gate/up).
void matmul_multi(const std::vector<const GGUFTensorInfo*>& ws, const float* x, int64_t M,
                  const std::vector<float*>& ys);

}  // namespace vq
