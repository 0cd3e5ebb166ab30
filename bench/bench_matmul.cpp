// Weight-product benchmark: y = x @ W^T on packed weights at SmolLM2-135M shapes, 1 and 2
// threads. Prints the weight bytes streamed per second (GB/s) beside the machine's read
// bandwidth measured in the same run (a plain sum over as many bytes: the floor a matvec that
// must read every weight byte cannot beat), and the multiply-adds per second (GOP/s, 2 per
// weight and activation row; the measure that matters when M > 1). "hot": the same matrix again and again (it stays in
// cache when small); "cold": a new copy each call from a pool larger than the caches, as in a
// decode step where the whole model streams from memory.
//
//   bench_matmul [--types q4_1,q8_0] [--threads 1,2] [--M 1] [--min-ms 300]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "core/buffer.h"
#include "core/int_list.h"
#include "core/thread_pool.h"
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

vq::GGMLType parse_type(const std::string& s) {
  for (uint32_t i = 0; i < 40; ++i) {
    const auto t = static_cast<vq::GGMLType>(i);
    if (vq::ggml_type_supported(t) && vq::ggml_type_name(t) == s) return t;
  }
  std::fprintf(stderr, "unknown type %s\n", s.c_str());
  std::exit(2);
}

double cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

// Seconds per call of fn, the fastest of many short batches (at least min_ms in total).
// `wall`: elapsed time. `cpu`: the process's CPU time, the time the call takes when it is not
// preempted: the machine is shared, and under load the wall time partly measures the other
// processes (stalls on memory still count as CPU time). `best()`: cpu with one thread; wall with
// more (the CPU time of several threads says nothing about how long the call took).
struct Timing {
  double wall, cpu;
  double best() const { return vq::num_threads() == 1 ? cpu : wall; }
};
template <class F>
Timing time_it(F&& fn, double min_ms) {
  fn();
  Timing best{1e30, 1e30};
  const auto start = Clock::now();
  int reps = 1, batches = 0;
  while (true) {
    const auto t0 = Clock::now();
    const double c0 = cpu_seconds();
    for (int i = 0; i < reps; ++i) fn();
    const double c = cpu_seconds() - c0;
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    best.wall = std::min(best.wall, s / reps);
    best.cpu = std::min(best.cpu, c / reps);
    ++batches;
    if (s < 0.002) reps *= 2;
    if (std::chrono::duration<double, std::milli>(Clock::now() - start).count() > min_ms && batches >= 5) break;
  }
  return best;
}

// Reads n bytes at p with all threads (four independent 64-bit xor chains per thread): the
// peer of a matvec, which must read every weight byte at least once.
void read_bytes(const uint8_t* p, size_t n) {
  static volatile uint64_t sink = 0;
  std::vector<uint64_t> part(static_cast<size_t>(vq::num_threads()), 0);
  vq::parallel_for(
      n / 64,
      [&](size_t b, size_t e, int t) {
        uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        const uint64_t* q = reinterpret_cast<const uint64_t*>(p);
        for (size_t i = b * 8; i < e * 8; i += 8) {
          a0 ^= q[i] + q[i + 4];
          a1 ^= q[i + 1] + q[i + 5];
          a2 ^= q[i + 2] + q[i + 6];
          a3 ^= q[i + 3] + q[i + 7];
        }
        part[size_t(t)] = a0 ^ a1 ^ a2 ^ a3;
      },
      1024);
  uint64_t a = 0;
  for (auto v : part) a += v;
  sink = sink + a;
}

}  // namespace

static int run(int argc, char** argv) {
  std::vector<std::string> types = {"q4_1", "q8_0"};
  std::vector<int> threads = {1, 2};
  int64_t M = 1;
  double min_ms = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--types") types = split(v);
    else if (a == "--threads") {
      threads.clear();
      for (int64_t t : vq::parse_int_list(v, "--threads", 1, 1024)) threads.push_back(int(t));
    } else if (a == "--M") M = vq::parse_int_option(v, "--M");
    else if (a == "--min-ms") min_ms = std::stod(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  // SmolLM2-135M projections as (rows, cols): q/o, k/v, gate/up, down, tied output.
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{576, 576}, {192, 576}, {1536, 576}, {576, 1536}, {49152, 576}};
  constexpr size_t kPool = size_t(192) << 20;  // bytes of weight copies for the cold runs

  std::printf("Times per call: CPU time with 1 thread, elapsed time with more (see time_it).\n\n");
  std::printf("| type | rows x cols | M | threads | hot us | hot GB/s | cold us | cold GB/s | read GB/s | cold/read | GOP/s | cold wall us |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int nt : threads) {
    vq::set_num_threads(nt);
    vq::AlignedBuffer<uint8_t> pool(kPool);  // pool: [kPool] bytes, copies of one weight back to back
    for (const auto& tn : types) {
      const vq::GGMLType t = parse_type(tn);
      for (auto [rows, cols] : shapes) {
        const size_t rb = vq::ggml_row_bytes(t, cols), bytes = rb * size_t(rows);
        const auto w = [&] {
          std::vector<float> v(size_t(rows * cols));  // v: [rows, cols] f32
          uint64_t s = 12345;
          for (auto& x : v) s = s * 6364136223846793005ull + 1442695040888963407ull, x = float(int64_t(s >> 40) % 2001 - 1000) * 1e-3f;
          std::vector<uint8_t> q(bytes);  // q: [rows, rb] packed
          for (int64_t r = 0; r < rows; ++r) vq::quantize_row(t, v.data() + r * cols, q.data() + size_t(r) * rb, cols);
          return q;
        }();
        const size_t copies = std::max<size_t>(2, kPool / bytes);
        for (size_t c = 0; c < copies; ++c) std::memcpy(pool.data() + c * bytes, w.data(), bytes);
        size_t c = 0;
        const Timing read = time_it(
            [&] {
              read_bytes(pool.data() + c * bytes, bytes);
              c = (c + 1) % copies;
            },
            min_ms);
        const double read_gbs = double(bytes) / read.best() / 1e9;
        std::vector<float> x(size_t(M * cols)), y(size_t(M * rows));  // x: [M, cols], y: [M, rows]
        for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i * 7919 % 200) - 100) * 0.01f;
        const Timing hot = time_it([&] { vq::matmul(t, pool.data(), rows, cols, x.data(), M, y.data()); }, min_ms);
        c = 0;
        const Timing cold = time_it(
            [&] {
              vq::matmul(t, pool.data() + c * bytes, rows, cols, x.data(), M, y.data());
              c = (c + 1) % copies;
            },
            min_ms);
        std::printf("| %s | %lld x %lld | %lld | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.1f | %.1f |\n",
                    tn.c_str(), (long long)rows, (long long)cols, (long long)M, nt, hot.best() * 1e6,
                    double(bytes) / hot.best() / 1e9, cold.best() * 1e6, double(bytes) / cold.best() / 1e9,
                    read_gbs, double(bytes) / cold.best() / 1e9 / read_gbs,
                    2.0 * double(M * rows * cols) / cold.best() / 1e9, cold.wall * 1e6);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {  // a bad option (vq::Error, std::stod's) or a failed product
    std::fprintf(stderr, "bench_matmul: %s\n", e.what());
    return 2;
  }
}
