// GGUF reader: round trips through the test writer (every metadata value type, nested arrays,
// every tensor type, versions 2 and 3, custom alignment) and malformed files (one vq::Error
// naming the field and offset, never a crash or an out-of-bounds read: the corpus tests below
// copy every mutated image into an exactly-sized heap buffer so ASan sees any overread).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <unistd.h>

#include "core/error.h"
#include "model/gguf.h"
#include "model/gguf_writer.h"

namespace {

using vq::GGMLType;
using vq::GGUFValue;
using vq::GGUFValueType;
namespace t = vq::test;

// Parses the first n bytes of an image and reads every tensor's bytes.
void parse(const std::vector<uint8_t>& bytes, size_t n = SIZE_MAX) {
  n = std::min(n, bytes.size());
  // Exactly n bytes on the heap, so a read past the end is a heap overflow under ASan.
  auto* buf = new uint8_t[n ? n : 1];
  if (n) std::memcpy(buf, bytes.data(), n);
  struct Free {
    uint8_t* p;
    ~Free() { delete[] p; }
  } f{buf};
  auto file = vq::GGUFFile::from_memory(buf, n, "mem.gguf");
  // Touch every tensor's bytes while the buffer lives (checks they lie inside it).
  uint64_t sum = 0;
  for (const auto& ti : file->tensors())
    for (size_t i = 0; i < ti.nbytes; i += 7) sum += ti.data[i];
  (void)sum;
}

struct Kept {
  std::vector<uint8_t> bytes;
  std::unique_ptr<vq::GGUFFile> file;
};
Kept parse_keep(std::vector<uint8_t> bytes) {
  Kept k{std::move(bytes), nullptr};
  k.file = vq::GGUFFile::from_memory(k.bytes.data(), k.bytes.size(), "mem.gguf");
  return k;
}

std::string error_of(const std::vector<uint8_t>& bytes, size_t n = SIZE_MAX) {
  try {
    parse(bytes, n);
  } catch (const vq::Error& e) {
    return e.what();
  }
  return "";
}

// Every value type once, with extreme values, plus arrays of each and nested arrays.
void add_all_metadata(t::GGUFWriter& w) {
  w.add("u8", t::gguf_uint(GGUFValueType::UINT8, 250));
  w.add("i8", t::gguf_int(GGUFValueType::INT8, -128));
  w.add("u16", t::gguf_uint(GGUFValueType::UINT16, 65535));
  w.add("i16", t::gguf_int(GGUFValueType::INT16, -32768));
  w.add("u32", t::gguf_uint(GGUFValueType::UINT32, 4000000000u));
  w.add("i32", t::gguf_int(GGUFValueType::INT32, -2000000000));
  w.add("f32", t::gguf_float(GGUFValueType::FLOAT32, 1.5));
  w.add("bool_t", t::gguf_bool(true));
  w.add("bool_f", t::gguf_bool(false));
  w.add("str", t::gguf_string("h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C"));
  w.add("str_empty", t::gguf_string(""));
  w.add("u64", t::gguf_uint(GGUFValueType::UINT64, std::numeric_limits<uint64_t>::max()));
  w.add("i64", t::gguf_int(GGUFValueType::INT64, std::numeric_limits<int64_t>::min()));
  w.add("f64", t::gguf_float(GGUFValueType::FLOAT64, -1e300));
  w.add_string_array("arr_str", {"a", "", "ccc"});
  w.add_int32_array("arr_i32", {1, -2, 3});
  w.add_float32_array("arr_f32", {0.25f, -8.0f});
  w.add("arr_u8", t::gguf_array(GGUFValueType::UINT8, {t::gguf_uint(GGUFValueType::UINT8, 0),
                                                       t::gguf_uint(GGUFValueType::UINT8, 255)}));
  w.add("arr_u64", t::gguf_array(GGUFValueType::UINT64, {t::gguf_uint(GGUFValueType::UINT64, 1ull << 40)}));
  w.add("arr_i16", t::gguf_array(GGUFValueType::INT16, {t::gguf_int(GGUFValueType::INT16, -7)}));
  w.add("arr_bool", t::gguf_array(GGUFValueType::BOOL, {t::gguf_bool(true), t::gguf_bool(false)}));
  w.add("arr_f64", t::gguf_array(GGUFValueType::FLOAT64, {t::gguf_float(GGUFValueType::FLOAT64, 2.5)}));
  w.add("arr_empty", t::gguf_array(GGUFValueType::INT32, {}));
  // [[1, 2], [], [3]] and [["x"], ["y", "z"]] and [[[7]]]
  w.add("nested_i32",
        t::gguf_array(GGUFValueType::ARRAY,
                      {t::gguf_array(GGUFValueType::INT32, {t::gguf_int(GGUFValueType::INT32, 1),
                                                            t::gguf_int(GGUFValueType::INT32, 2)}),
                       t::gguf_array(GGUFValueType::INT32, {}),
                       t::gguf_array(GGUFValueType::INT32, {t::gguf_int(GGUFValueType::INT32, 3)})}));
  w.add("nested_str", t::gguf_array(GGUFValueType::ARRAY,
                                    {t::gguf_array(GGUFValueType::STRING, {t::gguf_string("x")}),
                                     t::gguf_array(GGUFValueType::STRING, {t::gguf_string("y"), t::gguf_string("z")})}));
  w.add("nested3", t::gguf_array(GGUFValueType::ARRAY,
                                 {t::gguf_array(GGUFValueType::ARRAY, {t::gguf_array(GGUFValueType::UINT16,
                                                                                      {t::gguf_uint(GGUFValueType::UINT16, 7)})})}));
}

// Deep comparison of two values (type and content).
void expect_same(const GGUFValue& a, const GGUFValue& b, const std::string& where) {
  ASSERT_EQ(a.type, b.type) << where;
  if (a.type == GGUFValueType::ARRAY) {
    const auto& x = *std::get<std::shared_ptr<vq::GGUFArray>>(a.v);
    const auto& y = *std::get<std::shared_ptr<vq::GGUFArray>>(b.v);
    ASSERT_EQ(x.type, y.type) << where;
    ASSERT_EQ(x.items.size(), y.items.size()) << where;
    for (size_t i = 0; i < x.items.size(); ++i) expect_same(x.items[i], y.items[i], where + "[" + std::to_string(i) + "]");
    return;
  }
  if (a.type == GGUFValueType::FLOAT32) {
    EXPECT_EQ(float(std::get<double>(a.v)), float(std::get<double>(b.v))) << where;
    return;
  }
  EXPECT_TRUE(a.v == b.v) << where;
}

// A small model-like file: every supported tensor type, a 3-D and a 1-D tensor and an
// unsupported known type.
t::GGUFWriter sample_writer(uint32_t version = 3, uint32_t alignment = 0) {
  t::GGUFWriter w(version);
  if (alignment) w.set_alignment(alignment);
  w.add_string("general.architecture", "llama");
  w.add_uint32("llama.block_count", 1);
  add_all_metadata(w);
  uint64_t seed = 1;
  for (GGMLType ty : t::supported_types()) {
    const int64_t cols = vq::ggml_block_elems(ty) == 256 ? 256 : 64;
    w.add_tensor_f32("w." + vq::ggml_type_name(ty), {cols, 3}, ty, t::random_weights(size_t(cols * 3), seed++, 0.1f));
  }
  w.add_tensor("iq4xs", {256, 2}, static_cast<GGMLType>(23), std::vector<uint8_t>(2 * 136, 7));  // IQ4_XS: not supported
  w.add_tensor_f32("norm", {8}, GGMLType::F32, t::random_weights(8, 99));
  w.add_tensor_f32("cube", {4, 3, 2}, GGMLType::F16, t::random_weights(24, 98));
  return w;
}

TEST(GGUFReader, EveryMetadataTypeRoundTrips) {
  for (uint32_t version : {2u, 3u}) {
    t::GGUFWriter w(version);
    add_all_metadata(w);
    t::GGUFWriter w2(version);
    add_all_metadata(w2);
    auto k = parse_keep(w.bytes());
    const auto& f = *k.file;
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.metadata().size(), 26u);
    EXPECT_TRUE(f.tensors().empty());
    EXPECT_EQ(f.get_int("u8"), 250);
    EXPECT_EQ(f.get_int("i8"), -128);
    EXPECT_EQ(f.get_int("u16"), 65535);
    EXPECT_EQ(f.get_int("i16"), -32768);
    EXPECT_EQ(f.get_int("u32"), 4000000000ll);
    EXPECT_EQ(f.get_int("i32"), -2000000000);
    EXPECT_EQ(f.get_float("f32"), 1.5);
    EXPECT_TRUE(f.get_bool("bool_t"));
    EXPECT_FALSE(f.get_bool("bool_f"));
    EXPECT_EQ(f.get_string("str"), "h\xC3\xA9llo, \xE4\xB8\x96\xE7\x95\x8C");
    EXPECT_EQ(f.get_string("str_empty"), "");
    EXPECT_EQ(std::get<uint64_t>(f.metadata().at("u64").v), std::numeric_limits<uint64_t>::max());
    EXPECT_THROW(f.get_int("u64"), vq::Error);  // does not fit int64
    EXPECT_EQ(f.get_int("i64"), std::numeric_limits<int64_t>::min());
    EXPECT_EQ(f.get_float("f64"), -1e300);
    EXPECT_EQ(f.get_string_array("arr_str"), (std::vector<std::string>{"a", "", "ccc"}));
    EXPECT_EQ(f.get_int_array("arr_i32"), (std::vector<int64_t>{1, -2, 3}));
    EXPECT_EQ(f.get_float_array("arr_f32"), (std::vector<double>{0.25, -8.0}));
    EXPECT_EQ(f.get_int_array("arr_u8"), (std::vector<int64_t>{0, 255}));
    EXPECT_EQ(f.get_int_array("arr_u64"), (std::vector<int64_t>{1ll << 40}));
    EXPECT_EQ(f.get_float_array("arr_i16"), (std::vector<double>{-7.0}));
    EXPECT_EQ(f.get_float_array("arr_f64"), (std::vector<double>{2.5}));
    EXPECT_TRUE(f.get_int_array("arr_empty").empty());
    EXPECT_EQ(f.metadata().at("arr_bool").type, GGUFValueType::ARRAY);
    // Nested arrays: compare the whole value trees against what was written.
    // Whole value trees, against a second image of the same input (a stable parse).
    auto expected = parse_keep(w2.bytes());
    for (const auto& [key, v] : f.metadata()) expect_same(v, expected.file->metadata().at(key), key);
    const auto& nested = *std::get<std::shared_ptr<vq::GGUFArray>>(f.metadata().at("nested_i32").v);
    ASSERT_EQ(nested.type, GGUFValueType::ARRAY);
    ASSERT_EQ(nested.items.size(), 3u);
    const auto& first = *std::get<std::shared_ptr<vq::GGUFArray>>(nested.items[0].v);
    ASSERT_EQ(first.items.size(), 2u);
    EXPECT_EQ(std::get<int64_t>(first.items[1].v), 2);
    const auto& n3 = *std::get<std::shared_ptr<vq::GGUFArray>>(f.metadata().at("nested3").v);
    const auto& n3b = *std::get<std::shared_ptr<vq::GGUFArray>>(n3.items[0].v);
    const auto& n3c = *std::get<std::shared_ptr<vq::GGUFArray>>(n3b.items[0].v);
    EXPECT_EQ(n3c.type, GGUFValueType::UINT16);
    EXPECT_EQ(std::get<uint64_t>(n3c.items[0].v), 7u);
  }
}

