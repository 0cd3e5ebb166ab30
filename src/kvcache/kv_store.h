#pragma once
// KVStore: the KV cache of a whole model for many sequences at once, in one budgeted pool of
// blocks (kv_pool.h). Each sequence (SeqKV) owns a block table per layer; a block holds
// block_tokens() tokens of every KV head of one layer in one of two forms:
//   - dense: fp16 (fp32 for the fp32 method) keys channel-major [H][D][B] then values [H][B][D];
//   - coded: the method's payload (kv_format.h): q8_0/q4_0, KIVI codes + scales, VecInfer codes.
// Which form a query reads is a function of positions only, never of how tokens were batched or
// chunked, so sequences sharing a prefix, a prefix-cache hit and a fresh run see the same cache:
// a query at position t reads
//   dense  [0, sink_end)                   the attention sinks (VecInfer; whole blocks)
//   coded  [sink_end, coded_end(t))        coded_end(t) = floor((t + 1 - R) / B) * B, at least sink_end
//   dense  [max(coded_end(t), sink_end), t] the fp16 residual window: R..R+B-1 tokens
// (fp16/fp32: all dense; q8_0/q4_0: all coded, written per token; R = residual_length), each
// clipped to [t + 1 - W, t] for a sliding-window layer of W tokens. A block leaves the window in
// one piece: it is encoded when a query first needs its codes, and its dense form is released
// when no later query reads it (blocks of a sliding-window layer go once they leave the window).
//
// Blocks are reference-counted: fork() shares a sequence's blocks with a new one (copy-on-write
// at the first write into a shared block); an fp16 block and the coded block made from it are
// twins, so sharers encode a block once.
//
// Threading: one thread drives append / trim / fork / release; attend() runs its work items on
// the process-wide thread pool (sequences x KV heads x query blocks x key ranges).
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvcache/kv_format.h"
#include "kvcache/kv_pool.h"
#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"

namespace vq {

struct Calibration;

// A KV method with what it needs to run: the parsed spec and, for VecInfer, the calibration.
struct KVSpec {
  KVCacheConfig config;
  std::shared_ptr<const Calibration> calibration;
  std::string name() const { return config.name(); }
};

struct KVStoreOptions {
  size_t budget_bytes = size_t(-1);  // pool budget (all layers, all sequences)
  int block_tokens = 0;              // 0: the default (32, or a multiple of the KIVI group)
  // Per-layer sliding-window size in tokens (0: global attention); empty: all global.
  std::vector<int> sliding_window;
  // Model layer of store layer 0 (a one-layer store serving layer L of a model uses L's codebooks).
  int calib_layer_offset = 0;
  // A whole model's store checks that the calibration has its layer count (a one-layer store
  // serving layer L of a model does not).
  bool whole_model = true;
};

class KVStore;

// One sequence's KV: per layer, its block tables and tokens held. Move-only; its blocks go back
// to the pool when it is destroyed or released.
class SeqKV {
 public:
  SeqKV() = default;
  SeqKV(SeqKV&& o) noexcept { *this = std::move(o); }
  SeqKV& operator=(SeqKV&& o) noexcept;
  SeqKV(const SeqKV&) = delete;
  SeqKV& operator=(const SeqKV&) = delete;
  ~SeqKV();

  bool valid() const { return store_ != nullptr; }
  // Tokens held (after a whole step: every layer holds the same count).
  int64_t size() const { return layers_.empty() ? 0 : layers_[0].n; }
  int64_t layer_size(int layer) const { return layers_[size_t(layer)].n; }

 private:
  friend class KVStore;
  struct Layer {
    std::vector<int32_t> dense;  // [n_blocks] dense-form block id, -1: none
    std::vector<int32_t> coded;  // [n_blocks] coded-form block id, -1: none
    int64_t n = 0;               // tokens held
    int64_t trimmed_for = 0;     // forms only queries at positions >= this read may be gone
  };
  KVStore* store_ = nullptr;
  std::vector<Layer> layers_;
};

// One sequence's queries for an attention call: n_q queries at positions pos0 .. pos0 + n_q - 1
// (their keys and values already appended); query i sees keys up to its own position. pos0 may
// not precede the sequence's last append (older queries' fp16 windows may be released).
struct AttnEntry {
  const SeqKV* seq = nullptr;
  int64_t pos0 = 0;
  int n_q = 0;
  const float* q = nullptr;  // [n_q, n_heads, head_dim] f32, after RoPE
  float* out = nullptr;      // [n_q, n_heads, head_dim] f32
};

class KVStore {
 public:
  KVStore(const KVGeometry& geo, int n_layers, const KVSpec& spec, const KVStoreOptions& opt = {});
  ~KVStore();
  KVStore(const KVStore&) = delete;
  KVStore& operator=(const KVStore&) = delete;

