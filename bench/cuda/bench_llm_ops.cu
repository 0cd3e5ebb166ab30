// H200 benchmark of the forward-pass device ops (llm_ops_cuda.h, weights_cuda.h, gemv_cuda.h,
// gemm_cuda.h) at the shapes of SmolLM2-135M, Llama-3.1-8B, Falcon3-7B and gemma3-270m (random
// weights of those geometries; speed does not depend on the values). Prints one key=value line
// per measurement: median of CUDA-event timings after warm-up, achieved GB/s (bytes that must
// move: inputs read once + outputs written once) and its share of the device-to-device copy
// bandwidth measured in the same run. Weights are rotated over copies totalling >= 4x the L2 so
// that every launch reads memory. The quantized GEMV is compared with the fp16 cuBLAS product
// at 1, 2, 4 and 8 activation rows; the last lines summarise where it wins.
//   bench_llm_ops [ops|dequant|gemv|gemm|layer|all]
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "bench_util.cuh"
#include "ops/cuda/device.h"
#include "ops/cuda/gemm_cuda.h"
#include "ops/cuda/gemv_cuda.h"
#include "ops/cuda/llm_ops_cuda.h"
#include "ops/cuda/weights_cuda.h"

namespace {

using namespace vq::bench;
namespace vc = vq::cuda;
namespace g = vq::cuda::ggml;

struct Geo {
  const char* name;
  int E, Hq, Hk, D, F;
  int64_t vocab;
  uint32_t emb_type;  // the type the public GGUFs use for token_embd (SmolLM2: q4_1 file)
};
const Geo kGeo[] = {
    {"smollm2_135m", 576, 9, 3, 64, 1536, 49152, g::Q4_1},
    {"llama31_8b", 4096, 32, 8, 128, 14336, 128256, g::Q4_K},
    {"falcon3_7b", 3072, 12, 4, 256, 23040, 131072, g::Q4_K},
    {"gemma3_270m", 640, 4, 1, 256, 2048, 262144, g::Q8_0},
};

double g_copy = 4163.0;  // GB/s, measured in main()

void report(const char* op, const std::string& what, double ms, double bytes) {
  const double gbps = bytes / (ms * 1e-3) / 1e9;
  std::printf("%s %s ms=%.4f bytes=%.0f GBps=%.0f pct_of_copy=%.1f\n", op, what.c_str(), ms, bytes, gbps,
              100.0 * gbps / g_copy);
  std::fflush(stdout);
}

// Overwrites the fp16 scale fields of every block with finite values (random bytes there could be
// NaN / Inf; timing would not change, but the outputs should be numbers).
__global__ void fix_scales(uint8_t* w, int64_t n_blocks, int block_bytes, int off0, int off1) {
  for (int64_t b = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; b < n_blocks; b += int64_t(gridDim.x) * blockDim.x) {
    const __half h = __float2half(0.001f + 0.01f * float(b % 97) / 97.0f);
    const uint16_t bits = __half_as_ushort(h);
    for (int off : {off0, off1})
      if (off >= 0) w[b * block_bytes + off] = uint8_t(bits), w[b * block_bytes + off + 1] = uint8_t(bits >> 8);
  }
}
__global__ void fill_tokens(int32_t* t, int n, int64_t vocab) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    t[i] = int32_t((uint64_t(i) * 2654435761u + 12345u) % uint64_t(vocab));
}

// rows x cols of `type` with random quants and finite scales, `copies` times back to back.
vc::DeviceBuffer random_weights(uint32_t type, int64_t rows, int64_t cols, int copies, uint32_t seed) {
  const size_t bytes = size_t(rows) * vc::weight_row_bytes(type, cols);
  vc::DeviceBuffer w(bytes * copies);
  fill_bytes_hash<<<2048, 256>>>(w.as<uint8_t>(), w.size(), seed);
  const int bb = int(vc::weight_block_bytes(type));
  int off0 = -1, off1 = -1;
  if (type == g::Q8_0 || type == g::Q4_0 || type == g::Q5_0) off0 = 0;
  if (type == g::Q4_1 || type == g::Q5_1 || type == g::Q4_K || type == g::Q5_K) off0 = 0, off1 = 2;
  if (type == g::Q6_K) off0 = 208;
  if (off0 >= 0) fix_scales<<<2048, 256>>>(w.as<uint8_t>(), int64_t(w.size() / bb), bb, off0, off1);
  CK(cudaGetLastError());
  return w;
}

