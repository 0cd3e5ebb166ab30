#include "kvcache/kv_identity.h"

#include <xxhash.h>

#include <vector>

#include "codec/calibration_file.h"
#include "core/mmap_file.h"
#include "kvcache/kv_store.h"

namespace vq {
namespace {

// Feeds values into one XXH64 state; each value is hashed with its size, so no two sequences
// of fields collide by shifting bytes between them.
class Hasher {
 public:
  Hasher() : st_(XXH64_createState()) { XXH64_reset(st_, 0); }
  ~Hasher() { XXH64_freeState(st_); }
  Hasher(const Hasher&) = delete;
  Hasher& operator=(const Hasher&) = delete;
  void bytes(const void* p, size_t n) {
    const uint64_t len = n;
    XXH64_update(st_, &len, sizeof(len));
    XXH64_update(st_, p, n);
  }
  void i64(int64_t v) { bytes(&v, sizeof(v)); }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  void floats(const std::vector<float>& v) { bytes(v.data(), v.size() * sizeof(float)); }
  uint64_t digest() const { return XXH64_digest(st_); }

 private:
  XXH64_state_t* st_;
};

}  // namespace

uint64_t KVIdentity::combined() const {
  const uint64_t v[3] = {model, spec, calibration};
  return XXH64(v, sizeof(v), 0x5651);
}

uint64_t file_checksum(const std::string& path) {
  MappedFile f(path);
  return XXH64(f.data(), f.size(), 0);
}

uint64_t spec_checksum(const KVStore& kv) {
  const KVCacheConfig& c = kv.spec().config;
  Hasher h;
  h.str("vq-kv-spec-1");
  h.i64(int64_t(c.method));
  h.i64(c.key.sub_dim), h.i64(c.key.bits), h.i64(c.value.sub_dim), h.i64(c.value.bits);
  h.i64(int64_t(c.granularity));
  h.i64(c.residual_length), h.i64(c.sink_tokens), h.i64(c.kivi_bits), h.i64(c.kivi_group);
  h.i64(kv.block_tokens());
  h.i64(kv.geometry().n_heads), h.i64(kv.geometry().n_kv_heads), h.i64(kv.geometry().head_dim);
  h.i64(kv.n_layers());
  for (int l = 0; l < kv.n_layers(); ++l) h.i64(kv.sliding_window(l));
  return h.digest();
}

uint64_t calibration_checksum(const Calibration* c) {
  if (!c) return 0;
  Hasher h;
  h.str("vq-calib-1");
  h.i64(c->n_layers), h.i64(c->n_kv_heads), h.i64(c->head_dim);
  h.i64(c->key.sub_dim), h.i64(c->key.bits), h.i64(c->value.sub_dim), h.i64(c->value.bits);
  h.i64(int64_t(c->granularity));
  for (const CalibrationLayer& L : c->layers) {
    h.floats(L.smoothing);
    h.floats(L.key_codebooks);
    h.floats(L.value_codebooks);
    // Hashed only when present, so that the digests of calibrations without them are unchanged.
    if (!L.key_mean.empty()) h.floats(L.key_mean);
    if (!L.key_map.empty()) h.floats(L.key_map);
  }
  return h.digest();
}

KVIdentity kv_identity(const KVStore& kv, const std::string& model_path) {
  KVIdentity id;
  id.model = file_checksum(model_path);
  id.spec = spec_checksum(kv);
  id.calibration = calibration_checksum(kv.spec().calibration.get());
  const size_t slash = model_path.find_last_of('/');
  id.model_name = slash == std::string::npos ? model_path : model_path.substr(slash + 1);
  id.spec_name = kv.name();
  return id;
}

KVIdentity kv_identity_like(const KVIdentity& base, const KVStore& kv) {
  KVIdentity id = base;
  id.spec = spec_checksum(kv);
  id.calibration = calibration_checksum(kv.spec().calibration.get());
  id.spec_name = kv.name();
  return id;
}

}  // namespace vq
