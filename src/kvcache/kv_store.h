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
//
// Device stores (KVStoreOptions::device = cuda): the same bookkeeping (block tables, window rule,
// refcounts, forks, twins, trims, budget) with block memory on the GPU; the data paths are
// kernels driven by KVStoreDevice (kv_store_device.h): append_blocks() does an append's
// bookkeeping only, and the step's kernels write, encode and attend. append() and attend() with
// host buffers still work (they run one small device step each: tests, benchmarks' fill).
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
  KVDevice device = KVDevice::cpu;   // where the blocks live (cuda: the methods with a device format)
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
class KVStoreDevice;

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
  friend class KVStoreDevice;
  struct Layer {
    std::vector<int32_t> dense;  // [n_blocks] dense-form block id, -1: none
    std::vector<int32_t> coded;  // [n_blocks] coded-form block id, -1: none
    int64_t n = 0;               // tokens held
    int64_t trimmed_for = 0;     // forms only queries at positions >= this read may be gone
    // Cursors that keep every step's bookkeeping O(new blocks), not O(context): blocks
    // [sink, coded_upto) have their codes; below trim_from no dense form waits for its codes.
    int64_t coded_upto = 0;
    int64_t trim_from = 0;
  };
  KVStore* store_ = nullptr;
  std::vector<Layer> layers_;
  mutable int32_t dev_table_ = -1;  // device stores: the sequence's device block table (-1: none yet)
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

  // Device stores: the bookkeeping of append(s, layer, ., ., n) without the data (blocks
  // allocated or copied on write, twins, encode jobs), noted in device() for the step's kernels.
  void append_blocks(SeqKV& s, int layer, int n);
  KVDevice device_kind() const { return pool_.device(); }
  KVStoreDevice& device();  // throws unless a device store
  const KVStoreDevice& device() const;

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
  // The pool block (arena, id) holding block j of a sequence's layer in one form (-1: none).
  int32_t block_id(const SeqKV& s, int layer, bool coded, size_t j) const;
  int arena_of(int layer, bool coded) const { return coded ? layers_[size_t(layer)].coded_arena : dense_arena_; }
  void set_reference_kernels(bool on);

  // ---- Block-level access (issue 11: sessions on disk; the server's prefix cache uses fork()).
  // Added methods only: nothing above calls them and they change nothing above.
  struct BlockIds {
    int32_t dense = -1;  // dense-arena block id, -1: absent
    int32_t coded = -1;  // the layer's coded-arena block id, -1: absent
  };
  // Block-table length of one layer of s, and block j's ids (not retained).
  int64_t n_blocks(const SeqKV& s, int layer) const;
  BlockIds block_ids(const SeqKV& s, int layer, int64_t j) const;
  size_t dense_block_bytes() const { return dense_block_bytes_; }
  size_t coded_block_bytes(int layer) const;  // 0: the layer has no coded form
  // Whether a coded block of the layer stores only finite scales (CodedFormat::block_finite).
  bool coded_block_finite(int layer, const uint8_t* block) const;
  // A block's payload: [dense_block_bytes()] or [coded_block_bytes(layer)] (in device memory when
  // the pool lives on the device: copy through read_blocks / write_blocks).
  const uint8_t* block_data(int layer, bool coded, int32_t id) const;
  uint8_t* block_data(int layer, bool coded, int32_t id);
  // Whole blocks copied between the pool and host memory wherever the pool lives (on the device:
  // asynchronous copies on the store's stream, one wait at the end); host[i]: block i's bytes.
  struct BlockRef {
    int layer = 0;
    bool coded = false;
    int32_t id = -1;
  };
  void read_blocks(const std::vector<BlockRef>& blocks, void* const* host) const;  // pool -> host
  void write_blocks(const std::vector<BlockRef>& blocks, const void* const* host);  // host -> pool
  // A new block of one form with refcount 1 (contents undefined). Throws KVPoolExhausted.
  int32_t alloc_block(int layer, bool coded);
  void release_block(int layer, bool coded, int32_t id);
  // A sequence of n tokens in every layer made of existing blocks: ids[l] has ceil(n / B) entries.
  // The sequence takes over one reference per id given. Throws (releasing them all) when a form
  // that a query at position n reads is missing, naming the layer and the tokens; forms no query
  // at n reads are released, as fork() does.
  SeqKV adopt_blocks(int64_t n, std::vector<std::vector<BlockIds>> ids);

 private:
  friend class KVStoreDevice;
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
  // The block of layer `layer` (its dense or coded table) at j, allocated or copied on write.
  int32_t writable(SeqKV& s, int layer, bool coded, size_t j);
  void encode(SeqKV& s, int layer, size_t j);
  // Bookkeeping shared by append() and append_blocks(): trims, grows the tables, makes the
  // touched blocks writable (run: called per token run with the block id, slot, count and
  // source offset) and returns the blocks whose codes the new queries need and nobody made yet.
  template <class Run>
  std::vector<size_t> append_bookkeeping(SeqKV& s, int layer, int n, Run&& run);
  void release_layer(SeqKV::Layer& sl, const Layer& L);
  // Throws naming the entry unless its queries are held and not older than the last append.
  void check_attend(int layer, const AttnEntry* ents, int n_ents) const;
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
  int calib_offset_ = 0;                 // calibration layer of store layer 0
  std::unique_ptr<KVStoreDevice> dev_;  // device stores
};

// The pool block size a spec uses by default (32 tokens; a multiple of the KIVI group).
int default_block_tokens(const KVCacheConfig& c);

}  // namespace vq
