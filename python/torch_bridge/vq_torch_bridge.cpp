// libveloxquant_torch: a C ABI over the KV store (src/kvcache) for veloxquant.torch, loaded with
// ctypes. Plain C types and raw pointers only, so that it depends on neither Python's nor
// torch's headers: one build serves every Python and every torch (a framework's tensors cross as
// their data pointers and its stream as a cudaStream_t handle; nothing is copied here).
//
// A handle holds one KVStore (cpu or cuda) for a model's attention layers and a batch of
// sequences (one per batch row). One forward of the model is one step:
//   vqt_begin(h, n_new)                 every row gets n_new[b] tokens (0: the row is idle);
//   vqt_layer(h, layer, q, k, v, out)   for layer 0 .. n_layers-1 in order: the rows' keys and
//                                       values appended, then attention of their queries;
// the last layer ends the step (forms no later query reads are released).
// A decode step under CUDA graphs (veloxquant.torch's compiled decode, which a graph replays without
// running any host code per layer) is split the other way:
//   vqt_reserve(h, max_batch, max_len)  once: the device buffers a decode step's launches read are
//                                       sized for good (KVStoreDevice::reserve_fixed);
//   vqt_begin_graph(h, n_batch, stream) every row gets one token; all the step's host work (blocks,
//                                       tables, descriptors, the fix-up) happens here, and the last
//                                       graph step is ended first (after its work on `stream`);
//   vqt_layer_graph(h, layer, ...)      launches only: no host state read or written, so that a
//                                       captured call stays right when replayed.
// Rows of q/k/v/out: the step's tokens, batch row by batch row (row b's n_new[b] tokens in
// position order), q [rows, n_heads, head_dim], k/v [rows, n_kv_heads, head_dim] f32, keys after
// RoPE; out [rows, n_heads, head_dim] f32 (or f16 on the device).
// Errors: functions return 0 (or a count) on success and -1 on failure; vqt_last_error() says why.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "codec/calibration_file.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "kvcache/kv_store.h"
#ifdef VQ_HAVE_CUDA
#include "kvcache/kv_store_device.h"
#include "ops/cuda/device.h"
#include "ops/cuda/stream_cuda.h"
#endif

#define VQT_API extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string g_error;

template <class F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_error = e.what();
  } catch (...) {
    g_error = "unknown C++ exception";
  }
  return -1;
}

struct Handle {
  std::unique_ptr<vq::KVStore> store;
  std::vector<vq::SeqKV> seqs;  // one per batch row
  int n_layers = 0;
  vq::KVGeometry geo;
  bool device = false;
  // The step in progress: rows per batch row, their first positions, and the next layer expected.
  std::vector<int> step_n;
  std::vector<int64_t> step_pos0;
  int next_layer = -1;  // -1: no step open
  bool graph_open = false;     // a vqt_begin_graph step whose layers may still be running
  int max_batch = 0;           // vqt_reserve (0: none)
  int64_t max_len = 0;
#ifdef VQ_HAVE_CUDA
  std::unique_ptr<vq::cuda::Event> into, back;  // torch's stream -> the store's stream -> torch's
  std::unique_ptr<vq::cuda::Event> done;        // the host waits for the caller's stream
  void* last_stream = nullptr;                  // the caller's stream of the last graph step
#endif
  std::string name;

  void check_seq(int b) const {
    VQ_CHECK(b >= 0 && size_t(b) < seqs.size(), "veloxquant.torch: batch row {} out of range (batch {})", b,
             seqs.size());
  }
  void end_step() {
    for (size_t b = 0; b < seqs.size(); ++b)
      if (step_n[b] > 0) store->trim(seqs[b]);
    next_layer = -1;
  }
  // Ends an open graph step: its launches (on the caller's stream, maybe replayed from a graph)
  // are waited for, then the step's forms no later query reads are released.
  void close_graph() {
    if (!graph_open) return;
#ifdef VQ_HAVE_CUDA
    if (device) {
      done->record(last_stream);
      done->synchronize();
    }
#endif
    graph_open = false;
    end_step();
  }
};

Handle* H(void* h) {
  VQ_CHECK(h != nullptr, "veloxquant.torch: null handle");
  return static_cast<Handle*>(h);
}

}  // namespace

VQT_API const char* vqt_last_error() { return g_error.c_str(); }

VQT_API int vqt_cuda_available() {
#ifdef VQ_HAVE_CUDA
  return vq::cuda::cuda_device_available() ? 1 : 0;
#else
  return 0;
#endif
}

