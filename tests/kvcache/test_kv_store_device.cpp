// The KV store with its pool on the GPU against the same store on the CPU: identical
// bookkeeping, identical dense block bytes, nearly identical codes, attention outputs within the
// kernels' rounding, for decode and prefill-style queries, forks, sliding windows, every GQA
// group 1..16, head_dim 64 / 128 / 256, fp16, the scalar-block methods (q8_0, q4_0, q4_0h, q5_0:
// block bytes identical, dequantized into the kernels' fp16 tiles) and VecInfer presets (shared
// and per-sub-space codebooks, so both coded split kernels run). GPU tests skip without a device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/calibration_file.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/kv_method.h"
#include "kvcache/kv_store.h"
#include "kvcache/kv_store_device.h"
#include "gpu_test.h"
#include "test_util.h"

#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#include "ops/cuda/stream_cuda.h"
#endif


namespace vq {
namespace {


struct Case {
  const char* name;
  int HQ, H, D;
  const char* spec;
  int window = 0;  // sliding window of layer 1 (0: global)
  int prompt = 75; // tokens of the first chunk (long ones: the decode rows use many splits)
  bool key_mean = false;  // the calibration carries a rotated key mean (codec/key_mean.h)
  bool learned = false;   // the calibration carries the learned key transform (codec/learned_key_map.h)
};

KVSpec spec_for(const Case& c, int layers) {
  KVCacheConfig cfg = parse_kv_cache_spec(c.spec);
  KVSpec s{cfg, nullptr};
  if (cfg.method == KVMethod::vecinfer) {
    Calibration cal = random_calibration(cfg, layers, c.H, c.D, 7);
    if (c.key_mean) {  // magnitude ~3: without its score terms, or coded with it, the scores are off by O(1)
      std::vector<double> freqs(size_t(c.D / 2));
      for (int i = 0; i < c.D / 2; ++i) freqs[size_t(i)] = std::pow(1e6, -2.0 * i / c.D);
      add_random_key_mean(cal, freqs, c.D, (c.HQ + c.D) % 2 == 0, 16, uint64_t(c.HQ + c.D));
    }
    if (c.learned) add_random_key_map(cal, uint64_t(c.HQ * 31 + c.D));
    s.calibration = std::make_shared<const Calibration>(std::move(cal));
  }
  return s;
}

std::unique_ptr<KVStore> make_store(const Case& c, const KVSpec& spec, KVDevice dev, size_t budget = size_t(-1)) {
  KVStoreOptions o;
  o.device = dev;
  o.budget_bytes = budget;
  if (c.window) o.sliding_window = {0, c.window};
  return std::make_unique<KVStore>(KVGeometry{c.HQ, c.H, c.D}, 2, spec, o);
}

class DeviceStoreParity : public ::testing::TestWithParam<Case> {};

// One sequence grows by a 75-token prompt, then single tokens and a 45-token chunk; a fork of it
// grows on its own; after every append both stores attend the new positions and agree.
TEST_P(DeviceStoreParity, AppendsForksAndAttentionMatchTheCpu) {
  VQ_SKIP_WITHOUT_GPU();
  const Case c = GetParam();
  const int L = 2;
  const KVSpec spec = spec_for(c, L);
  auto cpu = make_store(c, spec, KVDevice::cpu);
  auto gpu = make_store(c, spec, KVDevice::cuda);
  const bool coded = spec.config.method == KVMethod::vecinfer;
  const bool direct = kv_method(spec.config.method).direct();  // scalar blocks, coded on append
  // VecInfer: the two encoders may pick different centroids at near-ties (counted below), and
  // the GPU kernels use fp16 lookup tables / queries; fp16 decode rows: only the order of fp32
  // sums differs; fp16 prefill rows (>= 16 rows: the tensor-core kernel) round q and P to fp16.
  // Scalar blocks: the kernels round the dequantized d * q to fp16 (the CPU keeps fp32).
  auto tol_for = [&](int n) { return coded ? 2e-3 : direct ? 5e-6 : n >= 16 ? 1e-6 : 1e-8; };
  std::mt19937 rng(1234);
  const size_t kvrow = size_t(c.H) * c.D, qrow = size_t(c.HQ) * c.D;
  std::vector<SeqKV> sc, sg;
  sc.push_back(cpu->new_sequence());
  sg.push_back(gpu->new_sequence());
  auto grow = [&](size_t i, int n) {
    for (int l = 0; l < L; ++l) {
      const auto k = randn(size_t(n) * kvrow, rng), v = randn(size_t(n) * kvrow, rng);
      cpu->append(sc[i], l, k.data(), v.data(), n);
      gpu->append(sg[i], l, k.data(), v.data(), n);
    }
    for (int l = 0; l < L; ++l) {
      const auto q = randn(size_t(n) * qrow, rng);
      std::vector<float> oc(q.size()), og(q.size(), NAN);
      const int64_t pos0 = sc[i].size() - n;
      AttnEntry ec{&sc[i], pos0, n, q.data(), oc.data()}, eg{&sg[i], pos0, n, q.data(), og.data()};
      cpu->attend(l, &ec, 1, 1.0f / std::sqrt(float(c.D)));
      gpu->attend(l, &eg, 1, 1.0f / std::sqrt(float(c.D)));
      for (float x : og) ASSERT_TRUE(std::isfinite(x)) << "unwritten or NaN output, seq " << i << " layer " << l;
      ASSERT_LT(nmse(og, oc), tol_for(n)) << c.name << ": seq " << i << " layer " << l << " at " << sc[i].size();
    }
    cpu->trim(sc[i]);
    gpu->trim(sg[i]);
  };
  grow(0, c.prompt);
  for (int s = 0; s < 40; ++s) grow(0, 1);
  grow(0, 45);
  // a fork shares every block (the partial last one too); the first write into it copies it
  sc.push_back(cpu->fork(sc[0]));
  sg.push_back(gpu->fork(sg[0]));
  for (int s = 0; s < 70; ++s) grow(1, 1), grow(0, 1);
  EXPECT_EQ(cpu->pool().used_bytes(), gpu->pool().used_bytes());
  for (size_t i = 0; i < sc.size(); ++i) EXPECT_EQ(cpu->token_bytes(sc[i]), gpu->token_bytes(sg[i]));
  // Block bytes: dense blocks equal in every written slot, codes equal but for rare near-ties
  // of the nearest centroid.
  const int B = gpu->block_tokens();
  size_t same = 0, total = 0, dense_blocks = 0;
  for (size_t i = 0; i < sc.size(); ++i)
    for (int l = 0; l < L; ++l)
      for (int kind = 0; kind < 2; ++kind) {
        const int64_t n = sc[i].layer_size(l);
        for (size_t j = 0; int64_t(j) * B < n; ++j) {
          const int32_t idc = cpu->block_id(sc[i], l, kind == 1, j), idg = gpu->block_id(sg[i], l, kind == 1, j);
          ASSERT_EQ(idc >= 0, idg >= 0) << "seq " << i << " layer " << l << " block " << j << " kind " << kind;
          if (idc < 0) continue;
          const int arena = cpu->arena_of(l, kind == 1);
          const size_t bytes = cpu->pool().block_bytes(arena);
          std::vector<uint8_t> g(bytes);
          gpu->device().download_block(arena, idg, g.data());
          const uint8_t* h = cpu->pool().data(arena, idc);
          if (kind == 0) {  // fp16: keys [H][D][B], values [H][B][D]; slots past n are unwritten
            const int valid = int(std::min<int64_t>(B, n - int64_t(j) * B));
            const auto* hk = reinterpret_cast<const uint16_t*>(h);
            const auto* gk = reinterpret_cast<const uint16_t*>(g.data());
            for (int hh = 0; hh < c.H; ++hh)
              for (int ch = 0; ch < c.D; ++ch)
                for (int t = 0; t < valid; ++t) {
                  const size_t ki = (size_t(hh) * c.D + ch) * B + t;
                  const size_t vi = size_t(c.H) * c.D * B + (size_t(hh) * B + t) * c.D + ch;
                  ASSERT_EQ(hk[ki], gk[ki]) << "key h" << hh << " c" << ch << " t" << t;
                  ASSERT_EQ(hk[vi], gk[vi]) << "value h" << hh << " c" << ch << " t" << t;
                }
            ++dense_blocks;
          } else if (direct) {  // [2][H][B][row]: every written row identical (the CPU's rounding)
            const int valid = int(std::min<int64_t>(B, n - int64_t(j) * B));
            const size_t row = bytes / (2 * size_t(c.H) * B);
            for (int kv = 0; kv < 2; ++kv)
              for (int hh = 0; hh < c.H; ++hh)
                for (int t = 0; t < valid; ++t) {
                  const size_t at = ((size_t(kv) * c.H + hh) * B + t) * row;
                  for (size_t k = 0; k < row; ++k)
                    ASSERT_EQ(h[at + k], g[at + k]) << (kv ? "value" : "key") << " row h" << hh << " t" << t
                                                    << " byte " << k << ", seq " << i << " layer " << l << " block " << j;
                }
            ++total;
          } else {
            for (size_t k = 0; k < bytes; ++k) same += h[k] == g[k];
            total += bytes;
          }
        }
      }
  if (direct) EXPECT_GT(total, 0u);  // (no fp16 blocks)
  else EXPECT_GT(dense_blocks, 0u);
  if (coded) {
    ASSERT_GT(total, 0u);
    EXPECT_GE(double(same) / double(total), 0.98) << same << " of " << total << " code bytes equal";
  }
}

const Case kCases[] = {
    {"fp16_g1_d64", 4, 4, 64, "fp16"},
    {"fp16_g3_d64", 9, 3, 64, "fp16"},
    {"fp16_g4_d128", 32, 8, 128, "fp16"},
    {"fp16_g16_d64", 16, 1, 64, "fp16"},
    {"fp16_g3_d256", 12, 4, 256, "fp16"},
    {"fp16_window", 8, 2, 64, "fp16", 50},
    {"d4b8_shared_g4_d128_lut", 8, 2, 128, "vecinfer:d4b8,gran=shared"},
    {"d4b8_shared_g3_d64_lut", 9, 3, 64, "vecinfer:d4b8,gran=shared"},
    {"d4b8_sub_g4_d128", 8, 2, 128, "vecinfer:d4b8"},
    {"d8b8_sub_g8_d128", 16, 2, 128, "vecinfer:d8b8"},
    {"d4b8_sub_g3_d256", 12, 4, 256, "vecinfer:d4b8"},
    {"k_d8b8_v_d4b8_g16_d64", 16, 1, 64, "vecinfer:k=d8b8,v=d4b8,gran=shared"},
    {"d8b12_shared_g2_d128", 4, 2, 128, "vecinfer:d8b12,gran=shared"},
    {"d8b12_sub_g1_d64", 2, 2, 64, "vecinfer:d8b12"},
    {"d4b8_r64_sink0", 8, 2, 64, "vecinfer:d4b8,r=64,sink=0"},
    {"d4b8_window", 8, 2, 64, "vecinfer:d4b8", 100},
    // r=32: the prefill chunks' later rows read codes of the same chunk (the prefill kernel's coded form)
    {"d4b8_r32_g4_d128", 8, 2, 128, "vecinfer:d4b8,r=32"},
    {"d8b8_r32_g3_d256", 12, 4, 256, "vecinfer:d8b8,r=32"},
    {"d8b12_r32_g2_d64", 4, 2, 64, "vecinfer:d8b12,r=32,gran=shared"},
    {"fp16_g8_d256", 16, 2, 256, "fp16"},
    // the sweep's geometries (issue 20): every group size of the dense kernel's 16-row tiles
    {"fp16_g2_d256", 16, 8, 256, "fp16"},
    {"fp16_g1_d256", 4, 4, 256, "fp16"},
    {"fp16_g2_d128", 8, 4, 128, "fp16"},
    {"fp16_g6_d128", 12, 2, 128, "fp16"},
    {"fp16_g7_d128", 28, 4, 128, "fp16"},
    {"fp16_g8_d128", 8, 1, 128, "fp16"},
    {"fp16_g16_d128", 16, 1, 128, "fp16"},
    {"fp16_g7_d64", 14, 2, 64, "fp16"},
    {"fp16_g4_d128_long", 32, 8, 128, "fp16", 0, 1500},
    {"fp16_g3_d256_long_window", 12, 4, 256, "fp16", 700, 1500},
    {"d4b8_g7_d128_long", 28, 4, 128, "vecinfer:d4b8", 0, 1500},
    // head_dim 256 on the LUT kernel (shared value books)
    {"d4b8_shared_g3_d256_lut", 12, 4, 256, "vecinfer:d4b8,gran=shared"},
    {"k_d8b8_v_d4b8_g16_d256_lut", 16, 1, 256, "vecinfer:k=d8b8,v=d4b8,gran=shared"},
    // 8 heads per LUT block; head_dim 256 with per-sub-space value books (two value parts)
    {"d4b8_sub_g6_d128_lut8", 12, 2, 128, "vecinfer:d4b8", 0, 1500},
    {"d4b8_shared_g8_d64_lut8", 8, 1, 64, "vecinfer:d4b8,gran=shared"},
    {"d4b8_sub_g2_d256_vparts", 16, 8, 256, "vecinfer:d4b8", 0, 1500},
    {"d4b8_sub_g4_d256_vparts_window", 4, 1, 256, "vecinfer:d4b8", 300},
    // the rotated key mean (issue 18): the encoder's subtraction and the score terms in the LUT
    // kernel (4 and 8 heads per entry, two value parts), gather-mma and the prefill kernel
    {"kmean_d4b8_shared_g3_d64_lut", 9, 3, 64, "vecinfer:d4b8,gran=shared", 0, 75, true},
    {"kmean_d4b8_sub_g6_d128_lut8_long", 12, 2, 128, "vecinfer:d4b8", 0, 1500, true},
    {"kmean_d4b8_sub_g2_d256_vparts_long", 16, 8, 256, "vecinfer:d4b8", 0, 1500, true},
    {"kmean_d8b12_sub_g1_d64_gather", 2, 2, 64, "vecinfer:d8b12", 0, 75, true},
    {"kmean_d8b12_r32_g2_d64_gather_prefill", 4, 2, 64, "vecinfer:d8b12,r=32,gran=shared", 0, 75, true},
    {"kmean_d4b8_r32_g4_d128_prefill", 8, 2, 128, "vecinfer:d4b8,r=32", 0, 600, true},
    {"kmean_d8b8_r32_g3_d256_prefill", 12, 4, 256, "vecinfer:d8b8,r=32", 0, 75, true},
    {"kmean_d4b8_window", 8, 2, 64, "vecinfer:d4b8", 100, 75, true},
    {"kmean_d4b8_r64_sink0_g16", 16, 1, 64, "vecinfer:d4b8,r=64,sink=0", 0, 400, true},
    // the learned key transform (issue 18): keys mapped by M in the block encoder (fast and generic
    // kernels), queries by M^-T (LUT, gather-mma and prefill kernels), with and without the key mean
    {"learned_d4b8_g4_d128_lut", 8, 2, 128, "vecinfer:d4b8", 0, 75, false, true},
    {"learned_d4b8_g7_d64_long", 14, 2, 64, "vecinfer:d4b8", 0, 1500, false, true},
    {"learned_d4b8_g2_d256_vparts_long", 16, 8, 256, "vecinfer:d4b8", 0, 1500, true, true},
    {"learned_d8b12_g1_d64_gather", 2, 2, 64, "vecinfer:d8b12", 0, 75, false, true},
    {"learned_split_g6_d128_generic", 12, 2, 128, "vecinfer:k=d4b10,v=d8b12", 0, 600, true, true},
    {"learned_d4b8_r32_g4_d128_prefill", 8, 2, 128, "vecinfer:d4b8,r=32", 0, 600, true, true},
    {"learned_d8b8_r32_g3_d256_prefill", 12, 4, 256, "vecinfer:d8b8,r=32", 0, 75, false, true},
    {"learned_d4b8_window", 8, 2, 64, "vecinfer:d4b8", 100, 75, true, true},
    // the scalar-block methods (issue 19): decode and prefill kernels dequantizing q8_0 / q4_0 /
    // q5_0 rows, q4_0h's rotations, every head_dim, groups 1..16, windows, long rows
    {"q8_0_g4_d128", 8, 2, 128, "q8_0"},
    {"q8_0_g3_d256", 12, 4, 256, "q8_0"},
    {"q8_0_g7_d128_long", 28, 4, 128, "q8_0", 0, 1500},
    {"q4_0_g3_d64", 9, 3, 64, "q4_0"},
    {"q4_0_g16_d128", 16, 1, 128, "q4_0"},
    {"q4_0_window", 8, 2, 64, "q4_0", 50},
    {"q4_0h_g6_d128", 12, 2, 128, "q4_0h"},
    {"q4_0h_g1_d64", 4, 4, 64, "q4_0h"},
    {"q4_0h_g2_d256_long_window", 8, 4, 256, "q4_0h", 300, 1500},
    {"q5_0_g8_d64", 8, 1, 64, "q5_0"},
    {"q5_0_g2_d256", 16, 8, 256, "q5_0"},
};

INSTANTIATE_TEST_SUITE_P(Cases, DeviceStoreParity, ::testing::ValuesIn(kCases),
                         [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// A short run for compute-sanitizer racecheck (every attention kernel: dense split, LUT and
// gather-mma coded splits, merge, and the block encoder).
TEST(DeviceStore, SmallRunForSanitizers) {
  VQ_SKIP_WITHOUT_GPU();
  // 8 heads per LUT block (G 8) and the two value parts (head_dim 256, per-sub-space books) too
  const Case cases[] = {{"small", 8, 2, 64, "fp16"},
                        {"small", 8, 2, 64, "vecinfer:d4b8,r=32,gran=shared"},
                        {"small", 8, 2, 64, "vecinfer:d4b8,r=32"},
                        {"small_g8", 16, 2, 128, "vecinfer:d4b8,r=32"},
                        {"small_d256", 8, 4, 256, "vecinfer:d4b8,r=32"},
                        {"small_kmean", 8, 2, 64, "vecinfer:d4b8,r=32", 0, 75, true},
                        {"small_kmean_gather", 4, 2, 64, "vecinfer:d8b12,r=32", 0, 75, true},
                        {"small_learned", 8, 2, 64, "vecinfer:d4b8,r=32", 0, 75, true, true},
                        {"small_learned_generic", 4, 2, 64, "vecinfer:d8b12,r=32", 0, 75, false, true},
                        {"small_q8_0", 8, 2, 64, "q8_0"},
                        {"small_q4_0h_g8", 16, 2, 128, "q4_0h"},
                        {"small_q5_0_d256", 8, 4, 256, "q5_0"}};
  for (const Case& c : cases) {
    const char* kv = c.spec;
    const KVSpec spec = spec_for(c, 2);
    auto gpu = make_store(c, spec, KVDevice::cuda);
    std::mt19937 rng(3);
    SeqKV s = gpu->new_sequence();
    const size_t kvrow = size_t(c.H) * c.D, qrow = size_t(c.HQ) * c.D;
    for (int n : {70, 1, 33}) {
      for (int l = 0; l < 2; ++l) {
        const auto k = randn(size_t(n) * kvrow, rng), v = randn(size_t(n) * kvrow, rng);
        gpu->append(s, l, k.data(), v.data(), n);
      }
      const auto q = randn(size_t(n) * qrow, rng);
      std::vector<float> o(q.size(), NAN);
      AttnEntry e{&s, s.size() - n, n, q.data(), o.data()};
      gpu->attend(1, &e, 1, 0.125f);
      for (float x : o) ASSERT_TRUE(std::isfinite(x)) << kv;
    }
  }
}

// Coded prefill with the past decoded once per step (KVStoreDevice::set_prefill_scratch_bytes)
// gives bit for bit the outputs of every tile decoding it, chunk after chunk (the code ranges grow,
// in-chunk blocks are encoded in the same step), for shared and per-sub-space books, the rotated
// key mean, head_dim 64 / 128 / 256 and groups 4..8; a scratch too small for a step falls back.
TEST(DeviceStore, PrefillScratchEqualsPerTileDecoding) {
  VQ_SKIP_WITHOUT_GPU();
  const Case cases[] = {{"g4_d64_shared", 8, 2, 64, "vecinfer:d4b8,r=32,gran=shared"},
                        {"g6_d128", 12, 2, 128, "vecinfer:d4b8,r=32"},
                        {"g8_d128_kmean", 16, 2, 128, "vecinfer:d4b8,r=32", 0, 75, true},
                        {"g4_d256", 8, 2, 256, "vecinfer:d4b8,r=32"}};
  for (const Case& c : cases)
    for (const size_t cap : {size_t(1) << 30, size_t(1)}) {
      const KVSpec spec = spec_for(c, 2);
      auto a = make_store(c, spec, KVDevice::cuda), b = make_store(c, spec, KVDevice::cuda);
      ASSERT_TRUE(b->device().prefill_scratch_possible()) << c.name;
      a->device().set_prefill_scratch_bytes(0);
      b->device().set_prefill_scratch_bytes(cap);
      std::mt19937 rng(5);
      SeqKV sa = a->new_sequence(), sb = b->new_sequence();
      const size_t kvrow = size_t(c.H) * c.D, qrow = size_t(c.HQ) * c.D;
      int used = 0;
      for (int n : {96, 160, 200, 64}) {
        for (int l = 0; l < 2; ++l) {
          const auto k = randn(size_t(n) * kvrow, rng), v = randn(size_t(n) * kvrow, rng);
          a->append(sa, l, k.data(), v.data(), n);
          b->append(sb, l, k.data(), v.data(), n);
        }
        const auto q = randn(size_t(n) * qrow, rng);
        std::vector<float> oa(q.size(), NAN), ob(q.size(), NAN);
        AttnEntry ea{&sa, sa.size() - n, n, q.data(), oa.data()}, eb{&sb, sb.size() - n, n, q.data(), ob.data()};
        for (int l = 0; l < 2; ++l) {
          a->attend(l, &ea, 1, 0.125f);
          b->attend(l, &eb, 1, 0.125f);
          used += b->device().step_prefill_scratch();
          EXPECT_FALSE(a->device().step_prefill_scratch());
          for (size_t i = 0; i < oa.size(); ++i) ASSERT_TRUE(std::isfinite(ob[i])) << c.name << " " << i;
          ASSERT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * 4), 0)
              << c.name << " cap " << cap << ": chunk of " << n << " at " << sa.size() - n << ", layer " << l
              << ": the scratch's outputs differ from per-tile decoding";
        }
      }
      if (cap > 1) EXPECT_GE(used, 6) << c.name << ": the scratch was not used";
      else EXPECT_EQ(used, 0) << c.name << ": a scratch of 1 byte cannot hold a step";
    }
}

// reserve_fixed (a caller that captures its decode launches once: veloxquant.torch under CUDA
// graphs): every step that fits the sizes runs on the same descriptor addresses, before and after
// larger steps (prefill chunks, on the second set), with outputs bit for bit those of a store
// without it; with a rotated key mean, a step whose positions would move the key-mean tables past
// what was reserved is refused by name.
TEST(DeviceStore, FixedSlotKeepsDecodeAddressesAndOutputs) {
  VQ_SKIP_WITHOUT_GPU();
  const Case cases[] = {{"fp16", 8, 2, 64, "fp16"},
                        {"shared", 8, 2, 128, "vecinfer:d4b8,r=32,gran=shared"},
                        {"kmean", 12, 2, 128, "vecinfer:d4b8,r=32", 0, 75, true}};
  for (const Case& c : cases) {
    const KVSpec spec = spec_for(c, 2);
    auto a = make_store(c, spec, KVDevice::cuda), b = make_store(c, spec, KVDevice::cuda);
    b->device().reserve_fixed(2, 511);
    EXPECT_THROW(b->device().reserve_fixed(2, 511), Error) << c.name;
    std::mt19937 rng(11);
    SeqKV sa[2] = {a->new_sequence(), a->new_sequence()}, sb[2] = {b->new_sequence(), b->new_sequence()};
    const size_t kvrow = size_t(c.H) * c.D, qrow = size_t(c.HQ) * c.D;
    const int32_t* decode_pos = nullptr;
    int decode_steps = 0;
    for (int n : {70, 1, 1, 40, 1, 1, 1, 100, 1, 1}) {
      for (int r = 0; r < 2; ++r)
        for (int l = 0; l < 2; ++l) {
          const auto k = randn(size_t(n) * kvrow, rng), v = randn(size_t(n) * kvrow, rng);
          a->append(sa[r], l, k.data(), v.data(), n);
          b->append(sb[r], l, k.data(), v.data(), n);
          EXPECT_EQ(b->device().step_in_fixed_slot(), n == 1) << c.name << " append of " << n;
        }
      const auto q = randn(size_t(2 * n) * qrow, rng);
      std::vector<float> oa(q.size(), NAN), ob(q.size(), NAN);
      AttnEntry ea[2], eb[2];
      for (int r = 0; r < 2; ++r) {
        ea[r] = {&sa[r], sa[r].size() - n, n, q.data() + size_t(r * n) * qrow, oa.data() + size_t(r * n) * qrow};
        eb[r] = {&sb[r], sb[r].size() - n, n, q.data() + size_t(r * n) * qrow, ob.data() + size_t(r * n) * qrow};
      }
      for (int l = 0; l < 2; ++l) {
        a->attend(l, ea, 2, 0.125f);
        b->attend(l, eb, 2, 0.125f);
        ASSERT_EQ(b->device().step_in_fixed_slot(), n == 1) << c.name << " attention of " << n;
        if (n == 1) {
          if (!decode_pos) decode_pos = b->device().positions();
          EXPECT_EQ(b->device().positions(), decode_pos) << c.name << ": a decode step's descriptors moved";
          ++decode_steps;
        }
        ASSERT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * 4), 0)
            << c.name << ": " << n << " rows at " << sa[0].size() - n << ", layer " << l;
      }
    }
    EXPECT_EQ(decode_steps, 14) << c.name;
    if (c.key_mean) {  // the tables hold 4096 positions (grown in steps of 4096): a chunk past them is refused
      const int n = 4000;
      const auto k = randn(size_t(n) * kvrow, rng), v = randn(size_t(n) * kvrow, rng);
      try {
        b->append(sb[0], 0, k.data(), v.data(), n);
        ADD_FAILURE() << c.name << ": a chunk past the reserved positions was taken";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("sized for"), std::string::npos) << e.what();
      }
    }
  }
}

