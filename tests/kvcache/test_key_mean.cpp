// VecInfer's rotated key mean (codec/key_mean.h): the pre-RoPE mean recovered from rotated keys, the
// exactness of "code k - R(p_b) mu, add q . R(p_b) mu back", the cache's fast attention against its
// dequantising reference with the mean on, and the calibration file that stores it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "codec/calibration_file.h"
#include "codec/key_mean.h"
#include "core/error.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/kv_store_device.h"
#include "kvcache/pooled_cache.h"
#include "model/tensor_parallel.h"
#include "ops/ref/attention.h"
#include "test_util.h"

using namespace vq;

namespace {

// x [D] turned by RoPE to position p (pairs as codec/key_mean.h's rope_pair), written out by hand.
void rotate(float* x, int64_t p, int n_rot, bool neox, const std::vector<double>& freqs) {
  for (int i = 0; i < n_rot / 2; ++i) {
    const int a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
    const double c = std::cos(double(p) * freqs[size_t(i)]), s = std::sin(double(p) * freqs[size_t(i)]);
    const double xa = x[a], xb = x[b];
    x[a] = float(xa * c - xb * s);
    x[b] = float(xa * s + xb * c);
  }
}

std::vector<double> rope_freqs(int n_rot, double base) {
  std::vector<double> f(size_t(n_rot / 2));
  for (int i = 0; i < n_rot / 2; ++i) f[size_t(i)] = std::pow(base, -2.0 * i / n_rot);
  return f;
}

// A calibration trained on keys rotated by RoPE at positions 0..n-1 whose pre-RoPE mean is large
// on every channel (k_proj biases), carrying that mean (the model-level trainer's recipe, done here
// without a model: mean, subtract, train).
std::shared_ptr<const Calibration> calibration_with_mean(const char* spec, int H, int D, int n_rot, bool neox,
                                                         int n, std::mt19937& rng, std::vector<float>* mu_out,
                                                         float noise = 1.0f) {
  const auto freqs = rope_freqs(n_rot, 1e6);
  std::vector<float> mu = randn(size_t(H) * D, rng, 3.0f);
  auto k = randn(size_t(n) * H * D, rng, noise), v = randn(size_t(n) * H * D, rng);
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t) {
    pos[size_t(t)] = t;
    for (int h = 0; h < H; ++h) {
      float* row = k.data() + (size_t(t) * H + h) * D;
      for (int c = 0; c < D; ++c) row[c] += mu[size_t(h) * D + c];
      rotate(row, t, n_rot, neox, freqs);
    }
  }
  const auto mean = pre_rope_key_mean(k.data(), pos.data(), {}, n, H, D, n_rot, neox, freqs, 16);
  const RotatedKeyMean km(mean, freqs, H, D, n_rot, neox, 16);
  for (int t = 0; t < n; ++t)
    km.subtract(t, 1, k.data() + size_t(t) * H * D, 0, D);
  CalibTrainOptions opt;
  opt.kmeans_iters = 6;
  Calibration c = train_calibration(parse_kv_cache_spec(spec), H, D, {k.data()}, {v.data()}, n, opt, "mean");
  c.key_mean_tokens = 16;
  c.rope_neox = neox;
  c.n_rot = n_rot;
  c.layers[0].key_mean = mean;
  c.layers[0].rope_freqs = freqs;
  c.validate();
  if (mu_out) *mu_out = mu;
  return std::make_shared<const Calibration>(std::move(c));
}

}  // namespace

