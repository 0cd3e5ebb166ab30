// Model weights on the GPU (device_model.h).
#include "model/device_model.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#include "ops/cuda/gemv_cuda.h"
#include "ops/cuda/kv_blocks_cuda.h"
#include "ops/cuda/stream_cuda.h"
#include "ops/cuda/weights_cuda.h"
#endif

namespace vq {

#ifndef VQ_HAVE_CUDA

struct DeviceModel::Storage {};
DeviceModel::DeviceModel() = default;
DeviceModel::~DeviceModel() = default;
std::shared_ptr<const DeviceModel> DeviceModel::upload(const Model&) {
  VQ_FAIL("device model: this build has no CUDA backend");
}
std::shared_ptr<const DeviceModel> DeviceModel::random(const ModelConfig&, const std::vector<double>&, uint64_t, bool) {
  VQ_FAIL("device model: this build has no CUDA backend");
}
std::shared_ptr<const DeviceModel> DeviceModel::upload_shard(const Model&, const TPPlan&, int, bool) {
  VQ_FAIL("device model: this build has no CUDA backend");
}
size_t DeviceModel::step_weight_bytes(int) const { return 0; }
std::string DeviceModel::describe() const { return ""; }

#else

struct DeviceModel::Storage {
  std::vector<cuda::DeviceBuffer> bufs;
  void* alloc(size_t bytes, size_t& total, const std::string& what) {
    try {
      bufs.emplace_back(bytes);
    } catch (const Error& e) {
      throw Error(fmt::format("device model: out of device memory for {} ({:.1f} MiB; {:.1f} MiB uploaded so far): {}",
                              what, double(bytes) / 1048576.0, double(total) / 1048576.0, e.what()));
    }
    total += bytes;
    return bufs.back().data();
  }
};

DeviceModel::DeviceModel() : st_(std::make_unique<Storage>()) {}
DeviceModel::~DeviceModel() = default;

namespace {

bool gemv_shape_ok(uint32_t type, int64_t cols) {
  if (!cuda::gemv_type_supported(type)) return false;
  return type == cuda::ggml::Q4_K ? cols % 256 == 0 : cols % 32 == 0;
}

// Uploads one model matrix made of `parts` stacked by rows.
struct Uploader {
  DeviceModel::Storage& st;
  size_t& total;
  cuda::DeviceBuffer staging;
  cuda::DeviceBuffer flag;
  void* stream;

  void ensure_staging(size_t bytes) {
    if (staging.size() < bytes) staging = cuda::DeviceBuffer(bytes);
  }