// Why the device cannot run (an empty string when it can).
VQT_API const char* vqt_cuda_unavailable_reason() {
#ifdef VQ_HAVE_CUDA
  g_error = vq::cuda::cuda_unavailable_reason();
#else
  g_error = "this build of libveloxquant_torch has no CUDA backend (built without nvcc)";
#endif
  return g_error.c_str();
}

// spec: "fp16", "vecinfer:d4b8", ... (cpu: every method); calib: calibration file ("" for none).
// device: 0 cpu, 1 cuda. sliding: [n_layers] window per layer (0 global) or null. budget_mib 0:
// no budget. Returns null on failure.
VQT_API void* vqt_create(int n_layers, int n_heads, int n_kv_heads, int head_dim, const char* spec, const char* calib,
                         int device, int64_t budget_mib, const int* sliding) {
  std::unique_ptr<Handle> h = std::make_unique<Handle>();
  const int rc = guarded([&] {
    VQ_CHECK(n_layers >= 1, "veloxquant.torch: n_layers {} must be >= 1", n_layers);
    VQ_CHECK(spec != nullptr, "veloxquant.torch: null spec");
    h->geo = vq::KVGeometry{n_heads, n_kv_heads, head_dim};
    vq::check_geometry(h->geo, "veloxquant.torch cache");
    vq::KVCacheConfig cfg = vq::parse_kv_cache_spec(spec);
    cfg.validate(head_dim);
    vq::KVSpec s = vq::make_kv_spec(cfg, calib ? std::string(calib) : std::string());
    vq::KVStoreOptions opt;
    if (budget_mib > 0) opt.budget_bytes = size_t(budget_mib) << 20;
    if (sliding) opt.sliding_window.assign(sliding, sliding + n_layers);
    if (device == 1) {
#ifdef VQ_HAVE_CUDA
      VQ_CHECK(vq::cuda::cuda_device_available(), "veloxquant.torch: device 'cuda' asked for, but {}",
               vq::cuda::cuda_unavailable_reason());
      const std::string why = vq::kv_device_unsupported_reason(s, h->geo, vq::default_block_tokens(cfg));
      VQ_CHECK(why.empty(), "veloxquant.torch: {} cannot run on the GPU: {}", s.name(), why);
      opt.device = vq::KVDevice::cuda;
      h->into = std::make_unique<vq::cuda::Event>();
      h->back = std::make_unique<vq::cuda::Event>();
      h->done = std::make_unique<vq::cuda::Event>();
#else
      VQ_CHECK(false, "veloxquant.torch: device 'cuda' asked for, but this build has no CUDA backend");
#endif
    } else {
      VQ_CHECK(device == 0, "veloxquant.torch: device {} must be 0 (cpu) or 1 (cuda)", device);
    }
    h->store = std::make_unique<vq::KVStore>(h->geo, n_layers, s, opt);
    h->n_layers = n_layers;
    h->device = device == 1;
    h->name = s.name();
  });
  return rc == 0 ? h.release() : nullptr;
}

VQT_API void vqt_destroy(void* h) {
  if (!h) return;
  Handle* p = static_cast<Handle*>(h);
#ifdef VQ_HAVE_CUDA
  if (p->device) {
    try {
      p->close_graph();
      p->store->device().synchronize();
    } catch (...) {
    }
  }
#endif
  p->seqs.clear();
  delete p;
}

VQT_API const char* vqt_name(void* h) { return static_cast<Handle*>(h)->name.c_str(); }
VQT_API int vqt_is_device(void* h) { return static_cast<Handle*>(h)->device ? 1 : 0; }
VQT_API int vqt_batch(void* h) { return int(static_cast<Handle*>(h)->seqs.size()); }

// Tokens held by batch row b (-1 on error).
VQT_API int64_t vqt_seq_len(void* h, int b) {
  int64_t n = -1;
  guarded([&] {
    Handle* p = H(h);
    p->check_seq(b);
    n = p->seqs[size_t(b)].size();
  });
  return n;
}

// Sets the batch to n empty sequences (the old ones released).
VQT_API int vqt_reset(void* h, int n) {
  return guarded([&] {
    Handle* p = H(h);
    VQ_CHECK(n >= 0, "veloxquant.torch: batch {} must be >= 0", n);
    VQ_CHECK(p->next_layer < 0, "veloxquant.torch: reset inside a forward (layer {} expected next)", p->next_layer);
    p->close_graph();
#ifdef VQ_HAVE_CUDA
    if (p->device) p->store->device().synchronize();
#endif
    p->seqs.clear();
    for (int i = 0; i < n; ++i) p->seqs.push_back(p->store->new_sequence());
  });
}

