// VecInfer: keys smoothed + Walsh-Hadamard-rotated then product-quantized, values
// product-quantized, codebooks from a calibration (methods/vecinfer_format.cpp holds the CPU
// format; the device kernels are ops/cuda/pq_*). Spec: vecinfer[:dDbB | :k=dDbB,v=dDbB][,r=N]
// [,sink=N][,gran=shared|per_subspace]; vecinfer alone = vecinfer:d4b8.
#include <fmt/format.h>

#include <algorithm>

#include "codec/key_transform.h"
#include "core/error.h"
#include "kvcache/kv_format.h"
#include "kvcache/kv_method.h"

namespace vq {

std::unique_ptr<CodedFormat> make_vecinfer_format(const KVCacheConfig& cfg, const Calibration* calib, int layer,
                                                  const KVGeometry& g, int block_tokens);  // vecinfer_format.cpp

namespace {

// Exactly what the product quantizer (codec/product_quantizer.h) accepts, so that a spec the
// parser takes never fails later, after the model has loaded.
void check_preset(const PQPreset& p, const char* field, int head_dim_model) {
  VQ_CHECK(p.sub_dim == 2 || p.sub_dim == 4 || p.sub_dim == 8 || p.sub_dim == 16,
           "kv_cache.{}.sub_dim: {} must be 2, 4, 8 or 16", field, p.sub_dim);
  VQ_CHECK(p.bits >= 4 && p.bits <= 12, "kv_cache.{}.bits: {} must be in 4..12", field, p.bits);
  if (head_dim_model > 0)
    VQ_CHECK(head_dim_model % p.sub_dim == 0, "kv_cache.{}.sub_dim: {} does not divide the model's head_dim {}",
             field, p.sub_dim, head_dim_model);
}

bool has(const std::vector<std::string>& v, const char* x) { return std::find(v.begin(), v.end(), x) != v.end(); }

class VecInferMethod final : public KVMethodDef {
 public:
  KVMethod id() const override { return KVMethod::vecinfer; }
  std::string name() const override { return "vecinfer"; }
  std::vector<KVSpecOption> options(const std::string&) const override {
    return {{"", {}}, {"k", {}}, {"v", {}}, {"r", {"residual"}}, {"sink", {"sinks"}}, {"gran", {"granularity"}}};
  }
  std::vector<std::string> slots(const std::string& key) const override {
    return key.empty() ? std::vector<std::string>{"k", "v"} : std::vector<std::string>{key};
  }
  std::string slot_label(const std::string& slot) const override {
    return slot == "k" ? "the key preset" : slot == "v" ? "the value preset" : "option '" + slot + "'";
  }
  void set_option(const std::string& key, const std::string& val, KVCacheConfig& c,
                  const std::string& spec) const override {
    if (key.empty()) c.key = c.value = parse_spec_preset(val, spec);
    else if (key == "k") c.key = parse_spec_preset(val, spec);
    else if (key == "v") c.value = parse_spec_preset(val, spec);
    else if (key == "sink") c.sink_tokens = parse_spec_int(val, spec, "sink tokens");
    else if (key == "r") c.residual_length = parse_spec_int(val, spec, "residual length");
    else if (key == "gran") {
      if (val == "shared") c.granularity = CodebookGranularity::shared;
      else if (val == "per_subspace" || val == "subspace") c.granularity = CodebookGranularity::per_subspace;
      else VQ_FAIL("kv cache spec '{}': granularity '{}' must be shared or per_subspace", spec, val);
    }
  }
  // k= alone (or v= alone) would leave the other preset at the default without a word.
  void check_options(const std::vector<std::string>& seen, const std::string& spec) const override {
    VQ_CHECK(has(seen, "k") == has(seen, "v"), "kv cache spec '{}': {}= given without {}= (give both, k=dDbB,v=dDbB, "
             "or one preset dDbB for keys and values alike)", spec, has(seen, "k") ? "k" : "v", has(seen, "k") ? "v" : "k");
  }
  std::string help() const override {
    return "  vecinfer:dDbB        VecInfer product quantization, keys and values alike (vecinfer alone = vecinfer:d4b8)\n"
           "  vecinfer:k=dDbB,v=dDbB   separate key and value presets; D (sub_dim) 2, 4, 8 or 16 dividing\n"
           "                       head_dim, B (bits) 4..12, e.g. d4b8 = 2 bits/element; k=d4b10,v=d8b12 is 2 bits/element\n"
           "                       too (keys 2.5, values 1.5): lower KL than d4b8 on the models measured, 10x its\n"
           "                       codebook memory, slower on the CPU (docs/QUALITY.md); options:\n"
           "                         r=N     recent tokens kept in fp16, 0..1048576 (default 128)\n"
           "                         sink=N  first tokens kept in fp16, 0..4096 (default 4)\n"
           "                         gran=shared|per_subspace  codebook per head or per sub-space (default per_subspace)\n"
           "                         needs a calibration file made with the same presets and gran (--calib)\n";
  }
  // k=d4b10,v=d8b12: 2.5 + 1.5 bits, the same bytes per token as d4b8 spent where the error is
  // (issue 18, docs/QUALITY.md "Key/value bit split"; 10x d4b8's codebooks, so not the default).
  std::vector<std::string> presets() const override {
    return {"vecinfer:d4b8", "vecinfer:k=d4b10,v=d8b12", "vecinfer:d8b12", "vecinfer:d8b8"};
  }
  std::vector<std::string> examples() const override { return {"vecinfer:d4b8", "vecinfer:k=d4b8,v=d8b8,r=64,sink=0"}; }
  std::string canonical(const KVCacheConfig& c) const override {
    std::string s = c.key == c.value ? "vecinfer:" + c.key.name() : "vecinfer:k=" + c.key.name() + ",v=" + c.value.name();
    if (c.sink_tokens != KVCacheConfig{}.sink_tokens) s += fmt::format(",sink={}", c.sink_tokens);
    // gran is part of the name: shared and per-sub-space books are different caches (and files)
    if (c.granularity != KVCacheConfig{}.granularity) s += ",gran=shared";
    return s;
  }
  void validate(const KVCacheConfig& c, int hd) const override {
    check_preset(c.key, "key", hd);
    check_preset(c.value, "value", hd);
    if (hd > 0) {
      try {
        (void)hadamard_block(hd);
      } catch (const Error& e) {
        VQ_FAIL("kv_cache.method: vecinfer cannot rotate the keys of this model: {}", e.what());
      }
    }
  }
  double bits_per_element(const KVCacheConfig& c) const override {
    return 0.5 * (c.key.bits_per_element() + c.value.bits_per_element());
  }
  bool windowed() const override { return true; }
  int sink_tokens(const KVCacheConfig& c) const override { return c.sink_tokens; }
  bool needs_calibration() const override { return true; }
  std::unique_ptr<CodedFormat> make_format(const KVCacheConfig& c, const Calibration* calib, int layer,
                                           const KVGeometry& g, int block_tokens) const override {
    return make_vecinfer_format(c, calib, layer, g, block_tokens);
  }
  bool has_device_format() const override { return true; }
  std::string device_unsupported(const KVCacheConfig& c, const KVGeometry& g, int B) const override {
    if (B != 32)
      return fmt::format("blocks of {} tokens: the device pool takes a power of two >= 32 (32 for vecinfer)", B);
    const int D = g.head_dim;
    for (const PQPreset* p : {&c.key, &c.value}) {
      const int d = p->sub_dim;
      if (!((d == 4 || d == 8 || d == 16) && (D / 8) % d == 0))
        return fmt::format("{}: sub_dim {} with head_dim {} (the device kernels take 4, 8 or 16 dividing head_dim/8)",
                           canonical(c), d, D);
    }
    return "";
  }
};

}  // namespace

const KVMethodDef& vecinfer_method() {
  static const VecInferMethod m;
  return m;
}

}  // namespace vq
