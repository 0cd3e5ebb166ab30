// VecInfer: LUT attention on codes vs dequantise-then-attend, the cache against the dense
// reference, residual-window flushes, bytes accounting, calibration round trip.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

#include "core/bitpack.h"
#include "core/error.h"
#include "core/fp16.h"
#include "eval/calibrate.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/pooled_cache.h"
#include "ops/cpu/pq_attention.h"
#include "ops/ref/attention.h"
#include "ops/ref/pq_attention.h"
#include "test_util.h"

using namespace vq;

namespace {

struct PQCase { int D, G, ksd, kb, vsd, vb; bool per_sub; int n; };

void run_pq_case(const PQCase& c, std::mt19937& rng) {
  const int nks = c.D / c.ksd, nvs = c.D / c.vsd;
  const int kbooks = c.per_sub ? nks : 1, vbooks = c.per_sub ? nvs : 1;
  auto q = randn(size_t(c.G) * c.D, rng, 0.3f);
  auto kcb = randn(size_t(kbooks) << c.kb, rng), vcb = randn(size_t(vbooks) << c.vb, rng);
  kcb.resize((size_t(kbooks) << c.kb) * c.ksd);
  vcb.resize((size_t(vbooks) << c.vb) * c.vsd);
  for (auto& x : kcb) x = std::normal_distribution<float>(0, 1)(rng);
  for (auto& x : vcb) x = std::normal_distribution<float>(0, 1)(rng);
  const size_t kr = packed_row_bytes(nks, c.kb), vr = packed_row_bytes(nvs, c.vb);
  std::vector<uint8_t> kc(kr * c.n), vc(vr * c.n);
  std::vector<uint16_t> codes(std::max(nks, nvs));
  for (int t = 0; t < c.n; ++t) {
    for (int j = 0; j < nks; ++j) codes[j] = uint16_t(rng() & ((1u << c.kb) - 1));
    pack_codes(codes.data(), nks, c.kb, kc.data() + t * kr);
    for (int j = 0; j < nvs; ++j) codes[j] = uint16_t(rng() & ((1u << c.vb) - 1));
    pack_codes(codes.data(), nvs, c.vb, vc.data() + t * vr);
  }
  PQAttnArgs a;
  a.n_tokens = c.n; a.group = c.G; a.head_dim = c.D;
  a.k_sub_dim = c.ksd; a.k_bits = c.kb; a.k_books = kbooks;
  a.v_sub_dim = c.vsd; a.v_bits = c.vb; a.v_books = vbooks;
  a.q = q.data(); a.k_codes = kc.data(); a.k_codebook = kcb.data(); a.v_codes = vc.data(); a.v_codebook = vcb.data();
  std::vector<float> m[3], d[3], o[3];
  for (int r = 0; r < 3; ++r) {
    m[r].assign(c.G, 7.0f); d[r].assign(c.G, 7.0f); o[r].assign(size_t(c.G) * c.D, 7.0f);  // poisoned
    a.m = m[r].data(); a.d = d[r].data(); a.o = o[r].data();
    if (r == 0) ref::pq_attention_dequantized(a);
    else if (r == 1) ref::pq_attention(a);
    else cpu::pq_attention(a);
  }
  for (int r = 1; r < 3; ++r) {
    for (int g = 0; g < c.G; ++g) {
      if (c.n == 0) {
        EXPECT_TRUE(std::isinf(m[r][g]) && m[r][g] < 0);
        EXPECT_EQ(d[r][g], 0.0f);
        continue;
      }
      // scores are sums of D products of O(1) terms: fp32 rounding ~1e-6 relative
      EXPECT_NEAR(m[r][g], m[0][g], 1e-4 * (1 + std::fabs(m[0][g]))) << r;
      EXPECT_NEAR(d[r][g], d[0][g], 1e-4 * d[0][g]) << r;
    }
    // fp32 rounding of the scores enters through exp: normalized MSE ~1e-10 expected
    if (c.n > 0) EXPECT_LT(nmse(o[r], o[0]), 1e-9) << "impl " << r << " D" << c.D << " G" << c.G << " k d" << c.ksd
                                                    << "b" << c.kb << " v d" << c.vsd << "b" << c.vb;
    else for (float x : o[r]) EXPECT_EQ(x, 0.0f);
  }
}

// A calibration trained on random "activations" with per-channel outliers (as real keys have).
std::shared_ptr<const Calibration> random_calibration(const KVCacheConfig& cfg, int L, int H, int D, int n,
                                                      std::mt19937& rng, std::vector<std::vector<float>>* kv = nullptr) {
  std::vector<std::vector<float>> ks, vs;
  std::vector<const float*> kp, vp;
  for (int l = 0; l < L; ++l) {
    auto k = randn(size_t(n) * H * D, rng), v = randn(size_t(n) * H * D, rng);
    for (size_t i = 0; i < k.size(); ++i) if (i % D == 3) k[i] *= 8.0f;  // an outlier channel
    ks.push_back(std::move(k));
    vs.push_back(std::move(v));
  }
  for (int l = 0; l < L; ++l) { kp.push_back(ks[l].data()); vp.push_back(vs[l].data()); }
  CalibTrainOptions opt;
  opt.kmeans_iters = 6;
  auto c = std::make_shared<Calibration>(train_calibration(cfg, H, D, kp, vp, n, opt, "random"));
  if (kv) { kv->push_back(ks[0]); kv->push_back(vs[0]); }
  return c;
}

KVCacheConfig vi_config(const char* spec, std::shared_ptr<const Calibration> c) {
  KVCacheConfig cfg = parse_kv_cache_spec(spec);
  cfg.calibration = std::move(c);
  return cfg;
}

}  // namespace