TEST(KeyMean, PreRopeMeanIsRecoveredOnTheSlowPairsOnly) {
  std::mt19937 rng(3);
  for (bool neox : {true, false}) {
    const int H = 2, D = 64, n_rot = 48, n = 3000;  // partial rotary: channels 48..63 not rotated
    const auto freqs = rope_freqs(n_rot, 1e4);
    const std::vector<float> mu = randn(size_t(H) * D, rng, 2.0f);
    auto k = randn(size_t(n) * H * D, rng, 0.5f);
    std::vector<int64_t> pos(static_cast<size_t>(n));
    std::vector<bool> use(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) {
      pos[size_t(t)] = (t * 7919) % 20000;
      use[size_t(t)] = t % 100 >= 4;
      for (int h = 0; h < H; ++h) {
        float* row = k.data() + (size_t(t) * H + h) * D;
        for (int c = 0; c < D; ++c) row[c] += mu[size_t(h) * D + c];
        rotate(row, pos[size_t(t)], n_rot, neox, freqs);
      }
    }
    const auto got = pre_rope_key_mean(k.data(), pos.data(), use, n, H, D, n_rot, neox, freqs, 16);
    int kept = 0;
    for (int i = 0; i < n_rot / 2; ++i) {
      int a, b;
      rope_pair(i, n_rot, neox, a, b);
      const bool slow = freqs[size_t(i)] * 16 <= kKeyMeanMaxTurn;
      kept += slow;
      for (int h = 0; h < H; ++h)
        for (int c : {a, b}) {
          const float want = slow ? mu[size_t(h) * D + c] : 0.0f;
          EXPECT_NEAR(got[size_t(h) * D + c], want, 0.05f) << "pair " << i << " neox " << neox;
        }
    }
    EXPECT_GT(kept, 4);
    EXPECT_LT(kept, n_rot / 2);  // the fastest pairs carry no mean
    for (int h = 0; h < H; ++h)
      for (int c = n_rot; c < D; ++c) EXPECT_EQ(got[size_t(h) * D + c], 0.0f);  // not rotated: no mean
  }
}

TEST(KeyMean, SubtractedMeanPlusScoreBiasIsTheExactScore) {
  std::mt19937 rng(4);
  const int H = 2, G = 3, D = 128, n_rot = 128;
  auto mu = randn(size_t(H) * D, rng, 5.0f);
  const auto freqs = rope_freqs(n_rot, 1e6);
  for (int i = 0; i < n_rot / 2; ++i)  // a stored mean is zero on the pairs it does not cover
    if (freqs[size_t(i)] * 16 > kKeyMeanMaxTurn)
      for (int h = 0; h < H; ++h) mu[size_t(h) * D + i] = mu[size_t(h) * D + i + 64] = 0;
  const RotatedKeyMean km(mu, freqs, H, D, n_rot, true, 16);
  ASSERT_FALSE(km.empty());
  const float scale = 0.088f;
  // One run of 3000 segments from a position inside a segment: the recurrence over the segments
  // must stay on the exact angles (positions up to ~50K).
  const int64_t p0 = 1237;
  const int n_seg = 3000;
  const auto q = randn(size_t(G) * D, rng);
  std::vector<float> bias(size_t(n_seg) * G);
  km.score_bias(1, q.data(), G, scale, p0, n_seg, bias.data());
  double worst = 0;
  for (int s = 0; s < n_seg; s += 37) {
    const int64_t p = (p0 / 16 + s) * 16 + (s % 16);  // a token inside segment s
    auto k = randn(size_t(D), rng);
    std::vector<float> kc(size_t(H) * D);  // both heads' rows; head 1 holds k
    std::copy(k.begin(), k.end(), kc.begin() + D);
    km.subtract(p, 1, kc.data(), 0, D);
    kc.erase(kc.begin(), kc.begin() + D);
    for (int g = 0; g < G; ++g) {
      double exact = 0, coded = 0;
      for (int e = 0; e < D; ++e) {
        exact += double(q[size_t(g) * D + e]) * k[size_t(e)];
        coded += double(q[size_t(g) * D + e]) * kc[size_t(e)];
      }
      worst = std::max(worst, std::fabs(scale * exact - (scale * coded + bias[size_t(s) * G + g])));
    }
  }
  EXPECT_LT(worst, 2e-4);  // the scores are O(10): fp32 rounding of the subtracted key
}

