// Writes the seed corpus fuzz/corpus/*.gguf with the test GGUF writer: small files holding every
// metadata value type and every tensor type. Rebuild the seeds (rarely needed) with:
//   g++ -std=c++20 -Isrc -Iinclude -Itests fuzz/make_seeds.cpp tests/model/gguf_writer.cpp \
//     build/<dir>/src/libvq_{model,kvcache,codec,ops,core}.a -lfmt -lhwy -lxxhash -lpthread -o /tmp/make_seeds
//   /tmp/make_seeds fuzz/corpus
#include <string>

#include "model/gguf_writer.h"

int main(int argc, char** argv) {
  namespace t = vq::test;
  const std::string dir = argc > 1 ? argv[1] : "fuzz/corpus";
  {  // metadata of every type, nested arrays, no tensors (version 2)
    t::GGUFWriter w(2);
    w.add("u8", t::gguf_uint(vq::GGUFValueType::UINT8, 7));
    w.add("i8", t::gguf_int(vq::GGUFValueType::INT8, -7));
    w.add("u16", t::gguf_uint(vq::GGUFValueType::UINT16, 700));
    w.add("i16", t::gguf_int(vq::GGUFValueType::INT16, -700));
    w.add("i64", t::gguf_int(vq::GGUFValueType::INT64, -7));
    w.add("u64", t::gguf_uint(vq::GGUFValueType::UINT64, 7));
    w.add("f64", t::gguf_float(vq::GGUFValueType::FLOAT64, 0.5));
    w.add_bool("b", true);
    w.add_float32("f", 1.0f);
    w.add_string_array("s", {"a", "bc"});
    w.add("n", t::gguf_array(vq::GGUFValueType::ARRAY,
                             {t::gguf_array(vq::GGUFValueType::INT32, {t::gguf_int(vq::GGUFValueType::INT32, 1)})}));
    w.write(dir + "/metadata_v2.gguf");
  }
  {  // one tensor of every supported type (version 3)
    t::GGUFWriter w(3);
    w.add_string("general.architecture", "llama");
    uint64_t seed = 1;
    for (auto ty : t::supported_types()) {
      const int64_t cols = vq::ggml_block_elems(ty) == 256 ? 256 : 32;
      w.add_tensor_f32(vq::ggml_type_name(ty), {cols, 2}, ty, t::random_weights(size_t(cols * 2), seed++));
    }
    w.write(dir + "/all_types.gguf");
  }
  {  // custom alignment, 3-D tensor, an unsupported type
    t::GGUFWriter w(3);
    w.set_alignment(64);
    w.add_int32_array("ids", {1, 2, 3});
    w.add_tensor_f32("cube", {4, 2, 2}, vq::GGMLType::F16, t::random_weights(16, 3));
    w.add_tensor("q2k", {256}, vq::GGMLType::Q2_K, std::vector<uint8_t>(84, 1));
    w.add_tensor_f32("q41", {64, 1}, vq::GGMLType::Q4_1, t::random_weights(64, 4));
    w.write(dir + "/aligned.gguf");
  }
  return 0;
}