#ifdef VQ_HAVE_CUDA
// The step as veloxquant.torch's graph-safe ops run it (python/torch_bridge): the host work of a
// step (blocks, rows, descriptors, fix-up) eagerly, then every layer's append, encode and attention
// from device q/k/v in one go. A store with reserve_fixed captures the first decode step's launches
// into one CUDA graph and replays that graph for every later decode step, across prefill chunks and
// block boundaries (encodes inside the graph); a store without it runs each step eagerly. Their
// outputs must be bit-equal: the captured launches may hold no per-step host state.
struct GraphStepRun {
  KVStore& st;
  SeqKV seqs[2];
  cuda::DeviceBuffer k, v, q, out;
  cuda::Graph graph;
  GraphStepRun(KVStore& s) : st(s), seqs{s.new_sequence(), s.new_sequence()} {}

  // One step of n tokens per row: returns the attention outputs of the last layer, [2n][HQ*D].
  std::vector<float> step(int n, const std::vector<float>& hk, const std::vector<float>& hv,
                          const std::vector<float>& hq, bool replay, int layers) {
    KVStoreDevice& dev = st.device();
    const KVGeometry g = st.geometry();
    const int64_t HD = int64_t(g.n_kv_heads) * g.head_dim, QD = int64_t(g.n_heads) * g.head_dim;
    if (k.size() < hk.size() * 4) k = cuda::DeviceBuffer(hk.size() * 4), v = cuda::DeviceBuffer(hk.size() * 4);
    if (q.size() < hq.size() * 4) q = cuda::DeviceBuffer(hq.size() * 4), out = cuda::DeviceBuffer(hq.size() * 4);
    k.upload(hk.data(), hk.size() * 4);
    v.upload(hv.data(), hv.size() * 4);
    q.upload(hq.data(), hq.size() * 4);
    dev.synchronize();
    std::vector<int64_t> counts;
    int64_t pos0[2];
    for (int b = 0; b < 2; ++b) pos0[b] = seqs[b].size(), st.blocks_for_append(seqs[b], n, counts);
    st.pool().reserve(counts);
    dev.begin_step();
    for (int b = 0; b < 2; ++b)
      for (int l = 0; l < layers; ++l) st.append_blocks(seqs[b], l, n);
    for (int b = 0; b < 2; ++b) dev.add_rows(seqs[b], pos0[b], n);
    dev.finish_step();
    dev.launch_fixup();
    auto launches = [&] {
      for (int l = 0; l < layers; ++l) {
        dev.launch_append(l, k.as<float>(), HD, v.as<float>(), HD);
        dev.launch_encode(l);
        dev.launch_attend(l, q.as<float>(), QD, 0.125f, cuda::ElemType::f32, out.as<float>(), QD);
      }
    };
    if (!replay) {
      launches();
    } else {
      if (!graph.valid()) {
        graph.begin_capture(dev.stream());
        launches();
        graph.end_capture(dev.stream());
      }
      graph.launch(dev.stream());
    }
    dev.synchronize();
    std::vector<float> o(hq.size());
    out.download(o.data(), o.size() * 4);
    for (int b = 0; b < 2; ++b) st.trim(seqs[b]);
    return o;
  }
};

