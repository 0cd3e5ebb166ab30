// veloxquant bench e2e --device cuda: batched decode speed on the GPU for a real model's
// geometry with random weights built in device memory (no multi-GB files). Per (kv cache,
// context): max(batch) sequences are filled to `ctx` tokens directly through the device KV
// store's real append path (random keys/values written on the device, encoded into blocks as a
// prefill would), so 128k-token contexts take seconds; then per batch size B, B of them are
// forked and decode steps run through the device forward (one CUDA graph per step shape). Each
// row prints the step time, tokens/s, the bytes a step must read (weights + every row's KV) and
// the byte floor at the copy bandwidth measured in the same run, or `does not fit` where the
// pool cannot hold the batch. Optional prefill rows time a B=1 prompt of each --prefill length.
//
// Why this file stays on the internals (the layering check's allow-list names it): it builds a
// device model of random weights for a geometry (no GGUF file), fills the device KV store's blocks
// directly and times single device forward steps and CUDA graph captures against the measured copy
// bandwidth, all below anything the public API offers (which runs real GGUF models through
// veloxquant::Engine / Session).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_e2e_device.h"
#include "core/atomic_file.h"
#include "core/env.h"
#include "core/error.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/kv_method.h"
#include "kvcache/kv_store_device.h"
#include "model/device_model.h"
#include "model/forward_device.h"
#include "model/model.h"
#include "model/session.h"
#include "model/tensor_parallel.h"

#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#include "ops/cuda/collective_cuda.h"
#include "ops/cuda/kv_blocks_cuda.h"
#include "ops/cuda/stream_cuda.h"
#endif