// The batch becomes [fork of row src[i] for i < n] (beam reorder, batch selection, repeat). With
// keep > 0, each fork holds only the first `keep` tokens of its source (crop); keep -1: all.
VQT_API int vqt_select(void* h, int n, const int64_t* src, int64_t keep) {
  return guarded([&] {
    Handle* p = H(h);
    VQ_CHECK(p->next_layer < 0, "veloxquant.torch: reorder inside a forward (layer {} expected next)", p->next_layer);
    p->close_graph();
#ifdef VQ_HAVE_CUDA
    if (p->device) p->store->device().synchronize();
#endif
    std::vector<vq::SeqKV> out;
    out.reserve(size_t(n));
    for (int i = 0; i < n; ++i) {
      p->check_seq(int(src[i]));
      const vq::SeqKV& s = p->seqs[size_t(src[i])];
      VQ_CHECK(keep <= s.size(), "veloxquant.torch: crop to {} tokens, row {} holds {}", keep, src[i], s.size());
      out.push_back(p->store->fork(s, keep));
    }
    p->seqs = std::move(out);
  });
}

namespace {

// A step's host work (vqt_begin, vqt_begin_graph): blocks for every row's new tokens, and on the
// device the step's descriptors uploaded and the fix-up launched on the store's stream.
void begin_step(Handle* p, int n_batch, const int* n_new) {
  VQ_CHECK(n_batch == int(p->seqs.size()), "veloxquant.torch: a step of {} rows, the cache holds {} sequences",
           n_batch, p->seqs.size());
  VQ_CHECK(p->next_layer < 0, "veloxquant.torch: a new forward began before layer {} of the last one ran",
           p->next_layer);
  VQ_CHECK(p->max_batch == 0 || n_batch <= p->max_batch,
           "veloxquant.torch: a forward of batch {}, the cache was sized for max_batch_size {}", n_batch, p->max_batch);
  p->close_graph();
  std::vector<int> n(n_new, n_new + n_batch);
  std::vector<int64_t> pos0(static_cast<size_t>(n_batch));
  std::vector<int64_t> counts;
  for (int b = 0; b < n_batch; ++b) {
    VQ_CHECK(n[size_t(b)] >= 0, "veloxquant.torch: row {}: {} new tokens", b, n[size_t(b)]);
    pos0[size_t(b)] = p->seqs[size_t(b)].size();
    VQ_CHECK(p->max_len == 0 || pos0[size_t(b)] + n[size_t(b)] <= p->max_len,
             "veloxquant.torch: row {} would hold {} tokens, past the cache's max_cache_len {}", b,
             pos0[size_t(b)] + n[size_t(b)], p->max_len);
    if (n[size_t(b)] > 0) p->store->blocks_for_append(p->seqs[size_t(b)], n[size_t(b)], counts);
  }
  if (!p->store->pool().can_allocate(counts))
    throw vq::KVPoolExhausted("veloxquant.torch: the KV pool budget cannot hold this step");
  p->step_n = std::move(n);
  p->step_pos0 = std::move(pos0);
#ifdef VQ_HAVE_CUDA
  if (p->device) {
    vq::KVStoreDevice& dev = p->store->device();
    dev.synchronize();  // the descriptors of the last step are no longer read
    p->store->pool().reserve(counts);
    dev.begin_step();
    try {
      for (int b = 0; b < n_batch; ++b)
        if (p->step_n[size_t(b)] > 0)
          for (int l = 0; l < p->n_layers; ++l) p->store->append_blocks(p->seqs[size_t(b)], l, p->step_n[size_t(b)]);
      for (int b = 0; b < n_batch; ++b)
        if (p->step_n[size_t(b)] > 0) dev.add_rows(p->seqs[size_t(b)], p->step_pos0[size_t(b)], p->step_n[size_t(b)]);
    } catch (...) {
      dev.finish_step();
      throw;
    }
    dev.finish_step();
    dev.launch_fixup();
  }
#endif
}

// The cpu attention of one layer over the open step's rows (vqt_layer, vqt_layer_graph).
void layer_cpu(Handle* p, int layer, const float* q, const float* k, const float* v, float* out, float scale) {
  const int HD = p->geo.n_kv_heads * p->geo.head_dim, QD = p->geo.n_heads * p->geo.head_dim;
  std::vector<vq::AttnEntry> ents;
  int64_t row = 0;
  for (size_t b = 0; b < p->seqs.size(); ++b) {
    const int n = p->step_n[b];
    if (n == 0) continue;
    p->store->append(p->seqs[b], layer, k + row * HD, v + row * HD, n);
    vq::AttnEntry e;
    e.seq = &p->seqs[b];
    e.pos0 = p->step_pos0[b];
    e.n_q = n;
    e.q = q + row * QD;
    e.out = out + row * QD;
    ents.push_back(e);
    row += n;
  }
  p->store->attend(layer, ents.data(), int(ents.size()), scale);
}

#ifdef VQ_HAVE_CUDA
// One layer's launches on the store's stream, ordered after and before the caller's `stream`.
void layer_device(Handle* p, int layer, const float* q, const float* k, const float* v, void* out, int out_f16,
                  float scale, void* stream) {
  const int HD = p->geo.n_kv_heads * p->geo.head_dim, QD = p->geo.n_heads * p->geo.head_dim;
  vq::KVStoreDevice& dev = p->store->device();
  void* st = dev.stream();
  p->into->record(stream);
  p->into->wait(st);
  dev.launch_append(layer, k, HD, v, HD);
  dev.launch_encode(layer);
  dev.launch_attend(layer, q, QD, scale, out_f16 ? vq::cuda::ElemType::f16 : vq::cuda::ElemType::f32, out, QD);
  p->back->record(st);
  p->back->wait(stream);
}
#endif

}  // namespace

