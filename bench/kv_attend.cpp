// Decode-step attention time of every KV cache at SmolLM2-135M geometry (30 layers, 9 query /
// 3 KV heads, head_dim 64) on random keys/values: ms per token for all layers, and the append cost.
// usage: kv_attend [ctx=4096] [spec ...] [--calib FILE] [--threads N] [--nice N]
// --nice N: priority of the timed attends only (every thread), e.g. -10 on a shared machine.
#include <sys/resource.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "kvcache/factory.h"

using namespace vq;

// Linux nice values are per thread: set every thread of the process (the pool's workers too).
static bool set_nice_all_threads(int nice) {
  bool ok = true;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    ok &= setpriority(PRIO_PROCESS, id_t(std::atoi(e.path().filename().c_str())), nice) == 0;
  return ok;
}

int main(int argc, char** argv) {
  int ctx = 4096;
  std::vector<std::string> specs;
  std::string calib;
  int nice_timed = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--calib" && i + 1 < argc) calib = argv[++i];
    else if (a == "--threads" && i + 1 < argc) set_num_threads(std::atoi(argv[++i]));
    else if (a == "--nice" && i + 1 < argc) nice_timed = std::atoi(argv[++i]);
    else if (std::isdigit(static_cast<unsigned char>(a[0]))) ctx = std::atoi(a.c_str());
    else specs.push_back(a);
  }
  if (specs.empty()) specs = {"fp16"};
  const int L = 30, H = 9, HKV = 3, D = 64;
  KVGeometry g{H, HKV, D};
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> k(size_t(512) * HKV * D), v(k.size()), q(size_t(H) * D), out(q.size());
  for (auto& spec : specs) {
    try {
      auto cfg = parse_kv_cache_spec(spec);
      auto fac = make_kv_cache_factory(cfg, calib);
      std::vector<std::unique_ptr<KVCache>> caches;
      auto t0 = std::chrono::steady_clock::now();
      for (int l = 0; l < L; ++l) {
        caches.push_back(fac(l, g));
        for (int done = 0; done < ctx; done += 512) {
          const int n = std::min(512, ctx - done);
          for (auto& x : k) x = nd(rng);
          for (auto& x : v) x = nd(rng);
          caches.back()->append(k.data(), v.data(), n);
        }
      }
      auto t1 = std::chrono::steady_clock::now();
      const int steps = 20;
      double best = 1e9;
      const int prio0 = getpriority(PRIO_PROCESS, 0);
      const bool niced = nice_timed != 0 && set_nice_all_threads(nice_timed);
      for (int s = 0; s < steps; ++s) {
        for (auto& x : q) x = nd(rng);
        auto a = std::chrono::steady_clock::now();
        for (int l = 0; l < L; ++l) caches[l]->attend(q.data(), 1, 0.125f, out.data());
        auto b = std::chrono::steady_clock::now();
        best = std::min(best, std::chrono::duration<double, std::milli>(b - a).count());
      }
      if (niced) set_nice_all_threads(prio0);
      size_t bytes = 0;
      for (auto& c : caches) bytes += c->bytes();
      std::printf("%-24s ctx %6d  attend %.3f ms/token (30 layers, best of %d)  fill %.2f s  KV %.1f MiB  %.2f bits/elem\n",
                  spec.c_str(), ctx, best, steps, std::chrono::duration<double>(t1 - t0).count(),
                  bytes / 1048576.0, caches[0]->bits_per_element());
    } catch (const std::exception& e) {
      std::printf("%-24s error: %s\n", spec.c_str(), e.what());
    }
  }
}
