#include "model/gguf_writer.h"

#include <cstring>
#include <stdexcept>

#include "core/atomic_file.h"
#include "core/fp16.h"

namespace vq::test {

GGUFValue gguf_uint(GGUFValueType t, uint64_t v) { return GGUFValue{t, v}; }
GGUFValue gguf_int(GGUFValueType t, int64_t v) { return GGUFValue{t, v}; }
GGUFValue gguf_float(GGUFValueType t, double v) { return GGUFValue{t, v}; }
GGUFValue gguf_bool(bool v) { return GGUFValue{GGUFValueType::BOOL, v}; }
GGUFValue gguf_string(const std::string& v) { return GGUFValue{GGUFValueType::STRING, v}; }
GGUFValue gguf_array(GGUFValueType elem_type, std::vector<GGUFValue> items) {
  auto a = std::make_shared<GGUFArray>();
  a->type = elem_type;
  a->items = std::move(items);
  return GGUFValue{GGUFValueType::ARRAY, a};
}

namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}
void put_str(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

// The value only (no type tag): arrays carry their element type and count.
void put_value(std::vector<uint8_t>& out, const GGUFValue& v) {
  switch (v.type) {
    case GGUFValueType::UINT8: put<uint8_t>(out, uint8_t(std::get<uint64_t>(v.v))); break;
    case GGUFValueType::UINT16: put<uint16_t>(out, uint16_t(std::get<uint64_t>(v.v))); break;
    case GGUFValueType::UINT32: put<uint32_t>(out, uint32_t(std::get<uint64_t>(v.v))); break;
    case GGUFValueType::UINT64: put<uint64_t>(out, std::get<uint64_t>(v.v)); break;
    case GGUFValueType::INT8: put<int8_t>(out, int8_t(std::get<int64_t>(v.v))); break;
    case GGUFValueType::INT16: put<int16_t>(out, int16_t(std::get<int64_t>(v.v))); break;
    case GGUFValueType::INT32: put<int32_t>(out, int32_t(std::get<int64_t>(v.v))); break;
    case GGUFValueType::INT64: put<int64_t>(out, std::get<int64_t>(v.v)); break;
    case GGUFValueType::FLOAT32: put<float>(out, float(std::get<double>(v.v))); break;
    case GGUFValueType::FLOAT64: put<double>(out, std::get<double>(v.v)); break;
    case GGUFValueType::BOOL: put<uint8_t>(out, std::get<bool>(v.v) ? 1 : 0); break;
    case GGUFValueType::STRING: put_str(out, std::get<std::string>(v.v)); break;
    case GGUFValueType::ARRAY: {
      const GGUFArray& a = *std::get<std::shared_ptr<GGUFArray>>(v.v);
      put<uint32_t>(out, uint32_t(a.type));
      put<uint64_t>(out, a.items.size());
      for (const auto& it : a.items) {
        if (it.type != a.type) throw std::invalid_argument("gguf_writer: array item type differs from element type");
        put_value(out, it);
      }
      break;
    }
    default: throw std::invalid_argument("gguf_writer: unknown value type");
  }
}

}  // namespace

void GGUFWriter::add(const std::string& key, GGUFValue v) { kv_.emplace_back(key, std::move(v)); }

void GGUFWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  std::vector<GGUFValue> items;
  for (const auto& s : v) items.push_back(gguf_string(s));
  add(key, gguf_array(GGUFValueType::STRING, std::move(items)));
}
void GGUFWriter::add_int32_array(const std::string& key, const std::vector<int32_t>& v) {
  std::vector<GGUFValue> items;
  for (int32_t x : v) items.push_back(gguf_int(GGUFValueType::INT32, x));
  add(key, gguf_array(GGUFValueType::INT32, std::move(items)));
}
void GGUFWriter::add_float32_array(const std::string& key, const std::vector<float>& v) {
  std::vector<GGUFValue> items;
  for (float x : v) items.push_back(gguf_float(GGUFValueType::FLOAT32, x));
  add(key, gguf_array(GGUFValueType::FLOAT32, std::move(items)));
}

void GGUFWriter::set_alignment(uint32_t a) {
  alignment_ = a;
  add_uint32("general.alignment", a);
}

void GGUFWriter::add_tensor(const std::string& name, const std::vector<int64_t>& dims, GGMLType type,
                            std::vector<uint8_t> data) {
  if (ggml_block_bytes(type) != 0) {
    int64_t n = 1;
    for (int64_t d : dims) n *= d;
    const size_t want = size_t(n / ggml_block_elems(type)) * ggml_block_bytes(type);
    if (data.size() != want)
      throw std::invalid_argument("gguf_writer: tensor " + name + " has " + std::to_string(data.size()) +
                                  " bytes, its type needs " + std::to_string(want));
  }
  tensors_.push_back({name, dims, type, std::move(data)});
}

