// The batched forward pass on the GPU (forward_device.h).
#include "model/forward_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <cstring>
#include <map>
#include <tuple>
#include <vector>

#include "core/env.h"
#include "core/error.h"
#include "kvcache/kv_store_device.h"
#include "model/device_model.h"
#include "model/session.h"
#include "model/tensor_parallel.h"
#include "ops/cuda/collective_cuda.h"  // declarations only (no CUDA types)

#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#include "ops/cuda/gemm_cuda.h"
#include "ops/cuda/gemv_cuda.h"
#include "ops/cuda/kv_blocks_cuda.h"
#include "ops/cuda/llm_ops_cuda.h"
#include "ops/cuda/stream_cuda.h"
#endif

namespace vq {

#ifndef VQ_HAVE_CUDA

struct ForwardDevice::Impl {};
ForwardDevice::ForwardDevice(std::shared_ptr<const DeviceModel> model, KVStore& kv) : model_(std::move(model)), kv_(kv) {
  VQ_FAIL("forward: device cuda but this build has no CUDA backend");
}
ForwardDevice::~ForwardDevice() = default;
void ForwardDevice::step(const BatchEntry*, int) { VQ_FAIL("forward: this build has no CUDA backend"); }
void ForwardDevice::set_deterministic(bool) { VQ_FAIL("forward: this build has no CUDA backend"); }
bool ForwardDevice::deterministic() const { return false; }
struct TPForwardDevice::Rank {};
TPForwardDevice::TPForwardDevice(std::vector<std::shared_ptr<const DeviceModel>>, std::vector<KVStore*>,
                                 std::unique_ptr<cuda::DeviceCommunicator>) {
  VQ_FAIL("tp forward: device cuda but this build has no CUDA backend");
}
TPForwardDevice::~TPForwardDevice() = default;
int TPForwardDevice::tp() const { return 0; }
void TPForwardDevice::step(const TPBatchEntry*, int) { VQ_FAIL("tp forward: this build has no CUDA backend"); }

#else

namespace {

using cuda::ElemType;

// How a projection of `rows` activation rows runs: the native quantized GEMV where it beat cuBLAS
// (gemv_preferred), the fp16 GEMV for up to 4 rows (VQ_GEMV_F16=0 turns it off, for comparison),
// else cuBLAS. Both GEMV paths read f32 activations; cuBLAS reads fp16.
enum class Path { gemm, gemv_quant, gemv_f16 };

bool gemv_f16_enabled() {
  return gpu_tuning().gemv_f16;
}

Path path_of(const DeviceMatrix& m, int rows) {
  if (m.has_gemv() && rows <= cuda::kGemvMaxRows) {
    bool all = true;
    for (const auto& p : m.parts) all = all && cuda::gemv_preferred(p.type, rows);
    if (all) return Path::gemv_quant;
  }
  if (rows <= cuda::kGemvF16MaxRows && m.cols % 8 == 0 && gemv_f16_enabled()) return Path::gemv_f16;
  return Path::gemm;
}

// Whether the projection reads f32 activations (both GEMV paths, the int8 rounding of act_int8
// matrices, the deterministic mode), else fp16 for the GEMM.
bool use_gemv(const DeviceMatrix& m, int rows, bool det) {
  return det || path_of(m, rows) != Path::gemm || m.act_int8;
}

// Deterministic mode: the one path a matrix's rows of short entries take whatever their count
// (the quantized GEMV where it wins at one row, else the fp16 GEMV).
bool det_small_quant(const DeviceMatrix& m) {
  if (!m.has_gemv()) return false;
  for (const auto& p : m.parts)
    if (!cuda::gemv_preferred(p.type, 1)) return false;
  return true;
}

}  // namespace

struct ForwardDevice::Impl {
  const DeviceModel& M;
  KVStore& kv;
  KVStoreDevice& dev;
  cuda::GemmHandle gemm;
  bool det = false;  // ForwardDevice::set_deterministic
  // Deterministic mode: the step's first rows come from entries shorter than a prefill tile (they
  // take the GEMVs, row by row the same whatever their count); the rest from long chunks (the
  // batch-invariant GEMM). Of the logits rows likewise.
  int small_rows = 0, small_lrows = 0;
  int cap = 0, lcap = 0;
  int E, HQ, H, D, qd, kvd, qkvd, F, V;
  cuda::DeviceBuffer tokens, lidx, x, xn, xn16, qkv, attn, gu, act, xq, xd, xs, xdq, xl, xl16, logits, po, x16s;
  cuda::PinnedBuffer h_tokens, h_lidx, h_logits;
  uint64_t buf_version = 0;
  struct GraphRec {
    cuda::Graph g;
    uint64_t kv_version = 0, buf_version = 0;
  };
  std::map<std::tuple<int, int, bool, bool>, GraphRec> graphs;