TEST(DeviceStore, FixedSlotDecodeReplaysFromOneGraph) {
  VQ_SKIP_WITHOUT_GPU();
  const Case cases[] = {{"fp16", 8, 2, 64, "fp16"},
                        {"d4b8", 8, 2, 64, "vecinfer:d4b8,r=32"},
                        {"d4b8_shared_g6", 12, 2, 128, "vecinfer:d4b8,r=32,gran=shared"},
                        {"d4b8_kmean_learned", 8, 2, 64, "vecinfer:d4b8,r=32", 0, 75, true, true},
                        {"d4b8_kmean_g6", 12, 2, 128, "vecinfer:d4b8,r=32", 0, 75, true}};
  for (const Case& c : cases) {
    const KVSpec spec = spec_for(c, 2);
    auto a = make_store(c, spec, KVDevice::cuda), b = make_store(c, spec, KVDevice::cuda);
    b->device().reserve_fixed(2, 1023);
    GraphStepRun ra(*a), rb(*b);
    std::mt19937 rng(17);
    const size_t kvrow = size_t(c.H) * c.D, qrow = size_t(c.HQ) * c.D;
    int step = 0;
    // 37-token prompts, 40 decode steps, a 21-token chunk, 40 more: block boundaries at 64, 96, 128
    std::vector<int> plan = {37};
    for (int i = 0; i < 40; ++i) plan.push_back(1);
    plan.push_back(21);
    for (int i = 0; i < 40; ++i) plan.push_back(1);
    for (int n : plan) {
      const auto hk = randn(size_t(2 * n) * kvrow, rng), hv = randn(size_t(2 * n) * kvrow, rng);
      const auto hq = randn(size_t(2 * n) * qrow, rng);
      const std::vector<float> oa = ra.step(n, hk, hv, hq, false, 2);
      const std::vector<float> ob = rb.step(n, hk, hv, hq, n == 1, 2);
      EXPECT_EQ(b->device().step_in_fixed_slot(), n == 1) << c.name << " step " << step;
      for (float x : ob) ASSERT_TRUE(std::isfinite(x)) << c.name << " step " << step;
      ASSERT_EQ(std::memcmp(oa.data(), ob.data(), oa.size() * 4), 0)
          << c.name << ": step " << step << " (" << n << " rows each, positions from " << ra.seqs[0].size() - n
          << "): the replayed graph's outputs differ from the eager step's";
      ++step;
    }
  }
}
#endif

