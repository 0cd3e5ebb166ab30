// GPU-only: batched decode/prefill attention on VecInfer codes (vq::cuda::pq_attention_device)
// against vq::ref::pq_attention (coded part) merged with the fp16 segments in double here.
// Outputs and workspace are NaN-poisoned before each run. Skips without a device.
#if defined(VQ_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "cuda_test_util.h"
#include "ops/cuda/device.h"
#include "ops/cuda/paged_attention_cuda.h"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_cuda.h"
#include "ops/cuda/pq_attention_lut.cuh"
#include "ops/ref/pq_attention.h"

namespace vq::test {
namespace {

struct AttnCase {
  const char* name;
  int n_kv_heads, group, head_dim;
  int kd, kbits;
  bool kper;
  int vd, vbits;
  bool vper;
  std::vector<int> coded;   // per row
  std::vector<int> resid;   // per row: fp16 residual window (segment 0)
  int prefill = 0;          // > 0: rows share row 0's codes; segment 1 = causal chunk of this many tokens
  float score_scale = 2.0f;
};

const AttnCase kAttn[] = {
    {"d128_d4b8_g4_ragged", 2, 4, 128, 4, 8, false, 4, 8, false, {1, 17, 1000, 5000}, {0, 5, 16, 3}},
    {"d64_k_d8b8per_v_d4b8_g1", 3, 1, 64, 8, 8, true, 4, 8, false, {33, 0, 700}, {3, 7, 0}},
    {"d256_k_d4b8_v_d8b8_g8", 1, 8, 256, 4, 8, false, 8, 8, false, {2048, 300}, {4, 0}},
    {"d128_d8b12_g4", 2, 4, 128, 8, 12, false, 8, 12, false, {1500, 64}, {2, 9}},
    {"d128_d4b12_per_g8_global_books", 1, 8, 128, 4, 12, true, 8, 12, true, {700, 2000}, {0, 1}},
    {"d128_d4b4_per_g3", 2, 3, 128, 4, 4, true, 4, 4, true, {999, 129}, {1, 0}},
    {"d64_d4b8_g12_two_head_tiles", 2, 12, 64, 4, 8, false, 4, 8, false, {400, 1601}, {6, 2}},
    {"d128_d4b8_g4_131072", 1, 4, 128, 4, 8, false, 4, 8, false, {131072, 9000}, {16, 0}, 0, 3.0f},
    {"empty_rows", 2, 4, 64, 4, 8, false, 4, 8, false, {0, 0}, {0, 3}},
    {"prefill_chunk_d128_g4", 2, 4, 128, 4, 8, false, 8, 8, false, {3000}, {12}, 7},
    {"d128_k_d8b8per_v_d4b8_g2", 2, 2, 128, 8, 8, true, 4, 8, false, {2500, 31, 64}, {0, 4, 2}},
    {"d128_d4b8_g8_two_lut_tiles", 1, 8, 128, 4, 8, false, 4, 8, false, {3000, 77}, {5, 1}},
    {"d64_d4b8per_keys_g4_prefill", 2, 4, 64, 4, 8, true, 4, 8, false, {1200}, {3}, 5},
    // head_dim 256 on the LUT kernel (8 warps; d4 keys: the two-half LUT of 64 sub-spaces)
    {"d256_d4b8_g3_lut", 2, 3, 256, 4, 8, false, 4, 8, false, {3000, 513, 40}, {2, 0, 7}},
    {"d256_k_d8b8per_v_d4b8_g4_lut", 1, 4, 256, 8, 8, true, 4, 8, false, {2100, 1}, {0, 3}},
    // 8 heads per LUT entry (groups of 5..8 in one block, 9..16 in two), every key sub-space count
    {"d128_d4b8per_g6_lut8", 2, 6, 128, 4, 8, true, 4, 8, true, {2600, 45, 700}, {1, 0, 9}},
    {"d64_d4b8_g7_lut8", 2, 7, 64, 4, 8, false, 4, 8, false, {1900, 300}, {0, 4}},
    {"d128_k_d8b8_v_d4b8per_g16_lut8", 1, 16, 128, 8, 8, false, 4, 8, true, {1300, 64}, {2, 0}},
    {"d64_k_d4b8per_v_d4b8per_g5_lut8", 1, 5, 64, 4, 8, true, 4, 8, true, {777}, {3}},
    // head_dim 256 with per-sub-space value books: two value parts per block
    {"d256_d4b8per_g2_lut_vparts", 2, 2, 256, 4, 8, true, 4, 8, true, {2500, 200}, {0, 5}},
    {"d256_k_d8b8per_v_d4b8per_g3_lut_vparts", 1, 3, 256, 8, 8, true, 4, 8, true, {1700, 33}, {2, 1}},
};
// Each case runs with every shipped split kernel: auto (the v4 fp16-LUT kernel where it applies),
// gather-mma, and the LUT kernel asked for explicitly (skipped for shapes it does not take).
constexpr size_t kKernels = 3;
constexpr cuda::PQAttnKernel kKernelIds[kKernels] = {cuda::PQAttnKernel::automatic, cuda::PQAttnKernel::gather_mma,
                                                     cuda::PQAttnKernel::lut};
const char* const kKernelNames[kKernels] = {"_auto", "_gather", "_lut"};

struct Problem {
  int rows;
  std::vector<float> q_code, q_plain;            // [rows, Hq, D]
  std::vector<std::vector<uint8_t>> kc, vc;      // per code set: [Hkv][stride][row bytes]
  std::vector<float> kbook, vbook;               // [Hkv, books, K, d]
  std::vector<std::vector<uint16_t>> rk, rv;     // per row: residual [Hkv][R][D] fp16
  std::vector<uint16_t> ck, cv;                  // prefill chunk [P, Hkv, D] fp16
  int64_t stride;
};

// Reference partial (natural-log domain) over one fp16 run, merged into (m, l, o) in double.
void attend_f16(const float* q, const uint16_t* k, const uint16_t* v, int n, int64_t tok_stride, int D, double& m,
                double& l, std::vector<double>& o) {
  for (int t = 0; t < n; ++t) {
    double s = 0;
    for (int e = 0; e < D; ++e) s += double(q[e]) * f16_to_f32(k[t * tok_stride + e]);
    const double mn = std::max(m, s);
    const double a = std::isinf(m) ? 0.0 : std::exp(m - mn), p = std::exp(s - mn);
    l = l * a + p;
    for (int e = 0; e < D; ++e) o[e] = o[e] * a + p * f16_to_f32(v[t * tok_stride + e]);
    m = mn;
  }
}

class CudaPQAttention : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaPQAttention, MatchesReferenceMergedWithFp16Segments) {
  VQ_SKIP_WITHOUT_CUDA();
  const AttnCase& c = kAttn[GetParam() / kKernels];
  const cuda::PQAttnKernel kernel = kKernelIds[GetParam() % kKernels];
  std::mt19937 rng(101 + unsigned(GetParam()));
  std::normal_distribution<float> nd;
  const int Hkv = c.n_kv_heads, G = c.group, Hq = Hkv * G, D = c.head_dim;
  const bool prefill = c.prefill > 0;
  const int rows = prefill ? c.prefill : int(c.coded.size());
  const int n_sets = prefill ? 1 : rows;  // code sets
  const int kK = 1 << c.kbits, vK = 1 << c.vbits;
  const int kbooks = c.kper ? D / c.kd : 1, vbooks = c.vper ? D / c.vd : 1;
  const int kcb = int(cuda::code_row_bytes(D / c.kd, c.kbits)), vcb = int(cuda::code_row_bytes(D / c.vd, c.vbits));
  auto coded = [&](int r) { return prefill ? c.coded[0] : c.coded[r]; };
  auto resid = [&](int r) { return prefill ? c.resid[0] : c.resid[r]; };
  int max_coded = 0;
  for (int r = 0; r < rows; ++r) max_coded = std::max(max_coded, coded(r));
  const int64_t stride = (int64_t(max_coded) + 15) / 16 * 16 + 16;