  DeviceMatrix matrix(const std::vector<const WeightMatrix*>& parts, const std::string& what) {
    DeviceMatrix m;
    m.cols = parts[0]->cols;
    for (const WeightMatrix* w : parts) {
      VQ_CHECK(w->cols == m.cols, "device model: {} has {} columns, {} has {}", w->name, w->cols, parts[0]->name,
               m.cols);
      VQ_CHECK(cuda::weight_type_supported(uint32_t(w->type)), "device model: tensor {} has type {}, which the device "
               "cannot decode (it takes f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q4_K q5_K q6_K)",
               w->name, ggml_type_name(w->type));
      m.rows += w->rows;
    }
    m.f16 = st.alloc(size_t(m.rows) * m.cols * 2, total, what + " (fp16)");
    for (const WeightMatrix* w : parts)
      m.act_int8 = m.act_int8 || !(w->type == GGMLType::F32 || w->type == GGMLType::F16 || w->type == GGMLType::BF16);
    m.act_int8 = m.act_int8 && m.cols % 32 == 0;
    int64_t row0 = 0;
    for (const WeightMatrix* w : parts) {
      const size_t rb = ggml_row_bytes(w->type, w->cols);
      ensure_staging(rb * size_t(w->rows));
      cuda::UploadParams u;
      u.name = w->name.c_str();
      u.type = uint32_t(w->type);
      u.host = w->data;
      u.rows = w->rows, u.cols = w->cols;
      u.staging = staging.data();
      u.staging_bytes = staging.size();
      u.overflow_flag = flag.as<int>();
      u.out_type = cuda::ElemType::f16;
      u.out = static_cast<uint8_t*>(m.f16) + size_t(row0) * m.cols * 2;
      cuda::upload_dequantized(u, stream);
      row0 += w->rows;
    }
    // Native quantized parts: runs of one type are packed together (rows are self-contained).
    bool all_ok = true;
    for (const WeightMatrix* w : parts) all_ok = all_ok && gemv_shape_ok(uint32_t(w->type), w->cols);
    if (!all_ok) return m;
    row0 = 0;
    for (size_t i = 0; i < parts.size();) {
      size_t e = i;
      int64_t rows = 0;
      size_t raw = 0;
      while (e < parts.size() && parts[e]->type == parts[i]->type) {
        rows += parts[e]->rows;
        raw += ggml_row_bytes(parts[e]->type, parts[e]->cols) * size_t(parts[e]->rows);
        ++e;
      }
      ensure_staging(raw);
      size_t off = 0;
      for (size_t k = i; k < e; ++k) {
        const size_t b = ggml_row_bytes(parts[k]->type, parts[k]->cols) * size_t(parts[k]->rows);
        cuda::copy_to_device_async(static_cast<uint8_t*>(staging.data()) + off, parts[k]->data, b, stream);
        off += b;
      }
      DeviceMatrix::Part p;
      p.type = uint32_t(parts[i]->type);
      p.row0 = row0;
      p.rows = rows;
      p.packed = st.alloc(cuda::gemv_packed_bytes(p.type, rows, m.cols), total, what + " (packed)");
      cuda::GemvPackParams g;
      g.type = p.type;
      g.src = staging.data();
      g.rows = rows, g.cols = m.cols;
      g.dst = p.packed;
      cuda::gemv_pack_device(g, stream);  // the next copy into staging is ordered after it (one stream)
      m.parts.push_back(p);
      row0 += rows;
      i = e;
    }
    return m;
  }
};

float* upload_vec(DeviceModel::Storage& st, size_t& total, const std::vector<float>& v, const std::string& what) {
  if (v.empty()) return nullptr;
  auto* p = static_cast<float*>(st.alloc(v.size() * 4, total, what));
  cuda::copy_to_device_async(p, v.data(), v.size() * 4, nullptr);
  cuda::device_synchronize();
  return p;
}

std::vector<float> concat(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& c) {
  std::vector<float> r(a);
  r.insert(r.end(), b.begin(), b.end());
  r.insert(r.end(), c.begin(), c.end());
  return r;
}

}  // namespace

// The weights of one model (or one tensor-parallel rank's shard: shards[l] then holds layer l's
// slices of the projections and biases).
std::shared_ptr<DeviceModel> DeviceModel::build(const Model& model, const ModelConfig& cfg,
                                                const std::vector<TPLayerShard>* shards, bool with_output) {
  VQ_CHECK(cuda::cuda_device_available(), "device model: {}", cuda::cuda_unavailable_reason());
  std::shared_ptr<DeviceModel> dm(new DeviceModel());
  dm->cfg_ = cfg;
  Storage& st = *dm->st_;
  size_t& total = dm->bytes_;
  Uploader up{st, total, cuda::DeviceBuffer(), cuda::DeviceBuffer(sizeof(int)), nullptr};
  // the raw embedding table (the lookup decodes its rows)
  const WeightMatrix& emb = model.token_embd();
  VQ_CHECK(cuda::weight_type_supported(uint32_t(emb.type)), "device model: token_embd has type {}, which the device "
           "cannot decode", ggml_type_name(emb.type));
  const size_t emb_bytes = ggml_row_bytes(emb.type, emb.cols) * size_t(emb.rows);
  void* e = st.alloc(emb_bytes, total, "token_embd");
  cuda::copy_to_device_async(e, emb.data, emb_bytes, nullptr);
  dm->embd_ = e;
  dm->embd_type_ = uint32_t(emb.type);
  dm->out_norm_ = upload_vec(st, total, model.output_norm(), "output_norm");
  if (with_output) dm->output_ = up.matrix({&model.output()}, "output");
  for (size_t l = 0; l < model.layers().size(); ++l) {
    const LayerWeights& W = model.layers()[l];
    const TPLayerShard* S = shards ? &(*shards)[l] : nullptr;
    const std::string p = fmt::format("blk.{}", l);
    DeviceLayer D;
    D.attn_norm = upload_vec(st, total, W.attn_norm, p + ".attn_norm");
    D.ffn_norm = upload_vec(st, total, W.ffn_norm, p + ".ffn_norm");
    if (!W.q_bias.empty())
      D.qkv_bias = upload_vec(st, total, S ? concat(S->q_bias, S->k_bias, S->v_bias) : concat(W.q_bias, W.k_bias, W.v_bias),
                              p + ".qkv_bias");
    D.q_norm = upload_vec(st, total, W.q_norm, p + ".attn_q_norm");
    D.k_norm = upload_vec(st, total, W.k_norm, p + ".attn_k_norm");
    D.post_attn_norm = upload_vec(st, total, W.post_attn_norm, p + ".post_attention_norm");
    D.post_ffn_norm = upload_vec(st, total, W.post_ffn_norm, p + ".post_ffw_norm");
    D.wqkv = S ? up.matrix({&S->wq, &S->wk, &S->wv}, p + ".attn_qkv") : up.matrix({&W.wq, &W.wk, &W.wv}, p + ".attn_qkv");
    D.wo = up.matrix({S ? &S->wo : &W.wo}, p + ".attn_output");
    D.wgu = S ? up.matrix({&S->w_gate, &S->w_up}, p + ".ffn_gate_up") : up.matrix({&W.w_gate, &W.w_up}, p + ".ffn_gate_up");
    D.wdown = up.matrix({S ? &S->w_down : &W.w_down}, p + ".ffn_down");
    dm->layers_.push_back(D);
  }
  const auto& f = model.rope_inv_freqs();
  dm->inv_freqs_ = static_cast<double*>(st.alloc(f.size() * 8, total, "rope frequencies"));
  cuda::copy_to_device_async(dm->inv_freqs_, f.data(), f.size() * 8, nullptr);
  if (const auto& fs = model.rope_inv_freqs_swa(); !fs.empty()) {
    dm->inv_freqs_swa_ = static_cast<double*>(st.alloc(fs.size() * 8, total, "rope frequencies (sliding layers)"));
    cuda::copy_to_device_async(dm->inv_freqs_swa_, fs.data(), fs.size() * 8, nullptr);
  }
  cuda::device_synchronize();
  return dm;
}

std::shared_ptr<const DeviceModel> DeviceModel::upload(const Model& model) {
  static std::mutex mu;
  static std::map<std::pair<const Model*, const void*>, std::weak_ptr<const DeviceModel>> cache;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(&model, model.token_embd().data);
  if (auto it = cache.find(key); it != cache.end())
    if (auto sp = it->second.lock()) return sp;
  std::shared_ptr<DeviceModel> dm = build(model, model.config(), nullptr, true);
  cache[key] = dm;
  return dm;
}

std::shared_ptr<const DeviceModel> DeviceModel::upload_shard(const Model& model, const TPPlan& plan, int rank,
                                                             bool with_output) {
  const TPRankWeights w = make_rank_weights(model, plan, rank);  // views and column copies on the host
  return build(model, tp_rank_config(model.config(), plan, rank), &w.layers, with_output);
}

std::shared_ptr<const DeviceModel> DeviceModel::random(const ModelConfig& c, const std::vector<double>& inv_freqs,
                                                       uint64_t seed, bool with_output) {
  VQ_CHECK(cuda::cuda_device_available(), "device model: {}", cuda::cuda_unavailable_reason());
  std::shared_ptr<DeviceModel> dm(new DeviceModel());
  dm->cfg_ = c;
  Storage& st = *dm->st_;
  size_t& total = dm->bytes_;
  auto fill = [&](void* p, cuda::ElemType t, int64_t n, float scale, float offset) {
    cuda::RandomFillParams r;
    r.type = t, r.out = p, r.n = n, r.seed = ++seed, r.scale = scale, r.offset = offset;
    cuda::random_fill_device(r);
  };
  auto mat = [&](int64_t rows, int64_t cols, const std::string& what) {
    DeviceMatrix m;
    m.rows = rows, m.cols = cols;
    m.f16 = st.alloc(size_t(rows) * cols * 2, total, what);
    fill(m.f16, cuda::ElemType::f16, rows * cols, 1.0f / std::sqrt(float(cols)), 0.f);
    return m;
  };
  auto vec = [&](int64_t n, float offset, const std::string& what) {
    auto* p = static_cast<float*>(st.alloc(size_t(n) * 4, total, what));
    fill(p, cuda::ElemType::f32, n, 0.1f, offset);
    return p;
  };
  const int64_t E = c.n_embd, qd = c.q_dim(), kvd = c.kv_dim(), F = c.n_ff, V = c.n_vocab;
  void* e = st.alloc(size_t(V) * E * 2, total, "token_embd");
  fill(e, cuda::ElemType::f16, V * E, 1.0f, 0.f);
  dm->embd_ = e;
  dm->embd_type_ = cuda::ggml::F16;
  dm->out_norm_ = vec(E, 1.0f, "output_norm");
  if (with_output) dm->output_ = mat(V, E, "output");
  for (int l = 0; l < c.n_layers; ++l) {
    DeviceLayer D;
    D.attn_norm = vec(E, 1.0f, "attn_norm");
    D.ffn_norm = vec(E, 1.0f, "ffn_norm");
    if (c.qkv_bias) D.qkv_bias = vec(qd + 2 * kvd, 0.0f, "qkv_bias");
    if (c.qk_norm) D.q_norm = vec(c.head_dim, 1.0f, "q_norm"), D.k_norm = vec(c.head_dim, 1.0f, "k_norm");
    D.wqkv = mat(qd + 2 * kvd, E, "attn_qkv");
    D.wo = mat(E, qd, "attn_output");
    D.wgu = mat(2 * F, E, "ffn_gate_up");
    D.wdown = mat(E, F, "ffn_down");
    dm->layers_.push_back(D);
  }
  dm->inv_freqs_ = static_cast<double*>(st.alloc(inv_freqs.size() * 8, total, "rope frequencies"));
  cuda::copy_to_device_async(dm->inv_freqs_, inv_freqs.data(), inv_freqs.size() * 8, nullptr);
  cuda::device_synchronize();
  return dm;
}

namespace {
size_t matrix_step_bytes(const DeviceMatrix& m, int rows) {
  bool gemv = m.has_gemv() && rows <= cuda::kGemvMaxRows;  // forward_device.cpp path_of
  for (const auto& p : m.parts) gemv = gemv && cuda::gemv_preferred(p.type, rows);
  if (!gemv) return size_t(m.rows) * m.cols * 2;
  size_t b = 0;
  for (const auto& p : m.parts) b += cuda::gemv_packed_bytes(p.type, p.rows, m.cols);
  return b;
}
}  // namespace

size_t DeviceModel::step_weight_bytes(int m) const {
  size_t b = matrix_step_bytes(output_, m);
  for (const auto& L : layers_)
    b += matrix_step_bytes(L.wqkv, m) + matrix_step_bytes(L.wo, m) + matrix_step_bytes(L.wgu, m) +
         matrix_step_bytes(L.wdown, m);
  return b;
}

std::string DeviceModel::describe() const {
  size_t f16 = size_t(output_.rows) * output_.cols * 2, packed = 0;
  auto add = [&](const DeviceMatrix& m) {
    f16 += size_t(m.rows) * m.cols * 2;
    for (const auto& p : m.parts) packed += cuda::gemv_packed_bytes(p.type, p.rows, m.cols);
  };
  for (const auto& p : output_.parts) packed += cuda::gemv_packed_bytes(p.type, p.rows, output_.cols);
  for (const auto& L : layers_) add(L.wqkv), add(L.wo), add(L.wgu), add(L.wdown);
  return fmt::format("weights on the device: fp16 {:.2f} GB, native quantized {:.2f} GB", double(f16) / 1e9,
                     double(packed) / 1e9);
}

#endif

}  // namespace vq
