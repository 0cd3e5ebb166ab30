// libFuzzer target for the GGUF reader: any byte string must either parse or throw vq::Error,
// and whatever parses must be readable (metadata getters, every tensor's bytes, a few decoded
// rows of each supported tensor) without touching memory outside the input. Built with
// clang -fsanitize=fuzzer,address,undefined by fuzz/run_fuzz.sh (see docs/FUZZING.md).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "model/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::unique_ptr<vq::GGUFFile> f;
  try {
    f = vq::GGUFFile::from_memory(data, size, "fuzz.gguf");
  } catch (const vq::Error&) {
    return 0;
  }
  for (const auto& [key, value] : f->metadata()) {
    try {
      switch (value.type) {
        case vq::GGUFValueType::STRING: (void)f->get_string(key); break;
        case vq::GGUFValueType::BOOL: (void)f->get_bool(key); break;
        case vq::GGUFValueType::ARRAY:
          (void)f->get_float_array(key);
          (void)f->get_int_array(key);
          (void)f->get_string_array(key);
          break;
        default: (void)f->get_float(key), (void)f->get_int(key); break;
      }
    } catch (const vq::Error&) {
    }
  }
  volatile uint8_t sink = 0;
  std::vector<float> row;
  for (const auto& t : f->tensors()) {
    for (size_t i = 0; i < t.nbytes; ++i) sink = sink ^ t.data[i];
    if (!vq::ggml_type_supported(t.type) || t.dims[0] <= 0) continue;
    const int64_t rows = t.numel() / t.dims[0];
    const int64_t n = rows < 2 ? rows : 2;
    row.resize(size_t(n * t.dims[0]));
    try {
      vq::dequantize_rows(t, rows - n, n, row.data());
    } catch (const vq::Error&) {
    }
  }
  return 0;
}
