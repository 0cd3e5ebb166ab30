// Decode attention over the device KV pool (issue 10's table): one layer of a device KVStore per
// (geometry, cache, B, S); B sequences filled to S tokens through the real append path (random
// K/V), then the paged attention launch sequence (query transform + coded split + dense split +
// merge) of B rows at position S - 1, timed with CUDA events (median of 30 after 5 warm-ups):
// ms = eager launches, one sequence between two events; graph_ms = the sequence captured in a
// CUDA graph as the decode step runs it, 4 replays between two events (as torch_peers.py times
// SDPA), per replay.
// GB/s counts the KV bytes a step must read (codes + fp16 window and sinks, or fp16 K/V).
//   bench_paged_attention [llama|falcon|all] [caches...] [--B N --S N]  (one shape: for ncu)
//   ... --prefill Q: instead, B=1 and a chunk of Q query rows at positions S..S+Q-1 (appended
//   first, as the forward does), i.e. the tensor-core prefill kernel over S past tokens + the chunk.
//   ... --sweep: issue 20's sweep instead: geometries llama-3.1-8b 32/8/128, qwen2.5-7b 28/4/128,
//   qwen2.5-1.5b 12/2/128, 70b-tp8 8/1/128, qwen2.5-0.5b 14/2/64, smollm2 9/3/64, gemma2-9b
//   16/8/256, falcon3-7b 12/4/256 (or those whose name contains the first argument); B in {1, 4,
//   16, 64}, S in {4K, 16K, 64K, 200K} while the fp16 K/V fit in 56 GB; --variants 0,1,..: every
//   listed dense-kernel variant of the fp16 rows (paged_attention_set_dense_variant), one row each.
//   ... --coded-caps 64,32,..: the coded rows once per LUT split cap (paged_attention_set_coded_split_cap).
// Peers: bench/cuda/torch_peers.py attn10 / sweep (torch SDPA fp16 and dequantize-then-SDPA, same
// shapes); bench/cuda/sweep_table.py joins the two logs into the table with the ratios.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/int_list.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/kv_store.h"
#include "kvcache/kv_store_device.h"
#include "ops/cuda/device.h"
#include "ops/cuda/kv_blocks_cuda.h"
#include "ops/cuda/paged_attention_cuda.h"
#include "ops/cuda/stream_cuda.h"

using namespace vq;