  Problem P;
  P.rows = rows;
  P.stride = stride;
  const float qs = c.score_scale / std::sqrt(float(D));
  P.q_code.resize(size_t(rows) * Hq * D);
  P.q_plain.resize(P.q_code.size());
  for (auto& v : P.q_code) v = nd(rng) * qs;
  for (auto& v : P.q_plain) v = nd(rng) * qs;
  P.kbook.resize(size_t(Hkv) * kbooks * kK * c.kd);
  P.vbook.resize(size_t(Hkv) * vbooks * vK * c.vd);
  for (auto& v : P.kbook) v = nd(rng);
  for (auto& v : P.vbook) v = nd(rng);
  P.kc.resize(n_sets);
  P.vc.resize(n_sets);
  for (int s = 0; s < n_sets; ++s) {
    P.kc[s].assign(size_t(Hkv) * stride * kcb, 0xEE);
    P.vc[s].assign(size_t(Hkv) * stride * vcb, 0xEE);
    std::vector<uint16_t> tmp(D / 4);
    for (int h = 0; h < Hkv; ++h)
      for (int t = 0; t < coded(s); ++t) {
        for (int j = 0; j < D / c.kd; ++j) tmp[j] = uint16_t(rng() % unsigned(kK));
        pack_row(tmp.data(), D / c.kd, c.kbits, P.kc[s].data() + (size_t(h) * stride + t) * kcb);
        for (int j = 0; j < D / c.vd; ++j) tmp[j] = uint16_t(rng() % unsigned(vK));
        pack_row(tmp.data(), D / c.vd, c.vbits, P.vc[s].data() + (size_t(h) * stride + t) * vcb);
      }
  }
  const int rcap = 16;
  P.rk.resize(rows);
  P.rv.resize(rows);
  for (int r = 0; r < rows; ++r) {
    P.rk[r].resize(size_t(Hkv) * rcap * D);
    P.rv[r].resize(P.rk[r].size());
    for (auto& v : P.rk[r]) v = f32_to_f16(nd(rng));
    for (auto& v : P.rv[r]) v = f32_to_f16(nd(rng));
  }
  if (prefill) {
    P.ck.resize(size_t(c.prefill) * Hkv * D);
    P.cv.resize(P.ck.size());
    for (auto& v : P.ck) v = f32_to_f16(nd(rng));
    for (auto& v : P.cv) v = f32_to_f16(nd(rng));
  }

