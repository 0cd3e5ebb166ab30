// GPU-only: fused encode (smoothing + Hadamard + nearest centroid + bit-packing) and the packed
// code decoder, against plain CPU references written here from API.md. Skips without a device.
#if defined(VQ_HAVE_CUDA)
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "cuda_test_util.h"
#include "ops/cuda/device.h"
#include "ops/cuda/pq.h"

namespace vq::test {
namespace {

struct EncCase {
  const char* name;
  int n_heads, head_dim, sub_dim, bits;
  bool per_subspace;
  cuda::ElemType in;
  bool hadamard, smoothing;
  int64_t n_tokens;
};

const EncCase kEnc[] = {
    {"d128_s8_b8_shared_f32", 2, 128, 8, 8, false, cuda::ElemType::f32, true, true, 1000},
    {"d128_s4_b8_per_f16", 2, 128, 4, 8, true, cuda::ElemType::f16, true, true, 700},
    {"d64_s8_b12_shared_f32", 1, 64, 8, 12, false, cuda::ElemType::f32, true, true, 300},
    {"d256_s4_b8_shared_bf16", 3, 256, 4, 8, false, cuda::ElemType::bf16, true, true, 333},
    {"d128_s8_b4_per_plain", 2, 128, 8, 4, true, cuda::ElemType::f32, false, false, 513},
    {"d96_s16_b8_shared_hadamard32", 1, 96, 16, 8, false, cuda::ElemType::f32, true, false, 200},
    {"d128_s8_b12_per_generic", 2, 128, 8, 12, true, cuda::ElemType::f32, false, true, 40},
    {"d64_s4_b6_shared_one_token", 1, 64, 4, 6, false, cuda::ElemType::f16, true, true, 1},
};

// Orthonormal block Walsh-Hadamard (Sylvester order), block = largest power of two dividing n.
void hadamard_ref(std::vector<double>& v) {
  const int n = int(v.size()), B = n & -n;
  std::vector<double> out(v.size(), 0.0);
  for (int base = 0; base < n; base += B)
    for (int i = 0; i < B; ++i) {
      double s = 0;
      for (int j = 0; j < B; ++j) s += (__builtin_popcount(unsigned(i & j)) & 1 ? -1.0 : 1.0) * v[base + j];
      out[base + i] = s / std::sqrt(double(B));
    }
  v = out;
}

float to_input(float x, cuda::ElemType t, uint16_t* bits) {
  if (t == cuda::ElemType::f16) { *bits = f32_to_f16(x); return f16_to_f32(*bits); }
  if (t == cuda::ElemType::bf16) { *bits = f32_to_bf16(x); return bf16_to_f32(*bits); }
  return x;
}

class CudaFusedEncode : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaFusedEncode, PicksNearestCentroidOfTransformedKeysAndPacksRows) {
  VQ_SKIP_WITHOUT_CUDA();
  const EncCase& c = kEnc[GetParam()];
  std::mt19937 rng(31 + unsigned(GetParam()));
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(0.5f, 2.0f);
  const int H = c.n_heads, D = c.head_dim, d = c.sub_dim, n_sub = D / d, K = 1 << c.bits;
  const int books = c.per_subspace ? n_sub : 1;
  const int64_t T = c.n_tokens;
  const size_t elem = c.in == cuda::ElemType::f32 ? 4 : 2;
  // keys: [T, H, D] in the input type; xr: the same values as f32 (what the kernel reads)
  std::vector<float> xr(size_t(T) * H * D);
  std::vector<uint16_t> x16(xr.size());
  for (size_t i = 0; i < xr.size(); ++i) xr[i] = to_input(nd(rng) * (1.0f + 3.0f * (i % 7 == 0)), c.in, &x16[i]);
  std::vector<float> lambda(size_t(H) * D);  // [H, D]
  for (auto& l : lambda) l = ud(rng);
  // codebooks: [H, books, K, d], drawn at the scale of the transformed keys
  std::vector<float> cb(size_t(H) * books * K * d);
  for (auto& v : cb) v = nd(rng) * 0.8f;

