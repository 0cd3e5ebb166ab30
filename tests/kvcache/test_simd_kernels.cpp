// The SIMD attention kernels on integer codes (ops/cpu/scalar_attention.h) equal decoding the
// rows to f32 and attending in double, to fp32 rounding, over geometries that exercise every
// lane path (head_dim 32..256, GQA groups 1..9, tails of tiles, several calls continuing one
// state, KIVI groups that span tiles) and the vecinfer LUT kernel with groups > 4.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include <hwy/targets.h>

#include "core/bitpack.h"
#include "core/error.h"
#include "core/fp16.h"
#include "codec/scalar_blocks.h"
#include "ops/cpu/pq_attention.h"
#include "ops/cpu/scalar_attention.h"
#include "ops/ref/pq_attention.h"
#include "test_util.h"

using namespace vq;

namespace {

// Exact attention state over decoded rows: K, V [n, D] f32; q [G, D] (already scaled).
void exact_state(const std::vector<float>& K, const std::vector<float>& V, int n, int D, int G, const float* q,
                 std::vector<float>& m, std::vector<float>& d, std::vector<float>& o) {
  m.assign(size_t(G), -INFINITY);
  d.assign(size_t(G), 0.0f);
  o.assign(size_t(G) * D, 0.0f);
  for (int g = 0; g < G; ++g) {
    std::vector<double> s(static_cast<size_t>(n));
    double mx = -INFINITY;
    for (int t = 0; t < n; ++t) {
      double acc = 0;
      for (int c = 0; c < D; ++c) acc += double(q[g * D + c]) * K[size_t(t) * D + c];
      s[size_t(t)] = acc;
      mx = std::max(mx, acc);
    }
    double den = 0;
    std::vector<double> acc(static_cast<size_t>(D), 0.0);
    for (int t = 0; t < n; ++t) {
      const double p = std::exp(s[size_t(t)] - mx);
      den += p;
      for (int c = 0; c < D; ++c) acc[size_t(c)] += p * V[size_t(t) * D + c];
    }
    m[size_t(g)] = float(mx);
    d[size_t(g)] = float(den);
    for (int c = 0; c < D; ++c) o[size_t(g) * D + c] = float(acc[size_t(c)]);
  }
}

// Normalised outputs o/d of two states agree.
void expect_same(const std::vector<float>& m, const std::vector<float>& d, const std::vector<float>& o,
                 const std::vector<float>& rm, const std::vector<float>& rd, const std::vector<float>& ro, int G, int D,
                 const std::string& what) {
  std::vector<float> a(o.size()), b(o.size());
  for (int g = 0; g < G; ++g) {
    // scores are sums of D products of O(1) terms: fp32 rounding ~1e-6 relative
    EXPECT_NEAR(m[size_t(g)], rm[size_t(g)], 1e-4 * (1 + std::fabs(rm[size_t(g)]))) << what;
    for (int c = 0; c < D; ++c) {
      a[size_t(g) * D + c] = o[size_t(g) * D + c] / d[size_t(g)];
      b[size_t(g) * D + c] = ro[size_t(g) * D + c] / rd[size_t(g)];
    }
  }
  EXPECT_LT(nmse(a, b), 1e-10) << what;
}

}  // namespace