  Impl(const DeviceModel& m, KVStore& k) : M(m), kv(k), dev(k.device()) {
    const ModelConfig& c = m.config();
    E = c.n_embd, HQ = c.n_heads, H = c.n_kv_heads, D = c.head_dim, qd = c.q_dim(), kvd = c.kv_dim();
    qkvd = qd + 2 * kvd, F = c.n_ff, V = c.n_vocab;
  }

  void reserve(int rows, int lrows) {
    if (rows <= cap && lrows <= lcap && tokens.data()) return;
    cap = std::max(cap, std::max(rows, 16));
    lcap = std::max(lcap, std::max(lrows, 16));
    const size_t R = size_t(cap), LR = size_t(lcap);
    const size_t wide = size_t(std::max({E, F, qd}));
    tokens = cuda::DeviceBuffer(R * 4);
    lidx = cuda::DeviceBuffer(LR * 4);
    x = cuda::DeviceBuffer(R * E * 4);
    xn = cuda::DeviceBuffer(R * E * 4);
    xn16 = cuda::DeviceBuffer(R * E * 2);
    qkv = cuda::DeviceBuffer(R * qkvd * 4);
    attn = cuda::DeviceBuffer(R * qd * 4);
    gu = cuda::DeviceBuffer(R * 2 * F * 4);
    act = cuda::DeviceBuffer(R * F * 4);
    xq = cuda::DeviceBuffer(R * wide);
    xd = cuda::DeviceBuffer(R * (wide / 32 + 1) * 4);
    xs = cuda::DeviceBuffer(R * (wide / 32 + 1) * 4);
    xdq = cuda::DeviceBuffer(R * wide * 4);
    xl = cuda::DeviceBuffer(LR * E * 4);
    xl16 = cuda::DeviceBuffer(LR * E * 4);
    if (M.config().post_norms || partial) po = cuda::DeviceBuffer(R * E * 4);
    if (det) x16s = cuda::DeviceBuffer(std::max(R, LR) * std::max(wide, size_t(E)) * 2);
    logits = cuda::DeviceBuffer(LR * V * 4);
    h_tokens = cuda::PinnedBuffer(R * 4);
    h_lidx = cuda::PinnedBuffer(LR * 4);
    h_logits = cuda::PinnedBuffer(LR * V * 4);
    ++buf_version;
  }

  // f32 rows x [rows, cols] quantized to int8 blocks in xq / xd / xs (the quantized GEMV's input).
  void quantize_rows(int rows, int64_t cols, const float* x, void* st) {
    cuda::QuantizeActParams q;
    q.rows = rows;
    q.cols = cols;
    q.x_type = ElemType::f32;
    q.x = x;
    q.q = xq.as<int8_t>();
    q.d = xd.as<float>();
    q.s = xs.as<float>();
    cuda::quantize_act_device(q, st);
  }

  // The CPU's int8 activation rounding of rows x [rows, cols] into xdq (f32 or f16).
  void round_int8(int rows, int64_t cols, const float* x, ElemType out_type, void* st) {
    quantize_rows(rows, cols, x, st);
    cuda::DequantizeActParams dq;
    dq.rows = rows;
    dq.cols = cols;
    dq.q = xq.as<int8_t>();
    dq.d = xd.as<float>();
    dq.out_type = out_type;
    dq.out = xdq.data();
    cuda::dequantize_act_device(dq, st);
  }

  // y[rows, W.rows] (+)= x W^T. x32: f32 input (quantized for the native product), x16: fp16 input
  // (cuBLAS); only the one the path needs is read.
  void project(const DeviceMatrix& W, int rows, const float* x32, const void* x16, float* y, int64_t ldy, bool acc,
               void* st, int small = 0) {
    if (det) {
      project_det(W, rows, std::min(small, rows), x32, y, ldy, acc, st);
      return;
    }
    const Path path = path_of(W, rows);
    if (W.act_int8 && path != Path::gemv_quant) {
      // The CPU's int8 activation rounding (DeviceMatrix::act_int8): quantize, then back to the
      // float form the product reads.
      round_int8(rows, W.cols, x32, path == Path::gemm ? ElemType::f16 : ElemType::f32, st);
      if (path == Path::gemm) x16 = xdq.data();
      else x32 = xdq.as<float>();
    }
    if (path == Path::gemv_f16) {
      cuda::GemvF16Params g;
      g.w = W.f16;
      g.rows = W.rows, g.cols = W.cols;
      g.m = rows;
      g.x = x32;
      g.y = y;
      g.y_stride = ldy;
      g.accumulate = acc;
      cuda::gemv_f16_device(g, st);
      return;
    }
    if (path == Path::gemv_quant) {
      quantize_rows(rows, W.cols, x32, st);
      for (const auto& p : W.parts) {
        cuda::GemvParams g;
        g.type = p.type;
        g.w = p.packed;
        g.rows = p.rows, g.cols = W.cols;
        g.m = rows;
        g.xq = xq.as<int8_t>(), g.xd = xd.as<float>(), g.xs = xs.as<float>();
        g.y = y + p.row0;
        g.y_stride = ldy;
        g.accumulate = acc;
        cuda::gemv_device(g, st);
      }
      return;
    }
    cuda::GemmParams g;
    g.m = rows, g.n = W.rows, g.k = W.cols;
    g.ab_type = ElemType::f16;
    g.w = W.f16;
    g.x = x16;
    g.y_type = ElemType::f32;
    g.y = y;
    g.ldy = ldy;
    g.accumulate = acc;
    cuda::gemm_device(gemm, g, st);
  }

