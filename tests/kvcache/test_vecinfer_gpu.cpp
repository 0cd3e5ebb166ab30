// use_gpu_kernels routing of the VecInfer cache: the GPU-resident cache (src/kvcache/vecinfer_gpu.*)
// against the CPU cache (use_gpu_kernels = forbid) on the same inputs. GPU cases skip without a
// usable CUDA device (CI); the switch semantics are checked everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <memory>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/pooled_cache.h"
#include "ops/ref/attention.h"
#include "kvcache/vecinfer_gpu.h"
#include "test_util.h"
#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

using namespace vq;

namespace {

bool gpu_present() {
#ifdef VQ_HAVE_CUDA
  return cuda::cuda_device_available();
#else
  return false;
#endif
}

std::shared_ptr<const Calibration> calib_for(const KVCacheConfig& cfg, int H, int D, std::mt19937& rng) {
  const int n = 1024;
  auto k = randn(size_t(n) * H * D, rng), v = randn(size_t(n) * H * D, rng);
  for (size_t i = 0; i < k.size(); ++i)
    if (i % D == 3) k[i] *= 8.0f;  // an outlier channel, as real keys have
  std::vector<const float*> kp{k.data()}, vp{v.data()};
  CalibTrainOptions opt;
  opt.kmeans_iters = 4;
  return std::make_shared<Calibration>(train_calibration(cfg, H, D, kp, vp, n, opt, "random"));
}

KVCacheConfig config(const char* spec, GpuKernels g, std::shared_ptr<const Calibration> c) {
  KVCacheConfig cfg = parse_kv_cache_spec(spec);
  cfg.use_gpu_kernels = g;
  cfg.calibration = std::move(c);
  return cfg;
}

}  // namespace

TEST(VecInferGpu, SwitchSemantics) {
  std::mt19937 rng(1);
  const int H = 2, D = 64;
  auto calib = calib_for(parse_kv_cache_spec("vecinfer:d4b8"), H, D, rng);
  const KVGeometry g{4, H, D};
  // forbid: always the CPU cache
  auto forbid = make_kv_cache_factory(config("vecinfer:d4b8,sink=0", GpuKernels::forbid, calib))(0, g);
  EXPECT_NE(dynamic_cast<PooledCache*>(forbid.get()), nullptr);
  auto autoc = make_kv_cache_factory(config("vecinfer:d4b8,sink=0", GpuKernels::auto_select, calib))(0, g);
  if (gpu_present()) {
    // auto with a GPU: the GPU-resident cache; require works too
    EXPECT_EQ(dynamic_cast<PooledCache*>(autoc.get()), nullptr);
    auto req = make_kv_cache_factory(config("vecinfer:d4b8,sink=0", GpuKernels::require, calib))(0, g);
    EXPECT_EQ(dynamic_cast<PooledCache*>(req.get()), nullptr);
    EXPECT_EQ(req->name(), forbid->name());
    // require with a shape the kernels do not take (sub_dim 16 at head_dim 64) fails, naming it
    auto c16 = calib_for(parse_kv_cache_spec("vecinfer:k=d16b8,v=d4b8"), H, D, rng);
    try {
      make_kv_cache_factory(config("vecinfer:k=d16b8,v=d4b8,sink=0", GpuKernels::require, c16))(0, g);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("sub_dim 16"), std::string::npos) << e.what();
    }
    // attention sinks (sink_tokens > 0, the default) are kept on the GPU too: auto and require route there
    auto sink_auto = make_kv_cache_factory(config("vecinfer:d4b8", GpuKernels::auto_select, calib))(0, g);
    EXPECT_EQ(dynamic_cast<PooledCache*>(sink_auto.get()), nullptr);
    auto sink_req = make_kv_cache_factory(config("vecinfer:d4b8,sink=7", GpuKernels::require, calib))(0, g);
    EXPECT_EQ(dynamic_cast<PooledCache*>(sink_req.get()), nullptr);
    // ... while auto quietly takes the CPU cache
    auto a16 = make_kv_cache_factory(config("vecinfer:k=d16b8,v=d4b8,sink=0", GpuKernels::auto_select, c16))(0, g);
    EXPECT_NE(dynamic_cast<PooledCache*>(a16.get()), nullptr);
  } else {
    // no GPU: auto is the CPU cache, require fails at construction saying why
    EXPECT_NE(dynamic_cast<PooledCache*>(autoc.get()), nullptr);
    EXPECT_THROW(make_kv_cache_factory(config("vecinfer:d4b8,sink=0", GpuKernels::require, calib)), Error);
  }
}

