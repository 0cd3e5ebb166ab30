#include "kvcache/kv_store.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>

#include "codec/calibration_file.h"
#include "core/buffer.h"
#include "core/error.h"
#include "core/fp16.h"
#include "core/thread_pool.h"
#include "kvcache/kv_method.h"
#include "kvcache/kv_store_device.h"
#include "ops/cpu/attention.h"
#include "ops/online_softmax.h"

namespace vq {

int default_block_tokens(const KVCacheConfig& c) { return kv_method(c.method).default_block_tokens(c); }

SeqKV& SeqKV::operator=(SeqKV&& o) noexcept {
  if (this != &o) {
    if (store_) store_->release(*this);
    store_ = o.store_;
    layers_ = std::move(o.layers_);
    dev_table_ = o.dev_table_;
    o.store_ = nullptr;
    o.layers_.clear();
    o.dev_table_ = -1;
  }
  return *this;
}

SeqKV::~SeqKV() {
  if (store_) store_->release(*this);
}

int64_t KVStore::Layer::coded_end(int64_t t, int64_t B) const {
  if (!format) return 0;
  if (direct) return t + 1;
  const int64_t w = std::max<int64_t>(0, t + 1 - residual) / B * B;
  return std::max(w, sink_end);
}

KVStore::KVStore(const KVGeometry& g, int n_layers, const KVSpec& spec, const KVStoreOptions& opt)
    : geo_(g),
      spec_(spec),
      B_(opt.block_tokens > 0 ? opt.block_tokens : default_block_tokens(spec.config)),
      dense_f32_(kv_method(spec.config.method).dense_f32()),
      pool_(opt.budget_bytes, opt.device),
      calib_offset_(opt.calib_layer_offset) {
  VQ_CHECK(g.n_kv_heads >= 1, "kv store: n_kv_heads = {} must be >= 1", g.n_kv_heads);
  VQ_CHECK(g.n_heads >= 1 && g.n_heads % g.n_kv_heads == 0,
           "kv store: n_heads = {} must be a positive multiple of n_kv_heads = {}", g.n_heads, g.n_kv_heads);
  VQ_CHECK(g.head_dim >= 1 && g.head_dim <= 1024, "kv store: head_dim = {} must be in 1..1024", g.head_dim);
  VQ_CHECK(n_layers >= 1, "kv store: n_layers = {} must be >= 1", n_layers);
  VQ_CHECK(B_ >= 16 && B_ <= 4096 && B_ % 16 == 0, "kv store: block_tokens = {} must be a multiple of 16 in 16..4096",
           B_);
  spec_.config.validate(g.head_dim);
  if (kv_method(spec_.config.method).needs_calibration() && spec_.calibration && opt.whole_model)
    VQ_CHECK(spec_.calibration->n_layers == n_layers, "kv store: the calibration has {} layers, the model {}",
             spec_.calibration->n_layers, n_layers);
  const size_t es = dense_f32_ ? 4 : 2;
  dense_block_bytes_ = 2 * size_t(g.n_kv_heads) * size_t(g.head_dim) * size_t(B_) * es;
  dense_arena_ = pool_.add_arena(dense_block_bytes_, dense_f32_ ? "fp32" : "fp16");
  std::map<size_t, int> coded_arena_of;  // block bytes -> arena
  const KVCacheConfig& c = spec_.config;
  const KVMethodDef& method = kv_method(c.method);
  const bool windowed = method.windowed();
  const int sinks = method.sink_tokens(c);
  for (int l = 0; l < n_layers; ++l) {
    Layer L;
    L.format = make_coded_format(c, spec_.calibration.get(), l + opt.calib_layer_offset, g, B_);
    if (L.format) {
      const size_t bb = L.format->block_bytes();
      auto it = coded_arena_of.find(bb);
      if (it == coded_arena_of.end()) it = coded_arena_of.emplace(bb, pool_.add_arena(bb, L.format->name())).first;
      L.coded_arena = it->second;
      L.direct = L.format->direct();
    }
    L.residual = windowed ? c.residual_length : 0;
    // Sinks are kept as whole blocks (the first ceil(sink_tokens / B) blocks stay fp16).
    L.sink_end = sinks > 0 ? (int64_t(sinks) + B_ - 1) / B_ * B_ : 0;
    if (size_t(l) < opt.sliding_window.size()) {
      VQ_CHECK(opt.sliding_window[size_t(l)] >= 0, "kv store: layer {} sliding window {} must be >= 0", l,
               opt.sliding_window[size_t(l)]);
      L.window = opt.sliding_window[size_t(l)];
    }
    layers_.push_back(std::move(L));
  }
  if (opt.device == KVDevice::cuda) dev_ = std::make_unique<KVStoreDevice>(*this);
}

KVStore::~KVStore() = default;

KVStoreDevice& KVStore::device() {
  VQ_CHECK(dev_ != nullptr, "kv store: device() of a store whose blocks live on the cpu");
  return *dev_;
}
const KVStoreDevice& KVStore::device() const { return const_cast<KVStore*>(this)->device(); }

SeqKV KVStore::new_sequence() {
  SeqKV s;
  s.store_ = this;
  s.layers_.resize(layers_.size());
  return s;
}

void KVStore::release_layer(SeqKV::Layer& sl, const Layer& L) {
  for (int32_t& id : sl.dense)
    if (id >= 0) pool_.release(dense_arena_, id), id = -1;
  for (int32_t& id : sl.coded)
    if (id >= 0) pool_.release(L.coded_arena, id), id = -1;
}

void KVStore::release(SeqKV& s) {
  if (!s.store_) return;
  VQ_CHECK(s.store_ == this, "kv store: release of a sequence of another store");
  for (size_t l = 0; l < s.layers_.size(); ++l) release_layer(s.layers_[l], layers_[l]);
  if (dev_) dev_->release_table(s);
  s.layers_.clear();
  s.store_ = nullptr;
}

SeqKV KVStore::fork(const SeqKV& src, int64_t n) {
  VQ_CHECK(src.store_ == this, "kv store: fork of a sequence of another store");
  if (n < 0) n = src.size();
  for (size_t l = 0; l < layers_.size(); ++l)
    VQ_CHECK(src.layers_[l].n >= n, "kv store: fork at {} tokens but layer {} holds {}", n, l, src.layers_[l].n);
  SeqKV s = new_sequence();
  const size_t nb = size_t((n + B_ - 1) / B_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const SeqKV::Layer& a = src.layers_[l];
    SeqKV::Layer& b = s.layers_[l];
    b.dense.assign(nb, -1);
    b.coded.assign(nb, -1);
    b.n = n;
    const int64_t kb = L.key_begin(n), ce = L.coded_end(n, B_);
    for (size_t j = 0; j < nb && j < a.dense.size(); ++j) {
      const int64_t j0 = int64_t(j) * B_, j1 = j0 + B_;
      if (j1 <= kb) continue;  // left a sliding window for good
      const bool full = j1 <= n;
      // A windowed block's codes encode all of its tokens: only a block wholly inside the fork's
      // tokens may share them (a direct format's partial block is rewritten slot by slot).
      if (a.coded[j] >= 0 && (L.direct || full)) {
        pool_.retain(L.coded_arena, a.coded[j]);
        b.coded[j] = a.coded[j];
      }
      if (a.dense[j] >= 0) {
        pool_.retain(dense_arena_, a.dense[j]);
        b.dense[j] = a.dense[j];
      }
      // What a query at position n reads from this block must be there.
      const bool need_dense = has_dense(L) && (j0 < L.sink_end || j1 > ce);
      const bool need_code = L.format && !need_dense;
      if ((need_dense && b.dense[j] < 0) || (need_code && b.coded[j] < 0 && b.dense[j] < 0)) {
        const std::string what = need_dense ? "fp16" : "coded";
        release(s);
        VQ_FAIL("kv store: cannot fork at {} tokens: layer {} no longer holds the {} form of tokens {}..{}", n, l,
                what, j0, j1 - 1);
      }
    }
    trim_layer(b, L, n);
  }
  return s;
}

int32_t KVStore::writable(SeqKV& s, int layer, bool coded, size_t j) {
  const int arena = coded ? layers_[size_t(layer)].coded_arena : dense_arena_;
  std::vector<int32_t>& ids = coded ? s.layers_[size_t(layer)].coded : s.layers_[size_t(layer)].dense;
  int32_t id = ids[j];
  if (id < 0) {
    id = pool_.alloc(arena);
    ids[j] = id;
    if (dev_) dev_->note_block(s, layer, coded, j);
  } else if (pool_.refcount(arena, id) > 1) {  // copy-on-write
    const int32_t c = pool_.alloc(arena);
    if (dev_) dev_->note_copy(pool_.data(arena, id), pool_.data(arena, c), pool_.block_bytes(arena));
    else std::memcpy(pool_.data(arena, c), pool_.data(arena, id), pool_.block_bytes(arena));
    pool_.release(arena, id);
    ids[j] = id = c;
    if (dev_) dev_->note_block(s, layer, coded, j);
  }
  return id;
}

void KVStore::trim_layer(SeqKV::Layer& sl, const Layer& L, int64_t q) {
  sl.trimmed_for = std::max(sl.trimmed_for, q);
  if (L.window > 0) {
    const size_t jb = size_t(L.key_begin(q) / B_);
    for (size_t j = 0; j < jb && j < sl.dense.size(); ++j) {
      if (sl.dense[j] >= 0) pool_.release(dense_arena_, sl.dense[j]), sl.dense[j] = -1;
      if (sl.coded[j] >= 0) pool_.release(L.coded_arena, sl.coded[j]), sl.coded[j] = -1;
    }
  }
  if (L.format && !L.direct) {
    // Dense forms of blocks that every later query reads as codes (once the codes exist). Blocks
    // below trim_from were done by an earlier call (dense forms only ever appear at the end).
    const size_t j1 = std::min(size_t(L.coded_end(q, B_) / B_), sl.dense.size());
    const size_t j0 = std::max(size_t(L.sink_end / B_), size_t(sl.trim_from));
    size_t kept = j1;  // the first block whose dense form still waits for its codes
    for (size_t j = j0; j < j1; ++j) {
      if (sl.dense[j] < 0) continue;
      if (sl.coded[j] >= 0) pool_.release(dense_arena_, sl.dense[j]), sl.dense[j] = -1;
      else kept = std::min(kept, j);
    }
    sl.trim_from = int64_t(std::max(j0, kept));
  }
}

void KVStore::trim(SeqKV& s) {
  VQ_CHECK(s.store_ == this, "kv store: trim of a sequence of another store");
  for (size_t l = 0; l < layers_.size(); ++l) trim_layer(s.layers_[l], layers_[l], s.layers_[l].n);
}

void KVStore::encode(SeqKV& s, int layer, size_t j) {
  const Layer& L = layers_[size_t(layer)];
  SeqKV::Layer& sl = s.layers_[size_t(layer)];
  const int32_t d = sl.dense[j];
  VQ_CHECK(d >= 0, "kv store: block {} has no fp16 form to encode (internal error)", j);
  const int32_t tw = pool_.twin(dense_arena_, d, L.coded_arena);
  if (tw >= 0) {
    pool_.retain(L.coded_arena, tw);
    sl.coded[j] = tw;
    if (dev_) dev_->note_block(s, layer, true, j);
    return;
  }
  const int32_t c = pool_.alloc(L.coded_arena);
  pool_.link_twins(dense_arena_, d, L.coded_arena, c);
  sl.coded[j] = c;
  if (dev_) {
    dev_->note_block(s, layer, true, j);
    dev_->note_encode(layer, pool_.data(dense_arena_, d), pool_.data(L.coded_arena, c), int64_t(j) * B_);
  }
}

namespace {
// Dense block element access. Keys [H][D][B] channel-major, then values [H][B][D].
template <class T>
void write_rows(uint8_t* blk, int H, int D, int B, int slot, const float* k, const float* v, int n) {
  T* K = reinterpret_cast<T*>(blk);
  T* V = K + size_t(H) * D * B;
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < H; ++h) {
      const float* kr = k + (size_t(i) * H + size_t(h)) * D;
      const float* vr = v + (size_t(i) * H + size_t(h)) * D;
      T* kd = K + size_t(h) * D * B + size_t(slot + i);
      T* vd = V + (size_t(h) * B + size_t(slot + i)) * D;
      if constexpr (sizeof(T) == 4) {
        for (int c = 0; c < D; ++c) kd[size_t(c) * B] = kr[c];
        std::memcpy(vd, vr, size_t(D) * 4);
      } else {
        for (int c = 0; c < D; ++c) kd[size_t(c) * B] = f32_to_f16(kr[c]);
        f32_to_f16(vr, vd, size_t(D));
      }
    }
}
// k, v: [H][B][D] f32 of a whole block.
template <class T>
void read_block(const uint8_t* blk, int H, int D, int B, float* k, float* v) {
  const T* K = reinterpret_cast<const T*>(blk);
  const T* V = K + size_t(H) * D * B;
  for (int h = 0; h < H; ++h) {
    for (int c = 0; c < D; ++c) {
      const T* row = K + (size_t(h) * D + size_t(c)) * B;
      for (int t = 0; t < B; ++t) {
        if constexpr (sizeof(T) == 4) k[(size_t(h) * B + t) * D + c] = row[t];
        else k[(size_t(h) * B + t) * D + c] = f16_to_f32(row[t]);
      }
    }
    if constexpr (sizeof(T) == 4) std::memcpy(v + size_t(h) * B * D, V + size_t(h) * B * D, size_t(B) * D * 4);
    else f16_to_f32(V + size_t(h) * B * D, v + size_t(h) * B * D, size_t(B) * D);
  }
}
}  // namespace

