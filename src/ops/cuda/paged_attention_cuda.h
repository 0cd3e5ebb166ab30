#pragma once
// Attention over the KV pool's blocks on the GPU (vq::cuda): every query row reads its
// sequence's blocks through a block table (device array of block base pointers, indexed by
// block number = position / block_tokens), with the KV store's position-defined window rule
// (kvcache/kv_store.h) applied per query position:
//   dense  [kb, min(t+1, sink_end))          sinks (VecInfer)
//   coded  [max(kb, sink_end), min(t+1, ce)) ce = max(floor((t+1-R)/B)*B, sink_end)
//   dense  [max(kb, ce), t+1]                 the fp16 window
// with kb = max(0, t+1-W) for a sliding window of W tokens (0: global); an all-dense layer
// (fp16 method) reads [kb, t+1] dense. Block layouts (bytes identical to the CPU's):
//   dense: fp16 keys channel-major [H][D][B], then values [H][B][D];
//   coded: VecInfer codes, keys [H][B][krow] then values [H][B][vrow] (packed rows).
//
// Launch sequence: coded split kernel (the LUT or gather-mma kernel of pq_attention.cu in its
// paged mode) + dense split kernel, each writing flash-decoding partials (m, l, o) per split,
// then one merge kernel that combines them and normalises. Grids are fixed by the plan (rows,
// heads, split counts) and every per-row range is derived on the device from the row's
// position, so the launch sequence can be captured once in a CUDA graph and replayed with new
// positions and tables.
// No CUDA types here; all pointers are device pointers unless a comment says otherwise.
#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/cuda/elem_type.h"
#include "ops/cuda/pq_attention_cuda.h"

#if defined(__CUDACC__)
#define VQ_HD __host__ __device__ __forceinline__
#else
#define VQ_HD inline
#endif

