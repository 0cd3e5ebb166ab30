// The GPU side of a device KV store (kv_store_device.h).
#include "kvcache/kv_store_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <unordered_map>
#include <vector>

#include "codec/calibration_file.h"
#include "codec/key_mean.h"
#include "codec/learned_key_map.h"
#include "core/env.h"
#include "core/error.h"
#include "kvcache/kv_method.h"

#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#include "ops/cuda/key_mean_cuda.h"
#include "ops/cuda/kv_blocks_cuda.h"
#include "ops/cuda/paged_attention_cuda.h"
#include "ops/cuda/pq_attention_cuda.h"
#include "ops/cuda/stream_cuda.h"
#endif

namespace vq {

std::string kv_device_unsupported_reason(const KVSpec& spec, const KVGeometry& g, int B) {
#ifndef VQ_HAVE_CUDA
  (void)spec, (void)g, (void)B;
  return "this build has no CUDA backend";
#else
  const KVCacheConfig& c = spec.config;
  const KVMethodDef& method = kv_method(c.method);
  if (!method.has_device_format())
    return fmt::format("the {} KV cache does not run on the device: {}; --device cuda runs {}, the others run with "
                       "--device cpu",
                       c.name(), method.device_why_not(), kv_device_method_names());
  const int D = g.head_dim;
  if (D != 64 && D != 128 && D != 256)
    return fmt::format("head_dim {}: the device attention takes head_dim 64, 128 or 256", D);
  if (g.n_kv_heads < 1 || g.n_heads % g.n_kv_heads != 0 || g.n_heads / g.n_kv_heads > 16)
    return fmt::format("{} query heads per KV head: the device attention takes 1..16", g.n_heads / std::max(1, g.n_kv_heads));
  if (B < 32 || (B & (B - 1)) != 0)
    return fmt::format("blocks of {} tokens: the device pool takes a power of two >= 32", B);
  if (std::string why = method.device_unsupported(c, g, B); !why.empty()) return why;
  if (method.direct() && method.device_scalar().blocks == DeviceScalarBlocks::none)
    return fmt::format("the {} KV cache is direct but its registry entry names no device block type", c.name());
  if (spec.calibration && spec.calibration->has_key_mean()) {
    const int T = spec.calibration->key_mean_tokens;
    if (T != kKeyMeanTokens)
      return fmt::format("the calibration's rotated key mean has segments of {} tokens: the device kernels take {} "
                         "(what `veloxquant calibrate` makes)", T, kKeyMeanTokens);
  }
  if (!cuda::cuda_device_available()) return cuda::cuda_unavailable_reason();
  return "";
#endif
}

#ifndef VQ_HAVE_CUDA

struct KVStoreDevice::Impl {};
KVStoreDevice::KVStoreDevice(KVStore&) { VQ_FAIL("kv store: device cuda but this build has no CUDA backend"); }
KVStoreDevice::~KVStoreDevice() = default;
#define VQ_NO_CUDA VQ_FAIL("kv store: this build has no CUDA backend")
void* KVStoreDevice::stream() const { VQ_NO_CUDA; }
void KVStoreDevice::synchronize() const { VQ_NO_CUDA; }
void KVStoreDevice::begin_step() { VQ_NO_CUDA; }
int KVStoreDevice::add_rows(const SeqKV&, int64_t, int) { VQ_NO_CUDA; }
bool KVStoreDevice::finish_step() { VQ_NO_CUDA; }
int KVStoreDevice::rows() const { VQ_NO_CUDA; }
bool KVStoreDevice::step_has_fixups() const { VQ_NO_CUDA; }
bool KVStoreDevice::step_has_encodes() const { VQ_NO_CUDA; }
uint64_t KVStoreDevice::layout_version() const { VQ_NO_CUDA; }
void KVStoreDevice::reserve_fixed(int, int64_t) { VQ_NO_CUDA; }
bool KVStoreDevice::step_in_fixed_slot() const { VQ_NO_CUDA; }
bool KVStoreDevice::step_prefill_scratch() const { VQ_NO_CUDA; }
const int32_t* KVStoreDevice::positions() const { VQ_NO_CUDA; }
void KVStoreDevice::launch_fixup() { VQ_NO_CUDA; }
void KVStoreDevice::launch_append(int, const float*, int64_t, const float*, int64_t) { VQ_NO_CUDA; }
void KVStoreDevice::launch_encode(int) { VQ_NO_CUDA; }
void KVStoreDevice::launch_attend(int, const float*, int64_t, float, cuda::ElemType, void*, int64_t) { VQ_NO_CUDA; }
void KVStoreDevice::append_host(SeqKV&, int, const float*, const float*, int) { VQ_NO_CUDA; }
void KVStoreDevice::append_device(SeqKV&, int, const float*, const float*, int) { VQ_NO_CUDA; }
void KVStoreDevice::attend_host(int, const AttnEntry*, int, float) { VQ_NO_CUDA; }
void KVStoreDevice::download_block(int, int32_t, void*) const { VQ_NO_CUDA; }
bool KVStoreDevice::tiles_rows(int) const { VQ_NO_CUDA; }
void KVStoreDevice::set_deterministic(bool) { VQ_NO_CUDA; }
void KVStoreDevice::set_prefill_scratch_bytes(size_t) { VQ_NO_CUDA; }
bool KVStoreDevice::prefill_scratch_possible() const { VQ_NO_CUDA; }
void KVStoreDevice::copy_to_host(const std::vector<HostCopy>&) const { VQ_NO_CUDA; }
void KVStoreDevice::copy_to_device(const std::vector<HostCopy>&) { VQ_NO_CUDA; }
void KVStoreDevice::note_block(const SeqKV&, int, bool, size_t) {}
void KVStoreDevice::note_copy(const uint8_t*, uint8_t*, size_t) {}
void KVStoreDevice::note_encode(int, const uint8_t*, uint8_t*, int64_t) {}
void KVStoreDevice::release_table(SeqKV&) {}

#else

static_assert(1 << cuda::kKeyMeanSegmentLog2 == kKeyMeanTokens, "the device's key-mean segment is the tools' one");

namespace {
// GpuTuning::coded_gather_mma (VQ_CODED_ATTN_KERNEL=gather_mma): the gather-mma split kernel for
// every coded layer (benchmarks compare it with the automatic choice in one run).
cuda::PQAttnKernel coded_kernel_override() {
  return gpu_tuning().coded_gather_mma ? cuda::PQAttnKernel::gather_mma : cuda::PQAttnKernel::automatic;
}
// GpuTuning::attn_fork off (VQ_ATTN_FORK=0): the dense split kernel of a coded layer on the main
// stream after the coded kernel (for comparisons); else on a second stream beside the query
// transform and the coded kernel (a graph branch).
bool attn_fork_enabled() { return gpu_tuning().attn_fork; }
}  // namespace

namespace {

// The device's form of a direct method's blocks (KVMethodDef::device_scalar).
cuda::PagedElem scalar_elem(const KVCacheConfig& c) {
  switch (kv_method(c.method).device_scalar().blocks) {
    case DeviceScalarBlocks::q8_0: return cuda::PagedElem::q8_0;
    case DeviceScalarBlocks::q4_0: return cuda::PagedElem::q4_0;
    case DeviceScalarBlocks::q5_0: return cuda::PagedElem::q5_0;
    case DeviceScalarBlocks::none: break;
  }
  VQ_FAIL("kv store (cuda): the direct method {} names no device block type (KVMethodDef::device_scalar)", c.name());
}

size_t align_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
// Deterministic mode: the decode kernels' split counts are planned for this many rows.
constexpr int kDetNominalRows = 4;
int pow2_at_least(int64_t x, int lo) {
  int64_t v = lo;
  while (v < x) v *= 2;
  return int(v);
}

struct LayerBooks {
  cuda::DeviceBuffer lambda, k32, v32, k16, v16;
  // The learned key transform (empty otherwise): M^T and N^T = M^-1 per KV head, [H][D][D].
  cuda::DeviceBuffer key_map_t, query_map_t;
};

// [H][D][D] row-major maps -> each transposed.
std::vector<float> transpose_maps(const float* m, int H, int D) {
  std::vector<float> t(size_t(H) * D * D);
  for (int h = 0; h < H; ++h)
    for (int e = 0; e < D; ++e)
      for (int j = 0; j < D; ++j) t[(size_t(h) * D + j) * D + e] = m[(size_t(h) * D + e) * D + j];
  return t;
}

// A layer's rotated key mean on the device (key_mean_cuda.h); table indexes Impl::km_tables.
struct LayerKeyMean {
  int n_pairs = 0;  // 0: none
  int table = -1;
  cuda::DeviceBuffer pairs, chan, mu;
};
// The (cos, sin) table of one set of pair frequencies (layers with the same rotary frequencies
// share it), grown on the host in double as the step's positions pass its end.
struct KeyMeanTable {
  std::vector<double> freqs;
  int64_t segs = 0;
  cuda::DeviceBuffer cs;
};

// A sequence's device block table: [n_layers][2 (dense, coded)][cap] block base pointers.
struct DevTable {
  cuda::DeviceBuffer buf;
  int64_t cap = 0;
  bool live = false;
  bool regrow = false;  // an entry past cap was set: add_rows must grow the table
  struct Pending {
    uint32_t lk;  // layer * 2 + coded
    uint64_t j;
    uint8_t* value;
  };
  std::vector<Pending> pending;  // entries set since the last upload
};

// A step's descriptor layout (byte offsets into host / dev) and the buffers sized with it
// (Impl::layout, grow_workspace, grow_key_bias): what a captured launch holds the addresses of. Impl
// is the current one; once reserve_fixed() has sized one for the caller's largest decode step, the
// other one waits in Impl::parked.
struct DescSlot {
  int rows_cap = 0, seq_cap = 0, jobs_cap = 0, upd_cap = 0, copy_cap = 0, tiles_cap = 0;
  size_t o_pos = 0, o_rowseq = 0, o_dtab = 0, o_ctab = 0, o_njobs = 0, o_jobs = 0, o_nupd = 0, o_upd = 0, o_ncopy = 0,
         o_copy = 0, o_skip = 0, o_tiles = 0, o_boff = 0, o_bnseg = 0, o_scr_n = 0, o_scr_seqs = 0, o_scr_slot0 = 0,
         total = 0;
  cuda::PinnedBuffer host;
  cuda::DeviceBuffer dev, qcode, work, kbias;
};

}  // namespace

struct KVStoreDevice::Impl : DescSlot {
  KVStore& st;
  cuda::Stream stream;
  cuda::Stream side;         // the dense split kernel of coded layers (attn_fork_enabled)
  cuda::Event fork, join;    // main -> side before the query transform, side -> main before the merge
  int L = 0, H = 0, HQ = 0, D = 0, B = 0;
  std::vector<LayerBooks> books;
  std::vector<LayerKeyMean> km;         // per layer (n_pairs 0: none)
  std::vector<KeyMeanTable> km_tables;
  std::vector<cuda::PagedRule> km_rules;  // the distinct rules of layers with a key mean
  std::vector<int64_t> row_boff;          // the open step's rows: their first score term, count per head
  std::vector<int32_t> row_bnseg;
  // kbias (DescSlot): the step's score terms (PagedKeyBias::values)
  std::vector<cuda::PagedRule> rules;
  bool rotate = false;             // q4_0h: rows, queries and outputs through the Walsh-Hadamard rotation
  cuda::DeviceBuffer ones;         // [H * D] 1.0f: the rotation's query transform (no smoothing)
  std::vector<DevTable> tables;
  std::vector<int32_t> free_tables;
  std::vector<int32_t> dirty_tables;  // tables with pending entries