template <class Run>
std::vector<size_t> KVStore::append_bookkeeping(SeqKV& s, int layer, int n, Run&& run) {
  VQ_CHECK(s.store_ == this, "kv store: append to a sequence of another store (or a released one)");
  VQ_CHECK(layer >= 0 && layer < n_layers(), "kv store: layer {} out of range [0, {})", layer, n_layers());
  VQ_CHECK(n >= 0, "kv store: append of {} tokens", n);
  std::vector<size_t> todo;
  if (n == 0) return todo;
  const Layer& L = layers_[size_t(layer)];
  SeqKV::Layer& sl = s.layers_[size_t(layer)];
  const int64_t a = sl.n, b = a + n;
  trim_layer(sl, L, a);
  const size_t nblocks = size_t((b + B_ - 1) / B_);
  if (sl.dense.size() < nblocks) {
    sl.dense.resize(nblocks, -1);
    sl.coded.resize(nblocks, -1);
  }
  for (int64_t t = a; t < b;) {
    const size_t j = size_t(t / B_);
    const int slot = int(t % B_), cnt = int(std::min<int64_t>(B_ - slot, b - t));
    const bool dense = has_dense(L);
    const int32_t id = writable(s, layer, !dense, j);
    run(dense ? dense_arena_ : L.coded_arena, id, slot, cnt, t - a);
    t += cnt;
  }
  sl.n = b;
  if (!L.format || L.direct) return todo;
  // Blocks the last new query reads as codes; the ones nobody encoded yet are encoded (twins of
  // an already encoded fp16 block are shared instead).
  const size_t j0 = size_t(std::max(L.sink_end, L.key_begin(a)) / B_), j1 = size_t(L.coded_end(b - 1, B_) / B_);
  for (size_t j = std::max(j0, size_t(sl.coded_upto)); j < j1; ++j) {  // (earlier blocks have their codes)
    if (sl.coded[j] >= 0) continue;
    encode(s, layer, j);
    if (pool_.refcount(L.coded_arena, sl.coded[j]) == 1) todo.push_back(j);  // new, not a twin
  }
  sl.coded_upto = std::max(sl.coded_upto, int64_t(j1));
  return todo;
}

