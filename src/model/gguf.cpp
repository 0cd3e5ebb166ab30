// GGUF reader. File layout (GGUF specification, versions 2 and 3; all integers little-endian):
//   u32 magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
//   kv_count x { string key | u32 value_type | value }
//   tensor_count x { string name | u32 n_dims | u64 dims[n_dims] | u32 ggml_type | u64 offset }
//   padding to general.alignment (default 32) | tensor data (offsets relative to its start)
// string = u64 length + bytes; array value = u32 element type + u64 count + elements.
// Every read goes through Cursor, which checks the remaining size first and names the field
// and byte offset in its error, so no input can make the parser read outside the image.
#include "model/gguf.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace vq {

namespace {

constexpr uint32_t kMaxDims = 4;         // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 16;       // nested arrays deeper than this are rejected
constexpr uint64_t kDefaultAlignment = 32;

const char* value_type_name(uint32_t t) {
  static const char* names[] = {"uint8", "int8",  "uint16", "int16",  "uint32", "int32",  "float32",
                                "bool",  "string", "array", "uint64", "int64",  "float64"};
  return t < 13 ? names[t] : "unknown";
}

// Minimum encoded size of one value of type t (used to bound array counts before allocating).
uint64_t min_value_bytes(uint32_t t) {
  switch (static_cast<GGUFValueType>(t)) {
    case GGUFValueType::UINT8: case GGUFValueType::INT8: case GGUFValueType::BOOL: return 1;
    case GGUFValueType::UINT16: case GGUFValueType::INT16: return 2;
    case GGUFValueType::UINT32: case GGUFValueType::INT32: case GGUFValueType::FLOAT32: return 4;
    case GGUFValueType::UINT64: case GGUFValueType::INT64: case GGUFValueType::FLOAT64: return 8;
    case GGUFValueType::STRING: return 8;
    case GGUFValueType::ARRAY: return 12;
  }
  return 0;
}

// A field name for error messages, formatted only when an error is raised ("key[index]").
struct Field {
  const std::string& base;
  int64_t index = -1;
  std::string str() const { return index < 0 ? base : fmt::format("{}[{}]", base, index); }
};

class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size, const std::string& name) : p_(data), size_(size), name_(name) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  T read(const Field& f, const char* what = "") {
    if (sizeof(T) > remaining()) truncated(f, what, sizeof(T));
    T v;
    std::memcpy(&v, p_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  template <typename T>
  T read(const std::string& field) {
    return read<T>(Field{field});
  }
  std::string read_string(const Field& f) {
    const size_t at = pos_;
    const uint64_t len = read<uint64_t>(f, " (string length)");
    if (len > remaining())
      VQ_FAIL("{}: {} at byte offset {}: string length {} exceeds the {} bytes left in the file", name_, f.str(),
              at, len, remaining());
    std::string s(reinterpret_cast<const char*>(p_ + pos_), size_t(len));
    pos_ += size_t(len);
    return s;
  }
  std::string read_string(const std::string& field) { return read_string(Field{field}); }
  [[noreturn]] void fail_at(size_t at, const std::string& field, const std::string& what) const {
    VQ_FAIL("{}: {} at byte offset {}: {}", name_, field, at, what);
  }

 private:
  [[noreturn]] void truncated(const Field& f, const char* what, size_t n) const {
    VQ_FAIL("{}: truncated file: {}{} needs {} bytes at byte offset {}, but the file has {} bytes", name_, f.str(),
            what, n, pos_, size_);
  }
  const uint8_t* p_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& name_;
};

GGUFValue read_value(Cursor& c, uint32_t type, const Field& field, int depth) {
  GGUFValue v;
  v.type = static_cast<GGUFValueType>(type);
  switch (v.type) {
    case GGUFValueType::UINT8: v.v = uint64_t(c.read<uint8_t>(field)); break;
    case GGUFValueType::UINT16: v.v = uint64_t(c.read<uint16_t>(field)); break;
    case GGUFValueType::UINT32: v.v = uint64_t(c.read<uint32_t>(field)); break;
    case GGUFValueType::UINT64: v.v = c.read<uint64_t>(field); break;
    case GGUFValueType::INT8: v.v = int64_t(c.read<int8_t>(field)); break;
    case GGUFValueType::INT16: v.v = int64_t(c.read<int16_t>(field)); break;
    case GGUFValueType::INT32: v.v = int64_t(c.read<int32_t>(field)); break;
    case GGUFValueType::INT64: v.v = c.read<int64_t>(field); break;
    case GGUFValueType::FLOAT32: v.v = double(c.read<float>(field)); break;
    case GGUFValueType::FLOAT64: v.v = c.read<double>(field); break;
    case GGUFValueType::BOOL: v.v = c.read<uint8_t>(field) != 0; break;
    case GGUFValueType::STRING: v.v = c.read_string(field); break;
    case GGUFValueType::ARRAY: {
      const size_t at = c.pos();
      const std::string name = field.str();
      if (depth >= kMaxArrayDepth) c.fail_at(at, name, fmt::format("arrays nested deeper than {}", kMaxArrayDepth));
      const uint32_t et = c.read<uint32_t>(field, " (array element type)");
      if (et > uint32_t(GGUFValueType::FLOAT64)) c.fail_at(at, name, fmt::format("unknown array element type {}", et));
      const uint64_t n = c.read<uint64_t>(field, " (array count)");
      // Bound the count by the bytes left before reserving, so a corrupt count cannot
      // trigger a huge allocation.
      if (n > c.remaining() / min_value_bytes(et))
        c.fail_at(at, name,
                  fmt::format("array of {} {} elements needs at least {} bytes per element but only {} bytes are left",
                              n, value_type_name(et), min_value_bytes(et), c.remaining()));
      auto arr = std::make_shared<GGUFArray>();
      arr->type = static_cast<GGUFValueType>(et);
      arr->items.reserve(size_t(n));
      for (uint64_t i = 0; i < n; ++i) arr->items.push_back(read_value(c, et, Field{name, int64_t(i)}, depth + 1));
      v.v = std::move(arr);
      break;
    }
    default:
      c.fail_at(c.pos() - 4, field.str(), fmt::format("unknown value type {}", type));
  }
  return v;
}

}  // namespace