// n normal(0, scale) values as f16 or bf16.
vc::DeviceBuffer random_half(size_t n, uint32_t seed, float scale, vc::ElemType t = vc::ElemType::f16) {
  vc::DeviceBuffer tmp(n * 4), out(n * 2);
  fill_normal_f32<<<2048, 256>>>(tmp.as<float>(), n, seed, scale);
  vc::CastParams c;
  c.n_tokens = 1, c.n = int(n), c.x = tmp.as<float>(), c.out_type = t, c.out = out.data();
  if (n % 4096 == 0) c.n_tokens = int(n / 4096), c.n = 4096;
  vc::cast_device(c);
  return out;
}

int copies_for(size_t bytes) { return int(std::clamp<size_t>((size_t(256) << 20) / std::max<size_t>(bytes, 1) + 1, 1, 32)); }

// ---- element-wise and row-wise ops ----
void bench_ops() {
  for (const Geo& geo : kGeo)
    for (const int T : {1, 512}) {
      const std::string tag = std::string("geo=") + geo.name + " T=" + std::to_string(T);
      const int E = geo.E, QK = (geo.Hq + geo.Hk) * geo.D;
      vc::DeviceBuffer x(size_t(T) * std::max(E, geo.F) * 2 * 4), y(x.size()), o16(x.size()), w(size_t(std::max(E, geo.F)) * 4);
      fill_normal_f32<<<1024, 256>>>(x.as<float>(), x.size() / 4, 1, 1.0f);
      fill_normal_f32<<<1024, 256>>>(y.as<float>(), y.size() / 4, 2, 1.0f);
      fill_normal_f32<<<64, 256>>>(w.as<float>(), w.size() / 4, 3, 1.0f);
      // embedding
      {
        const size_t rb = vc::weight_row_bytes(geo.emb_type, E);
        vc::DeviceBuffer table = random_weights(geo.emb_type, geo.vocab, E, 1, 4), tok(size_t(T) * 4);
        fill_tokens<<<4, 256>>>(tok.as<int32_t>(), T, geo.vocab);
        vc::EmbeddingParams p;
        p.type = geo.emb_type, p.table = table.data(), p.n_vocab = geo.vocab, p.n_embd = E;
        p.tokens = tok.as<int32_t>(), p.n_tokens = T, p.out = x.as<float>();
        const double ms = median_ms([&](int) { vc::embedding_device(p); }, 20);
        report("embedding", tag + " type=" + vc::weight_type_name(geo.emb_type), ms, double(T) * (rb + E * 4.0));
      }
      // RMSNorm: plain f32 out; fused residual add + f16 out (the pre-GEMM form); per-head q/k norm
      {
        vc::RmsNormParams p;
        p.n_tokens = T, p.n = E, p.x = x.as<float>(), p.w = w.as<float>(), p.out = y.as<float>();
        report("rms_norm", tag + " form=f32", median_ms([&](int) { vc::rms_norm_device(p); }, 20), double(T) * E * 8 + E * 4);
        p.add = y.as<float>(), p.sum_out = x.as<float>(), p.out_type = vc::ElemType::f16, p.out = o16.data();
        report("rms_norm", tag + " form=add_f16", median_ms([&](int) { vc::rms_norm_device(p); }, 20),
               double(T) * E * 14 + E * 4);
        vc::RmsNormParams h;
        h.n_tokens = T, h.n_heads = geo.Hq + geo.Hk, h.n = geo.D, h.x = x.as<float>(), h.w = w.as<float>(), h.out = x.as<float>();
        report("rms_norm", tag + " form=per_head_qk", median_ms([&](int) { vc::rms_norm_device(h); }, 20), double(T) * QK * 8);
      }
      // RoPE on q and k (positions up to 128k)
      {
        std::vector<double> f(static_cast<size_t>(geo.D / 2));
        for (int i = 0; i < geo.D / 2; ++i) f[size_t(i)] = std::pow(500000.0, -2.0 * i / geo.D);
        std::vector<int32_t> pos(static_cast<size_t>(T));
        for (int i = 0; i < T; ++i) pos[size_t(i)] = 131072 - T + i;
        vc::DeviceBuffer df = vc::to_device(f.data(), f.size() * 8), dp = vc::to_device(pos.data(), pos.size() * 4);
        vc::RopeParams p;
        p.n_tokens = T, p.head_dim = geo.D, p.n_rot = geo.D, p.pos = dp.as<int32_t>(), p.inv_freq = df.as<double>();
        p.q = x.as<float>(), p.n_q_heads = geo.Hq, p.k = x.as<float>() + size_t(geo.Hq) * geo.D, p.n_k_heads = geo.Hk;
        p.q_stride = p.k_stride = QK;
        report("rope", tag, median_ms([&](int) { vc::rope_device(p); }, 20), double(T) * QK * 8);
      }
      // gated activations with the f16 cast for w_down; residual add; cast
      for (const auto kind : {vc::GluKind::swiglu, vc::GluKind::gelu_tanh}) {
        vc::GluParams p;
        p.kind = kind, p.n_tokens = T, p.n = geo.F, p.gate = x.as<float>(), p.up = y.as<float>();
        p.out_type = vc::ElemType::f16, p.out = o16.data();
        report(kind == vc::GluKind::swiglu ? "swiglu" : "gelu_tanh", tag + " out=f16",
               median_ms([&](int) { vc::glu_device(p); }, 20), double(T) * geo.F * 10);
      }
      {
        vc::AddParams p;
        p.n_tokens = T, p.n = E, p.x = x.as<float>(), p.y = y.as<float>();
        report("add", tag, median_ms([&](int) { vc::add_device(p); }, 20), double(T) * E * 12);
        vc::CastParams c;
        c.n_tokens = T, c.n = geo.Hq * geo.D, c.x = y.as<float>(), c.out = o16.data();
        report("cast_f16", tag, median_ms([&](int) { vc::cast_device(c); }, 20), double(T) * geo.Hq * geo.D * 6);
      }
    }
}