TEST(SimdKernels, BlockQuantEqualsDecodeThenAttend) {
  std::mt19937 rng(21);
  struct Case { int D, G, n, calls; };
  for (const Case c : {Case{32, 1, 1, 1}, Case{64, 3, 200, 3}, Case{128, 4, 64, 1}, Case{64, 9, 77, 2},
                       Case{256, 2, 130, 4}, Case{96, 5, 65, 1}}) {
    for (bool q4 : {false, true}) {
      const size_t bb = q4 ? 18 : 34, rb = size_t(c.D / 32) * bb;
      std::vector<uint8_t> kr(rb * c.n), vr(rb * c.n);
      std::vector<float> K(size_t(c.n) * c.D), V(K.size());
      for (int t = 0; t < c.n; ++t)
        for (int b = 0; b < c.D / 32; ++b) {
          auto x = randn(32, rng, 1.0f + float(b));
          auto y = randn(32, rng);
          uint8_t* kb = kr.data() + t * rb + b * bb;
          uint8_t* vb = vr.data() + t * rb + b * bb;
          if (q4) { quantize_q4_0(x.data(), kb); quantize_q4_0(y.data(), vb); dequantize_q4_0(kb, &K[size_t(t) * c.D + b * 32]); dequantize_q4_0(vb, &V[size_t(t) * c.D + b * 32]); }
          else { quantize_q8_0(x.data(), kb); quantize_q8_0(y.data(), vb); dequantize_q8_0(kb, &K[size_t(t) * c.D + b * 32]); dequantize_q8_0(vb, &V[size_t(t) * c.D + b * 32]); }
        }
      auto q = randn(size_t(c.G) * c.D, rng, 0.2f);
      std::vector<float> m(size_t(c.G), -INFINITY), d(size_t(c.G), 0.0f), o(size_t(c.G) * c.D, 0.0f);
      cpu::BlockQuantAttnArgs a;
      a.group = c.G; a.head_dim = c.D; a.q4 = q4; a.q = q.data(); a.row_stride = rb;
      a.m = m.data(); a.d = d.data(); a.o = o.data();
      for (int i = 0; i < c.calls; ++i) {  // several calls continue one state
        const int t0 = c.n * i / c.calls, t1 = c.n * (i + 1) / c.calls;
        a.n_tokens = t1 - t0;
        a.k_rows = kr.data() + size_t(t0) * rb;
        a.v_rows = vr.data() + size_t(t0) * rb;
        cpu::block_quant_attention(a);
      }
      std::vector<float> rm, rd, ro;
      exact_state(K, V, c.n, c.D, c.G, q.data(), rm, rd, ro);
      expect_same(m, d, o, rm, rd, ro, c.G, c.D,
                  std::string(q4 ? "q4_0" : "q8_0") + " D" + std::to_string(c.D) + " G" + std::to_string(c.G));
    }
  }
}

TEST(SimdKernels, KiviEqualsDecodeThenAttend) {
  std::mt19937 rng(22);
  struct Case { int D, GQ, GK, bits, n, calls; };
  for (const Case c : {Case{64, 3, 32, 2, 96, 1}, Case{64, 3, 32, 4, 70, 2}, Case{128, 4, 32, 2, 64, 1},
                       Case{128, 9, 64, 4, 200, 2}, Case{32, 1, 32, 2, 33, 1}, Case{256, 2, 128, 2, 256, 1},
                       Case{48, 2, 16, 4, 40, 1}, Case{64, 5, 16, 2, 130, 1},
                       Case{36, 2, 4, 2, 20, 1} /* no lane width fits: plain C++ path */}) {
    const int D = c.D, GK = c.GK, ncg = D / GK;
    const size_t krow = packed_row_bytes(D, c.bits);
    const size_t kgb = size_t(D) * 4 + size_t(GK) * krow, vtb = size_t(ncg) * 4 + krow;
    const int n_groups = (c.n + GK - 1) / GK;
    std::vector<uint8_t> kg(kgb * n_groups), vt(vtb * c.n);
    std::vector<float> K(size_t(c.n) * D), V(K.size());
    const int levels = (1 << c.bits) - 1;
    auto f16 = [](float x) { return f16_to_f32(f32_to_f16(x)); };
    auto put = [](uint8_t* p, float x) { const uint16_t h = f32_to_f16(x); std::memcpy(p, &h, 2); };
    std::uniform_int_distribution<int> code(0, levels);
    std::vector<uint16_t> codes(static_cast<size_t>(D));
    for (int gi = 0; gi < n_groups; ++gi) {
      uint8_t* g = kg.data() + gi * kgb;
      std::vector<float> sc(static_cast<size_t>(D)), mn(static_cast<size_t>(D));
      for (int ch = 0; ch < D; ++ch) {
        sc[size_t(ch)] = f16(0.05f + 0.1f * std::fabs(randn(1, rng)[0]));
        mn[size_t(ch)] = f16(randn(1, rng)[0]);
        put(g + ch * 2, sc[size_t(ch)]);
        put(g + D * 2 + ch * 2, mn[size_t(ch)]);
      }
      for (int t = gi * GK; t < std::min(c.n, (gi + 1) * GK); ++t) {
        for (int ch = 0; ch < D; ++ch) {
          codes[size_t(ch)] = uint16_t(code(rng));
          K[size_t(t) * D + ch] = mn[size_t(ch)] + sc[size_t(ch)] * float(codes[size_t(ch)]);
        }
        pack_codes(codes.data(), D, c.bits, g + D * 4 + size_t(t - gi * GK) * krow);
      }
    }
    for (int t = 0; t < c.n; ++t) {
      uint8_t* r = vt.data() + t * vtb;
      for (int cg = 0; cg < ncg; ++cg) {
        const float s = f16(0.05f + 0.1f * std::fabs(randn(1, rng)[0])), m0 = f16(randn(1, rng)[0]);
        put(r + cg * 4, s);
        put(r + cg * 4 + 2, m0);
        for (int ch = cg * GK; ch < (cg + 1) * GK; ++ch) {
          codes[size_t(ch)] = uint16_t(code(rng));
          V[size_t(t) * D + ch] = m0 + s * float(codes[size_t(ch)]);
        }
      }
      pack_codes(codes.data(), D, c.bits, r + ncg * 4);
    }
    auto q = randn(size_t(c.GQ) * D, rng, 0.3f);
    std::vector<float> m(size_t(c.GQ), -INFINITY), d(size_t(c.GQ), 0.0f), o(size_t(c.GQ) * D, 0.0f);
    cpu::KiviAttnArgs a;
    a.group = c.GQ; a.head_dim = D; a.bits = c.bits; a.kivi_group = GK; a.q = q.data();
    a.k_group_stride = kgb; a.v_stride = vtb; a.m = m.data(); a.d = d.data(); a.o = o.data();
    for (int i = 0; i < c.calls; ++i) {  // calls start at key-group boundaries
      const int t0 = std::min(c.n, (n_groups * i / c.calls) * GK), t1 = std::min(c.n, (n_groups * (i + 1) / c.calls) * GK);
      a.n_tokens = t1 - t0;
      a.k_groups = kg.data() + size_t(t0 / GK) * kgb;
      a.v_rows = vt.data() + size_t(t0) * vtb;
      cpu::kivi_attention(a);
    }
    std::vector<float> rm, rd, ro;
    exact_state(K, V, c.n, D, c.GQ, q.data(), rm, rd, ro);
    expect_same(m, d, o, rm, rd, ro, c.GQ, D,
                "kivi" + std::to_string(c.bits) + " D" + std::to_string(D) + " G" + std::to_string(GK) + " GQ" +
                    std::to_string(c.GQ));
  }
  cpu::KiviAttnArgs bad;
  bad.bits = 3;
  EXPECT_THROW(cpu::kivi_attention(bad), Error);
}