int64_t GGUFTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

GGUFFile::GGUFFile(const std::string& path) : path_(path), map_(path) { parse(map_.data(), map_.size()); }

std::unique_ptr<GGUFFile> GGUFFile::from_memory(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GGUFFile> f(new GGUFFile());
  f->path_ = name;
  f->parse(data, size);
  return f;
}

void GGUFFile::parse(const uint8_t* data, size_t size) {
  Cursor c(data, size, path_);
  const uint32_t magic = c.read<uint32_t>("header magic");
  if (std::memcmp(&magic, "GGUF", 4) != 0)
    c.fail_at(0, "header magic", fmt::format("not a GGUF file (magic 0x{:08x}, expected \"GGUF\")", magic));
  version_ = c.read<uint32_t>("header version");
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    c.fail_at(4, "header version",
              swapped == 2 || swapped == 3
                  ? fmt::format("big-endian GGUF (version {}) is not supported", swapped)
                  : fmt::format("unsupported GGUF version {} (2 and 3 are supported)", version_));
  }
  const uint64_t n_tensors = c.read<uint64_t>("header tensor_count");
  const uint64_t n_kv = c.read<uint64_t>("header kv_count");
  // A kv pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at least 8+4+4+8.
  if (n_kv > c.remaining() / 13)
    c.fail_at(16, "header kv_count", fmt::format("{} pairs cannot fit in the {} bytes left", n_kv, c.remaining()));
  if (n_tensors > c.remaining() / 24)
    c.fail_at(8, "header tensor_count",
              fmt::format("{} tensor infos cannot fit in the {} bytes left", n_tensors, c.remaining()));

  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t at = c.pos();
    std::string key = c.read_string(fmt::format("metadata[{}] key", i));
    const std::string field = fmt::format("metadata[{}] '{}'", i, key);
    const uint32_t type = c.read<uint32_t>(field + " value type");
    if (kv_.count(key)) c.fail_at(at, field, "duplicate key");
    GGUFValue v = read_value(c, type, Field{field}, 0);
    kv_.emplace(std::move(key), std::move(v));
  }

  // Counts the rest of the file sizes itself: a vocabulary (<arch>.vocab_size, a tokenizer's
  // count) needs at least one byte per token (its embedding row), so a count beyond the file's
  // size is a corrupt or hostile value, refused here rather than trusted by a later reader.
  for (const auto& [key, v] : kv_) {
    const bool is_count = key.size() > 11 && key.compare(key.size() - 11, 11, ".vocab_size") == 0;
    if (!is_count) continue;
    int64_t n = -1;
    if (const auto* u = std::get_if<uint64_t>(&v.v)) n = *u > uint64_t(INT64_MAX) ? INT64_MAX : int64_t(*u);
    else if (const auto* i = std::get_if<int64_t>(&v.v)) n = *i;
    else
      VQ_FAIL("{}: metadata '{}' must be an integer, got {}", path_, key, value_type_name(uint32_t(v.type)));
    if (n < 1 || uint64_t(n) > size)
      VQ_FAIL("{}: metadata '{}' = {}: a vocabulary of that many tokens cannot fit in a file of {} bytes", path_, key,
              std::get_if<uint64_t>(&v.v) ? fmt::format("{}", std::get<uint64_t>(v.v)) : fmt::format("{}", n), size);
  }

  uint64_t alignment = kDefaultAlignment;
  if (auto it = kv_.find("general.alignment"); it != kv_.end()) {
    const GGUFValue& a = it->second;
    if (a.type != GGUFValueType::UINT32)
      VQ_FAIL("{}: metadata 'general.alignment' must be uint32, got {}", path_, value_type_name(uint32_t(a.type)));
    alignment = std::get<uint64_t>(a.v);
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      VQ_FAIL("{}: metadata 'general.alignment' = {} is not a power of two", path_, alignment);
  }

  tensors_.reserve(size_t(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const size_t at = c.pos();
    GGUFTensorInfo t;
    t.name = c.read_string(fmt::format("tensor_info[{}] name", i));
    const std::string field = fmt::format("tensor_info[{}] '{}'", i, t.name);
    const uint32_t n_dims = c.read<uint32_t>(field + " n_dims");
    if (n_dims == 0 || n_dims > kMaxDims)
      c.fail_at(c.pos() - 4, field + " n_dims", fmt::format("{} dimensions (must be 1..{})", n_dims, kMaxDims));
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = c.read<uint64_t>(fmt::format("{} dims[{}]", field, d));
      if (ne > uint64_t(std::numeric_limits<int64_t>::max()))
        c.fail_at(c.pos() - 8, fmt::format("{} dims[{}]", field, d), fmt::format("dimension {} is too large", ne));
      if (ne != 0 && numel > std::numeric_limits<int64_t>::max() / int64_t(ne))
        c.fail_at(c.pos() - 8, fmt::format("{} dims[{}]", field, d), "element count overflows int64");
      numel *= int64_t(ne);
      t.dims.push_back(int64_t(ne));
    }
    t.type = static_cast<GGMLType>(c.read<uint32_t>(field + " type"));
    t.offset = c.read<uint64_t>(field + " offset");
    if (t.offset % alignment != 0)
      c.fail_at(c.pos() - 8, field + " offset",
                fmt::format("data offset {} is not a multiple of the alignment {}", t.offset, alignment));
    // Byte size from the type's block layout. Without a layout (an unknown type id, e.g. a
    // corrupted type byte) the data cannot be bounded or told apart from its neighbours'.
    if (ggml_block_bytes(t.type) == 0)
      c.fail_at(c.pos() - 12, field + " type", fmt::format("unknown tensor type id {}", uint32_t(t.type)));
    const int64_t be = ggml_block_elems(t.type);
    if (t.dims[0] % be != 0)
      c.fail_at(at, field,
                fmt::format("dims[0] = {} is not a multiple of the {} block size {}", t.dims[0],
                            ggml_type_name(t.type), be));
    const uint64_t blocks = uint64_t(numel / be);
    const uint64_t bb = ggml_block_bytes(t.type);
    if (blocks > std::numeric_limits<uint64_t>::max() / bb) c.fail_at(at, field, "byte size overflows");
    t.nbytes = size_t(blocks * bb);
    if (tensor_index_.count(t.name)) c.fail_at(at, field, "duplicate tensor name");
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment after the tensor infos.
  const uint64_t info_end = c.pos();
  const uint64_t data_start = (info_end + alignment - 1) / alignment * alignment;
  if (n_tensors > 0 && data_start > size)
    VQ_FAIL("{}: truncated file: tensor data section starts at byte offset {} but the file has {} bytes", path_,
            data_start, size);
  for (auto& t : tensors_) {
    const uint64_t avail = size > data_start ? size - data_start : 0;
    if (t.offset > avail || t.nbytes > avail - t.offset)
      VQ_FAIL("{}: tensor '{}' data [{}, {}) lies outside the file ({} bytes; data section at byte offset {})", path_,
              t.name, data_start + t.offset, data_start + t.offset + t.nbytes, size, data_start);
    t.data = data + data_start + t.offset;
  }
  check_data_layout(size > data_start ? size - data_start : 0, alignment);
}