  // The deterministic mode's product (ForwardDevice::set_deterministic): rows [0, small) through
  // the GEMVs in groups (row-invariant forms), rows [small, rows) through the batch-invariant GEMM
  // (their f32 activations cast to fp16 first). x32: [rows, W.cols] packed.
  void project_det(const DeviceMatrix& W, int rows, int small, const float* x32, float* y, int64_t ldy, bool acc,
                   void* st) {
    const bool quant = det_small_quant(W);
    const int64_t K = W.cols;
    // act_int8 matrices take the CPU's int8-rounded activations (as in project): the quantized
    // GEMV rounds them itself; the fp16 GEMV and the GEMM read them rounded back to f32.
    const float* x_small = x32;
    const float* x_long = x32;
    if (W.act_int8 && ((small > 0 && !quant) || small < rows)) {
      round_int8(rows, K, x32, ElemType::f32, st);
      if (!quant) x_small = xdq.as<float>();
      x_long = xdq.as<float>();
    }
    if (small > 0 && quant) {
      quantize_rows(small, K, x32, st);
      for (int r0 = 0; r0 < small; r0 += cuda::kGemvMaxRows)
        for (const auto& p : W.parts) {
          cuda::GemvParams g;
          g.type = p.type;
          g.w = p.packed;
          g.rows = p.rows, g.cols = K;
          g.m = std::min(cuda::kGemvMaxRows, small - r0);
          g.xq = xq.as<int8_t>() + size_t(r0) * K, g.xd = xd.as<float>() + size_t(r0) * (K / 32),
          g.xs = xs.as<float>() + size_t(r0) * (K / 32);
          g.y = y + size_t(r0) * ldy + p.row0;
          g.y_stride = ldy;
          g.accumulate = acc;
          g.row_invariant = true;
          cuda::gemv_device(g, st);
        }
    } else if (small > 0) {
      for (int r0 = 0; r0 < small; r0 += cuda::kGemvF16MaxRows) {
        cuda::GemvF16Params g;
        g.w = W.f16;
        g.rows = W.rows, g.cols = K;
        g.m = std::min(cuda::kGemvF16MaxRows, small - r0);
        g.x = x_small + size_t(r0) * K;
        g.x_stride = K;
        g.y = y + size_t(r0) * ldy;
        g.y_stride = ldy;
        g.accumulate = acc;
        cuda::gemv_f16_device(g, st);
      }
    }
    if (small < rows) {
      cuda::CastParams c;
      c.n_tokens = rows - small;
      c.n = int(K);
      c.x = x_long + size_t(small) * K;
      c.out_type = ElemType::f16;
      c.out = x16s.data();
      cuda::cast_device(c, st);
      cuda::GemmParams g;
      g.m = rows - small, g.n = W.rows, g.k = K;
      g.ab_type = ElemType::f16;
      g.w = W.f16;
      g.x = x16s.data();
      g.y_type = ElemType::f32;
      g.y = y + size_t(small) * ldy;
      g.ldy = ldy;
      g.accumulate = acc;
      cuda::gemm_invariant_device(g, st);
    }
  }

  // x += out projection of a block; with a post-norm (gemma3), x += RMSNorm(projection) * w.
  void block_out(const DeviceMatrix& W, const float* post_norm, int rows, const float* in32, const void* in16,
                 void* st) {
    if (!post_norm) {
      project(W, rows, in32, in16, x.as<float>(), E, true, st, small_rows);
      return;
    }
    project(W, rows, in32, in16, po.as<float>(), E, false, st, small_rows);
    add_partial(post_norm, rows, st);
  }

  void norm(const float* in, const float* w, int rows, bool f32_out, void* out32, void* out16, void* st) {
    cuda::RmsNormParams n;
    n.n_tokens = rows;
    n.n = E;
    n.x = in;
    n.w = w;
    n.eps = M.config().norm_eps;
    n.out_type = f32_out ? ElemType::f32 : ElemType::f16;
    n.out = f32_out ? out32 : out16;
    cuda::rms_norm_device(n, st);
  }

  // Tensor-parallel rank (TPForwardDevice): the blocks' output projections are written to po as
  // this rank's partial sums (no residual add); after the all-reduce add_partial adds them.
  bool partial = false;

