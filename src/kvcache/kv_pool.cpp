#include "kvcache/kv_pool.h"

#include <algorithm>
#include <cstdlib>
#include <new>

#ifdef VQ_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace vq {

const char* kv_device_name(KVDevice d) { return d == KVDevice::cuda ? "cuda" : "cpu"; }

#ifdef VQ_HAVE_CUDA
struct KVPool::Slab {
  cuda::DeviceBuffer mem;
  int arena = -1;
  size_t stride = 0;  // bytes between its blocks
};
#else
struct KVPool::Slab {};
#endif

KVPool::KVPool(size_t budget_bytes, KVDevice device) : budget_(budget_bytes), device_(device) {
#ifndef VQ_HAVE_CUDA
  VQ_CHECK(device == KVDevice::cpu, "kv pool: device cuda but this build has no CUDA backend");
#else
  if (device == KVDevice::cuda)
    VQ_CHECK(cuda::cuda_device_available(), "kv pool: device cuda but {}", cuda::cuda_unavailable_reason());
#endif
}

KVPool::~KVPool() {
  if (device_ == KVDevice::cpu)
    for (auto& a : arenas_)
      for (auto& s : a.slots) std::free(s.ptr);
}

// Device slabs: blocks are 256-byte aligned inside a slab (cudaMalloc gives 256).
[[maybe_unused]] static size_t dev_block_stride(size_t block_bytes) { return (block_bytes + 255) / 256 * 256; }

void KVPool::grow(Arena& a, size_t min_blocks) {
#ifdef VQ_HAVE_CUDA
  const size_t stride = dev_block_stride(a.block_bytes);
  size_t n = std::max(min_blocks, a.next_slab_blocks);
  const size_t cap = std::max<size_t>(1, (size_t(64) << 20) / stride);
  a.next_slab_blocks = std::min(cap, a.next_slab_blocks * 2);
  auto slab = std::make_unique<Slab>();
  try {
    slab->mem = cuda::DeviceBuffer(n * stride);
  } catch (const Error& e) {
    throw KVPoolExhausted(fmt::format("kv pool: out of device memory: {} more '{}' blocks ({:.1f} MiB) cannot be "
                                      "allocated ({:.1f} MiB held in slabs): {}",
                                      n, a.name, double(n * stride) / 1048576.0, double(slab_bytes_) / 1048576.0,
                                      e.what()));
  }
  slab->arena = int(&a - arenas_.data());
  slab->stride = stride;
  auto* base = slab->mem.as<uint8_t>();
  for (size_t i = n; i-- > 0;) a.free_dev.push_back(base + i * stride);
  slab_bytes_ += n * stride;
  slabs_.push_back(std::move(slab));
#else
  (void)a;
  (void)min_blocks;
  VQ_FAIL("kv pool: no CUDA backend");
#endif
}

KVPool::Span KVPool::device_span(int arena) const {
  Span sp;
#ifdef VQ_HAVE_CUDA
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (const auto& s : slabs_)
    if (s->arena == arena) {
      const auto b = reinterpret_cast<uintptr_t>(s->mem.data());
      lo = std::min(lo, b), hi = std::max(hi, b + s->mem.size());
    }
  if (hi == 0) return sp;
  size_t g = 4096;  // the largest power of two dividing every slab's offset and block stride
  for (const auto& s : slabs_)
    if (s->arena == arena)
      while (g > 1 && ((reinterpret_cast<uintptr_t>(s->mem.data()) - lo) % g || s->stride % g)) g /= 2;
  sp.base = reinterpret_cast<const uint8_t*>(lo);
  sp.bytes = hi - lo;
  sp.align = g;
#else
  (void)arena;
#endif
  return sp;
}

uint8_t* KVPool::take_block_memory(Arena& a) {
  if (device_ == KVDevice::cpu) {
    const size_t bytes = (a.block_bytes + 63) / 64 * 64;
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
    if (!p) throw std::bad_alloc();
    return p;
  }
  if (a.free_dev.empty()) grow(a, 1);
  uint8_t* p = a.free_dev.back();
  a.free_dev.pop_back();
  return p;
}

void KVPool::reserve(const std::vector<int64_t>& counts) {
  if (device_ == KVDevice::cpu) return;
  for (size_t i = 0; i < counts.size() && i < arenas_.size(); ++i) {
    Arena& a = arenas_[i];
    if (counts[i] > int64_t(a.free_dev.size())) grow(a, size_t(counts[i]) - a.free_dev.size());
  }
}