// The GGUF writers (llama.cpp's and gguf-py's) store tensor data back to back, each tensor at
// the next multiple of the alignment after the previous one ends, and llama.cpp's loader
// requires it. So the sizes implied by the types and shapes must tile the data section: a tensor
// whose type byte or dims were changed overlaps its neighbour, leaves unused bytes before the
// next one, or leaves bytes after the last. Any of these is refused here, naming the tensors,
// instead of decoding some other tensor's bytes as weights. (Tensors may be listed in any order.)
void GGUFFile::check_data_layout(uint64_t data_bytes, uint64_t alignment) const {
  std::vector<const GGUFTensorInfo*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const GGUFTensorInfo* a, const GGUFTensorInfo* b) { return a->offset < b->offset; });
  auto describe = [](const GGUFTensorInfo& t) {
    return fmt::format("'{}' ({} [{}], {} bytes at data offset {})", t.name, ggml_type_name(t.type),
                       fmt::join(t.dims, ", "), t.nbytes, t.offset);
  };
  auto align_up = [alignment](uint64_t x) { return (x + alignment - 1) / alignment * alignment; };
  const GGUFTensorInfo* prev = nullptr;
  uint64_t end = 0;  // end of the previous tensor's data, relative to the data section
  for (const GGUFTensorInfo* t : order) {
    if (prev && t->offset < end)
      VQ_FAIL("{}: tensor {} overlaps tensor {}: the type or shape of one of them does not match the data", path_,
              describe(*t), describe(*prev));
    if (t->offset > align_up(end))
      VQ_FAIL("{}: {} unused bytes before tensor {}{}: a tensor's type or shape does not match the data", path_,
              t->offset - end, describe(*t), prev ? fmt::format(", after tensor {}", describe(*prev)) : "");
    prev = t;
    end = t->offset + t->nbytes;
  }
  if (prev && data_bytes > align_up(end))
    VQ_FAIL("{}: {} bytes after the last tensor {}: its type or shape does not match the data", path_,
            data_bytes - end, describe(*prev));
}

