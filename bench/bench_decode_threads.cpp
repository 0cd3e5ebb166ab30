// Thread scaling of the decode step's weight products (issue 22): the products of one
// transformer layer of a real model's shapes (q, k, v in one dispatch; o; gate and up in one
// dispatch; down), on the packed layouts the forward uses, over several distinct copies of the
// layer so that the weights stream from memory as in a real decode step. Activation
// quantization included. Prints a Markdown table: per thread count and activation row count
// (1 = decode, 8 = batched decode of 8 sequences, 512 = prefill), the time of one pass over the
// layers, the weight bytes streamed per second and the speed-up over the first thread count.
//
//   bench_decode_threads [--model qwen1.5b|qwen0.5b|smollm2] [--threads 1,2,4,8,16]
//                        [--M 1,8] [--layers 8] [--min-ms 300]
//
// Layer shapes and weight types (as in the usual GGUF files):
//   qwen1.5b: Qwen2.5-1.5B Q4_K_M: n_embd 1536, kv 256, ffn 8960; q/k/o/gate/up q4_K, v/down q6_K
//   qwen0.5b: Qwen2.5-0.5B Q4_K_M: n_embd 896 (not a multiple of 256: llama.cpp writes those
//             rows as q5_0 and q8_0), kv 128, ffn 4864; q/k/o/gate/up q5_0, v q8_0, down q6_K
//   smollm2:  SmolLM2-135M Q4_1: n_embd 576, kv 192, ffn 1536, every product q4_1
// Run on a quiet machine; each figure is the fastest of several repetitions.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/int_list.h"
#include "core/thread_pool.h"
#include "model/matmul_packed.h"
#include "model/weight_formats.h"

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_decode_threads: %s\n", why.c_str());
  std::exit(2);
}

std::vector<int64_t> parse_list(const std::string& s, const char* what) {
  try {
    return vq::parse_int_list(s, what);
  } catch (const vq::Error& e) {
    usage(e.what());
  }
}

struct Proj {
  const char* name;
  vq::GGMLType type;
  int64_t rows, cols;
};

std::vector<Proj> layer_of(const std::string& model) {
  using T = vq::GGMLType;
  if (model == "qwen1.5b")
    return {{"q", T::Q4_K, 1536, 1536}, {"k", T::Q4_K, 256, 1536},  {"v", T::Q6_K, 256, 1536},
            {"o", T::Q4_K, 1536, 1536}, {"gate", T::Q4_K, 8960, 1536}, {"up", T::Q4_K, 8960, 1536},
            {"down", T::Q6_K, 1536, 8960}};
  if (model == "qwen0.5b")
    return {{"q", T::Q5_0, 896, 896},   {"k", T::Q5_0, 128, 896},     {"v", T::Q8_0, 128, 896},
            {"o", T::Q5_0, 896, 896},   {"gate", T::Q5_0, 4864, 896}, {"up", T::Q5_0, 4864, 896},
            {"down", T::Q6_K, 896, 4864}};
  if (model == "smollm2")
    return {{"q", T::Q4_1, 576, 576},   {"k", T::Q4_1, 192, 576},     {"v", T::Q4_1, 192, 576},
            {"o", T::Q4_1, 576, 576},   {"gate", T::Q4_1, 1536, 576}, {"up", T::Q4_1, 1536, 576},
            {"down", T::Q4_1, 576, 1536}};
  usage("unknown --model " + model + " (qwen1.5b, qwen0.5b or smollm2)");
}

vq::PackedWeight make_packed(const Proj& p) {
  const size_t rb = vq::ggml_row_bytes(p.type, p.cols);
  std::vector<uint8_t> W(rb * size_t(p.rows));  // W: [rows, rb] GGUF rows
  std::vector<float> v(static_cast<size_t>(p.cols));
  uint64_t s = 777;
  for (int64_t r = 0; r < p.rows; ++r) {
    for (auto& e : v)
      s = s * 6364136223846793005ull + 1442695040888963407ull, e = float(int64_t(s >> 40) % 2001 - 1000) * 1e-4f;
    vq::quantize_row(p.type, v.data(), W.data() + size_t(r) * rb, p.cols);
  }
  return vq::pack_weight(p.type, W.data(), p.rows, p.cols);
}