int KVPool::add_arena(size_t block_bytes, std::string name) {
  VQ_CHECK(block_bytes > 0, "kv pool: arena '{}' with blocks of 0 bytes", name);
  Arena a;
  a.block_bytes = block_bytes;
  a.name = std::move(name);
  arenas_.push_back(std::move(a));
  return int(arenas_.size()) - 1;
}

KVPool::Slot& KVPool::slot(int arena, int32_t id) {
  VQ_CHECK(arena >= 0 && arena < n_arenas(), "kv pool: no arena {}", arena);
  Arena& a = arenas_[size_t(arena)];
  VQ_CHECK(id >= 0 && size_t(id) < a.slots.size() && a.slots[size_t(id)].refs > 0,
           "kv pool: block {} of arena '{}' is not allocated", id, a.name);
  return a.slots[size_t(id)];
}
const KVPool::Slot& KVPool::slot(int arena, int32_t id) const { return const_cast<KVPool*>(this)->slot(arena, id); }

int32_t KVPool::alloc(int arena) {
  VQ_CHECK(arena >= 0 && arena < n_arenas(), "kv pool: no arena {}", arena);
  Arena& a = arenas_[size_t(arena)];
  if (used_ + a.block_bytes > budget_) {
    throw KVPoolExhausted(fmt::format("kv pool: budget of {:.1f} MiB exhausted ({:.1f} MiB in use; a '{}' block needs {} bytes)",
                                      double(budget_) / 1048576.0, double(used_) / 1048576.0, a.name, a.block_bytes));
  }
  uint8_t* p = take_block_memory(a);
  int32_t id;
  if (!a.free_ids.empty()) {
    id = a.free_ids.back();
    a.free_ids.pop_back();
  } else {
    id = int32_t(a.slots.size());
    a.slots.emplace_back();
  }
  Slot& s = a.slots[size_t(id)];
  s.ptr = p;
  s.refs = 1;
  s.twin_arena = s.twin_id = -1;
  ++a.in_use;
  used_ += a.block_bytes;
  peak_ = std::max(peak_, used_);
  return id;
}

void KVPool::retain(int arena, int32_t id) { ++slot(arena, id).refs; }

void KVPool::release(int arena, int32_t id) {
  Slot& s = slot(arena, id);
  if (--s.refs == 0) free_block(arena, id);
}

int KVPool::refcount(int arena, int32_t id) const { return slot(arena, id).refs; }

void KVPool::free_block(int arena, int32_t id) {
  Arena& a = arenas_[size_t(arena)];
  Slot& s = a.slots[size_t(id)];
  if (s.twin_arena >= 0) {
    Slot& t = arenas_[size_t(s.twin_arena)].slots[size_t(s.twin_id)];
    t.twin_arena = t.twin_id = -1;
  }
  if (device_ == KVDevice::cpu) std::free(s.ptr);
  else a.free_dev.push_back(s.ptr);
  s = Slot{};
  a.free_ids.push_back(id);
  --a.in_use;
  used_ -= a.block_bytes;
}

void KVPool::link_twins(int arena_a, int32_t a, int arena_b, int32_t b) {
  Slot& sa = slot(arena_a, a);
  Slot& sb = slot(arena_b, b);
  VQ_CHECK(sa.twin_arena < 0 && sb.twin_arena < 0, "kv pool: block {} or {} already has a twin", a, b);
  sa.twin_arena = arena_b;
  sa.twin_id = b;
  sb.twin_arena = arena_a;
  sb.twin_id = a;
}

int32_t KVPool::twin(int arena, int32_t id, int in) const {
  const Slot& s = slot(arena, id);
  return s.twin_arena == in ? s.twin_id : -1;
}

size_t KVPool::bytes_of(const std::vector<int64_t>& counts) const {
  size_t b = 0;
  for (size_t a = 0; a < counts.size() && a < arenas_.size(); ++a) b += size_t(std::max<int64_t>(0, counts[a])) * arenas_[a].block_bytes;
  return b;
}

bool KVPool::can_allocate(const std::vector<int64_t>& counts) const { return used_ + bytes_of(counts) <= budget_; }

}  // namespace vq