TEST(GGUFReader, TypedGettersNameTheKey) {
  auto k = parse_keep(sample_writer().bytes());
  const auto& f = *k.file;
  auto msg = [](auto&& fn) {
    try {
      fn();
    } catch (const vq::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(msg([&] { f.get_int("str"); }).find("'str'"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_string("u8"); }).find("'u8'"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_bool("nope"); }).find("'nope' is missing"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_string_array("arr_i32"); }).find("'arr_i32'"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_int_array("arr_f32"); }).find("'arr_f32'"), std::string::npos);
  EXPECT_NE(msg([&] { f.get_float_array("str"); }).find("'str'"), std::string::npos);
  EXPECT_EQ(f.get_int_or("nope", 42), 42);
  EXPECT_EQ(f.get_float_or("nope", 0.5), 0.5);
  EXPECT_EQ(f.get_string_or("nope", "d"), "d");
  EXPECT_EQ(f.get_int_or("u8", 1), 250);
  EXPECT_THROW(f.get_int_or("str", 1), vq::Error);  // present with the wrong type
  EXPECT_EQ(f.get_float("i32"), -2000000000.0);     // integers read as floats
  EXPECT_EQ(f.find_tensor("absent"), nullptr);
  EXPECT_NE(msg([&] { f.tensor("absent"); }).find("'absent'"), std::string::npos);
}

