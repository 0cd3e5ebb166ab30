// Dense caches (fp16 / fp32) against the reference attention, and the spec parser.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "kvcache/pooled_cache.h"
#include "kvcache/factory.h"
#include "ops/cpu/attention.h"
#include "ops/ref/attention.h"
#include "test_util.h"

using namespace vq;

namespace {
std::unique_ptr<KVCache> dense(const KVGeometry& g, bool fp32) {
  return make_kv_cache_factory(parse_kv_cache_spec(fp32 ? "fp32" : "fp16"))(0, g);
}
}  // namespace

TEST(Dense, Fp32MatchesReferenceAcrossChunkings) {
  for (int D : {64, 40, 128}) {
    KVGeometry g{6, 2, D};
    auto cp = dense(g, /*fp32=*/true);
    KVCache& c = *cp;
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
    // 600 tokens in blocks of 32: 19 blocks x 2 KV heads x (K, V) x 32 tokens x D x 4 bytes
    EXPECT_EQ(c.bytes(), size_t(19) * 2 * 2 * 32 * D * 4);
  }
}

TEST(Dense, Fp16WithinRoundingOfReference) {
  KVGeometry g{9, 3, 64};
  auto cp = dense(g, false);
  KVCache& c = *cp;
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
  EXPECT_NEAR(c.bits_per_element(), 16.0 * 1504.0 / 1500.0, 1e-9);  // blocks of 32 tokens
  EXPECT_EQ(static_cast<PooledCache&>(c).token_bytes(), size_t(n) * 3 * 64 * 4);
}

TEST(Dense, CpuKernelMatchesRefKernel) {
  // Every group size the kernel splits differently (1-4 heads per pass, then passes of 4), head
  // sizes of 1, 2, 4 and 8 vectors and a head_dim no vector width divides.
  std::mt19937 rng(3);
  for (int G : {1, 2, 3, 4, 5, 7, 8})
  for (int D : {64, 128, 256, 24}) {
    SCOPED_TRACE(testing::Message() << "G " << G << " D " << D);
    const int nq = 5, nk = 77;
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

TEST(Dense, PagedKernelsMatchContiguous) {
  // The same keys/values as one contiguous run and as blocks of 32 tokens (in scattered order):
  // ref and cpu kernels, runs starting inside a block, queries seeing different prefixes.
  std::mt19937 rng(4);
  for (bool f32 : {false, true})
    for (int D : {64, 128})
    for (int G : {1, 3, 6}) {
      SCOPED_TRACE(testing::Message() << "f32 " << f32 << " D " << D << " G " << G);
      const int nq = 4, B = 32, nblk = 5, first = 7, nk = nblk * B - first - 3;
      const size_t es = f32 ? 4 : 2, H = 2, h = 1;
      const size_t block_bytes = 2 * H * D * B * es;
      std::vector<std::vector<uint8_t>> blocks(nblk, std::vector<uint8_t>(block_bytes + 64));
      std::vector<const uint8_t*> ptrs;
      for (int b = nblk - 1; b >= 0; --b) ptrs.insert(ptrs.begin(), blocks[size_t(b)].data());
      auto k = randn(size_t(nk) * D, rng), v = randn(size_t(nk) * D, rng);
      // contiguous copy: keys [D][ks], values [nk][D]
      const int ks = (nk + 15) / 16 * 16;
      std::vector<float> kc(size_t(ks) * D), vc(size_t(nk) * D);
      std::vector<uint16_t> kc16(kc.size()), vc16(vc.size());
      for (int t = 0; t < nk; ++t) {
        const int u = first + t, b = u / B, slot = u % B;
        uint8_t* blk = blocks[size_t(b)].data();
        for (int c = 0; c < D; ++c) {
          const float kx = f32 ? k[size_t(t) * D + c] : f16_to_f32(f32_to_f16(k[size_t(t) * D + c]));
          const float vx = f32 ? v[size_t(t) * D + c] : f16_to_f32(f32_to_f16(v[size_t(t) * D + c]));
          kc[size_t(c) * ks + t] = kx;
          vc[size_t(t) * D + c] = vx;
          kc16[size_t(c) * ks + t] = f32_to_f16(kx);
          vc16[size_t(t) * D + c] = f32_to_f16(vx);
          const size_t ki = (h * D + c) * B + slot, vi = (H * D * B) + (h * B + slot) * D + c;
          if (f32) {
            reinterpret_cast<float*>(blk)[ki] = kx;
            reinterpret_cast<float*>(blk)[vi] = vx;
          } else {
            reinterpret_cast<uint16_t*>(blk)[ki] = f32_to_f16(kx);
            reinterpret_cast<uint16_t*>(blk)[vi] = f32_to_f16(vx);
          }
        }
      }
      auto q = randn(size_t(nq) * G * D, rng);
      std::vector<int64_t> vis = {1, 30, 90, nk};
      std::vector<std::vector<float>> res;
      for (int mode = 0; mode < 4; ++mode) {  // ref contiguous, ref paged, cpu contiguous, cpu paged
        std::vector<float> m(nq * G, -INFINITY), d(nq * G, 0), o(size_t(nq) * G * D, 0);
        ref::DenseAttnArgs a;
        a.n_q = nq; a.group = G; a.head_dim = D; a.q = q.data(); a.q_stride = int64_t(G) * D; a.scale = 0.2f;
        a.n_keys = nk; a.n_visible = vis.data(); a.m = m.data(); a.d = d.data(); a.o = o.data();
        if (mode % 2 == 0) {
          if (f32) { a.k32 = kc.data(); a.v32 = vc.data(); } else { a.k16 = kc16.data(); a.v16 = vc16.data(); }
          a.k_stride = ks;
        } else {
          a.blocks = ptrs.data(); a.block_tokens = B; a.first = first; a.paged_f32 = f32;
          a.k_offset = h * D * B * es; a.v_offset = (H * D * B + h * B * D) * es;
        }
        if (mode < 2) ref::dense_attention(a); else cpu::dense_attention(a);
        res.push_back(o);
      }
      for (int mode = 1; mode < 4; ++mode) EXPECT_LT(nmse(res[size_t(mode)], res[0]), 1e-10) << "mode " << mode << " D " << D;
    }
}

TEST(Dense, BadInputErrors) {
  EXPECT_THROW(dense(KVGeometry{5, 2, 64}, false), Error);
  EXPECT_THROW(dense(KVGeometry{4, 2, 0}, false), Error);
  auto cp = dense(KVGeometry{2, 1, 16}, false);
  KVCache& c = *cp;
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
  EXPECT_NE(error_of([] { parse_kv_cache_spec("kivi2,r=-1"); }).find("residual_length"), std::string::npos);
  EXPECT_NE(error_of([] { parse_kv_cache_spec("fp16,zz=1"); }).find("unknown option"), std::string::npos);
  KVCacheConfig c;
  c.method = KVMethod::vecinfer;
  c.key = {6, 8};
  EXPECT_NE(error_of([&] { c.validate(64); }).find("key.sub_dim"), std::string::npos);
  c = KVCacheConfig{};
  c.head_dim = 128;
  EXPECT_NE(error_of([&] { make_kv_cache_factory(c)(0, KVGeometry{9, 3, 64}); }).find("head_dim"), std::string::npos);
}
