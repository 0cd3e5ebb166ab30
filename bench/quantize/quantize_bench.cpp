#include "quantize_bench.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <random>

#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/cpu/pq.h"
#include "ops/ref/pq.h"

namespace vq {

namespace {

using Clock = std::chrono::steady_clock;

// Reads a "Key:   123 kB" line of /proc/self/status, in bytes; -1 if absent.
int64_t proc_status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.rfind(k, 0) == 0) return std::stoll(line.substr(k.size())) * 1024;
  return -1;
}

// Resets the resident-set high-water mark to the current resident set (Linux clear_refs 5).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  f << "5";
  f.flush();
  return bool(f);
}

// Peak extra resident bytes while fn runs (fn's allocations, pages it first touches).
template <typename F>
int64_t measure_peak_extra(F&& fn) {
  malloc_trim(0);
  if (!reset_peak_rss()) {
    fn();
    return -1;
  }
  const int64_t base = proc_status_bytes("VmRSS");
  fn();
  const int64_t peak = proc_status_bytes("VmHWM");
  if (base < 0 || peak < 0) return -1;
  return std::max<int64_t>(0, peak - base);
}

double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

template <typename F>
QuantizeBenchRun time_runs(F&& fn, int min_reps, double min_seconds, double flops) {
  std::vector<double> ms, cpu;
  const auto start = Clock::now();
  while (int(ms.size()) < min_reps ||
         std::chrono::duration<double>(Clock::now() - start).count() < min_seconds) {
    const double c0 = process_cpu_ms();
    const auto t0 = Clock::now();
    fn();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    cpu.push_back(process_cpu_ms() - c0);
    if (ms.size() >= 1000) break;
  }
  QuantizeBenchRun r;
  r.reps = int(ms.size());
  r.median_ms = median(ms);
  r.median_cpu_ms = median(cpu);
  r.min_ms = *std::min_element(ms.begin(), ms.end());
  r.gflops = flops / (r.median_ms * 1e-3) / 1e9;
  return r;
}

std::string today() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d", &tm);
  return buf;
}

std::string json_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) o += c;
  }
  return o;
}

}  // namespace

std::vector<QuantizeBenchCase> default_quantize_cases() {
  return {{128, 128, 8, 8, 256},  {512, 128, 8, 8, 256},  {2048, 128, 8, 8, 256},
          {8192, 128, 8, 8, 256}, {1024, 256, 4, 4, 256}, {4096, 256, 4, 4, 256}};
}

namespace {

// One case's inputs: the keys of one layer, [H*S, D] f32 = [n, sub_dim] sub-vectors, and one
// shared codebook [k, sub_dim] f32 (standard normal, seeded).
struct CaseData {
  PQShape s;
  std::vector<float> x, book;
  CaseData(const QuantizeBenchCase& c, uint64_t seed)
      : s{int64_t(c.H) * c.S, c.D / c.sub_dim, c.sub_dim, c.n_centroids, false} {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> nd;
    x.resize(size_t(c.n_sub_vectors()) * c.sub_dim);
    for (auto& v : x) v = nd(rng);
    book.resize(size_t(c.n_centroids) * c.sub_dim);
    for (auto& v : book) v = nd(rng);
  }
};

}  // namespace