// Same appends and queries through both routes: decode steps (1 query), prefill chunks (several
// causal queries), window flushes, ragged append sizes, clear(); with the default fp16 sinks
// (4), other sink counts and none. The first appends (2, then 3 tokens) put query rows inside and
// across the sink boundary (rows that see only sinks, sinks + window, later sinks + codes +
// window). Differences come from fp16 queries/centroids in the GPU attention and from near-tie
// code choices of the encoder.
TEST(VecInferGpu, MatchesCpuCache) {
  if (!gpu_present()) GTEST_SKIP() << "no usable CUDA device: GPU tests run on the H200 via bench/cuda/run_all.sh";
  std::mt19937 rng(7);
  struct Case { const char* spec; int HQ, H, D; };
  const Case cases[] = {{"vecinfer:d4b8,r=40", 8, 2, 128},
                        {"vecinfer:d4b8,r=40,sink=0", 8, 2, 128},
                        {"vecinfer:k=d4b8,v=d8b8,r=64", 6, 2, 64},
                        {"vecinfer:k=d4b8,v=d8b8,r=64,sink=0", 6, 2, 64},
                        {"vecinfer:d8b8,r=32,sink=5", 4, 4, 64},
                        {"vecinfer:d8b8,r=32,sink=0", 4, 4, 64}};
  for (const Case& c : cases) {
    auto calib = calib_for(parse_kv_cache_spec(c.spec), c.H, c.D, rng);
    const KVGeometry g{c.HQ, c.H, c.D};
    auto gpu = make_kv_cache_factory(config(c.spec, GpuKernels::require, calib))(0, g);
    auto cpu = make_kv_cache_factory(config(c.spec, GpuKernels::forbid, calib))(0, g);
    ASSERT_EQ(dynamic_cast<PooledCache*>(gpu.get()), nullptr);
    auto* cpu_vi = dynamic_cast<PooledCache*>(cpu.get());
    ASSERT_NE(cpu_vi, nullptr);
    for (int round = 0; round < 2; ++round) {
      int total = 0;
      std::vector<float> keys, values;  // everything appended this round: [total, H, D]
      for (int step : {2, 3, 37, 1, 1, 5, 200, 1, 64, 3, 1}) {
        auto k = randn(size_t(step) * c.H * c.D, rng), v = randn(size_t(step) * c.H * c.D, rng);
        for (size_t i = 0; i < k.size(); ++i)
          if (i % c.D == 3) k[i] *= 8.0f;
        gpu->append(k.data(), v.data(), step);
        cpu->append(k.data(), v.data(), step);
        total += step;
        ASSERT_EQ(gpu->size(), total);
        ASSERT_EQ(cpu->size(), total);
        keys.insert(keys.end(), k.begin(), k.end());
        values.insert(values.end(), v.begin(), v.end());
        const int nq = std::min(step, 4);
        auto q = randn(size_t(nq) * c.HQ * c.D, rng, 0.5f);
        std::vector<float> og(q.size(), 1e30f), oc(q.size()), ex(q.size());
        gpu->attend(q.data(), nq, 0.125f, og.data());
        cpu->attend(q.data(), nq, 0.125f, oc.data());
        ref::attention(q.data(), nq, keys.data(), values.data(), total, c.HQ, c.H, c.D, 0.125f, ex.data());
        // The CPU store keeps whole sink blocks and a position-defined window, the GPU cache its
        // own window: both are judged against exact attention (PQ error ~0.1-0.2 on random data).
        const double eg = nmse(og, ex), ec = nmse(oc, ex);
        EXPECT_LT(eg, 1.5 * ec + 0.05) << c.spec << " round " << round << " total " << total << " nq " << nq;
      }
      EXPECT_GT(cpu_vi->coded_tokens(), 0);
      EXPECT_GT(gpu->bytes(), 0u);
      gpu->clear();
      cpu->clear();
      EXPECT_EQ(gpu->size(), 0);
    }
  }
}

