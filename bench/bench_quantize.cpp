// The quantize benchmark: fused nearest-centroid encoder vs the materialising reference on the
// original's table (bench/quantize/quantize_bench.h). Usage: bench_quantize [--json FILE] [--quick]
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "quantize_bench.h"
#include "core/atomic_file.h"
#include "core/error.h"

int main(int argc, char** argv) {
  std::string json;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json") && i + 1 < argc) {
      json = argv[++i];
    } else if (!std::strcmp(argv[i], "--quick")) {
      quick = true;
    } else {
      std::fprintf(stderr, "usage: %s [--json FILE] [--quick]\n", argv[0]);
      return 2;
    }
  }
  try {
    vq::QuantizeBenchOptions opt;
    auto cases = vq::default_quantize_cases();
    if (quick) {  // smoke run: the two smallest cases, few reps
      cases.resize(2);
      opt.min_seconds = 0.05;
      opt.ref_reps = 1;
    }
    const auto rows = vq::run_quantize_bench(cases, opt, [](const std::string& s) {
      std::fprintf(stderr, "%s\n", s.c_str());
    });
    std::printf("%s", vq::quantize_bench_table(rows).c_str());
    std::vector<vq::DistanceFormRow> dist;
    if (!quick) {
      dist = vq::run_distance_form_bench();
      std::printf("\ndistance form, 1 thread (GFLOP/s from CPU time, 3*d flops per pair for both):\n%s",
                  vq::distance_form_table(dist).c_str());
    }
    if (!json.empty()) {
      const std::string doc = vq::quantize_bench_json(rows, dist);
      vq::write_file_atomic(json, doc.data(), doc.size());
      std::printf("wrote %s\n", json.c_str());
    }
  } catch (const vq::Error& e) {
    std::fprintf(stderr, "bench_quantize: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