  // the open step
  bool open = false;
  std::vector<int32_t> row_pos, row_seq;  // per row: position, index into step_tables
  std::vector<int32_t> step_tables;       // step index -> table id
  std::unordered_map<int32_t, int32_t> step_index;
  std::vector<std::vector<cuda::BlockEncodeJob>> jobs;  // per layer
  std::vector<cuda::BlockCopy> copies;
  std::vector<cuda::TableUpdate> updates;
  std::vector<cuda::PagedPrefillTile> tiles;  // rows of prefill chunks for the tensor-core kernel
  int tile_rows = 0;                           // rows per tile (cuda::paged_prefill_tile_rows)
  std::vector<uint8_t> row_skip;              // [rows] 1: a prefill tile computes the row
  int decode_rows = 0;                        // rows before the last run of skipped rows
  bool det = false;                           // set_deterministic
  // Coded layers' prefill with the past decoded once per step (cuda::PrefillScratch;
  // GpuTuning::prefill_scratch_mib, 0: off): per distinct rule of the coded layers, each tiled
  // sequence's code blocks get consecutive slots of `scr` before the layer's prefill kernel.
  size_t scr_cap_bytes = 0;                   // 0: the store's layers do not take it
  std::vector<int> scr_rule_of;               // [L] index into scr_rules, -1: not a coded layer
  std::vector<cuda::PagedRule> scr_rules;
  bool scr_on = false;                        // this step's coded tiles read scr
  int scr_slots = 0;                          // capacity of scr in slots
  cuda::DeviceBuffer scr;
  std::vector<int32_t> scr_n, scr_seqs;       // per rule: entries, [seq_cap][4] entries
  std::vector<int64_t> scr_slot0;             // per rule: [seq_cap]

  // the descriptor layout, host, dev, qcode, work and kbias: DescSlot
  uint64_t version = 0;
  // reserve_fixed: this Impl's DescSlot is slot 0, sized once and never grown again, whenever a step
  // fits it; a step that does not runs in slot 1 (parked here while slot 0 is current, and the
  // other way round), which grows as before.
  bool fixed = false;
  int cur_slot = 0;
  DescSlot parked;
  int64_t fixed_max_pos = -1;  // key-mean tables sized to this position (reserve_fixed)

  // scratch
  cuda::DeviceBuffer kbuf, vbuf, qbuf, obuf;

  explicit Impl(KVStore& s) : st(s) {}

  template <class T>
  T* dptr(size_t off) const { return reinterpret_cast<T*>(static_cast<uint8_t*>(dev.data()) + off); }
  template <class T>
  T* hptr(size_t off) const { return reinterpret_cast<T*>(static_cast<uint8_t*>(host.data()) + off); }

  // A direct method's layer: scalar blocks only, read and written through the coded tables.
  bool direct(int layer) const { return rules[size_t(layer)].elem != cuda::PagedElem::f16; }

  uint8_t* block_ptr(int layer, bool coded, int32_t id) const {
    if (id < 0) return nullptr;
    const int arena = coded ? st.layers_[size_t(layer)].coded_arena : st.dense_arena_;
    return st.pool_.data(arena, id);
  }

  static int64_t blocks_needed(const SeqKV& s) {
    int64_t n = 0;
    for (const auto& l : s.layers_) n = std::max<int64_t>(n, int64_t(l.dense.size()));
    return n;
  }