TEST(GGUFReader, TensorsRoundTripWithAlignment) {
  for (uint32_t version : {2u, 3u}) {
    for (uint32_t alignment : {0u, 64u, 1u}) {
      const auto w = sample_writer(version, alignment);
      const auto bytes = w.bytes();
      auto k = parse_keep(bytes);
      const auto& f = *k.file;
      const uint64_t al = alignment ? alignment : 32;
      ASSERT_EQ(f.tensors().size(), t::supported_types().size() + 3);
      for (GGMLType ty : t::supported_types()) {
        const auto& ti = f.tensor("w." + vq::ggml_type_name(ty));
        EXPECT_EQ(ti.type, ty);
        const int64_t cols = vq::ggml_block_elems(ty) == 256 ? 256 : 64;
        EXPECT_EQ(ti.dims, (std::vector<int64_t>{cols, 3}));
        EXPECT_EQ(ti.numel(), cols * 3);
        EXPECT_EQ(ti.nbytes, 3 * vq::ggml_row_bytes(ty, cols));
        EXPECT_EQ(ti.offset % al, 0u);
        EXPECT_EQ(size_t(ti.data - k.bytes.data()) % al, 0u);
        std::vector<float> rows(static_cast<size_t>(cols * 3));
        vq::dequantize_rows(ti, 0, 3, rows.data());
        for (float x : rows) EXPECT_TRUE(std::isfinite(x));
      }
      // Data of each tensor is byte-identical to what was written (the writer encodes the
      // same values again here).
      uint64_t seed = 1;
      for (GGMLType ty : t::supported_types()) {
        const int64_t cols = vq::ggml_block_elems(ty) == 256 ? 256 : 64;
        const auto v = t::random_weights(size_t(cols * 3), seed++, 0.1f);
        std::vector<uint8_t> enc(3 * vq::ggml_row_bytes(ty, cols));
        for (int r = 0; r < 3; ++r)
          vq::quantize_row(ty, v.data() + r * cols, enc.data() + r * vq::ggml_row_bytes(ty, cols), cols);
        const auto& ti = f.tensor("w." + vq::ggml_type_name(ty));
        EXPECT_EQ(0, std::memcmp(ti.data, enc.data(), enc.size())) << vq::ggml_type_name(ty);
      }
      EXPECT_EQ(f.tensor("cube").dims, (std::vector<int64_t>{4, 3, 2}));
      EXPECT_EQ(f.tensor("norm").nbytes, 32u);
      EXPECT_EQ(f.tensor("iq4xs").nbytes, 2u * 136);
    }
  }
}