TEST(PQAttention, LutEqualsDequantizeThenAttend) {
  std::mt19937 rng(11);
  const PQCase cases[] = {
      {64, 3, 4, 8, 4, 8, true, 200},  {64, 1, 4, 8, 4, 8, false, 65}, {128, 4, 8, 12, 8, 12, true, 130},
      {64, 8, 8, 8, 8, 8, false, 64},  {128, 2, 4, 8, 8, 8, true, 1},  {64, 3, 2, 4, 16, 6, true, 77},
      {256, 5, 8, 8, 4, 8, true, 40},  {64, 3, 4, 8, 4, 8, true, 0},
  };
  for (const auto& c : cases) run_pq_case(c, rng);
}

TEST(PQAttention, BadArgsError) {
  PQAttnArgs a;
  a.group = 1; a.head_dim = 64; a.k_sub_dim = 3; a.k_bits = 8; a.k_books = 1;
  a.v_sub_dim = 4; a.v_bits = 8; a.v_books = 1;
  float x[64];
  a.q = a.m = a.d = a.o = x;
  EXPECT_THROW(cpu::pq_attention(a), Error);
}

TEST(VecInfer, MissingCalibrationSaysHowToMakeIt) {
  try {
    make_kv_cache_factory(parse_kv_cache_spec("vecinfer:d4b8"));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("veloxquant calibrate"), std::string::npos) << e.what();
  }
}