TEST(KeyMean, CacheAttentionEqualsItsDequantisingReference) {
  std::mt19937 rng(5);
  for (bool neox : {true, false}) {
    const int H = 2, HQ = 6, D = 64;
    auto calib = calibration_with_mean("vecinfer:d4b8", H, D, D, neox, 600, rng, nullptr);
    KVCacheConfig cfg = parse_kv_cache_spec("vecinfer:d4b8,r=40");
    cfg.calibration = calib;
    for (int n : {200, 333, 1100}) {
      PooledCache c(KVGeometry{HQ, H, D}, make_kv_spec(cfg), 0);
      auto k = randn(size_t(n) * H * D, rng, 2.0f), v = randn(size_t(n) * H * D, rng);
      for (int done = 0; done < n; done += 97) c.append(k.data() + size_t(done) * H * D, v.data() + size_t(done) * H * D,
                                                         std::min(97, n - done));
      ASSERT_GT(c.coded_tokens(), 0);
      for (int nq : {1, 4}) {
        auto q = randn(size_t(nq) * HQ * D, rng);
        std::vector<float> out(q.size()), deq(q.size());
        c.attend(q.data(), nq, 0.125f, out.data());
        c.attend_dequantized(q.data(), nq, 0.125f, deq.data());
        EXPECT_LT(nmse(out, deq), 1e-9) << "n=" << n << " nq=" << nq << " neox " << neox;
      }
    }
  }
}

TEST(KeyMean, KeysFarPastTheCalibrationPositionsKeepTheirAccuracy) {
  // Keys with a large pre-RoPE mean, calibration at positions 0..1499, attention at position
  // 20400 over all of them: with the mean removed the cache's error at the far positions stays near its error at
  // the calibration's positions; keys coded with their rotated mean do not follow it there.
  std::mt19937 rng(6);
  const int H = 1, HQ = 2, D = 64;
  std::vector<float> mu;
  const float noise = 0.3f;
  auto with = calibration_with_mean("vecinfer:d4b8", H, D, D, true, 1500, rng, &mu, noise);
  // The same kind of keys' codebooks trained without removing the mean.
  const auto freqs = rope_freqs(D, 1e6);
  auto kcal = randn(size_t(1500) * H * D, rng, noise), vcal = randn(size_t(1500) * H * D, rng);
  for (int t = 0; t < 1500; ++t) {
    for (int c = 0; c < D; ++c) kcal[size_t(t) * D + c] += mu[size_t(c)];
    rotate(kcal.data() + size_t(t) * D, t, D, true, freqs);
  }
  CalibTrainOptions opt;
  opt.kmeans_iters = 6;
  auto without = std::make_shared<const Calibration>(
      train_calibration(parse_kv_cache_spec("vecinfer:d4b8"), H, D, {kcal.data()}, {vcal.data()}, 1500, opt, "plain"));
  const int64_t far = 20000;
  const int n = 400;
  double err[2];
  for (int w = 0; w < 2; ++w) {
    KVCacheConfig cfg = parse_kv_cache_spec("vecinfer:d4b8,r=0,sink=0");
    cfg.calibration = w == 0 ? with : without;
    PooledCache c(KVGeometry{HQ, H, D}, make_kv_spec(cfg), 0);
    // positions 0..far+n: fill the early ones with keys too (the cache holds the whole sequence)
    std::mt19937 r2(9);
    auto k = randn(size_t(far + n) * D, r2, noise), v = randn(size_t(far + n) * D, r2);
    for (int64_t t = 0; t < far + n; ++t) {
      for (int cc = 0; cc < D; ++cc) k[size_t(t) * D + cc] += mu[size_t(cc)];
      rotate(k.data() + size_t(t) * D, t, D, true, freqs);
    }
    c.append(k.data(), v.data(), int(far + n));
    auto q = randn(size_t(HQ) * D, rng, 1.0f);
    std::vector<float> out(q.size()), ref_out(q.size());
    c.attend(q.data(), 1, 0.125f, out.data());
    ref::attention(q.data(), 1, k.data(), v.data(), int(far + n), HQ, H, D, 0.125f, ref_out.data());
    err[w] = nmse(out, ref_out);
  }
  std::printf("[ key mean ] attention NMSE at positions past 20000: removed %.4f, kept %.4f\n", err[0], err[1]);
  EXPECT_LT(err[0], 0.5 * err[1]);
}

