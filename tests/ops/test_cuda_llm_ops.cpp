// GPU forward-pass ops against the CPU forward's own functions (model/layers.h): RMSNorm (whole
// rows and per head, fused residual add, f32 / f16 / bf16 out), RoPE (normal and NeoX, partial
// rotation, positions up to 128k, fused q/k buffers), SwiGLU and tanh-GELU, residual add and
// casts. Shapes of SmolLM2-135M, Llama-3.1-8B, Falcon3-7B and gemma3-270m; fresh random inputs;
// outputs NaN-poisoned, with gaps between rows that must stay untouched.
#if defined(VQ_HAVE_CUDA)
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "cuda_test_util.h"
#include "cuda_weight_util.h"
#include "model/layers.h"
#include "ops/cuda/device.h"
#include "ops/cuda/llm_ops_cuda.h"

namespace vq::test {
namespace {

using cuda::ElemType;

struct Geometry {
  const char* name;
  int n_embd, n_heads, n_kv_heads, head_dim, n_ff;
};
const Geometry kGeo[] = {
    {"smollm2_135m", 576, 9, 3, 64, 1536},
    {"llama31_8b", 4096, 32, 8, 128, 14336},
    {"falcon3_7b", 3072, 12, 4, 256, 23040},
    {"gemma3_270m", 640, 4, 1, 256, 2048},
};

// Output element i of a device buffer of type t as float (NaN for the all-ones poison pattern).
std::vector<float> download_as_f32(const cuda::DeviceBuffer& b, ElemType t, size_t n) {
  std::vector<float> out(n);
  if (t == ElemType::f32) {
    b.download(out.data(), n * 4);
    return out;
  }
  std::vector<uint16_t> h(n);
  b.download(h.data(), n * 2);
  for (size_t i = 0; i < n; ++i) out[i] = h[i] == 0xFFFF ? NAN : (t == ElemType::f16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]));
  return out;
}
float round_to(float v, ElemType t) {
  return t == ElemType::f32 ? v : t == ElemType::f16 ? f16_to_f32(f32_to_f16(v)) : bf16_to_f32(f32_to_bf16(v));
}
// Tolerance of a device result against the CPU's fp32 result `want`, both rounded to t.
double tol_for(ElemType t, float want, double rel32) {
  const double a = std::fabs(want);
  return t == ElemType::f32 ? rel32 * a + 1e-30 : t == ElemType::f16 ? 1e-3 * a + 1e-7 : 8e-3 * a + 1e-30;
}