TEST(VecInfer, WindowAndSinksFollowPositions) {
  std::mt19937 rng(5);
  const int H = 2, HQ = 4, D = 64, R = 40, B = 32;
  auto calib = random_calibration(parse_kv_cache_spec("vecinfer:d4b8"), 1, H, D, 512, rng);
  for (int S : {0, 4}) {  // fp16 sink tokens: none, the default (one whole block)
    const std::string spec = "vecinfer:d4b8,r=40,sink=" + std::to_string(S);
    const int sink_end = S > 0 ? B : 0;
    for (int n : {0, 1, 31, 32, 33, R - 1, R, R + 1, sink_end + R + B - 1, sink_end + R + B, sink_end + R + B + 1, 700}) {
      for (int step : {1, 7, 1000}) {
        if (n > 200 && step == 1) continue;
        auto cp = make_kv_cache_factory(vi_config(spec.c_str(), calib))(0, KVGeometry{HQ, H, D});
        auto& c = static_cast<PooledCache&>(*cp);
        auto k = randn(size_t(n + 1) * H * D, rng), v = randn(size_t(n + 1) * H * D, rng);
        for (int done = 0; done < n; done += step) {
          const int m = std::min(step, n - done);
          c.append(k.data() + size_t(done) * H * D, v.data() + size_t(done) * H * D, m);
          // the last query (at done + m - 1) reads codes for whole blocks after the sinks that
          // end at least R tokens before it: exactly those blocks are coded
          const int t = done + m - 1;
          const int coded_end = std::max(sink_end, std::max(0, t + 1 - R) / B * B);
          EXPECT_EQ(c.coded_tokens(), std::max(0, coded_end - sink_end)) << "n=" << n << " step " << step;
          for (int u = 0; u <= t; u += 7)
            EXPECT_EQ(c.store().reads_coded(0, t, u), u >= sink_end && u < coded_end) << u << " " << t;
        }
        EXPECT_EQ(c.size(), n);
        if (n == 0) continue;
        auto q = randn(size_t(HQ) * D, rng);
        std::vector<float> out(q.size()), deq(q.size()), ref_out(q.size());
        c.attend(q.data(), 1, 0.125f, out.data());
        c.attend_dequantized(q.data(), 1, 0.125f, deq.data());
        EXPECT_LT(nmse(out, deq), 1e-9) << "n=" << n << " step=" << step << " S=" << S;
        ref::attention(q.data(), 1, k.data(), v.data(), n, HQ, H, D, 0.125f, ref_out.data());
        if (c.coded_tokens() == 0) EXPECT_LT(nmse(out, ref_out), 1e-5) << "all fp16, n=" << n;
        // random data: PQ error (~0.18 at d4b8, see AgreesWithDenseOnStructuredData), noisier with
        // few coded tokens; broken codes give ~1 or more
        else EXPECT_LT(nmse(out, ref_out), 0.4) << "n=" << n;
        // several queries at once (prefill): each sees its causal prefix across sinks/codes/window
        const int last = n % step == 0 ? std::min(n, step) : n % step;  // tokens of the last append
        const int nq = std::min(last, 5);
        auto qs = randn(size_t(nq) * HQ * D, rng);
        std::vector<float> o5(qs.size()), d5(qs.size());
        c.attend(qs.data(), nq, 0.125f, o5.data());
        c.attend_dequantized(qs.data(), nq, 0.125f, d5.data());
        EXPECT_LT(nmse(o5, d5), 1e-9) << "n=" << n << " step=" << step << " S=" << S;
      }
    }
  }
}