namespace vq::cuda {

// The window rule of one layer (KVStore::Layer).
struct PagedRule {
  int block_tokens = 32;  // B: a power of two >= 32
  int64_t sink_end = 0;   // a multiple of B (0: no sinks)
  int64_t residual = 0;   // R
  int64_t window = 0;     // sliding window W (0: global)
  bool coded = false;     // the layer has a coded (VecInfer) form
  PagedElem elem = PagedElem::f16;  // the blocks of an all-dense layer (coded == false)
};

// Key ranges [lo, hi) of a query at position t; empty ranges have hi <= lo.
struct PagedRanges {
  int64_t sink_lo, sink_hi, code_lo, code_hi, win_lo, win_hi;
};

VQ_HD int64_t paged_max64(int64_t a, int64_t b) { return a > b ? a : b; }
VQ_HD int64_t paged_min64(int64_t a, int64_t b) { return a < b ? a : b; }

VQ_HD PagedRanges paged_ranges(const PagedRule& r, int64_t t) {
  const int64_t lim = t + 1;
  const int64_t kb = r.window > 0 ? paged_max64(0, t + 1 - r.window) : 0;
  PagedRanges g{0, 0, 0, 0, 0, 0};
  if (!r.coded) {
    g.win_lo = kb, g.win_hi = lim;
    return g;
  }
  const int64_t B = r.block_tokens;
  const int64_t ce = paged_max64(paged_max64(0, t + 1 - r.residual) / B * B, r.sink_end);
  g.sink_lo = kb, g.sink_hi = paged_min64(lim, r.sink_end);
  g.code_lo = paged_max64(kb, r.sink_end), g.code_hi = paged_min64(lim, ce);
  g.win_lo = paged_max64(kb, ce), g.win_hi = lim;
  return g;
}

// VecInfer's rotated key mean (codec/key_mean.h) on the device: the coded keys are k - R(p_b) mu,
// and every score of a coded key at position u gains the term scale * q . R(p_b) mu, p_b = u
// rounded down to a multiple of 16 (kKeyMeanSegmentLog2; the device store takes calibrations with
// that segment only): one number per (row, query head, segment), computed for the step by
// key_bias_device (key_mean_cuda.h) into `values` before the attention kernels run. Row r's numbers
// start at row_off[r]: row_nseg[r] per query head (the segments of the widest coded range any
// layer of the store gives that row), the first one the segment of the row's code_lo.
inline constexpr int kKeyMeanSegmentLog2 = 4;
struct PagedKeyBias {
  float* values = nullptr;            // null: the layer has no key mean
  const int64_t* row_off = nullptr;   // [rows]
  const int32_t* row_nseg = nullptr;  // [rows]
};

// Where the term of (row r, query head qh, coded key u) lies in values (u in the row's code range).
VQ_HD int64_t key_bias_index(int64_t row_off, int row_nseg, int64_t code_lo, int qh, int64_t u) {
  return row_off + int64_t(qh) * row_nseg + ((u >> kKeyMeanSegmentLog2) - (code_lo >> kKeyMeanSegmentLog2));
}

// Prefill of coded layers with the past decoded once per step (CUDA_NOTES.md section 6): before the
// prefill kernel, the code blocks the step's tiles read are decoded into `blocks`, fp16 slots of
// [n_kv_heads][K, V][32 tokens][head_dim] (prefill_scratch_halves(head_dim) per KV head), and
// the prefill kernel copies a coded pass from there instead of decoding it in every tile. Sequence
// entry i of `seqs` (n_seqs of them, device count, at most max_seqs): {table, first block, blocks,
// first slot}; block b of table t's sequence is slot slot0[t] + b. blocks null: per-tile decoding.
struct PrefillScratch {
  void* blocks = nullptr;
  int slots = 0;                      // capacity in slots (the decode kernel's grid)
  const int64_t* slot0 = nullptr;     // [tables]
  const int32_t* seqs = nullptr;      // [max_seqs][4]
  const int32_t* n_seqs = nullptr;
  int max_seqs = 0;
};
VQ_HD constexpr int64_t prefill_scratch_halves(int head_dim) { return int64_t(2) * 32 * head_dim; }
// Whether a coded layer's prefill can take the scratch: 8-bit codes in rows of whole 32-bit words
// (sub-spaces a multiple of 4) and sub-vectors of a multiple of 4 channels.
inline bool prefill_scratch_supported(int head_dim, int k_sub_dim, int k_bits, int v_sub_dim, int v_bits) {
  return k_bits == 8 && v_bits == 8 && k_sub_dim > 0 && v_sub_dim > 0 && k_sub_dim % 4 == 0 && v_sub_dim % 4 == 0 &&
         (head_dim / k_sub_dim) % 4 == 0 && (head_dim / v_sub_dim) % 4 == 0;
}

// Prefill: a tile of consecutive query rows (positions) of one sequence, computed by the
// tensor-core prefill kernel (each key block read once per tile); at most
// paged_prefill_positions_per_tile(group, tile_rows) rows, block_tokens 32. A tile holds
// tile_rows = paged_prefill_tile_rows(coded) (position, query head) rows: 128 when some layer of
// the store is coded (its decode of code tiles is shared by more rows), else 64.
struct PagedPrefillTile {
  int32_t row0 = 0;   // first row (rows row0 .. row0 + n_pos - 1: positions p, p+1, ...)
  int32_t n_pos = 0;
};
int paged_prefill_tile_rows(bool coded);
int paged_prefill_positions_per_tile(int group, int tile_rows);

struct PagedAttnParams {
  int rows = 0;               // query rows (decode: one per sequence; prefill: one per position)
  int n_kv_heads = 0;
  int group = 1;              // query heads per KV head, 1..16
  int head_dim = 0;           // 64, 128 or 256
  PagedRule rule;
  const int32_t* pos = nullptr;                       // [rows] query position
  // Block tables: row r reads tables[row_table[r]] (row_table null: tables[r]), so rows of one
  // sequence (a prefill chunk) share one entry.
  const int32_t* row_table = nullptr;
  const uint8_t* const* const* dense_tables = nullptr;  // the sequences' dense block tables
  const uint8_t* const* const* coded_tables = nullptr;  // coded block tables (rule.coded)
  // Where every fp16 block of dense_tables lies (the pool arena's device span, KVPool::device_span)
  // and the power of two dividing each block's distance from dense_base: the prefill kernel reads
  // the blocks by TMA through one tensor map over it. Null: unknown (the prefill takes the
  // synchronous form).
  const uint8_t* dense_base = nullptr;
  size_t dense_bytes = 0, dense_align = 0;
  const float* q = nullptr;   // row r at q + r*q_stride: [n_kv_heads*group][head_dim] f32 after RoPE
  int64_t q_stride = 0;       // elements; 0: packed
  float scale = 1.0f;         // score = scale * q.k on the dense keys
  // VecInfer layers (rule.coded): transformed queries q~ = H(q*lambda)*scale (query_transform_device),
  // presets and fp16 codebooks [n_kv_heads, books, 2^bits, sub_dim].
  const float* q_code = nullptr;  // [rows][n_kv_heads*group][head_dim] packed
  int k_sub_dim = 4, k_bits = 8;
  bool k_per_subspace = false;
  int v_sub_dim = 4, v_bits = 8;
  bool v_per_subspace = false;
  const uint16_t* k_book = nullptr;
  const uint16_t* v_book = nullptr;
  PQAttnKernel kernel = PQAttnKernel::automatic;
  PagedKeyBias key_bias;      // coded layers of a calibration with the rotated key mean
  // Split counts (paged_attention_plan fills them from the SM count; fixed for a captured graph).
  int coded_splits = 0, dense_splits = 0;
  int dense_variant = -1;     // the dense split kernel's variant (paged_attention_plan)
  // Prefill tiles (device array, n_tiles of them; eager steps): their rows are computed by the
  // prefill kernel and skipped by the decode kernels (row_skip[r] = 1).
  const PagedPrefillTile* tiles = nullptr;
  int n_tiles = 0;
  int tile_rows = 0;          // paged_prefill_tile_rows: the tiles were cut for this many rows
  int prefill_splits = 0;     // key splits of the prefill kernel (paged_attention_plan: few tiles -> several)
  const uint8_t* row_skip = nullptr;  // [rows] or null
  PrefillScratch prefill_scratch;     // coded layers' tiles: the past decoded once (blocks null: not)
  // Rows [decode_rows, rows) are all prefill-tile rows (row_skip set): the decode kernels, their
  // merge and their workspace cover rows [0, decode_rows) only. -1: all rows.
  int decode_rows = -1;
  ElemType out_type = ElemType::f32;  // f32 or f16 (the input of the output projection)
  void* out = nullptr;        // row r at out + r*out_stride: [n_kv_heads*group][head_dim]
  int64_t out_stride = 0;     // elements; 0: packed
  void* workspace = nullptr;  // paged_attention_workspace_bytes(params)
  size_t workspace_bytes = 0;
  // Coded layers: a second stream for the dense split kernel, so that it runs beside the query
  // transform and the coded split kernel (a graph branch). The caller records an event on the
  // main stream before the query transform and makes dense_stream wait for it; dense_join (a
  // cuda::Event handle) is recorded on dense_stream after the dense kernel and waited for by
  // the main stream before the merge. Null: everything on the main stream.
  void* dense_stream = nullptr;
  void* dense_join = nullptr;
};

// The decode kernels for a shape (the model: llama.cpp's ggml_cuda_get_best_fattn_kernel): one
// place that says whether a shape is supported (why_not names what is not) and, if it is, which
// kernels run it and how the sequence is split, from the shape and the SM count:
//   dense part (fp16 layers; sinks and window of coded ones): the tensor-core dense split kernel
//     (all query heads of a KV head in one block), dense_splits chosen so that rows * n_kv_heads
//     * dense_splits blocks fill whole waves of the GPU;
//   coded part: the LUT kernel where it takes the presets, else gather-mma.
// rows here are the decode kernels' rows (decode_rows when a step also holds prefill tiles).
struct PagedDecodeChoice {
  bool supported = false;
  std::string why_not;  // "" when supported
  PQAttnKernel coded = PQAttnKernel::automatic;  // lut or gather_mma for coded layers
  int dense_variant = 0;
  int coded_splits = 0, dense_splits = 0;
};
PagedDecodeChoice paged_attention_choose(const PagedAttnParams& p, int sm_count);
// "" when the shape and presets are supported, else what is not.
std::string paged_attention_unsupported_reason(const PagedAttnParams& p);
// Fills coded_splits / dense_splits / dense_variant from paged_attention_choose with the device's
// SM count (throws naming what is unsupported). Rows shorter than the splits leave later splits
// empty; those blocks exit at once.
void paged_attention_plan(PagedAttnParams& p);
// Benchmarks only: plan later steps with dense kernel variant v (0..paged_attention_dense_variants()-1;
// -1: the dispatch's choice). Not read by anything but paged_attention_choose.
void paged_attention_set_dense_variant(int v);
// For bench/cuda only: the most splits the LUT kernel's plan may use per (row, KV head, head tile)
// (0: the dispatcher's cap, 64), to time the split choice at few units.
void paged_attention_set_coded_split_cap(int cap);
int paged_attention_dense_variants();
size_t paged_attention_workspace_bytes(const PagedAttnParams& p);
// Throws vq::Error naming the field unless supported (shapes, presets, splits, workspace).
void check_paged_attention(const PagedAttnParams& p);
// Asynchronous on `stream`; no allocation, no synchronisation (capturable).
void paged_attention_device(const PagedAttnParams& p, void* stream = nullptr);
// Whether the coded split kernel for these presets is the LUT one (else gather-mma).
bool paged_attention_uses_lut(const PagedAttnParams& p);

}  // namespace vq::cuda