  const int row = int(cuda::code_row_bytes(n_sub, c.bits));
  const int64_t cap = T + 5;  // head-major [H][cap][row]; tokens >= T must stay untouched
  cuda::DeviceBuffer dx = cuda::to_device(c.in == cuda::ElemType::f32 ? static_cast<const void*>(xr.data())
                                                                      : static_cast<const void*>(x16.data()),
                                          xr.size() * elem);
  cuda::DeviceBuffer dl = cuda::to_device(lambda.data(), lambda.size() * 4);
  cuda::DeviceBuffer dcb = cuda::to_device(cb.data(), cb.size() * 4);
  cuda::DeviceBuffer dcodes(size_t(H) * cap * row);
  cuda::FusedEncodeArgs a;
  a.n_tokens = T, a.n_heads = H, a.head_dim = D, a.sub_dim = d, a.bits = c.bits, a.per_subspace = c.per_subspace;
  a.in_type = c.in, a.x = dx.data(), a.lambda = c.smoothing ? dl.as<float>() : nullptr, a.hadamard = c.hadamard;
  a.codebooks = dcb.as<float>(), a.codes = dcodes.as<uint8_t>();
  a.code_head_stride = cap * row, a.code_token_stride = row;
  // Two runs over differently poisoned outputs must agree: every byte of every row is written,
  // nothing past the rows is.
  std::vector<uint8_t> out0(dcodes.size()), out1(dcodes.size());
  dcodes.fill_bytes(0x00);
  cuda::fused_encode_device(a);
  cuda::device_synchronize();
  dcodes.download(out0.data(), out0.size());
  dcodes.fill_bytes(0xFF);
  cuda::fused_encode_device(a);
  cuda::device_synchronize();
  dcodes.download(out1.data(), out1.size());
  for (int h = 0; h < H; ++h)
    for (int64_t t = 0; t < cap; ++t)
      for (int i = 0; i < row; ++i) {
        const size_t o = size_t(h * cap + t) * row + i;
        if (t < T) ASSERT_EQ(out0[o], out1[o]) << "byte " << i << " of row (" << h << ", " << t << ") not written";
        else ASSERT_TRUE(out0[o] == 0x00 && out1[o] == 0xFF) << "padding row " << t << " was written";
      }
  // Reference: transform in double, nearest centroid by exhaustive search.
  int64_t bad = 0, exact = 0;
  for (int64_t t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      std::vector<double> v(D);
      for (int e = 0; e < D; ++e)
        v[e] = double(xr[(t * H + h) * D + e]) / (c.smoothing ? double(lambda[h * D + e]) : 1.0);
      if (c.hadamard) hadamard_ref(v);
      const uint8_t* r = out0.data() + size_t(h * cap + t) * row;
      if (c.bits * n_sub % 8) {
        const int pad_bits = row * 8 - c.bits * n_sub;
        ASSERT_EQ(r[row - 1] >> (8 - pad_bits), 0) << "padding bits must be zero";
      }
      for (int j = 0; j < n_sub; ++j) {
        const float* book = cb.data() + (size_t(h) * books + (c.per_subspace ? j : 0)) * K * d;
        double best = INFINITY, xn = 0;
        int bi = 0;
        for (int e = 0; e < d; ++e) xn += v[j * d + e] * v[j * d + e];
        for (int k = 0; k < K; ++k) {
          double s = 0;
          for (int e = 0; e < d; ++e) s += (v[j * d + e] - book[k * d + e]) * (v[j * d + e] - book[k * d + e]);
          if (s < best) best = s, bi = k;
        }
        const uint32_t got = unpack_one(r, j, c.bits);
        ASSERT_LT(got, uint32_t(K));
        double s = 0, cn = 0, bn = 0;
        for (int e = 0; e < d; ++e) {
          s += (v[j * d + e] - book[got * d + e]) * (v[j * d + e] - book[got * d + e]);
          cn += double(book[got * d + e]) * book[got * d + e];
          bn += double(book[bi * d + e]) * book[bi * d + e];
        }
        // fp32 transform + distance rounding: a few eps of the norms involved.
        const double tol = 16.0 * (d + 8) * FLT_EPSILON * (xn + cn + bn);
        if (s - best > tol && ++bad <= 5)
          ADD_FAILURE() << "token " << t << " head " << h << " sub " << j << ": code " << got << " at " << s
                        << ", nearest " << bi << " at " << best;
        exact += got == uint32_t(bi);
      }
    }
  EXPECT_EQ(bad, 0);
  EXPECT_GE(double(exact), 0.99 * double(T * H * n_sub)) << exact << " exact of " << T * H * n_sub;
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaFusedEncode, ::testing::Range<size_t>(0, std::size(kEnc)),
                         [](const auto& p) { return std::string(kEnc[p.param].name); });

TEST(CudaFusedEncode, RejectsUnsupportedShapesWithNamedErrors) {
  VQ_SKIP_WITHOUT_CUDA();
  cuda::FusedEncodeArgs a;
  cuda::DeviceBuffer dummy(1024);
  a.n_tokens = 4, a.n_heads = 1, a.head_dim = 80, a.sub_dim = 8, a.bits = 8, a.hadamard = true;
  a.x = dummy.data(), a.codebooks = dummy.as<float>(), a.codes = dummy.as<uint8_t>();
  EXPECT_THROW(cuda::fused_encode_device(a), Error);  // Hadamard needs head_dim % 32 == 0
  a.head_dim = 128, a.sub_dim = 6;
  EXPECT_THROW(cuda::fused_encode_device(a), Error);  // 128 % 6 != 0
  a.sub_dim = 8, a.bits = 17;
  EXPECT_THROW(cuda::fused_encode_device(a), Error);
}

struct DecCase {
  const char* name;
  int n_heads, head_dim, sub_dim, bits;
  bool per_subspace;
};
const DecCase kDec[] = {{"d128_s4_b8_shared", 2, 128, 4, 8, false},
                        {"d64_s8_b12_per", 3, 64, 8, 12, true},
                        {"d256_s16_b4_shared", 1, 256, 16, 4, false},
                        {"d128_s8_b5_per", 2, 128, 8, 5, true},
                        // the vectorised 8-bit kernel (pq_decode.cuh): sub_dim 4 and 8, shared and per-sub-space books
                        {"d64_s4_b8_per", 3, 64, 4, 8, true},
                        {"d128_s8_b8_shared", 2, 128, 8, 8, false},
                        {"d256_s8_b8_per", 2, 256, 8, 8, true},
                        {"d256_s4_b8_shared", 3, 256, 4, 8, false}};

class CudaDecodeCodes : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaDecodeCodes, GathersCentroidsInEveryOutputType) {
  VQ_SKIP_WITHOUT_CUDA();
  const DecCase& c = kDec[GetParam()];
  std::mt19937 rng(7 + unsigned(GetParam()));
  std::normal_distribution<float> nd;
  const int H = c.n_heads, D = c.head_dim, d = c.sub_dim, n_sub = D / d, K = 1 << c.bits;
  const int books = c.per_subspace ? n_sub : 1;
  const int64_t T = 777;
  const int row = int(cuda::code_row_bytes(n_sub, c.bits));
  std::vector<float> cb(size_t(H) * books * K * d);
  for (auto& v : cb) v = nd(rng);
  std::vector<uint16_t> codes(size_t(H) * T * n_sub);  // [H, T, n_sub]
  for (auto& v : codes) v = uint16_t(rng() % unsigned(K));
  std::vector<uint8_t> packed(size_t(H) * T * row);   // head-major [H][T][row]
  for (int64_t r = 0; r < H * T; ++r) pack_row(codes.data() + r * n_sub, n_sub, c.bits, packed.data() + r * row);
  cuda::DeviceBuffer dp = cuda::to_device(packed.data(), packed.size()), dcb = cuda::to_device(cb.data(), cb.size() * 4);
  for (auto type : {cuda::ElemType::f32, cuda::ElemType::f16, cuda::ElemType::bf16}) {
    const size_t es = type == cuda::ElemType::f32 ? 4 : 2;
    cuda::DeviceBuffer dout(size_t(T) * H * D * es);  // token-major [T, H, D]
    dout.fill_bytes(0xFF);                            // NaN poison
    cuda::CodeDecodeArgs a;
    a.n_tokens = T, a.n_heads = H, a.head_dim = D, a.sub_dim = d, a.bits = c.bits, a.per_subspace = c.per_subspace;
    a.codes = dp.as<uint8_t>(), a.code_head_stride = T * row, a.code_token_stride = row;
    a.codebooks = dcb.as<float>(), a.out_type = type, a.out = dout.data();
    a.out_head_stride = D, a.out_token_stride = int64_t(H) * D;
    cuda::decode_codes_device(a);
    cuda::device_synchronize();
    std::vector<uint8_t> raw(dout.size());
    dout.download(raw.data(), raw.size());
    for (int64_t t = 0; t < T; ++t)
      for (int h = 0; h < H; ++h)
        for (int e = 0; e < D; ++e) {
          const int j = e / d;
          const uint16_t code = codes[(size_t(h) * T + t) * n_sub + j];
          const float want = cb[((size_t(h) * books + (c.per_subspace ? j : 0)) * K + code) * d + e % d];
          const size_t i = (size_t(t) * H + h) * D + e;
          float got;
          if (type == cuda::ElemType::f32) {
            std::memcpy(&got, raw.data() + 4 * i, 4);
          } else {
            uint16_t b16;
            std::memcpy(&b16, raw.data() + 2 * i, 2);
            got = type == cuda::ElemType::f16 ? f16_to_f32(b16) : bf16_to_f32(b16);
          }
          const float w = type == cuda::ElemType::f32 ? want
                          : type == cuda::ElemType::f16 ? f16_to_f32(f32_to_f16(want))
                                                        : bf16_to_f32(f32_to_bf16(want));
          ASSERT_EQ(got, w) << "token " << t << " head " << h << " elem " << e;
        }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, CudaDecodeCodes, ::testing::Range<size_t>(0, std::size(kDec)),
                         [](const auto& p) { return std::string(kDec[p.param].name); });

}  // namespace
}  // namespace vq::test
#endif
