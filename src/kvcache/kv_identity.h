#pragma once
// What a block of KV payload was made with, as checksums: the model (its GGUF file), the cache
// spec (every field that changes the bytes of a block or which form a query reads) and the
// calibration (VecInfer codebooks). The prefix cache keys its hash chains by it and session files
// carry it in their header, so KV made under one identity is never read under another.
#include <cstdint>
#include <string>

namespace vq {

class KVStore;
struct Calibration;

struct KVIdentity {
  uint64_t model = 0;        // xxh64 of the model file
  uint64_t spec = 0;         // spec_checksum()
  uint64_t calibration = 0;  // calibration_checksum(), 0: none
  std::string model_name;    // for messages: the model file's name
  std::string spec_name;     // for messages: the canonical spec string
  uint64_t combined() const;  // one key of all three
};

// xxh64 of a whole file (mapped; the model's pages are read anyway by the first step).
uint64_t file_checksum(const std::string& path);
// The store's spec as it shapes blocks: method, presets, granularity, residual, sinks, KIVI
// bits/group, block size, geometry and layer count.
uint64_t spec_checksum(const KVStore& kv);
// The calibration's contents (header fields and every array); 0 for nullptr.
uint64_t calibration_checksum(const Calibration* c);
KVIdentity kv_identity(const KVStore& kv, const std::string& model_path);
// The identity of kv for base's model (no second pass over the model file): another
// tensor-parallel rank's store, whose calibration is its heads' slice.
KVIdentity kv_identity_like(const KVIdentity& base, const KVStore& kv);

}  // namespace vq
