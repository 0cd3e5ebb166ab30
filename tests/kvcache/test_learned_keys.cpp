// VecInfer with the learned key transform (codec/learned_key_map.h) through the cache: trained by
// train_calibration, coded and attended by the CPU store, refused where it cannot run.
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/learned_key_map.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "eval/calibrate.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/kv_identity.h"
#include "kvcache/kv_store_device.h"
#include "model/tensor_parallel.h"
#include "ops/ref/attention.h"
#include "test_util.h"
#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace vq {
namespace {

constexpr int kH = 2, kHQ = 6, kD = 64;

// Tokens of a structured "model": keys of rank 8 with offsets and uneven channel scales, values
// Gaussian, queries that share the keys' directions (so attention is peaked and scores matter).
struct Tokens {
  std::vector<float> k, v, q;  // k, v: [n, kH, kD]; q: [n, kHQ, kD]
};
Tokens make_tokens(int n, uint64_t seed) {
  std::mt19937 fixed(41);
  std::normal_distribution<float> nd;
  const int r = 8;
  std::vector<float> basis(size_t(kH) * kD * r), off(size_t(kH) * kD);
  for (auto& x : basis) x = nd(fixed);
  for (size_t i = 0; i < off.size(); ++i) off[i] = i % 9 == 0 ? 15.0f * nd(fixed) : 0.0f;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  Tokens t;
  t.k.resize(size_t(n) * kH * kD);
  t.v = randn(size_t(n) * kH * kD, rng);
  t.q.resize(size_t(n) * kHQ * kD);
  std::vector<float> z(r);
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < kH; ++h) {
      for (auto& x : z) x = nd(rng);
      for (int c = 0; c < kD; ++c) {
        float s = off[size_t(h) * kD + c] + 0.1f * nd(rng);
        for (int j = 0; j < r; ++j) s += basis[(size_t(h) * kD + c) * r + j] * z[size_t(j)] * (c % 4 == 0 ? 3.0f : 1.0f);
        t.k[(size_t(i) * kH + h) * kD + c] = s;
      }
    }
    for (int hq = 0; hq < kHQ; ++hq) {
      const int h = hq / (kHQ / kH);
      for (auto& x : z) x = nd(rng);
      for (int c = 0; c < kD; ++c) {
        float s = 0.3f * nd(rng);
        for (int j = 0; j < r; ++j) s += 0.4f * basis[(size_t(h) * kD + c) * r + j] * z[size_t(j)];
        t.q[(size_t(i) * kHQ + hq) * kD + c] = s;
      }
    }
  }
  return t;
}

// The trainer's inputs from the training tokens: the queries' per-channel energy (query-aware
// smoothing) or second moment (learned), per KV head.
CalibTrainOptions train_options(const Tokens& t, int n, KeyTransform kt) {
  CalibTrainOptions o;
  o.kmeans_iters = 8;
  o.key_transform = kt;
  const int G = kHQ / kH;
  std::vector<double> qe(size_t(kH) * kD, 0.0), qm(size_t(kH) * kD * kD, 0.0);
  for (int i = 0; i < n; ++i)
    for (int hq = 0; hq < kHQ; ++hq) {
      const float* q = t.q.data() + (size_t(i) * kHQ + hq) * kD;
      for (int c = 0; c < kD; ++c) qe[size_t(hq / G) * kD + c] += double(q[c]) * q[c] / (double(n) * G);
      add_second_moment(q, 1, kD, kD, qm.data() + size_t(hq / G) * kD * kD);
    }
  for (auto& x : qm) x /= double(n) * G;
  o.query_energy = {qe};
  if (kt == KeyTransform::learned) o.query_moment = {qm};
  return o;
}

std::shared_ptr<const Calibration> calibrate(const char* spec, const Tokens& t, int n, KeyTransform kt) {
  return std::make_shared<const Calibration>(train_calibration(parse_kv_cache_spec(spec), kH, kD, {t.k.data()},
                                                               {t.v.data()}, n, train_options(t, n, kt), "test"));
}

double attention_nmse(const char* spec, std::shared_ptr<const Calibration> calib, const Tokens& t, int n) {
  KVCacheConfig cfg = parse_kv_cache_spec(spec);
  cfg.calibration = std::move(calib);
  cfg.residual_length = 0;  // every token coded
  auto cache = make_kv_cache_factory(cfg)(0, KVGeometry{kHQ, kH, kD});
  cache->append(t.k.data(), t.v.data(), n);
  const int nq = 8;
  std::vector<float> out(size_t(nq) * kHQ * kD), ref(out.size());
  const float* q = t.q.data() + size_t(n - nq) * kHQ * kD;
  cache->attend(q, nq, 0.125f, out.data());
  ref::attention(q, nq, t.k.data(), t.v.data(), n, kHQ, kH, kD, 0.125f, ref.data());
  return nmse(out, ref);
}