TEST(PQAttention, PagedCodesEqualContiguous) {
  // cpu::pq_attention_accumulate over codes scattered in blocks of 32 (runs starting inside a
  // block, more than one 256-token softmax block, 8- and 12-bit codes) equals the contiguous call.
  std::mt19937 rng(12);
  for (int bits : {8, 12})
    for (int first : {0, 5}) {
      const int D = 64, G = 3, sd = 4, n = 600, B = 32;
      const int nks = D / sd;
      const size_t row = packed_row_bytes(nks, bits);
      PQAttnArgs a;
      a.n_tokens = n; a.group = G; a.head_dim = D;
      a.k_sub_dim = sd; a.k_bits = bits; a.k_books = 1; a.v_sub_dim = sd; a.v_bits = bits; a.v_books = 1;
      auto q = randn(size_t(G) * D, rng, 0.3f);
      auto kcb = randn((size_t(1) << bits) * sd, rng), vcb = randn((size_t(1) << bits) * sd, rng);
      std::vector<uint8_t> kc(row * n), vc(row * n);
      for (auto& x : kc) x = uint8_t(rng());
      for (auto& x : vc) x = uint8_t(rng());
      const int nblk = (first + n + B - 1) / B;
      std::vector<std::vector<uint8_t>> kb(size_t(nblk), std::vector<uint8_t>(row * B)), vb = kb;
      std::vector<const uint8_t*> kp, vp;
      for (int t = 0; t < n; ++t) {
        const int u = first + t;
        std::copy_n(kc.data() + size_t(t) * row, row, kb[size_t(u / B)].data() + size_t(u % B) * row);
        std::copy_n(vc.data() + size_t(t) * row, row, vb[size_t(u / B)].data() + size_t(u % B) * row);
      }
      for (int b = 0; b < nblk; ++b) kp.push_back(kb[size_t(b)].data()), vp.push_back(vb[size_t(b)].data());
      a.q = q.data(); a.k_codebook = kcb.data(); a.v_codebook = vcb.data();
      const auto cbt = cpu::transpose_codebook(kcb.data(), 1, bits, sd);
      std::vector<float> lut(cpu::pq_lut_floats(a));
      cpu::pq_build_lut(a, cbt.data(), lut.data());
      std::vector<float> m[2], d[2], o[2];
      for (int r = 0; r < 2; ++r) {
        m[r].assign(G, -INFINITY); d[r].assign(G, 0.0f); o[r].assign(size_t(G) * D, 0.0f);
        PQAttnArgs b = a;
        b.m = m[r].data(); b.d = d[r].data(); b.o = o[r].data();
        if (r == 0) { b.k_codes = kc.data(); b.v_codes = vc.data(); }
        else { b.k_blocks = kp.data(); b.v_blocks = vp.data(); b.block_tokens = B; b.first = first; }
        cpu::pq_attention_accumulate(b, lut.data());
      }
      EXPECT_EQ(m[0], m[1]);
      EXPECT_LT(nmse(o[1], o[0]), 1e-12) << bits << " " << first;
    }
}

TEST(VecInfer, SinkTokensAreAttendedExactly) {
  // Token 0 is an attention sink: its key is aligned with the query and large, so it takes all
  // the softmax mass (the others' weights are < e^-40) and the output is its value. With the
  // sink kept in fp16 the output equals fp16(v0) to fp32 rounding; quantized (sink=0), the PQ
  // error of k0 and v0 shows.
  std::mt19937 rng(21);
  const int H = 1, HQ = 2, D = 64, n = 100;
  auto calib = random_calibration(parse_kv_cache_spec("vecinfer:d4b8"), 1, H, D, 512, rng);
  auto k = randn(size_t(n + 1) * H * D, rng, 0.2f), v = randn(size_t(n + 1) * H * D, rng);
  auto q = randn(size_t(HQ) * D, rng);
  for (int c = 0; c < D; ++c) q[size_t(D + c)] = q[size_t(c)];  // both query heads alike
  double qq = 0;
  for (int c = 0; c < D; ++c) qq += double(q[size_t(c)]) * q[size_t(c)];
  for (int c = 0; c < D; ++c) k[size_t(c)] = float(q[size_t(c)] * 60.0 / qq);  // score 60 at scale 1
  std::vector<float> v0(static_cast<size_t>(D));
  for (int c = 0; c < D; ++c) v0[size_t(c)] = f16_to_f32(f32_to_f16(v[size_t(c)]));
  for (int S : {4, 1, 0}) {
    auto cfg = vi_config(("vecinfer:d4b8,r=0,sink=" + std::to_string(S)).c_str(), calib);
    PooledCache c(KVGeometry{HQ, H, D}, make_kv_spec(cfg), 0);
    c.append(k.data(), v.data(), n);
    c.append(k.data() + size_t(n) * D, v.data() + size_t(n) * D, 1);
    // sinks are whole blocks: S > 0 keeps tokens 0..31 in fp16; r=0 codes every other whole block
    EXPECT_EQ(c.coded_tokens(), S > 0 ? (n + 1) / 32 * 32 - 32 : (n + 1) / 32 * 32);
    std::vector<float> out(size_t(HQ) * D);
    c.attend(q.data(), 1, 1.0f, out.data());
    double err = 0, den = 0;
    for (int g = 0; g < HQ; ++g)
      for (int e = 0; e < D; ++e) {
        err += std::pow(double(out[size_t(g * D + e)]) - v0[size_t(e)], 2);
        den += double(v0[size_t(e)]) * v0[size_t(e)];
      }
    if (S > 0) EXPECT_LT(err / den, 1e-10) << "S=" << S;
    else EXPECT_GT(err / den, 1e-3) << "a quantized sink should show its PQ error";
  }
}