// Token 0 is an attention sink: its key is aligned with the query and large (score 60 at scale 1),
// so it takes all the softmax mass and the output is its value. Kept in fp16 on the GPU the
// output equals fp16(v0) to fp32 rounding, as on the CPU; quantized (sink=0), the PQ error of k0
// and v0 shows. Byte accounting: S sink tokens of fp16 K and V, allocated at the first token.
TEST(VecInferGpu, SinkTokensAreAttendedExactly) {
  if (!gpu_present()) GTEST_SKIP() << "no usable CUDA device: GPU tests run on the H200 via bench/cuda/run_all.sh";
  std::mt19937 rng(21);
  const int H = 2, HQ = 4, D = 64, n = 100;
  auto calib = calib_for(parse_kv_cache_spec("vecinfer:d4b8"), H, D, rng);
  auto k = randn(size_t(n + 1) * H * D, rng, 0.2f), v = randn(size_t(n + 1) * H * D, rng);
  auto q = randn(size_t(HQ) * D, rng);
  for (int gq = 1; gq < HQ; ++gq)
    for (int c = 0; c < D; ++c) q[size_t(gq * D + c)] = q[size_t(c)];  // all query heads alike
  double qq = 0;
  for (int c = 0; c < D; ++c) qq += double(q[size_t(c)]) * q[size_t(c)];
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < D; ++c) k[size_t(h * D + c)] = float(q[size_t(c)] * 60.0 / qq);
  for (int S : {4, 1, 0}) {
    const std::string spec = "vecinfer:d4b8,r=0,sink=" + std::to_string(S);
    auto gpu = make_kv_cache_factory(config(spec.c_str(), GpuKernels::require, calib))(0, KVGeometry{HQ, H, D});
    ASSERT_EQ(dynamic_cast<PooledCache*>(gpu.get()), nullptr);
    if (S > 0) {
      gpu->append(k.data(), v.data(), S);
      EXPECT_EQ(gpu->bytes(), size_t(2) * S * H * D * 2) << "sinks only: fp16 K and V of S tokens";
      gpu->append(k.data() + size_t(S) * H * D, v.data() + size_t(S) * H * D, n - S);
    } else {
      gpu->append(k.data(), v.data(), n);
    }
    gpu->append(k.data() + size_t(n) * H * D, v.data() + size_t(n) * H * D, 1);  // flushes the window into codes
    ASSERT_EQ(gpu->size(), n + 1);
    std::vector<float> out(size_t(HQ) * D, 1e30f);
    gpu->attend(q.data(), 1, 1.0f, out.data());
    double err = 0, den = 0;
    for (int gq = 0; gq < HQ; ++gq) {
      const int h = gq / (HQ / H);
      for (int e = 0; e < D; ++e) {
        const double v0 = f16_to_f32(f32_to_f16(v[size_t(h * D + e)]));
        err += std::pow(double(out[size_t(gq * D + e)]) - v0, 2);
        den += v0 * v0;
      }
    }
    if (S > 0) EXPECT_LT(err / den, 1e-9) << "S=" << S;
    else EXPECT_GT(err / den, 1e-3) << "a quantized sink should show its PQ error";
  }
}