  // The block's output projection into po, then x += po (with a post-norm, gemma3:
  // x += RMSNorm(po) * w). po holds the projection or, split, the all-reduced sum of the ranks'.
  void add_partial(const float* post_norm, int rows, void* st) {
    if (post_norm) {
      cuda::RmsNormParams n;
      n.n_tokens = rows;
      n.n = E;
      n.x = po.as<float>();
      n.w = post_norm;
      n.eps = M.config().norm_eps;
      n.out = po.data();
      cuda::rms_norm_device(n, st);
    }
    cuda::AddParams a;
    a.n_tokens = rows;
    a.n = E;
    a.x = x.as<float>();
    a.y = po.as<float>();
    cuda::add_device(a, st);
  }

  // The whole step's launches (eager or under capture). obs: download q/k/v per layer (eager only).
  void run(int rows, int lrows, bool fixups, bool encodes, const ForwardDevice::KVObserver* obs,
           const std::vector<std::pair<int, int>>* entry_rows, void* st) {
    begin(rows, fixups, st);
    for (int l = 0; l < M.config().n_layers; ++l) {
      attention(l, rows, encodes, obs, entry_rows, st);
      mlp(l, rows, st);
    }
    head(lrows, st);
  }

  // Table fix-ups of the step's appends, then the embeddings of its tokens into x.
  void begin(int rows, bool fixups, void* st) {
    const ModelConfig& c = M.config();
    if (fixups) dev.launch_fixup();
    cuda::EmbeddingParams em;
    em.type = M.embd_type();
    em.table = M.embd();
    em.n_vocab = V;
    em.n_embd = E;
    em.tokens = tokens.as<int32_t>();
    em.n_tokens = rows;
    em.scale = c.embd_scale;  // gemma3: sqrt(n_embd)
    em.out = x.as<float>();
    cuda::embedding_device(em, st);
  }

  // Layer l's attention block: x += its output (partial: the output projection into po).
  void attention(int l, int rows, bool encodes, const ForwardDevice::KVObserver* obs,
                 const std::vector<std::pair<int, int>>* entry_rows, void* st) {
    const ModelConfig& c = M.config();
    const DeviceLayer& W = M.layers()[size_t(l)];
    const bool gq = use_gemv(W.wqkv, rows, det);
    norm(x.as<float>(), W.attn_norm, rows, gq, xn.data(), xn16.data(), st);
    project(W.wqkv, rows, xn.as<float>(), xn16.data(), qkv.as<float>(), qkvd, false, st, small_rows);
    if (W.qkv_bias) {
      cuda::BiasAddParams b;
      b.rows = rows, b.n = qkvd, b.x = qkv.as<float>(), b.x_stride = qkvd, b.bias = W.qkv_bias;
      cuda::bias_add_device(b, st);
    }
    if (W.q_norm) {
      for (int side = 0; side < 2; ++side) {
        cuda::RmsNormParams n;
        n.n_tokens = rows;
        n.n_heads = side ? H : HQ;
        n.n = D;
        n.x = qkv.as<float>() + (side ? qd : 0);
        n.x_stride = qkvd;
        n.w = side ? W.k_norm : W.q_norm;
        n.eps = c.norm_eps;
        n.out = qkv.as<float>() + (side ? qd : 0);
        n.out_stride = qkvd;
        cuda::rms_norm_device(n, st);
      }
    }
    cuda::RopeParams r;
    r.n_tokens = rows;
    r.head_dim = D;
    r.n_rot = c.n_rot;
    r.neox = c.rope_layout == RopeLayout::NeoX;
    r.pos = dev.positions();
    r.inv_freq = c.is_sliding(l) ? M.inv_freqs_swa() : M.inv_freqs();
    r.q = qkv.as<float>();
    r.n_q_heads = HQ;
    r.q_stride = qkvd;
    r.k = qkv.as<float>() + qd;
    r.n_k_heads = H;
    r.k_stride = qkvd;
    cuda::rope_device(r, st);
    if (obs && *obs) observe(l, rows, *obs, *entry_rows, st);
    dev.launch_append(l, qkv.as<float>() + qd, qkvd, qkv.as<float>() + qd + kvd, qkvd);
    if (encodes) dev.launch_encode(l);
    const bool go = use_gemv(W.wo, rows, det);
    dev.launch_attend(l, qkv.as<float>(), qkvd, c.attn_scale, go ? ElemType::f32 : ElemType::f16, attn.data(), qd);
    if (partial) project(W.wo, rows, attn.as<float>(), attn.data(), po.as<float>(), E, false, st, small_rows);
    else block_out(W.wo, W.post_attn_norm, rows, attn.as<float>(), attn.data(), st);
  }