  // Creates (or grows) the sequence's device table and uploads it whole (the device is idle
  // between steps, so a synchronous copy is safe).
  void ensure_table(const SeqKV& s) {
    const int64_t need = blocks_needed(s);
    if (s.dev_table_ >= 0) {
      const DevTable& t = tables[size_t(s.dev_table_)];
      if (t.cap >= need && !t.regrow) return;
    } else {
      int32_t id;
      if (!free_tables.empty()) {
        id = free_tables.back();
        free_tables.pop_back();
      } else {
        id = int32_t(tables.size());
        tables.emplace_back();
      }
      s.dev_table_ = id;
    }
    DevTable& t = tables[size_t(s.dev_table_)];
    const int64_t cap = std::max<int64_t>(t.cap, pow2_at_least(need, 64));
    std::vector<uint8_t*> h(size_t(L) * 2 * size_t(cap), nullptr);
    for (int l = 0; l < L; ++l) {
      const auto& sl = s.layers_[size_t(l)];
      for (size_t j = 0; j < sl.dense.size(); ++j) {
        h[(size_t(l) * 2 + 0) * size_t(cap) + j] = block_ptr(l, false, sl.dense[j]);
        h[(size_t(l) * 2 + 1) * size_t(cap) + j] = block_ptr(l, true, sl.coded[j]);
      }
    }
    if (t.cap != cap || !t.buf.data()) t.buf = cuda::DeviceBuffer(h.size() * sizeof(uint8_t*));
    t.cap = cap;
    t.buf.upload(h.data(), h.size() * sizeof(uint8_t*));
    t.live = true;
    t.regrow = false;
    t.pending.clear();
  }

  void layout(int rows, int seqs, int njobs, int nupd, int ncopy, int ntiles) {
    const bool grow = rows > rows_cap || seqs > seq_cap || njobs > jobs_cap || nupd > upd_cap || ncopy > copy_cap ||
                      ntiles > tiles_cap || !dev.data();
    if (!grow) return;
    tiles_cap = std::max(tiles_cap, pow2_at_least(ntiles, 8));
    rows_cap = std::max(rows_cap, pow2_at_least(rows, 16));
    seq_cap = std::max(seq_cap, pow2_at_least(seqs, 8));
    jobs_cap = std::max(jobs_cap, pow2_at_least(njobs, 4));
    upd_cap = std::max(upd_cap, pow2_at_least(nupd, 64));
    copy_cap = std::max(copy_cap, pow2_at_least(ncopy, 8));
    size_t o = 0;
    auto take = [&](size_t bytes) {
      const size_t at = o;
      o = align_up(o + bytes, 16);
      return at;
    };
    o_pos = take(size_t(rows_cap) * 4);
    o_rowseq = take(size_t(rows_cap) * 4);
    o_dtab = take(size_t(L) * seq_cap * 8);
    o_ctab = take(size_t(L) * seq_cap * 8);
    o_njobs = take(size_t(L) * 4);
    o_jobs = take(size_t(L) * jobs_cap * sizeof(cuda::BlockEncodeJob));
    o_nupd = take(4);
    o_upd = take(size_t(upd_cap) * sizeof(cuda::TableUpdate));
    o_ncopy = take(4);
    o_copy = take(size_t(copy_cap) * sizeof(cuda::BlockCopy));
    o_skip = take(size_t(rows_cap));
    o_tiles = take(size_t(tiles_cap) * sizeof(cuda::PagedPrefillTile));
    o_boff = take(size_t(rows_cap) * 8);
    o_bnseg = take(size_t(rows_cap) * 4);
    const size_t nr = scr_rules.size();
    o_scr_n = take(nr * 4);
    o_scr_seqs = take(nr * size_t(seq_cap) * 16);
    o_scr_slot0 = take(nr * size_t(seq_cap) * 8);
    total = o;
    host = cuda::PinnedBuffer(total);
    dev = cuda::DeviceBuffer(total);
    qcode = cuda::DeviceBuffer(size_t(rows_cap) * HQ * D * 4);
    ++version;
  }

  cuda::PagedAttnParams attn_params(int layer, int rows) const {
    cuda::PagedAttnParams p{};
    p.rows = rows;
    p.n_kv_heads = H;
    p.group = HQ / H;
    p.head_dim = D;
    p.rule = rules[size_t(layer)];
    // The step's prefill tiles (their count sets the prefill kernel's key splits and workspace).
    p.n_tiles = int(tiles.size());
    p.tile_rows = tile_rows;
    if (p.rule.coded) {
      const KVCacheConfig& c = st.spec_.config;
      const Calibration& cal = *st.spec_.calibration;
      p.k_sub_dim = c.key.sub_dim, p.k_bits = c.key.bits;
      p.v_sub_dim = c.value.sub_dim, p.v_bits = c.value.bits;
      p.k_per_subspace = cal.key_books() > 1;
      p.v_per_subspace = cal.value_books() > 1;
      p.kernel = coded_kernel_override();
    }
    p.decode_rows = decode_rows;
    if (det) {
      // The split counts of kDetNominalRows decode rows (no tiles), whatever this step holds: a
      // row's splits then depend on its own length only; one key split for prefill tiles.
      cuda::PagedAttnParams nominal = p;
      nominal.rows = kDetNominalRows;
      nominal.decode_rows = -1;
      nominal.n_tiles = 0;
      cuda::paged_attention_plan(nominal);
      p.coded_splits = nominal.coded_splits;
      p.dense_splits = nominal.dense_splits;
      p.dense_variant = nominal.dense_variant;
      p.prefill_splits = p.n_tiles > 0 ? 1 : 0;
    } else {
      cuda::paged_attention_plan(p);
    }
    return p;
  }

  // Makes slot `to` current (reserve_fixed); the addresses of the step's buffers change, so version too.
  void use_slot(int to) {
    if (to == cur_slot) return;
    std::swap(static_cast<DescSlot&>(*this), parked);
    cur_slot = to;
    ++version;
  }

  // Whether the open step fits slot 0 as reserve_fixed sized it (the step's counts, its key-mean
  // terms, the attention workspace it needs).
  bool fits_slot0(int rows, int seqs, int njobs, int nupd, int ncopy, int ntiles, int64_t kb_terms,
                  size_t workspace) const {
    const DescSlot& f = cur_slot == 0 ? static_cast<const DescSlot&>(*this) : parked;
    return std::max(rows, 1) <= f.rows_cap && std::max(seqs, 1) <= f.seq_cap && njobs <= f.jobs_cap &&
           nupd <= f.upd_cap && ncopy <= f.copy_cap && ntiles <= f.tiles_cap &&
           (km_rules.empty() || key_bias_bytes(kb_terms) <= f.kbias.size()) && workspace <= f.work.size();
  }

  // The attention workspace the current step's `rows` rows need (the largest any layer needs).
  size_t workspace_need(int rows) const {
    size_t need = 0;
    for (int l = 0; l < L; ++l) need = std::max(need, cuda::paged_attention_workspace_bytes(attn_params(l, rows)));
    return need;
  }

  // The attention workspace grown to `need` bytes (workspace_need) outside graph capture:
  // finish_step calls it, launch_attend only reads it.
  void grow_workspace(size_t need) {
    if (need > work.size()) {
      work = cuda::DeviceBuffer(need + need / 4);
      ++version;
    }
  }

