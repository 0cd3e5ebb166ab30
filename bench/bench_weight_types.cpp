// Weight-product micro-benchmark over every GGUF weight type and activation row count:
// y[M, rows] = x[M, cols] @ W^T through vq::matmul (activation quantization included, as in the
// forward), weights resident ("hot": the same matrix again and again). Prints GFLOP/s
// (2 * M * rows * cols per call) per type, shape, row count and dispatch target, as a
// Markdown table. M = 1 is decode, 2..16 batched decode, 64 and more prefill.
//
//   bench_weight_types [--types all|q4_K,q6_K,...] [--M 1,2,4,8,16,64,512] [--threads 1[,2,4,8,16]]
//                      [--shapes 1536x1536,8960x1536,1536x8960] [--targets best|all] [--min-ms 200]
//                      [--layout both|plain|packed]
//
// --layout: "plain" multiplies the GGUF layout (vq::matmul), "packed" the row-interleaved copy
// of model/matmul_packed.h (the forward's path for the types that have one), "both"
// prints a row for each where a packed layout exists.
//
// --threads with a list repeats every row at each thread count (a thread sweep; each row
// then says its thread count).
//
// Shapes are rows x cols (output x input); the defaults are Qwen2.5-Coder-1.5B's q/o,
// gate/up and down projections. --targets all repeats every row on each Highway target this
// CPU runs (AVX2, AVX-512, AVX-512 VNNI, ...), forced with hwy::SetSupportedTargetsForTest.
// Run it on a quiet machine: it measures elapsed time per call (the fastest of many batches).
#ifndef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL 1  // the target set of model/matmul_kernels.cpp
#endif
#include <hwy/targets.h>

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

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t p = 0;
  while (p <= s.size()) {
    size_t q = s.find(',', p);
    if (q == std::string::npos) q = s.size();
    if (q > p) out.push_back(s.substr(p, q - p));
    p = q + 1;
  }
  return out;
}

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr, "bench_weight_types: %s\n", why.c_str());
  std::exit(2);
}

vq::GGMLType parse_type(const std::string& s) {
  for (uint32_t i = 0; i < 40; ++i) {
    const auto t = static_cast<vq::GGMLType>(i);
    if (vq::ggml_type_supported(t) && vq::ggml_type_name(t) == s) return t;
  }
  usage("unknown or unsupported type " + s);
}

std::vector<int64_t> parse_list(const std::string& s, const char* what) {
  try {
    return vq::parse_int_list(s, what);
  } catch (const vq::Error& e) {
    usage(e.what());
  }
}

int64_t parse_int(const std::string& s, const char* what) {
  try {
    return vq::parse_int_option(s, what);
  } catch (const vq::Error& e) {
    usage(e.what());
  }
}