  // Layer l's MLP block: x += its output (partial: the down projection into po).
  void mlp(int l, int rows, void* st) {
    const ModelConfig& c = M.config();
    const DeviceLayer& W = M.layers()[size_t(l)];
    const bool gg = use_gemv(W.wgu, rows, det);
    norm(x.as<float>(), W.ffn_norm, rows, gg, xn.data(), xn16.data(), st);
    project(W.wgu, rows, xn.as<float>(), xn16.data(), gu.as<float>(), 2 * F, false, st, small_rows);
    const bool gd = use_gemv(W.wdown, rows, det);
    cuda::GluParams gl;
    gl.kind = c.ffn_act == FfnActivation::GeluTanh ? cuda::GluKind::gelu_tanh : cuda::GluKind::swiglu;
    gl.n_tokens = rows;
    gl.n = F;
    gl.gate = gu.as<float>();
    gl.gate_stride = 2 * F;
    gl.up = gu.as<float>() + F;
    gl.up_stride = 2 * F;
    gl.out_type = gd ? ElemType::f32 : ElemType::f16;
    gl.out = act.data();
    cuda::glu_device(gl, st);
    if (partial) project(W.wdown, rows, act.as<float>(), act.data(), po.as<float>(), E, false, st, small_rows);
    else block_out(W.wdown, W.post_ffn_norm, rows, act.as<float>(), act.data(), st);
  }

  // The output head over the lrows rows asked for (lidx) into logits.
  void head(int lrows, void* st) {
    if (lrows == 0) return;
    cuda::GatherRowsParams g;
    g.rows = lrows;
    g.n = E;
    g.x = x.as<float>();
    g.index = lidx.as<int32_t>();
    g.out = xl.data();
    cuda::gather_rows_device(g, st);
    const bool gout = use_gemv(M.output(), lrows, det);
    norm(xl.as<float>(), M.output_norm(), lrows, gout, xl.data(), xl16.data(), st);
    project(M.output(), lrows, xl.as<float>(), xl16.data(), logits.as<float>(), V, false, st, small_lrows);
  }

