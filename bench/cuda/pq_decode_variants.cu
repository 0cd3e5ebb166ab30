// Decode of codes to fp16: the kernel before run 15 (v1: one thread per sub-vector, scalar 2-byte
// stores, codebook read through L1) and the vectorised kernel's other configurations, timed
// against the shipped one by bench_cuda_ops ("decode"). Times: docs/BENCHMARKS.md (c).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "bench_util.cuh"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_decode.cuh"

namespace {
using namespace vq::bench;

__device__ __forceinline__ uint32_t read_packed_v1(const uint8_t* row, int i, int bits) {
  if (bits == 8) return row[i];
  const int64_t bit = int64_t(i) * bits;
  const uint8_t* q = row + (bit >> 3);
  const unsigned shift = unsigned(bit & 7);
  const unsigned need = shift + unsigned(bits);
  uint32_t v = q[0];
  if (need > 8) v |= uint32_t(q[1]) << 8;
  if (need > 16) v |= uint32_t(q[2]) << 16;
  return (v >> shift) & ((1u << bits) - 1u);
}

// v1 as shipped up to run 14 (f16 output only here).
__global__ void decode_codes_v1(vq::cuda::CodeDecodeArgs a, int n_sub, int K, int books) {
  const int h = blockIdx.y;
  const int64_t total = a.n_tokens * n_sub;
  for (int64_t it = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; it < total; it += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = it / n_sub;
    const int sub = int(it - t * n_sub);
    const uint8_t* row = a.codes + int64_t(h) * a.code_head_stride + t * a.code_token_stride;
    const uint32_t c = read_packed_v1(row, sub, a.bits);
    const float* src = a.codebooks + ((int64_t(h) * books + (books > 1 ? sub : 0)) * K + c) * a.sub_dim;
    const int64_t o = int64_t(h) * a.out_head_stride + t * a.out_token_stride + int64_t(sub) * a.sub_dim;
    for (int e = 0; e < a.sub_dim; ++e) static_cast<__half*>(a.out)[o + e] = __float2half_rn(__ldg(src + e));
  }
}

void run_v1(const vq::cuda::CodeDecodeArgs& a) {
  const int n_sub = a.head_dim / a.sub_dim;
  const int64_t total = a.n_tokens * n_sub;
  const unsigned g = unsigned(std::max<int64_t>(1, std::min<int64_t>((total + 255) / 256, 65535)));
  decode_codes_v1<<<dim3(g, unsigned(a.n_heads)), 256>>>(a, n_sub, 1 << a.bits, a.per_subspace ? n_sub : 1);
}

template <int SD, int ITEMS, bool STREAM, bool L1 = false>
void run_vec(const vq::cuda::CodeDecodeArgs& a, int waves) {
  vq::cuda::detail::launch_decode_vec<SD, false, ITEMS, STREAM, L1>(a, waves, nullptr);
}

}  // namespace

// All variants on one shape; every variant's output is compared byte for byte with the shipped
// decode_codes_device's (which test_ops checks against the CPU reference).
using namespace vq::bench;
void bench_decode_variants(double copy_bw, int sub_dim, bool per_subspace) {
  const int H = 8, D = 128, S = 131072;
  const int n_sub = D / sub_dim, books = per_subspace ? n_sub : 1;
  const int cb = int(vq::cuda::code_row_bytes(n_sub, 8));
  std::vector<float> book(size_t(H) * books * 256 * sub_dim);
  for (size_t i = 0; i < book.size(); ++i) book[i] = float((i * 2654435761u) % 2001) / 1000.0f - 1.0f;
  vq::cuda::DeviceBuffer dbook = vq::cuda::to_device(book.data(), book.size() * 4);
  vq::cuda::DeviceBuffer codes(size_t(H) * S * cb), out(size_t(H) * S * D * 2), ref(size_t(H) * S * D * 2);
  fill_bytes_hash<<<2048, 256>>>(codes.as<uint8_t>(), codes.size(), 21);
  vq::cuda::CodeDecodeArgs a;
  a.n_tokens = S, a.n_heads = H, a.head_dim = D, a.sub_dim = sub_dim, a.bits = 8, a.per_subspace = per_subspace;
  a.codes = codes.as<uint8_t>(), a.code_head_stride = int64_t(S) * cb, a.code_token_stride = cb;
  a.codebooks = dbook.as<float>(), a.out_type = vq::cuda::ElemType::f16, a.out = ref.data();
  a.out_head_stride = int64_t(S) * D, a.out_token_stride = D;
  const double bytes = double(codes.size() + out.size());
  auto report = [&](const char* name, double ms) {
    std::printf("decode_var sub=%d books=%s %-22s ms=%.4f GBps=%.0f pct_of_copy=%.1f\n", sub_dim,
                per_subspace ? "per" : "shared", name, ms, bytes / (ms * 1e-3) / 1e9,
                100.0 * bytes / (ms * 1e-3) / 1e9 / copy_bw);
  };
  vq::cuda::decode_codes_device(a);
  CK(cudaDeviceSynchronize());
  std::vector<uint8_t> want(ref.size()), got(ref.size());
  ref.download(want.data(), want.size());
  vq::cuda::CodeDecodeArgs b = a;
  b.out = out.data();
  auto check = [&](const char* name) {
    CK(cudaDeviceSynchronize());
    out.download(got.data(), got.size());
    if (std::memcmp(got.data(), want.data(), got.size()) != 0) std::printf("decode_var MISMATCH %s\n", name);
  };
  auto time_it = [&](const char* name, auto&& f) {
    CK(cudaMemset(out.data(), 0xFF, out.size()));
    f();
    CK(cudaGetLastError());
    check(name);
    report(name, median_ms([&](int) { f(); }, 5, 15));
  };
  time_it("shipped", [&] { vq::cuda::decode_codes_device(b); });
  time_it("v1_scalar", [&] { run_v1(b); });
  char nm[64];
#define VQ_DEC_VAR(SD, IT, ST, L1)                                                    \
  for (int w : {2, 4, 8, 16}) {                                                       \
    std::snprintf(nm, sizeof nm, "%s_it%d_%s_w%d", L1 ? "l1" : "vec", IT, ST ? "stcs" : "st", w); \
    time_it(nm, [&] { run_vec<SD, IT, ST, L1>(b, w); });                             \
  }
  if (sub_dim == 4) {
    VQ_DEC_VAR(4, 2, false, false) VQ_DEC_VAR(4, 4, false, false) VQ_DEC_VAR(4, 8, false, false)
    VQ_DEC_VAR(4, 4, true, false) VQ_DEC_VAR(4, 8, true, false)
    VQ_DEC_VAR(4, 4, true, true) VQ_DEC_VAR(4, 8, true, true)
  } else {
    VQ_DEC_VAR(8, 4, false, false) VQ_DEC_VAR(8, 4, true, false) VQ_DEC_VAR(8, 4, true, true)
  }
#undef VQ_DEC_VAR
  std::fflush(stdout);
}