template <class F>
double seconds_per_call(F&& fn, double min_ms) {
  fn();
  double best = 1e30;
  const auto start = Clock::now();
  int reps = 1, batches = 0;
  while (true) {
    const auto t0 = Clock::now();
    for (int i = 0; i < reps; ++i) fn();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best = std::min(best, s / reps);
    ++batches;
    if (s < 0.005) reps *= 2;
    if (std::chrono::duration<double, std::milli>(Clock::now() - start).count() > min_ms && batches >= 3) break;
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> types = {"q4_K", "q6_K", "q5_0", "q8_0", "q4_1", "q4_0", "q5_1",
                                    "q2_K", "q3_K", "q5_K", "f16",  "bf16", "f32"};
  std::vector<int64_t> Ms = {1, 2, 4, 8, 16, 64, 512};
  std::vector<std::pair<int64_t, int64_t>> shapes = {{1536, 1536}, {8960, 1536}, {1536, 8960}};
  std::vector<int64_t> thread_counts = {1};
  bool all_targets = false;
  std::string layout = "both";
  double min_ms = 200;
  for (int i = 1; i < argc; i += 2) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage("option " + a + " needs a value");
    const std::string v = argv[i + 1];
    if (a == "--types") {
      if (v != "all") types = split(v);
    } else if (a == "--M") {
      Ms = parse_list(v, "--M");
    } else if (a == "--threads") {
      thread_counts = parse_list(v, "--threads");
    } else if (a == "--shapes") {
      shapes.clear();
      for (const auto& s : split(v)) {
        const size_t x = s.find('x');
        if (x == std::string::npos) usage("shape '" + s + "' is not ROWSxCOLS");
        shapes.emplace_back(parse_int(s.substr(0, x), "rows"), parse_int(s.substr(x + 1), "cols"));
      }
    } else if (a == "--targets") {
      if (v != "best" && v != "all") usage("--targets is best or all, not " + v);
      all_targets = v == "all";
    } else if (a == "--layout") {
      if (v != "both" && v != "plain" && v != "packed") usage("--layout is both, plain or packed, not " + v);
      layout = v;
    } else if (a == "--min-ms") {
      min_ms = double(parse_int(v, "--min-ms"));
    } else {
      usage("unknown option " + a);
    }
  }
  std::vector<int64_t> targets = {0};  // 0: the normal dispatch (best target)
  if (all_targets) targets = hwy::SupportedAndGeneratedTargets();

  std::printf("GFLOP/s = 2*M*rows*cols / elapsed time per call (hot weights, quantization of x included)\n\n");
  std::printf("| type | layout | rows x cols | target | threads |");
  for (int64_t M : Ms) std::printf(" M=%lld |", (long long)M);
  std::printf("\n|---|---|---|---|---|");
  for (size_t i = 0; i < Ms.size(); ++i) std::printf("---|");
  std::printf("\n");
  for (const auto& tn : types) {
    const vq::GGMLType t = parse_type(tn);
    for (auto [rows, cols] : shapes) {
      if (cols % vq::ggml_block_elems(t) != 0) {
        std::printf("| %s | - | %lld x %lld | (cols not a multiple of the block) |\n", tn.c_str(), (long long)rows,
                    (long long)cols);
        continue;
      }
      const size_t rb = vq::ggml_row_bytes(t, cols);
      std::vector<uint8_t> W(rb * size_t(rows));  // W: [rows, rb] packed weights
      {
        std::vector<float> v(static_cast<size_t>(cols));  // v: [cols] one f32 row before quantization
        uint64_t s = 12345;
        for (int64_t r = 0; r < rows; ++r) {
          for (auto& e : v)
            s = s * 6364136223846793005ull + 1442695040888963407ull, e = float(int64_t(s >> 40) % 2001 - 1000) * 1e-4f;
          vq::quantize_row(t, v.data(), W.data() + size_t(r) * rb, cols);
        }
      }
      const int64_t maxM = *std::max_element(Ms.begin(), Ms.end());
      std::vector<float> x(size_t(maxM * cols)), y(size_t(maxM * rows));  // x: [maxM, cols], y: [maxM, rows]
      for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7919 % 200) - 100) * 0.01f;
      std::vector<bool> packed_layouts;  // which layouts to time for this type
      if (layout != "packed") packed_layouts.push_back(false);
      if (layout != "plain" && vq::packable(t, cols)) packed_layouts.push_back(true);
      vq::PackedWeight P;
      if (vq::packable(t, cols)) P = vq::pack_weight(t, W.data(), rows, cols);
      for (bool packed : packed_layouts)
        for (int64_t target : targets)
          for (int64_t threads : thread_counts) {
            vq::set_num_threads(int(threads));
            if (target != 0) hwy::SetSupportedTargetsForTest(target);
            const char* tname = target != 0 ? hwy::TargetName(target) : "best";
            std::printf("| %s | %s | %lld x %lld | %s | %lld |", tn.c_str(), packed ? "packed" : "plain", (long long)rows,
                        (long long)cols, tname, (long long)threads);
            for (int64_t M : Ms) {
              const double s = seconds_per_call(
                  [&] {
                    if (packed)
                      vq::matmul_packed(P, x.data(), M, y.data());  // quantizes x unless P is a float type
                    else
                      vq::matmul(t, W.data(), rows, cols, x.data(), M, y.data());
                  },
                  min_ms);
              std::printf(" %.1f |", 2.0 * double(M) * double(rows) * double(cols) / s / 1e9);
              std::fflush(stdout);
            }
            std::printf("\n");
          }
      hwy::SetSupportedTargetsForTest(0);
    }
  }
  return 0;
}