void KVStore::append_blocks(SeqKV& s, int layer, int n) {
  VQ_CHECK(dev_ != nullptr, "kv store: append_blocks on a store whose blocks live on the cpu");
  append_bookkeeping(s, layer, n, [](int, int32_t, int, int, int64_t) {});
}

void KVStore::append(SeqKV& s, int layer, const float* k, const float* v, int n) {
  VQ_CHECK(layer >= 0 && layer < n_layers(), "kv store: layer {} out of range [0, {})", layer, n_layers());
  if (dev_) return dev_->append_host(s, layer, k, v, n);
  const Layer& L = layers_[size_t(layer)];
  const int H = geo_.n_kv_heads, D = geo_.head_dim;
  const size_t row = size_t(H) * D;
  const std::vector<size_t> todo =
      append_bookkeeping(s, layer, n, [&](int arena, int32_t id, int slot, int cnt, int64_t off) {
        const float* kt = k + size_t(off) * row;
        const float* vt = v + size_t(off) * row;
        uint8_t* blk = pool_.data(arena, id);
        if (arena != dense_arena_) L.format->write_tokens(kt, vt, cnt, slot, blk);
        else if (dense_f32_) write_rows<float>(blk, H, D, B_, slot, kt, vt, cnt);
        else write_rows<uint16_t>(blk, H, D, B_, slot, kt, vt, cnt);
      });
  if (todo.empty()) return;
  SeqKV::Layer& sl = s.layers_[size_t(layer)];
  const bool f32 = dense_f32_;
  // Several blocks at once in prefill: one thread each.
  parallel_for(todo.size(), [&](size_t i0, size_t i1, int) {
    thread_local std::vector<float> kf, vf;  // [H][B][D] f32 of one block
    kf.resize(size_t(H) * B_ * D);
    vf.resize(kf.size());
    for (size_t i = i0; i < i1; ++i) {
      const size_t j = todo[i];
      const uint8_t* src = pool_.data(dense_arena_, sl.dense[j]);
      if (f32) read_block<float>(src, H, D, B_, kf.data(), vf.data());
      else read_block<uint16_t>(src, H, D, B_, kf.data(), vf.data());
      L.format->encode_block(kf.data(), vf.data(), pool_.data(L.coded_arena, sl.coded[j]), int64_t(j) * B_);
    }
  });
}

