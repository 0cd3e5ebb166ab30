// The machine's sequential read bandwidth from memory, the ceiling of a decode step's weight
// stream (issue 22): T threads each sum their slice of a buffer far larger than the caches with
// the widest vector loads the CPU has (AVX-512, else AVX2, else 64-bit; four independent sums: the
// loads are not a dependency chain), no software prefetch, best of several passes. Compare the weight products' GB/s (bench_decode_threads) with
// it: a product well below it is bound by its instructions or latency, not by memory.
//
//   bench_read_bandwidth [--threads 1,2] [--mib 1024] [--passes 8]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "core/int_list.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// Sums of [b, e) (64-byte aligned, a multiple of 64 bytes long) by the widest loads available.
#if defined(__x86_64__)
__attribute__((target("avx512f"))) uint64_t sum512(const uint64_t* b, const uint64_t* e) {
  __m512i s0 = _mm512_set1_epi64(0), s1 = s0, s2 = s0, s3 = s0;
  for (; b + 32 <= e; b += 32) {
    s0 = _mm512_add_epi64(s0, _mm512_load_si512(b));
    s1 = _mm512_add_epi64(s1, _mm512_load_si512(b + 8));
    s2 = _mm512_add_epi64(s2, _mm512_load_si512(b + 16));
    s3 = _mm512_add_epi64(s3, _mm512_load_si512(b + 24));
  }
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
  uint64_t s = 0;
  for (uint64_t x : lanes) s += x;
  for (; b < e; ++b) s += *b;
  return s;
}
__attribute__((target("avx2"))) uint64_t sum256(const uint64_t* b, const uint64_t* e) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  for (; b + 16 <= e; b += 16) {
    s0 = _mm256_add_epi64(s0, _mm256_load_si256(reinterpret_cast<const __m256i*>(b)));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 4)));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 8)));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
  uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; b < e; ++b) s += *b;
  return s;
}
#endif
uint64_t sum64(const uint64_t* b, const uint64_t* e) {
  uint64_t s[4] = {};
  for (; b + 4 <= e; b += 4)
    for (int k = 0; k < 4; ++k) s[k] += b[k];
  for (; b < e; ++b) s[0] += *b;
  return s[0] + s[1] + s[2] + s[3];
}

std::vector<int> parse_list(const char* s, const char* what) {
  try {
    const std::vector<int64_t> v = vq::parse_int_list(s, what, 1, 1 << 20);
    return std::vector<int>(v.begin(), v.end());
  } catch (const vq::Error& e) {
    std::fprintf(stderr, "bench_read_bandwidth: %s\n", e.what());
    std::exit(2);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> threads = {1, 2};
  size_t mib = 1024;
  int passes = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "bench_read_bandwidth: %s needs a value\n", a.c_str());
      return 2;
    }
    if (a == "--threads") threads = parse_list(argv[++i], "--threads");
    else if (a == "--mib") mib = size_t(parse_list(argv[++i], "--mib").at(0));
    else if (a == "--passes") passes = parse_list(argv[++i], "--passes").at(0);
    else {
      std::fprintf(stderr, "bench_read_bandwidth: unknown option %s\n", a.c_str());
      return 2;
    }
  }
  const size_t n = mib * (size_t(1) << 20) / sizeof(uint64_t);
  vq::AlignedBuffer<uint64_t> buf(n);  // 2 MiB-aligned and huge-page advised, as the packed weights
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  auto sum = sum64;
  const char* width = "64-bit";
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) sum = sum512, width = "AVX-512";
  else if (__builtin_cpu_supports("avx2")) sum = sum256, width = "AVX2";
#endif
  std::printf("| threads | MiB | loads | GB/s (best of %d passes) |\n|---:|---:|---|---:|\n", passes);
  for (int T : threads) {
    double best = 1e30;
    std::vector<uint64_t> sink(static_cast<size_t>(T));
    for (int r = 0; r < passes; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      std::vector<std::thread> th;
      for (int t = 0; t < T; ++t)
        th.emplace_back([&, t] {
          const size_t per = n / size_t(T) / 8 * 8;  // whole 64-byte lines per thread
          const size_t b = per * size_t(t), e = t + 1 == T ? n : b + per;
          sink[size_t(t)] = sum(buf.data() + b, buf.data() + e);
        });
      for (auto& x : th) x.join();
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    uint64_t total = 0;
    for (uint64_t x : sink) total += x;
    std::printf("| %d | %zu | %s | %.1f |\n", T, mib, width, double(n * sizeof(uint64_t)) / best / 1e9);
    if (total == 42) std::printf("\n");  // keeps the sums alive
  }
}