class CudaRmsNorm : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaRmsNorm, MatchesCpuRmsNorm) {
  VQ_SKIP_WITHOUT_CUDA();
  const Geometry& geo = kGeo[GetParam()];
  std::mt19937 rng(40 + unsigned(GetParam()));
  std::normal_distribution<float> nd;
  struct Form {
    int n_heads, n;
    bool add;
    ElemType out;
  };
  // whole rows (attn / ffn norm, f16 out for the GEMM, fused residual add), per-head q / k norms,
  // and an odd width
  const Form forms[] = {{1, geo.n_embd, false, ElemType::f32}, {1, geo.n_embd, true, ElemType::f16},
                        {1, geo.n_embd, true, ElemType::bf16}, {geo.n_heads, geo.head_dim, false, ElemType::f32},
                        {geo.n_kv_heads, geo.head_dim, true, ElemType::f16},
                        {3, 33, true, ElemType::f32}};  // a width not divisible by 4: the scalar path
  for (const Form& f : forms)
    for (const int T : {1, 7, 130}) {
      const int64_t row = int64_t(f.n_heads) * f.n, xs = row + 4, os = row + 8;  // strided rows
      std::vector<float> x(size_t(T * xs)), add(x.size()), w(size_t(f.n));
      for (auto& v : x) v = nd(rng) * 2.0f;
      for (auto& v : add) v = nd(rng);
      for (auto& v : w) v = 1.0f + 0.1f * nd(rng);
      cuda::DeviceBuffer dx = cuda::to_device(x.data(), x.size() * 4), da = cuda::to_device(add.data(), add.size() * 4);
      cuda::DeviceBuffer dw = cuda::to_device(w.data(), w.size() * 4), dsum(x.size() * 4);
      cuda::DeviceBuffer dout(size_t(T * os) * cuda::elem_bytes(f.out));
      dout.fill_bytes(0xFF), dsum.fill_bytes(0xFF);
      cuda::RmsNormParams p;
      p.n_tokens = T, p.n_heads = f.n_heads, p.n = f.n, p.x = dx.as<float>(), p.x_stride = xs, p.w = dw.as<float>();
      p.eps = 1e-6f, p.out_type = f.out, p.out = dout.data(), p.out_stride = os;
      if (f.add) p.add = da.as<float>(), p.sum_out = dsum.as<float>();
      cuda::rms_norm_device(p);
      cuda::device_synchronize();
      const std::vector<float> got = download_as_f32(dout, f.out, size_t(T * os));
      std::vector<float> sum(x.size());
      dsum.download(sum.data(), sum.size() * 4);
      for (int t = 0; t < T; ++t)
        for (int h = 0; h < f.n_heads; ++h) {
          std::vector<float> in(size_t(f.n)), want(size_t(f.n));
          for (int i = 0; i < f.n; ++i) {
            const size_t xi = size_t(t * xs + h * f.n + i);
            in[size_t(i)] = f.add ? x[xi] + add[xi] : x[xi];
            if (f.add) {
              ASSERT_EQ(f32_bits(sum[xi]), f32_bits(in[size_t(i)])) << "sum_out";
            }
          }
          rms_norm(in.data(), w.data(), want.data(), f.n, 1e-6f);
          for (int i = 0; i < f.n; ++i) {
            const float gv = got[size_t(t * os + h * f.n + i)], wv = round_to(want[size_t(i)], f.out);
            ASSERT_LE(std::fabs(gv - wv), tol_for(f.out, wv, 2e-6))
                << geo.name << " heads " << f.n_heads << " n " << f.n << " T " << T << " t " << t << " h " << h << " i " << i;
          }
        }
      for (int t = 0; t < T; ++t)
        for (int64_t i = row; i < os; ++i) ASSERT_TRUE(std::isnan(got[size_t(t * os + i)])) << "gap written";
    }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaRmsNorm, ::testing::Range<size_t>(0, std::size(kGeo)),
                         [](const auto& p) { return std::string(kGeo[p.param].name); });

// Inverse frequencies as Model::rope_inv_freqs gives them: theta^(-2i/n_rot), here with a
// llama3-like division of the low frequencies for one case.
std::vector<double> inv_freqs(int n_rot, double theta, bool scaled) {
  std::vector<double> f(size_t(n_rot / 2));
  for (int i = 0; i < n_rot / 2; ++i) {
    f[size_t(i)] = std::pow(theta, -2.0 * i / n_rot);
    if (scaled && i > n_rot / 4) f[size_t(i)] /= 8.0;
  }
  return f;
}