std::vector<QuantizeBenchRow> run_quantize_bench(const std::vector<QuantizeBenchCase>& cases,
                                                 const QuantizeBenchOptions& opt,
                                                 const std::function<void(const std::string&)>& progress) {
  for (int t : opt.threads) VQ_CHECK(t >= 1 && t <= 1024, "bench quantize: thread count {} must be in 1..1024", t);
  for (const QuantizeBenchCase& c : cases)
    VQ_CHECK(c.S > 0 && c.H > 0 && c.sub_dim > 0 && c.D % c.sub_dim == 0 && c.n_centroids >= 1,
             "bench quantize: case S={} D={} H={} sub_dim={} k={} invalid", c.S, c.D, c.H, c.sub_dim, c.n_centroids);
  const int restore_threads = num_threads();
  std::vector<QuantizeBenchRow> rows;
  // Phase 1: times, with the allocator in its default state (the reference reuses its heap).
  for (const QuantizeBenchCase& c : cases) {
    const CaseData D(c, opt.seed);
    QuantizeBenchRow row;
    row.c = c;
    row.n = c.n_sub_vectors();
    std::vector<uint16_t> codes(size_t(row.n), 0), ref_codes(size_t(row.n), 0);  // [H*S, D/sub_dim] uint16
    row.codes_bytes = int64_t(codes.size() * sizeof(uint16_t));
    row.ref_scratch_accounted = int64_t(ref::pq_encode_scratch_bytes(D.s));
    row.fused_scratch_accounted = int64_t(cpu::PQEncoder(D.s, D.book.data()).bytes());
    const double flops = 3.0 * c.sub_dim * double(row.n) * c.n_centroids;
    if (opt.run_ref) {
      auto ref_run = [&] { ref::pq_encode(D.s, D.x.data(), D.book.data(), ref_codes.data()); };
      ref_run();  // warm-up
      row.ref = time_runs(ref_run, opt.ref_reps, 0.0, flops);
      if (progress)
        progress(fmt::format("S={} D={} H={} d={}: ref {:.2f} ms", c.S, c.D, c.H, c.sub_dim, row.ref.median_ms));
    }
    for (int th : opt.threads) {
      set_num_threads(th);
      auto fused_run = [&] { cpu::pq_encode(D.s, D.x.data(), D.book.data(), codes.data()); };
      fused_run();  // warm-up: pool threads, pages
      QuantizeBenchRun r = time_runs(fused_run, opt.min_reps, opt.min_seconds, flops);
      r.threads = th;
      row.fused.push_back(r);
      if (progress)
        progress(fmt::format("S={} D={} H={} d={}: fused {} thread(s) {:.3f} ms", c.S, c.D, c.H, c.sub_dim, th,
                             r.median_ms));
    }
    if (opt.run_ref) {
      row.mismatches = 0;
      for (size_t i = 0; i < codes.size(); ++i) row.mismatches += codes[i] != ref_codes[i];
    }
    rows.push_back(std::move(row));
  }
  // Phase 2: peak extra memory. A fixed mmap threshold (no dynamic raising) makes every large
  // buffer its own mapping, returned to the OS on free, so each run's high-water mark is its own.
  mallopt(M_MMAP_THRESHOLD, 64 * 1024);
  for (QuantizeBenchRow& row : rows) {
    const CaseData D(row.c, opt.seed);
    std::vector<uint16_t> codes(size_t(row.n), 0);  // [H*S, D/sub_dim] uint16, touched before measuring
    if (opt.run_ref)
      row.ref.peak_bytes = measure_peak_extra([&] { ref::pq_encode(D.s, D.x.data(), D.book.data(), codes.data()); });
    for (QuantizeBenchRun& r : row.fused) {
      set_num_threads(r.threads);
      cpu::pq_encode(D.s, D.x.data(), D.book.data(), codes.data());
      r.peak_bytes = measure_peak_extra([&] { cpu::pq_encode(D.s, D.x.data(), D.book.data(), codes.data()); });
    }
  }
  set_num_threads(restore_threads);
  return rows;
}

std::vector<DistanceFormRow> run_distance_form_bench(double min_seconds, uint64_t seed) {
  const int restore_threads = num_threads();
  set_num_threads(1);
  std::vector<DistanceFormRow> rows;
  for (int k : {256, 1024, 4096})
    for (int d : {4, 8, 16}) {
      const int64_t n = (int64_t(1) << 28) / (int64_t(k) * d);  // ~0.8 GFLOP per encode
      const PQShape s{n, 1, d, k, false};
      std::mt19937 rng(static_cast<uint32_t>(seed));
      std::normal_distribution<float> nd;
      std::vector<float> x(size_t(n) * d), book(size_t(k) * d);  // x: [n, d]; book: [k, d]
      for (auto& v : x) v = nd(rng);
      for (auto& v : book) v = nd(rng);
      std::vector<uint16_t> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));  // codes: [n]
      const cpu::PQEncoder direct(s, book.data(), cpu::PQDistance::direct);
      const cpu::PQEncoder dot(s, book.data(), cpu::PQDistance::dot);
      const double flops = 3.0 * d * double(n) * k;
      DistanceFormRow r{d, k, n, 0, 0, 0};
      // 1 thread: process CPU time is the run time without the other processes' share of the core.
      r.direct_gflops =
          flops / time_runs([&] { direct.encode(x.data(), n, a.data()); }, 3, min_seconds, flops).median_cpu_ms / 1e6;
      r.dot_gflops =
          flops / time_runs([&] { dot.encode(x.data(), n, b.data()); }, 3, min_seconds, flops).median_cpu_ms / 1e6;
      for (int64_t i = 0; i < n; ++i) r.code_differences += a[size_t(i)] != b[size_t(i)];
      rows.push_back(r);
    }
  set_num_threads(restore_threads);
  return rows;
}

std::string distance_form_table(const std::vector<DistanceFormRow>& rows) {
  std::string out =
      "|    k |  d |       N | direct GFLOP/s | dot GFLOP/s | dot/direct | codes differing |\n"
      "|------|----|---------|----------------|-------------|------------|-----------------|\n";
  for (const auto& r : rows)
    out += fmt::format("| {:4} | {:2} | {:7} | {:14.1f} | {:11.1f} | {:9.2f}x | {:15} |\n", r.n_centroids, r.sub_dim,
                       r.n, r.direct_gflops, r.dot_gflops, r.dot_gflops / r.direct_gflops, r.code_differences);
  return out;
}