void KVStore::blocks_for_append(const SeqKV& s, int64_t n_new, std::vector<int64_t>& counts) const {
  counts.resize(size_t(pool_.n_arenas()), 0);
  if (n_new <= 0) return;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const SeqKV::Layer& sl = s.layers_[l];
    const int64_t a = sl.n, b = a + n_new;
    const int arena = has_dense(L) ? dense_arena_ : L.coded_arena;
    const std::vector<int32_t>& ids = has_dense(L) ? sl.dense : sl.coded;
    for (int64_t j = a / B_; j < (b + B_ - 1) / B_; ++j) {
      const bool present = size_t(j) < ids.size() && ids[size_t(j)] >= 0;
      if (!present || pool_.refcount(arena, ids[size_t(j)]) > 1) ++counts[size_t(arena)];
    }
    if (L.format && !L.direct) {
      for (int64_t j = std::max(std::max(L.sink_end, L.key_begin(a)) / B_, sl.coded_upto); j < L.coded_end(b - 1, B_) / B_;
           ++j)
        if (size_t(j) >= sl.coded.size() || sl.coded[size_t(j)] < 0) ++counts[size_t(L.coded_arena)];
    }
  }
}

bool KVStore::can_append(const SeqKV& s, int64_t n_new) const {
  std::vector<int64_t> counts;
  blocks_for_append(s, n_new, counts);
  return pool_.can_allocate(counts);
}

void KVStore::attend_dense(const SeqKV::Layer& sl, int h, const float* q, int64_t q_stride, int n_q, float scale,
                           const int64_t* n_visible, int64_t u0, int64_t u1, float* m, float* d, float* o) const {
  thread_local std::vector<const uint8_t*> ptrs;
  ptrs.clear();
  for (int64_t j = u0 / B_; j < (u1 + B_ - 1) / B_; ++j) {
    const int32_t id = sl.dense[size_t(j)];
    VQ_CHECK(id >= 0, "kv store: tokens {}..{} have no fp16 form (internal error)", j * B_, j * B_ + B_ - 1);
    ptrs.push_back(pool_.data(dense_arena_, id));
  }
  const size_t es = dense_f32_ ? 4 : 2;
  const int H = geo_.n_kv_heads, D = geo_.head_dim;
  ref::DenseAttnArgs a;
  a.n_q = n_q;
  a.group = geo_.n_heads / H;
  a.head_dim = D;
  a.q = q;
  a.q_stride = q_stride;
  a.scale = scale;
  a.blocks = ptrs.data();
  a.block_tokens = B_;
  a.first = int(u0 % B_);
  a.k_offset = size_t(h) * D * B_ * es;
  a.v_offset = (size_t(H) * D * B_ + size_t(h) * B_ * D) * es;
  a.paged_f32 = dense_f32_;
  a.n_keys = u1 - u0;
  a.n_visible = n_visible;
  a.m = m;
  a.d = d;
  a.o = o;
  cpu::dense_attention(a);
}