class CudaRope : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaRope, MatchesCpuRopeApply) {
  VQ_SKIP_WITHOUT_CUDA();
  const Geometry& geo = kGeo[GetParam()];
  std::mt19937 rng(60 + unsigned(GetParam()));
  std::normal_distribution<float> nd;
  const int D = geo.head_dim, Hq = geo.n_heads, Hk = geo.n_kv_heads;
  struct Form {
    bool neox;
    int n_rot;
    double theta;
    bool scaled;
  };
  const Form forms[] = {{false, D, 10000.0, false}, {true, D, 1e6, false}, {false, D, 500000.0, true}, {true, D / 2, 10000.0, false}};
  for (const Form& f : forms) {
    // Positions: the ends of a 128k context and random ones. q, k, v in one fused row per token
    // (as a fused qkv projection writes them): q at 0, k at Hq*D, row stride (Hq + 2 Hk) * D.
    std::vector<int32_t> pos = {0, 1, 2, 4095, 131071, 131072};
    for (int i = 0; i < 40; ++i) pos.push_back(int32_t(rng() % 131072));
    const int T = int(pos.size());
    const int64_t stride = int64_t(Hq + 2 * Hk) * D;
    std::vector<float> qkv(size_t(T * stride));
    for (auto& v : qkv) v = nd(rng);
    const std::vector<double> fr = inv_freqs(f.n_rot, f.theta, f.scaled);
    cuda::DeviceBuffer dq = cuda::to_device(qkv.data(), qkv.size() * 4), dp = cuda::to_device(pos.data(), pos.size() * 4);
    cuda::DeviceBuffer df = cuda::to_device(fr.data(), fr.size() * 8);
    cuda::RopeParams p;
    p.n_tokens = T, p.head_dim = D, p.n_rot = f.n_rot, p.neox = f.neox, p.pos = dp.as<int32_t>(), p.inv_freq = df.as<double>();
    p.q = dq.as<float>(), p.n_q_heads = Hq, p.q_stride = stride;
    p.k = dq.as<float>() + int64_t(Hq) * D, p.n_k_heads = Hk, p.k_stride = stride;
    cuda::rope_device(p);
    cuda::device_synchronize();
    std::vector<float> got(qkv.size());
    dq.download(got.data(), got.size() * 4);
    // CPU: cos/sin from the double angle, then rope_apply (as Session::forward_chunk does)
    std::vector<float> want = qkv, c(size_t(f.n_rot / 2)), s(c.size());
    int64_t exact = 0, total = 0;
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < f.n_rot / 2; ++i) {
        c[size_t(i)] = float(std::cos(double(pos[size_t(t)]) * fr[size_t(i)]));
        s[size_t(i)] = float(std::sin(double(pos[size_t(t)]) * fr[size_t(i)]));
      }
      rope_apply(want.data() + t * stride, Hq, D, f.n_rot, c.data(), s.data(), f.neox);
      rope_apply(want.data() + t * stride + int64_t(Hq) * D, Hk, D, f.n_rot, c.data(), s.data(), f.neox);
      for (int64_t i = 0; i < stride; ++i) {
        const float gv = got[size_t(t * stride + i)], wv = want[size_t(t * stride + i)];
        if (i >= int64_t(Hq + Hk) * D) {  // v: untouched
          ASSERT_EQ(f32_bits(gv), f32_bits(wv)) << "v written";
          continue;
        }
        // cos/sin may differ in the last float bit where the double values lie next to a
        // rounding boundary; the rotation is otherwise the same fp32 arithmetic.
        ASSERT_LE(std::fabs(gv - wv), 4e-7 * 4.0 + 1e-6 * std::fabs(wv))
            << geo.name << (f.neox ? " neox" : " normal") << " n_rot " << f.n_rot << " pos " << pos[size_t(t)] << " i " << i;
        exact += f32_bits(gv) == f32_bits(wv), ++total;
      }
    }
    EXPECT_GE(double(exact) / double(total), 0.999) << "bit-equal fraction";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaRope, ::testing::Range<size_t>(0, std::size(kGeo)),
                         [](const auto& p) { return std::string(kGeo[p.param].name); });

