#include "kvcache/vecinfer_gpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "codec/calibration_check.h"
#include "codec/calibration_file.h"
#include "codec/key_transform.h"
#include "core/error.h"
#include "core/fp16.h"
#include "kvcache/factory.h"
#include "kvcache/factory.h"

#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#include "ops/cuda/pq.h"
#include "ops/cuda/pq_attention_cuda.h"
#endif

namespace vq {

std::string vecinfer_gpu_unsupported_reason(const KVGeometry& g, const KVCacheConfig& cfg) {
#ifndef VQ_HAVE_CUDA
  (void)g;
  (void)cfg;
  return "this build has no CUDA backend";
#else
  const int D = g.head_dim;
  if (D != 64 && D != 128 && D != 256) return fmt::format("head_dim {} (the CUDA kernels take 64, 128 or 256)", D);
  for (const PQPreset* p : {&cfg.key, &cfg.value}) {
    const int d = p->sub_dim;
    if (!((d == 4 || d == 8 || d == 16) && (D / 8) % d == 0))
      return fmt::format("sub_dim {} with head_dim {} (the CUDA attention takes 4, 8 or 16 dividing head_dim/8)", d, D);
  }
  if (!cuda::cuda_device_available()) return cuda::cuda_unavailable_reason();
  return "";
#endif
}

#ifndef VQ_HAVE_CUDA

std::unique_ptr<KVCache> make_vecinfer_gpu_cache(const KVGeometry& g, const KVCacheConfig& cfg,
                                                 std::shared_ptr<const Calibration>, int) {
  VQ_CHECK(cfg.use_gpu_kernels != GpuKernels::require, "kv_cache.use_gpu_kernels: require but {}",
           vecinfer_gpu_unsupported_reason(g, cfg));
  return nullptr;
}

#else

namespace {

constexpr int kFlushBlock = 32;  // tokens leaving the fp16 window per encode (the CPU store's block)

class VecInferGpuCache final : public KVCache {
 public:
  VecInferGpuCache(const KVGeometry& g, const KVCacheConfig& cfg, std::shared_ptr<const Calibration> calib, int layer)
      : geo_(g), cfg_(cfg), calib_(std::move(calib)) {
    check_geometry(g, "vecinfer gpu cache");
    cfg_.validate(g.head_dim);
    VQ_CHECK(calib_, "{}", calibration_howto(cfg_));
    const Calibration& c = *calib_;
    VQ_CHECK(layer >= 0 && layer < c.n_layers, "vecinfer cache: layer {} but the calibration has {} layers", layer,
             c.n_layers);
    check_calibration_matches(c, cfg, g, c.n_layers);  // the layer index is checked above
    const CalibrationLayer& L = c.layers[size_t(layer)];
    per_sub_ = c.granularity == Granularity::per_subspace;
    lambda_host_ = L.smoothing;
    lambda_ = cuda::to_device(L.smoothing.data(), L.smoothing.size() * 4);
    kbook32_ = cuda::to_device(L.key_codebooks.data(), L.key_codebooks.size() * 4);
    vbook32_ = cuda::to_device(L.value_codebooks.data(), L.value_codebooks.size() * 4);
    kbook16_ = cuda::DeviceBuffer(L.key_codebooks.size() * 2);
    vbook16_ = cuda::DeviceBuffer(L.value_codebooks.size() * 2);
    cuda::f32_to_f16_device(kbook32_.as<float>(), kbook16_.as<uint16_t>(), int64_t(L.key_codebooks.size()));
    cuda::f32_to_f16_device(vbook32_.as<float>(), vbook16_.as<uint16_t>(), int64_t(L.value_codebooks.size()));
    krow_ = cuda::code_row_bytes(g.head_dim / cfg.key.sub_dim, cfg.key.bits);
    vrow_ = cuda::code_row_bytes(g.head_dim / cfg.value.sub_dim, cfg.value.bits);
    cuda::device_synchronize();
  }