// ---- decode of every weight type to fp16 (the upload path) ----
void bench_dequant() {
  const uint32_t types[] = {g::F32, g::F16, g::BF16, g::Q4_0, g::Q4_1, g::Q5_0, g::Q5_1, g::Q8_0, g::Q4_K, g::Q5_K, g::Q6_K};
  const int64_t rows = 14336, cols = 4096;
  for (const uint32_t t : types) {
    const size_t n = size_t(rows * cols);
    vc::DeviceBuffer src = t == g::F16    ? random_half(n, 6, 1.0f)
                           : t == g::BF16 ? random_half(n, 6, 1.0f, vc::ElemType::bf16)
                           : t == g::F32  ? vc::DeviceBuffer(n * 4)
                                          : random_weights(t, rows, cols, 1, 5);
    if (t == g::F32) fill_normal_f32<<<1024, 256>>>(src.as<float>(), n, 6, 1.0f);
    vc::DeviceBuffer out(size_t(rows * cols) * 2);
    vc::DequantParams p;
    p.type = t, p.src = src.data(), p.rows = rows, p.cols = cols, p.out = out.data();
    const double ms = median_ms([&](int) { vc::dequantize_device(p); }, 3);
    report("dequant_to_f16", std::string("type=") + vc::weight_type_name(t) + " rows=14336 cols=4096", ms,
           double(src.size() + out.size()));
  }
}