  // The step's prefill scratch (finish_step, after layout): per rule, the slots of each tiled
  // sequence's code blocks (the union of its tile rows' code ranges); on when some coded tile reads
  // codes and the largest rule's slots fit in scr_cap_bytes (else the tiles decode as before).
  void plan_scratch() {
    scr_on = false;
    if (scr_cap_bytes == 0 || tiles.empty()) return;
    const int seqs = int(step_tables.size());
    std::vector<int32_t> first(size_t(seqs), INT32_MAX), last(size_t(seqs), -1);
    for (const cuda::PagedPrefillTile& t : tiles) {
      const size_t si = size_t(row_seq[size_t(t.row0)]);
      first[si] = std::min(first[si], row_pos[size_t(t.row0)]);
      last[si] = std::max(last[si], row_pos[size_t(t.row0 + t.n_pos - 1)]);
    }
    const size_t nr = scr_rules.size();
    scr_n.assign(nr, 0);
    scr_seqs.assign(nr * size_t(seq_cap) * 4, 0);
    scr_slot0.assign(nr * size_t(seq_cap), 0);
    int64_t need = 0;
    for (size_t ri = 0; ri < nr; ++ri) {
      int64_t slots = 0;
      for (int si = 0; si < seqs; ++si) {
        if (last[size_t(si)] < 0) continue;
        const cuda::PagedRanges a = cuda::paged_ranges(scr_rules[ri], first[size_t(si)]);
        const cuda::PagedRanges b = cuda::paged_ranges(scr_rules[ri], last[size_t(si)]);
        const int64_t lo = std::min(a.code_lo, b.code_lo), hi = std::max(a.code_hi, b.code_hi);
        if (hi <= lo) continue;
        const int64_t b0 = lo / B, nb = (hi + B - 1) / B - b0;
        int32_t* e = &scr_seqs[(ri * size_t(seq_cap) + size_t(scr_n[ri])) * 4];
        e[0] = si, e[1] = int32_t(b0), e[2] = int32_t(nb), e[3] = int32_t(slots);
        scr_slot0[ri * size_t(seq_cap) + size_t(si)] = slots - b0;
        ++scr_n[ri];
        slots += nb;
      }
      need = std::max(need, slots);
    }
    const size_t slot_bytes = size_t(H) * size_t(cuda::prefill_scratch_halves(D)) * 2;
    if (need == 0 || size_t(need) * slot_bytes > scr_cap_bytes || need > INT32_MAX / 2) return;
    if (need > scr_slots) {
      const int slots =
          int(std::min<int64_t>(std::max<int64_t>(need + need / 4, 64), int64_t(scr_cap_bytes / slot_bytes)));
      try {
        cuda::DeviceBuffer grown(size_t(slots) * slot_bytes);
        scr = std::move(grown);
      } catch (const Error&) {
        return;  // no device memory for it: this step's tiles decode as before (the step is under way)
      }
      scr_slots = slots;
      ++version;
    }
    scr_on = true;
  }

  // The rotated key mean's part of a step (finish_step): each row's score terms (as many
  // segments per query head as its widest coded range over the layers), the terms' buffer, and the
  // (cos, sin) tables up to the step's last position (or the last encoded block's).
  // key_mean_segments: the score terms of a row at position pos, per query head.
  int64_t key_mean_segments(int64_t pos) const {
    int64_t n = 0;
    for (const cuda::PagedRule& rule : km_rules) {
      const cuda::PagedRanges g = cuda::paged_ranges(rule, pos);
      constexpr int lt = cuda::kKeyMeanSegmentLog2;
      if (g.code_hi > g.code_lo) n = std::max<int64_t>(n, ((g.code_hi - 1) >> lt) - (g.code_lo >> lt) + 1);
    }
    return n;
  }
  static size_t key_bias_bytes(int64_t terms) { return size_t(std::max<int64_t>(terms, 1)) * sizeof(float); }

  // The rows' score-term offsets (row_boff, row_bnseg) and the (cos, sin) tables up to max_pos;
  // returns the step's terms (kbias is sized by grow_key_bias, once the step's slot is known).
  int64_t plan_key_mean(int64_t max_pos) {
    if (km_rules.empty()) return 0;
    const int rows = int(row_pos.size());
    row_boff.resize(size_t(rows));
    row_bnseg.resize(size_t(rows));
    int64_t total = 0;
    for (int r = 0; r < rows; ++r) {
      const int64_t n = key_mean_segments(row_pos[size_t(r)]);
      row_boff[size_t(r)] = total;
      row_bnseg[size_t(r)] = int32_t(n);
      total += n * HQ;
    }
    grow_key_mean_tables(max_pos);
    return total;
  }
  void grow_key_bias(int64_t terms) {
    const size_t bytes = key_bias_bytes(terms);
    if (bytes > kbias.size()) {
      kbias = cuda::DeviceBuffer(bytes + bytes / 4);
      ++version;
    }
  }
  void grow_key_mean_tables(int64_t max_pos) {
    const int64_t need_segs = (max_pos >> cuda::kKeyMeanSegmentLog2) + 1;
    for (KeyMeanTable& t : km_tables) {
      if (t.segs >= need_segs) continue;
      VQ_CHECK(!fixed, "kv store (cuda): position {} is past the {} positions the cache was sized for "
               "(reserve_fixed: max_cache_len)", max_pos, fixed_max_pos + 1);
      const int64_t segs = std::max<int64_t>(need_segs * 2, 4096 >> cuda::kKeyMeanSegmentLog2);
      const size_t np = t.freqs.size();
      std::vector<float> cs(size_t(segs) * np * 2);
      for (int64_t sg = 0; sg < segs; ++sg)
        for (size_t j = 0; j < np; ++j) {
          const double ang = double(sg << cuda::kKeyMeanSegmentLog2) * t.freqs[j];
          cs[(size_t(sg) * np + j) * 2] = float(std::cos(ang));
          cs[(size_t(sg) * np + j) * 2 + 1] = float(std::sin(ang));
        }
      stream.synchronize();  // the old table may be read by the previous step's kernels
      t.cs = cuda::to_device(cs.data(), cs.size() * sizeof(float));
      t.segs = segs;
      ++version;
    }
  }

  // qcode = H(q * lambda) * scale per query head (VecInfer's queries; q4_0h's with unit lambda), or
  // N (q * lambda) * scale with the learned key transform's query maps (map_t: N^T per KV head).
  void transform_queries(int rows, const float* q, int64_t q_stride, const float* lambda, float scale,
                         const float* map_t = nullptr) {
    cuda::QueryTransformParams t;
    t.rows = rows;
    t.n_q_heads = HQ;
    t.n_kv_heads = H;
    t.head_dim = D;
    t.q = q;
    t.q_stride = q_stride;
    t.lambda = lambda;
    t.map_t = map_t;
    t.scale = scale;
    t.out = qcode.as<float>();
    cuda::query_transform_device(t, stream.handle());
  }