// The vecinfer kernel on a grid of GQA groups (one and several interleaved LUT head groups of
// 4 or 8 heads: pq_lut_heads), head_dims, sub-dims, code widths (8-bit codes read in place,
// 10-bit unpacked) and shared or per-sub-space books, tokens split over calls that continue one
// state, against the reference LUT kernel, on every compiled SIMD target.
TEST(SimdKernels, VecInferGroupsAndSplitCalls) {
  EXPECT_EQ(cpu::pq_lut_heads(3), 4);
  EXPECT_EQ(cpu::pq_lut_heads(4), 4);
  EXPECT_EQ(cpu::pq_lut_heads(6), 8);
  EXPECT_EQ(cpu::pq_lut_heads(7), 8);
  EXPECT_EQ(cpu::pq_lut_heads(8), 8);
  EXPECT_EQ(cpu::pq_lut_heads(12), 4);
  EXPECT_EQ(cpu::pq_lut_heads(16), 8);
  struct Case { int G, D, ksd, kbits, vsd, vbits; bool shared; };
  const Case cases[] = {{1, 64, 4, 8, 4, 8, false},  {3, 128, 4, 8, 4, 8, false}, {5, 64, 4, 8, 4, 8, false},
                        {6, 128, 4, 8, 4, 8, false}, {6, 128, 4, 8, 8, 8, true},  {7, 64, 8, 8, 8, 8, false},
                        {8, 256, 4, 8, 4, 8, false}, {8, 128, 4, 10, 4, 12, false}, {9, 64, 4, 8, 4, 8, false},
                        {12, 128, 4, 8, 4, 8, false}, {16, 64, 4, 8, 16, 8, false}, {6, 64, 4, 8, 2, 8, false},
                        {5, 128, 4, 8, 4, 8, true},  {6, 24, 4, 8, 4, 8, false},  {13, 64, 4, 8, 4, 8, false},
                        {14, 40, 4, 8, 4, 8, false}, {6, 20, 4, 8, 4, 8, false}};
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    std::mt19937 rng(23);
    for (const Case& c : cases) {
      const int G = c.G, D = c.D, n = 300;
      const int nks = D / c.ksd, nvs = D / c.vsd, kb = c.shared ? 1 : nks, vb = c.shared ? 1 : nvs;
      auto kcb = randn((size_t(kb) << c.kbits) * c.ksd, rng), vcb = randn((size_t(vb) << c.vbits) * c.vsd, rng);
      auto q = randn(size_t(G) * D, rng, 0.3f);
      const size_t kr = packed_row_bytes(nks, c.kbits), vr = packed_row_bytes(nvs, c.vbits);
      std::vector<uint8_t> kc(size_t(n) * kr), vc(size_t(n) * vr);
      std::vector<uint16_t> codes(static_cast<size_t>(D));
      for (int t = 0; t < n; ++t) {
        for (int j = 0; j < nks; ++j) codes[size_t(j)] = uint16_t(rng() & ((1u << c.kbits) - 1));
        pack_codes(codes.data(), nks, c.kbits, kc.data() + size_t(t) * kr);
        for (int j = 0; j < nvs; ++j) codes[size_t(j)] = uint16_t(rng() & ((1u << c.vbits) - 1));
        pack_codes(codes.data(), nvs, c.vbits, vc.data() + size_t(t) * vr);
      }
      PQAttnArgs a;
      a.group = G; a.head_dim = D; a.k_sub_dim = c.ksd; a.k_bits = c.kbits; a.k_books = kb;
      a.v_sub_dim = c.vsd; a.v_bits = c.vbits; a.v_books = vb;
      a.q = q.data(); a.k_codebook = kcb.data(); a.v_codebook = vcb.data();
      std::vector<float> m(static_cast<size_t>(G), -INFINITY), d(static_cast<size_t>(G), 0.0f), o(size_t(G) * D, 0.0f);
      const auto cbt = cpu::transpose_codebook(kcb.data(), kb, c.kbits, c.ksd);
      std::vector<float> lut(cpu::pq_lut_floats(a));
      cpu::pq_build_lut(a, cbt.data(), lut.data());
      {  // the same table built in parts of its sub-spaces (one query's build split over threads), last part first
        std::vector<float> parts(lut.size(), std::numeric_limits<float>::quiet_NaN());
        const int cut[] = {0, nks / 3, nks / 3, nks - 1, nks};  // an empty part among them
        for (int k = 3; k >= 0; --k) cpu::pq_build_lut_part(a, cbt.data(), parts.data(), cut[k], cut[k + 1]);
        EXPECT_EQ(0, std::memcmp(parts.data(), lut.data(), lut.size() * sizeof(float)))
            << hwy::TargetName(target) << " G" << G << " D" << D << ": the table built in parts differs";
        EXPECT_THROW(cpu::pq_build_lut_part(a, cbt.data(), parts.data(), 1, nks + 1), Error);
      }
      a.m = m.data(); a.d = d.data(); a.o = o.data();
      for (int t0 : {0, 100, 257}) {
        const int t1 = t0 == 0 ? 100 : (t0 == 100 ? 257 : n);
        a.n_tokens = t1 - t0;
        a.k_codes = kc.data() + size_t(t0) * kr;
        a.v_codes = vc.data() + size_t(t0) * vr;
        cpu::pq_attention_accumulate(a, lut.data());
      }
      std::vector<float> rm(static_cast<size_t>(G)), rd(static_cast<size_t>(G)), ro(size_t(G) * D);
      PQAttnArgs r = a;
      r.n_tokens = n; r.k_codes = kc.data(); r.v_codes = vc.data(); r.m = rm.data(); r.d = rd.data(); r.o = ro.data();
      ref::pq_attention(r);
      expect_same(m, d, o, rm, rd, ro, G, D,
                  std::string(hwy::TargetName(target)) + " vecinfer G" + std::to_string(G) + " D" + std::to_string(D) +
                      " k=d" + std::to_string(c.ksd) + "b" + std::to_string(c.kbits) + " v=d" + std::to_string(c.vsd) +
                      "b" + std::to_string(c.vbits) + (c.shared ? " shared" : ""));
    }
  }
  hwy::SetSupportedTargetsForTest(0);
}