  void observe(int layer, int rows, const ForwardDevice::KVObserver& obs, const std::vector<std::pair<int, int>>& er,
               void* st) {
    std::vector<float> h(size_t(rows) * qkvd);
    cuda::copy_to_host_async(h.data(), qkv.data(), h.size() * 4, st);
    dev.synchronize();
    std::vector<float> q, k, v;
    for (size_t e = 0; e < er.size(); ++e) {
      const auto [r0, n] = er[e];
      q.resize(size_t(n) * qd), k.resize(size_t(n) * kvd), v.resize(size_t(n) * kvd);
      for (int i = 0; i < n; ++i) {
        const float* row = h.data() + size_t(r0 + i) * qkvd;
        std::memcpy(q.data() + size_t(i) * qd, row, size_t(qd) * 4);
        std::memcpy(k.data() + size_t(i) * kvd, row + qd, size_t(kvd) * 4);
        std::memcpy(v.data() + size_t(i) * kvd, row + qd + kvd, size_t(kvd) * 4);
      }
      obs(layer, int(e), q.data(), k.data(), v.data(), n);
    }
  }
};

ForwardDevice::ForwardDevice(std::shared_ptr<const DeviceModel> model, KVStore& kv) : model_(std::move(model)), kv_(kv) {
  VQ_CHECK(kv.device_kind() == KVDevice::cuda, "forward (cuda): the KV store's blocks live on the cpu");
  const ModelConfig& c = model_->config();
  VQ_CHECK(kv.n_layers() == c.n_layers, "forward (cuda): the KV store has {} layers, the model {}", kv.n_layers(),
           c.n_layers);
  VQ_CHECK(kv.geometry().n_heads == c.n_heads && kv.geometry().n_kv_heads == c.n_kv_heads &&
               kv.geometry().head_dim == c.head_dim,
           "forward (cuda): the KV store's geometry differs from the model's");
  // The llama family (llama, qwen2, qwen3) and gemma3 (GELU MLP, embedding scale, post-norms,
  // sliding-window layers with their own RoPE base).
  VQ_CHECK(c.n_sliding_layers() == 0 || model_->inv_freqs_swa(),
           "forward (cuda): {} has sliding-window layers but the device model has no frequencies for them", c.arch);
  VQ_CHECK(!c.post_norms || std::all_of(model_->layers().begin(), model_->layers().end(),
                                        [](const DeviceLayer& L) { return L.post_attn_norm && L.post_ffn_norm; }),
           "forward (cuda): {} uses post-norms but the device model lacks their weights", c.arch);
  impl_ = std::make_unique<Impl>(*model_, kv);
}

ForwardDevice::~ForwardDevice() = default;

void ForwardDevice::set_deterministic(bool on) {
  Impl& m = *impl_;
  if (m.det == on) return;
  m.det = on;
  m.dev.set_deterministic(on);
  m.graphs.clear();       // captured with the other kernels
  m.cap = m.lcap = 0;     // the next step sizes the buffers again (the mode's fp16 staging)
}
bool ForwardDevice::deterministic() const { return impl_->det; }

// One step's shape, measured before anything changes.
struct StepShape {
  int rows = 0, lrows = 0;
  bool decode_shape = true;
  std::vector<int64_t> counts;  // blocks per layer the appends may take (KVStore::blocks_for_append)
};

namespace {

// Rows of the prefill kernel's chunks last, so that the decode kernels launch over the rows before
// them only (KVStoreDevice::tiles_rows). Each entry's out is its own, so order is free.
template <class E, class N>
void order_entries(const E*& entries, int n_entries, std::vector<E>& ordered, const KVStoreDevice& dev, N n_of) {
  if (n_entries <= 1) return;
  ordered.assign(entries, entries + n_entries);
  std::stable_partition(ordered.begin(), ordered.end(), [&](const E& e) { return !dev.tiles_rows(n_of(e)); });
  entries = ordered.data();
}

StepShape measure(KVStore& kv, const BatchEntry* entries, int n_entries) {
  StepShape s;
  for (int e = 0; e < n_entries; ++e) {
    const BatchEntry& B = entries[e];
    s.rows += B.n;
    s.lrows += B.logits == LogitsWanted::all ? B.n : B.logits == LogitsWanted::last ? 1 : 0;
    s.decode_shape = s.decode_shape && B.n == 1 && B.logits != LogitsWanted::all;
    kv.blocks_for_append(*B.seq, B.n, s.counts);
  }
  return s;
}

void check_room(KVStore& kv, const StepShape& s, const std::string& who) {
  if (kv.pool().can_allocate(s.counts)) return;
  throw KVPoolExhausted(fmt::format("{}: a step of {} tokens needs up to {:.1f} MiB more, {:.1f} MiB of the "
                                    "{:.1f} MiB budget are free",
                                    who, s.rows, double(kv.pool().bytes_of(s.counts)) / 1048576.0,
                                    double(kv.pool().free_bytes()) / 1048576.0,
                                    double(kv.pool().budget_bytes()) / 1048576.0));
}

}  // namespace

// Device memory for every block the step may take and the step's buffers (may throw: out of device
// memory), before anything changes.
void reserve_step(ForwardDevice::Impl& m, const StepShape& s) {
  m.kv.pool().reserve(s.counts);
  m.reserve(s.rows, s.lrows);
}

// The step's bookkeeping on the host (every append, the rows' descriptors) and its tokens and
// logits rows uploaded, after reserve_step. Returns (first row, rows) per entry.
std::vector<std::pair<int, int>> prepare_step(ForwardDevice::Impl& m, const BatchEntry* entries, int n_entries,
                                              const StepShape& s) {
  KVStoreDevice& dev = m.dev;
  KVStore& kv = m.kv;
  dev.begin_step();
  std::vector<int64_t> pos0(static_cast<size_t>(n_entries));
  for (int e = 0; e < n_entries; ++e) {
    pos0[size_t(e)] = entries[e].seq->size();
    for (int l = 0; l < kv.n_layers(); ++l) kv.append_blocks(*entries[e].seq, l, entries[e].n);
  }
  std::vector<std::pair<int, int>> entry_rows;
  for (int e = 0; e < n_entries; ++e)
    entry_rows.emplace_back(dev.add_rows(*entries[e].seq, pos0[size_t(e)], entries[e].n), entries[e].n);
  // Deterministic mode: rows and logits rows of the short entries (first, by the order above).
  m.small_rows = m.small_lrows = 0;
  for (int e = 0; e < n_entries && !dev.tiles_rows(entries[e].n); ++e) {
    const BatchEntry& B = entries[e];
    m.small_rows += B.n;
    m.small_lrows += B.logits == LogitsWanted::all ? B.n : B.logits == LogitsWanted::last ? 1 : 0;
  }
  dev.finish_step();
  void* st = dev.stream();
  // Tokens and the rows whose logits are wanted.
  int32_t* ht = m.h_tokens.as<int32_t>();
  int32_t* hl = m.h_lidx.as<int32_t>();
  int lr = 0;
  for (int e = 0, r = 0; e < n_entries; r += entries[e].n, ++e) {
    const BatchEntry& B = entries[e];
    for (int i = 0; i < B.n; ++i) ht[r + i] = B.tokens[i];
    if (B.logits == LogitsWanted::all)
      for (int i = 0; i < B.n; ++i) hl[lr++] = r + i;
    else if (B.logits == LogitsWanted::last)
      hl[lr++] = r + B.n - 1;
  }
  cuda::copy_to_device_async(m.tokens.data(), ht, size_t(s.rows) * 4, st);
  if (s.lrows) cuda::copy_to_device_async(m.lidx.data(), hl, size_t(s.lrows) * 4, st);
  return entry_rows;
}

// Queues the logits' copy to the host (when wanted), waits for the step, hands each entry its rows.
void finish_step(ForwardDevice::Impl& m, const BatchEntry* entries, int n_entries, int lrows, bool download) {
  const size_t Vn = size_t(m.V);
  download = download && lrows > 0;
  if (download) cuda::copy_to_host_async(m.h_logits.data(), m.logits.data(), size_t(lrows) * Vn * 4, m.dev.stream());
  m.dev.synchronize();
  if (!download) return;
  const float* src = m.h_logits.as<float>();
  for (int e = 0; e < n_entries; ++e) {
    const BatchEntry& B = entries[e];
    const int n = B.logits == LogitsWanted::all ? B.n : B.logits == LogitsWanted::last ? 1 : 0;
    if (n == 0) continue;
    std::memcpy(B.out, src, size_t(n) * Vn * 4);
    src += size_t(n) * Vn;
  }
}

void ForwardDevice::step(const BatchEntry* entries, int n_entries) {
  Impl& m = *impl_;
  KVStoreDevice& dev = m.dev;
  // An observer is told entries by index: their order is kept.
  std::vector<BatchEntry> ordered;
  if (!observer_) order_entries(entries, n_entries, ordered, dev, [](const BatchEntry& e) { return e.n; });
  const StepShape s = measure(kv_, entries, n_entries);
  if (s.rows == 0) return;
  check_room(kv_, s, "kv pool");
  reserve_step(m, s);
  const std::vector<std::pair<int, int>> entry_rows = prepare_step(m, entries, n_entries, s);
  const int rows = s.rows, lrows = s.lrows;
  void* st = dev.stream();
  const bool fixups = dev.step_has_fixups(), encodes = dev.step_has_encodes();
  const bool use_graph = graphs_ && s.decode_shape && !observer_;
  ++stats_.steps;
  if (use_graph) {
    Impl::GraphRec& g = m.graphs[std::make_tuple(rows, lrows, fixups, encodes)];
    if (g.g.valid() && g.kv_version == dev.layout_version() && g.buf_version == m.buf_version) {
      g.g.launch(st);
      ++stats_.graph_replays;
    } else {
      // This step runs eagerly (sizing anything still unsized), then the same launches are
      // recorded for the next steps of this shape.
      m.run(rows, lrows, fixups, encodes, nullptr, nullptr, st);
      ++stats_.eager_steps;
      g.g.reset();
      g.g.begin_capture(st);
      try {
        m.run(rows, lrows, fixups, encodes, nullptr, nullptr, st);
        g.g.end_capture(st);
      } catch (...) {
        cuda::Graph::abort_capture(st);
        g.g.reset();
        throw;
      }
      g.kv_version = dev.layout_version();
      g.buf_version = m.buf_version;
      ++stats_.graph_captures;
    }
  } else {
    m.run(rows, lrows, fixups, encodes, observer_ ? &observer_ : nullptr, &entry_rows, st);
    ++stats_.eager_steps;
  }
  finish_step(m, entries, n_entries, lrows, !skip_download_);
  for (int e = 0; e < n_entries; ++e) kv_.trim(*entries[e].seq);
}

// ---- the split forward over tensor-parallel ranks

struct TPForwardDevice::Rank {
  std::shared_ptr<const DeviceModel> model;
  KVStore* kv = nullptr;
  std::unique_ptr<ForwardDevice::Impl> impl;
};

TPForwardDevice::TPForwardDevice(std::vector<std::shared_ptr<const DeviceModel>> models, std::vector<KVStore*> stores,
                                 std::unique_ptr<cuda::DeviceCommunicator> comm)
    : comm_(std::move(comm)) {
  VQ_CHECK(!models.empty() && models.size() == stores.size(), "tp forward (cuda): {} rank models and {} stores",
           models.size(), stores.size());
  VQ_CHECK(comm_ && comm_->size() == int(models.size()), "tp forward (cuda): a communicator of {} ranks for {} ranks",
           comm_ ? comm_->size() : 0, models.size());
  const ModelConfig& c0 = models[0]->config();
  for (size_t r = 0; r < models.size(); ++r) {
    const ModelConfig& c = models[r]->config();
    KVStore& kv = *stores[r];
    VQ_CHECK(kv.device_kind() == KVDevice::cuda, "tp forward (cuda): rank {}'s KV store lives on the cpu", r);
    VQ_CHECK(c.n_layers == c0.n_layers && c.n_embd == c0.n_embd && c.n_vocab == c0.n_vocab &&
                 c.head_dim == c0.head_dim && kv.n_layers() == c.n_layers,
             "tp forward (cuda): rank {}'s model or store does not match rank 0's", r);
    VQ_CHECK(kv.geometry().n_heads == c.n_heads && kv.geometry().n_kv_heads == c.n_kv_heads &&
                 kv.geometry().head_dim == c.head_dim,
             "tp forward (cuda): rank {}'s KV store geometry differs from its model shard's", r);
    auto R = std::make_unique<Rank>();
    R->model = std::move(models[r]);
    R->kv = &kv;
    cuda::DeviceScope on(comm_->device(int(r)));
    R->impl = std::make_unique<ForwardDevice::Impl>(*R->model, kv);
    R->impl->partial = true;
    ranks_.push_back(std::move(R));
  }
  VQ_CHECK(ranks_[0]->model->output().rows == c0.n_vocab, "tp forward (cuda): rank 0's model has no output head");
}

TPForwardDevice::~TPForwardDevice() {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    cuda::DeviceScope on(comm_->device(int(r)));
    ranks_[r]->impl.reset();
  }
}