TEST(VecInfer, AgreesWithDenseOnStructuredData) {
  // Keys/values are i.i.d. Gaussians, the worst case for any quantizer: at 2 bits/element the
  // rate-distortion bound alone leaves 2^-4 of each K and V element's energy as error, and the
  // attention output (a weighted mean of near-independent values) is small, which amplifies the
  // relative error (measured 0.18 for d4b8, 0.41 for d8b8 at 1 bit/element). The thresholds
  // (0.3, 0.6) catch broken codes (NMSE ~1 or more); quality is judged on real activations.
  std::mt19937 rng(9);
  const int H = 3, HQ = 9, D = 64, n = 1200;
  std::vector<std::vector<float>> kv;
  const std::pair<const char*, double> specs[] = {{"vecinfer:d4b8", 0.3}, {"vecinfer:k=d4b8,v=d8b8", 0.6}};
  for (auto [spec, limit] : specs) {
    kv.clear();
    auto base = parse_kv_cache_spec(spec);
    auto calib = random_calibration(base, 1, H, D, 1024, rng, &kv);
    auto cfg = vi_config(spec, calib);
    auto cache = make_kv_cache_factory(cfg)(0, KVGeometry{HQ, H, D});
    auto k = randn(size_t(n) * H * D, rng), v = randn(size_t(n) * H * D, rng);
    for (size_t i = 0; i < k.size(); ++i) if (i % D == 3) k[i] *= 8.0f;
    for (int done = 0; done < n; done += 100) cache->append(k.data() + size_t(done) * H * D, v.data() + size_t(done) * H * D, 100);
    const int nq = 5;
    auto q = randn(size_t(nq) * HQ * D, rng, 0.5f);
    std::vector<float> out(q.size()), ref_out(q.size());
    cache->attend(q.data(), nq, 0.125f, out.data());
    ref::attention(q.data(), nq, k.data(), v.data(), n, HQ, H, D, 0.125f, ref_out.data());
    const double e = nmse(out, ref_out);
    std::printf("[ %s ] attention NMSE vs fp32 on random data: %.4f, %.3f bits/elem\n", spec, e, cache->bits_per_element());
    EXPECT_LT(e, limit) << spec;
  }
}

TEST(VecInfer, CalibrationLeavesSinksOut) {
  // Tokens 0 and 100 (the first of two sequences of 100) carry a huge key in channel 5 and a
  // huge value: with skip_tokens = 4 and segment_tokens = 100 neither moves the smoothing
  // factor or any codebook entry; with skip_tokens = 0 both do.
  std::mt19937 rng(8);
  const int H = 1, D = 64, n = 400;
  auto k = randn(size_t(n) * H * D, rng), v = randn(size_t(n) * H * D, rng);
  float rest_max = 0;
  for (int t = 0; t < n; ++t) rest_max = std::max(rest_max, std::fabs(k[size_t(t) * D + 5]));
  for (int t : {0, 100}) {
    k[size_t(t) * D + 5] = 1e4f;
    for (int c = 0; c < D; ++c) v[size_t(t) * D + c] = 1e3f;
  }
  const auto cfg = parse_kv_cache_spec("vecinfer:d8b8");
  std::vector<const float*> kp{k.data()}, vp{v.data()};
  CalibTrainOptions opt;
  opt.kmeans_iters = 3;
  opt.segment_tokens = 100;
  const Calibration with = train_calibration(cfg, H, D, kp, vp, n, opt, "t");
  EXPECT_FLOAT_EQ(with.layers[0].smoothing[5], std::sqrt(rest_max));
  auto max_abs = [](const std::vector<float>& x) {
    float m = 0;
    for (float e : x) m = std::max(m, std::fabs(e));
    return m;
  };
  EXPECT_LT(max_abs(with.layers[0].value_codebooks), 10.0f);
  opt.skip_tokens = 0;
  const Calibration without = train_calibration(cfg, H, D, kp, vp, n, opt, "t");
  EXPECT_FLOAT_EQ(without.layers[0].smoothing[5], 100.0f);
  EXPECT_GT(max_abs(without.layers[0].value_codebooks), 100.0f);
  opt.skip_tokens = 100;
  EXPECT_THROW(train_calibration(cfg, H, D, kp, vp, n, opt, "t"), Error);  // nothing left to train on
}

