// GPU products: activation quantization against the CPU's ActivationBuffer (bit-exact), the
// quantized GEMV (q8_0, q4_1, q4_K; 1..8 rows) against the CPU's quantized product matmul_q, and
// the cuBLAS GEMM against a double reference of its fp16/bf16 inputs. Shapes of the four
// reference models' projections; fresh random weights and activations; NaN-poisoned outputs.
#if defined(VQ_HAVE_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "cuda_test_util.h"
#include "cuda_weight_util.h"
#include "model/weight_formats.h"
#include "ops/cuda/device.h"
#include "ops/cuda/gemm_cuda.h"
#include "ops/cuda/gemv_cuda.h"
#include "ops/cuda/weights_cuda.h"

namespace vq::test {
namespace {

namespace g = cuda::ggml;

struct ActQ {
  cuda::DeviceBuffer q, d, s;
};
// Quantizes host rows x [m, cols] on the device; x given as f32 or rounded to f16 first.
ActQ quantize_on_device(const std::vector<float>& x, int m, int64_t cols, cuda::ElemType xt) {
  ActQ a{cuda::DeviceBuffer(size_t(m * cols)), cuda::DeviceBuffer(size_t(m * cols / 32) * 4),
         cuda::DeviceBuffer(size_t(m * cols / 32) * 4)};
  a.q.fill_bytes(0x7F), a.d.fill_bytes(0xFF), a.s.fill_bytes(0xFF);
  cuda::DeviceBuffer dx;
  if (xt == cuda::ElemType::f32) {
    dx = cuda::to_device(x.data(), x.size() * 4);
  } else {
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = f32_to_f16(x[i]);
    dx = cuda::to_device(h.data(), h.size() * 2);
  }
  cuda::QuantizeActParams p;
  p.rows = m, p.cols = cols, p.x_type = xt, p.x = dx.data(), p.q = a.q.as<int8_t>(), p.d = a.d.as<float>(),
  p.s = a.s.as<float>();
  cuda::quantize_act_device(p);
  cuda::device_synchronize();
  return a;
}

TEST(CudaQuantizeAct, BitExactWithCpuActivationBuffer) {
  VQ_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(31);
  std::normal_distribution<float> nd;
  for (const int64_t cols : {576, 640, 3072, 14336}) {
    for (cuda::ElemType xt : {cuda::ElemType::f32, cuda::ElemType::f16}) {
      const int m = 5;
      std::vector<float> x(size_t(m * cols));
      for (auto& v : x) v = nd(rng) * 3.0f;
      for (int i = 0; i < 32; ++i) x[size_t(64 + i)] = 0.0f;  // an all-zero block: d = 0, q = 0
      x[200] = 1e-30f;
      if (xt == cuda::ElemType::f16)
        for (auto& v : x) v = round_f16(v);
      const ActQ a = quantize_on_device(x, m, cols, xt);
      ActivationBuffer cpu;
      const QuantizedRows& r = cpu.quantize(x.data(), m, cols);
      std::vector<int8_t> q(size_t(m * cols));
      std::vector<float> d(size_t(m * cols / 32)), s(d.size());
      a.q.download(q.data(), q.size()), a.d.download(d.data(), d.size() * 4), a.s.download(s.data(), s.size() * 4);
      for (size_t i = 0; i < q.size(); ++i) ASSERT_EQ(q[i], r.q[i]) << "cols " << cols << " q " << i;
      for (size_t i = 0; i < d.size(); ++i) {
        ASSERT_EQ(f32_bits(d[i]), f32_bits(r.d[i])) << "cols " << cols << " d " << i;
        ASSERT_EQ(f32_bits(s[i]), f32_bits(r.s[i])) << "cols " << cols << " s " << i;
      }
    }
  }
}

struct GemvCase {
  const char* name;
  uint32_t type;
  int64_t rows, cols;
};
const GemvCase kGemv[] = {
    {"q8_0_smollm_wk", g::Q8_0, 192, 576},          {"q8_0_gemma_wq", g::Q8_0, 1024, 640},
    {"q8_0_falcon_wk", g::Q8_0, 1024, 3072},        {"q8_0_llama_down", g::Q8_0, 4096, 14336},
    {"q4_1_smollm_wk", g::Q4_1, 192, 576},          {"q4_1_smollm_down", g::Q4_1, 576, 1536},
    {"q4_1_gemma_wk", g::Q4_1, 256, 640},           {"q4_1_llama_gate", g::Q4_1, 14336, 4096},
    {"q4_K_smollm_down", g::Q4_K, 576, 1536},       {"q4_K_llama_wk", g::Q4_K, 1024, 4096},
    {"q4_K_falcon_gate", g::Q4_K, 23040, 3072},     {"q4_K_llama_down", g::Q4_K, 4096, 14336},
    {"q4_K_odd_rows", g::Q4_K, 37, 512},
};

class CudaGemv : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaGemv, MatchesCpuQuantizedProduct) {
  VQ_SKIP_WITHOUT_CUDA();
  const GemvCase& c = kGemv[GetParam()];
  std::mt19937 rng(500 + unsigned(GetParam()));
  std::normal_distribution<float> nd;
  const std::vector<uint8_t> w = random_weight_rows(c.type, c.rows, c.cols, rng);
  cuda::DeviceBuffer raw = cuda::to_device(w.data(), w.size());
  cuda::DeviceBuffer packed(cuda::gemv_packed_bytes(c.type, c.rows, c.cols));
  packed.fill_bytes(0xAB);
  cuda::GemvPackParams pk;
  pk.type = c.type, pk.src = raw.data(), pk.rows = c.rows, pk.cols = c.cols, pk.dst = packed.data();
  cuda::gemv_pack_device(pk);
  for (const int m : {1, 2, 3, 5, 8}) {
    std::vector<float> x(size_t(m * c.cols));
    for (auto& v : x) v = nd(rng);
    ActivationBuffer cpu;
    const QuantizedRows& xr = cpu.quantize(x.data(), m, c.cols);
    std::vector<float> want(size_t(m * c.rows));
    matmul_q(GGMLType(c.type), w.data(), c.rows, c.cols, xr, want.data());
    const ActQ a = quantize_on_device(x, m, c.cols, cuda::ElemType::f32);
    // y rows with a gap (y_stride > rows) that must stay untouched
    const int64_t ys = c.rows + 5;
    cuda::DeviceBuffer y(size_t(m * ys) * 4);
    for (int pass = 0; pass < 2; ++pass) {
      std::vector<float> y0(size_t(m * ys), 0.0f);
      if (pass == 0) {
        y.fill_bytes(0xFF);
      } else {  // accumulate into random y0
        for (auto& v : y0) v = nd(rng);
        y.upload(y0.data(), y0.size() * 4);
      }
      cuda::GemvParams p;
      p.type = c.type, p.w = packed.data(), p.rows = c.rows, p.cols = c.cols, p.m = m;
      p.xq = a.q.as<int8_t>(), p.xd = a.d.as<float>(), p.xs = a.s.as<float>();
      p.y = y.as<float>(), p.y_stride = ys, p.accumulate = pass == 1;
      cuda::gemv_device(p);
      cuda::device_synchronize();
      std::vector<float> got(size_t(m * ys));
      y.download(got.data(), got.size() * 4);
      double num = 0, den = 0, rms = 0;
      for (int i = 0; i < m; ++i)
        for (int64_t r = 0; r < c.rows; ++r) rms += double(want[size_t(i * c.rows + r)]) * want[size_t(i * c.rows + r)];
      rms = std::sqrt(rms / double(m * c.rows));
      for (int i = 0; i < m; ++i)
        for (int64_t r = 0; r < ys; ++r) {
          const float gv = got[size_t(i * ys + r)];
          if (r >= c.rows) {
            if (pass == 0) {
              ASSERT_EQ(f32_bits(gv), 0xFFFFFFFFu) << "gap written at m=" << i << " r=" << r;
            }
            continue;
          }
          ASSERT_TRUE(std::isfinite(gv)) << c.name << " m=" << m << " row " << r;
          const double wv = double(want[size_t(i * c.rows + r)]) + (pass ? y0[size_t(i * ys + r)] : 0.0);
          ASSERT_LE(std::fabs(gv - wv), 2e-5 * rms + 1e-6 * std::fabs(wv))
              << c.name << " m=" << m << " row " << r << (pass ? " (accumulate)" : "");
          num += (gv - wv) * (gv - wv), den += wv * wv;
        }
      EXPECT_LT(std::sqrt(num / std::max(den, 1e-30)), 2e-6) << c.name << " m=" << m;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemv, ::testing::Range<size_t>(0, std::size(kGemv)),
                         [](const auto& p) { return std::string(kGemv[p.param].name); });

// The deterministic mode's GEMVs: with row_invariant (quantized) and always (fp16), each row's
// result is bit-identical for every m, the row alone or among others.
TEST(CudaGemvInvariant, RowsAreBitIdenticalForEveryM) {
  VQ_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(321);
  std::normal_distribution<float> nd;
  const int64_t rows = 300, cols = 1024;
  std::vector<float> x(size_t(cuda::kGemvMaxRows * cols));
  for (auto& v : x) v = nd(rng);
  const ActQ a = quantize_on_device(x, cuda::kGemvMaxRows, cols, cuda::ElemType::f32);
  for (const uint32_t type : {uint32_t(cuda::ggml::Q8_0), uint32_t(cuda::ggml::Q4_1), uint32_t(cuda::ggml::Q4_K)}) {
    const std::vector<uint8_t> w = random_weight_rows(type, rows, cols, rng);
    cuda::DeviceBuffer raw = cuda::to_device(w.data(), w.size());
    cuda::DeviceBuffer packed(cuda::gemv_packed_bytes(type, rows, cols));
    cuda::GemvPackParams pk;
    pk.type = type, pk.src = raw.data(), pk.rows = rows, pk.cols = cols, pk.dst = packed.data();
    cuda::gemv_pack_device(pk);
    cuda::DeviceBuffer y(size_t(cuda::kGemvMaxRows * rows) * 4);
    auto run = [&](int r0, int m) {
      cuda::GemvParams p;
      p.type = type, p.w = packed.data(), p.rows = rows, p.cols = cols, p.m = m;
      p.xq = a.q.as<int8_t>() + size_t(r0) * cols, p.xd = a.d.as<float>() + size_t(r0) * (cols / 32);
      p.xs = a.s.as<float>() + size_t(r0) * (cols / 32);
      p.y = y.as<float>(), p.row_invariant = true;
      cuda::gemv_device(p);
      std::vector<float> got(size_t(m * rows));
      y.download(got.data(), got.size() * 4);
      return got;
    };
    const std::vector<float> all = run(0, cuda::kGemvMaxRows);
    for (int m = 1; m < cuda::kGemvMaxRows; ++m)
      for (int r0 : {0, cuda::kGemvMaxRows - m}) {
        const std::vector<float> part = run(r0, m);
        ASSERT_EQ(std::memcmp(part.data(), all.data() + size_t(r0) * rows, part.size() * 4), 0)
            << cuda::weight_type_name(type) << ": rows " << r0 << ".." << r0 + m - 1 << " with m = " << m;
      }
  }
  std::vector<uint16_t> w16(size_t(rows * cols));
  for (auto& v : w16) v = f32_to_f16(nd(rng) * 0.05f);
  cuda::DeviceBuffer dw = cuda::to_device(w16.data(), w16.size() * 2), dx = cuda::to_device(x.data(), x.size() * 4);
  cuda::DeviceBuffer y(size_t(cuda::kGemvF16MaxRows * rows) * 4);
  auto run16 = [&](int r0, int m) {
    cuda::GemvF16Params p;
    p.w = dw.data(), p.rows = rows, p.cols = cols, p.m = m, p.x = dx.as<float>() + size_t(r0) * cols;
    p.y = y.as<float>();
    cuda::gemv_f16_device(p);
    std::vector<float> got(size_t(m * rows));
    y.download(got.data(), got.size() * 4);
    return got;
  };
  const std::vector<float> all16 = run16(0, cuda::kGemvF16MaxRows);
  for (int m = 1; m < cuda::kGemvF16MaxRows; ++m) {
    const std::vector<float> part = run16(cuda::kGemvF16MaxRows - m, m);
    ASSERT_EQ(std::memcmp(part.data(), all16.data() + size_t(cuda::kGemvF16MaxRows - m) * rows, part.size() * 4), 0)
        << "fp16 GEMV m = " << m;
  }
}

TEST(CudaGemvArgs, RejectsBadArguments) {
  EXPECT_FALSE(cuda::gemv_type_supported(g::Q6_K));
  EXPECT_THROW(cuda::gemv_packed_bytes(g::Q6_K, 4, 256), Error);
  EXPECT_THROW(cuda::gemv_packed_bytes(g::Q4_K, 4, 576), Error);
  EXPECT_EQ(cuda::gemv_packed_bytes(g::Q8_0, 3, 64), size_t(3 * 68));
  EXPECT_TRUE(cuda::gemv_preferred(g::Q8_0, 1) && cuda::gemv_preferred(g::Q4_1, 4) && cuda::gemv_preferred(g::Q4_K, 2));
  EXPECT_FALSE(cuda::gemv_preferred(g::Q8_0, 8) || cuda::gemv_preferred(g::Q4_K, 4) || cuda::gemv_preferred(g::Q6_K, 1));
  cuda::GemvParams p;
  p.type = g::Q8_0, p.rows = 4, p.cols = 64, p.m = 9;
  EXPECT_THROW(cuda::gemv_device(p), Error);
}

struct GemmCase {
  const char* name;
  int64_t m, n, k;
  cuda::ElemType ab, y;
  bool accumulate;
  int64_t ldy_pad;
};
const GemmCase kGemm[] = {
    {"smollm_m1", 1, 576, 576, cuda::ElemType::f16, cuda::ElemType::f32, false, 0},
    {"llama_wk_m8", 8, 1024, 4096, cuda::ElemType::f16, cuda::ElemType::f32, false, 0},
    {"falcon_m77_bf16_acc", 77, 3072, 3072, cuda::ElemType::bf16, cuda::ElemType::f32, true, 0},
    {"gemma_m512_f16out", 512, 640, 640, cuda::ElemType::f16, cuda::ElemType::f16, false, 0},
    {"llama_gate_m300", 300, 14336, 4096, cuda::ElemType::f16, cuda::ElemType::f32, false, 0},
    {"gemma_kv_m33_bf16out_ldy", 33, 256, 640, cuda::ElemType::bf16, cuda::ElemType::bf16, false, 16},
    {"llama_down_m8_acc_ldy", 8, 4096, 14336, cuda::ElemType::f16, cuda::ElemType::f32, true, 4},
};

uint16_t to_bits(float v, cuda::ElemType t) { return t == cuda::ElemType::f16 ? f32_to_f16(v) : f32_to_bf16(v); }
float from_bits(uint16_t b, cuda::ElemType t) { return t == cuda::ElemType::f16 ? f16_to_f32(b) : bf16_to_f32(b); }

class CudaGemm : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaGemm, MatchesDoubleReference) {
  VQ_SKIP_WITHOUT_CUDA();
  const GemmCase& c = kGemm[GetParam()];
  std::mt19937 rng(900 + unsigned(GetParam()));
  std::normal_distribution<float> nd;
  std::vector<uint16_t> w(size_t(c.n * c.k)), x(size_t(c.m * c.k));
  for (auto& v : w) v = to_bits(nd(rng) * 0.05f, c.ab);
  for (auto& v : x) v = to_bits(nd(rng), c.ab);
  const int64_t ldy = c.n + c.ldy_pad;
  const size_t yb = cuda::elem_bytes(c.y);
  std::vector<float> y0(size_t(c.m * ldy), 0.0f);
  cuda::DeviceBuffer dw = cuda::to_device(w.data(), w.size() * 2), dx = cuda::to_device(x.data(), x.size() * 2);
  cuda::DeviceBuffer dy(size_t(c.m * ldy) * yb);
  dy.fill_bytes(0xFF);
  if (c.accumulate) {
    for (auto& v : y0) v = nd(rng);
    dy.upload(y0.data(), y0.size() * 4);  // accumulate cases use f32 y
  }
  cuda::GemmHandle h;
  cuda::GemmParams p;
  p.m = c.m, p.n = c.n, p.k = c.k, p.ab_type = c.ab, p.w = dw.data(), p.x = dx.data();
  p.y_type = c.y, p.y = dy.data(), p.ldy = ldy, p.accumulate = c.accumulate;
  cuda::gemm_device(h, p);
  cuda::device_synchronize();
  std::vector<float> got(size_t(c.m * ldy));
  if (c.y == cuda::ElemType::f32) {
    dy.download(got.data(), got.size() * 4);
  } else {
    std::vector<uint16_t> gb(got.size());
    dy.download(gb.data(), gb.size() * 2);
    for (size_t i = 0; i < gb.size(); ++i) got[i] = gb[i] == 0xFFFF ? NAN : from_bits(gb[i], c.y);
  }
  // Gap columns untouched; a sample of entries (all of them on small shapes) against double.
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = c.n; j < ldy; ++j)
      if (!c.accumulate) {
        ASSERT_TRUE(std::isnan(got[size_t(i * ldy + j)])) << "gap written";
      }
  const int64_t total = c.m * c.n, samples = std::min<int64_t>(total, 6000);
  for (int64_t s = 0; s < samples; ++s) {
    const int64_t e = samples == total ? s : int64_t(rng() % uint64_t(total));
    const int64_t i = e / c.n, j = e % c.n;
    double ref = 0, mag = 0;
    for (int64_t kk = 0; kk < c.k; ++kk) {
      const double t = double(from_bits(x[size_t(i * c.k + kk)], c.ab)) * from_bits(w[size_t(j * c.k + kk)], c.ab);
      ref += t, mag += std::fabs(t);
    }
    if (c.accumulate) ref += y0[size_t(i * ldy + j)], mag += std::fabs(y0[size_t(i * ldy + j)]);
    const double tol = 1e-5 * mag + (c.y == cuda::ElemType::f32 ? 0.0 : (c.y == cuda::ElemType::f16 ? 1e-3 : 8e-3) * std::fabs(ref));
    ASSERT_LE(std::fabs(got[size_t(i * ldy + j)] - ref), tol + 1e-6) << c.name << " y[" << i << ", " << j << "]";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaGemm, ::testing::Range<size_t>(0, std::size(kGemm)),
                         [](const auto& p) { return std::string(kGemm[p.param].name); });

// The batch-invariant product: against double within fp32-accumulation error, and every row
// bit-identical whether computed alone, in a small call, or in any larger one (each tile shape,
// rows at any offset of the tile, edge columns, k not a multiple of 32, accumulate and f16 out).
TEST(CudaGemmInvariant, RowsAreBitIdenticalWhateverElseTheCallHolds) {
  VQ_SKIP_WITHOUT_CUDA();
  for (const auto& [n, k] : {std::pair<int, int>{200, 72}, {960, 576}, {1000, 2056}}) {
    const int M = 300;
    std::mt19937 rng(77 + unsigned(n));
    std::normal_distribution<float> nd;
    std::vector<uint16_t> w(size_t(n) * k), x(size_t(M) * k);
    for (auto& v : w) v = f32_to_f16(nd(rng) * 0.05f);
    for (auto& v : x) v = f32_to_f16(nd(rng));
    std::vector<float> y0(size_t(M) * n);
    for (auto& v : y0) v = nd(rng);
    cuda::DeviceBuffer dw = cuda::to_device(w.data(), w.size() * 2), dx = cuda::to_device(x.data(), x.size() * 2);
    cuda::DeviceBuffer dy(y0.size() * 4);
    for (const bool acc : {false, true}) {
      // One call over rows [r0, r0 + m) into y rows [r0, r0 + m).
      auto run = [&](int r0, int m) {
        if (acc) dy.upload(y0.data(), y0.size() * 4);
        else dy.fill_bytes(0);
        cuda::GemmParams p;
        p.m = m, p.n = n, p.k = k, p.w = dw.data();
        p.x = static_cast<const uint16_t*>(dx.data()) + size_t(r0) * k;
        p.y = dy.as<float>() + size_t(r0) * n;
        p.accumulate = acc;
        cuda::gemm_invariant_device(p);
        cuda::device_synchronize();
        std::vector<float> y(size_t(m) * n);
        dy.download(y.data(), y.size() * 4, size_t(r0) * n * 4);
        return y;
      };
      const std::vector<float> all = run(0, M);  // the 128-row tiles
      for (int i = 0; i < M; i += 37) {  // against double
        for (int j = 0; j < n; j += 7) {
          double ref = acc ? y0[size_t(i) * n + j] : 0.0, mag = std::fabs(ref);
          for (int kk = 0; kk < k; ++kk) {
            const double t = double(f16_to_f32(x[size_t(i) * k + kk])) * f16_to_f32(w[size_t(j) * k + kk]);
            ref += t, mag += std::fabs(t);
          }
          ASSERT_LE(std::fabs(all[size_t(i) * n + j] - ref), 1e-5 * mag + 1e-6) << n << "x" << k << " y[" << i << "," << j << "]";
        }
      }
      std::set<int> tiles;
      for (const auto& [r0, m] : {std::pair<int, int>{0, 1}, {5, 1}, {299, 1}, {3, 8}, {17, 16}, {40, 17}, {100, 64},
                                 {1, 65}, {130, 129}, {64, 236}}) {
        tiles.insert(cuda::gemm_invariant_tile_rows(m));
        const std::vector<float> part = run(r0, m);
        ASSERT_EQ(std::memcmp(part.data(), all.data() + size_t(r0) * n, part.size() * 4), 0)
            << n << "x" << k << (acc ? " accumulate" : "") << ": rows " << r0 << ".." << r0 + m - 1
            << " alone differ from the same rows in a call of " << M;
      }
      EXPECT_EQ(tiles.size(), 3u) << "every tile shape exercised";
    }
  }
  // f16 output: the same rounding of the same sums.
  {
    const int n = 136, k = 64, M = 70;
    std::vector<uint16_t> w(size_t(n) * k, f32_to_f16(0.01f)), x(size_t(M) * k);
    std::mt19937 rng(5);
    std::normal_distribution<float> nd;
    for (auto& v : x) v = f32_to_f16(nd(rng));
    cuda::DeviceBuffer dw = cuda::to_device(w.data(), w.size() * 2), dx = cuda::to_device(x.data(), x.size() * 2);
    cuda::DeviceBuffer dy(size_t(M) * n * 2);
    auto run = [&](int m) {
      cuda::GemmParams p;
      p.m = m, p.n = n, p.k = k, p.w = dw.data(), p.x = dx.data(), p.y = dy.data(), p.y_type = cuda::ElemType::f16;
      cuda::gemm_invariant_device(p);
      std::vector<uint16_t> y(static_cast<size_t>(n));
      dy.download(y.data(), y.size() * 2);
      return y;
    };
    EXPECT_EQ(run(1), run(M));
  }
}

TEST(CudaGemmInvariant, RefusesWhatItCannotRunWithOneLine) {
  VQ_SKIP_WITHOUT_CUDA();
  cuda::DeviceBuffer b(1 << 16);
  cuda::GemmParams p;
  p.m = 2, p.n = 8, p.k = 12, p.w = b.data(), p.x = b.data(), p.y = b.data();
  try {
    cuda::gemm_invariant_device(p);
    ADD_FAILURE() << "k = 12 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("multiples of 8"), std::string::npos) << e.what();
  }
  p.k = 16;
  p.ab_type = cuda::ElemType::bf16;
  EXPECT_THROW(cuda::gemm_invariant_device(p), Error);
}

}  // namespace
}  // namespace vq::test
#endif