void KVStore::check_attend(int layer, const AttnEntry* ents, int n_ents) const {
  for (int e = 0; e < n_ents; ++e) {
    const AttnEntry& E = ents[e];
    VQ_CHECK(E.seq && E.seq->store_ == this, "kv store: attention entry {} names no sequence of this store", e);
    const SeqKV::Layer& sl = E.seq->layers_[size_t(layer)];
    VQ_CHECK(E.n_q >= 0 && E.pos0 >= 0 && E.pos0 + E.n_q <= sl.n,
             "kv store: attention entry {}: queries at {}..{} but layer {} holds {} tokens", e, E.pos0,
             E.pos0 + E.n_q - 1, layer, sl.n);
    VQ_CHECK(E.n_q == 0 || E.pos0 >= sl.trimmed_for,
             "kv store: attention entry {}: a query at position {} precedes the last append (position {}), whose "
             "step released the older fp16 window",
             e, E.pos0, sl.trimmed_for);
  }
}

namespace {
// Merges partial (sb, ob) into (sa, acc). One out-of-line function for both places that merge
// (inside an item and across items), so that both run the very same instructions: the batch
// invariance of attend() depends on it.
[[gnu::noinline]] void merge_partial(SoftmaxState& sa, float* acc, const SoftmaxState& sb, const float* ob, int D) {
  float wa, wb;
  softmax_merge(sa, sb, wa, wb);
  for (int c = 0; c < D; ++c) acc[c] = acc[c] * wa + ob[c] * wb;
}
}  // namespace

