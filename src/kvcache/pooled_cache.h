#pragma once
// PooledCache: the KVCache interface (one layer of one sequence) over a private KVStore, so the
// standalone cache API and its tests run the very code the batched engine runs. Appends go
// through KVStore::append, attention through KVStore::attend with one entry. attend(q, n_q)
// serves queries for tokens of the last append (n_q at most its count): an append releases the
// fp16 window older queries read.
#include <memory>

#include "kvcache/kv_store.h"
#include "veloxquant/kv_cache.h"

namespace vq {

class PooledCache final : public KVCache {
 public:
  // layer: the model layer this cache serves (selects the layer's VecInfer codebooks).
  PooledCache(const KVGeometry& g, const KVSpec& spec, int layer);

  void append(const float* k, const float* v, int n_tokens) override;
  void attend(const float* q, int n_q, float scale, float* out) const override;
  int64_t size() const override { return seq_.size(); }
  void clear() override;
  size_t bytes() const override { return store_->allocated_bytes(seq_); }
  size_t token_bytes() const { return store_->token_bytes(seq_); }
  size_t codebook_bytes() const override { return store_->codebook_bytes(); }
  const KVGeometry& geometry() const override { return store_->geometry(); }
  std::string name() const override { return store_->name(); }

  // Test hooks: tokens held as codes / as fp16 blocks (whole blocks), the attention sinks, and
  // attention through the reference kernels (VecInfer: decode the codes, then attend).
  int64_t coded_tokens() const;
  int64_t dense_block_tokens() const { return store_->blocks_held(seq_, 0, false) * store_->block_tokens(); }
  void attend_dequantized(const float* q, int n_q, float scale, float* out);

  const KVStore& store() const { return *store_; }
  const SeqKV& sequence() const { return seq_; }

 private:
  std::unique_ptr<KVStore> store_;
  SeqKV seq_;
};

}  // namespace vq