// The whole path (training, coding keys through M, queries through M^-T, LUT attention): attention
// closer to fp32 than with the query-aware smoothing + Hadamard on structured keys. A query side
// that did not match the keys' map would give an error near 1.
TEST(LearnedKeys, CacheAttentionIsCloserToExactThanSmoothingAndHadamard) {
  const int n_train = 4096, n = 1024;
  const Tokens train = make_tokens(n_train, 1), test = make_tokens(n, 2);
  // Bounds: measured 0.113 and 0.325 (the 1-bit values' own error dominates the second), against
  // 0.332 and 0.508 for smoothing + Hadamard.
  const std::pair<const char*, double> specs[] = {{"vecinfer:d4b8", 0.2}, {"vecinfer:k=d4b8,v=d8b8", 0.45}};
  for (auto [spec, limit] : specs) {
    const double had = attention_nmse(spec, calibrate(spec, train, n_train, KeyTransform::hadamard), test, n);
    const double learned = attention_nmse(spec, calibrate(spec, train, n_train, KeyTransform::learned), test, n);
    std::printf("[ %s ] attention NMSE vs fp32: smoothing + Hadamard %.4f, learned %.4f\n", spec, had, learned);
    EXPECT_LT(learned, 0.8 * had) << spec;
    EXPECT_LT(learned, limit) << spec;
  }
}

// Batch invariance of the learned map (docs/DETERMINISM.md): a query transformed alone (a decode
// step) gets the same bits as inside a chunk of 70 tokens (a prefill, split over 2 threads), on every compiled SIMD
// target and head_dim (one not a multiple of the vector width among them); keys likewise for any
// token count; and the product is M x within float rounding (against double).
TEST(LearnedKeys, QueriesAndKeysAreMappedTheSameAloneAndInChunks) {
  const int saved_threads = num_threads();
  set_num_threads(2);
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    for (int D : {64, 80, 128, 256}) {
      std::mt19937 rng{uint32_t(D)};
      std::normal_distribution<float> nd;
      const int HQ = 6, H = 2, n = 70;  // 70 rows: the chunk is split over the threads (map_rows)
      std::vector<float> maps(size_t(H) * D * D), lambda(size_t(H) * D), q(size_t(n) * HQ * D);
      for (auto& v : maps) v = nd(rng) / std::sqrt(float(D));
      for (auto& v : lambda) v = 0.5f + std::fabs(nd(rng));
      for (auto& v : q) v = nd(rng);
      std::vector<float> chunk = q;
      transform_queries_mapped(chunk.data(), n, HQ, H, D, lambda.data(), maps.data());
      std::vector<float> keys = q, key_chunk = q;  // n tokens of HQ "heads" as keys of HQ KV heads
      std::vector<float> kmaps(size_t(HQ) * D * D), klambda(size_t(HQ) * D);
      for (int h = 0; h < HQ; ++h) {
        std::copy(maps.begin() + (h % H) * D * D, maps.begin() + (h % H + 1) * D * D, kmaps.begin() + size_t(h) * D * D);
        std::copy(lambda.begin() + (h % H) * D, lambda.begin() + (h % H + 1) * D, klambda.begin() + size_t(h) * D);
      }
      transform_keys_mapped(key_chunk.data(), n, HQ, D, klambda.data(), kmaps.data());
      double worst = 0;
      for (int t = 0; t < n; ++t) {
        std::vector<float> one(q.begin() + size_t(t) * HQ * D, q.begin() + size_t(t + 1) * HQ * D);
        transform_queries_mapped(one.data(), 1, HQ, H, D, lambda.data(), maps.data());
        ASSERT_EQ(0, std::memcmp(one.data(), chunk.data() + size_t(t) * HQ * D, one.size() * sizeof(float)))
            << hwy::TargetName(target) << " D " << D << ": query " << t << " alone differs from the chunk";
        std::vector<float> k1(q.begin() + size_t(t) * HQ * D, q.begin() + size_t(t + 1) * HQ * D);
        transform_keys_mapped(k1.data(), 1, HQ, D, klambda.data(), kmaps.data());
        ASSERT_EQ(0, std::memcmp(k1.data(), key_chunk.data() + size_t(t) * HQ * D, k1.size() * sizeof(float)))
            << hwy::TargetName(target) << " D " << D << ": key " << t << " alone differs from the chunk";
        for (int h = 0; h < HQ; ++h) {  // queries: M (lambda * q)
          const float* M = maps.data() + size_t(h / (HQ / H)) * D * D;
          const float* l = lambda.data() + size_t(h / (HQ / H)) * D;
          const float* x = q.data() + (size_t(t) * HQ + h) * D;
          for (int r = 0; r < D; ++r) {
            double e = 0, mag = 0;
            for (int c = 0; c < D; ++c) e += double(M[size_t(r) * D + c]) * l[c] * x[c], mag += std::fabs(double(M[size_t(r) * D + c]) * l[c] * x[c]);
            worst = std::max(worst, std::fabs(e - one[size_t(h) * D + r]) / (mag + 1e-30));
          }
        }
      }
      EXPECT_LT(worst, 1e-5) << hwy::TargetName(target) << " D " << D;
    }
  }
  hwy::SetSupportedTargetsForTest(0);
  set_num_threads(saved_threads);
}