void KVStore::attend(int layer, const AttnEntry* ents, int n_ents, float scale) const {
  VQ_CHECK(layer >= 0 && layer < n_layers(), "kv store: layer {} out of range [0, {})", layer, n_layers());
  check_attend(layer, ents, n_ents);
  if (dev_) return dev_->attend_host(layer, ents, n_ents, scale);
  const Layer& L = layers_[size_t(layer)];
  const int HQ = geo_.n_heads, H = geo_.n_kv_heads, D = geo_.head_dim, G = HQ / H;
  // Per-entry query preparation (transformed queries, decode lookup tables).
  std::vector<std::unique_ptr<QueryPrep>> prep(static_cast<size_t>(n_ents));
  for (int e = 0; e < n_ents; ++e) {
    const AttnEntry& E = ents[e];
    if (L.format && E.n_q > 0 && L.coded_end(E.pos0 + E.n_q - 1, B_) > L.coded_begin())
      prep[size_t(e)] = L.format->prepare(E.q, E.n_q, scale);
  }
  // Work items: entry x KV head x block of up to 8 queries x key range. Batch invariance: every
  // query's result is the same whatever else is in the step, however its tokens were chunked and
  // on any thread count. So the keys are cut at fixed positions, units of U = 256 tokens
  // (multiples of U), each unit's partial softmax state is computed from an empty state, and a
  // query's partials are merged in key order, always by the same operations: either inside one
  // item that walks its units in order, or, when the keys are split over items to keep the threads
  // busy (decode: few entries and heads), one item per unit, merged in order afterwards. A
  // unit with no key visible to a query leaves its state unchanged in both.
  struct Item {
    int e, h, q0, q1, split;
    int64_t t0, t1;
  };
  const int threads = num_threads();
  int64_t base_total = 0;
  for (int e = 0; e < n_ents; ++e) base_total += int64_t(H) * ((ents[e].n_q + 7) / 8);
  const int64_t U = (256 + B_ - 1) / B_ * B_;
  // Per-unit partial states of a split entry take n_units * n_q * HQ * (D + 2) floats; beyond
  // this the entry is walked by one item per query block instead.
  constexpr size_t kMaxSplitStateBytes = size_t(64) << 20;
  std::vector<Item> items;
  std::vector<int64_t> n_splits(size_t(n_ents), 1), state_off(size_t(n_ents) + 1, 0);
  for (int e = 0; e < n_ents; ++e) {
    const AttnEntry& E = ents[e];
    if (E.n_q == 0) {
      state_off[size_t(e) + 1] = state_off[size_t(e)];
      continue;
    }
    const int64_t n_keys = E.pos0 + E.n_q;
    // The units some query of the entry sees (a sliding window's first query sees the fewest).
    const int64_t u_lo = L.key_begin(E.pos0) / U, u_hi = (n_keys + U - 1) / U;
    const bool split = base_total < 4 * int64_t(threads) && u_hi - u_lo > 1 &&
                       size_t(u_hi - u_lo) * size_t(E.n_q) * size_t(HQ) * size_t(D + 2) * sizeof(float) <=
                           kMaxSplitStateBytes;
    const int64_t ns = split ? u_hi - u_lo : 1;
    n_splits[size_t(e)] = ns;
    const int qb = E.n_q >= 8 ? 8 : E.n_q;
    for (int q0 = 0; q0 < E.n_q; q0 += qb)
      for (int h = 0; h < H; ++h)
        for (int64_t sp = 0; sp < ns; ++sp) {
          const int q1 = std::min(E.n_q, q0 + qb);
          const int64_t t0 = (u_lo + sp) * U;
          const int64_t t1 = std::min({n_keys, split ? t0 + U : n_keys, E.pos0 + q1});  // the block's last query sees the most
          items.push_back({e, h, q0, q1, int(sp), t0, t1});
        }
    state_off[size_t(e) + 1] = state_off[size_t(e)] + ns * E.n_q * HQ;
  }
  // Partial states per entry: m, d [n_splits, n_q, HQ]; o [n_splits, n_q, HQ, D].
  const size_t n_state = size_t(state_off.back());
  AlignedBuffer<float> m_buf(n_state), d_buf(n_state), o_buf(n_state * D);
  parallel_for(items.size(), [&](size_t b, size_t e_end, int) {
    // per item: the running state m, d [8, G], o [8, G, D]; the current unit's um, ud, uo alike; vis [8]
    std::vector<float> m(size_t(8) * G), d(size_t(8) * G), o(size_t(8) * G * D);
    std::vector<float> um(size_t(8) * G), ud(size_t(8) * G), uo(size_t(8) * G * D);
    int64_t vis[8];
    for (size_t it = b; it < e_end; ++it) {
      const Item& I = items[it];
      const AttnEntry& E = ents[I.e];
      const SeqKV::Layer& sl = E.seq->layers_[size_t(layer)];
      const int nq = I.q1 - I.q0, h = I.h;
      std::fill(m.begin(), m.begin() + nq * G, -INFINITY);
      std::fill(d.begin(), d.begin() + nq * G, 0.0f);
      std::fill(o.begin(), o.begin() + size_t(nq) * G * D, 0.0f);
      // The unit partials of rows [r0, r1) of the block (query i - I.q0 times G + head g) into
      // the running state, as the final merge below does.
      auto merge_rows = [&](int r0, int r1) {
        for (int r = r0; r < r1; ++r) {
          SoftmaxState st{m[size_t(r)], d[size_t(r)]};
          merge_partial(st, o.data() + size_t(r) * D, SoftmaxState{um[size_t(r)], ud[size_t(r)]},
                        uo.data() + size_t(r) * D, D);
          m[size_t(r)] = st.m, d[size_t(r)] = st.d;
        }
      };
      if (!L.format && L.window == 0) {  // all dense: per unit, the queries of the block in one call
        for (int64_t a0 = I.t0; a0 < I.t1; a0 += U) {
          const int64_t a1 = std::min(I.t1, a0 + U);
          std::fill(um.begin(), um.begin() + nq * G, -INFINITY);
          std::fill(ud.begin(), ud.begin() + nq * G, 0.0f);
          std::fill(uo.begin(), uo.begin() + size_t(nq) * G * D, 0.0f);
          for (int i = 0; i < nq; ++i) vis[i] = std::min(a1, E.pos0 + I.q0 + i + 1) - a0;
          attend_dense(sl, h, E.q + (size_t(I.q0) * HQ + size_t(h) * G) * D, int64_t(HQ) * D, nq, scale, vis, a0, a1,
                       um.data(), ud.data(), uo.data());
          merge_rows(0, nq * G);
        }
      } else {  // per query (its lookup tables are built once for all its units), per unit
        for (int i = I.q0; i < I.q1; ++i) {
          const int64_t pos = E.pos0 + i;
          const int r0 = (i - I.q0) * G;
          float* mi = um.data() + size_t(r0);
          float* di = ud.data() + size_t(r0);
          float* oi = uo.data() + size_t(r0) * D;
          const float* qi = E.q + (size_t(i) * HQ + size_t(h) * G) * D;
          for (int64_t a0 = I.t0; a0 < std::min(I.t1, pos + 1); a0 += U) {
            const int64_t lim = std::min({I.t1, a0 + U, pos + 1});
            const int64_t kb = std::max(a0, L.key_begin(pos));
            if (kb >= lim) continue;  // no key of this unit in the query's window
            const int64_t cb = L.coded_begin(), ce = std::max(L.coded_end(pos, B_), cb);
            std::fill(mi, mi + G, -INFINITY);
            std::fill(di, di + G, 0.0f);
            std::fill(oi, oi + size_t(G) * D, 0.0f);
            if (has_dense(L) && std::min(lim, cb) > kb) {  // fp16 sinks
              const int64_t v1 = std::min(lim, cb), nv = v1 - kb;
              attend_dense(sl, h, qi, 0, 1, scale, &nv, kb, v1, mi, di, oi);
            }
            const int64_t c0 = std::max(kb, cb), c1 = std::min(lim, ce);
            if (c1 > c0) {  // codes
              thread_local std::vector<const uint8_t*> ptrs;
              ptrs.clear();
              for (int64_t j = c0 / B_; j < (c1 + B_ - 1) / B_; ++j) {
                const int32_t id = sl.coded[size_t(j)];
                VQ_CHECK(id >= 0, "kv store: tokens {}..{} of layer {} have no codes (internal error)", j * B_,
                         j * B_ + B_ - 1, layer);
                ptrs.push_back(pool_.data(L.coded_arena, id));
              }
              L.format->attend(*prep[size_t(I.e)], i, h, ptrs.data(), int(c0 % B_), c1 - c0, mi, di, oi, c0 / B_ * B_);
            }
            const int64_t w0 = std::max(kb, ce);
            if (has_dense(L) && lim > w0) {  // fp16 window
              const int64_t nv = lim - w0;
              attend_dense(sl, h, qi, 0, 1, scale, &nv, w0, lim, mi, di, oi);
            }
            merge_rows(r0, r0 + G);
          }
        }
      }
      const AttnEntry& EE = ents[I.e];
      for (int i = I.q0; i < I.q1; ++i)
        for (int g = 0; g < G; ++g) {
          const size_t dst = size_t(state_off[size_t(I.e)]) + (size_t(I.split) * EE.n_q + size_t(i)) * HQ +
                             size_t(h) * G + size_t(g);
          const size_t src = size_t(i - I.q0) * G + size_t(g);
          m_buf[dst] = m[src];
          d_buf[dst] = d[src];
          std::copy(o.begin() + src * D, o.begin() + (src + 1) * D, o_buf.data() + dst * D);
        }
    }
  });
  // Merge the splits of every entry and normalise.
  for (int e = 0; e < n_ents; ++e) {
    const AttnEntry& E = ents[e];
    const size_t per_split = size_t(E.n_q) * HQ, base = size_t(state_off[size_t(e)]);
    for (size_t r = 0; r < per_split; ++r) {
      SoftmaxState st{m_buf[base + r], d_buf[base + r]};
      float* acc = E.out + r * D;
      std::copy(o_buf.data() + (base + r) * D, o_buf.data() + (base + r + 1) * D, acc);
      for (int64_t sp = 1; sp < n_splits[size_t(e)]; ++sp) {
        const size_t idx = base + size_t(sp) * per_split + r;
        merge_partial(st, acc, SoftmaxState{m_buf[idx], d_buf[idx]}, o_buf.data() + idx * D, D);
      }
      const float inv = st.d > 0 ? 1.0f / st.d : 0.0f;
      for (int c = 0; c < D; ++c) acc[c] *= inv;
    }
  }
}

