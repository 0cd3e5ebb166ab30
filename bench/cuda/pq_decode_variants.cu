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

using vq::cuda::CodeDecodeArgs;
using vq::cuda::detail::to_16;
// Run 15 loser ("l1"): books without staging: the f32 centroids are read through L1 (__ldg, 16 or 32
// bytes per code) and rounded to 16 bits per element. For books too large to stage cheaply.
template <int SD, bool BF16, int ITEMS, bool STREAM>
__global__ void __launch_bounds__(256) decode_codes_l1_kernel(CodeDecodeArgs a, int chunk_shift, int books, int total) {
  const int h = blockIdx.y;
  const float4* book = reinterpret_cast<const float4*>(a.codebooks + int64_t(h) * books * 256 * SD);
  const uint8_t* codes_h = a.codes + int64_t(h) * a.code_head_stride;
  uint16_t* out_h = static_cast<uint16_t*>(a.out) + int64_t(h) * a.out_head_stride;
  constexpr int CPC = 8 / SD;
  const int chunk_mask = (1 << chunk_shift) - 1;
  const int tile = ITEMS * int(blockDim.x);
  for (int base = int(blockIdx.x) * tile; base < total; base += int(gridDim.x) * tile) {
    uint32_t code[ITEMS];
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int it = base + k * int(blockDim.x) + int(threadIdx.x);
      code[k] = 0;
      if (it < total) {
        const int t = it >> chunk_shift, c = it & chunk_mask;
        const uint8_t* p = codes_h + int64_t(t) * a.code_token_stride + c * CPC;
        code[k] = __ldg(p);
        if constexpr (CPC == 2) code[k] |= uint32_t(__ldg(p + 1)) << 8;
      }
    }
#pragma unroll
    for (int k = 0; k < ITEMS; ++k) {
      const int it = base + k * int(blockDim.x) + int(threadIdx.x);
      if (it >= total) continue;
      const int t = it >> chunk_shift, c = it & chunk_mask;
      float4 f0, f1;
      if constexpr (SD == 8) {
        const float4* e = book + ((books > 1 ? c * 256 : 0) + int(code[k])) * 2;
        f0 = __ldg(e), f1 = __ldg(e + 1);
      } else {
        f0 = __ldg(book + (books > 1 ? (2 * c) * 256 : 0) + int(code[k] & 255u));
        f1 = __ldg(book + (books > 1 ? (2 * c + 1) * 256 : 0) + int(code[k] >> 8));
      }
      uint4 v;
      v.x = uint32_t(to_16<BF16>(f0.x)) | uint32_t(to_16<BF16>(f0.y)) << 16;
      v.y = uint32_t(to_16<BF16>(f0.z)) | uint32_t(to_16<BF16>(f0.w)) << 16;
      v.z = uint32_t(to_16<BF16>(f1.x)) | uint32_t(to_16<BF16>(f1.y)) << 16;
      v.w = uint32_t(to_16<BF16>(f1.z)) | uint32_t(to_16<BF16>(f1.w)) << 16;
      uint4* dst = reinterpret_cast<uint4*>(out_h + int64_t(t) * a.out_token_stride) + c;
      if constexpr (STREAM) __stcs(dst, v);
      else *dst = v;
    }
  }
}

template <int SD, int ITEMS, bool STREAM, bool L1 = false>
void run_vec(const vq::cuda::CodeDecodeArgs& a, int waves, int group_chunks = 0) {
  if constexpr (L1) {
    const int chunks = a.head_dim / 8, books = a.per_subspace ? a.head_dim / a.sub_dim : 1;
    int shift = 0;
    while ((1 << shift) < chunks) ++shift;
    const int total = int(a.n_tokens) * chunks, tile = ITEMS * 256, tiles = (total + tile - 1) / tile;
    const int want = (vq::cuda::device_sm_count() * waves + a.n_heads - 1) / a.n_heads;
    decode_codes_l1_kernel<SD, false, ITEMS, STREAM>
        <<<dim3(unsigned(std::max(1, std::min(tiles, want))), unsigned(a.n_heads)), 256>>>(a, shift, books, total);
  } else {
    vq::cuda::detail::launch_decode_vec<SD, false, ITEMS, STREAM>(a, waves, nullptr, group_chunks);
  }
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
#define VQ_DEC_VAR(SD, IT, ST, L1, GC)                                                \
  for (int w : {2, 4, 8, 16}) {                                                       \
    std::snprintf(nm, sizeof nm, "%s_it%d_%s_w%d_gc%d", L1 ? "l1" : "vec", IT, ST ? "stcs" : "st", w, GC); \
    time_it(nm, [&] { run_vec<SD, IT, ST, L1>(b, w, GC); });                         \
  }
  // Run 15 measured (shared books) ITEMS 1/2/4/8, plain or streaming stores, the L1 form: all within
  // 78-82% of copy at 8-16 blocks per SM (BENCHMARKS.md (c)); run 16 keeps the shipped one and
  // the per-sub-space row groups.
  if (!per_subspace) {
    if (sub_dim == 4) { VQ_DEC_VAR(4, 4, true, false, 0) VQ_DEC_VAR(4, 8, true, false, 0) }
    else { VQ_DEC_VAR(8, 4, true, false, 0) }
  } else if (sub_dim == 4) {
    VQ_DEC_VAR(4, 4, true, false, 0) VQ_DEC_VAR(4, 4, true, false, 2) VQ_DEC_VAR(4, 4, true, false, 4)
    VQ_DEC_VAR(4, 4, true, false, 8) VQ_DEC_VAR(4, 8, true, false, 4)
  } else {
    VQ_DEC_VAR(8, 4, true, false, 0) VQ_DEC_VAR(8, 4, true, false, 2) VQ_DEC_VAR(8, 4, true, false, 4)
    VQ_DEC_VAR(8, 4, true, false, 8)
  }
#undef VQ_DEC_VAR
  std::fflush(stdout);
}