// ---------------------------------------------------------------- typed metadata access

namespace {
[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const char* want, GGUFValueType got) {
  VQ_FAIL("{}: metadata '{}' must be {}, but it is {}", path, key, want, value_type_name(uint32_t(got)));
}
bool is_uint(GGUFValueType t) {
  return t == GGUFValueType::UINT8 || t == GGUFValueType::UINT16 || t == GGUFValueType::UINT32 ||
         t == GGUFValueType::UINT64;
}
bool is_sint(GGUFValueType t) {
  return t == GGUFValueType::INT8 || t == GGUFValueType::INT16 || t == GGUFValueType::INT32 ||
         t == GGUFValueType::INT64;
}
bool is_float(GGUFValueType t) { return t == GGUFValueType::FLOAT32 || t == GGUFValueType::FLOAT64; }

bool value_as_int(const GGUFValue& v, int64_t* out) {
  if (is_uint(v.type)) {
    const uint64_t u = std::get<uint64_t>(v.v);
    if (u > uint64_t(std::numeric_limits<int64_t>::max())) return false;
    *out = int64_t(u);
    return true;
  }
  if (is_sint(v.type)) {
    *out = std::get<int64_t>(v.v);
    return true;
  }
  return false;
}
bool value_as_float(const GGUFValue& v, double* out) {
  if (is_float(v.type)) {
    *out = std::get<double>(v.v);
    return true;
  }
  if (is_uint(v.type)) {
    *out = double(std::get<uint64_t>(v.v));
    return true;
  }
  if (is_sint(v.type)) {
    *out = double(std::get<int64_t>(v.v));
    return true;
  }
  return false;
}
}  // namespace

static const GGUFValue& lookup(const std::map<std::string, GGUFValue>& kv, const std::string& path,
                               const std::string& key) {
  auto it = kv.find(key);
  if (it == kv.end()) VQ_FAIL("{}: metadata key '{}' is missing", path, key);
  return it->second;
}

std::string GGUFFile::get_string(const std::string& key) const {
  const GGUFValue& v = lookup(kv_, path_, key);
  if (v.type != GGUFValueType::STRING) wrong_type(path_, key, "a string", v.type);
  return std::get<std::string>(v.v);
}

int64_t GGUFFile::get_int(const std::string& key) const {
  const GGUFValue& v = lookup(kv_, path_, key);
  int64_t out;
  if (!value_as_int(v, &out)) {
    if (is_uint(v.type)) VQ_FAIL("{}: metadata '{}' = {} does not fit in int64", path_, key, std::get<uint64_t>(v.v));
    wrong_type(path_, key, "an integer", v.type);
  }
  return out;
}