namespace vq::cli {

namespace {

struct GeometrySpec {
  const char* name;
  int n_layers, n_embd, n_heads, n_kv_heads, head_dim, n_ff, n_vocab;
  float rope_theta;
};

// Shapes of real models (their config.json): only shapes matter for speed.
const GeometrySpec kGeometries[] = {
    {"smollm2-135m", 30, 576, 9, 3, 64, 1536, 49152, 100000.0f},
    {"llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 500000.0f},
    {"falcon3-7b", 28, 3072, 12, 4, 256, 23040, 131072, 1000042.0f},
    {"qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 1000000.0f},
    {"mistral-7b", 32, 4096, 32, 8, 128, 14336, 32768, 1000000.0f},
    {"qwen2.5-1.5b", 28, 1536, 12, 2, 128, 8960, 151936, 1000000.0f},
    {"qwen2.5-0.5b", 24, 896, 14, 2, 64, 4864, 151936, 1000000.0f},
    {"llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 500000.0f},  // needs --tp over several GPUs
};

}  // namespace

std::string device_geometry_names() {
  std::string s;
  for (const auto& g : kGeometries) s += (s.empty() ? "" : ", ") + std::string(g.name);
  return s;
}

#ifndef VQ_HAVE_CUDA

void run_e2e_device(const E2EDeviceArgs&) { VQ_FAIL("bench e2e --device cuda: this build has no CUDA backend"); }

#else

namespace {

using Clock = std::chrono::steady_clock;

ModelConfig config_of(const GeometrySpec& g) {
  ModelConfig c;
  c.arch = "llama";
  c.name = g.name;
  c.n_layers = g.n_layers, c.n_embd = g.n_embd, c.n_heads = g.n_heads, c.n_kv_heads = g.n_kv_heads;
  c.head_dim = g.head_dim, c.n_ff = g.n_ff, c.n_vocab = g.n_vocab, c.n_rot = g.head_dim;
  c.rope_theta = g.rope_theta;
  c.n_ctx_train = 1 << 20;
  return c;
}

std::vector<double> plain_inv_freqs(const ModelConfig& c) {
  std::vector<double> f(size_t(c.n_rot / 2));
  for (int i = 0; i < c.n_rot / 2; ++i) f[size_t(i)] = std::pow(double(c.rope_theta), -2.0 * i / c.n_rot);
  return f;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}


// --tp N: decode steps of the split forward (TPForwardDevice) at each (kv cache, context, batch).
// Each rank holds its shard of random weights and its own device KV store; its sequences are
// filled through its store's append path like the unsplit rows. The all-reduce's share: 2 per
// layer of [B, n_embd] floats, timed alone on the ranks' streams in the same run.
void run_e2e_device_tp(const E2EDeviceArgs& a, const ModelConfig& mc) {
  VQ_CHECK(a.itl_prompt == 0 && a.prefill.empty() && !a.deterministic,
           "bench e2e --tp: decode rows only (no --itl, --prefill or --deterministic)");
  const TPPlan plan = make_tp_plan(mc, a.tp);
  const int L = mc.n_layers, D = mc.head_dim, tp = a.tp;
  std::printf("device %s; geometry %s (%d layers, %d/%d heads, head_dim %d) at tp %d: ranks %s; each rank %d/%d "
              "heads, %d MLP columns\n",
              cuda::cuda_device_description().c_str(), mc.name.c_str(), L, mc.n_heads, mc.n_kv_heads, D, tp,
              tp_placement(tp, KVDevice::cuda).c_str(), plan.ranks[0].q_heads.count, plan.ranks[0].kv_heads.count,
              plan.ranks[0].ff.count);
  auto make_comm = [&] {
    const int n = cuda::device_count();
    if (n >= tp) {
      std::vector<int> devs;
      for (int r = 0; r < tp; ++r) devs.push_back(r);
      return cuda::make_nccl_communicator(devs);
    }
    return cuda::make_local_communicator(tp, 0);
  };
  auto comm0 = make_comm();
  std::vector<int> dev_of(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) dev_of[size_t(r)] = comm0->device(r);
  comm0.reset();
  std::vector<std::shared_ptr<const DeviceModel>> models;
  for (int r = 0; r < tp; ++r) {
    cuda::DeviceScope on(dev_of[size_t(r)]);
    const ModelConfig rc = tp_rank_config(mc, plan, r);
    models.push_back(DeviceModel::random(rc, plain_inv_freqs(mc), 1 + uint64_t(r), r == 0));
  }
  const int ranks_per_device = dev_of.back() == dev_of.front() ? tp : 1;
  std::printf("| kv cache | ctx | batch | tp | step ms | tok/s | weights GB/step (all ranks) | KV GB/step (all ranks) | "
              "all-reduce ms/step (%% of step) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  nlohmann::json out = nlohmann::json::array();
  const int max_b = *std::max_element(a.batches.begin(), a.batches.end());
  const int chunk = 4096;
  uint64_t seed = 100;
  for (const std::string& kvs : a.kv_caches) {
    const KVCacheConfig c = parse_kv_cache_spec(kvs);
    for (int ctx : a.ctxs) {
      std::vector<std::unique_ptr<KVStore>> stores;
      std::vector<std::vector<SeqKV>> seqs(static_cast<size_t>(tp));
      int fitted = max_b;
      for (int r = 0; r < tp; ++r) {
        cuda::DeviceScope on(dev_of[size_t(r)]);
        const TPRankPlan& p = plan.ranks[size_t(r)];
        KVSpec spec{c, nullptr};
        if (kv_method(c.method).needs_calibration())
          spec.calibration = std::make_shared<const Calibration>(random_calibration(c, L, p.kv_heads.count, D, 5 + r));
        KVStoreOptions o;
        o.device = KVDevice::cuda;
        const size_t headroom = size_t(3) << 30, free_b = cuda::device_free_bytes();
        // ranks sharing a device share its free memory
        const size_t share = (free_b > headroom ? free_b - headroom : 0) / size_t(ranks_per_device - (r % ranks_per_device));
        o.budget_bytes = a.kv_budget_mib > 0 ? size_t(a.kv_budget_mib * 1048576.0) / size_t(tp) : share;
        stores.push_back(std::make_unique<KVStore>(KVGeometry{p.q_heads.count, p.kv_heads.count, D}, L, spec, o));
        KVStore& store = *stores.back();
        const int64_t kvd = int64_t(p.kv_heads.count) * D;
        cuda::DeviceBuffer kbuf(size_t(chunk) * kvd * 4), vbuf(size_t(chunk) * kvd * 4);
        for (int b = 0; b < fitted; ++b) {
          SeqKV s = store.new_sequence();
          try {
            for (int t = 0; t < ctx; t += chunk) {
              const int n = std::min(chunk, ctx - t);
              for (int l = 0; l < L; ++l) {
                for (cuda::DeviceBuffer* buf : {&kbuf, &vbuf}) {
                  cuda::RandomFillParams rf;
                  rf.type = cuda::ElemType::f32, rf.out = buf->data(), rf.n = int64_t(n) * kvd, rf.seed = ++seed;
                  cuda::random_fill_device(rf);
                }
                store.device().append_device(s, l, kbuf.as<float>(), vbuf.as<float>(), n);
              }
              store.trim(s);
            }
          } catch (const KVPoolExhausted&) {
            store.release(s);
            fitted = b;
            break;
          }
          seqs[size_t(r)].push_back(std::move(s));
        }
      }
      std::vector<KVStore*> sp;
      for (auto& st : stores) sp.push_back(st.get());
      TPForwardDevice fwd(models, sp, make_comm());
      for (int B : a.batches) {
        if (B > fitted) {
          std::printf("| %s | %d | %d | %d | does not fit | | | | |\n", c.name().c_str(), ctx, B, tp);
          std::fflush(stdout);
          out.push_back({{"kv_cache", c.name()}, {"ctx", ctx}, {"batch", B}, {"tp", tp}, {"fits", false}});
          continue;
        }
        std::vector<TPSequence> forks(static_cast<size_t>(B));
        size_t kv_bytes = 0;
        for (int b = 0; b < B; ++b)
          for (int r = 0; r < tp; ++r) {
            cuda::DeviceScope on(dev_of[size_t(r)]);
            forks[size_t(b)].ranks.push_back(stores[size_t(r)]->fork(seqs[size_t(r)][size_t(b)]));
            kv_bytes += stores[size_t(r)]->token_bytes(forks[size_t(b)].ranks.back());
          }
        std::vector<int32_t> tok(size_t(B), 1);
        std::vector<float> logits(size_t(B) * mc.n_vocab);
        std::vector<TPBatchEntry> entries(static_cast<size_t>(B));
        std::vector<double> dt;
        bool fits = true;
        try {
          for (int i = 0; i < a.warmup + a.steps; ++i) {
            for (int b = 0; b < B; ++b)
              entries[size_t(b)] = TPBatchEntry{&forks[size_t(b)], &tok[size_t(b)], 1, false,
                                                a.skip_logits ? nullptr : logits.data() + size_t(b) * mc.n_vocab};
            const auto t0 = Clock::now();
            fwd.step(entries.data(), B);
            if (i >= a.warmup) dt.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
            for (int b = 0; b < B; ++b) tok[size_t(b)] = int32_t((tok[size_t(b)] * 7 + 13) % mc.n_vocab);
          }
        } catch (const KVPoolExhausted& e) {
          fits = false;
          std::fprintf(stderr, "batch %d: %s\n", B, e.what());
        }
        for (int r = 0; r < tp; ++r) {
          cuda::DeviceScope on(dev_of[size_t(r)]);
          for (auto& f : forks) stores[size_t(r)]->release(f.ranks[size_t(r)]);
        }
        if (!fits) {
          std::printf("| %s | %d | %d | %d | does not fit | | | | |\n", c.name().c_str(), ctx, B, tp);
          continue;
        }
        // The all-reduce alone: 2 per layer of [B, n_embd] floats on the ranks' streams.
        double ar_ms = 0;
        {
          auto comm = make_comm();
          std::vector<cuda::DeviceBuffer> bufs;
          std::vector<std::unique_ptr<cuda::Stream>> streams;
          std::vector<float*> bp;
          std::vector<void*> sp2;
          for (int r = 0; r < tp; ++r) {
            cuda::DeviceScope on(dev_of[size_t(r)]);
            bufs.emplace_back(size_t(B) * mc.n_embd * 4);
            bufs.back().fill_bytes(0);
            streams.push_back(std::make_unique<cuda::Stream>());
            bp.push_back(bufs.back().as<float>());
            sp2.push_back(streams.back()->handle());
          }
          auto sync_all = [&] {
            for (int r = 0; r < tp; ++r) {
              cuda::DeviceScope on(dev_of[size_t(r)]);
              streams[size_t(r)]->synchronize();
            }
          };
          for (int w = 0; w < 4; ++w) comm->all_reduce_sum(bp.data(), int64_t(B) * mc.n_embd, sp2.data());
          sync_all();
          const auto t0 = Clock::now();
          const int n_ar = 2 * L;
          for (int w = 0; w < n_ar; ++w) comm->all_reduce_sum(bp.data(), int64_t(B) * mc.n_embd, sp2.data());
          sync_all();
          ar_ms = std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
        }
        const double step = median(dt);
        double wb = 0;
        for (const auto& m : models) wb += double(m->step_weight_bytes(B));
        std::printf("| %s | %d | %d | %d | %.3f | %.1f | %.2f | %.3f | %.3f (%.0f%%) |\n", c.name().c_str(), ctx, B, tp,
                    step * 1e3, B / step, wb / 1e9, double(kv_bytes) / 1e9, ar_ms, 100.0 * ar_ms / (step * 1e3));
        std::fflush(stdout);
        out.push_back({{"kv_cache", c.name()}, {"ctx", ctx}, {"batch", B}, {"tp", tp}, {"fits", true},
                       {"step_ms", step * 1e3}, {"tok_s", B / step}, {"weight_bytes", wb}, {"kv_bytes", kv_bytes},
                       {"allreduce_ms", ar_ms}, {"ranks", tp_placement(tp, KVDevice::cuda)},
                       {"geometry", mc.name}});
      }
      for (int r = 0; r < tp; ++r) {
        cuda::DeviceScope on(dev_of[size_t(r)]);
        for (auto& s : seqs[size_t(r)]) stores[size_t(r)]->release(s);
      }
    }
  }
  if (!a.json.empty()) {
    const std::string doc = out.dump(1) + "\n";
    write_file_atomic(a.json, doc.data(), doc.size());
  }
}

}  // namespace

void run_e2e_device(const E2EDeviceArgs& a) {
  VQ_CHECK(cuda::cuda_device_available(), "bench e2e --device cuda: {}", cuda::cuda_unavailable_reason());
  const GeometrySpec* gs = nullptr;
  for (const auto& g : kGeometries)
    if (a.geometry == g.name) gs = &g;
  VQ_CHECK(gs != nullptr, "--geometry: '{}' is not one of {}", a.geometry, device_geometry_names());
  VQ_CHECK(a.steps >= 2 && a.warmup >= 0, "--steps {} must be >= 2, --warmup {} >= 0", a.steps, a.warmup);
  const ModelConfig mc = config_of(*gs);
  if (a.tp > 1) {
    run_e2e_device_tp(a, mc);
    return;
  }
  const int L = mc.n_layers, H = mc.n_kv_heads, D = mc.head_dim;
  const double bw = cuda::measure_copy_bandwidth(size_t(2) << 30);  // GB/s, read + written
  const auto t_build = Clock::now();
  const auto dm = DeviceModel::random(mc, plain_inv_freqs(mc), 1);
  std::printf("device %s; geometry %s (%d layers, %d/%d heads, head_dim %d), random fp16 weights built on the device "
              "in %.2f s (%s); copy bandwidth %.0f GB/s (read + written)%s\n",
              cuda::cuda_device_description().c_str(), gs->name, L, mc.n_heads, H, D,
              std::chrono::duration<double>(Clock::now() - t_build).count(), dm->describe().c_str(), bw,
              a.deterministic ? "; deterministic mode" : "");
  std::printf("| kv cache | ctx | batch | step ms | tok/s | weights GB/step | KV GB/step | floor ms | step / floor |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  nlohmann::json out = nlohmann::json::array();
  const int max_b = *std::max_element(a.batches.begin(), a.batches.end());
  bool profiled = false;
  const int64_t kvd = int64_t(H) * D;
  const int chunk = 4096;
  cuda::DeviceBuffer kbuf(size_t(chunk) * kvd * 4), vbuf(size_t(chunk) * kvd * 4);
  uint64_t seed = 100;
  auto fill_kv = [&](int n) {
    for (cuda::DeviceBuffer* b : {&kbuf, &vbuf}) {
      cuda::RandomFillParams r;
      r.type = cuda::ElemType::f32, r.out = b->data(), r.n = int64_t(n) * kvd, r.seed = ++seed;
      cuda::random_fill_device(r);
    }
  };
  // The caches to time: each --kv-cache, and for calibrated ones without and/or with a rotated key
  // mean (--key-mean), labelled in the tables.
  VQ_CHECK(a.key_mean == "none" || a.key_mean == "rotated" || a.key_mean == "both",
           "--key-mean: '{}' is none, rotated or both", a.key_mean);
  std::vector<std::pair<std::string, KVSpec>> variants;
  for (const std::string& kvs : a.kv_caches) {
    const KVCacheConfig c = parse_kv_cache_spec(kvs);
    if (!kv_method(c.method).needs_calibration()) {
      variants.push_back({c.name(), KVSpec{c, nullptr}});
      continue;
    }
    for (int learned : {0, 1})
      for (int with : {0, 1}) {
        if ((with == 0 && a.key_mean == "rotated") || (with == 1 && a.key_mean == "none")) continue;
        if ((learned == 0 && a.key_transform == "learned") || (learned == 1 && a.key_transform == "hadamard")) continue;
        if (learned && c.granularity == CodebookGranularity::shared) continue;  // the maps need per-sub-space books
        Calibration cal = random_calibration(c, L, H, D, 5);
        if (with) add_random_key_mean(cal, plain_inv_freqs(mc), mc.n_rot, true, 16, 6);
        if (learned) add_random_key_map(cal, 7);
        variants.push_back({c.name() + (learned ? " learned" : "") + (with ? " +key mean" : ""),
                            KVSpec{c, std::make_shared<const Calibration>(std::move(cal))}});
      }
  }
  for (const auto& [label, spec] : variants) {
    for (int ctx : a.ctxs) {
      const size_t headroom = size_t(3) << 30;  // activations, cuBLAS, attention workspaces
      const size_t free_b = cuda::device_free_bytes();
      KVStoreOptions o;
      o.device = KVDevice::cuda;
      o.budget_bytes = a.kv_budget_mib > 0 ? size_t(a.kv_budget_mib * 1048576.0) : (free_b > headroom ? free_b - headroom : 0);
      KVStore store(KVGeometry{mc.n_heads, H, D}, L, spec, o);
      std::vector<SeqKV> seqs;
      int fitted = 0;
      const auto t_fill = Clock::now();
      for (int b = 0; b < max_b; ++b) {
        SeqKV s = store.new_sequence();
        bool ok = true;
        try {
          for (int t = 0; t < ctx && ok; t += chunk) {
            const int n = std::min(chunk, ctx - t);
            for (int l = 0; l < L; ++l) {
              fill_kv(n);
              store.device().append_device(s, l, kbuf.as<float>(), vbuf.as<float>(), n);
            }
            store.trim(s);
          }
        } catch (const KVPoolExhausted&) {
          ok = false;
        }
        if (!ok) break;
        seqs.push_back(std::move(s));
        fitted = b + 1;
      }
      const double fill_s = std::chrono::duration<double>(Clock::now() - t_fill).count();
      std::fprintf(stderr, "%s ctx %d: %d of %d sequences filled in %.1f s (pool %.1f GiB used of %.1f GiB)\n",
                   label.c_str(), ctx, fitted, max_b, fill_s, double(store.pool().used_bytes()) / 1073741824.0,
                   double(store.pool().budget_bytes()) / 1073741824.0);
      ForwardDevice fwd(dm, store);
      fwd.set_skip_logits_download(a.skip_logits);
      fwd.set_deterministic(a.deterministic);
      for (int B : a.batches) {
        const size_t seq_bytes = seqs.empty() ? 0 : store.token_bytes(seqs[0]);
        if (B > fitted) {
          std::printf("| %s | %d | %d | does not fit | | | %.1f | | |\n", label.c_str(), ctx, B,
                      double(seq_bytes ? seq_bytes : 0) * B / 1e9);
          std::fflush(stdout);
          out.push_back({{"kv_cache", label}, {"ctx", ctx}, {"batch", B}, {"fits", false},
                         {"geometry", gs->name}});
          continue;
        }
        std::vector<SeqKV> forks;
        for (int b = 0; b < B; ++b) forks.push_back(store.fork(seqs[size_t(b)]));
        std::vector<int32_t> tok(size_t(B), 1);
        std::vector<float> logits(size_t(B) * mc.n_vocab);
        std::vector<BatchEntry> entries(static_cast<size_t>(B));
        std::vector<double> dt;
        bool fits = true;
        size_t kv_bytes = 0;
        const std::string ps = env_or_empty("VQ_PROFILE_STEP");
        const bool profile_decode = !ps.empty() && ps.rfind("itl-", 0) != 0;
        try {
          for (int i = 0; i < a.warmup + a.steps; ++i) {
            for (int b = 0; b < B; ++b)
              entries[size_t(b)] = BatchEntry{&forks[size_t(b)], &tok[size_t(b)], 1, LogitsWanted::last,
                                              logits.data() + size_t(b) * mc.n_vocab};
            if (i == a.warmup) {
              kv_bytes = 0;
              for (int b = 0; b < B; ++b) kv_bytes += store.token_bytes(forks[size_t(b)]);
            }
            // VQ_PROFILE_STEP=1: the first timed step of the first row is the region a profiler
            // started with --profile-from-start off records (ncu: one decode step's kernels).
            const bool prof = i == a.warmup && !profiled && profile_decode;
            if (prof) cuda::profiler_range(true);
            const auto t0 = Clock::now();
            fwd.step(entries.data(), B);
            if (i >= a.warmup) dt.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
            if (prof) cuda::profiler_range(false), profiled = true;
            for (int b = 0; b < B; ++b) tok[size_t(b)] = int32_t((tok[size_t(b)] * 7 + 13) % mc.n_vocab);
          }
        } catch (const KVPoolExhausted& e) {
          fits = false;
          std::fprintf(stderr, "batch %d: %s\n", B, e.what());
        }
        forks.clear();
        if (!fits) {
          std::printf("| %s | %d | %d | does not fit | | | | | |\n", label.c_str(), ctx, B);
          out.push_back({{"kv_cache", label}, {"ctx", ctx}, {"batch", B}, {"fits", false}, {"geometry", gs->name}});
          continue;
        }
        const double step = median(dt);
        const double wb = double(dm->step_weight_bytes(B));
        const double floor_ms = (wb + double(kv_bytes)) / (bw * 1e9) * 1e3;
        std::printf("| %s | %d | %d | %.3f | %.1f | %.2f | %.3f | %.3f | %.2fx |\n", label.c_str(), ctx, B,
                    step * 1e3, B / step, wb / 1e9, double(kv_bytes) / 1e9, floor_ms, step * 1e3 / floor_ms);
        std::fflush(stdout);
        const ForwardDeviceStats& st = fwd.stats();
        out.push_back({{"kv_cache", label}, {"ctx", ctx}, {"batch", B}, {"fits", true}, {"step_ms", step * 1e3},
                       {"step_ms_best", *std::min_element(dt.begin(), dt.end()) * 1e3}, {"tok_s", B / step},
                       {"weight_bytes", wb}, {"kv_bytes", kv_bytes}, {"floor_ms", floor_ms}, {"copy_gbs", bw},
                       {"graph_replays", st.graph_replays}, {"graph_captures", st.graph_captures},
                       {"geometry", gs->name}, {"fill_s", fill_s}});
      }
      if (a.itl_prompt > 0 && fitted > 0) {
        // Inter-token latency of `fitted` running streams at this context: their decode steps
        // alone, then while a new prompt of itl_prompt tokens is prefilled beside them, C tokens
        // per step (what the engine does with max_step_tokens = B + C).
        const int B = fitted;
        std::vector<int32_t> prompt(size_t(a.itl_prompt));
        for (int i = 0; i < a.itl_prompt; ++i) prompt[size_t(i)] = int32_t((i * 7919 + 3) % mc.n_vocab);
        for (int C : a.itl_chunks) {
          std::vector<SeqKV> run;
          for (int b = 0; b < B; ++b) run.push_back(store.fork(seqs[size_t(b)]));
          std::vector<int32_t> tok(size_t(B), 1);
          std::vector<float> logits(size_t(B + 1) * mc.n_vocab);
          std::vector<BatchEntry> e(size_t(B) + 1);
          auto decode_rows = [&] {
            for (int b = 0; b < B; ++b)
              e[size_t(b)] = BatchEntry{&run[size_t(b)], &tok[size_t(b)], 1, LogitsWanted::last,
                                        logits.data() + size_t(b) * mc.n_vocab};
          };
          auto advance = [&] {
            for (int b = 0; b < B; ++b) tok[size_t(b)] = int32_t((tok[size_t(b)] * 7 + 13) % mc.n_vocab);
          };
          std::vector<double> idle, during;
          double prefill_s = 0;
          bool fits = true;
          try {
            // VQ_PROFILE_STEP=itl-idle / itl-mixed: the profiler range (ncu --profile-from-start
            // off) is the first timed idle step / the mixed step halfway through the prompt, of
            // the first chunk size.
            const std::string ps = env_or_empty("VQ_PROFILE_STEP");
            const bool prof_idle = ps == "itl-idle" && C == a.itl_chunks.front();
            const bool prof_mixed = ps == "itl-mixed" && C == a.itl_chunks.front();
            for (int i = 0; i < a.warmup + a.steps; ++i) {
              decode_rows();
              const bool prof = prof_idle && i == a.warmup;
              if (prof) cuda::profiler_range(true);
              const auto t0 = Clock::now();
              fwd.step(e.data(), B);
              if (i >= a.warmup) idle.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
              if (prof) cuda::profiler_range(false);
              advance();
            }
            SeqKV p = store.new_sequence();
            const auto tp = Clock::now();
            for (int d = 0; d < a.itl_prompt; d += C) {
              const int m = std::min(C, a.itl_prompt - d);
              decode_rows();
              e[size_t(B)] = BatchEntry{&p, prompt.data() + d, m,
                                        d + m == a.itl_prompt ? LogitsWanted::last : LogitsWanted::none,
                                        logits.data() + size_t(B) * mc.n_vocab};
              const bool prof = prof_mixed && d / C == (a.itl_prompt / C) / 2;
              if (prof) cuda::profiler_range(true);
              const auto t0 = Clock::now();
              fwd.step(e.data(), B + 1);
              during.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
              if (prof) cuda::profiler_range(false);
              advance();
            }
            prefill_s = std::chrono::duration<double>(Clock::now() - tp).count();
          } catch (const KVPoolExhausted& ex) {
            fits = false;
            std::fprintf(stderr, "itl: %s\n", ex.what());
          }
          if (!fits) {
            std::printf("| %s | itl: %d streams at %d + a %d-token prompt, %d per step | does not fit | | | | | | |\n",
                        label.c_str(), B, ctx, a.itl_prompt, C);
            continue;
          }
          auto pct = [](std::vector<double> v, double q) {
            std::sort(v.begin(), v.end());
            return v[std::min(v.size() - 1, size_t(std::ceil(q * double(v.size())) - 1))];
          };
          const double i50 = pct(idle, 0.5), i99 = pct(idle, 0.99), d50 = pct(during, 0.5), d99 = pct(during, 0.99);
          std::printf("| %s | itl: %d streams at %d + a %d-token prompt, %d per step | idle p50 %.2f ms, p99 %.2f | "
                      "during p50 %.2f ms, p99 %.2f | p99 %.2fx idle | prompt prefilled in %.2f s (%.0f tok/s) | | | |\n",
                      label.c_str(), B, ctx, a.itl_prompt, C, i50 * 1e3, i99 * 1e3, d50 * 1e3, d99 * 1e3, d99 / i99,
                      prefill_s, a.itl_prompt / prefill_s);
          std::fflush(stdout);
          out.push_back({{"kv_cache", label}, {"ctx", ctx}, {"streams", B}, {"itl_prompt", a.itl_prompt},
                         {"itl_chunk", C}, {"idle_p50_ms", i50 * 1e3}, {"idle_p99_ms", i99 * 1e3},
                         {"during_p50_ms", d50 * 1e3}, {"during_p99_ms", d99 * 1e3}, {"prefill_s", prefill_s},
                         {"geometry", gs->name}});
        }
      }
    }
    for (int n : a.prefill) {
      KVStoreOptions o;
      o.device = KVDevice::cuda;
      const size_t free_b = cuda::device_free_bytes();
      o.budget_bytes = free_b > (size_t(3) << 30) ? free_b - (size_t(3) << 30) : 0;
      KVStore store(KVGeometry{mc.n_heads, H, D}, L, spec, o);
      ForwardDevice fwd(dm, store);
      fwd.set_deterministic(a.deterministic);
      std::vector<int32_t> toks(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) toks[size_t(i)] = int32_t((i * 7919) % mc.n_vocab);
      std::vector<float> logits(size_t(mc.n_vocab));
      double best = 1e30;
      for (int rep = 0; rep < 2; ++rep) {  // the first run sizes the buffers
        SeqKV s = store.new_sequence();
        const auto t0 = Clock::now();
        for (int d = 0; d < n; d += a.prefill_chunk) {
          const int m = std::min(a.prefill_chunk, n - d);
          BatchEntry e{&s, toks.data() + d, m, d + m == n ? LogitsWanted::last : LogitsWanted::none, logits.data()};
          fwd.step(&e, 1);
        }
        best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
      }
      std::printf("| %s | prefill %d | 1 | %.1f ms | %.0f tok/s (chunks of %d) | | | | |\n", label.c_str(), n,
                  best * 1e3, n / best, a.prefill_chunk);
      std::fflush(stdout);
      out.push_back({{"kv_cache", label}, {"prefill", n}, {"prefill_ms", best * 1e3}, {"prefill_tok_s", n / best},
                     {"chunk", a.prefill_chunk}, {"geometry", gs->name}});
    }
  }
  if (!a.json.empty()) {
    const std::string doc = out.dump(1) + "\n";
    write_file_atomic(a.json, doc.data(), doc.size());
  }
}

#endif

}  // namespace vq::cli