TEST(VecInfer, BytesAreBlockBytes) {
  std::mt19937 rng(3);
  const int H = 3, D = 64, B = 32;
  auto calib = random_calibration(parse_kv_cache_spec("vecinfer:d4b8"), 1, H, D, 512, rng);
  for (int S : {0, 4}) {
    auto cfg = vi_config("vecinfer:d4b8", calib);
    cfg.sink_tokens = S;
    PooledCache c(KVGeometry{9, H, D}, make_kv_spec(cfg), 0);
    const int n = 5000;
    auto k = randn(size_t(n) * H * D, rng);
    for (int done = 0; done < n; done += 500) c.append(k.data() + size_t(done) * H * D, k.data() + size_t(done) * H * D, 500);
    c.append(k.data(), k.data(), 1);  // releases the fp16 blocks the last chunk no longer needs
    EXPECT_EQ(c.size(), n + 1);
    // A coded block: 32 tokens x 3 heads x (16 key + 16 value bytes); an fp16 block: 32 tokens x
    // 3 heads x 64 channels x 2 (K, V) x 2 bytes. Held: the sink block, the window (R = 128 plus
    // the block being filled) and the last chunk's blocks (released at the next append).
    const size_t coded_block = size_t(B) * H * 32, dense_block = size_t(B) * H * D * 4;
    EXPECT_EQ(c.bytes(), size_t(c.coded_tokens() / B) * coded_block + size_t(c.dense_block_tokens() / B) * dense_block);
    EXPECT_EQ(c.coded_tokens(), (n + 1 - 128) / B * B - (S > 0 ? B : 0));
    // the tokens' payload: coded tokens at 2 bits/element, the rest (sinks, window) in fp16
    const int64_t dense_tokens = n + 1 - c.coded_tokens();
    EXPECT_EQ(c.token_bytes(), size_t(c.coded_tokens()) * H * 32 + size_t(dense_tokens) * H * D * 4);
    c.clear();
    EXPECT_EQ(c.bytes(), 0u);
    EXPECT_EQ(c.size(), 0);
  }
}

