// veloxquant bench <what>: benchmarks. `bench e2e`: batched decode (bench_e2e.cpp). `bench quantize`
// runs the quantize table (bench/quantize/quantize_bench.h, the same code as bench/bench_quantize),
// when the build has benchmarks (VQ_BUILD_BENCH). This file is on the public API; the benchmarks
// it runs time internals on purpose (see bench_e2e.cpp, bench_e2e_device.cpp, bench/quantize).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#if VQ_WITH_QUANTIZE_BENCH
#include "quantize_bench.h"
#endif
#include "commands.h"
#include "core/error.h"
#include "veloxquant/files.h"
#include "veloxquant/runtime.h"

namespace vq::cli {

namespace {
struct QuantizeArgs {
  std::string json;
  bool quick = false;
  int max_threads = 2;
};
}  // namespace

void add_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Run a benchmark and print its table");
  bench->require_subcommand(1);
  add_bench_e2e(bench);

  auto qa = std::make_shared<QuantizeArgs>();
  CLI::App* q = bench->add_subcommand(
      "quantize", "Fused nearest-centroid encoder vs the materialising reference (the original's quantize table)");
  q->add_option("--json", qa->json, "Also write the results as JSON to this file");
  q->add_flag("--quick", qa->quick, "Smoke run: the two smallest cases, few repetitions");
  q->add_option("--threads", qa->max_threads, "Fused runs with 1 and this many threads")->check(CLI::Range(1, 1024));
  q->callback([qa] {
    if (!qa->json.empty()) veloxquant::check_output_path(qa->json, "--json");
#if !VQ_WITH_QUANTIZE_BENCH
    VQ_FAIL("bench quantize: not built (configure with -DVQ_BUILD_BENCH=ON)");
#else
    QuantizeBenchOptions opt;
    opt.threads = {1};
    if (qa->max_threads > 1) opt.threads.push_back(qa->max_threads);
    auto cases = default_quantize_cases();
    if (qa->quick) {
      cases.resize(2);
      opt.min_seconds = 0.05;
      opt.ref_reps = 1;
    }
    std::printf("quantize benchmark on %s (GFLOP/s counts 3*sub_dim flops per sub-vector x centroid)\n",
                veloxquant::cpu_description().c_str());
    const auto rows = run_quantize_bench(cases, opt, [](const std::string& s) {
      std::fprintf(stderr, "  %s\n", s.c_str());
    });
    std::printf("%s", quantize_bench_table(rows).c_str());
    std::vector<DistanceFormRow> dist;
    if (!qa->quick) {
      dist = run_distance_form_bench();
      std::printf("\ndistance form, 1 thread (GFLOP/s from CPU time, 3*d flops per pair for both):\n%s",
                  distance_form_table(dist).c_str());
    }
    if (!qa->json.empty()) {
      const std::string doc = quantize_bench_json(rows, dist);
      veloxquant::write_file_atomic(qa->json, doc);
      std::printf("wrote %s\n", qa->json.c_str());
    }
#endif
  });
}

}  // namespace vq::cli