  cuda::KeyMeanDevice key_mean_of(int layer) const {
    cuda::KeyMeanDevice d;
    const LayerKeyMean& k = km[size_t(layer)];
    if (k.n_pairs == 0) return d;
    const KeyMeanTable& t = km_tables[size_t(k.table)];
    d.n_pairs = k.n_pairs;
    d.pairs = k.pairs.as<int32_t>();
    d.chan = k.chan.as<int32_t>();
    d.mu = k.mu.as<float>();
    d.cs = t.cs.as<float>();
    d.cs_segs = t.segs;
    return d;
  }
};

KVStoreDevice::KVStoreDevice(KVStore& store) : impl_(std::make_unique<Impl>(store)) {
  Impl& m = *impl_;
  const std::string why = kv_device_unsupported_reason(store.spec(), store.geometry(), store.block_tokens());
  VQ_CHECK(why.empty(), "kv store on cuda: {}", why);
  m.L = store.n_layers();
  m.H = store.geometry().n_kv_heads;
  m.HQ = store.geometry().n_heads;
  m.D = store.geometry().head_dim;
  m.B = store.block_tokens();
  m.jobs.resize(size_t(m.L));
  m.books.resize(size_t(m.L));
  for (int l = 0; l < m.L; ++l) {
    const KVStore::Layer& L = store.layers_[size_t(l)];
    cuda::PagedRule r;
    r.block_tokens = m.B;
    r.sink_end = L.sink_end;
    r.residual = L.residual;
    r.window = L.window;
    r.coded = L.format && !L.direct;
    if (L.format && L.direct) r.elem = scalar_elem(store.spec().config);
    m.rules.push_back(r);
    if (!r.coded) continue;
    const Calibration& cal = *store.spec().calibration;
    const CalibrationLayer& cl = cal.layers[size_t(l + store.calib_offset_)];
    LayerBooks& b = m.books[size_t(l)];
    b.lambda = cuda::to_device(cl.smoothing.data(), cl.smoothing.size() * 4);
    b.k32 = cuda::to_device(cl.key_codebooks.data(), cl.key_codebooks.size() * 4);
    b.v32 = cuda::to_device(cl.value_codebooks.data(), cl.value_codebooks.size() * 4);
    b.k16 = cuda::DeviceBuffer(cl.key_codebooks.size() * 2);
    b.v16 = cuda::DeviceBuffer(cl.value_codebooks.size() * 2);
    cuda::f32_to_f16_device(b.k32.as<float>(), b.k16.as<uint16_t>(), int64_t(cl.key_codebooks.size()),
                            m.stream.handle());
    cuda::f32_to_f16_device(b.v32.as<float>(), b.v16.as<uint16_t>(), int64_t(cl.value_codebooks.size()),
                            m.stream.handle());
    if (cal.learned_keys()) {  // the CPU format's maps (VecInferFormat): M for keys, M^-T for queries
      const std::vector<float> qmaps = key_maps_query_side(cl.key_map.data(), m.H, m.D, "device cache");
      const std::vector<float> kt = transpose_maps(cl.key_map.data(), m.H, m.D), qt = transpose_maps(qmaps.data(), m.H, m.D);
      b.key_map_t = cuda::to_device(kt.data(), kt.size() * 4);
      b.query_map_t = cuda::to_device(qt.data(), qt.size() * 4);
    }
    const RotatedKeyMean mean(cal, l + store.calib_offset_);
    if (mean.empty()) continue;
    if (m.km.empty()) m.km.resize(size_t(m.L));
    LayerKeyMean& k = m.km[size_t(l)];
    std::vector<int32_t> pairs, chan(size_t(m.D), 0);
    std::vector<double> freqs;
    for (const RotatedKeyMean::Pair& pr : mean.pairs()) {
      const int j = int(freqs.size());
      pairs.push_back(pr.a);
      pairs.push_back(pr.b);
      chan[size_t(pr.a)] = 2 * j + 1;
      chan[size_t(pr.b)] = 2 * j + 2;
      freqs.push_back(pr.freq);
    }
    k.n_pairs = int(freqs.size());
    k.pairs = cuda::to_device(pairs.data(), pairs.size() * 4);
    k.chan = cuda::to_device(chan.data(), chan.size() * 4);
    k.mu = cuda::to_device(mean.mean().data(), mean.mean().size() * 4);
    for (size_t i = 0; i < m.km_tables.size() && k.table < 0; ++i)
      if (m.km_tables[i].freqs == freqs) k.table = int(i);
    if (k.table < 0) {
      k.table = int(m.km_tables.size());
      m.km_tables.push_back(KeyMeanTable{freqs, 0, {}});
    }
    const bool seen = std::any_of(m.km_rules.begin(), m.km_rules.end(), [&](const cuda::PagedRule& x) {
      return x.sink_end == r.sink_end && x.residual == r.residual && x.window == r.window;
    });
    if (!seen) m.km_rules.push_back(r);
  }
  m.rotate = kv_method(store.spec().config.method).device_scalar().rotated;
  if (m.rotate) {
    const std::vector<float> ones(size_t(m.H) * m.D, 1.0f);
    m.ones = cuda::to_device(ones.data(), ones.size() * 4);
  }
  const bool any_coded = std::any_of(m.rules.begin(), m.rules.end(), [](const cuda::PagedRule& r) { return r.coded; });
  m.tile_rows = cuda::paged_prefill_tile_rows(any_coded);
  const KVCacheConfig& cc = store.spec().config;
  if (any_coded && m.B == 32 &&
      cuda::prefill_scratch_supported(m.D, cc.key.sub_dim, cc.key.bits, cc.value.sub_dim, cc.value.bits)) {
    m.scr_cap_bytes = size_t(gpu_tuning().prefill_scratch_mib) << 20;
    m.scr_rule_of.assign(size_t(m.L), -1);
    for (int l = 0; l < m.L; ++l) {
      const cuda::PagedRule& r = m.rules[size_t(l)];
      if (!r.coded) continue;
      size_t i = 0;
      while (i < m.scr_rules.size() && !(m.scr_rules[i].sink_end == r.sink_end && m.scr_rules[i].residual == r.residual &&
                                         m.scr_rules[i].window == r.window))
        ++i;
      if (i == m.scr_rules.size()) m.scr_rules.push_back(r);
      m.scr_rule_of[size_t(l)] = int(i);
    }
  }
  m.stream.synchronize();
}

KVStoreDevice::~KVStoreDevice() = default;

void* KVStoreDevice::stream() const { return impl_->stream.handle(); }
void KVStoreDevice::synchronize() const { impl_->stream.synchronize(); }

void KVStoreDevice::begin_step() {
  Impl& m = *impl_;
  m.open = true;
  m.row_pos.clear();
  m.row_seq.clear();
  m.step_tables.clear();
  m.step_index.clear();
  for (auto& j : m.jobs) j.clear();
  m.copies.clear();
  m.updates.clear();
  m.tiles.clear();
  m.row_skip.clear();
}

namespace {
// Prefill chunks of at least this many rows take the tensor-core prefill kernel
// (VQ_PREFILL_KERNEL=0: the decode kernels for every row, for comparison).
constexpr int kPrefillMinRows = 16;
bool prefill_kernel_enabled() {
  return gpu_tuning().prefill_kernel;
}
}  // namespace

int KVStoreDevice::add_rows(const SeqKV& s, int64_t pos0, int n) {
  Impl& m = *impl_;
  VQ_CHECK(m.open, "kv store (cuda): add_rows outside a step");
  VQ_CHECK(s.store_ == &m.st, "kv store (cuda): rows of a sequence of another store");
  VQ_CHECK(pos0 >= 0 && pos0 + n <= int64_t(INT32_MAX), "kv store (cuda): positions {}..{} out of range", pos0,
           pos0 + n - 1);
  m.ensure_table(s);
  auto it = m.step_index.find(s.dev_table_);
  int32_t si;
  if (it == m.step_index.end()) {
    si = int32_t(m.step_tables.size());
    m.step_tables.push_back(s.dev_table_);
    m.step_index.emplace(s.dev_table_, si);
  } else {
    si = it->second;
  }
  const int first = int(m.row_pos.size());
  for (int i = 0; i < n; ++i) {
    m.row_pos.push_back(int32_t(pos0 + i));
    m.row_seq.push_back(si);
  }
  const bool tiled = tiles_rows(n);
  m.row_skip.resize(m.row_pos.size(), tiled ? 1 : 0);
  if (tiled) {
    const int P = cuda::paged_prefill_positions_per_tile(m.HQ / m.H, m.tile_rows);
    for (int i0 = 0; i0 < n; i0 += P) m.tiles.push_back({int32_t(first + i0), int32_t(std::min(P, n - i0))});
  }
  return first;
}

bool KVStoreDevice::tiles_rows(int n) const {
  return n >= kPrefillMinRows && impl_->B == 32 && prefill_kernel_enabled();
}

void KVStoreDevice::set_deterministic(bool on) { impl_->det = on; }

void KVStoreDevice::set_prefill_scratch_bytes(size_t bytes) {
  Impl& m = *impl_;
  VQ_CHECK(!m.open, "kv store (cuda): set_prefill_scratch_bytes inside a step");
  if (!m.scr_rules.empty()) m.scr_cap_bytes = bytes;
}
bool KVStoreDevice::prefill_scratch_possible() const { return !impl_->scr_rules.empty(); }

bool KVStoreDevice::finish_step() {
  Impl& m = *impl_;
  VQ_CHECK(m.open, "kv store (cuda): finish_step outside a step");
  m.decode_rows = int(m.row_skip.size());
  while (m.decode_rows > 0 && m.row_skip[size_t(m.decode_rows - 1)]) --m.decode_rows;
  for (int32_t tid : m.dirty_tables) {
    DevTable& t = m.tables[size_t(tid)];
    VQ_CHECK(!t.regrow, "kv store (cuda): a sequence grew past its device table outside the step's rows (internal error)");
    if (!t.live) continue;
    // One update per entry (the last value noted), so that the parallel fix-up has no write race.
    std::unordered_map<uint64_t, uint8_t*> last;
    for (const DevTable::Pending& e : t.pending) last[uint64_t(e.lk) * uint64_t(t.cap) + e.j] = e.value;
    for (const auto& [idx, value] : last) m.updates.push_back({t.buf.as<uint8_t*>() + idx, value});
    t.pending.clear();
  }
  m.dirty_tables.clear();
  const int rows = int(m.row_pos.size()), seqs = int(m.step_tables.size());
  int njobs = 0;
  for (const auto& j : m.jobs) njobs = std::max(njobs, int(j.size()));
  const uint64_t v0 = m.version;
  int64_t kb_terms = 0;
  if (!m.km_rules.empty()) {
    int64_t max_pos = 0;
    for (int32_t p : m.row_pos) max_pos = std::max<int64_t>(max_pos, p);
    for (const auto& lj : m.jobs)
      for (const cuda::BlockEncodeJob& j : lj) max_pos = std::max<int64_t>(max_pos, int64_t(j.pos0) + m.B - 1);
    kb_terms = m.plan_key_mean(max_pos);
  }
  const int nupd = int(m.updates.size()), ncopy = int(m.copies.size()), ntiles = int(m.tiles.size());
  const size_t workspace = m.workspace_need(std::max(rows, 1));
  if (m.fixed) m.use_slot(m.fits_slot0(rows, seqs, njobs, nupd, ncopy, ntiles, kb_terms, workspace) ? 0 : 1);
  const uint64_t v_slot = m.version;
  if (!m.km_rules.empty()) m.grow_key_bias(kb_terms);
  m.layout(std::max(rows, 1), std::max(seqs, 1), njobs, nupd, ncopy, ntiles);
  m.grow_workspace(workspace);
  VQ_CHECK(!m.fixed || m.cur_slot != 0 || m.version == v_slot,
           "kv store (cuda): the fixed descriptor slot grew (internal error)");
  m.plan_scratch();
  // descriptors
  std::memcpy(m.hptr<int32_t>(m.o_pos), m.row_pos.data(), size_t(rows) * 4);
  std::memcpy(m.hptr<int32_t>(m.o_rowseq), m.row_seq.data(), size_t(rows) * 4);
  for (int l = 0; l < m.L; ++l)
    for (int si = 0; si < seqs; ++si) {
      const DevTable& t = m.tables[size_t(m.step_tables[size_t(si)])];
      uint8_t** base = t.buf.as<uint8_t*>();
      m.hptr<uint8_t**>(m.o_dtab)[size_t(l) * m.seq_cap + size_t(si)] = base + (size_t(l) * 2 + 0) * size_t(t.cap);
      m.hptr<uint8_t**>(m.o_ctab)[size_t(l) * m.seq_cap + size_t(si)] = base + (size_t(l) * 2 + 1) * size_t(t.cap);
    }
  for (int l = 0; l < m.L; ++l) {
    m.hptr<int32_t>(m.o_njobs)[l] = int32_t(m.jobs[size_t(l)].size());
    std::copy(m.jobs[size_t(l)].begin(), m.jobs[size_t(l)].end(),
              m.hptr<cuda::BlockEncodeJob>(m.o_jobs) + size_t(l) * m.jobs_cap);
  }
  *m.hptr<int32_t>(m.o_nupd) = int32_t(m.updates.size());
  std::copy(m.updates.begin(), m.updates.end(), m.hptr<cuda::TableUpdate>(m.o_upd));
  *m.hptr<int32_t>(m.o_ncopy) = int32_t(m.copies.size());
  std::copy(m.copies.begin(), m.copies.end(), m.hptr<cuda::BlockCopy>(m.o_copy));
  std::copy(m.row_skip.begin(), m.row_skip.end(), m.hptr<uint8_t>(m.o_skip));
  std::copy(m.tiles.begin(), m.tiles.end(), m.hptr<cuda::PagedPrefillTile>(m.o_tiles));
  if (m.scr_on) {
    std::copy(m.scr_n.begin(), m.scr_n.end(), m.hptr<int32_t>(m.o_scr_n));
    std::copy(m.scr_seqs.begin(), m.scr_seqs.end(), m.hptr<int32_t>(m.o_scr_seqs));
    std::copy(m.scr_slot0.begin(), m.scr_slot0.end(), m.hptr<int64_t>(m.o_scr_slot0));
  }
  if (!m.km_rules.empty()) {
    std::copy(m.row_boff.begin(), m.row_boff.end(), m.hptr<int64_t>(m.o_boff));
    std::copy(m.row_bnseg.begin(), m.row_bnseg.end(), m.hptr<int32_t>(m.o_bnseg));
  }
  cuda::copy_to_device_async(m.dev.data(), m.host.data(), m.total, m.stream.handle());
  m.open = false;
  return m.version != v0;
}

int KVStoreDevice::rows() const { return int(impl_->row_pos.size()); }
bool KVStoreDevice::step_has_fixups() const { return !impl_->updates.empty() || !impl_->copies.empty(); }
bool KVStoreDevice::step_has_encodes() const {
  for (const auto& j : impl_->jobs)
    if (!j.empty()) return true;
  return false;
}
uint64_t KVStoreDevice::layout_version() const { return impl_->version; }
bool KVStoreDevice::step_in_fixed_slot() const { return impl_->fixed && impl_->cur_slot == 0; }

void KVStoreDevice::reserve_fixed(int rows, int64_t max_pos) {
  Impl& m = *impl_;
  VQ_CHECK(!m.open, "kv store (cuda): reserve_fixed inside a step");
  VQ_CHECK(!m.fixed, "kv store (cuda): reserve_fixed was called already (its sizes hold for the store's life)");
  VQ_CHECK(rows >= 1 && rows <= 65535, "kv store (cuda): reserve_fixed for {} rows (1..65535)", rows);
  VQ_CHECK(max_pos >= 0 && max_pos < int64_t(INT32_MAX), "kv store (cuda): reserve_fixed to position {}", max_pos);
  m.stream.synchronize();
  // A decode step: one row per sequence, at most one block per row and layer leaving the window,
  // table entries (new dense and coded blocks, released ones) and copy-on-write copies per
  // (sequence, layer) bounded as below.
  m.tiles.clear();
  m.decode_rows = rows;
  m.layout(rows, rows, rows, m.L * rows * 4 + 64, m.L * rows * 2 + 8, 0);
  m.grow_workspace(m.workspace_need(rows));
  if (!m.km_rules.empty()) {
    int64_t segs = m.key_mean_segments(max_pos);
    for (int64_t p = 0; p < max_pos; p += m.B) segs = std::max(segs, m.key_mean_segments(p));
    m.grow_key_bias(int64_t(rows) * segs * m.HQ);
    m.grow_key_mean_tables(max_pos + m.B);
  }
  m.fixed = true;
  m.fixed_max_pos = max_pos;
}
bool KVStoreDevice::step_prefill_scratch() const { return impl_->scr_on; }
const int32_t* KVStoreDevice::positions() const { return impl_->dptr<int32_t>(impl_->o_pos); }

void KVStoreDevice::launch_fixup() {
  Impl& m = *impl_;
  cuda::StepFixupParams p;
  p.n_updates = m.dptr<int>(m.o_nupd);
  p.updates = m.dptr<cuda::TableUpdate>(m.o_upd);
  p.max_updates = m.upd_cap;
  p.n_copies = m.dptr<int>(m.o_ncopy);
  p.copies = m.dptr<cuda::BlockCopy>(m.o_copy);
  p.max_copies = m.copy_cap;
  cuda::step_fixup_device(p, m.stream.handle());
}

void KVStoreDevice::launch_append(int layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride) {
  Impl& m = *impl_;
  cuda::KVAppendParams p;
  p.rows = int(m.row_pos.size());
  p.n_kv_heads = m.H;
  p.head_dim = m.D;
  p.block_tokens = m.B;
  p.k = k, p.k_stride = k_stride;
  p.v = v, p.v_stride = v_stride;
  p.pos = m.dptr<int32_t>(m.o_pos);
  p.row_table = m.dptr<int32_t>(m.o_rowseq);
  const bool direct = m.direct(layer);  // rows coded into the layer's scalar blocks
  p.tables = m.dptr<uint8_t* const*>((direct ? m.o_ctab : m.o_dtab) + size_t(layer) * m.seq_cap * 8);
  p.elem = m.rules[size_t(layer)].elem;
  p.rotate = direct && m.rotate;
  cuda::kv_append_device(p, m.stream.handle());
}

void KVStoreDevice::launch_encode(int layer) {
  Impl& m = *impl_;
  if (!m.rules[size_t(layer)].coded) return;
  const KVCacheConfig& c = m.st.spec_.config;
  const Calibration& cal = *m.st.spec_.calibration;
  const LayerBooks& b = m.books[size_t(layer)];
  cuda::KVEncodeParams p;
  p.n_kv_heads = m.H;
  p.head_dim = m.D;
  p.block_tokens = m.B;
  p.n_jobs = m.dptr<int>(m.o_njobs) + layer;
  p.jobs = m.dptr<cuda::BlockEncodeJob>(m.o_jobs) + size_t(layer) * m.jobs_cap;
  p.max_jobs = m.jobs_cap;
  p.k_sub_dim = c.key.sub_dim, p.k_bits = c.key.bits, p.k_per_subspace = cal.key_books() > 1;
  p.lambda = b.lambda.as<float>();
  p.key_map_t = b.key_map_t.as<float>();
  p.k_books = b.k32.as<float>();
  p.v_sub_dim = c.value.sub_dim, p.v_bits = c.value.bits, p.v_per_subspace = cal.value_books() > 1;
  p.v_books = b.v32.as<float>();
  if (!m.km.empty()) p.key_mean = m.key_mean_of(layer);
  cuda::kv_encode_blocks_device(p, m.stream.handle());
}

void KVStoreDevice::launch_attend(int layer, const float* q, int64_t q_stride, float scale, cuda::ElemType out_type,
                                  void* out, int64_t out_stride) {
  Impl& m = *impl_;
  const int rows = int(m.row_pos.size());
  cuda::PagedAttnParams p = m.attn_params(layer, rows);
  p.pos = m.dptr<int32_t>(m.o_pos);
  p.row_table = m.dptr<int32_t>(m.o_rowseq);
  p.dense_tables = m.dptr<const uint8_t* const*>(m.o_dtab + size_t(layer) * m.seq_cap * 8);
  p.coded_tables = m.dptr<const uint8_t* const*>(m.o_ctab + size_t(layer) * m.seq_cap * 8);
  p.q = q;
  p.q_stride = q_stride;
  p.scale = scale;
  const bool direct = m.direct(layer);
  if (direct) p.dense_tables = p.coded_tables;  // a direct layer's only blocks: its scalar blocks
  if (!direct && !m.tiles.empty()) {
    const KVPool::Span sp = m.st.pool_.device_span(m.st.dense_arena_);
    p.dense_base = sp.base, p.dense_bytes = sp.bytes, p.dense_align = sp.align;
  }
  const bool rotated = direct && m.rotate;
  if (rotated) {  // the keys were rotated: score with H q (the softmax scale stays the kernels')
    m.transform_queries(rows, q, q_stride, m.ones.as<float>(), 1.0f);
    p.q = m.qcode.as<float>();
    p.q_stride = int64_t(m.HQ) * m.D;
  }
  if (p.rule.coded && attn_fork_enabled()) {
    m.fork.record(m.stream.handle());
    m.fork.wait(m.side.handle());
    p.dense_stream = m.side.handle();
    p.dense_join = m.join.handle();
  }
  if (p.rule.coded) {
    const LayerBooks& b = m.books[size_t(layer)];
    m.transform_queries(rows, q, q_stride, b.lambda.as<float>(), scale, b.query_map_t.as<float>());
    p.q_code = m.qcode.as<float>();
    p.k_book = m.books[size_t(layer)].k16.as<uint16_t>();
    p.v_book = m.books[size_t(layer)].v16.as<uint16_t>();
    if (!m.km.empty() && m.km[size_t(layer)].n_pairs > 0) {
      p.key_bias.values = m.kbias.as<float>();
      p.key_bias.row_off = m.dptr<int64_t>(m.o_boff);
      p.key_bias.row_nseg = m.dptr<int32_t>(m.o_bnseg);
      cuda::KeyBiasParams kb;
      kb.rows = rows;
      kb.n_kv_heads = m.H;
      kb.group = m.HQ / m.H;
      kb.head_dim = m.D;
      kb.rule = p.rule;
      kb.pos = p.pos;
      kb.q = q;
      kb.q_stride = q_stride;
      kb.scale = scale;
      kb.km = m.key_mean_of(layer);
      kb.out = p.key_bias;
      cuda::key_bias_device(kb, m.stream.handle());
    }
  }
  if (!m.tiles.empty()) {
    p.tiles = m.dptr<cuda::PagedPrefillTile>(m.o_tiles);
    p.n_tiles = int(m.tiles.size());
    p.tile_rows = m.tile_rows;
    p.row_skip = m.dptr<uint8_t>(m.o_skip);
    const int ri = m.scr_on ? m.scr_rule_of[size_t(layer)] : -1;
    if (ri >= 0) {
      cuda::PrefillScratch& sc = p.prefill_scratch;
      sc.blocks = m.scr.data();
      sc.slots = m.scr_slots;
      sc.slot0 = m.dptr<int64_t>(m.o_scr_slot0) + size_t(ri) * m.seq_cap;
      sc.seqs = m.dptr<int32_t>(m.o_scr_seqs) + size_t(ri) * m.seq_cap * 4;
      sc.n_seqs = m.dptr<int32_t>(m.o_scr_n) + ri;
      sc.max_seqs = m.seq_cap;
    }
  }
  p.out_type = out_type;
  p.out = out;
  p.out_stride = out_stride;
  p.workspace = m.work.data();
  p.workspace_bytes = m.work.size();
  cuda::paged_attention_device(p, m.stream.handle());
  if (rotated) {  // the values were rotated too: the output back (H is its own inverse)
    cuda::RotateRowsParams r;
    r.rows = rows;
    r.n_heads = m.HQ;
    r.head_dim = m.D;
    r.type = out_type;
    r.x = out;
    r.stride = out_stride;
    cuda::rotate_rows_device(r, m.stream.handle());
  }
}

void KVStoreDevice::append_device(SeqKV& s, int layer, const float* k, const float* v, int n) {
  Impl& m = *impl_;
  VQ_CHECK(s.store_ == &m.st, "kv store: append to a sequence of another store (or a released one)");
  if (n == 0) return;
  std::vector<int64_t> counts;
  m.st.blocks_for_append(s, n, counts);
  m.st.pool().reserve(counts);
  begin_step();
  const int64_t pos0 = s.layer_size(layer);
  try {
    m.st.append_blocks(s, layer, n);
  } catch (...) {
    m.open = false;
    throw;
  }
  add_rows(s, pos0, n);
  finish_step();
  const int64_t kvd = int64_t(m.H) * m.D;
  launch_fixup();
  launch_append(layer, k, kvd, v, kvd);
  launch_encode(layer);
  m.stream.synchronize();
}

void KVStoreDevice::append_host(SeqKV& s, int layer, const float* k, const float* v, int n) {
  Impl& m = *impl_;
  if (n == 0) return;
  const size_t bytes = size_t(n) * m.H * m.D * 4;
  if (m.kbuf.size() < bytes) m.kbuf = cuda::DeviceBuffer(bytes), m.vbuf = cuda::DeviceBuffer(bytes);
  m.kbuf.upload(k, bytes);
  m.vbuf.upload(v, bytes);
  append_device(s, layer, m.kbuf.as<float>(), m.vbuf.as<float>(), n);
}

void KVStoreDevice::attend_host(int layer, const AttnEntry* ents, int n_ents, float scale) {
  Impl& m = *impl_;
  const int HQ = m.HQ, D = m.D;
  int rows = 0;  // (KVStore::attend checked the entries)
  for (int e = 0; e < n_ents; ++e) rows += ents[e].n_q;
  if (rows == 0) return;
  begin_step();
  for (int e = 0; e < n_ents; ++e)
    if (ents[e].n_q > 0) add_rows(*ents[e].seq, ents[e].pos0, ents[e].n_q);
  finish_step();
  const size_t row_bytes = size_t(HQ) * D * 4;
  if (m.qbuf.size() < size_t(rows) * row_bytes)
    m.qbuf = cuda::DeviceBuffer(size_t(rows) * row_bytes), m.obuf = cuda::DeviceBuffer(size_t(rows) * row_bytes);
  size_t off = 0;
  for (int e = 0; e < n_ents; ++e) {
    if (ents[e].n_q == 0) continue;
    m.qbuf.upload(ents[e].q, size_t(ents[e].n_q) * row_bytes, off);
    off += size_t(ents[e].n_q) * row_bytes;
  }
  launch_fixup();
  launch_attend(layer, m.qbuf.as<float>(), int64_t(HQ) * D, scale, cuda::ElemType::f32, m.obuf.data(),
                int64_t(HQ) * D);
  m.stream.synchronize();
  off = 0;
  for (int e = 0; e < n_ents; ++e) {
    if (ents[e].n_q == 0) continue;
    m.obuf.download(ents[e].out, size_t(ents[e].n_q) * row_bytes, off);
    off += size_t(ents[e].n_q) * row_bytes;
  }
}

void KVStoreDevice::download_block(int arena, int32_t id, void* dst) const {
  const KVPool& pool = impl_->st.pool();
  impl_->stream.synchronize();
  const size_t bytes = pool.block_bytes(arena);
  cuda::copy_to_host_async(dst, pool.data(arena, id), bytes, impl_->stream.handle());
  impl_->stream.synchronize();
}


void KVStoreDevice::copy_to_host(const std::vector<HostCopy>& copies) const {
  const Impl& m = *impl_;
  m.stream.synchronize();  // the steps that wrote them
  for (const HostCopy& c : copies) cuda::copy_to_host_async(c.dst, c.src, c.bytes, m.stream.handle());
  m.stream.synchronize();
}

void KVStoreDevice::copy_to_device(const std::vector<HostCopy>& copies) {
  Impl& m = *impl_;
  for (const HostCopy& c : copies) cuda::copy_to_device_async(c.dst, c.src, c.bytes, m.stream.handle());
  m.stream.synchronize();  // the host buffers may go once this returns
}

void KVStoreDevice::note_block(const SeqKV& s, int layer, bool coded, size_t j) {
  Impl& m = *impl_;
  if (s.dev_table_ < 0) return;  // its table is built whole at its first step
  DevTable& t = m.tables[size_t(s.dev_table_)];
  if (t.pending.empty() && !t.regrow) m.dirty_tables.push_back(s.dev_table_);
  if (int64_t(j) >= t.cap) {
    t.regrow = true;  // add_rows rebuilds it whole
    return;
  }
  const auto& sl = s.layers_[size_t(layer)];
  const int32_t id = coded ? sl.coded[j] : sl.dense[j];
  t.pending.push_back({uint32_t(layer * 2 + (coded ? 1 : 0)), uint64_t(j), m.block_ptr(layer, coded, id)});
}

void KVStoreDevice::note_copy(const uint8_t* src, uint8_t* dst, size_t bytes) {
  Impl& m = *impl_;
  VQ_CHECK(m.open && bytes % 16 == 0, "kv store (cuda): a block copy outside a step or of {} bytes (internal error)",
           bytes);
  m.copies.push_back({src, dst, uint64_t(bytes)});
}

void KVStoreDevice::note_encode(int layer, const uint8_t* dense, uint8_t* coded, int64_t pos0) {
  Impl& m = *impl_;
  VQ_CHECK(m.open, "kv store (cuda): an encode outside a step (internal error)");
  m.jobs[size_t(layer)].push_back({dense, coded, int32_t(pos0)});
}

void KVStoreDevice::release_table(SeqKV& s) {
  Impl& m = *impl_;
  if (s.dev_table_ < 0) return;
  DevTable& t = m.tables[size_t(s.dev_table_)];
  t.live = false;
  t.regrow = false;
  t.pending.clear();
  m.free_tables.push_back(s.dev_table_);
  s.dev_table_ = -1;
}

#endif

}  // namespace vq