  void append(const float* k, const float* v, int n) override {
    VQ_CHECK(n >= 0, "{} append: n_tokens = {} must be >= 0", name(), n);
    // Same policy as VecInferCache::append: the sequence's first sink_tokens tokens go to the fp16
    // sink store for good (only ever at the start, before anything reaches the window).
    const int to_sink = int(std::min<int64_t>(n, cfg_.sink_tokens - ns_));
    if (to_sink > 0) {
      push_sink(k, v, to_sink);
      k += size_t(to_sink) * token_elems();
      v += size_t(to_sink) * token_elems();
      n -= to_sink;
      if (n == 0) return;
    }
    const int64_t excess = wn_ - cfg_.residual_length;  // same policy as VecInferCache::append
    if (excess >= kFlushBlock) flush(excess / kFlushBlock * kFlushBlock);
    push(k, v, n);
  }

  void attend(const float* q, int n_q, float scale, float* out) const override;
  int64_t size() const override { return ns_ + n_coded_ + wn_; }
  // Keeps the device allocations (as before) for the next sequence; bytes() counts them.
  void clear() override { ns_ = 0, n_coded_ = 0, w0_ = 0, wn_ = 0; }
  // Device bytes held for K/V: code buffers, both ping-pong window buffers, the sink store (all
  // at capacity, as VecInferCache counts its pages, window and sinks at capacity).
  size_t bytes() const override {
    return kcodes_.size() + vcodes_.size() + 2 * (win_[0][0].size() + win_[0][1].size()) + sink_[0].size() +
           sink_[1].size();
  }
  size_t codebook_bytes() const override {
    return lambda_.size() + kbook32_.size() + vbook32_.size() + kbook16_.size() + vbook16_.size();
  }
  const KVGeometry& geometry() const override { return geo_; }
  std::string name() const override { return cfg_.name(); }

 private:
  size_t token_elems() const { return size_t(geo_.n_kv_heads) * geo_.head_dim; }
  void flush(int64_t n);
  void push(const float* k, const float* v, int n);
  void push_sink(const float* k, const float* v, int n);
  void reserve_codes(int64_t n);