  // ---- device ----
  std::vector<uint8_t> kall, vall;
  for (int s = 0; s < n_sets; ++s) {
    kall.insert(kall.end(), P.kc[s].begin(), P.kc[s].end());
    vall.insert(vall.end(), P.vc[s].begin(), P.vc[s].end());
  }
  cuda::DeviceBuffer dk = cuda::to_device(kall.data(), kall.size()), dv = cuda::to_device(vall.data(), vall.size());
  std::vector<const uint8_t*> kp(rows), vp(rows);
  for (int r = 0; r < rows; ++r) {
    const int s = prefill ? 0 : r;
    kp[r] = dk.as<uint8_t>() + size_t(s) * Hkv * stride * kcb;
    vp[r] = dv.as<uint8_t>() + size_t(s) * Hkv * stride * vcb;
  }
  cuda::DeviceBuffer dkp = cuda::to_device(kp.data(), rows * sizeof(void*)),
                     dvp = cuda::to_device(vp.data(), rows * sizeof(void*));
  std::vector<int> ncoded(rows), nres(rows), nchunk(rows);
  for (int r = 0; r < rows; ++r) ncoded[r] = coded(r), nres[r] = resid(r), nchunk[r] = r + 1;
  cuda::DeviceBuffer dn = cuda::to_device(ncoded.data(), rows * 4), dnr = cuda::to_device(nres.data(), rows * 4),
                     dnc = cuda::to_device(nchunk.data(), rows * 4);
  cuda::DeviceBuffer dkb32 = cuda::to_device(P.kbook.data(), P.kbook.size() * 4),
                     dvb32 = cuda::to_device(P.vbook.data(), P.vbook.size() * 4);
  cuda::DeviceBuffer dkb(P.kbook.size() * 2), dvb(P.vbook.size() * 2);
  cuda::f32_to_f16_device(dkb32.as<float>(), dkb.as<uint16_t>(), int64_t(P.kbook.size()));
  cuda::f32_to_f16_device(dvb32.as<float>(), dvb.as<uint16_t>(), int64_t(P.vbook.size()));
  cuda::DeviceBuffer dqc = cuda::to_device(P.q_code.data(), P.q_code.size() * 4),
                     dqp = cuda::to_device(P.q_plain.data(), P.q_plain.size() * 4);
  std::vector<uint16_t> rall;
  std::vector<uint16_t> vall16;
  for (int r = 0; r < rows; ++r) {
    rall.insert(rall.end(), P.rk[r].begin(), P.rk[r].end());
    vall16.insert(vall16.end(), P.rv[r].begin(), P.rv[r].end());
  }
  cuda::DeviceBuffer drk = cuda::to_device(rall.data(), rall.size() * 2), drv = cuda::to_device(vall16.data(), vall16.size() * 2);
  std::vector<const uint16_t*> rkp(rows), rvp(rows);
  for (int r = 0; r < rows; ++r)
    rkp[r] = drk.as<uint16_t>() + size_t(r) * Hkv * rcap * D, rvp[r] = drv.as<uint16_t>() + size_t(r) * Hkv * rcap * D;
  cuda::DeviceBuffer drkp = cuda::to_device(rkp.data(), rows * sizeof(void*)),
                     drvp = cuda::to_device(rvp.data(), rows * sizeof(void*));
  cuda::DeviceBuffer dck, dcv, dckp, dcvp;
  if (prefill) {
    dck = cuda::to_device(P.ck.data(), P.ck.size() * 2);
    dcv = cuda::to_device(P.cv.data(), P.cv.size() * 2);
    std::vector<const uint16_t*> a(rows, dck.as<uint16_t>()), b(rows, dcv.as<uint16_t>());
    dckp = cuda::to_device(a.data(), rows * sizeof(void*));
    dcvp = cuda::to_device(b.data(), rows * sizeof(void*));
  }
  cuda::DeviceBuffer dout(size_t(rows) * Hq * D * 4);

