// H200 benchmark of the CUDA ops (bench/cuda/run_all.sh runs it next to the PyTorch peers).
// Prints one line per measurement, "key=value" pairs, medians of CUDA-event timings after warm-up;
// inputs are rotated over several copies so that each launch reads memory, not L2, where the
// working set is below 4x the L2 size.
//   bench_cuda_ops [quant|attn|decode|copy|all]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/cuda/device.h"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_cuda.h"
#include "ops/cuda/pq_attention_lut.cuh"
#include "bench_util.cuh"
#include "pq_attention_lut_variants.h"

void bench_decode_variants(double copy_bw, int sub_dim, bool per_subspace);  // pq_decode_variants.cu

namespace {

using namespace vq::bench;

void bench_quant() {
  struct Q { int S, D, H, sub; };
  const Q cases[] = {{128, 128, 8, 8}, {512, 128, 8, 8}, {2048, 128, 8, 8}, {8192, 128, 8, 8}, {1024, 256, 4, 4}, {4096, 256, 4, 4}};
  // VQ_BENCH_QUANT_S=N: only the cases with S = N (e.g. one shape under the profiler)
  const char* only_s = std::getenv("VQ_BENCH_QUANT_S");
  for (const Q& q : cases) {
    if (only_s && std::atoi(only_s) != q.S) continue;
    const int K = 256, n_sub = q.D / q.sub;
    const int64_t rows = int64_t(q.S) * q.H, N = rows * n_sub;
    const size_t xn = size_t(rows) * q.D;
    // x: kRot copies of [rows, D] f32, rotated per launch (S=8192: 4 x 32 MiB, 2.6x the L2)
    constexpr int kRot = 4;
    vq::cuda::DeviceBuffer x(kRot * xn * 4), xh(xn * 2), books(size_t(q.H) * K * q.sub * 4), lam(size_t(q.H) * q.D * 4);
    fill_normal_f32<<<1024, 256>>>(x.as<float>(), kRot * xn, 1, 1.0f);
    fill_normal_f32<<<64, 256>>>(books.as<float>(), books.size() / 4, 2, 1.0f);
    vq::cuda::f32_to_f16_device(x.as<float>(), xh.as<uint16_t>(), int64_t(xn));
    std::vector<float> lh(size_t(q.H) * q.D, 1.0f);
    for (size_t i = 0; i < lh.size(); ++i) lh[i] = 0.75f + 0.5f * float(i % 7) / 7.0f;
    lam.upload(lh.data(), lh.size() * 4);
    vq::cuda::DeviceBuffer codes(size_t(N) * 2), codes_mma(size_t(N) * 2), packed(size_t(rows) * vq::cuda::code_row_bytes(n_sub, 8));
    CK(cudaDeviceSynchronize());
    const vq::PQShape s{rows, n_sub, q.sub, K, false};
    const size_t before = free_mem();
    const float* x0 = x.as<float>();
    const double ms_plain = median_ms([&](int j) { vq::cuda::pq_encode_device(s, x0 + (j % kRot) * xn, books.as<float>(), codes.as<uint16_t>()); }, 8);
    const size_t after = free_mem();
    // Tensor-core encoder (pq_encode_mma.cu, fp16 centroids): time, scratch, and agreement with
    // the exact fp32 encoder on the same input (codes of copy 0 from both).
    const size_t before_mma = free_mem();
    const double ms_mma = median_ms([&](int j) { vq::cuda::pq_encode_mma_device(s, x0 + (j % kRot) * xn, books.as<float>(), codes_mma.as<uint16_t>()); }, 8);
    const size_t after_mma = free_mem();
    // Row tiles per warp iteration: 1 (v3c, run 6) against the shipped value, same call; codes compared.
    double ms_rt[2];
    for (int rt = 1; rt <= 2; ++rt)
      ms_rt[rt - 1] = median_ms([&](int j) { vq::cuda::detail::pq_encode_mma_device_rt(s, x0 + (j % kRot) * xn, books.as<float>(), codes_mma.as<uint16_t>(), rt, nullptr); }, 8);
    {
      vq::cuda::DeviceBuffer c1(size_t(N) * 2);
      vq::cuda::detail::pq_encode_mma_device_rt(s, x0, books.as<float>(), c1.as<uint16_t>(), 1, nullptr);
      vq::cuda::pq_encode_mma_device(s, x0, books.as<float>(), codes_mma.as<uint16_t>());
      CK(cudaDeviceSynchronize());
      std::vector<uint16_t> a1(static_cast<size_t>(N)), a2(static_cast<size_t>(N));
      c1.download(a1.data(), a1.size() * 2);
      codes_mma.download(a2.data(), a2.size() * 2);
      std::printf("quant_rt S=%d D=%d sub=%d ms_rt1=%.4f ms_rt2=%.4f ms_shipped=%.4f rt1_equals_shipped=%d\n", q.S, q.D,
                  q.sub, ms_rt[0], ms_rt[1], ms_mma, int(a1 == a2));
    }
    vq::cuda::pq_encode_device(s, x0, books.as<float>(), codes.as<uint16_t>());
    vq::cuda::pq_encode_mma_device(s, x0, books.as<float>(), codes_mma.as<uint16_t>());
    CK(cudaDeviceSynchronize());
    std::vector<uint16_t> ce(static_cast<size_t>(N)), cm(static_cast<size_t>(N));
    codes.download(ce.data(), ce.size() * 2);
    codes_mma.download(cm.data(), cm.size() * 2);
    int64_t same = 0;
    for (size_t i = 0; i < ce.size(); ++i) same += ce[i] == cm[i];
    vq::cuda::FusedEncodeArgs a;
    a.n_tokens = q.S, a.n_heads = q.H, a.head_dim = q.D, a.sub_dim = q.sub, a.bits = 8, a.per_subspace = false;
    a.in_type = vq::cuda::ElemType::f16, a.x = xh.data(), a.lambda = lam.as<float>(), a.hadamard = true;
    a.codebooks = books.as<float>();  // one shared book per head: [H, 1, K, sub]
    a.codes = packed.as<uint8_t>(), a.code_head_stride = int64_t(q.S) * n_sub, a.code_token_stride = n_sub;
    const double ms_fused = median_ms([&](int) { vq::cuda::fused_encode_device(a); }, 5);
    const double flop2 = double(N) * K * q.sub * 2.0;  // |c|^2 - 2 x.c form
    std::printf("quant S=%d D=%d H=%d sub=%d N=%lld ms_plain_f32=%.4f ms_fused_f16_smooth_hadamard_pack=%.4f "
                "ms_mma_f16=%.4f TFLOPs_2flop=%.1f scratch_bytes=%lld scratch_bytes_mma=%lld mma_code_agree=%.5f\n",
                q.S, q.D, q.H, q.sub, (long long)N, ms_plain, ms_fused, ms_mma, flop2 / (ms_plain * 1e-3) / 1e12,
                (long long)(before - after), (long long)(before_mma - after_mma), double(same) / double(N));
  }
}

void bench_attn(double copy_bw) {
  const int Hkv = 8, G = 4, D = 128, Hq = Hkv * G;
  const int kd = 4, bits = 8, K = 256;
  const int cb = int(vq::cuda::code_row_bytes(D / kd, bits));  // 32 bytes per token per head per side
  std::vector<uint16_t> bookh(size_t(Hkv) * K * kd);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (auto& v : bookh) {
    __half h = __float2half(nd(rng));
    std::memcpy(&v, &h, 2);
  }
  vq::cuda::DeviceBuffer kbook = vq::cuda::to_device(bookh.data(), bookh.size() * 2);
  for (auto& v : bookh) {
    __half h = __float2half(nd(rng));
    std::memcpy(&v, &h, 2);
  }
  vq::cuda::DeviceBuffer vbook = vq::cuda::to_device(bookh.data(), bookh.size() * 2);
  // VQ_BENCH_ONLY="B,S" restricts the table to one shape (used for profiling with ncu).
  int only_b = 0, only_s = 0;
  if (const char* e = std::getenv("VQ_BENCH_ONLY")) std::sscanf(e, "%d,%d", &only_b, &only_s);
  for (int B : {1, 8})
    for (int S : {4096, 32768, 131072}) {
      if (only_b && (B != only_b || S != only_s)) continue;
      const size_t per_side = size_t(B) * Hkv * S * cb;  // bytes of key codes (same for values)
      const size_t bytes = 2 * per_side;
      const int copies = int(std::min<size_t>(64, std::max<size_t>(1, (size_t(512) << 20) / bytes)));
      vq::cuda::DeviceBuffer kc(per_side * copies), vc(per_side * copies);
      fill_bytes_hash<<<2048, 256>>>(kc.as<uint8_t>(), kc.size(), 11);
      fill_bytes_hash<<<2048, 256>>>(vc.as<uint8_t>(), vc.size(), 12);
      vq::cuda::DeviceBuffer q(size_t(B) * Hq * D * 4), out(size_t(B) * Hq * D * 4);
      fill_normal_f32<<<64, 256>>>(q.as<float>(), size_t(B) * Hq * D, 5, 1.0f / std::sqrt(float(D)));
      std::vector<int> lens(B, S);
      vq::cuda::DeviceBuffer dl = vq::cuda::to_device(lens.data(), B * 4);
      std::vector<const uint8_t*> kp(size_t(B) * copies), vp(size_t(B) * copies);
      for (int c = 0; c < copies; ++c)
        for (int b = 0; b < B; ++b) {
          kp[size_t(c) * B + b] = kc.as<uint8_t>() + size_t(c) * per_side + size_t(b) * Hkv * S * cb;
          vp[size_t(c) * B + b] = vc.as<uint8_t>() + size_t(c) * per_side + size_t(b) * Hkv * S * cb;
        }
      vq::cuda::DeviceBuffer dkp = vq::cuda::to_device(kp.data(), kp.size() * sizeof(void*));
      vq::cuda::DeviceBuffer dvp = vq::cuda::to_device(vp.data(), vp.size() * sizeof(void*));
      vq::cuda::PQAttnBatchArgs a;
      a.rows = B, a.n_kv_heads = Hkv, a.group = G, a.head_dim = D;
      a.k_sub_dim = kd, a.k_bits = bits, a.v_sub_dim = kd, a.v_bits = bits;
      a.q_code = q.as<float>(), a.q_plain = q.as<float>();
      a.n_coded = dl.as<int>(), a.code_head_stride = S, a.max_coded = S;
      a.k_book = kbook.as<uint16_t>(), a.v_book = vbook.as<uint16_t>();
      a.out = out.as<float>();
      vq::cuda::DeviceBuffer ws(vq::cuda::pq_attention_workspace_bytes(a));
      a.workspace = ws.data(), a.workspace_bytes = ws.size();
      // variant: null = the shipped kernel chosen by a.kernel; else a losing LUT variant of bench/cuda
      vq::cuda::detail::SplitLauncher variant = nullptr;
      auto run = [&](int i) {
        const int c = i % copies;
        a.k_codes = dkp.as<const uint8_t*>() + size_t(c) * B;
        a.v_codes = dvp.as<const uint8_t*>() + size_t(c) * B;
        if (variant) vq::cuda::detail::pq_attention_device_with_split(a, variant);
        else vq::cuda::pq_attention_device(a);
      };
      a.kernel = vq::cuda::PQAttnKernel::gather_mma;  // v2
      vq::cuda::DeviceBuffer ws1(vq::cuda::pq_attention_workspace_bytes(a));
      a.workspace = ws1.data(), a.workspace_bytes = ws1.size();
      const double ms_gather = median_ms(run, 10, 21, 3);
      a.kernel = vq::cuda::PQAttnKernel::lut;  // the LUT plan and workspace for v3b, v5, v4
      a.workspace = ws.data(), a.workspace_bytes = ws.size();
      variant = vq::cuda::bench_variants::launch_v3b;  // fp32 LUT
      const double ms_v3b = median_ms(run, 10, 21, 3);
      variant = vq::cuda::bench_variants::launch_v5;  // v4 with 20 warps of 96 registers
      const double ms_v5 = median_ms(run, 10, 21, 3);
      variant = nullptr;  // v4 explicitly
      const double ms_v4 = median_ms(run, 10, 21, 3);
      a.kernel = vq::cuda::PQAttnKernel::automatic;
      const double ms = median_ms(run, 10, 21, 3);
      // v4 with the split count set for 1, 2 (the default's rule, roughly) and 4 waves of one block per SM.
      double ms_w[3] = {0, 0, 0};
      const int waves[3] = {1, 2, 4};
      for (int w = 0; w < 3; ++w) {
        const int sms = 132, splits = std::max(1, waves[w] * sms / (B * Hkv));
        a.split_tokens = std::max(32, (S + splits - 1) / splits);
        vq::cuda::DeviceBuffer wsw(vq::cuda::pq_attention_workspace_bytes(a));
        a.workspace = wsw.data(), a.workspace_bytes = wsw.size();
        ms_w[w] = median_ms(run, 10, 21, 3);
      }
      a.split_tokens = 0;
      // The variants compute the same attention as the shipped kernel: largest difference of their
      // outputs to v4's on the same codes, relative to v4's largest output.
      auto output_of = [&](vq::cuda::detail::SplitLauncher v) {
        vq::cuda::DeviceBuffer wsv(vq::cuda::pq_attention_workspace_bytes(a));
        a.workspace = wsv.data(), a.workspace_bytes = wsv.size();
        variant = v;
        out.fill_bytes(0xFF);
        run(0);
        std::vector<float> o(size_t(B) * Hq * D);
        out.download(o.data(), o.size() * 4);
        variant = nullptr;
        return o;
      };
      a.kernel = vq::cuda::PQAttnKernel::lut;
      const std::vector<float> o4 = output_of(nullptr), o3 = output_of(vq::cuda::bench_variants::launch_v3b),
                               o5 = output_of(vq::cuda::bench_variants::launch_v5);
      a.kernel = vq::cuda::PQAttnKernel::automatic;
      double omax = 0, d3 = 0, d5 = 0;
      for (size_t i = 0; i < o4.size(); ++i) {
        omax = std::max(omax, double(std::fabs(o4[i])));
        d3 = std::max(d3, double(std::fabs(o3[i] - o4[i])));  // NaN (unwritten) fails the max: printed as nan below
        d5 = std::max(d5, double(std::fabs(o5[i] - o4[i])));
        if (std::isnan(o3[i]) || std::isnan(o5[i]) || std::isnan(o4[i])) d3 = d5 = NAN;
      }
      std::printf("attn_variants B=%d S=%d v3b_vs_v4_maxrel=%.2e v5_vs_v4_maxrel=%.2e\n", B, S, d3 / omax, d5 / omax);
      const double gbps = double(bytes) / (ms * 1e-3) / 1e9;
      std::printf("attn B=%d Hq=%d Hkv=%d D=%d S=%d k=d4b8 v=d4b8 ms=%.4f code_bytes=%zu GBps_codes=%.0f "
                  "pct_of_copy=%.1f rotate_copies=%d ms_gather_mma_v2=%.4f ms_lut_f32_v3b=%.4f "
                  "ms_v4_waves1=%.4f ms_v4_waves2=%.4f ms_v4_waves4=%.4f ms_v4=%.4f ms_v5=%.4f\n",
                  B, Hq, Hkv, D, S, ms, bytes, gbps, 100.0 * gbps / copy_bw, copies, ms_gather, ms_v3b, ms_w[0],
                  ms_w[1], ms_w[2], ms_v4, ms_v5);
      std::fflush(stdout);
    }
}

// Decode (gather) of packed d4b8 codes to fp16, [H][S][D] head-major, one shared book per head.
void bench_decode(double copy_bw) {
  const int H = 8, D = 128, kd = 4, S = 131072;
  const int cb = int(vq::cuda::code_row_bytes(D / kd, 8));
  std::vector<float> book(size_t(H) * 256 * kd);
  std::mt19937 rng(4);
  std::normal_distribution<float> nd;
  for (auto& v : book) v = nd(rng);
  vq::cuda::DeviceBuffer dbook = vq::cuda::to_device(book.data(), book.size() * 4);
  vq::cuda::DeviceBuffer codes(size_t(H) * S * cb), out(size_t(H) * S * D * 2);
  fill_bytes_hash<<<2048, 256>>>(codes.as<uint8_t>(), codes.size(), 21);
  vq::cuda::CodeDecodeArgs a;
  a.n_tokens = S, a.n_heads = H, a.head_dim = D, a.sub_dim = kd, a.bits = 8;
  a.codes = codes.as<uint8_t>(), a.code_head_stride = int64_t(S) * cb, a.code_token_stride = cb;
  a.codebooks = dbook.as<float>(), a.out_type = vq::cuda::ElemType::f16, a.out = out.data();
  a.out_head_stride = int64_t(S) * D, a.out_token_stride = D;
  const double ms = median_ms([&](int) { vq::cuda::decode_codes_device(a); }, 5);
  const double bytes = double(codes.size() + out.size());
  std::printf("decode S=%d H=%d D=%d d4b8->f16 ms=%.4f bytes_rw=%.0f GBps=%.0f pct_of_copy=%.1f\n", S, H, D, ms, bytes,
              bytes / (ms * 1e-3) / 1e9, 100.0 * bytes / (ms * 1e-3) / 1e9 / copy_bw);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "all";
  if (!vq::cuda::cuda_device_available()) {
    std::printf("no CUDA device: %s\n", vq::cuda::cuda_unavailable_reason().c_str());
    return 1;
  }
  std::printf("device %s\n", vq::cuda::cuda_device_description().c_str());
  double bw = 4163.0;
  if (what == "copy" || what == "all" || what == "attn" || what == "decode") bw = copy_gbps();
  if (what == "quant" || what == "all") bench_quant();
  if (what == "attn" || what == "all") bench_attn(bw);
  if (what == "decode" || what == "all") {
    bench_decode(bw);
    bench_decode_variants(bw, 4, false);
    bench_decode_variants(bw, 8, false);
    bench_decode_variants(bw, 4, true);
    bench_decode_variants(bw, 8, true);
    bench_decode(bw);  // the shipped kernel again: the spread between two runs of one version
  }
  vq::cuda::device_synchronize();
  return 0;
}