// Opens a step: row b gets n_new[b] tokens (n_batch must equal the batch size).
VQT_API int vqt_begin(void* h, int n_batch, const int* n_new) {
  return guarded([&] {
    Handle* p = H(h);
    begin_step(p, n_batch, n_new);
    p->next_layer = 0;
  });
}

// Sizes the cache for decode steps under CUDA graphs: at most max_batch sequences of at most max_len
// tokens each (later steps past max_len are refused, naming it). Once, before the first step.
VQT_API int vqt_reserve(void* h, int max_batch, int64_t max_len) {
  return guarded([&] {
    Handle* p = H(h);
    VQ_CHECK(p->max_len == 0, "veloxquant.torch: the cache's sizes were set already");
    VQ_CHECK(p->next_layer < 0 && !p->graph_open, "veloxquant.torch: vqt_reserve inside a forward");
    VQ_CHECK(max_batch >= 1 && max_batch <= 65535, "veloxquant.torch: max_batch_size {} must be in 1..65535",
             max_batch);
    VQ_CHECK(max_len >= 1 && max_len < int64_t(INT32_MAX), "veloxquant.torch: max_cache_len {} must be in 1..{}",
             max_len, INT32_MAX - 1);
    for (size_t b = 0; b < p->seqs.size(); ++b)
      VQ_CHECK(p->seqs[b].size() <= max_len, "veloxquant.torch: row {} holds {} tokens, past max_cache_len {}", b,
               p->seqs[b].size(), max_len);
#ifdef VQ_HAVE_CUDA
    if (p->device) p->store->device().reserve_fixed(max_batch, max_len - 1);
#endif
    p->max_batch = max_batch;
    p->max_len = max_len;
  });
}

// Opens a decode step for CUDA graphs: every row gets one token. stream: the caller's cudaStream_t,
// on which the step's vqt_layer_graph launches run (after the fix-up launched here).
VQT_API int vqt_begin_graph(void* h, int n_batch, void* stream) {
  return guarded([&] {
    Handle* p = H(h);
    VQ_CHECK(p->max_len > 0, "veloxquant.torch: a graph step needs the cache's sizes (vqt_reserve first)");
    const std::vector<int> ones(size_t(std::max(n_batch, 0)), 1);
    begin_step(p, n_batch, ones.data());
#ifdef VQ_HAVE_CUDA
    if (p->device) {
      vq::KVStoreDevice& dev = p->store->device();
      if (!dev.step_in_fixed_slot()) {
        p->end_step();
        VQ_FAIL("veloxquant.torch: this decode step needs more than the buffers sized for max_batch_size {} (internal "
                "error)", p->max_batch);
      }
      p->back->record(dev.stream());  // the layers' launches after the fix-up
      p->back->wait(stream);
      p->last_stream = stream;
    }
#endif
    (void)stream;
    p->graph_open = true;
  });
}