  cuda::PQAttnBatchArgs a;
  a.rows = rows, a.n_kv_heads = Hkv, a.group = G, a.head_dim = D;
  a.k_sub_dim = c.kd, a.k_bits = c.kbits, a.k_per_subspace = c.kper;
  a.v_sub_dim = c.vd, a.v_bits = c.vbits, a.v_per_subspace = c.vper;
  a.q_code = dqc.as<float>(), a.q_plain = dqp.as<float>();
  a.k_codes = dkp.as<const uint8_t*>(), a.v_codes = dvp.as<const uint8_t*>();
  a.n_coded = dn.as<int>(), a.code_head_stride = stride, a.max_coded = max_coded;
  a.k_book = dkb.as<uint16_t>(), a.v_book = dvb.as<uint16_t>();
  a.seg[0].k = drkp.as<const uint16_t*>(), a.seg[0].v = drvp.as<const uint16_t*>(), a.seg[0].len = dnr.as<int>();
  a.seg[0].head_stride = int64_t(rcap) * D, a.seg[0].token_stride = D;
  if (prefill) {
    a.seg[1].k = dckp.as<const uint16_t*>(), a.seg[1].v = dcvp.as<const uint16_t*>(), a.seg[1].len = dnc.as<int>();
    a.seg[1].head_stride = D, a.seg[1].token_stride = int64_t(Hkv) * D;
  }
  a.out = dout.as<float>();
  // Small splits on some cases so that many blocks and the log-sum-exp merge are exercised.
  a.split_tokens = (GetParam() / kKernels) % 2 ? 256 : 0;
  a.kernel = kernel;
  // The LUT kernel keeps the queries in fp32 (LUT = q~ . fp16 centroid); the gather-mma one rounds them.
  const bool lut_shape = c.kbits == 8 && c.vd == 4 && c.vbits == 8 &&
                         (D <= 128 ? (D / c.kd == 16 || D / c.kd == 32)
                                   : (D == 256 && (D / c.kd == 32 || D / c.kd == 64)));
  if (kernel == cuda::PQAttnKernel::lut && !lut_shape) GTEST_SKIP() << "the LUT kernel does not take this shape";
  const bool lut = kernel != cuda::PQAttnKernel::gather_mma && lut_shape;
  cuda::DeviceBuffer ws(std::max<size_t>(cuda::pq_attention_workspace_bytes(a), 4));
  a.workspace = ws.data(), a.workspace_bytes = ws.size();
  ws.fill_bytes(0xFF);
  dout.fill_bytes(0xFF);
  cuda::pq_attention_device(a);
  cuda::device_synchronize();
  std::vector<float> got(size_t(rows) * Hq * D);
  dout.download(got.data(), got.size() * 4);

