#pragma once
// KVStoreDevice: the GPU side of a KVStore whose pool lives in device memory
// (KVStoreOptions::device = KVDevice::cuda). The store keeps all bookkeeping (block tables, the
// window rule, refcounts, forks, twins, trims, the budget); this class mirrors each sequence's
// block tables on the device and runs the data paths as kernels (ops/cuda/kv_blocks_cuda.h,
// ops/cuda/paged_attention_cuda.h):
//   append: rows of K/V written into the fp16 blocks (channel-major keys, as on the CPU),
//   encode: fp16 blocks leaving the window encoded into VecInfer blocks by the fused encoder,
//   attend: a paged kernel that reads every row's blocks through its block table.
// Methods: those whose registry entry has a device format (KVMethodDef::has_device_format): fp16,
// vecinfer (any preset with sub_dim 4, 8 or 16 dividing head_dim / 8) and the direct scalar-block
// methods (q8_0, q4_0, q4_0h, q5_0: KVMethodDef::device_scalar; each row coded into its slot on
// append, the attention kernels dequantize), head_dim 64, 128 or 256; the constructor refuses the
// others quoting the registry's reason.
//
// One step (the forward's, or one of the host-data helpers below):
//   begin_step(); the store's append_blocks() for every (sequence, layer) that grows;
//   add_rows() for every sequence's rows (new tokens or queries, in row order);
//   finish_step() builds the step's descriptors (positions, per-layer table pointers, encode jobs,
//   table updates, copy-on-write copies) in pinned memory and copies them to the device in one
//   transfer; then launch_fixup / launch_append / launch_encode / launch_attend per layer.
// The descriptors live at fixed device addresses until layout_version() changes, so a step's
// launches can be captured in a CUDA graph and replayed with new descriptors.
// Steps are synchronous with the host (the caller synchronises the stream at the end of a
// step), so released blocks are never read by work still in flight.
// No CUDA types here; all device pointers are plain pointers.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kvcache/kv_store.h"
#include "ops/cuda/elem_type.h"

namespace vq {

class KVStoreDevice {
 public:
  explicit KVStoreDevice(KVStore& store);
  ~KVStoreDevice();
  KVStoreDevice(const KVStoreDevice&) = delete;
  KVStoreDevice& operator=(const KVStoreDevice&) = delete;

  void* stream() const;  // the store's cudaStream_t: the forward runs on it too
  void synchronize() const;

  // ---- a step ----
  void begin_step();
  // Rows [first, first + n) of the step: queries / new tokens of s at positions pos0 .. pos0 + n - 1.
  int add_rows(const SeqKV& s, int64_t pos0, int n);
  // Builds and uploads the descriptors; true when their device addresses moved (re-capture graphs).
  bool finish_step();
  int rows() const;
  // Whether add_rows gives a chunk of n rows to the prefill kernel (its rows skip the decode
  // kernels). Steps whose other rows come first launch the decode kernels over those only.
  bool tiles_rows(int n) const;
  // Batch-invariant attention (ForwardDevice::set_deterministic): the split counts of the decode
  // kernels are those of a step of kDetNominalRows decode rows and the prefill kernel takes one
  // key split, whatever the step holds, so a row's result depends on its own sequence only.
  void set_deterministic(bool on);
  // Coded layers' prefill with the past decoded once per step into a scratch of at most `bytes`
  // (cuda::PrefillScratch; default GpuTuning::prefill_scratch_mib MiB, 0: every tile decodes; a
  // step needing more decodes per tile too). Same results either way. Between steps.
  void set_prefill_scratch_bytes(size_t bytes);
  // Whether the store's layers can take it (coded layers, 8-bit codes: cuda::prefill_scratch_supported).
  bool prefill_scratch_possible() const;
  // Whether the step has table updates, copies or encode jobs (a graph without them is cheaper).
  bool step_has_fixups() const;
  bool step_has_encodes() const;
  uint64_t layout_version() const;
  // For a caller that captures the launches of its decode steps once and cannot re-capture on a
  // layout_version change (veloxquant.torch under torch.compile's CUDA graphs): sizes the
  // descriptors and the step buffers (query codes, attention workspace, key-mean terms and tables)
  // for decode steps of up to `rows` rows (one per sequence) at positions up to max_pos, once. From
  // then on every step that fits those sizes runs on exactly those addresses (step_in_fixed_slot);
  // a larger step (a prefill) runs on a second set, which grows as before, and never moves the
  // first. With a rotated key mean, positions past max_pos are refused (the tables would move).
  void reserve_fixed(int rows, int64_t max_pos);
  bool step_in_fixed_slot() const;
  // Whether the step's coded prefill tiles read the past decoded once (GpuTuning::prefill_scratch_mib).
  bool step_prefill_scratch() const;
  const int32_t* positions() const;  // [rows] device

  void launch_fixup();
  // k, v: row r at k + r*k_stride (device, f32, after RoPE)
  void launch_append(int layer, const float* k, int64_t k_stride, const float* v, int64_t v_stride);
  void launch_encode(int layer);
  // q: row r at q + r*q_stride (device, f32 after RoPE); out: row r at out + r*out_stride (f32 or f16)
  void launch_attend(int layer, const float* q, int64_t q_stride, float scale, cuda::ElemType out_type, void* out,
                     int64_t out_stride);

  // ---- host/device-data helpers (each one synchronous device step) ----
  // Appends n rows to one layer: k, v [n, n_kv_heads, head_dim] f32 in host memory / on the device.
  void append_host(SeqKV& s, int layer, const float* k, const float* v, int n);
  void append_device(SeqKV& s, int layer, const float* k, const float* v, int n);
  // KVStore::attend's contract with host q / out.
  void attend_host(int layer, const AttnEntry* entries, int n_entries, float scale);
  // Test hook: a copy of a block's bytes (arena and id as in KVStore::arena_of / block_id).
  void download_block(int arena, int32_t id, void* dst) const;
  // Copies between device and host memory on the store's stream, waited for at the end
  // (KVStore::read_blocks / write_blocks: session files, the prefix store).
  struct HostCopy {
    const void* src;
    void* dst;
    size_t bytes;
  };
  void copy_to_host(const std::vector<HostCopy>& copies) const;
  void copy_to_device(const std::vector<HostCopy>& copies);

  // ---- bookkeeping hooks (KVStore) ----
  void note_block(const SeqKV& s, int layer, bool coded, size_t j);
  void note_copy(const uint8_t* src, uint8_t* dst, size_t bytes);
  // pos0: the position of the block's first token (the rotated key mean's segments).
  void note_encode(int layer, const uint8_t* dense, uint8_t* coded, int64_t pos0);
  void release_table(SeqKV& s);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// Why a KV method cannot run on the device ("" when it can). Never throws.
std::string kv_device_unsupported_reason(const KVSpec& spec, const KVGeometry& g, int block_tokens);

}  // namespace vq
