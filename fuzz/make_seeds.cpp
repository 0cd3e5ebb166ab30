// Writes the seed corpora: fuzz/corpus/*.gguf with the test GGUF writer (small files holding every
// metadata value type and every tensor type) and fuzz/corpus_calibration/*.vqcal (small
// calibration files of each granularity and several presets, one with learned key maps). Rebuild the seeds (rarely needed):
//   g++ -std=c++20 -Isrc -Iinclude -Itests fuzz/make_seeds.cpp tests/model/gguf_writer.cpp \
//     build/<dir>/src/libvq_{model,kvcache,codec,ops,core}.a -lfmt -lhwy -lxxhash -lpthread -o /tmp/make_seeds
//   /tmp/make_seeds fuzz/corpus fuzz/corpus_calibration
#include <cmath>
#include <random>
#include <string>

#include "codec/calibration_file.h"
#include "model/gguf_writer.h"

namespace {

// A small calibration with random values inside the file's bounds.
void write_calibration(const std::string& path, int layers, int heads, int head_dim, vq::CodecParams k,
                       vq::CodecParams v, vq::Granularity g, uint32_t seed, bool learned = false) {
  vq::Calibration c;
  c.n_layers = layers, c.n_kv_heads = heads, c.head_dim = head_dim;
  c.key = k, c.value = v, c.granularity = g;
  c.kmeans_iters = 3, c.seed = seed, c.n_calib_tokens = 64, c.model = "seed";
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  c.layers.resize(size_t(layers));
  for (auto& L : c.layers) {
    L.smoothing.resize(size_t(heads) * head_dim);
    for (auto& x : L.smoothing) x = 0.5f + std::fabs(nd(rng));
    L.key_codebooks.resize(c.key_codebook_floats());
    L.value_codebooks.resize(c.value_codebook_floats());
    for (auto* b : {&L.key_codebooks, &L.value_codebooks})
      for (auto& x : *b) x = nd(rng);
    if (learned) {  // invertible maps: the identity plus small noise
      L.key_map.resize(size_t(heads) * head_dim * head_dim);
      for (size_t i = 0; i < L.key_map.size(); ++i)
        L.key_map[i] = (i / size_t(head_dim) % size_t(head_dim) == i % size_t(head_dim) ? 1.0f : 0.0f) + 0.05f * nd(rng);
    }
  }
  if (learned) c.key_transform = vq::KeyTransform::learned;
  vq::save_calibration(path, c);
}

}  // namespace

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
  const std::string cdir = argc > 2 ? argv[2] : "fuzz/corpus_calibration";
  write_calibration(cdir + "/shared_d2b4.vqcal", 1, 1, 8, {2, 4}, {2, 4}, vq::Granularity::shared, 1);
  write_calibration(cdir + "/per_subspace_k4_v8.vqcal", 2, 2, 16, {4, 4}, {8, 4}, vq::Granularity::per_subspace, 2);
  write_calibration(cdir + "/shared_d16b5.vqcal", 1, 1, 32, {16, 5}, {16, 5}, vq::Granularity::shared, 3);
  write_calibration(cdir + "/learned_k4_v8.vqcal", 2, 2, 16, {4, 4}, {8, 4}, vq::Granularity::per_subspace, 4, true);
  return 0;
}