// One layer of the open graph step: launches only (device), or the cpu store's append and
// attention. q, k, v, out, out_f16, scale, stream: as vqt_layer.
VQT_API int vqt_layer_graph(void* h, int layer, const float* q, const float* k, const float* v, void* out,
                            int out_f16, float scale, void* stream) {
  return guarded([&] {
    Handle* p = H(h);
    VQ_CHECK(p->graph_open, "veloxquant.torch: layer {} outside a graph step (vqt_begin_graph first)", layer);
    VQ_CHECK(layer >= 0 && layer < p->n_layers, "veloxquant.torch: layer {} of {}", layer, p->n_layers);
#ifdef VQ_HAVE_CUDA
    if (p->device) {
      layer_device(p, layer, q, k, v, out, out_f16, scale, stream);
      return;
    }
#endif
    VQ_CHECK(!out_f16, "veloxquant.torch: f16 output is a device feature (cpu attention writes f32)");
    (void)stream;
    layer_cpu(p, layer, q, k, v, static_cast<float*>(out), scale);
  });
}

// One layer of the open step. q, k, v: row-major f32 (see the header); out: f32, or f16 when
// out_f16 (device only). stream: the caller's cudaStream_t (device; null: the legacy stream),
// ignored on the cpu. scale: score = scale * q.k.
VQT_API int vqt_layer(void* h, int layer, const float* q, const float* k, const float* v, void* out, int out_f16,
                      float scale, void* stream) {
  return guarded([&] {
    Handle* p = H(h);
    VQ_CHECK(p->next_layer >= 0, "veloxquant.torch: layer {} outside a forward (vqt_begin first)", layer);
    VQ_CHECK(layer == p->next_layer, "veloxquant.torch: layer {} ran, layer {} was expected next", layer,
             p->next_layer);
#ifdef VQ_HAVE_CUDA
    if (p->device) {
      layer_device(p, layer, q, k, v, out, out_f16, scale, stream);
    } else
#endif
    {
      VQ_CHECK(!out_f16, "veloxquant.torch: f16 output is a device feature (cpu attention writes f32)");
      (void)stream;
      layer_cpu(p, layer, q, k, v, static_cast<float*>(out), scale);
    }
    p->next_layer = layer + 1;
    if (p->next_layer == p->n_layers) p->end_step();
  });
}

// Abandons an open step (an exception in the model between layers): the tokens some layers took
// stay in those layers; the next vqt_reset / vqt_select clears the state.
VQT_API void vqt_abort_step(void* h) {
  if (h) static_cast<Handle*>(h)->next_layer = -1;
}

// Memory (bytes): what = 0 token bytes (payload of every row's tokens), 1 allocated (blocks
// referenced by the rows), 2 fp16 equivalent, 3 pool used, 4 codebooks.
VQT_API int64_t vqt_memory(void* h, int what) {
  int64_t r = -1;
  guarded([&] {
    Handle* p = H(h);
    int64_t s = 0;
    for (const auto& q : p->seqs) {
      if (what == 0) s += int64_t(p->store->token_bytes(q));
      if (what == 1) s += int64_t(p->store->allocated_bytes(q));
      if (what == 2) s += int64_t(p->store->fp16_bytes(q));
    }
    if (what == 3) s = int64_t(p->store->pool().used_bytes());
    if (what == 4) s = int64_t(p->store->codebook_bytes());
    VQ_CHECK(what >= 0 && what <= 4, "veloxquant.torch: memory kind {} must be 0..4", what);
    r = s;
  });
  return r;
}

