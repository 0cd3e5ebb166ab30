#pragma once
// The quantize benchmark (the original's quantize table on this CPU), shared by
// bench/bench_quantize and `veloxquant bench quantize`. Fused encoder (vq::cpu) against the
// materialising reference (vq::ref): median time, peak extra memory (resident-set high-water
// mark above the baseline, measured per run), GFLOP/s counting 3*sub_dim flops per
// (sub-vector, centroid) pair. The library only returns text; callers print it.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/cpu_info.h"  // cpu_model_name, for the records

namespace vq {

struct QuantizeBenchCase {
  int S, D, H, sub_dim, n_centroids;
  int64_t n_sub_vectors() const { return int64_t(H) * S * D / sub_dim; }
};

struct QuantizeBenchOptions {
  std::vector<int> threads = {1, 2};  // fused runs per thread count (ref is single-threaded)
  double min_seconds = 0.5;           // fused: repeat until this much time and
  int min_reps = 5;                   //        at least this many reps
  int ref_reps = 3;                   // reference reps (it is slow)
  bool run_ref = true;
  uint64_t seed = 1;
};

struct QuantizeBenchRun {
  int threads = 1;
  double median_ms = 0, min_ms = 0;
  // Median process CPU time per rep (all threads): close to threads * median_ms when the run had
  // the cores to itself; far below it when other processes competed (then the wall time is noisy).
  double median_cpu_ms = 0;
  int reps = 0;
  double gflops = 0;        // at the median
  int64_t peak_bytes = -1;  // measured extra resident memory; -1 if the OS gave no figure
};

struct QuantizeBenchRow {
  QuantizeBenchCase c;
  int64_t n = 0;                    // sub-vectors
  int64_t codes_bytes = 0;          // output codes (uint16)
  QuantizeBenchRun ref;             // materialising reference, 1 thread
  std::vector<QuantizeBenchRun> fused;
  int64_t ref_scratch_accounted = 0;    // the reference's chunk buffers, by construction
  int64_t fused_scratch_accounted = 0;  // the fused encoder's transposed codebook
  int64_t mismatches = -1;              // fused vs ref codes (-1: ref not run)
};

// The original's table: S in {128, 512, 2048, 8192} with D=128, H=8, sub_dim 8; S in
// {1024, 4096} with D=256, H=4, sub_dim 4; 256 centroids.
std::vector<QuantizeBenchCase> default_quantize_cases();

// Runs the cases. progress (may be empty) receives one line per finished measurement.
// Times first; then the peak-memory runs, for which it fixes glibc's mmap threshold (mallopt,
// process-wide) so freed scratch leaves the resident set and each run's high-water mark is its own.
std::vector<QuantizeBenchRow> run_quantize_bench(const std::vector<QuantizeBenchCase>& cases,
                                                 const QuantizeBenchOptions& opt,
                                                 const std::function<void(const std::string&)>& progress = {});

std::string quantize_bench_table(const std::vector<QuantizeBenchRow>& rows);
std::string quantize_bench_json(const std::vector<QuantizeBenchRow>& rows);

// Direct sum (x-c)^2 against the |c|^2 - 2 x.c form of the fused encoder, 1 thread, per
// (sub_dim, n_centroids): the measurement behind the encoder's automatic choice.
struct DistanceFormRow {
  int sub_dim, n_centroids;
  int64_t n;                             // sub-vectors
  double direct_gflops, dot_gflops;      // at the median process CPU time (1 thread)
  int64_t code_differences;              // sub-vectors where the two forms chose differently
};
std::vector<DistanceFormRow> run_distance_form_bench(double min_seconds = 0.3, uint64_t seed = 1);
std::string distance_form_table(const std::vector<DistanceFormRow>& rows);

// JSON document: {"benchmark", "date", "cpu", "simd_target", "flops_per_pair", "rows": [...],
// "distance_form": [...]}.
std::string quantize_bench_json(const std::vector<QuantizeBenchRow>& rows,
                                const std::vector<DistanceFormRow>& distance_rows = {});  // from /proc/cpuinfo ("unknown" elsewhere)

}  // namespace vq