// Issue 18: the 2-bit split preset k=d4b10,v=d8b12 (2.5 bits for keys, 1.5 for values) stores
// exactly d4b8's bytes, attends through the CPU LUT kernels (keys of 1024-entry books, values of
// 4096-entry books: 10- and 12-bit codes packed across bytes) close to exact attention, and its
// first-use calibration keeps per-sub-space books (only 12-bit keys switch to one shared book).
TEST(VecInfer, KeyValueSplitPresetCostsD4b8sBytes) {
  std::mt19937 rng(12);
  const int H = 1, HQ = 2, D = 32, n_cal = 4200, n = 600;
  const KVCacheConfig split = parse_kv_cache_spec("vecinfer:k=d4b10,v=d8b12");
  EXPECT_EQ(split.name(), "vecinfer:k=d4b10,v=d8b12");
  EXPECT_DOUBLE_EQ(split.nominal_bits_per_element(), 2.0);
  EXPECT_EQ(first_use_calib_config(split).granularity, CodebookGranularity::per_subspace);
  EXPECT_EQ(first_use_calib_config(parse_kv_cache_spec("vecinfer:d8b12")).granularity, CodebookGranularity::shared);
  EXPECT_EQ(first_use_calib_config(parse_kv_cache_spec("vecinfer:d4b8")).granularity, CodebookGranularity::per_subspace);
  // 4200 calibration tokens fill 4096-entry per-sub-space value books; 1000 do not: a clear error.
  std::mt19937 rng_small(1);
  EXPECT_THROW(random_calibration(split, 1, H, D, 1000, rng_small), Error);
  auto k = randn(size_t(n) * H * D, rng), v = randn(size_t(n) * H * D, rng);
  for (size_t i = 0; i < k.size(); ++i) if (i % D == 3) k[i] *= 8.0f;
  auto q = randn(size_t(3) * HQ * D, rng, 0.5f);
  std::vector<float> ref_out(q.size());
  ref::attention(q.data(), 3, k.data(), v.data(), n, HQ, H, D, 0.125f, ref_out.data());
  size_t bytes[2] = {0, 0};
  const char* specs[2] = {"vecinfer:d4b8", "vecinfer:k=d4b10,v=d8b12"};
  for (int i = 0; i < 2; ++i) {
    auto calib = random_calibration(parse_kv_cache_spec(specs[i]), 1, H, D, n_cal, rng);
    PooledCache c(KVGeometry{HQ, H, D}, make_kv_spec(vi_config(specs[i], calib)), 0);
    c.append(k.data(), v.data(), n);
    ASSERT_GT(c.coded_tokens(), 400) << specs[i];
    bytes[i] = c.token_bytes();
    std::vector<float> out(q.size());
    c.attend(q.data(), 3, 0.125f, out.data());
    const double e = nmse(out, ref_out);
    std::printf("[ %s ] attention NMSE vs fp32 on random data: %.4f\n", specs[i], e);
    EXPECT_LT(e, 0.3) << specs[i];  // broken codes give ~1 or more
  }
  EXPECT_EQ(bytes[0], bytes[1]) << "the split must store exactly d4b8's bytes";
}

TEST(VecInfer, CalibrationFileRoundTrip) {
  std::mt19937 rng(4);
  auto spec = parse_kv_cache_spec("vecinfer:d8b8");
  auto calib = random_calibration(spec, 2, 2, 64, 300, rng);
  const std::string path = std::string(VQ_BINARY_DIR) + "/test_vecinfer_roundtrip.vqcal";
  save_calibration(path, *calib);
  auto from_file = make_kv_cache_factory(spec, path);
  KVCacheConfig in_mem = spec;
  in_mem.calibration = calib;
  auto from_mem = make_kv_cache_factory(in_mem);
  auto a = from_file(1, KVGeometry{4, 2, 64}), b = from_mem(1, KVGeometry{4, 2, 64});
  auto k = randn(size_t(300) * 2 * 64, rng);
  a->append(k.data(), k.data(), 300);
  b->append(k.data(), k.data(), 300);
  a->append(k.data(), k.data(), 1);
  b->append(k.data(), k.data(), 1);
  auto q = randn(size_t(4) * 64, rng);
  std::vector<float> oa(q.size()), ob(q.size());
  a->attend(q.data(), 1, 0.1f, oa.data());
  b->attend(q.data(), 1, 0.1f, ob.data());
  EXPECT_EQ(oa, ob);
  EXPECT_THROW(from_file(2, KVGeometry{4, 2, 64}), Error);  // layer beyond the calibration
  EXPECT_THROW(from_file(0, KVGeometry{4, 1, 64}), Error);  // wrong KV heads
  EXPECT_THROW(make_kv_cache_factory(parse_kv_cache_spec("vecinfer:d4b8"), path)(0, KVGeometry{4, 2, 64}), Error);
  std::remove(path.c_str());
}

TEST(GpuSwitch, RequireWithoutGpuErrorsAtConstruction) {
#ifdef VQ_HAVE_CUDA
  GTEST_SKIP() << "CUDA build: covered where no device is present";
#endif
  try {
    make_kv_cache_factory(parse_kv_cache_spec("fp16,gpu=forbid"));
    KVCacheConfig c;
    c.use_gpu_kernels = GpuKernels::require;
    make_kv_cache_factory(c);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("use_gpu_kernels: require but no CUDA device"), std::string::npos) << e.what();
  }
}