int TPForwardDevice::tp() const { return int(ranks_.size()); }

void TPForwardDevice::step(const TPBatchEntry* tentries, int n_entries) {
  const int tp = int(ranks_.size());
  std::vector<TPBatchEntry> ordered;
  order_entries(tentries, n_entries, ordered, ranks_[0]->impl->dev, [](const TPBatchEntry& e) { return e.n; });
  // Every rank's entries (rank 0 alone computes the output head), measured and checked before
  // anything changes.
  std::vector<std::vector<BatchEntry>> ents(static_cast<size_t>(tp));
  std::vector<StepShape> shapes;
  for (int r = 0; r < tp; ++r) {
    for (int e = 0; e < n_entries; ++e) {
      const TPBatchEntry& T = tentries[e];
      BatchEntry b;
      b.seq = &T.seq->ranks[size_t(r)];
      b.tokens = T.tokens;
      b.n = T.n;
      b.logits = r > 0 || !T.out ? LogitsWanted::none : T.all_logits ? LogitsWanted::all : LogitsWanted::last;
      b.out = r > 0 ? nullptr : T.out;
      ents[size_t(r)].push_back(b);
    }
    shapes.push_back(measure(*ranks_[size_t(r)]->kv, ents[size_t(r)].data(), n_entries));
  }
  if (shapes[0].rows == 0) return;
  for (int r = 0; r < tp; ++r)
    check_room(*ranks_[size_t(r)]->kv, shapes[size_t(r)], fmt::format("kv pool of tp rank {}", r));
  for (int r = 0; r < tp; ++r) {  // every rank's memory before any rank's sequences change
    cuda::DeviceScope on(comm_->device(r));
    reserve_step(*ranks_[size_t(r)]->impl, shapes[size_t(r)]);
  }
  const int rows = shapes[0].rows;
  std::vector<void*> streams(static_cast<size_t>(tp));
  std::vector<float*> parts(static_cast<size_t>(tp));
  std::vector<uint8_t> fixups(static_cast<size_t>(tp)), encodes(static_cast<size_t>(tp));
  for (int r = 0; r < tp; ++r) {
    cuda::DeviceScope on(comm_->device(r));
    ForwardDevice::Impl& m = *ranks_[size_t(r)]->impl;
    prepare_step(m, ents[size_t(r)].data(), n_entries, shapes[size_t(r)]);
    streams[size_t(r)] = m.dev.stream();
    parts[size_t(r)] = m.po.as<float>();
    fixups[size_t(r)] = m.dev.step_has_fixups();
    encodes[size_t(r)] = m.dev.step_has_encodes();
  }
  // Layer by layer: each rank's share, the all-reduce of the partials, each rank's residual add.
  auto each = [&](auto&& f) {  // f(rank, its forward, its stream) with the rank's device current
    for (int r = 0; r < tp; ++r) {
      cuda::DeviceScope on(comm_->device(r));
      f(size_t(r), *ranks_[size_t(r)]->impl, streams[size_t(r)]);
    }
  };
  const int n_layers = ranks_[0]->model->config().n_layers;
  const int64_t n_sum = int64_t(rows) * ranks_[0]->impl->E;
  each([&](size_t r, ForwardDevice::Impl& m, void* st) { m.begin(rows, fixups[r] != 0, st); });
  for (int l = 0; l < n_layers; ++l) {
    each([&](size_t r, ForwardDevice::Impl& m, void* st) { m.attention(l, rows, encodes[r] != 0, nullptr, nullptr, st); });
    comm_->all_reduce_sum(parts.data(), n_sum, streams.data());
    each([&](size_t, ForwardDevice::Impl& m, void* st) { m.add_partial(m.M.layers()[size_t(l)].post_attn_norm, rows, st); });
    each([&](size_t, ForwardDevice::Impl& m, void* st) { m.mlp(l, rows, st); });
    comm_->all_reduce_sum(parts.data(), n_sum, streams.data());
    each([&](size_t, ForwardDevice::Impl& m, void* st) { m.add_partial(m.M.layers()[size_t(l)].post_ffn_norm, rows, st); });
  }
  {
    cuda::DeviceScope on(comm_->device(0));
    ForwardDevice::Impl& m0 = *ranks_[0]->impl;
    m0.head(shapes[0].lrows, streams[0]);
  }
  ++steps_;
  for (int r = tp - 1; r >= 0; --r) {  // rank 0 last: its logits copy is the step's end
    cuda::DeviceScope on(comm_->device(r));
    finish_step(*ranks_[size_t(r)]->impl, ents[size_t(r)].data(), n_entries, shapes[size_t(r)].lrows, r == 0);
  }
  for (int r = 0; r < tp; ++r) {
    cuda::DeviceScope on(comm_->device(r));
    for (int e = 0; e < n_entries; ++e) ranks_[size_t(r)]->kv->trim(*ents[size_t(r)][size_t(e)].seq);
  }
}

#endif

}  // namespace vq