TEST(GGUFReader, UnsupportedTypesFailAtUseNamingTensorAndType) {
  auto k = parse_keep(sample_writer().bytes());
  const auto& f = *k.file;
  std::vector<float> buf(1024);
  for (const char* name : {"iq4xs"}) {
    const auto& ti = f.tensor(name);
    EXPECT_FALSE(vq::ggml_type_supported(ti.type));
    for (int which = 0; which < 3; ++which) {
      try {
        if (which == 0) vq::require_supported(ti);
        if (which == 1) vq::dequantize_rows(ti, 0, 1, buf.data());
        if (which == 2) vq::matmul(ti, buf.data(), 1, buf.data());
        FAIL() << "no throw for " << name;
      } catch (const vq::Error& e) {
        const std::string m = e.what();
        EXPECT_NE(m.find(name), std::string::npos) << m;
        EXPECT_NE(m.find(vq::ggml_type_name(ti.type)), std::string::npos) << m;
      }
    }
  }
  const auto& good = f.tensor("w.q4_1");
  EXPECT_THROW(vq::dequantize_rows(good, 2, 2, buf.data()), vq::Error);  // rows out of range
  EXPECT_THROW(vq::matmul(f.tensor("cube"), buf.data(), 1, buf.data()), vq::Error);  // not 2-D
}