// ---- quantized GEMV vs fp16 cuBLAS at 1, 2, 4 and 8 activation rows ----
struct Proj {
  const char* name;
  int64_t rows, cols;
};
std::vector<Proj> projections(const Geo& geo) {
  return {{"wq", int64_t(geo.Hq) * geo.D, geo.E},
          {"wk", int64_t(geo.Hk) * geo.D, geo.E},
          {"wo", geo.E, int64_t(geo.Hq) * geo.D},
          {"w_gate", geo.F, geo.E},
          {"w_down", geo.E, geo.F}};
}

struct Win {
  int wins = 0, total = 0;
  double log_speedup = 0, log_speedup_gemv = 0;  // with / without the activation quantization launch
};

void bench_gemv() {
  vc::GemmHandle h;
  std::map<std::string, Win> summary;  // "type m=M" -> wins
  for (const Geo& geo : kGeo)
    for (const Proj& pr : projections(geo)) {
      const size_t f16_bytes = size_t(pr.rows * pr.cols) * 2;
      const int cf = copies_for(f16_bytes);
      vc::DeviceBuffer wf = random_half(size_t(pr.rows * pr.cols) * cf, 8, 0.02f), x32(size_t(8) * pr.cols * 4),
                       x16(size_t(8) * pr.cols * 2), y(size_t(8) * pr.rows * 4);
      fill_normal_f32<<<64, 256>>>(x32.as<float>(), x32.size() / 4, 9, 1.0f);
      vc::CastParams c;
      c.n_tokens = 8, c.n = int(pr.cols), c.x = x32.as<float>(), c.out = x16.data();
      vc::cast_device(c);
      vc::DeviceBuffer xq(size_t(8) * pr.cols), xd(size_t(8) * pr.cols / 32 * 4), xs(xd.size());
      constexpr int kM[4] = {1, 2, 4, 8};
      double ms_f16[4] = {0, 0, 0, 0};
      for (int mi = 0; mi < 4; ++mi) {
        const int m = kM[mi];
        vc::GemmParams p;
        p.m = m, p.n = pr.rows, p.k = pr.cols, p.x = x16.data(), p.y = y.data();
        ms_f16[mi] = median_ms([&](int i) {
          p.w = wf.as<uint8_t>() + size_t(i % cf) * f16_bytes;
          vc::gemm_device(h, p);
        }, 10);
        report("gemv_cublas_f16", std::string("geo=") + geo.name + " proj=" + pr.name + " rows=" + std::to_string(pr.rows) +
                   " cols=" + std::to_string(pr.cols) + " m=" + std::to_string(m),
               ms_f16[mi], double(f16_bytes) + m * pr.cols * 2.0 + m * pr.rows * 4.0);
      }
      for (const uint32_t t : {g::Q8_0, g::Q4_1, g::Q4_K}) {
        if (pr.cols % (t == g::Q4_K ? 256 : 32)) continue;
        const size_t qb = vc::gemv_packed_bytes(t, pr.rows, pr.cols);
        const int cq = copies_for(qb);
        vc::DeviceBuffer raw = random_weights(t, pr.rows, pr.cols, 1, 10), packed(qb * cq);
        for (int k = 0; k < cq; ++k) {
          vc::GemvPackParams pk;
          pk.type = t, pk.src = raw.data(), pk.rows = pr.rows, pk.cols = pr.cols, pk.dst = packed.as<uint8_t>() + size_t(k) * qb;
          vc::gemv_pack_device(pk);
        }
        for (int mi = 0; mi < 4; ++mi) {
          const int m = kM[mi];
          vc::QuantizeActParams qa;
          qa.rows = m, qa.cols = pr.cols, qa.x = x32.data(), qa.q = xq.as<int8_t>(), qa.d = xd.as<float>(), qa.s = xs.as<float>();
          const double ms_qa = median_ms([&](int) { vc::quantize_act_device(qa); }, 10);
          vc::quantize_act_device(qa);
          vc::GemvParams gp;
          gp.type = t, gp.rows = pr.rows, gp.cols = pr.cols, gp.m = m, gp.xq = xq.as<int8_t>(), gp.xd = xd.as<float>();
          gp.xs = xs.as<float>(), gp.y = y.as<float>();
          const double ms = median_ms([&](int i) {
            gp.w = packed.as<uint8_t>() + size_t(i % cq) * qb;
            vc::gemv_device(gp);
          }, 10);
          const double speedup = ms_f16[mi] / (ms + ms_qa);
          const std::string what = std::string("geo=") + geo.name + " proj=" + pr.name + " rows=" + std::to_string(pr.rows) +
                                   " cols=" + std::to_string(pr.cols) + " type=" + vc::weight_type_name(t) +
                                   " m=" + std::to_string(m);
          report("gemv_quant", what, ms, double(qb) + m * pr.cols * 1.125 + m * pr.rows * 4.0);
          std::printf("gemv_vs_cublas %s ms_quant=%.4f ms_quantize_act=%.4f ms_f16=%.4f speedup_incl_act=%.2f\n",
                      what.c_str(), ms, ms_qa, ms_f16[mi], speedup);
          // large: >= 8M weights (Llama/Falcon wq, wo, MLP); small: the rest (launch-bound on both paths)
          const char* size = pr.rows * pr.cols >= (int64_t(8) << 20) ? " size=large" : " size=small";
          Win& wn = summary[std::string(vc::weight_type_name(t)) + " m=" + std::to_string(m) + size];
          wn.total += 1, wn.wins += speedup > 1.0, wn.log_speedup += std::log(speedup);
          wn.log_speedup_gemv += std::log(ms_f16[mi] / ms);
        }
      }
    }
  for (const auto& [k, wn] : summary)
    std::printf("gemv_summary %s wins_incl_act=%d/%d geomean_speedup_vs_f16_cublas_incl_act=%.2f gemv_only=%.2f\n",
                k.c_str(), wn.wins, wn.total, std::exp(wn.log_speedup / wn.total), std::exp(wn.log_speedup_gemv / wn.total));
}

