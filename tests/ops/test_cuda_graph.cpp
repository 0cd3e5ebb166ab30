// GPU: one decoder layer's ops (SmolLM2-135M geometry, one decode token) enqueued on a stream,
// once eagerly and once captured into a CUDA graph in global capture mode (which refuses
// synchronizing and other capture-unsafe calls) and replayed: the replays equal the eager run
// bit for bit. Shows how the ops chain on a stream: embedding -> RMSNorm -> quantized q/k/v
// GEMVs -> RoPE -> (attention stand-in: cast of q) -> fp16 wo GEMM accumulating into the residual
// -> RMSNorm with fused f16 cast -> fp16 gate/up GEMM -> SwiGLU -> quantized down GEMV
// accumulating into the residual.
#if defined(VQ_HAVE_CUDA)
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "cuda_weight_util.h"
#include "ops/cuda/device.h"
#include "ops/cuda/gemm_cuda.h"
#include "ops/cuda/gemv_cuda.h"
#include "ops/cuda/llm_ops_cuda.h"
#include "ops/cuda/stream_cuda.h"
#include "ops/cuda/weights_cuda.h"

namespace vq::test {
namespace {

namespace g = cuda::ggml;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

TEST(CudaGraph, LayerOpsCaptureAndReplayEqualEager) {
  VQ_SKIP_WITHOUT_CUDA();
  const int E = 576, Hq = 9, Hk = 3, D = 64, F = 1536, V = 1000, T = 1;
  const int qd = Hq * D, kvd = Hk * D;
  std::mt19937 rng(2024);
  std::normal_distribution<float> nd;
  // weights: embedding and q/k/v and down in Q8_0 (quantized GEMV), wo and gate|up in fp16 (cuBLAS)
  const auto emb = random_weight_rows(g::Q8_0, V, E, rng), wqkv = random_weight_rows(g::Q8_0, qd + 2 * kvd, E, rng);
  const auto wdown = random_weight_rows(g::Q8_0, E, F, rng);
  std::vector<uint16_t> wo(size_t(E) * qd), wgu(size_t(2 * F) * E);
  for (auto& v : wo) v = f32_to_f16(nd(rng) * 0.05f);
  for (auto& v : wgu) v = f32_to_f16(nd(rng) * 0.05f);
  std::vector<float> norm1(static_cast<size_t>(E)), norm2(static_cast<size_t>(E));
  for (auto& v : norm1) v = 1.0f + 0.1f * nd(rng);
  for (auto& v : norm2) v = 1.0f + 0.1f * nd(rng);
  std::vector<double> freqs(size_t(D / 2));
  for (int i = 0; i < D / 2; ++i) freqs[size_t(i)] = std::pow(10000.0, -2.0 * i / D);
  const int32_t token = 123, pos = 77;

  cuda::DeviceBuffer d_emb = cuda::to_device(emb.data(), emb.size()), raw_qkv = cuda::to_device(wqkv.data(), wqkv.size());
  cuda::DeviceBuffer raw_down = cuda::to_device(wdown.data(), wdown.size());
  cuda::DeviceBuffer p_qkv(cuda::gemv_packed_bytes(g::Q8_0, qd + 2 * kvd, E)), p_down(cuda::gemv_packed_bytes(g::Q8_0, E, F));
  cuda::GemvPackParams pk;
  pk.type = g::Q8_0, pk.src = raw_qkv.data(), pk.rows = qd + 2 * kvd, pk.cols = E, pk.dst = p_qkv.data();
  cuda::gemv_pack_device(pk);
  pk.src = raw_down.data(), pk.rows = E, pk.cols = F, pk.dst = p_down.data();
  cuda::gemv_pack_device(pk);
  cuda::DeviceBuffer d_wo = cuda::to_device(wo.data(), wo.size() * 2), d_wgu = cuda::to_device(wgu.data(), wgu.size() * 2);
  cuda::DeviceBuffer d_n1 = cuda::to_device(norm1.data(), E * 4), d_n2 = cuda::to_device(norm2.data(), E * 4);
  cuda::DeviceBuffer d_f = cuda::to_device(freqs.data(), freqs.size() * 8), d_tok = cuda::to_device(&token, 4),
                     d_pos = cuda::to_device(&pos, 4);
  // activations (all allocated up front: nothing is allocated while the layer runs)
  cuda::DeviceBuffer x(size_t(E) * 4), xn(size_t(E) * 4), xn16(size_t(E) * 2), qkv(size_t(qd + 2 * kvd) * 4),
      q16(size_t(qd) * 2), gu(size_t(2 * F) * 4), act(size_t(F) * 4), xq(static_cast<size_t>(F)), xd(size_t(F / 32) * 4),
      xs(size_t(F / 32) * 4);
  cuda::GemmHandle gemm;

  auto layer = [&](cudaStream_t st) {
    cuda::EmbeddingParams e;
    e.type = g::Q8_0, e.table = d_emb.data(), e.n_vocab = V, e.n_embd = E, e.tokens = d_tok.as<int32_t>(), e.n_tokens = T;
    e.out = x.as<float>();
    cuda::embedding_device(e, st);
    cuda::RmsNormParams n;
    n.n_tokens = T, n.n = E, n.x = x.as<float>(), n.w = d_n1.as<float>(), n.out = xn.data();
    cuda::rms_norm_device(n, st);
    cuda::QuantizeActParams qa;
    qa.rows = T, qa.cols = E, qa.x = xn.data(), qa.q = xq.as<int8_t>(), qa.d = xd.as<float>(), qa.s = xs.as<float>();
    cuda::quantize_act_device(qa, st);
    cuda::GemvParams gv;  // q, k, v as one fused [qd + 2 kvd, E] weight
    gv.type = g::Q8_0, gv.w = p_qkv.data(), gv.rows = qd + 2 * kvd, gv.cols = E, gv.m = T;
    gv.xq = xq.as<int8_t>(), gv.xd = xd.as<float>(), gv.xs = xs.as<float>(), gv.y = qkv.as<float>();
    cuda::gemv_device(gv, st);
    cuda::RopeParams r;
    r.n_tokens = T, r.head_dim = D, r.n_rot = D, r.pos = d_pos.as<int32_t>(), r.inv_freq = d_f.as<double>();
    r.q = qkv.as<float>(), r.n_q_heads = Hq, r.k = qkv.as<float>() + qd, r.n_k_heads = Hk;
    r.q_stride = r.k_stride = qd + 2 * kvd;
    cuda::rope_device(r, st);
    cuda::CastParams c;  // attention stand-in: the rotated queries become the "attention output"
    c.n_tokens = T, c.n = qd, c.x = qkv.as<float>(), c.out = q16.data();
    cuda::cast_device(c, st);
    cuda::GemmParams gm;
    gm.m = T, gm.n = E, gm.k = qd, gm.w = d_wo.data(), gm.x = q16.data(), gm.y = x.data(), gm.accumulate = true;
    cuda::gemm_device(gemm, gm, st);
    n.w = d_n2.as<float>(), n.out_type = cuda::ElemType::f16, n.out = xn16.data();
    cuda::rms_norm_device(n, st);
    gm.n = 2 * F, gm.k = E, gm.w = d_wgu.data(), gm.x = xn16.data(), gm.y = gu.data(), gm.accumulate = false;
    cuda::gemm_device(gemm, gm, st);
    cuda::GluParams gl;
    gl.n_tokens = T, gl.n = F, gl.gate = gu.as<float>(), gl.gate_stride = 2 * F, gl.up = gu.as<float>() + F;
    gl.up_stride = 2 * F, gl.out = act.data();
    cuda::glu_device(gl, st);
    qa.cols = F, qa.x = act.data();
    cuda::quantize_act_device(qa, st);
    gv.w = p_down.data(), gv.rows = E, gv.cols = F, gv.y = x.as<float>(), gv.accumulate = true;
    cuda::gemv_device(gv, st);
  };

  cuda::device_synchronize();  // uploads and packing ran on the default stream; `st` does not wait for it
  cudaStream_t st;
  CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  layer(st);
  CUDA_OK(cudaStreamSynchronize(st));
  std::vector<float> eager(static_cast<size_t>(E)), replay(static_cast<size_t>(E));
  x.download(eager.data(), eager.size() * 4);
  for (float v : eager) ASSERT_TRUE(std::isfinite(v));

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  layer(st);
  CUDA_OK(cudaStreamEndCapture(st, &graph));
  CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int rep = 0; rep < 3; ++rep) {
    CUDA_OK(cudaMemsetAsync(x.data(), 0xFF, x.size(), st));  // the embedding rewrites the residual each replay
    CUDA_OK(cudaGraphLaunch(exec, st));
    CUDA_OK(cudaStreamSynchronize(st));
    x.download(replay.data(), replay.size() * 4);
    for (int i = 0; i < E; ++i) ASSERT_EQ(f32_bits(replay[size_t(i)]), f32_bits(eager[size_t(i)])) << "replay " << rep << " elem " << i;
  }
  CUDA_OK(cudaGraphExecDestroy(exec));
  CUDA_OK(cudaGraphDestroy(graph));
  CUDA_OK(cudaStreamDestroy(st));
}

// DeviceBuffer::upload and fill_bytes are complete when they return, also from pageable memory
// (a plain cudaMemcpy returns once the data is staged, before its DMA lands), so work on one of
// our non-blocking streams may read the buffer next. Each round reads the whole buffer back on a
// non-blocking stream right after the upload; a copy still in flight shows as old bytes (it did
// under load from other processes: the device store's parity tests failed that way).
TEST(CudaBuffers, UploadAndFillHaveLandedWhenTheyReturn) {
  VQ_SKIP_WITHOUT_CUDA();
  const size_t n = size_t(48) << 20;  // several staging chunks
  std::vector<uint8_t> host(n);
  cuda::DeviceBuffer d(n);
  cuda::PinnedBuffer back(n);
  cuda::Stream st;
  for (int round = 0; round < 6; ++round) {
    const uint8_t a = uint8_t(3 * round + 1);
    for (size_t i = 0; i < n; i += 4096) std::fill_n(host.data() + i, 4096, uint8_t(a + (i >> 12)));
    if (round % 2) {
      d.fill_bytes(a);
      std::fill(host.begin(), host.end(), a);
    } else {
      d.upload(host.data(), n);
    }
    cuda::copy_to_host_async(back.data(), d.data(), n, st.handle());
    st.synchronize();
    const auto* b = static_cast<const uint8_t*>(back.data());
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) bad += b[i] != host[i];
    ASSERT_EQ(bad, 0u) << "round " << round << (round % 2 ? " (fill_bytes)" : " (upload)");
  }
}

}  // namespace
}  // namespace vq::test
#endif