TEST(GGUFReader, ReadsFromDiskAndReportsMissingFiles) {
  const auto dir = std::filesystem::temp_directory_path() / ("vq_gguf_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "tiny.gguf").string();
  sample_writer().write(path);
  vq::GGUFFile f(path);
  EXPECT_EQ(f.path(), path);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.tensors().size(), t::supported_types().size() + 3);
  try {
    vq::GGUFFile g((dir / "missing.gguf").string());
    FAIL();
  } catch (const vq::Error& e) {
    EXPECT_NE(std::string(e.what()).find("missing.gguf"), std::string::npos);
  }
  EXPECT_THROW(vq::GGUFFile g(dir.string()), vq::Error);  // a directory
  std::filesystem::remove_all(dir);
}

// --- malformed files

// Offset of the first occurrence of `needle` in bytes.
size_t find(const std::vector<uint8_t>& b, const std::string& needle) {
  auto it = std::search(b.begin(), b.end(), needle.begin(), needle.end());
  EXPECT_NE(it, b.end()) << needle;
  return size_t(it - b.begin());
}
template <typename T>
void poke(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof(T));
}

void expect_error(const std::vector<uint8_t>& b, const std::string& part1, const std::string& part2 = "") {
  const std::string e = error_of(b);
  EXPECT_NE(e, "") << "no error, wanted " << part1;
  EXPECT_NE(e.find(part1), std::string::npos) << e;
  if (!part2.empty()) {
    EXPECT_NE(e.find(part2), std::string::npos) << e;
  }
}