void GGUFWriter::add_tensor_f32(const std::string& name, const std::vector<int64_t>& dims, GGMLType type,
                                const std::vector<float>& values) {
  const int64_t cols = dims.at(0);
  const int64_t rows = cols ? int64_t(values.size()) / cols : 0;
  const size_t rb = ggml_row_bytes(type, cols);
  std::vector<uint8_t> data(rb * size_t(rows));  // data: [rows, rb] bytes in `type`
  for (int64_t r = 0; r < rows; ++r) quantize_row(type, values.data() + r * cols, data.data() + size_t(r) * rb, cols);
  add_tensor(name, dims, type, std::move(data));
}

std::vector<uint8_t> GGUFWriter::bytes() const {
  std::vector<uint8_t> out = {'G', 'G', 'U', 'F'};  // (an insert into the empty vector: a GCC 12 false warning)
  put<uint32_t>(out, version_);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_str(out, k);
    put<uint32_t>(out, uint32_t(v.type));
    put_value(out, v);
  }
  std::vector<uint64_t> offsets;
  uint64_t off = 0;
  for (const auto& t : tensors_) {
    off = (off + alignment_ - 1) / alignment_ * alignment_;
    offsets.push_back(off);
    off += t.data.size();
  }
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const auto& t = tensors_[i];
    put_str(out, t.name);
    put<uint32_t>(out, uint32_t(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(out, uint64_t(d));
    put<uint32_t>(out, uint32_t(t.type));
    put<uint64_t>(out, offsets[i]);
  }
  const size_t data_start = (out.size() + alignment_ - 1) / alignment_ * alignment_;
  out.resize(data_start, 0);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    out.resize(data_start + offsets[i], 0);
    out.insert(out.end(), tensors_[i].data.begin(), tensors_[i].data.end());
  }
  return out;
}

void GGUFWriter::write(const std::string& path) const {
  const std::vector<uint8_t> b = bytes();
  write_file_atomic(path, b.data(), b.size());
}

std::vector<float> random_weights(size_t n, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  std::uniform_real_distribution<float> ud(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = nd(rng);
    if (ud(rng) < 0.01f) x *= 8.0f;  // outliers, as real weights have
  }
  return v;
}

std::vector<uint8_t> random_blocks(GGMLType t, int64_t n_elems, std::mt19937_64& rng) {
  const size_t bytes = ggml_row_bytes(t, n_elems);
  std::vector<uint8_t> b(bytes);
  for (auto& x : b) x = uint8_t(rng());
  std::uniform_real_distribution<float> ud(-2.0f, 2.0f);
  auto set_h = [&](size_t at, float v) {
    const uint16_t h = f32_to_f16(v);
    std::memcpy(b.data() + at, &h, 2);
  };
  const size_t bb = ggml_block_bytes(t);
  const size_t nb = bytes / bb;
  for (size_t i = 0; i < nb; ++i) {
    const size_t p = i * bb;
    switch (t) {
      case GGMLType::F32: {
        const float v = ud(rng);
        std::memcpy(b.data() + p, &v, 4);
        break;
      }
      case GGMLType::F16: set_h(p, ud(rng)); break;
      case GGMLType::BF16: {
        const uint16_t h = f32_to_bf16(ud(rng));
        std::memcpy(b.data() + p, &h, 2);
        break;
      }
      case GGMLType::Q8_0: case GGMLType::Q4_0: case GGMLType::Q5_0: set_h(p, ud(rng) * 0.1f); break;
      case GGMLType::Q4_1: case GGMLType::Q5_1: case GGMLType::Q4_K: case GGMLType::Q5_K:
        set_h(p, ud(rng) * 0.1f), set_h(p + 2, ud(rng) * 0.1f);
        break;
      case GGMLType::Q6_K: set_h(p + 208, ud(rng) * 0.01f); break;
      case GGMLType::Q2_K: set_h(p + 80, ud(rng) * 0.1f), set_h(p + 82, ud(rng) * 0.1f); break;
      case GGMLType::Q3_K: set_h(p + 108, ud(rng) * 0.01f); break;
      default: break;
    }
  }
  return b;
}

const std::vector<GGMLType>& supported_types() {
  static const std::vector<GGMLType> t = {GGMLType::F32,  GGMLType::F16,  GGMLType::BF16, GGMLType::Q8_0,
                                          GGMLType::Q4_0, GGMLType::Q4_1, GGMLType::Q5_0, GGMLType::Q5_1,
                                          GGMLType::Q4_K, GGMLType::Q5_K, GGMLType::Q6_K, GGMLType::Q2_K,
                                          GGMLType::Q3_K};
  return t;
}

}  // namespace vq::test
