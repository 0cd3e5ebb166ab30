#pragma once
// KVPool: a byte-budgeted store of fixed-size, reference-counted blocks holding KV payloads.
// Blocks live in arenas of one block size each (one arena per payload format: the fp16 window
// form, each coded form); block ids are arena-local. A block is shared by every sequence whose
// block table names it (a common prefix); the last release frees it. A block of one arena may
// be linked to its "twin" in another arena (an fp16 block and the coded block encoded from it):
// codes are a pure function of the fp16 contents, so a second sequence that needs the coded form
// of a shared fp16 block takes the twin instead of encoding it again.
//
// Running out of budget throws KVPoolExhausted, a recoverable condition: nothing is changed, and
// the caller refuses or preempts a sequence. Callers that must not fail half-way (a model step)
// ask can_allocate() for everything first.
//
// Memory: each block is its own 64-byte aligned allocation, returned to the allocator when freed,
// so resident memory follows used_bytes(), which never exceeds the budget.
// Device pools (KVDevice::cuda) hold block memory on the GPU: blocks are carved from device slabs
// (cudaMalloc'd once, growing geometrically per arena up to 64 MiB) and go back to their arena's
// free list, so device memory follows the peak of each arena, not used_bytes(); data() is then a
// device pointer. reserve() makes room for a step's blocks first, so that running out of device
// memory throws before any sequence changes.
// Not thread-safe: one thread allocates and releases; kernels may read blocks concurrently.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"

namespace vq {

class KVPoolExhausted : public Error {
 public:
  using Error::Error;
};

// Where a pool's block memory lives.
enum class KVDevice { cpu, cuda };
const char* kv_device_name(KVDevice d);

class KVPool {
 public:
  explicit KVPool(size_t budget_bytes, KVDevice device = KVDevice::cpu);
  ~KVPool();
  KVPool(const KVPool&) = delete;
  KVPool& operator=(const KVPool&) = delete;

  // Adds an arena of blocks of block_bytes (> 0) and returns its id.
  int add_arena(size_t block_bytes, std::string name);
  int n_arenas() const { return int(arenas_.size()); }
  size_t block_bytes(int arena) const { return arenas_[size_t(arena)].block_bytes; }
  const std::string& arena_name(int arena) const { return arenas_[size_t(arena)].name; }

  // One new block with refcount 1 (contents undefined). Throws KVPoolExhausted naming the arena,
  // the budget and the use when the budget cannot hold it.
  int32_t alloc(int arena);
  void retain(int arena, int32_t id);
  void release(int arena, int32_t id);  // frees the block when its count reaches 0
  int refcount(int arena, int32_t id) const;
  uint8_t* data(int arena, int32_t id) const { return slot(arena, id).ptr; }

  // Twins: links block a (arena_a) and block b (arena_b); either one's free clears the link.
  void link_twins(int arena_a, int32_t a, int arena_b, int32_t b);
  // The twin of (arena, id) in arena `in`, or -1.
  int32_t twin(int arena, int32_t id, int in) const;

  size_t budget_bytes() const { return budget_; }
  // A smaller budget than used_bytes() is allowed: allocations fail until enough is released.
  void set_budget(size_t bytes) { budget_ = bytes; }
  size_t used_bytes() const { return used_; }
  size_t peak_bytes() const { return peak_; }
  size_t free_bytes() const { return used_ >= budget_ ? 0 : budget_ - used_; }
  int64_t blocks_in_use(int arena) const { return arenas_[size_t(arena)].in_use; }
  // True when `counts[a]` more blocks of each arena a fit in the budget.
  bool can_allocate(const std::vector<int64_t>& counts) const;
  size_t bytes_of(const std::vector<int64_t>& counts) const;
  KVDevice device() const { return device_; }
  // Device pools: makes sure counts[a] more blocks of each arena have device memory (new slabs),
  // throwing KVPoolExhausted ("out of device memory") when the device cannot hold them. Host
  // pools: nothing to do.
  void reserve(const std::vector<int64_t>& counts);
  size_t device_reserved_bytes() const { return slab_bytes_; }  // device memory held in slabs
  // Device pools: the address range that holds every block of `arena` (from its lowest slab to the
  // end of its highest; other arenas' slabs may lie inside), and the largest power of two (up to
  // 4096) that divides the distance of every block of it from `base`. {null, 0, 0}: no slab yet.
  struct Span {
    const uint8_t* base = nullptr;
    size_t bytes = 0;
    size_t align = 0;
  };
  Span device_span(int arena) const;

 private:
  struct Slot {
    uint8_t* ptr = nullptr;
    int32_t refs = 0;
    int32_t twin_arena = -1, twin_id = -1;
  };
  struct Arena {
    size_t block_bytes = 0;
    std::string name;
    std::vector<Slot> slots;
    std::vector<int32_t> free_ids;  // slots without memory, reused LIFO
    int64_t in_use = 0;
    std::vector<uint8_t*> free_dev;  // device pools: block memory ready for reuse
    size_t next_slab_blocks = 16;
  };
  Slot& slot(int arena, int32_t id);
  const Slot& slot(int arena, int32_t id) const;
  void free_block(int arena, int32_t id);

  uint8_t* take_block_memory(Arena& a);
  void grow(Arena& a, size_t min_blocks);

  std::vector<Arena> arenas_;
  size_t budget_;
  size_t used_ = 0, peak_ = 0;
  KVDevice device_;
  struct Slab;
  std::vector<std::unique_ptr<Slab>> slabs_;  // device pools
  size_t slab_bytes_ = 0;
};

}  // namespace vq