TEST(GGUFReader, MalformedHeadersNameFieldAndOffset) {
  t::GGUFWriter w;
  w.add_uint32("k", 1);
  w.add_tensor_f32("tensor_a", {32, 2}, GGMLType::Q8_0, t::random_weights(64, 1));
  const auto good = w.bytes();
  ASSERT_EQ(error_of(good), "");

  auto b = good;
  b[0] = 'X';
  expect_error(b, "not a GGUF file", "byte offset 0");
  b = good;
  poke<uint32_t>(b, 4, 1);
  expect_error(b, "unsupported GGUF version 1", "byte offset 4");
  b = good;
  poke<uint32_t>(b, 4, 0x03000000u);
  expect_error(b, "big-endian");
  b = good;
  poke<uint64_t>(b, 16, uint64_t(1) << 60);  // kv_count
  expect_error(b, "kv_count");
  b = good;
  poke<uint64_t>(b, 8, uint64_t(1) << 60);  // tensor_count
  expect_error(b, "tensor_count");

  // Metadata: key length, value type, string length.
  const size_t key_at = find(good, "k") - 8;
  b = good;
  poke<uint64_t>(b, key_at, 1ull << 40);
  expect_error(b, "metadata[0] key", "string length");
  b = good;
  poke<uint32_t>(b, key_at + 9, 13);
  expect_error(b, "unknown value type 13", "metadata[0] 'k'");

  // Tensor info fields follow the name: n_dims u32, dims u64[n], type u32, offset u64.
  const size_t name_end = find(good, "tensor_a") + 8;
  b = good;
  poke<uint32_t>(b, name_end, 5);
  expect_error(b, "n_dims", "5 dimensions");
  b = good;
  poke<uint32_t>(b, name_end, 0);
  expect_error(b, "n_dims");
  b = good;
  poke<uint64_t>(b, name_end + 4, 1ull << 62);
  poke<uint64_t>(b, name_end + 12, 1ull << 62);
  expect_error(b, "dims[1]", "overflows");
  b = good;
  poke<uint64_t>(b, name_end + 4, 33);
  expect_error(b, "not a multiple of the q8_0 block size 32");
  b = good;
  poke<uint64_t>(b, name_end + 4, 64);  // twice the data: runs past the end of the file
  expect_error(b, "'tensor_a' data", "outside the file");
  b = good;
  poke<uint64_t>(b, name_end + 24, 4);  // offset not aligned
  expect_error(b, "offset", "not a multiple of the alignment 32");
  b = good;
  poke<uint64_t>(b, name_end + 24, 1ull << 63);
  expect_error(b, "offset");
  b = good;
  poke<uint64_t>(b, name_end + 24, uint64_t(-32));  // offset + size wraps around
  expect_error(b, "outside the file");
}

// The offset of tensor `name`'s type field (name, u32 n_dims, u64 dims[n_dims], then the type).
size_t type_field(const std::vector<uint8_t>& b, const std::string& name, int n_dims) {
  return find(b, name) + name.size() + 4 + 8 * size_t(n_dims);
}

TEST(GGUFReader, UnknownTypeIdIsRefusedNamingTheTensor) {
  t::GGUFWriter w;
  w.add_tensor("mystery", {16}, static_cast<GGMLType>(99), std::vector<uint8_t>(40, 1));
  expect_error(w.bytes(), "tensor_info[0] 'mystery' type", "unknown tensor type id 99");
}

// A changed type byte gives the tensor another size: it then overlaps the next tensor, leaves
// unused bytes before it, or (the last tensor) leaves bytes at the end. Each is refused at load
// naming the tensor; before, the file loaded and decoded other tensors' bytes as weights.
TEST(GGUFReader, ChangedTypeByteIsRefusedNamingTheTensor) {
  // Tensors of a few hundred bytes or more (as every weight of a real model): a size change is
  // then larger than the alignment padding. Same-size types (f16 <-> bf16) cannot be told apart
  // by the layout and are left out.
  t::GGUFWriter w;
  uint64_t seed = 7;
  for (GGMLType ty : t::supported_types())
    w.add_tensor_f32("w." + vq::ggml_type_name(ty), {256, 4}, ty, t::random_weights(256 * 4, seed++, 0.1f));
  w.add_tensor_f32("tail", {64}, GGMLType::F32, t::random_weights(64, seed++));
  const auto good = w.bytes();
  ASSERT_EQ(error_of(good), "");
  size_t refused = 0, cases = 0;
  for (GGMLType ty : t::supported_types()) {
    const std::string name = "w." + vq::ggml_type_name(ty);
    for (GGMLType other : t::supported_types()) {
      if (other == ty || vq::ggml_row_bytes(other, 256) == vq::ggml_row_bytes(ty, 256)) continue;
      auto b = good;
      poke<uint32_t>(b, type_field(b, name, 2), uint32_t(other));
      const std::string e = error_of(b);
      ++cases;
      if (e.find(name) != std::string::npos && e.find("mem.gguf") == 0) ++refused;
      else ADD_FAILURE() << name << " as " << vq::ggml_type_name(other) << ": " << (e.empty() ? "loaded" : e);
    }
  }
  EXPECT_EQ(refused, cases);
  EXPECT_GT(cases, 80u);
}