namespace {

struct Geo {
  const char* name;
  int HQ, H, D;
};

void run(const Geo& g, const std::string& kv, int B, int S, int Q, const std::vector<int>& variants,
         const std::vector<int>& caps, int reps) {
  KVCacheConfig cfg = parse_kv_cache_spec(kv);
  KVSpec spec{cfg, nullptr};
  if (cfg.method == KVMethod::vecinfer)
    spec.calibration = std::make_shared<const Calibration>(random_calibration(cfg, 1, g.H, g.D, 3));
  KVStoreOptions o;
  o.device = KVDevice::cuda;
  KVStore store(KVGeometry{g.HQ, g.H, g.D}, 1, spec, o);
  const int chunk = 8192;
  const int64_t kvd = int64_t(g.H) * g.D;
  cuda::DeviceBuffer kb(size_t(chunk) * kvd * 4), vb(size_t(chunk) * kvd * 4);
  std::vector<SeqKV> seqs;
  uint64_t seed = 1;
  const int total = S + Q;  // Q > 0: the prefill chunk's own keys are appended before its attention
  for (int b = 0; b < B; ++b) {
    seqs.push_back(store.new_sequence());
    for (int t = 0; t < total; t += chunk) {
      const int n = std::min(chunk, total - t);
      for (cuda::DeviceBuffer* x : {&kb, &vb}) {
        cuda::RandomFillParams r;
        r.type = cuda::ElemType::f32, r.out = x->data(), r.n = n * kvd, r.seed = ++seed;
        cuda::random_fill_device(r);
      }
      store.device().append_device(seqs.back(), 0, kb.as<float>(), vb.as<float>(), n);
    }
  }
  size_t kv_bytes = 0;
  for (auto& s : seqs) kv_bytes += store.token_bytes(s);
  KVStoreDevice& dev = store.device();
  const size_t qn = size_t(B) * std::max(Q, 1) * g.HQ * g.D;
  cuda::DeviceBuffer q(qn * 4), out(qn * 4);
  cuda::RandomFillParams r;
  r.type = cuda::ElemType::f32, r.out = q.data(), r.n = int64_t(qn), r.seed = 99;
  cuda::random_fill_device(r);
  void* st = dev.stream();
  auto once = [&] {
    dev.launch_attend(0, q.as<float>(), int64_t(g.HQ) * g.D, 0.088f, cuda::ElemType::f16, out.data(),
                      int64_t(g.HQ) * g.D);
  };
  // Median of `reps` timings of `per` back-to-back calls of f between two events, per call (after 5
  // warm-up calls).
  cuda::EventTimer t;
  auto median_ms = [&](auto&& f, int per) {
    for (int i = 0; i < 5; ++i) f();
    dev.synchronize();
    std::vector<float> ms;
    for (int i = 0; i < reps; ++i) {
      t.start(st);
      for (int k = 0; k < per; ++k) f();
      t.stop(st);
      ms.push_back(t.elapsed_ms() / float(per));
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  for (int variant : variants)
  for (int cap : caps) {
    cuda::paged_attention_set_dense_variant(variant);
    cuda::paged_attention_set_coded_split_cap(cap);
    dev.begin_step();  // plans (split counts, workspace) for this variant
    for (auto& s : seqs) {
      if (Q > 0) dev.add_rows(s, S, Q);
      else dev.add_rows(s, S - 1, 1);
    }
    dev.finish_step();
    dev.launch_fixup();
    const double m = median_ms(once, 1);
    // The decode step's own path: the sequence captured once in a CUDA graph and replayed, 4 replays
    // between a pair of events (as the torch peer times 4 SDPA calls), median per replay.
    double mg = 0;
    if (Q == 0) {
      cuda::Graph graph;
      graph.begin_capture(st);
      once();
      graph.end_capture(st);
      mg = median_ms([&] { graph.launch(st); }, 4);
    }
    if (Q > 0) {
      // causal FLOPs of the chunk: QK^T and PV over S + (i+1) keys for query i, every query head
      const double flops = 4.0 * g.HQ * g.D * (double(Q) * S + double(Q) * (Q + 1) / 2);
      std::printf("paged_prefill geo=%s kv=%s Q=%d S=%d ms=%.4f TFLOPs=%.1f kv_GB=%.3f\n", g.name, cfg.name().c_str(),
                  Q, S, m, flops / (m * 1e-3) / 1e12, double(kv_bytes) / 1e9);
    } else {
      std::printf("paged_attn geo=%s kv=%s B=%d S=%d variant=%d coded_cap=%d ms=%.4f graph_ms=%.4f kv_GB=%.3f GBps=%.0f "
                  "graph_GBps=%.0f\n",
                  g.name, kv.c_str(), B, S, variant, cap, m, mg, double(kv_bytes) / 1e9,
                  double(kv_bytes) / (m * 1e-3) / 1e9, double(kv_bytes) / (mg * 1e-3) / 1e9);
    }
    std::fflush(stdout);
  }
  cuda::paged_attention_set_dense_variant(-1);
  cuda::paged_attention_set_coded_split_cap(0);
  std::fflush(stdout);
}

}  // namespace

[[noreturn]] static void bad_flag(const vq::Error& e) {
  std::fprintf(stderr, "bench_paged_attention: %s\n", e.what());
  std::exit(2);
}

int main(int argc, char** argv) {
  const std::string which = argc > 1 ? argv[1] : "all";
  std::vector<std::string> caches;
  int only_b = 0, only_s = 0, prefill = 0, reps = 30;
  bool sweep = false;
  std::vector<int> variants = {-1};
  std::vector<int> caps = {0};  // --coded-caps: LUT split caps to time (0: the dispatcher's)
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    // --B / --S / --prefill take a positive count, lists numbers in lo..hi; anything else is
    // refused, not read as 0.
    auto count = [&](const char* flag) {
      try {
        return int(vq::parse_int_option(i + 1 < argc ? argv[++i] : "", flag, 1, 1 << 24));
      } catch (const vq::Error& e) {
        bad_flag(e);
      }
    };
    auto ints = [&](const char* flag, long lo, long hi) {
      try {
        const std::vector<int64_t> v = vq::parse_int_list(i + 1 < argc ? argv[++i] : "", flag, lo, hi);
        return std::vector<int>(v.begin(), v.end());
      } catch (const vq::Error& e) {
        bad_flag(e);
      }
    };
    if (a == "--B") only_b = count("--B");
    else if (a == "--S") only_s = count("--S");
    else if (a == "--prefill") prefill = count("--prefill");
    else if (a == "--reps") reps = count("--reps");
    else if (a == "--sweep") sweep = true;
    else if (a == "--variants") variants = ints("--variants", -1, 15);  // dense-kernel variants (-1: the dispatch's)
    else if (a == "--coded-caps") caps = ints("--coded-caps", 0, 1024);  // LUT split caps (0: the dispatcher's)
    else if (a.rfind("--", 0) == 0) {
      std::fprintf(stderr, "bench_paged_attention: unknown flag %s\n", a.c_str());
      return 2;
    } else {
      caches.push_back(a);
    }
  }
  if (caches.empty()) caches = {"fp16", "vecinfer:d4b8,gran=shared", "vecinfer:d4b8"};
  if (!cuda::cuda_device_available()) {
    std::printf("no CUDA device: %s\n", cuda::cuda_unavailable_reason().c_str());
    return 0;
  }
  std::printf("device %s\n", cuda::cuda_device_description().c_str());
  for (int v : variants)
    if (v >= cuda::paged_attention_dense_variants()) {
      std::fprintf(stderr, "bench_paged_attention: variant %d: there are %d\n", v, cuda::paged_attention_dense_variants());
      return 2;
    }
  const std::vector<Geo> geos =
      sweep ? std::vector<Geo>{{"llama-3.1-8b", 32, 8, 128}, {"qwen2.5-7b", 28, 4, 128}, {"qwen2.5-1.5b", 12, 2, 128},
                               {"70b-tp8", 8, 1, 128},       {"qwen2.5-0.5b", 14, 2, 64}, {"smollm2", 9, 3, 64},
                               {"gemma2-9b", 16, 8, 256},    {"falcon3-7b", 12, 4, 256}}
            : std::vector<Geo>{{"llama-3.1-8b", 32, 8, 128}, {"falcon3-7b", 12, 4, 256}};
  // --B / --S pick one batch / context, also one outside the default lists.
  const std::vector<int> Bs = only_b ? std::vector<int>{only_b}
                              : sweep ? std::vector<int>{1, 4, 16, 64}
                                      : std::vector<int>{1, 8, 32};
  const std::vector<int> Ss = only_s ? std::vector<int>{only_s}
                              : sweep ? std::vector<int>{4096, 16384, 65536, 204800}
                                      : std::vector<int>{4096, 32768, 131072};
  const double max_gb = sweep ? 56 : 40;
  for (const Geo& g : geos) {
    if (which != "all" && std::string(g.name).find(which) == std::string::npos) continue;
    for (const auto& kv : caches)
      for (int B : Bs)
        for (int S : Ss) {
          if ((only_b && B != only_b) || (only_s && S != only_s)) continue;
          if (prefill > 0 && B != 1) continue;
          const double fp16_gb = 4.0 * B * double(S) * g.H * g.D / 1e9;
          if (fp16_gb > max_gb) {  // the coded rows too: the peer (SDPA on fp16) would not fit
            std::printf("paged_attn geo=%s kv=%s B=%d S=%d skipped (%.0f GB of fp16 K/V)\n", g.name, kv.c_str(), B, S,
                        fp16_gb);
            continue;
          }
          const bool dense = kv == "fp16";
          try {
            run(g, kv, B, S, prefill, dense ? variants : std::vector<int>{-1}, dense ? std::vector<int>{0} : caps, reps);
          } catch (const std::exception& e) {
            std::printf("paged_attn geo=%s kv=%s B=%d S=%d error: %s\n", g.name, kv.c_str(), B, S, e.what());
          }
        }
  }
  return 0;
}