  SeqKV new_sequence();
  // A new sequence holding the first n_tokens (-1: all) tokens of src, sharing its blocks. Throws
  // when src no longer holds a form those tokens need (e.g. the fp16 window of an earlier point).
  SeqKV fork(const SeqKV& src, int64_t n_tokens = -1);
  void release(SeqKV& s);  // gives every block back; s becomes invalid

  // Appends n tokens to one layer of s at positions s.layer_size(layer) .. + n - 1, encoding the
  // blocks that the new queries read as codes. k, v: [n, n_kv_heads, head_dim] f32 (keys after
  // RoPE). Throws KVPoolExhausted when the pool runs out (call can_append first).
  void append(SeqKV& s, int layer, const float* k, const float* v, int n);
  // Releases the forms that no query at position >= s.layer_size(layer) reads (also done at the
  // start of every append); call after a step to give the memory back at once.
  void trim(SeqKV& s);
  // Attention of several sequences' queries for one layer. scale: score = scale * q.k.
  void attend(int layer, const AttnEntry* entries, int n_entries, float scale) const;

  // Blocks per arena that appending n_new tokens (all layers) to s may allocate, added to
  // `counts` (sized n_arenas()); an upper bound (shared blocks copied, no twin reuse).
  void blocks_for_append(const SeqKV& s, int64_t n_new, std::vector<int64_t>& counts) const;
  bool can_append(const SeqKV& s, int64_t n_new) const;

  // Memory: what the sequence's tokens take (payload bytes, exact token counts: dense tokens x
  // dense bytes/token + coded tokens x coded bytes/token) and what its blocks allocate.
  size_t token_bytes(const SeqKV& s) const;
  size_t allocated_bytes(const SeqKV& s) const;  // blocks referenced (shared ones counted in full)
  size_t fp16_bytes(const SeqKV& s) const;       // what an fp16 cache takes for the same tokens
  size_t codebook_bytes() const;

  KVPool& pool() { return pool_; }
  const KVPool& pool() const { return pool_; }
  const KVGeometry& geometry() const { return geo_; }
  int n_layers() const { return int(layers_.size()); }
  int block_tokens() const { return B_; }
  const KVSpec& spec() const { return spec_; }
  std::string name() const { return spec_.name(); }
  // Bytes per token of each form for one layer (dense: fp16/fp32 K+V of every KV head).
  double dense_bytes_per_token() const { return double(dense_block_bytes_) / B_; }
  double coded_bytes_per_token(int layer) const;
  int sliding_window(int layer) const { return int(layers_[size_t(layer)].window); }
  // Test hooks: whether a query at position t reads key position u as codes; blocks a sequence
  // holds in one layer (dense or coded form); attention through the reference kernels.
  bool reads_coded(int layer, int64_t t, int64_t u) const;
  int64_t blocks_held(const SeqKV& s, int layer, bool coded) const;
  void set_reference_kernels(bool on);

 private:
  struct Layer {
    std::unique_ptr<CodedFormat> format;  // null: dense only
    int coded_arena = -1;
    bool direct = false;
    int64_t sink_end = 0, residual = 0, window = 0;
    int64_t coded_begin() const { return direct ? 0 : sink_end; }
    int64_t coded_end(int64_t t, int64_t B) const;  // see the header comment
    int64_t key_begin(int64_t t) const { return window > 0 ? std::max<int64_t>(0, t + 1 - window) : 0; }
  };
  bool has_dense(const Layer& L) const { return !L.direct; }
  void trim_layer(SeqKV::Layer& sl, const Layer& L, int64_t next_query);
  int32_t writable(std::vector<int32_t>& ids, size_t j, int arena);
  void encode(SeqKV::Layer& sl, const Layer& L, size_t j);
  void release_layer(SeqKV::Layer& sl, const Layer& L);
  // Dense-form attention of one head over keys [u0, u1) for n_q queries (n_visible per query).
  void attend_dense(const SeqKV::Layer& sl, int h, const float* q, int64_t q_stride, int n_q, float scale,
                    const int64_t* n_visible, int64_t u0, int64_t u1, float* m, float* d, float* o) const;

  KVGeometry geo_;
  KVSpec spec_;
  int B_;
  bool dense_f32_;
  size_t dense_block_bytes_;
  KVPool pool_;
  int dense_arena_;
  std::vector<Layer> layers_;
};

// The pool block size a spec uses by default (32 tokens; a multiple of the KIVI group).
int default_block_tokens(const KVCacheConfig& c);

}  // namespace vq