std::string quantize_bench_table(const std::vector<QuantizeBenchRow>& rows) {
  auto mib = [](int64_t b) { return b < 0 ? std::string("n/a") : fmt::format("{:.2f}", double(b) / (1 << 20)); };
  std::string out;
  std::string head = "|    S |   D | H | d |       N | ref ms (cpu) | ref peak MiB |";
  std::string rule = "|------|-----|---|---|---------|--------------|--------------|";
  const size_t nf = rows.empty() ? 0 : rows[0].fused.size();
  for (size_t i = 0; i < nf; ++i) {
    const int th = rows[0].fused[i].threads;
    head += fmt::format(" fused {}T ms (cpu) | {}T GFLOP/s | {}T peak MiB | {}T speedup |", th, th, th, th);
    rule += "-------------------|-------------|--------------|------------|";
  }
  if (nf >= 2) {
    head += fmt::format(" {}T/{}T |", rows[0].fused[1].threads, rows[0].fused[0].threads);
    rule += "-------|";
  }
  head += " codes MiB | mismatch |";
  rule += "-----------|----------|";
  out += head + "\n" + rule + "\n";
  for (const auto& r : rows) {
    std::string line =
        fmt::format("| {:4} | {:3} | {} | {} | {:7} | {:>12} | {:>12} |", r.c.S, r.c.D, r.c.H, r.c.sub_dim, r.n,
                    fmt::format("{:.1f} ({:.0f})", r.ref.median_ms, r.ref.median_cpu_ms), mib(r.ref.peak_bytes));
    for (const auto& f : r.fused)
      line += fmt::format(" {:>17} | {:11.1f} | {:>12} | {:>9.1f}x |",
                          fmt::format("{:.3f} ({:.3f})", f.median_ms, f.median_cpu_ms), f.gflops, mib(f.peak_bytes),
                          r.ref.median_ms > 0 ? r.ref.median_ms / f.median_ms : 0.0);
    if (r.fused.size() >= 2) line += fmt::format(" {:5.2f} |", r.fused[0].median_ms / r.fused[1].median_ms);
    line += fmt::format(" {:>9} | {:>8} |", mib(r.codes_bytes), r.mismatches);
    out += line + "\n";
  }
  return out;
}

std::string quantize_bench_json(const std::vector<QuantizeBenchRow>& rows,
                                const std::vector<DistanceFormRow>& distance_rows) {
  std::string o = "{\n";
  o += "  \"benchmark\": \"quantize\",\n";
  o += fmt::format("  \"date\": \"{}\",\n", today());
  o += fmt::format("  \"cpu\": \"{}\",\n", json_escape(cpu_model_name()));
  o += fmt::format("  \"simd_target\": \"{}\",\n", json_escape(cpu::simd_target_name()));
  o += "  \"flops_per_pair\": \"3 * sub_dim\",\n";
  o += "  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    o += fmt::format(
        "    {{\"S\": {}, \"D\": {}, \"H\": {}, \"sub_dim\": {}, \"n_centroids\": {}, \"n_sub_vectors\": {}, "
        "\"codes_bytes\": {}, \"ref_scratch_accounted_bytes\": {}, \"fused_scratch_accounted_bytes\": {}, "
        "\"mismatches\": {},\n",
        r.c.S, r.c.D, r.c.H, r.c.sub_dim, r.c.n_centroids, r.n, r.codes_bytes, r.ref_scratch_accounted,
        r.fused_scratch_accounted, r.mismatches);
    o += fmt::format(
        "     \"ref\": {{\"threads\": 1, \"median_ms\": {:.4f}, \"min_ms\": {:.4f}, \"median_cpu_ms\": {:.4f}, "
        "\"reps\": {}, \"gflops\": {:.3f}, \"peak_extra_bytes\": {}}},\n",
        r.ref.median_ms, r.ref.min_ms, r.ref.median_cpu_ms, r.ref.reps, r.ref.gflops, r.ref.peak_bytes);
    o += "     \"fused\": [";
    for (size_t j = 0; j < r.fused.size(); ++j) {
      const auto& f = r.fused[j];
      o += fmt::format(
          "{}{{\"threads\": {}, \"median_ms\": {:.4f}, \"min_ms\": {:.4f}, \"median_cpu_ms\": {:.4f}, \"reps\": {}, "
          "\"gflops\": {:.3f}, \"peak_extra_bytes\": {}, \"speedup_vs_ref\": {:.2f}}}",
          j ? ", " : "", f.threads, f.median_ms, f.min_ms, f.median_cpu_ms, f.reps, f.gflops, f.peak_bytes,
          r.ref.median_ms > 0 ? r.ref.median_ms / f.median_ms : 0.0);
    }
    o += "]}";
    o += i + 1 < rows.size() ? ",\n" : "\n";
  }
  o += "  ],\n  \"distance_form\": [";
  for (size_t i = 0; i < distance_rows.size(); ++i) {
    const auto& r = distance_rows[i];
    o += fmt::format(
        "{}\n    {{\"sub_dim\": {}, \"n_centroids\": {}, \"n_sub_vectors\": {}, \"direct_gflops\": {:.3f}, "
        "\"dot_gflops\": {:.3f}, \"code_differences\": {}}}",
        i ? "," : "", r.sub_dim, r.n_centroids, r.n, r.direct_gflops, r.dot_gflops, r.code_differences);
  }
  o += distance_rows.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return o;
}

}  // namespace vq