  // ---- reference: exact inputs, and inputs rounded to fp16 as the kernel sees them ----
  for (int rounded = 0; rounded < 2; ++rounded) {
    std::vector<float> kb = P.kbook, vb = P.vbook, qc = P.q_code;
    if (rounded) {
      for (auto& v : kb) v = round_f16(v);
      for (auto& v : vb) v = round_f16(v);
      if (!lut)
        for (auto& v : qc) v = round_f16(v);
    }
    std::vector<double> want(got.size());
    for (int r = 0; r < rows; ++r)
      for (int h = 0; h < Hkv; ++h) {
        const int s = prefill ? 0 : r;
        std::vector<float> m(G), d(G), o(size_t(G) * D);
        PQAttnArgs ra;
        ra.n_tokens = coded(r), ra.group = G, ra.head_dim = D;
        ra.k_sub_dim = c.kd, ra.k_bits = c.kbits, ra.k_books = kbooks;
        ra.v_sub_dim = c.vd, ra.v_bits = c.vbits, ra.v_books = vbooks;
        ra.q = qc.data() + (size_t(r) * Hq + size_t(h) * G) * D;
        ra.k_codes = P.kc[s].data() + size_t(h) * stride * kcb;
        ra.k_codebook = kb.data() + size_t(h) * kbooks * kK * c.kd;
        ra.v_codes = P.vc[s].data() + size_t(h) * stride * vcb;
        ra.v_codebook = vb.data() + size_t(h) * vbooks * vK * c.vd;
        ra.m = m.data(), ra.d = d.data(), ra.o = o.data();
        ref::pq_attention(ra);
        for (int gq = 0; gq < G; ++gq) {
          const int qh = h * G + gq;
          double M = m[gq], L = d[gq];
          std::vector<double> O(D);
          for (int e = 0; e < D; ++e) O[e] = o[size_t(gq) * D + e];
          const float* qp = P.q_plain.data() + (size_t(r) * Hq + qh) * D;
          attend_f16(qp, P.rk[r].data() + size_t(h) * rcap * D, P.rv[r].data() + size_t(h) * rcap * D, resid(r), D, D,
                     M, L, O);
          if (prefill)
            attend_f16(qp, P.ck.data() + size_t(h) * D, P.cv.data() + size_t(h) * D, r + 1, int64_t(Hkv) * D, D, M, L, O);
          for (int e = 0; e < D; ++e) want[(size_t(r) * Hq + qh) * D + e] = L > 0 ? O[e] / L : 0.0;
        }
      }
    for (size_t i = 0; i < got.size(); ++i) ASSERT_TRUE(std::isfinite(got[i])) << "output " << i << " = " << got[i];
    const double err = rel_l2(got, want);
    // fp16 queries/centroids/probabilities inside the kernel (fp32 accumulation): see CUDA_NOTES.md.
    const double tol = rounded ? 2e-3 : 5e-3;
    EXPECT_LT(err, tol) << (rounded ? "vs fp16-rounded-input reference" : "vs exact reference");
    if (c.coded[0] == 0 && c.resid[0] == 0) {
      for (int i = 0; i < Hq * D; ++i) ASSERT_EQ(got[i], 0.0f) << "row with no tokens must give 0";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaPQAttention, ::testing::Range<size_t>(0, kKernels * std::size(kAttn)),
                         [](const auto& p) {
                           return std::string(kAttn[p.param / kKernels].name) + kKernelNames[p.param % kKernels];
                         });

TEST(CudaPQAttentionArgs, RejectsUnsupportedShapes) {
  cuda::PQAttnBatchArgs a;
  a.rows = 1, a.n_kv_heads = 1, a.group = 1, a.head_dim = 96;
  EXPECT_THROW(cuda::check_pq_attention_args(a), Error);
  a.head_dim = 128, a.k_sub_dim = 2;
  EXPECT_THROW(cuda::check_pq_attention_args(a), Error);
  a.k_sub_dim = 4, a.code_head_stride = 10;
  EXPECT_THROW(cuda::check_pq_attention_args(a), Error);
  a.code_head_stride = 16, a.kernel = static_cast<cuda::PQAttnKernel>(5);
  EXPECT_THROW(cuda::check_pq_attention_args(a), Error);
  a.kernel = cuda::PQAttnKernel::lut, a.head_dim = 256, a.k_sub_dim = 16;  // head_dim 256: 32 or 64 key sub-spaces
  EXPECT_THROW(cuda::check_pq_attention_args(a), Error);
  EXPECT_STREQ(cuda::pq_attn_kernel_name(cuda::PQAttnKernel::automatic), "auto");
}

// The decode dispatch (paged_attention_choose): which shapes it takes, what it says about the
// others, and split counts that fill whole waves of a 132-SM GPU. Host logic: runs without a GPU.
TEST(PagedDecodeChoice, SupportsTheSweepShapesAndNamesWhatItRefuses) {
  auto params = [](int rows, int H, int G, int D) {
    cuda::PagedAttnParams p{};
    p.rows = rows, p.n_kv_heads = H, p.group = G, p.head_dim = D;
    return p;
  };
  for (int G : {1, 2, 3, 4, 6, 7, 8, 16})
    for (int D : {64, 128, 256})
      for (int rows : {1, 4, 16, 64, 256}) {
        const cuda::PagedDecodeChoice c = cuda::paged_attention_choose(params(rows, 2, G, D), 132);
        ASSERT_TRUE(c.supported) << "G " << G << " D " << D << ": " << c.why_not;
        EXPECT_EQ(c.why_not, "");
        // at least one wave (with one resident block per SM: the count without a GPU), waves >= 85%
        // full, or past 2 splits per SM slot no more splits than that
        const int64_t blocks = int64_t(rows) * 2 * c.dense_splits;
        ASSERT_GE(c.dense_splits, 1);
        if (rows * 2 < 132) {
          EXPECT_GE(blocks, 132) << rows;
        }
        const int64_t waves = (blocks + 131) / 132;
        EXPECT_GE(double(blocks) / double(waves * 132), 0.85) << rows << " rows, " << c.dense_splits << " splits";
      }
  // Coded layers on the LUT kernel (one block per SM): one wave nearly full (at most 64 splits)
  // whatever the rows, KV heads, group (4 or 8 heads per block) and head_dim (two value parts at
  // 256 with per-sub-space books).
  for (int G : {1, 3, 4, 6, 8, 16})
    for (int D : {64, 128, 256})
      for (int H : {1, 2, 8})
        for (int rows : {1, 4, 16, 64}) {
          cuda::PagedAttnParams p = params(rows, H, G, D);
          p.rule.coded = true;
          p.k_sub_dim = 4, p.k_bits = 8, p.v_sub_dim = 4, p.v_bits = 8, p.k_per_subspace = p.v_per_subspace = true;
          const cuda::PagedDecodeChoice c = cuda::paged_attention_choose(p, 132);
          ASSERT_TRUE(c.supported) << c.why_not;
          ASSERT_EQ(c.coded, cuda::PQAttnKernel::lut) << "G " << G << " D " << D;
          const int heads_per_block = G > 4 && D <= 128 ? 8 : 4;
          const int64_t per = int64_t(rows) * H * ((G + heads_per_block - 1) / heads_per_block) * (D == 256 ? 2 : 1);
          const int64_t blocks = per * c.coded_splits;
          if (per <= 132) {  // at most one wave, and at most 64 splits
            EXPECT_LE(blocks, 132) << rows << " rows, H " << H << ", G " << G << ", D " << D;
            EXPECT_GT(blocks, std::min<int64_t>(132 - per, 63 * per)) << rows << " rows, H " << H << ", G " << G << ", D " << D;
            EXPECT_LE(c.coded_splits, 64);
          } else {
            EXPECT_EQ(c.coded_splits, 1);
          }
        }
  // A mixed step (decode rows, then prefill-tile rows): the decode kernels split as a decode
  // step of their rows alone would, not as one of all the step's rows (which left 8 decode rows
  // beside a 64-row chunk with 1 split: a fifth of the GPU's blocks).
  for (bool coded : {false, true})
    for (int decode : {1, 8, 32}) {
      cuda::PagedAttnParams alone = params(decode, 8, 4, 128), mixed = params(decode + 64, 8, 4, 128);
      mixed.decode_rows = decode;
      mixed.n_tiles = 2, mixed.tile_rows = 128;
      for (cuda::PagedAttnParams* q : {&alone, &mixed}) {
        q->rule.coded = coded;
        q->k_sub_dim = 4, q->k_bits = 8, q->v_sub_dim = 4, q->v_bits = 8;
      }
      const cuda::PagedDecodeChoice a = cuda::paged_attention_choose(alone, 132);
      const cuda::PagedDecodeChoice m = cuda::paged_attention_choose(mixed, 132);
      ASSERT_TRUE(a.supported && m.supported) << a.why_not << m.why_not;
      EXPECT_EQ(m.dense_splits, a.dense_splits) << decode << " decode rows, coded " << coded;
      EXPECT_EQ(m.coded_splits, a.coded_splits) << decode << " decode rows, coded " << coded;
      if (decode == 8 && !coded) {
        EXPECT_GT(m.dense_splits, 1);
      }
    }
  const cuda::PagedDecodeChoice g17 = cuda::paged_attention_choose(params(1, 2, 17, 128), 132);
  EXPECT_FALSE(g17.supported);
  EXPECT_NE(g17.why_not.find("group = 17"), std::string::npos) << g17.why_not;
  const cuda::PagedDecodeChoice d96 = cuda::paged_attention_choose(params(1, 2, 4, 96), 132);
  EXPECT_FALSE(d96.supported);
  EXPECT_NE(d96.why_not.find("head_dim = 96"), std::string::npos) << d96.why_not;
  cuda::PagedAttnParams odd = params(1, 2, 4, 128);
  odd.rule.block_tokens = 48;
  EXPECT_NE(cuda::paged_attention_unsupported_reason(odd).find("block_tokens = 48"), std::string::npos);
  cuda::PagedAttnParams plan_me = params(1, 2, 17, 128);
  EXPECT_THROW(cuda::paged_attention_plan(plan_me), Error);
}

// The prefill kernel's key splits (prefill_key_splits): the waves of blocks, in whole units'
// time, ceil(units s / slots) / s, with 1..16 splits; a count past 1 only where it gains more than
// 10%, and within 10% of the best count, e.g. a 2048-row chunk of Qwen2.5-1.5B (98 tiles of 21
// positions x 2 KV heads on 132 SMs: 1.48 waves of work in 2 waves) takes 2, a 512-row one (25 x 2)
// 5 (2 splits left 32 SMs idle). Host logic: runs without a GPU.
TEST(PagedPrefillSplits, FillTheLastWave) {
  const int sms = 132;
  EXPECT_EQ(cuda::detail::prefill_key_splits(98, 2, 128, sms), 2);
  EXPECT_EQ(cuda::detail::prefill_key_splits(25, 2, 128, sms), 5);
  EXPECT_EQ(cuda::detail::prefill_key_splits(16, 8, 128, sms), 1);  // 128 units: one wave already
  EXPECT_EQ(cuda::detail::prefill_key_splits(64, 8, 128, sms), 1);  // 512 units: 3.9 of 4 waves
  EXPECT_EQ(cuda::detail::prefill_key_splits(4, 8, 128, sms), 4);   // 32 units: one wave of 4 splits
  EXPECT_EQ(cuda::detail::prefill_key_splits(0, 8, 128, sms), 1);
  auto waves = [](int64_t units, int64_t slots, int s) { return double((units * s + slots - 1) / slots) / s; };
  for (int tile_rows : {64, 128})
    for (int H : {1, 2, 4, 8})
      for (int tiles = 1; tiles <= 600; ++tiles) {
        const int s = cuda::detail::prefill_key_splits(tiles, H, tile_rows, sms);
        const int64_t units = int64_t(tiles) * H, slots = int64_t(sms) * (tile_rows <= 64 ? 2 : 1);
        ASSERT_GE(s, 1);
        ASSERT_LE(s, 16);
        const double t = waves(units, slots, s);
        if (s > 1) {  // splits gain more than 10%
          EXPECT_LT(t, 0.9 * waves(units, slots, 1)) << tiles << " x " << H << ": " << s;
        }
        for (int o = 1; o <= 16; ++o)  // within 10% of the best count of 1..16
          EXPECT_GE(waves(units, slots, o), 0.9 * t - 1e-12) << tiles << " x " << H << ": " << s << " vs " << o;
      }
}

// The merge reads partials as float4: a workspace that is not 16-byte aligned is refused by name
// (host-side check, no GPU needed).
TEST(PagedDecodeChoice, RefusesAMisalignedWorkspace) {
  cuda::PagedAttnParams p{};
  p.rows = 1, p.decode_rows = 1, p.n_kv_heads = 2, p.group = 4, p.head_dim = 128;
  cuda::paged_attention_plan(p);
  alignas(16) static uint8_t dummy[64];
  std::vector<float> ws(cuda::paged_attention_workspace_bytes(p) / sizeof(float) + 8);
  p.pos = reinterpret_cast<const int32_t*>(dummy);
  p.dense_tables = reinterpret_cast<const uint8_t* const* const*>(dummy);
  p.q = reinterpret_cast<const float*>(dummy);
  p.out = dummy;
  const uintptr_t base = (reinterpret_cast<uintptr_t>(ws.data()) + 15) / 16 * 16;
  p.workspace = reinterpret_cast<void*>(base);
  p.workspace_bytes = ws.size() * sizeof(float) - 16;
  EXPECT_NO_THROW(cuda::check_paged_attention(p));
  p.workspace = reinterpret_cast<void*>(base + 4);
  try {
    cuda::check_paged_attention(p);
    ADD_FAILURE() << "a workspace at a 4-byte offset was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("16-byte aligned"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace vq::test
#endif