double KVStore::coded_bytes_per_token(int layer) const {
  const Layer& L = layers_[size_t(layer)];
  return L.format ? double(L.format->block_bytes()) / B_ : 0.0;
}

bool KVStore::reads_coded(int layer, int64_t t, int64_t u) const {
  const Layer& L = layers_[size_t(layer)];
  return L.format && u >= L.coded_begin() && u < L.coded_end(t, B_) && u <= t;
}

int64_t KVStore::blocks_held(const SeqKV& s, int layer, bool coded) const {
  const auto& ids = coded ? s.layers_[size_t(layer)].coded : s.layers_[size_t(layer)].dense;
  return int64_t(std::count_if(ids.begin(), ids.end(), [](int32_t id) { return id >= 0; }));
}

int32_t KVStore::block_id(const SeqKV& s, int layer, bool coded, size_t j) const {
  const auto& sl = s.layers_[size_t(layer)];
  const auto& ids = coded ? sl.coded : sl.dense;
  return j < ids.size() ? ids[j] : -1;
}

void KVStore::set_reference_kernels(bool on) {
  for (Layer& L : layers_)
    if (L.format) L.format->set_reference(on);
}

size_t KVStore::token_bytes(const SeqKV& s) const {
  double b = 0;
  for (size_t l = 0; l < layers_.size() && l < s.layers_.size(); ++l) {
    const Layer& L = layers_[l];
    const int64_t n = s.layers_[l].n;
    if (n == 0) continue;
    const int64_t kb = L.key_begin(n), cb = L.coded_begin(), ce = std::min(n, L.coded_end(n, B_));
    const int64_t coded = L.format ? std::max<int64_t>(0, ce - std::max(kb, cb)) : 0;
    const int64_t held = n - kb;
    b += double(coded) * coded_bytes_per_token(int(l)) + double(held - coded) * dense_bytes_per_token();
  }
  return size_t(std::llround(b));
}

size_t KVStore::allocated_bytes(const SeqKV& s) const {
  size_t b = 0;
  for (size_t l = 0; l < layers_.size() && l < s.layers_.size(); ++l) {
    for (int32_t id : s.layers_[l].dense)
      if (id >= 0) b += pool_.block_bytes(dense_arena_);
    for (int32_t id : s.layers_[l].coded)
      if (id >= 0) b += pool_.block_bytes(layers_[l].coded_arena);
  }
  return b;
}

size_t KVStore::fp16_bytes(const SeqKV& s) const {
  size_t b = 0;
  for (size_t l = 0; l < layers_.size() && l < s.layers_.size(); ++l) {
    const int64_t n = s.layers_[l].n;
    b += size_t(n - layers_[l].key_begin(n)) * size_t(geo_.n_kv_heads) * size_t(geo_.head_dim) * 4u;
  }
  return b;
}

size_t KVStore::codebook_bytes() const {
  size_t b = 0;
  for (const Layer& L : layers_)
    if (L.format) b += L.format->codebook_bytes();
  return b;
}

}  // namespace vq

