#pragma once
// CodedFormat: one layer's compressed KV block payload and the kernels that write and read it.
// A block holds block_tokens tokens of every KV head of one layer. The KV store (kv_store.h)
// owns block tables, the fp16 window and the attention driver; a format only knows its bytes.
//
// Two kinds:
//  - windowed (KIVI, VecInfer): tokens arrive in the fp16 window form and are encoded a whole
//    block at a time when the block leaves the window (encode_block);
//  - direct (q8_0, q4_0, as llama.cpp): every token is written into its coded block on append
//    (write_tokens); no fp16 form exists.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "veloxquant/config.h"
#include "veloxquant/kv_cache.h"

namespace vq {

struct Calibration;

// Per-entry query state a format prepares once per attention call (e.g. transformed queries and
// lookup tables); read concurrently by the worker threads.
class QueryPrep {
 public:
  virtual ~QueryPrep() = default;
};

// Whether the fp16 value at p is finite (its exponent is not all ones): block_finite's check of a
// stored scale or minimum.
inline bool f16_finite_at(const uint8_t* p) { return ((uint16_t(p[1]) << 8 | p[0]) & 0x7c00u) != 0x7c00u; }
// Whether the count fp16 values at p, p + stride, p + 2 * stride, ... are all finite.
inline bool f16_all_finite(const uint8_t* p, size_t count, size_t stride = 2) {
  for (size_t i = 0; i < count; ++i)
    if (!f16_finite_at(p + i * stride)) return false;
  return true;
}

class CodedFormat {
 public:
  CodedFormat(const KVGeometry& g, int block_tokens) : geo_(g), B_(block_tokens) {}
  virtual ~CodedFormat() = default;

  virtual std::string name() const = 0;
  virtual size_t block_bytes() const = 0;  // one block: block_tokens tokens x all KV heads
  virtual bool direct() const { return false; }
  virtual size_t codebook_bytes() const { return 0; }

  // Windowed: encodes one full block whose first token sits at position pos0 (a format may code
  // keys relative to their position: VecInfer's rotated key mean). k, v: [n_kv_heads, block_tokens,
  // head_dim] f32 (the function may overwrite them); block: [block_bytes()].
  virtual void encode_block(float* k, float* v, uint8_t* block, int64_t pos0) const;
  // Direct: writes n tokens into slots [slot, slot + n) of a block. k, v: [n, n_kv_heads, head_dim].
  virtual void write_tokens(const float* k, const float* v, int n, int slot, uint8_t* block) const;

  // Whether every float a block stores (its scales and minima) is finite; a block read from a
  // file is checked with it. Default: the format stores codes only (VecInfer: centroid indices).
  virtual bool block_finite(const uint8_t* block) const {
    (void)block;
    return true;
  }

  // q: [n_q, n_heads, head_dim] f32 of one entry. Default: keeps q * scale.
  virtual std::unique_ptr<QueryPrep> prepare(const float* q, int n_q, float scale) const;
  // Accumulates n coded tokens into the online-softmax state of query i (of the prepared entry)
  // and the `group` query heads of KV head h: m, d: [group], o: [group, head_dim] (not
  // normalised). Token 0 of the run sits at slot `first` of blocks[0]; later tokens continue
  // through blocks[1], blocks[2], ... (each the base address of a block); slot 0 of blocks[0]
  // holds position pos0.
  virtual void attend(const QueryPrep& prep, int i, int h, const uint8_t* const* blocks, int first, int64_t n,
                      float* m, float* d, float* o, int64_t pos0) const = 0;

  const KVGeometry& geometry() const { return geo_; }
  int block_tokens() const { return B_; }
  // Test hook: attend() through the plain reference kernels (VecInfer: decode the codes, then
  // attend) instead of the fast ones.
  void set_reference(bool on) { reference_ = on; }

 protected:
  KVGeometry geo_;
  int B_;
  bool reference_ = false;
};

// q * scale, [n_q, n_heads, head_dim]: the default QueryPrep.
class ScaledQueries : public QueryPrep {
 public:
  ScaledQueries(const float* q, int n_q, const KVGeometry& g, float scale);
  // The group's queries of query i, KV head h: [group, head_dim].
  const float* at(int i, int h) const { return q_.get() + (size_t(i) * n_heads_ + size_t(h) * group_) * head_dim_; }

 private:
  std::unique_ptr<float[]> q_;
  int n_heads_, group_, head_dim_;
};

// The coded format of a layer for a KV method; nullptr for fp16 / fp32 (no coded form).
// calib: the model's calibration (VecInfer), validated against the layer.
std::unique_ptr<CodedFormat> make_coded_format(const KVCacheConfig& cfg, const Calibration* calib, int layer,
                                               const KVGeometry& g, int block_tokens);

}  // namespace vq
