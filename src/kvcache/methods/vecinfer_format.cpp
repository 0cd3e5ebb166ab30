// VecInfer's coded block: keys smoothed + Hadamard-rotated then product-quantized, values
// product-quantized, codes bit-packed. Block: keys [n_kv_heads][block_tokens][krow] then values
// [n_kv_heads][block_tokens][vrow]. Attention on the codes: per (query, KV head) a lookup table
// LUT[j][c] = q~_j . c, scores as sums of table reads, values decoded in registers
// (ops/cpu/pq_attention.h). With a rotated key mean in the calibration (codec/key_mean.h) the keys
// are coded without it and its exact score is added per 16-token segment.
#include <algorithm>
#include <atomic>
#include <vector>

#include "codec/calibration_check.h"
#include "codec/calibration_file.h"
#include "codec/key_mean.h"
#include "codec/key_transform.h"
#include "codec/learned_key_map.h"
#include "codec/product_quantizer.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kvcache/factory.h"
#include "kvcache/kv_format.h"
#include "ops/cpu/pq_attention.h"
#include "ops/online_softmax.h"
#include "ops/ref/pq_attention.h"

namespace vq {
namespace {

// Table buffers of finished preparations, kept by the thread that drives attend() for its next
// ones: a decode step prepares every sequence of every layer (n_kv_heads tables of 64-256 KiB
// each), and allocating them fresh zero-filled and faulted in the pages each time (SmolLM2 at
// batch 8: ~46 MB of memset per step).
constexpr size_t kLutPoolMax = 256;
thread_local std::vector<AlignedBuffer<float>> lut_pool;

// Transformed queries q~ * scale and, for decode (few queries), every (query, KV head) table
// built up front so that the key ranges of all threads share them.
class VecInferPrep final : public QueryPrep {
 public:
  ~VecInferPrep() override {
    if (luts.size() > 0 && lut_pool.size() < kLutPoolMax) lut_pool.push_back(std::move(luts));
  }
  std::vector<float> qt;    // [n_q, n_heads, head_dim]
  std::vector<float> q;     // [n_q, n_heads, head_dim] the queries as given (rotated key mean only)
  float scale = 1;
  bool prebuilt = false;         // luts holds every (query, KV head) table
  AlignedBuffer<float> luts;     // [n_q, n_kv_heads, lut_n] (at least) when prebuilt
  size_t lut_n = 0;
  // Distinct per preparation: keys the table a thread built last for (query, head) when the
  // tables are not prebuilt (prefill), so the calls of one query over consecutive key units
  // build it once. An address would not do: a new preparation may reuse a freed one's.
  uint64_t id = next_id.fetch_add(1, std::memory_order_relaxed) + 1;
  static inline std::atomic<uint64_t> next_id{0};
};

class VecInferFormat final : public CodedFormat {
 public:
  VecInferFormat(const KVGeometry& g, int B, const KVCacheConfig& cfg, const Calibration& c, int layer)
      : CodedFormat(g, B), cfg_(cfg), key_mean_(c, layer) {
    const CalibrationLayer& L = c.layers[size_t(layer)];
    lambda_ = L.smoothing;
    const int H = g.n_kv_heads, D = g.head_dim;
    if (c.learned_keys()) {
      key_map_ = L.key_map;
      query_map_ = key_maps_query_side(key_map_.data(), H, D, "vecinfer cache");
    }
    const size_t kf = c.key_codebook_floats() / size_t(H), vf = c.value_codebook_floats() / size_t(H);
    for (int h = 0; h < H; ++h) {
      kpq_.emplace_back(D, c.key, c.granularity,
                        std::vector<float>(L.key_codebooks.begin() + h * kf, L.key_codebooks.begin() + (h + 1) * kf));
      vpq_.emplace_back(D, c.value, c.granularity,
                        std::vector<float>(L.value_codebooks.begin() + h * vf, L.value_codebooks.begin() + (h + 1) * vf));
      kbook_t_.push_back(cpu::transpose_codebook(kpq_.back().codebooks().data(), kpq_.back().n_books(), c.key.bits,
                                                 c.key.sub_dim));
    }
    krow_ = kpq_[0].code_size();
    vrow_ = vpq_[0].code_size();
    base_.group = g.n_heads / g.n_kv_heads;
    base_.head_dim = D;
    base_.k_sub_dim = c.key.sub_dim;
    base_.k_bits = c.key.bits;
    base_.k_books = kpq_[0].n_books();
    base_.v_sub_dim = c.value.sub_dim;
    base_.v_bits = c.value.bits;
    base_.v_books = vpq_[0].n_books();
    lut_n_ = cpu::pq_lut_floats(base_);
  }

