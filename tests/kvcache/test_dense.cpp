// Dense caches (fp16 / fp32) against the reference attention, and the spec parser.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "kvcache/dense_cache.h"
#include "kvcache/factory.h"
#include "ops/cpu/attention.h"
#include "ops/ref/attention.h"
#include "test_util.h"

using namespace vq;

TEST(Dense, Fp32MatchesReferenceAcrossChunkings) {
  for (int D : {64, 40, 128}) {
    KVGeometry g{6, 2, D};
    DenseCache c(g, /*fp32=*/true);
    std::mt19937 rng(1);
    const int total = 600;
    auto k = randn(size_t(total) * 2 * D, rng), v = randn(size_t(total) * 2 * D, rng);
    int pos = 0;
    for (int chunk : {1, 7, 256, 300, 35, 1}) {
      c.append(k.data() + size_t(pos) * 2 * D, v.data() + size_t(pos) * 2 * D, chunk);
      pos += chunk;
      auto q = randn(size_t(chunk) * 6 * D, rng);
      std::vector<float> out(q.size()), ref_out(q.size());
      const float scale = 1.0f / std::sqrt(float(D));
      c.attend(q.data(), chunk, scale, out.data());
      ref::attention(q.data(), chunk, k.data(), v.data(), pos, 6, 2, D, scale, ref_out.data());
      EXPECT_LT(nmse(out, ref_out), 1e-10) << "D=" << D << " pos=" << pos;
    }
    EXPECT_EQ(c.size(), total);
    EXPECT_EQ(c.bytes(), size_t(3) * 2 * 2 * DenseCache::kPageTokens * D * 4);
  }
}

TEST(Dense, Fp16WithinRoundingOfReference) {
  KVGeometry g{9, 3, 64};
  DenseCache c(g, false);
  std::mt19937 rng(2);
  const int n = 1500;
  auto k = randn(size_t(n) * 3 * 64, rng, 2.0f), v = randn(size_t(n) * 3 * 64, rng);
  c.append(k.data(), v.data(), n);
  auto q = randn(size_t(4) * 9 * 64, rng);
  std::vector<float> out(q.size()), ref_out(q.size());
  c.attend(q.data(), 4, 0.125f, out.data());
  ref::attention(q.data(), 4, k.data(), v.data(), n, 9, 3, 64, 0.125f, ref_out.data());
  // fp16 storage: relative rounding 2^-11 per element -> normalized MSE ~1e-7; 1e-5 leaves margin
  EXPECT_LT(nmse(out, ref_out), 1e-5);
  EXPECT_GT(nmse(out, ref_out), 0.0);  // it really stores fp16
  EXPECT_EQ(c.fp16_bytes(), size_t(n) * 3 * 64 * 4);
  EXPECT_NEAR(c.bits_per_element(), 16.0 * 1536.0 / 1500.0, 1e-9);  // pages of 256 tokens
}

TEST(Dense, CpuKernelMatchesRefKernel) {
  std::mt19937 rng(3);
  for (int D : {64, 128, 24}) {
    const int nq = 5, G = 4, nk = 77;
    const int ks = 80;  // keys channel-major [D][ks]
    auto q = randn(size_t(nq) * G * D, rng), k = randn(size_t(ks) * D, rng), v = randn(size_t(nk) * D, rng);
    std::vector<int64_t> vis = {0, 1, 40, 77, 200};
    std::vector<float> m1(nq * G, -INFINITY), d1(nq * G, 0), o1(size_t(nq) * G * D, 0);
    auto m2 = m1, d2 = d1, o2 = o1;
    ref::DenseAttnArgs a;
    a.n_q = nq; a.group = G; a.head_dim = D; a.q = q.data(); a.q_stride = int64_t(G) * D; a.scale = 0.3f;
    a.k32 = k.data(); a.v32 = v.data(); a.k_stride = ks; a.n_keys = nk; a.n_visible = vis.data();
    a.m = m1.data(); a.d = d1.data(); a.o = o1.data();
    ref::dense_attention(a);
    a.m = m2.data(); a.d = d2.data(); a.o = o2.data();
    cpu::dense_attention(a);
    for (int i = 0; i < nq * G; ++i) {
      if (std::isinf(m1[i])) { EXPECT_TRUE(std::isinf(m2[i])); EXPECT_EQ(d2[i], 0.0f); continue; }
      EXPECT_NEAR(m1[i], m2[i], 1e-4);
      EXPECT_NEAR(d1[i], d2[i], 1e-4 * d1[i]);
    }
    EXPECT_LT(nmse(o2, o1), 1e-10);
  }
}