// ---- cuBLAS prefill products (m = 512 tokens) ----
void bench_gemm() {
  vc::GemmHandle h;
  for (const Geo& geo : kGeo)
    for (const Proj& pr : projections(geo)) {
      const int64_t m = 512;
      vc::DeviceBuffer w = random_half(size_t(pr.rows * pr.cols), 11, 0.02f), x = random_half(size_t(m * pr.cols), 12, 1.0f),
                       y(size_t(m * pr.rows) * 4);
      vc::GemmParams p;
      p.m = m, p.n = pr.rows, p.k = pr.cols, p.w = w.data(), p.x = x.data(), p.y = y.data();
      const double ms = median_ms([&](int) { vc::gemm_device(h, p); }, 10);
      const double flop = 2.0 * double(m) * double(pr.rows) * double(pr.cols);
      std::printf("gemm_cublas_f16 geo=%s proj=%s m=%lld n=%lld k=%lld ms=%.4f TFLOPs=%.1f\n", geo.name, pr.name,
                  (long long)m, (long long)pr.rows, (long long)pr.cols, ms, flop / (ms * 1e-3) / 1e12);
      std::fflush(stdout);
    }
}

// ---- one decode layer (T = 1) without attention, eager vs CUDA-graph replay ----
// Llama-3.1-8B geometry, weights q4_K (quantized GEMV path) or fp16 (cuBLAS path); q/k/v and
// gate/up as fused matrices: rms_norm -> [quantize_act] -> qkv -> rope -> cast -> wo (+= x) ->
// rms_norm -> [quantize_act] -> gate|up -> swiglu -> [quantize_act] -> down (+= x). Byte floor =
// weight bytes / copy bandwidth. Layers are rotated over copies (> 4x L2).
void bench_layer() {
  const Geo& geo = kGeo[1];
  const int E = geo.E, qd = geo.Hq * geo.D, kvd = geo.Hk * geo.D, F = geo.F;
  const int64_t qkv_rows = qd + 2 * kvd;
  vc::GemmHandle gh;
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  std::vector<double> f(static_cast<size_t>(geo.D / 2));
  for (int i = 0; i < geo.D / 2; ++i) f[size_t(i)] = std::pow(500000.0, -2.0 * i / geo.D);
  const int32_t pos = 4000;
  vc::DeviceBuffer df = vc::to_device(f.data(), f.size() * 8), dpos = vc::to_device(&pos, 4);
  vc::DeviceBuffer x(size_t(E) * 4), xn(size_t(E) * 4), xn16(size_t(E) * 2), qkv(size_t(qkv_rows) * 4), q16(size_t(qd) * 2),
      gu(size_t(2 * F) * 4), act(size_t(F) * 4), act16(size_t(F) * 2), xq(static_cast<size_t>(F)), xd(size_t(F / 32) * 4), xs(xd.size()),
      nw(size_t(E) * 4);
  fill_normal_f32<<<64, 256>>>(x.as<float>(), E, 1, 1.0f);
  fill_normal_f32<<<64, 256>>>(nw.as<float>(), E, 2, 0.1f);
  for (const bool quant : {true, false}) {
    const uint32_t t = g::Q4_K;
    const int64_t shapes[4][2] = {{qkv_rows, E}, {E, qd}, {2 * int64_t(F), E}, {E, F}};  // qkv, wo, gate|up, down
    size_t bytes[4], layer_bytes = 0;
    for (int k = 0; k < 4; ++k)
      bytes[k] = quant ? vc::gemv_packed_bytes(t, shapes[k][0], shapes[k][1]) : size_t(shapes[k][0] * shapes[k][1]) * 2;
    for (size_t b : bytes) layer_bytes += b;
    const int copies = copies_for(layer_bytes);
    std::vector<vc::DeviceBuffer> w;
    for (int k = 0; k < 4; ++k) {
      if (quant) {
        vc::DeviceBuffer raw = random_weights(t, shapes[k][0], shapes[k][1], 1, 20 + k), packed(bytes[k] * copies);
        for (int c = 0; c < copies; ++c) {
          vc::GemvPackParams pk;
          pk.type = t, pk.src = raw.data(), pk.rows = shapes[k][0], pk.cols = shapes[k][1];
          pk.dst = packed.as<uint8_t>() + size_t(c) * bytes[k];
          vc::gemv_pack_device(pk);
        }
        w.push_back(std::move(packed));
      } else {
        w.push_back(random_half(bytes[k] / 2 * copies, 20 + k, 0.02f));
      }
    }
    CK(cudaDeviceSynchronize());
    auto product = [&](int k, int c, const void* in32, const void* in16, int64_t rows, int64_t cols, float* y, bool acc) {
      const void* wk = w[size_t(k)].as<uint8_t>() + size_t(c) * bytes[k];
      if (quant) {
        vc::QuantizeActParams qa;
        qa.rows = 1, qa.cols = cols, qa.x = in32, qa.q = xq.as<int8_t>(), qa.d = xd.as<float>(), qa.s = xs.as<float>();
        vc::quantize_act_device(qa, st);
        vc::GemvParams gp;
        gp.type = t, gp.w = wk, gp.rows = rows, gp.cols = cols, gp.m = 1, gp.xq = xq.as<int8_t>(), gp.xd = xd.as<float>();
        gp.xs = xs.as<float>(), gp.y = y, gp.accumulate = acc;
        vc::gemv_device(gp, st);
      } else {
        vc::GemmParams gm;
        gm.m = 1, gm.n = rows, gm.k = cols, gm.w = wk, gm.x = in16, gm.y = y, gm.accumulate = acc;
        vc::gemm_device(gh, gm, st);
      }
    };
    auto layer = [&](int c) {
      vc::RmsNormParams n;
      n.n_tokens = 1, n.n = E, n.x = x.as<float>(), n.w = nw.as<float>();
      n.out_type = quant ? vc::ElemType::f32 : vc::ElemType::f16, n.out = quant ? xn.data() : xn16.data();
      vc::rms_norm_device(n, st);
      product(0, c, xn.data(), xn16.data(), qkv_rows, E, qkv.as<float>(), false);
      vc::RopeParams r;
      r.n_tokens = 1, r.head_dim = geo.D, r.n_rot = geo.D, r.pos = dpos.as<int32_t>(), r.inv_freq = df.as<double>();
      r.q = qkv.as<float>(), r.n_q_heads = geo.Hq, r.k = qkv.as<float>() + qd, r.n_k_heads = geo.Hk;
      vc::rope_device(r, st);
      vc::CastParams cs;  // attention stand-in
      cs.n_tokens = 1, cs.n = qd, cs.x = qkv.as<float>(), cs.out = q16.data();
      vc::cast_device(cs, st);
      product(1, c, qkv.data(), q16.data(), E, qd, x.as<float>(), true);
      vc::rms_norm_device(n, st);
      product(2, c, xn.data(), xn16.data(), 2 * int64_t(F), E, gu.as<float>(), false);
      vc::GluParams gl;
      gl.n_tokens = 1, gl.n = F, gl.gate = gu.as<float>(), gl.up = gu.as<float>() + F;
      gl.out_type = quant ? vc::ElemType::f32 : vc::ElemType::f16, gl.out = quant ? act.data() : act16.data();
      vc::glu_device(gl, st);
      product(3, c, act.data(), act16.data(), E, F, x.as<float>(), true);
    };
    // eager: `copies` layers back to back; graph: the same sequence captured once, replayed
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    auto time_it = [&](auto&& body) {
      std::vector<double> ts;
      for (int rep = 0; rep < 12; ++rep) {
        CK(cudaEventRecord(a, st));
        body();
        CK(cudaEventRecord(b, st));
        CK(cudaEventSynchronize(b));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, a, b));
        if (rep >= 2) ts.push_back(double(ms) / copies);
      }
      std::sort(ts.begin(), ts.end());
      return ts[ts.size() / 2];
    };
    const double ms_eager = time_it([&] {
      for (int c = 0; c < copies; ++c) layer(c);
    });
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int c = 0; c < copies; ++c) layer(c);
    CK(cudaStreamEndCapture(st, &graph));
    CK(cudaGraphInstantiate(&exec, graph, 0));
    const double ms_graph = time_it([&] { CK(cudaGraphLaunch(exec, st)); });
    CK(cudaGraphExecDestroy(exec));
    CK(cudaGraphDestroy(graph));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    const double floor_ms = double(layer_bytes) / (g_copy * 1e9) * 1e3;
    std::printf("layer_decode geo=%s weights=%s launches=%d ms_eager=%.4f ms_graph=%.4f weight_bytes=%zu floor_ms=%.4f "
                "graph_vs_floor=%.2f\n", geo.name, quant ? "q4_K_gemv" : "f16_cublas", quant ? 13 : 10, ms_eager, ms_graph,
                layer_bytes, floor_ms, ms_graph / floor_ms);
    std::fflush(stdout);
  }
  CK(cudaStreamDestroy(st));
}

}  // namespace

int main(int argc, char** argv) {
  const std::string what = argc > 1 ? argv[1] : "all";
  if (!vc::cuda_device_available()) {
    std::printf("no CUDA device: %s\n", vc::cuda_unavailable_reason().c_str());
    return 1;
  }
  std::printf("device %s\n", vc::cuda_device_description().c_str());
  g_copy = copy_gbps();
  if (what == "ops" || what == "all") bench_ops();
  if (what == "dequant" || what == "all") bench_dequant();
  if (what == "gemv" || what == "all") bench_gemv();
  if (what == "gemm" || what == "all") bench_gemm();
  if (what == "layer" || what == "all") bench_layer();
  vc::device_synchronize();
  return 0;
}