  std::string name() const override { return cfg_.name(); }
  size_t keys_bytes() const { return size_t(geo_.n_kv_heads) * B_ * krow_; }
  size_t block_bytes() const override { return keys_bytes() + size_t(geo_.n_kv_heads) * B_ * vrow_; }
  size_t codebook_bytes() const override {
    size_t b = (lambda_.size() + key_map_.size() + query_map_.size()) * 4;
    for (size_t h = 0; h < kpq_.size(); ++h)
      b += (kpq_[h].codebooks().size() + vpq_[h].codebooks().size() + kbook_t_[h].size()) * 4;
    return b;
  }

  void encode_block(float* kf, float* vf, uint8_t* block, int64_t pos0) const override {
    const int H = geo_.n_kv_heads, D = geo_.head_dim;
    if (!key_mean_.empty()) key_mean_.subtract(pos0, B_, kf, D, int64_t(B_) * D);  // kf: [H][B][D]
    for (int h = 0; h < H; ++h) {
      float* x = kf + size_t(h) * B_ * D;
      if (key_map_.empty())
        transform_keys(x, B_, 1, D, lambda_.data() + size_t(h) * D);
      else
        transform_keys_mapped(x, B_, 1, D, lambda_.data() + size_t(h) * D, key_map_.data() + size_t(h) * D * D);
    }
    for (int h = 0; h < H; ++h) {
      kpq_[size_t(h)].encode(kf + size_t(h) * B_ * D, B_, block + size_t(h) * B_ * krow_);
      vpq_[size_t(h)].encode(vf + size_t(h) * B_ * D, B_, block + keys_bytes() + size_t(h) * B_ * vrow_);
    }
  }

  std::unique_ptr<QueryPrep> prepare(const float* q, int n_q, float scale) const override {
    const int HQ = geo_.n_heads, H = geo_.n_kv_heads, D = geo_.head_dim, G = HQ / H;
    auto p = std::make_unique<VecInferPrep>();
    p->qt.assign(q, q + size_t(n_q) * HQ * D);
    if (!key_mean_.empty()) p->q = p->qt;
    p->scale = scale;
    if (query_map_.empty())
      transform_queries(p->qt.data(), n_q, HQ, H, D, lambda_.data());
    else
      transform_queries_mapped(p->qt.data(), n_q, HQ, H, D, lambda_.data(), query_map_.data());
    for (auto& x : p->qt) x *= scale;
    p->lut_n = lut_n_;
    if (n_q <= 4) {
      const size_t need = size_t(n_q) * H * lut_n_;
      if (!lut_pool.empty()) {
        p->luts = std::move(lut_pool.back());
        lut_pool.pop_back();
      }
      if (p->luts.size() < need) p->luts.resize(need);
      p->prebuilt = true;
      // Each table in parts of its key sub-spaces, so that few tables (one KV head: Gemma 3) still
      // keep every thread busy: about two parts per thread over all tables.
      const int nks = D / base_.k_sub_dim, n_tab = n_q * H;
      const int parts = std::clamp((2 * num_threads() + n_tab - 1) / n_tab, 1, nks);
      parallel_for(size_t(n_tab) * parts, [&](size_t b, size_t e, int) {
        for (size_t it = b; it < e; ++it) {
          const int tab = int(it / parts), part = int(it % parts);
          const int i = tab / H, h = tab % H;
          PQAttnArgs a = base_;
          a.q = p->qt.data() + (size_t(i) * HQ + size_t(h) * G) * D;
          a.v_codebook = vpq_[size_t(h)].codebooks().data();  // requested into L2 during the build
          cpu::pq_build_lut_part(a, kbook_t_[size_t(h)].data(), p->luts.data() + size_t(tab) * lut_n_,
                                 nks * part / parts, nks * (part + 1) / parts);
        }
      });
    }
    return p;
  }