TEST(LearnedKeys, TrainerRefusesSharedBooksAndMissingQueries) {
  const Tokens t = make_tokens(300, 3);
  CalibTrainOptions o = train_options(t, 300, KeyTransform::learned);
  try {
    (void)train_calibration(parse_kv_cache_spec("vecinfer:d4b6,gran=shared"), kH, kD, {t.k.data()}, {t.v.data()}, 300,
                            o, "test");
    ADD_FAILURE() << "trained shared books with the learned transform";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs per-sub-space codebooks"), std::string::npos) << e.what();
  }
  o.query_moment.clear();
  try {
    (void)train_calibration(parse_kv_cache_spec("vecinfer:d4b6"), kH, kD, {t.k.data()}, {t.v.data()}, 300, o, "test");
    ADD_FAILURE() << "trained without the queries' second moment";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("second moment of 1 layers, got 0"), std::string::npos) << e.what();
  }
}

// The maps are part of what a calibration is: its identity (session files, the prefix store) and a
// tensor-parallel rank's slice carry them.
TEST(LearnedKeys, MapsAreInTheIdentityAndTheRanksSlices) {
  const Tokens t = make_tokens(600, 4);
  auto calib = calibrate("vecinfer:d4b6", t, 600, KeyTransform::learned);
  Calibration other = *calib;
  other.layers[0].key_map[17] += 0.25f;
  EXPECT_NE(calibration_checksum(calib.get()), calibration_checksum(&other));
  const Calibration s = slice_calibration(*calib, 1, 1);
  ASSERT_TRUE(s.learned_keys());
  ASSERT_EQ(s.layers[0].key_map.size(), size_t(kD) * kD);
  EXPECT_TRUE(std::equal(s.layers[0].key_map.begin(), s.layers[0].key_map.end(),
                         calib->layers[0].key_map.begin() + kD * kD));
}

// The first use: learned for per-sub-space books (on either device), in a file of its own recipe
// tag; shared books, whose one book the learned map's uneven sub-spaces do not suit, keep the
// Walsh-Hadamard recipe's tag, so the two never share a cached file.
TEST(LearnedKeys, FirstUseRecipeFollowsTheBooks) {
  const KVCacheConfig d4b8 = first_use_calib_config(parse_kv_cache_spec("vecinfer:d4b8"));
  const KVCacheConfig d8b12 = first_use_calib_config(parse_kv_cache_spec("vecinfer:d8b12"));
  EXPECT_EQ(default_key_transform(d4b8, 8192, 128), KeyTransform::learned);
  EXPECT_EQ(default_key_transform(d8b12, 8192, 128), KeyTransform::hadamard);
  // Too few tokens per channel for the map's covariances: 16 per channel at least.
  EXPECT_EQ(default_key_transform(d4b8, 4096, 256), KeyTransform::learned);
  EXPECT_EQ(default_key_transform(d4b8, 4095, 256), KeyTransform::hadamard);
  const std::string model = std::string(VQ_SOURCE_DIR) + "/README.md";  // any file: the path hashes it
  const std::string learned = default_calibration_path(model, d4b8, 128),
                    rotated = default_calibration_path(model, d8b12, 128);
  EXPECT_NE(learned.find("vecinfer_d4b8-r7.vqcal"), std::string::npos) << learned;
  EXPECT_NE(rotated.find("vecinfer_d8b12_shared-r6.vqcal"), std::string::npos) << rotated;
  // Wider heads take more tokens (64 per key channel), and the name says so.
  EXPECT_EQ(first_use_calib_tokens(64), 8192);
  EXPECT_EQ(first_use_calib_tokens(128), 8192);
  EXPECT_EQ(first_use_calib_tokens(256), 16384);
  const std::string wide = default_calibration_path(model, d4b8, 256);
  EXPECT_NE(wide.find("vecinfer_d4b8-r7-t16384.vqcal"), std::string::npos) << wide;
}

// The device store takes learned calibrations (its kernels map keys and queries; parity with the
// CPU store: tests/kvcache/test_kv_store_device.cpp).
TEST(LearnedKeys, TheDeviceTakesThem) {
#ifdef VQ_HAVE_CUDA
  const Tokens t = make_tokens(600, 5);
  KVCacheConfig cfg = parse_kv_cache_spec("vecinfer:d4b6");
  cfg.calibration = calibrate("vecinfer:d4b6", t, 600, KeyTransform::learned);
  const std::string why = kv_device_unsupported_reason(make_kv_spec(cfg), KVGeometry{kHQ, kH, kD}, 32);
  EXPECT_EQ(why.find("learned"), std::string::npos) << why;
  if (cuda::cuda_device_available()) {
    EXPECT_EQ(why, "");
  }
#else
  GTEST_SKIP() << "no CUDA backend in this build: the device check is not compiled";
#endif
}

}  // namespace
}  // namespace vq