TEST(GGUFReader, ChangedTypeOfTheLastTensorIsRefused) {
  const auto good = sample_writer().bytes();
  // The last tensor ("cube", f16) as f32: past the end; as q2_K-sized garbage: block multiple.
  auto b = good;
  poke<uint32_t>(b, type_field(b, "cube", 3), uint32_t(GGMLType::F32));
  expect_error(b, "'cube'", "outside the file");
  b = good;
  poke<uint32_t>(b, type_field(b, "cube", 3), uint32_t(GGMLType::I8));  // half the size: bytes left over
  expect_error(b, "bytes after the last tensor 'cube'", "does not match");
}

TEST(GGUFReader, OverlappingOrGappedOffsetsAreRefused) {
  const auto good = sample_writer().bytes();
  auto k = parse_keep(good);
  const auto& a = k.file->tensor("w.q8_0");
  const auto& next = k.file->tensor("w.q4_0");
  ASSERT_GT(next.offset, a.offset);
  // next points into a's data: the two overlap.
  auto b = good;
  poke<uint64_t>(b, type_field(b, "w.q4_0", 2) + 4, a.offset);
  expect_error(b, "overlaps tensor 'w.q8_0'", "'w.q4_0'");
  // next moved one alignment step later: a gap before it, and then it overlaps the one after.
  b = good;
  poke<uint64_t>(b, type_field(b, "w.q4_0", 2) + 4, next.offset + 32);
  EXPECT_NE(error_of(b), "");
  // Tensors listed in another order than their data is stored in are fine.
  t::GGUFWriter w;
  w.add_tensor_f32("first", {32}, GGMLType::F32, std::vector<float>(32, 1.0f));
  w.add_tensor_f32("second", {32}, GGMLType::F32, std::vector<float>(32, 2.0f));
  auto swapped = w.bytes();
  const uint64_t o1 = 0, o2 = 128;
  poke<uint64_t>(swapped, type_field(swapped, "first", 1) + 4, o2);
  poke<uint64_t>(swapped, type_field(swapped, "second", 1) + 4, o1);
  auto ks = parse_keep(swapped);
  float x;
  std::memcpy(&x, ks.file->tensor("second").data, 4);
  EXPECT_EQ(x, 1.0f);  // "second" now names the first stored tensor's bytes
}

TEST(GGUFReader, MalformedMetadataValues) {
  auto bytes_with = [](auto&& add) {
    t::GGUFWriter w;
    add(w);
    return w.bytes();
  };
  // Array count larger than the bytes left: rejected before any allocation.
  auto b = bytes_with([](t::GGUFWriter& w) { w.add_int32_array("arr", {1, 2, 3}); });
  poke<uint64_t>(b, find(b, "arr") + 3 + 4 + 4, 1ull << 61);
  expect_error(b, "metadata[0] 'arr'", "array of");
  b = bytes_with([](t::GGUFWriter& w) { w.add_int32_array("arr", {1, 2, 3}); });
  poke<uint32_t>(b, find(b, "arr") + 3 + 4, 77);
  expect_error(b, "unknown array element type 77");
  // A string inside an array with a bad length names the element.
  b = bytes_with([](t::GGUFWriter& w) { w.add_string_array("toks", {"aa", "bb", "cc"}); });
  poke<uint64_t>(b, find(b, "bb") - 8, 1ull << 40);
  expect_error(b, "'toks'[1]", "string length");
  // Nesting depth is bounded.
  b = bytes_with([](t::GGUFWriter& w) {
    GGUFValue v = t::gguf_array(GGUFValueType::INT8, {});
    for (int i = 0; i < 40; ++i) v = t::gguf_array(GGUFValueType::ARRAY, {v});
    w.add("deep", v);
  });
  expect_error(b, "nested deeper");
  // Duplicate keys, bad general.alignment.
  b = bytes_with([](t::GGUFWriter& w) {
    w.add_uint32("dup", 1);
    w.add_uint32("dup", 2);
  });
  expect_error(b, "duplicate key", "'dup'");
  b = bytes_with([](t::GGUFWriter& w) { w.add_uint32("general.alignment", 48); });
  expect_error(b, "general.alignment", "power of two");
  b = bytes_with([](t::GGUFWriter& w) { w.add_uint32("general.alignment", 0); });
  expect_error(b, "general.alignment");
  b = bytes_with([](t::GGUFWriter& w) { w.add_string("general.alignment", "32"); });
  expect_error(b, "general.alignment", "uint32");
  // Duplicate tensor names.
  b = bytes_with([](t::GGUFWriter& w) {
    w.add_tensor_f32("same", {4}, GGMLType::F32, {1, 2, 3, 4});
    w.add_tensor_f32("same", {4}, GGMLType::F32, {1, 2, 3, 4});
  });
  expect_error(b, "duplicate tensor name");
}