// TEMPORARY (gemma3 branch) windowed attention: query at position p sees keys [p - W + 1, p].
// Reference: exact attention of each query alone over its window's keys. Windows that start
// mid-page, span page boundaries (256 tokens), of one key, and longer than the sequence; head
// dims on every kernel path (16-lane, 8-lane, the scalar fallback for 18).
TEST(Dense, WindowedAttendMatchesReferenceOnTheWindow) {
  for (bool fp32 : {true, false}) {
    for (int D : {256, 40, 18}) {
      for (int64_t W : {1, 7, 300, 5000}) {
        KVGeometry g{4, 1, D};
        DenseCache c(g, fp32);
        std::mt19937 rng(uint32_t(D + W));
        const int total = 600;
        auto k = randn(size_t(total) * D, rng), v = randn(size_t(total) * D, rng);
        int pos = 0;
        for (int chunk : {1, 300, 257, 2, 40}) {
          c.append(k.data() + size_t(pos) * D, v.data() + size_t(pos) * D, chunk);
          pos += chunk;
          auto q = randn(size_t(chunk) * 4 * D, rng);
          std::vector<float> out(q.size()), ref_out(q.size());
          c.attend_window(q.data(), chunk, 0.1f, out.data(), W);
          for (int i = 0; i < chunk; ++i) {
            const int64_t p = pos - chunk + i, lo = std::max<int64_t>(0, p - W + 1);
            ref::attention(q.data() + size_t(i) * 4 * D, 1, k.data() + lo * D, v.data() + lo * D, p - lo + 1, 4, 1,
                           D, 0.1f, ref_out.data() + size_t(i) * 4 * D);
          }
          EXPECT_LT(nmse(out, ref_out), fp32 ? 1e-10 : 1e-5) << "fp32=" << fp32 << " D=" << D << " W=" << W
                                                               << " pos=" << pos;
        }
      }
    }
  }
  DenseCache c(KVGeometry{4, 1, 16}, true);
  std::vector<float> x(16, 1.0f), out(64);
  c.append(x.data(), x.data(), 1);
  EXPECT_THROW(c.attend_window(x.data(), 1, 1.0f, out.data(), 0), Error);
}

TEST(Dense, BadInputErrors) {
  EXPECT_THROW(DenseCache(KVGeometry{5, 2, 64}, false), Error);
  EXPECT_THROW(DenseCache(KVGeometry{4, 2, 0}, false), Error);
  DenseCache c(KVGeometry{2, 1, 16}, false);
  std::vector<float> x(64);
  c.append(x.data(), x.data(), 1);
  EXPECT_THROW(c.attend(x.data(), 2, 1.0f, x.data()), Error);  // more queries than tokens
  EXPECT_THROW(c.append(x.data(), x.data(), -1), Error);
}

TEST(Spec, ParsesEveryForm) {
  EXPECT_EQ(parse_kv_cache_spec("fp16").method, KVMethod::fp16);
  EXPECT_EQ(parse_kv_cache_spec("FP32").method, KVMethod::fp32);
  EXPECT_EQ(parse_kv_cache_spec("q8_0").method, KVMethod::q8_0);
  EXPECT_EQ(parse_kv_cache_spec("q4_0").method, KVMethod::q4_0);
  auto k2 = parse_kv_cache_spec("kivi2");
  EXPECT_EQ(k2.method, KVMethod::kivi);
  EXPECT_EQ(k2.kivi_bits, 2);
  EXPECT_EQ(parse_kv_cache_spec("kivi4,g=64").kivi_group, 64);
  auto v = parse_kv_cache_spec("vecinfer:d8b12,r=64");
  EXPECT_EQ(v.key, (PQPreset{8, 12}));
  EXPECT_EQ(v.value, (PQPreset{8, 12}));
  EXPECT_EQ(v.residual_length, 64);
  auto kv = parse_kv_cache_spec("vecinfer:k=d4b8,v=d8b8");
  EXPECT_EQ(kv.key, (PQPreset{4, 8}));
  EXPECT_EQ(kv.value, (PQPreset{8, 8}));
  EXPECT_EQ(kv.name(), "vecinfer:k=d4b8,v=d8b8");
  EXPECT_EQ(parse_kv_cache_spec("vecinfer:d4b8").name(), "vecinfer:d4b8");
  EXPECT_DOUBLE_EQ(parse_kv_cache_spec("vecinfer:d8b12").nominal_bits_per_element(), 1.5);
  EXPECT_EQ(parse_kv_cache_spec("vecinfer:d4b8,gran=shared").granularity, CodebookGranularity::shared);
  EXPECT_EQ(parse_kv_cache_spec("vecinfer:d4b8,gpu=forbid").use_gpu_kernels, GpuKernels::forbid);
}

static std::string error_of(const std::function<void()>& f) {
  try { f(); } catch (const Error& e) { return e.what(); }
  return "";
}

TEST(Spec, ErrorsNameTheField) {
  EXPECT_NE(error_of([] { parse_kv_cache_spec("bogus"); }).find("unknown method"), std::string::npos);
  EXPECT_NE(error_of([] { parse_kv_cache_spec("vecinfer:x4b8"); }).find("d<sub_dim>b<bits>"), std::string::npos);
  EXPECT_NE(error_of([] { parse_kv_cache_spec("kivi,b=3"); }).find("kivi_bits"), std::string::npos);
  EXPECT_NE(error_of([] { parse_kv_cache_spec("vecinfer:d4b17"); }).find("key.bits"), std::string::npos);
  EXPECT_NE(error_of([] { parse_kv_cache_spec("fp16,r=-1"); }).find("residual_length"), std::string::npos);
  EXPECT_NE(error_of([] { parse_kv_cache_spec("fp16,zz=1"); }).find("unknown option"), std::string::npos);
  KVCacheConfig c;
  c.method = KVMethod::vecinfer;
  c.key = {6, 8};
  EXPECT_NE(error_of([&] { c.validate(64); }).find("key.sub_dim"), std::string::npos);
  c = KVCacheConfig{};
  c.head_dim = 128;
  EXPECT_NE(error_of([&] { make_kv_cache_factory(c)(0, KVGeometry{9, 3, 64}); }).find("head_dim"), std::string::npos);
}