class CudaGlu : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaGlu, SwigluMatchesCpuAndGeluMatchesDouble) {
  VQ_SKIP_WITHOUT_CUDA();
  const Geometry& geo = kGeo[GetParam()];
  std::mt19937 rng(80 + unsigned(GetParam()));
  std::normal_distribution<float> nd;
  const int F = geo.n_ff;
  for (const auto kind : {cuda::GluKind::swiglu, cuda::GluKind::gelu_tanh})
    for (const ElemType ot : {ElemType::f32, ElemType::f16})
      for (const int T : {1, 9}) {
        // gate and up as the two halves of one fused [T, 2F] projection output
        std::vector<float> gu(size_t(T) * 2 * F);
        for (auto& v : gu) v = nd(rng) * 3.0f;
        gu[0] = -100.0f, gu[1] = 100.0f;  // exp overflow / saturation
        const int64_t os = F + 4;
        cuda::DeviceBuffer dgu = cuda::to_device(gu.data(), gu.size() * 4), dout(size_t(T * os) * cuda::elem_bytes(ot));
        dout.fill_bytes(0xFF);
        cuda::GluParams p;
        p.kind = kind, p.n_tokens = T, p.n = F, p.gate = dgu.as<float>(), p.gate_stride = 2 * F;
        p.up = dgu.as<float>() + F, p.up_stride = 2 * F, p.out_type = ot, p.out = dout.data(), p.out_stride = os;
        cuda::glu_device(p);
        cuda::device_synchronize();
        const std::vector<float> got = download_as_f32(dout, ot, size_t(T * os));
        for (int t = 0; t < T; ++t) {
          const float* gt = gu.data() + size_t(t) * 2 * F;
          std::vector<float> want(static_cast<size_t>(F));
          if (kind == cuda::GluKind::swiglu) {
            silu_mul(gt, gt + F, want.data(), F);
          } else {
            for (int i = 0; i < F; ++i) {
              const double gd = gt[i];
              want[size_t(i)] = float(0.5 * gd * (1.0 + std::tanh(0.7978845608028654 * (gd + 0.044715 * gd * gd * gd))) * gt[F + i]);
            }
          }
          for (int i = 0; i < F; ++i) {
            const float gv = got[size_t(t * os + i)], wv = round_to(want[size_t(i)], ot);
            ASSERT_LE(std::fabs(gv - wv), tol_for(ot, wv, kind == cuda::GluKind::swiglu ? 2e-6 : 2e-5) + 1e-6)
                << geo.name << (kind == cuda::GluKind::swiglu ? " swiglu" : " gelu") << " t " << t << " i " << i
                << " gate " << gt[i] << " up " << gt[F + i];
          }
          for (int64_t i = F; i < os; ++i) ASSERT_TRUE(std::isnan(got[size_t(t * os + i)])) << "gap written";
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaGlu, ::testing::Range<size_t>(0, std::size(kGeo)),
                         [](const auto& p) { return std::string(kGeo[p.param].name); });

TEST(CudaAddCast, AddIsExactAndCastRoundsToNearestEven) {
  VQ_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(99);
  std::normal_distribution<float> nd;
  for (const int n : {576, 4096, 3075}) {  // 3075: the scalar path
    const int T = 5;
    std::vector<float> x(size_t(T * n)), y(x.size());
    for (auto& v : x) v = nd(rng);
    for (auto& v : y) v = nd(rng) * 1e-3f;
    cuda::DeviceBuffer dx = cuda::to_device(x.data(), x.size() * 4), dy = cuda::to_device(y.data(), y.size() * 4);
    cuda::AddParams a;
    a.n_tokens = T, a.n = n, a.x = dx.as<float>(), a.y = dy.as<float>();
    cuda::add_device(a);
    std::vector<float> got(x.size());
    dx.download(got.data(), got.size() * 4);
    for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(f32_bits(got[i]), f32_bits(x[i] + y[i])) << "add " << i;
    for (const ElemType ot : {ElemType::f16, ElemType::bf16}) {
      cuda::DeviceBuffer dout(x.size() * 2);
      dout.fill_bytes(0xFF);
      cuda::CastParams c;
      c.n_tokens = T, c.n = n, c.x = dy.as<float>(), c.out_type = ot, c.out = dout.data();
      cuda::cast_device(c);
      std::vector<uint16_t> h(x.size());
      dout.download(h.data(), h.size() * 2);
      for (size_t i = 0; i < h.size(); ++i)
        ASSERT_EQ(h[i], ot == ElemType::f16 ? f32_to_f16(y[i]) : f32_to_bf16(y[i])) << "cast " << i;
    }
  }
}

TEST(CudaLlmOpsArgs, RejectBadShapes) {
  cuda::RopeParams r;
  r.n_tokens = 1, r.head_dim = 64, r.n_rot = 65;
  EXPECT_THROW(cuda::rope_device(r), Error);
  cuda::RmsNormParams n;
  n.n_tokens = 1, n.n = 64, n.x_stride = 32;
  EXPECT_THROW(cuda::rms_norm_device(n), Error);
  cuda::GluParams g;
  g.n_tokens = 1, g.n = 0;
  EXPECT_THROW(cuda::glu_device(g), Error);
}

}  // namespace
}  // namespace vq::test
#endif