// Issue 26: a vocabulary size no file of this size can hold is refused naming the key.
TEST(GGUFReader, VocabularySizesAreBoundedByTheFile) {
  auto bytes_with = [](auto&& add) {
    t::GGUFWriter w;
    add(w);
    return w.bytes();
  };
  auto b = bytes_with([](t::GGUFWriter& w) { w.add_uint32("llama.vocab_size", 4294967295u); });
  expect_error(b, "'llama.vocab_size' = 4294967295", "cannot fit in a file of");
  b = bytes_with([](t::GGUFWriter& w) { w.add_uint32("llama.vocab_size", 0); });
  expect_error(b, "'llama.vocab_size' = 0");
  b = bytes_with([](t::GGUFWriter& w) { w.add_string("llama.vocab_size", "49152"); });
  expect_error(b, "'llama.vocab_size'", "integer");
  b = bytes_with([](t::GGUFWriter& w) { w.add_uint32("llama.vocab_size", 20); });  // fits: accepted
  EXPECT_EQ(error_of(b), "");
}

TEST(GGUFReader, TruncationAtEveryOffsetThrows) {
  const auto bytes = sample_writer().bytes();
  size_t with_offset = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string e = error_of(bytes, n);
    ASSERT_NE(e, "") << "truncated to " << n << " bytes parsed without error";
    if (e.find("byte offset") != std::string::npos) ++with_offset;
  }
  EXPECT_EQ(with_offset, bytes.size());  // every message names an offset
  EXPECT_EQ(error_of(bytes), "");
}

TEST(GGUFReader, FlippedBytesNeverCrash) {
  auto w = sample_writer();
  const auto bytes = w.bytes();
  auto k = parse_keep(bytes);
  // Mutate the header, metadata and tensor infos (everything before the first tensor's data).
  size_t data_start = bytes.size();
  for (const auto& ti : k.file->tensors()) data_start = std::min(data_start, size_t(ti.data - k.bytes.data()));
  std::mt19937_64 rng(123);
  size_t ok = 0, failed = 0;
  std::vector<float> out;
  for (size_t at = 0; at < data_start; ++at) {
    for (uint8_t flip : {uint8_t(0x01), uint8_t(0x80), uint8_t(0xFF), uint8_t(rng() | 1)}) {
      auto b = bytes;
      b[at] ^= flip;
      try {
        auto kk = parse_keep(b);
        ++ok;
        // Whatever parsed must be usable without reading outside the image.
        for (const auto& ti : kk.file->tensors()) {
          if (!vq::ggml_type_supported(ti.type) || ti.dims.empty() || ti.dims[0] == 0) continue;
          const int64_t rows = std::min<int64_t>(ti.numel() / ti.dims[0], 4);
          out.resize(size_t(rows * ti.dims[0]));
          vq::dequantize_rows(ti, 0, rows, out.data());
        }
      } catch (const vq::Error&) {
        ++failed;
      }
    }
  }
  EXPECT_GT(failed, 0u);
  EXPECT_GT(ok, 0u);  // flips in string contents or values still parse
  std::printf("[ flips ] %zu bytes x 4 mutations: %zu parsed, %zu rejected with vq::Error\n", data_start, ok, failed);
}

}  // namespace