TEST(DeviceStore, RefusesMethodsWithoutDeviceKernels) {
  for (const char* s : {"kivi2", "fp32"}) {
    const KVSpec spec{parse_kv_cache_spec(s), nullptr};
    const std::string why = kv_device_unsupported_reason(spec, KVGeometry{8, 2, 64}, 32);
    EXPECT_NE(why, "");
#ifdef VQ_HAVE_CUDA
    EXPECT_NE(why.find(kv_device_method_names()), std::string::npos) << why;
#endif
  }
}

TEST(DeviceStore, BudgetExhaustionMatchesTheCpuAndChangesNothing) {
  VQ_SKIP_WITHOUT_GPU();
  const Case c{"budget", 8, 2, 64, "vecinfer:d4b8"};
  const KVSpec spec = spec_for(c, 2);
  const size_t budget = 400 * 1024;
  auto cpu = make_store(c, spec, KVDevice::cpu, budget);
  auto gpu = make_store(c, spec, KVDevice::cuda, budget);
  std::mt19937 rng(5);
  SeqKV a = cpu->new_sequence(), b = gpu->new_sequence();
  const size_t kvrow = size_t(c.H) * c.D;
  int steps = 0;
  for (;; ++steps) {
    const bool fc = cpu->can_append(a, 16), fg = gpu->can_append(b, 16);
    ASSERT_EQ(fc, fg) << "at " << a.size() << " tokens";
    if (!fc) break;
    for (int l = 0; l < 2; ++l) {
      const auto k = randn(16 * kvrow, rng), v = randn(16 * kvrow, rng);
      cpu->append(a, l, k.data(), v.data(), 16);
      gpu->append(b, l, k.data(), v.data(), 16);
    }
    cpu->trim(a);
    gpu->trim(b);
    ASSERT_EQ(cpu->pool().used_bytes(), gpu->pool().used_bytes());
    ASSERT_LE(gpu->pool().used_bytes(), budget);
  }
  EXPECT_GT(steps, 3);
}

}  // namespace
}  // namespace vq