  void attend(const QueryPrep& prep_in, int i, int h, const uint8_t* const* blocks, int first, int64_t n, float* m,
              float* d, float* o, int64_t pos0) const override {
    const auto& prep = static_cast<const VecInferPrep&>(prep_in);
    const int HQ = geo_.n_heads, H = geo_.n_kv_heads, D = geo_.head_dim, G = HQ / H;
    PQAttnArgs a = base_;
    a.q = prep.qt.data() + (size_t(i) * HQ + size_t(h) * G) * D;
    a.k_codebook = kpq_[size_t(h)].codebooks().data();
    a.v_codebook = vpq_[size_t(h)].codebooks().data();
    thread_local std::vector<float> bias;  // [segments of the run, G]: the rotated key mean's score terms
    if (!key_mean_.empty()) {
      const int64_t p_first = pos0 + first, T = key_mean_.tokens();
      const int n_seg = int((p_first + n - 1) / T - p_first / T + 1);
      bias.resize(size_t(n_seg) * G);
      key_mean_.score_bias(h, prep.q.data() + (size_t(i) * HQ + size_t(h) * G) * D, G, prep.scale, p_first, n_seg,
                           bias.data());
      a.seg_bias = bias.data();
      a.seg_tokens = int(T);
      a.seg_first = int(p_first % T);
    }
    if (reference_) return attend_reference(a, h, blocks, first, n, m, d, o);
    const float* lut;
    thread_local AlignedBuffer<float> lut_buf;
    thread_local uint64_t lut_prep = 0;  // (preparation id, query, head) of lut_buf's table
    thread_local int lut_i = -1, lut_h = -1;
    if (prep.prebuilt) {
      lut = prep.luts.data() + (size_t(i) * H + size_t(h)) * lut_n_;
    } else {
      if (lut_prep != prep.id || lut_i != i || lut_h != h || lut_buf.size() < lut_n_) {
        if (lut_buf.size() < lut_n_) lut_buf.resize(lut_n_);
        cpu::pq_build_lut(a, kbook_t_[size_t(h)].data(), lut_buf.data());
        lut_prep = prep.id, lut_i = i, lut_h = h;
      }
      lut = lut_buf.data();
    }
    // This head's code rows in each block of the run: kp[j], vp[j].
    const size_t nb = size_t((int64_t(first) + n + B_ - 1) / B_);
    thread_local std::vector<const uint8_t*> kp, vp;
    kp.resize(nb);
    vp.resize(nb);
    for (size_t j = 0; j < nb; ++j) {
      kp[j] = blocks[j] + size_t(h) * B_ * krow_;
      vp[j] = blocks[j] + keys_bytes() + size_t(h) * B_ * vrow_;
    }
    a.k_blocks = kp.data();
    a.v_blocks = vp.data();
    a.block_tokens = B_;
    a.first = first;
    a.n_tokens = int(n);
    a.m = m;
    a.d = d;
    a.o = o;
    cpu::pq_attention_accumulate(a, lut);
  }

 private:
  // Gathers the run's codes of head h and attends through ref::pq_attention_dequantized, then
  // merges that partial into (m, d, o).
  void attend_reference(PQAttnArgs a, int h, const uint8_t* const* blocks, int first, int64_t n, float* m, float* d,
                        float* o) const {
    const int G = a.group, D = geo_.head_dim;
    std::vector<uint8_t> kc(size_t(n) * krow_), vc(size_t(n) * vrow_);
    for (int64_t t = 0; t < n; ++t) {
      const int64_t u = first + t;
      const uint8_t* blk = blocks[u / B_];
      std::copy_n(blk + (size_t(h) * B_ + size_t(u % B_)) * krow_, krow_, kc.data() + size_t(t) * krow_);
      std::copy_n(blk + keys_bytes() + (size_t(h) * B_ + size_t(u % B_)) * vrow_, vrow_, vc.data() + size_t(t) * vrow_);
    }
    std::vector<float> pm(static_cast<size_t>(G)), pd(static_cast<size_t>(G)), po(size_t(G) * D);
    a.n_tokens = int(n);
    a.k_codes = kc.data();
    a.v_codes = vc.data();
    a.m = pm.data();
    a.d = pd.data();
    a.o = po.data();
    ref::pq_attention_dequantized(a);
    for (int g = 0; g < G; ++g) {
      SoftmaxState st{m[g], d[g]};
      float wa, wb;
      softmax_merge(st, SoftmaxState{pm[size_t(g)], pd[size_t(g)]}, wa, wb);
      m[g] = st.m;
      d[g] = st.d;
      for (int e = 0; e < D; ++e) o[g * D + e] = o[g * D + e] * wa + po[size_t(g) * D + e] * wb;
    }
  }

  KVCacheConfig cfg_;
  RotatedKeyMean key_mean_;                     // empty unless the calibration stores one
  std::vector<float> lambda_;                   // [n_kv_heads, head_dim]
  std::vector<float> key_map_, query_map_;      // learned transform: [n_kv_heads, head_dim, head_dim] M, M^-T
  std::vector<ProductQuantizer> kpq_, vpq_;     // [n_kv_heads]
  std::vector<std::vector<float>> kbook_t_;     // [n_kv_heads] channel-major key codebooks
  size_t krow_ = 0, vrow_ = 0;                  // packed bytes per token and head
  PQAttnArgs base_;
  size_t lut_n_ = 0;
};

}  // namespace

std::unique_ptr<CodedFormat> make_vecinfer_format(const KVCacheConfig& cfg, const Calibration* calib, int layer,
                                                  const KVGeometry& g, int block_tokens) {
  VQ_CHECK(calib != nullptr, "{}", calibration_howto(cfg));
  const Calibration& c = *calib;
  VQ_CHECK(layer >= 0 && layer < c.n_layers, "vecinfer cache: layer {} but the calibration has {} layers", layer,
           c.n_layers);
  check_calibration_matches(c, cfg, g, c.n_layers);  // the store checks the layer count
  return std::make_unique<VecInferFormat>(g, block_tokens, cfg, c, layer);
}

}  // namespace vq