TEST(KeyMean, CalibrationFileKeepsTheMeanAndRefusesBadOnes) {
  std::mt19937 rng(7);
  auto calib = calibration_with_mean("vecinfer:d4b8", 2, 64, 64, false, 400, rng, nullptr);
  const std::string path = testing::TempDir() + "test_key_mean_" + std::to_string(::getpid()) + ".vqcal";
  save_calibration(path, *calib);
  const Calibration back = load_calibration(path);
  EXPECT_EQ(back.key_mean_tokens, 16);
  EXPECT_FALSE(back.rope_neox);
  EXPECT_EQ(back.n_rot, 64);
  EXPECT_EQ(back.layers[0].key_mean, calib->layers[0].key_mean);
  EXPECT_EQ(back.layers[0].rope_freqs, calib->layers[0].rope_freqs);
  std::remove(path.c_str());
  auto expect_refused = [&](auto mutate, const char* what) {
    Calibration c = *calib;
    mutate(c);
    try {
      c.validate();
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_refused([](Calibration& c) { c.layers[0].key_mean[5] = NAN; }, "key mean[0, 5]");
  expect_refused([](Calibration& c) { c.layers[0].rope_freqs[3] = 0; }, "rope freq[3]");
  expect_refused([](Calibration& c) { c.layers[0].rope_freqs.pop_back(); }, "rope freqs");
  expect_refused([](Calibration& c) { c.n_rot = 63; }, "n_rot");
  expect_refused([](Calibration& c) { c.key_mean_tokens = 5000; }, "key_mean_tokens");
  expect_refused([](Calibration& c) { c.key_mean_tokens = 0; }, "holds a key mean");
}

TEST(KeyMean, TensorParallelRanksGetTheirHeadsMeans) {
  std::mt19937 rng(9);
  auto calib = calibration_with_mean("vecinfer:d4b8", 4, 64, 64, true, 300, rng, nullptr);
  const Calibration s = slice_calibration(*calib, 2, 2);
  EXPECT_EQ(s.key_mean_tokens, 16);
  ASSERT_EQ(s.layers[0].key_mean.size(), size_t(2 * 64));
  EXPECT_TRUE(std::equal(s.layers[0].key_mean.begin(), s.layers[0].key_mean.end(),
                         calib->layers[0].key_mean.begin() + 2 * 64));
  EXPECT_EQ(s.layers[0].rope_freqs, calib->layers[0].rope_freqs);
}

TEST(KeyMean, TheDeviceTakesItWithSixteenTokenSegments) {
#ifdef VQ_HAVE_CUDA
  std::mt19937 rng(8);
  KVCacheConfig cfg = parse_kv_cache_spec("vecinfer:d4b8");
  auto calib = calibration_with_mean("vecinfer:d4b8", 2, 64, 64, true, 300, rng, nullptr);
  cfg.calibration = calib;
  const std::string why = kv_device_unsupported_reason(make_kv_spec(cfg), KVGeometry{4, 2, 64}, 32);
  EXPECT_EQ(why.find("key mean"), std::string::npos) << why;  // "" with a GPU, else why there is none
  Calibration odd = *calib;
  odd.key_mean_tokens = 12;
  cfg.calibration = std::make_shared<const Calibration>(odd);
  const std::string why12 = kv_device_unsupported_reason(make_kv_spec(cfg), KVGeometry{4, 2, 64}, 32);
  EXPECT_NE(why12.find("segments of 12 tokens: the device kernels take 16"), std::string::npos) << why12;
#else
  GTEST_SKIP() << "no CUDA backend in this build: the device check is not compiled";
#endif
}