// Trains a VecInfer calibration from recorded keys/values and writes it (the CLI's file format).
// k[l], v[l]: [n_tokens, n_kv_heads, head_dim] f32; query_energy: null, or [n_layers] arrays of
// [n_kv_heads * head_dim] doubles (the mean square of each query channel per KV head: the
// query-aware smoothing of `veloxquant calibrate`); query_moment: null, or [n_layers] arrays of
// [n_kv_heads, head_dim, head_dim] doubles (the queries' second moment per KV head: the learned key
// transform's input). key_transform: 0 Walsh-Hadamard, 1 learned (needs query_moment), -1 auto (as
// `veloxquant calibrate`: learned for per-sub-space books from enough tokens, when query_moment is
// given). segment_tokens: the recorded tokens are independent sequences of this many tokens (their
// first skip_tokens are left out), token t at position t % segment_tokens. key_mean_tokens > 0: the
// rotated key mean (the CLI's `--key-mean rotated`, segments of that many tokens) is fitted on the
// keys and removed before training; rope_freqs: [n_layers, n_rot / 2] doubles, each layer's rotary
// inverse frequencies, rope_neox: 1 when rotary pairs are (i, i + n_rot / 2), 0 when (2i, 2i + 1).
VQT_API int vqt_train_calibration(const char* spec, int n_layers, int n_kv_heads, int head_dim, const float* const* k,
                                  const float* const* v, int64_t n_tokens, int segment_tokens, int skip_tokens,
                                  const double* const* query_energy, const double* const* query_moment,
                                  int key_transform, int key_mean_tokens, const double* rope_freqs, int n_rot,
                                  int rope_neox, const char* model_name, const char* path) {
  return guarded([&] {
    vq::KVCacheConfig cfg = vq::parse_kv_cache_spec(spec);
    VQ_CHECK(cfg.method == vq::KVMethod::vecinfer, "calibrate: {} needs no calibration (vecinfer specs only)",
             cfg.name());
    cfg.validate(head_dim);
    vq::CalibTrainOptions opt;
    opt.segment_tokens = segment_tokens;
    opt.skip_tokens = skip_tokens;
    if (query_energy) {
      opt.query_energy.resize(size_t(n_layers));
      for (int l = 0; l < n_layers; ++l)
        opt.query_energy[size_t(l)].assign(query_energy[l], query_energy[l] + size_t(n_kv_heads) * head_dim);
    }
    VQ_CHECK(key_transform >= -1 && key_transform <= 1, "calibrate: key transform {} must be -1 (auto), 0 or 1",
             key_transform);
    VQ_CHECK(key_transform != 1 || query_moment, "calibrate: the learned key transform needs the queries' second moment");
    const bool learned = key_transform == 1 || (key_transform == -1 && query_moment &&
                                                vq::default_key_transform(cfg, n_tokens, head_dim) ==
                                                    vq::KeyTransform::learned);
    if (learned) {
      opt.key_transform = vq::KeyTransform::learned;
      opt.query_moment.resize(size_t(n_layers));
      const size_t n = size_t(n_kv_heads) * head_dim * head_dim;
      for (int l = 0; l < n_layers; ++l) opt.query_moment[size_t(l)].assign(query_moment[l], query_moment[l] + n);
    }
    std::vector<const float*> kk(k, k + n_layers), vv(v, v + n_layers);
    vq::KeyMeanFitSpec km;
    std::vector<int64_t> pos;
    std::vector<bool> use;
    if (key_mean_tokens > 0) {
      VQ_CHECK(rope_freqs && n_rot >= 2 && n_rot <= head_dim && n_rot % 2 == 0,
               "calibrate: the rotated key mean needs the rotary frequencies (n_rot {} of head_dim {})", n_rot,
               head_dim);
      const int seg = segment_tokens > 0 ? segment_tokens : int(std::min<int64_t>(n_tokens, INT32_MAX));
      pos.resize(static_cast<size_t>(n_tokens));
      use.resize(static_cast<size_t>(n_tokens));
      for (int64_t t = 0; t < n_tokens; ++t) {
        pos[size_t(t)] = t % seg;
        use[size_t(t)] = pos[size_t(t)] >= skip_tokens;
      }
      for (int l = 0; l < n_layers; ++l) {
        const double* f = rope_freqs + size_t(l) * size_t(n_rot / 2);
        for (int i = 0; i < n_rot / 2; ++i)
          VQ_CHECK(std::isfinite(f[i]) && f[i] > 0, "calibrate: layer {} rotary frequency {} = {} must be > 0", l, i,
                   f[i]);
        km.freqs.emplace_back(f, f + n_rot / 2);
      }
      km.T = key_mean_tokens, km.pos = pos.data(), km.use = &use, km.n_rot = n_rot, km.neox = rope_neox != 0;
    }
    const vq::Calibration c = vq::train_calibration_with_key_mean(cfg, n_kv_heads, head_dim, kk, vv, n_tokens, opt,
                                                                  model_name ? model_name : "", km);
    vq::save_calibration(path, c);
  });
}

// A calibration with random codebooks (speed work at a model's shape with random weights).
VQT_API int vqt_random_calibration(const char* spec, int n_layers, int n_kv_heads, int head_dim, uint64_t seed,
                                   const char* path) {
  return guarded([&] {
    vq::KVCacheConfig cfg = vq::parse_kv_cache_spec(spec);
    cfg.validate(head_dim);
    vq::save_calibration(path, vq::random_calibration(cfg, n_layers, n_kv_heads, head_dim, seed));
  });
}