vq::PackedWeight copy_of(const vq::PackedWeight& a) {
  vq::PackedWeight b;
  b.type = a.type, b.rows = a.rows, b.cols = a.cols;
  b.data.resize(a.data.size());
  std::copy(a.data.data(), a.data.data() + a.data.size(), b.data.data());
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model = "qwen1.5b";
  std::vector<int64_t> threads = {1, 2, 4, 8, 16}, Ms = {1, 8};
  int64_t n_layers = 8;
  double min_ms = 300;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("option " + a + " needs a value");
    const std::string v = argv[i + 1];
    if (a == "--model")
      model = v;
    else if (a == "--threads")
      threads = parse_list(v, "--threads");
    else if (a == "--M")
      Ms = parse_list(v, "--M");
    else if (a == "--layers")
      n_layers = parse_list(v, "--layers")[0];
    else if (a == "--min-ms")
      min_ms = double(parse_list(v, "--min-ms")[0]);
    else
      usage("unknown option " + a);
  }
  const std::vector<Proj> layer = layer_of(model);
  // weights[l][p]: projection p of layer copy l (distinct memory, same values)
  std::vector<std::vector<vq::PackedWeight>> weights(static_cast<size_t>(n_layers));
  size_t layer_bytes = 0;
  for (const Proj& p : layer) {
    weights[0].push_back(make_packed(p));
    layer_bytes += weights[0].back().data.size();
  }
  for (int64_t l = 1; l < n_layers; ++l)
    for (const auto& w : weights[0]) weights[size_t(l)].push_back(copy_of(w));
  const int64_t E = layer[0].cols, Q = layer[0].rows, F = layer[4].rows;
  const int64_t maxM = *std::max_element(Ms.begin(), Ms.end());
  // x: [maxM, max(E, Q, F)], the input of every product (its first E, Q or F columns per row).
  std::vector<float> x(size_t(maxM * std::max({E, Q, F})), 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7919 % 200) - 100) * 0.01f;
  std::vector<std::vector<float>> outs(layer.size());
  for (size_t p = 0; p < layer.size(); ++p) outs[p].resize(size_t(maxM * layer[p].rows));
  vq::ActivationBuffer ab;

  auto pass = [&](int64_t M) {
    for (int64_t l = 0; l < n_layers; ++l) {
      auto& W = weights[size_t(l)];
      const vq::QuantizedRows& X = ab.quantize(x.data(), M, E);
      const vq::PackedJob qkv[3] = {{&W[0], outs[0].data()}, {&W[1], outs[1].data()}, {&W[2], outs[2].data()}};
      vq::matmul_packed_multi(qkv, 3, X);
      vq::matmul_packed(W[3], ab.quantize(x.data(), M, Q), outs[3].data());
      const vq::QuantizedRows& X2 = ab.quantize(x.data(), M, E);
      const vq::PackedJob gu[2] = {{&W[4], outs[4].data()}, {&W[5], outs[5].data()}};
      vq::matmul_packed_multi(gu, 2, X2);
      vq::matmul_packed(W[6], ab.quantize(x.data(), M, F), outs[6].data());
    }
  };

  std::printf("model %s: %lld layer copies of %.1f MiB packed weights (%.1f MiB in all); times per pass over them\n\n",
              model.c_str(), (long long)n_layers, double(layer_bytes) / 1048576.0,
              double(layer_bytes) * double(n_layers) / 1048576.0);
  std::printf("| M | threads | ms per layer | weight GB/s | rows x layers / s | speed-up vs %lld thread(s) |\n",
              (long long)threads[0]);
  std::printf("|---|---|---|---|---|---|\n");
  for (int64_t M : Ms) {
    double first = 0;
    for (int64_t t : threads) {
      vq::set_num_threads(int(t));
      pass(M);  // warm-up
      double best = 1e30;
      const auto start = Clock::now();
      int reps = 0;
      while (reps < 3 || std::chrono::duration<double, std::milli>(Clock::now() - start).count() < min_ms) {
        const auto t0 = Clock::now();
        pass(M);
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
        ++reps;
      }
      const double per_layer = best / double(n_layers);
      if (first == 0) first = per_layer;
      std::printf("| %lld | %lld | %.3f | %.1f | %.0f | %.2f |\n", (long long)M, (long long)t, per_layer * 1e3,
                  double(layer_bytes) / per_layer / 1e9, double(M) / per_layer, first / per_layer);
      std::fflush(stdout);
    }
  }
  return 0;
}
