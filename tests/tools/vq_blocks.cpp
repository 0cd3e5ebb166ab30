// Test tool: encodes float32 values into a GGML block type with vq::quantize_row, or decodes
// blocks with vq::dequantize_row. Used by tests/python/test_block_formats.py to compare with
// gguf-py's bit-exact copies of llama.cpp's reference quantizers.
//   vq_blocks encode TYPE IN.f32 OUT.bin     (TYPE: q8_0, q4_0, q4_1, q5_0, q5_1, ...)
//   vq_blocks decode TYPE IN.bin OUT.f32
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/input_file.h"
#include "model/weight_formats.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: vq_blocks encode|decode TYPE IN OUT\n");
    return 2;
  }
  try {
    const std::string mode = argv[1], type = argv[2];
    vq::GGMLType t = vq::GGMLType::F32;
    bool found = false;
    for (uint32_t id = 0; id < 40 && !found; ++id)
      if (vq::ggml_type_name(vq::GGMLType(id)) == type) t = vq::GGMLType(id), found = true;
    VQ_CHECK(found, "unknown type {}", type);
    const std::string in = vq::read_input_file(argv[3], uint64_t(1) << 30, "input");
    const int64_t be = vq::ggml_block_elems(t);
    const size_t bb = vq::ggml_block_bytes(t);
    std::vector<uint8_t> out;
    if (mode == "encode") {
      const int64_t n = int64_t(in.size() / 4);
      std::vector<float> x(static_cast<size_t>(n));
      std::memcpy(x.data(), in.data(), size_t(n) * 4);
      out.resize(vq::ggml_row_bytes(t, n));
      vq::quantize_row(t, x.data(), out.data(), n);
    } else {
      VQ_CHECK(mode == "decode" && in.size() % bb == 0, "bad mode or size");
      const int64_t n = int64_t(in.size() / bb) * be;
      std::vector<float> y(static_cast<size_t>(n));
      vq::dequantize_row(t, in.data(), y.data(), n);
      out.resize(size_t(n) * 4);
      std::memcpy(out.data(), y.data(), out.size());
    }
    vq::write_file_atomic(argv[4], out.data(), out.size());
  } catch (const vq::Error& e) {
    std::fprintf(stderr, "vq_blocks: %s\n", e.what());
    return 1;
  }
  return 0;
}