double GGUFFile::get_float(const std::string& key) const {
  const GGUFValue& v = lookup(kv_, path_, key);
  double out;
  if (!value_as_float(v, &out)) wrong_type(path_, key, "a number", v.type);
  return out;
}

bool GGUFFile::get_bool(const std::string& key) const {
  const GGUFValue& v = lookup(kv_, path_, key);
  if (v.type != GGUFValueType::BOOL) wrong_type(path_, key, "a bool", v.type);
  return std::get<bool>(v.v);
}

static const GGUFArray& lookup_array(const std::map<std::string, GGUFValue>& kv, const std::string& path,
                                     const std::string& key) {
  const GGUFValue& v = lookup(kv, path, key);
  if (v.type != GGUFValueType::ARRAY) wrong_type(path, key, "an array", v.type);
  return *std::get<std::shared_ptr<GGUFArray>>(v.v);
}

std::vector<std::string> GGUFFile::get_string_array(const std::string& key) const {
  const GGUFArray& a = lookup_array(kv_, path_, key);
  if (a.type != GGUFValueType::STRING)
    VQ_FAIL("{}: metadata '{}' must be an array of strings, but its elements are {}", path_, key,
            value_type_name(uint32_t(a.type)));
  std::vector<std::string> out;
  out.reserve(a.items.size());
  for (const auto& it : a.items) out.push_back(std::get<std::string>(it.v));
  return out;
}

std::vector<double> GGUFFile::get_float_array(const std::string& key) const {
  const GGUFArray& a = lookup_array(kv_, path_, key);
  std::vector<double> out;
  out.reserve(a.items.size());
  for (size_t i = 0; i < a.items.size(); ++i) {
    double d;
    if (!value_as_float(a.items[i], &d))
      VQ_FAIL("{}: metadata '{}' must be an array of numbers, but its elements are {}", path_, key,
              value_type_name(uint32_t(a.type)));
    out.push_back(d);
  }
  return out;
}

std::vector<int64_t> GGUFFile::get_int_array(const std::string& key) const {
  const GGUFArray& a = lookup_array(kv_, path_, key);
  std::vector<int64_t> out;
  out.reserve(a.items.size());
  for (size_t i = 0; i < a.items.size(); ++i) {
    int64_t x;
    if (!value_as_int(a.items[i], &x))
      VQ_FAIL("{}: metadata '{}'[{}] must be an integer that fits in int64 (elements are {})", path_, key, i,
              value_type_name(uint32_t(a.type)));
    out.push_back(x);
  }
  return out;
}

int64_t GGUFFile::get_int_or(const std::string& key, int64_t def) const { return has(key) ? get_int(key) : def; }
double GGUFFile::get_float_or(const std::string& key, double def) const { return has(key) ? get_float(key) : def; }
std::string GGUFFile::get_string_or(const std::string& key, const std::string& def) const {
  return has(key) ? get_string(key) : def;
}

const GGUFTensorInfo* GGUFFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GGUFTensorInfo& GGUFFile::tensor(const std::string& name) const {
  const GGUFTensorInfo* t = find_tensor(name);
  if (!t) VQ_FAIL("{}: tensor '{}' not found", path_, name);
  return *t;
}

// ---------------------------------------------------------------- products on tensors

void require_supported(const GGUFTensorInfo& t) {
  if (!ggml_type_supported(t.type))
    VQ_FAIL("tensor '{}' has type {} ({}), which is not supported (supported: f32, f16, bf16, q8_0, q4_0, q4_1, "
            "q5_0, q5_1, q4_K, q5_K, q6_K)",
            t.name, ggml_type_name(t.type), uint32_t(t.type));
}

void dequantize_rows(const GGUFTensorInfo& t, int64_t row0, int64_t n_rows, float* dst) {
  require_supported(t);
  const int64_t cols = t.dims[0];
  const int64_t rows = cols == 0 ? 0 : t.numel() / cols;
  VQ_CHECK(row0 >= 0 && n_rows >= 0 && row0 <= rows && n_rows <= rows - row0,
           "tensor '{}': rows [{}, {}) out of range (it has {} rows)", t.name, row0, row0 + n_rows, rows);
  const size_t rb = ggml_row_bytes(t.type, cols);
  for (int64_t r = 0; r < n_rows; ++r) dequantize_row(t.type, t.data + size_t(row0 + r) * rb, dst + r * cols, cols);
}

}  // namespace vq