  KVGeometry geo_;
  KVCacheConfig cfg_;
  std::shared_ptr<const Calibration> calib_;
  bool per_sub_ = false;
  std::vector<float> lambda_host_;  // [n_kv_heads, head_dim]
  // Device: lambda [H, D] f32; books [H, books, 2^bits, sub_dim] as f32 (encoder) and f16 (attention).
  cuda::DeviceBuffer lambda_, kbook32_, vbook32_, kbook16_, vbook16_;
  size_t krow_ = 0, vrow_ = 0;
  // Codes, head-major: kcodes_ [H][ccap_][krow_], vcodes_ [H][ccap_][vrow_] (ccap_ a multiple of 16).
  cuda::DeviceBuffer kcodes_, vcodes_;
  int64_t ccap_ = 0, n_coded_ = 0;
  // fp16 window, token-major: win_[i][0] keys, win_[i][1] values, each [wcap_][H][D]; tokens
  // [w0_, w0_ + wn_) of buffer cur_ are live; the other buffer takes them when compacting.
  cuda::DeviceBuffer win_[2][2];
  int cur_ = 0;
  int64_t wcap_ = 0, w0_ = 0, wn_ = 0;
  // fp16 attention sinks (the sequence's first cfg_.sink_tokens tokens, never encoded): sink_[0]
  // keys, sink_[1] values, each [cfg_.sink_tokens][H][D] token-major (allocated at the first
  // token); tokens [0, ns_) are live.
  cuda::DeviceBuffer sink_[2];
  int64_t ns_ = 0;
  std::vector<uint16_t> stage_;  // host fp16 staging of appended tokens
  // Per-call scratch (grow-only): arguments blob, outputs, workspace.
  mutable cuda::DeviceBuffer args_, work_;
  mutable std::vector<unsigned char> blob_;
};

void VecInferGpuCache::reserve_codes(int64_t need) {
  if (need <= ccap_) return;
  const int64_t cap = (std::max<int64_t>({need, 2 * ccap_, 512}) + 15) / 16 * 16;
  const size_t H = size_t(geo_.n_kv_heads);
  cuda::DeviceBuffer k(H * size_t(cap) * krow_), v(H * size_t(cap) * vrow_);
  cuda::copy_device_2d(k.data(), size_t(cap) * krow_, kcodes_.data(), size_t(ccap_) * krow_, size_t(n_coded_) * krow_, H);
  cuda::copy_device_2d(v.data(), size_t(cap) * vrow_, vcodes_.data(), size_t(ccap_) * vrow_, size_t(n_coded_) * vrow_, H);
  cuda::device_synchronize();  // the old buffers are freed next
  kcodes_ = std::move(k);
  vcodes_ = std::move(v);
  ccap_ = cap;
}

void VecInferGpuCache::flush(int64_t n) {
  reserve_codes(n_coded_ + n);
  const size_t te = token_elems();
  for (int side = 0; side < 2; ++side) {
    const PQPreset& pr = side ? cfg_.value : cfg_.key;
    const size_t row = side ? vrow_ : krow_;
    cuda::FusedEncodeArgs a;
    a.n_tokens = n;
    a.n_heads = geo_.n_kv_heads;
    a.head_dim = geo_.head_dim;
    a.sub_dim = pr.sub_dim;
    a.bits = pr.bits;
    a.per_subspace = per_sub_;
    a.in_type = cuda::ElemType::f16;
    a.x = win_[cur_][side].as<uint16_t>() + size_t(w0_) * te;
    a.lambda = side ? nullptr : lambda_.as<float>();
    a.hadamard = side == 0;
    a.codebooks = side ? vbook32_.as<float>() : kbook32_.as<float>();
    a.codes = (side ? vcodes_ : kcodes_).as<uint8_t>() + size_t(n_coded_) * row;
    a.code_head_stride = ccap_ * int64_t(row);
    a.code_token_stride = int64_t(row);
    cuda::fused_encode_device(a);
  }
  w0_ += n;
  wn_ -= n;
  n_coded_ += n;
}

void VecInferGpuCache::push(const float* k, const float* v, int n) {
  if (n == 0) return;
  const size_t te = token_elems();
  if (w0_ + wn_ + n > wcap_) {
    const int64_t need = wn_ + n;
    if (need > wcap_) {  // grow: fresh pair of buffers, live tokens copied to the front
      const int64_t cap = (std::max<int64_t>({2 * need, 2 * (cfg_.residual_length + kFlushBlock), 64}) + 15) / 16 * 16;
      cuda::DeviceBuffer nb[2][2];
      for (auto& pair : nb)
        for (auto& b : pair) b = cuda::DeviceBuffer(size_t(cap) * te * 2);
      for (int s = 0; s < 2; ++s)
        cuda::copy_device(nb[0][s].data(), win_[cur_][s].as<uint16_t>() + size_t(w0_) * te, size_t(wn_) * te * 2);
      cuda::device_synchronize();
      for (int i = 0; i < 2; ++i)
        for (int s = 0; s < 2; ++s) win_[i][s] = std::move(nb[i][s]);
      cur_ = 0;
      wcap_ = cap;
    } else {  // compact into the other buffer
      const int o = 1 - cur_;
      for (int s = 0; s < 2; ++s)
        cuda::copy_device(win_[o][s].data(), win_[cur_][s].as<uint16_t>() + size_t(w0_) * te, size_t(wn_) * te * 2);
      cur_ = o;
    }
    w0_ = 0;
  }
  stage_.resize(size_t(n) * te);
  for (int s = 0; s < 2; ++s) {
    const float* src = s ? v : k;
    for (size_t i = 0; i < stage_.size(); ++i) stage_[i] = f32_to_f16(src[i]);
    win_[cur_][s].upload(stage_.data(), stage_.size() * 2, size_t(w0_ + wn_) * te * 2);
  }
  wn_ += n;
}

void VecInferGpuCache::push_sink(const float* k, const float* v, int n) {
  const size_t te = token_elems();
  if (sink_[0].size() == 0)
    for (auto& b : sink_) b = cuda::DeviceBuffer(size_t(cfg_.sink_tokens) * te * 2);
  stage_.resize(size_t(n) * te);
  for (int s = 0; s < 2; ++s) {
    const float* src = s ? v : k;
    for (size_t i = 0; i < stage_.size(); ++i) stage_[i] = f32_to_f16(src[i]);
    sink_[s].upload(stage_.data(), stage_.size() * 2, size_t(ns_) * te * 2);
  }
  ns_ += n;
}

template <class T>
size_t put(std::vector<unsigned char>& blob, const T* src, size_t n) {
  const size_t off = (blob.size() + 15) / 16 * 16;
  blob.resize(off + n * sizeof(T));
  std::memcpy(blob.data() + off, src, n * sizeof(T));
  return off;
}

void VecInferGpuCache::attend(const float* q, int n_q, float scale, float* out) const {
  const int HQ = geo_.n_heads, H = geo_.n_kv_heads, D = geo_.head_dim;
  const int64_t n = size();
  VQ_CHECK(n_q >= 0 && n_q <= n, "{} attend: n_q = {} must be in 0..size() = {}", name(), n_q, n);
  VQ_CHECK(n_q <= 65535, "{} attend: n_q = {} must be <= 65535 on the GPU", name(), n_q);
  if (n_q == 0) return;
  const size_t qn = size_t(n_q) * HQ * D;
  // q_code: [n_q, HQ, D] q~ * scale; q_plain: [n_q, HQ, D] q * scale
  std::vector<float> qc(q, q + qn), qp(q, q + qn);
  if (n_coded_ > 0) transform_queries(qc.data(), n_q, HQ, H, D, lambda_host_.data());
  for (size_t i = 0; i < qn; ++i) qc[i] *= scale, qp[i] *= scale;
  // Per row i (query position n - n_q + i): visible sink, coded and window tokens (positions:
  // [0, ns_) sinks, then ns_ + [0, n_coded_) codes, then the window).
  std::vector<int> ncoded(static_cast<size_t>(n_q)), wlen(static_cast<size_t>(n_q)), slen(static_cast<size_t>(n_q));
  std::vector<const uint8_t*> kp(size_t(n_q), kcodes_.as<uint8_t>()), vp(size_t(n_q), vcodes_.as<uint8_t>());
  const size_t te = token_elems();
  std::vector<const uint16_t*> wk(size_t(n_q), win_[cur_][0].as<uint16_t>() + size_t(w0_) * te),
      wv(size_t(n_q), win_[cur_][1].as<uint16_t>() + size_t(w0_) * te);
  std::vector<const uint16_t*> sk(size_t(n_q), sink_[0].as<uint16_t>()), sv(size_t(n_q), sink_[1].as<uint16_t>());
  int max_coded = 0;
  for (int i = 0; i < n_q; ++i) {
    const int64_t vis = n - n_q + i + 1;
    slen[size_t(i)] = int(std::min(vis, ns_));
    ncoded[size_t(i)] = int(std::clamp<int64_t>(vis - ns_, 0, n_coded_));
    wlen[size_t(i)] = int(std::max<int64_t>(0, vis - ns_ - n_coded_));
    max_coded = std::max(max_coded, ncoded[size_t(i)]);
  }
  blob_.clear();
  const size_t o_qc = put(blob_, qc.data(), qn), o_qp = put(blob_, qp.data(), qn);
  const size_t o_kp = put(blob_, kp.data(), kp.size()), o_vp = put(blob_, vp.data(), vp.size());
  const size_t o_wk = put(blob_, wk.data(), wk.size()), o_wv = put(blob_, wv.data(), wv.size());
  const size_t o_nc = put(blob_, ncoded.data(), ncoded.size()), o_wl = put(blob_, wlen.data(), wlen.size());
  const size_t o_sk = put(blob_, sk.data(), sk.size()), o_sv = put(blob_, sv.data(), sv.size());
  const size_t o_sl = put(blob_, slen.data(), slen.size());
  const size_t o_out = (blob_.size() + 15) / 16 * 16;
  const size_t total = o_out + qn * 4;
  if (args_.size() < total) args_ = cuda::DeviceBuffer(total + total / 2);
  args_.upload(blob_.data(), blob_.size());
  unsigned char* base = args_.as<unsigned char>();

  cuda::PQAttnBatchArgs a;
  a.rows = n_q;
  a.n_kv_heads = H;
  a.group = HQ / H;
  a.head_dim = D;
  a.k_sub_dim = cfg_.key.sub_dim, a.k_bits = cfg_.key.bits, a.k_per_subspace = per_sub_;
  a.v_sub_dim = cfg_.value.sub_dim, a.v_bits = cfg_.value.bits, a.v_per_subspace = per_sub_;
  a.q_code = reinterpret_cast<const float*>(base + o_qc);
  a.q_plain = reinterpret_cast<const float*>(base + o_qp);
  a.k_codes = reinterpret_cast<const uint8_t* const*>(base + o_kp);
  a.v_codes = reinterpret_cast<const uint8_t* const*>(base + o_vp);
  a.n_coded = reinterpret_cast<const int*>(base + o_nc);
  a.code_head_stride = ccap_;
  a.max_coded = max_coded;
  a.k_book = kbook16_.as<uint16_t>();
  a.v_book = vbook16_.as<uint16_t>();
  a.seg[0].k = reinterpret_cast<const uint16_t* const*>(base + o_wk);
  a.seg[0].v = reinterpret_cast<const uint16_t* const*>(base + o_wv);
  a.seg[0].len = reinterpret_cast<const int*>(base + o_wl);
  a.seg[0].head_stride = D;
  a.seg[0].token_stride = int64_t(te);
  if (ns_ > 0) {  // segment 1: the fp16 sinks (order is irrelevant to softmax attention)
    a.seg[1].k = reinterpret_cast<const uint16_t* const*>(base + o_sk);
    a.seg[1].v = reinterpret_cast<const uint16_t* const*>(base + o_sv);
    a.seg[1].len = reinterpret_cast<const int*>(base + o_sl);
    a.seg[1].head_stride = D;
    a.seg[1].token_stride = int64_t(te);
  }
  a.out = reinterpret_cast<float*>(base + o_out);
  const size_t ws = cuda::pq_attention_workspace_bytes(a);
  if (work_.size() < ws) work_ = cuda::DeviceBuffer(ws + ws / 2);
  a.workspace = work_.data();
  a.workspace_bytes = work_.size();
  cuda::pq_attention_device(a);
  args_.download(out, qn * 4, o_out);  // synchronous: orders after the kernels
}

}  // namespace

std::unique_ptr<KVCache> make_vecinfer_gpu_cache(const KVGeometry& g, const KVCacheConfig& cfg,
                                                 std::shared_ptr<const Calibration> calib, int layer) {
  if (cfg.use_gpu_kernels == GpuKernels::forbid) return nullptr;
  const std::string why = vecinfer_gpu_unsupported_reason(g, cfg);
  if (!why.empty()) {
    VQ_CHECK(cfg.use_gpu_kernels != GpuKernels::require, "kv_cache.use_gpu_kernels: require but {}", why);
    return nullptr;
  }
  return std::make_unique<VecInferGpuCache>(g, cfg, std::move(calib), layer);
}

#endif  // VQ_HAVE_CUDA

}  // namespace vq