// ---- Block-level access (issue 11: sessions on disk). Added methods only. ----
namespace vq {

int64_t KVStore::n_blocks(const SeqKV& s, int layer) const {
  VQ_CHECK(s.store_ == this, "kv store: n_blocks of a sequence of another store");
  VQ_CHECK(layer >= 0 && layer < n_layers(), "kv store: layer {} out of range [0, {})", layer, n_layers());
  return int64_t(s.layers_[size_t(layer)].dense.size());
}

KVStore::BlockIds KVStore::block_ids(const SeqKV& s, int layer, int64_t j) const {
  const int64_t nb = n_blocks(s, layer);
  VQ_CHECK(j >= 0 && j < nb, "kv store: block {} of layer {} out of range [0, {})", j, layer, nb);
  const SeqKV::Layer& sl = s.layers_[size_t(layer)];
  return BlockIds{sl.dense[size_t(j)], sl.coded[size_t(j)]};
}

bool KVStore::coded_block_finite(int layer, const uint8_t* block) const {
  VQ_CHECK(layer >= 0 && layer < n_layers(), "kv store: layer {} out of range [0, {})", layer, n_layers());
  const Layer& L = layers_[size_t(layer)];
  return !L.format || L.format->block_finite(block);
}

size_t KVStore::coded_block_bytes(int layer) const {
  VQ_CHECK(layer >= 0 && layer < n_layers(), "kv store: layer {} out of range [0, {})", layer, n_layers());
  const Layer& L = layers_[size_t(layer)];
  return L.format ? pool_.block_bytes(L.coded_arena) : 0;
}

const uint8_t* KVStore::block_data(int layer, bool coded, int32_t id) const {
  return const_cast<KVStore*>(this)->block_data(layer, coded, id);
}

uint8_t* KVStore::block_data(int layer, bool coded, int32_t id) {
  VQ_CHECK(layer >= 0 && layer < n_layers(), "kv store: layer {} out of range [0, {})", layer, n_layers());
  const Layer& L = layers_[size_t(layer)];
  VQ_CHECK(!coded || L.format, "kv store: layer {} has no coded form", layer);
  return pool_.data(coded ? L.coded_arena : dense_arena_, id);
}

void KVStore::read_blocks(const std::vector<BlockRef>& blocks, void* const* host) const {
  std::vector<KVStoreDevice::HostCopy> copies;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockRef& b = blocks[i];
    const size_t bytes = b.coded ? coded_block_bytes(b.layer) : dense_block_bytes();
    if (dev_) copies.push_back({block_data(b.layer, b.coded, b.id), host[i], bytes});
    else std::memcpy(host[i], block_data(b.layer, b.coded, b.id), bytes);
  }
  if (dev_) dev_->copy_to_host(copies);
}

void KVStore::write_blocks(const std::vector<BlockRef>& blocks, const void* const* host) {
  std::vector<KVStoreDevice::HostCopy> copies;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockRef& b = blocks[i];
    const size_t bytes = b.coded ? coded_block_bytes(b.layer) : dense_block_bytes();
    if (dev_) copies.push_back({host[i], block_data(b.layer, b.coded, b.id), bytes});
    else std::memcpy(block_data(b.layer, b.coded, b.id), host[i], bytes);
  }
  if (dev_) dev_->copy_to_device(copies);
}

int32_t KVStore::alloc_block(int layer, bool coded) {
  VQ_CHECK(layer >= 0 && layer < n_layers(), "kv store: layer {} out of range [0, {})", layer, n_layers());
  const Layer& L = layers_[size_t(layer)];
  VQ_CHECK(!coded || L.format, "kv store: layer {} has no coded form", layer);
  VQ_CHECK(coded || has_dense(L), "kv store: layer {} ({}) has no dense form", layer, spec_.name());
  return pool_.alloc(coded ? L.coded_arena : dense_arena_);
}

void KVStore::release_block(int layer, bool coded, int32_t id) {
  VQ_CHECK(layer >= 0 && layer < n_layers(), "kv store: layer {} out of range [0, {})", layer, n_layers());
  pool_.release(coded ? layers_[size_t(layer)].coded_arena : dense_arena_, id);
}

SeqKV KVStore::adopt_blocks(int64_t n, std::vector<std::vector<BlockIds>> ids) {
  // The references are taken over in every case: on any error they are released.
  const size_t nb = n >= 0 ? size_t((n + B_ - 1) / B_) : 0;
  SeqKV s = new_sequence();
  bool shape_ok = n >= 0 && ids.size() == layers_.size();
  for (size_t l = 0; l < ids.size() && l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    SeqKV::Layer& b = s.layers_[l];
    shape_ok = shape_ok && ids[l].size() == nb;
    for (const BlockIds& id : ids[l]) {
      // A form the layer does not have cannot be held (nor released through its arena).
      shape_ok = shape_ok && (id.coded < 0 || L.format) && (id.dense < 0 || has_dense(L));
      b.dense.push_back(has_dense(L) ? id.dense : -1);
      b.coded.push_back(L.format ? id.coded : -1);
    }
    b.n = std::max<int64_t>(n, 0);
  }
  if (!shape_ok) {
    release(s);
    VQ_FAIL("kv store: adopt_blocks of {} tokens needs {} layers of {} blocks each, in forms the layers have "
            "(got {} layers)", n, layers_.size(), nb, ids.size());
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& L = layers_[l];
    SeqKV::Layer& b = s.layers_[l];
    const int64_t kb = L.key_begin(n), ce = L.coded_end(n, B_);
    for (size_t j = 0; j < nb; ++j) {
      const int64_t j0 = int64_t(j) * B_, j1 = j0 + B_;
      if (j1 <= kb) continue;  // left a sliding window for good
      const bool need_dense = has_dense(L) && (j0 < L.sink_end || j1 > ce);
      const bool need_code = L.format && !need_dense;
      if ((need_dense && b.dense[j] < 0) || (need_code && b.coded[j] < 0 && b.dense[j] < 0)) {
        release(s);
        VQ_FAIL("kv store: a sequence of {} tokens lacks the {} form of tokens {}..{} in layer {}", n,
                need_dense ? "fp16" : "coded", j0, j1 - 1, l);
      }
    }
    trim_layer(b, L, n);
  }
  return s;
}

}  // namespace vq
