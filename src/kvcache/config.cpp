// KVCacheConfig validation and naming, and the spec-string parser (factory.h), all over the KV
// method registry (kv_method.h): nothing here knows a method by name.
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "kvcache/factory.h"
#include "kvcache/kv_method.h"
#include "kvcache/spec_syntax.h"
#include "veloxquant/config.h"

namespace vq {

const char* method_name(KVMethod m) {
  static const std::map<KVMethod, std::string> names = [] {  // c_str() of these stays valid
    std::map<KVMethod, std::string> n;
    for (const KVMethodDef* x : kv_methods()) n[x->id()] = x->name();
    return n;
  }();
  const auto it = names.find(m);
  return it == names.end() ? "?" : it->second.c_str();
}

const char* gpu_kernels_name(GpuKernels g) {
  switch (g) {
    case GpuKernels::auto_select: return "auto";
    case GpuKernels::require: return "require";
    case GpuKernels::forbid: return "forbid";
  }
  return "?";
}

std::string PQPreset::name() const { return fmt::format("d{}b{}", sub_dim, bits); }

void KVCacheConfig::validate(int head_dim_model) const {
  VQ_CHECK(head_dim >= 0 && head_dim <= 1024, "kv_cache.head_dim: {} must be in 0..1024 (0 = from the model)",
           head_dim);
  if (head_dim > 0 && head_dim_model > 0)
    VQ_CHECK(head_dim == head_dim_model, "kv_cache.head_dim: {} differs from the model's head_dim {}", head_dim,
             head_dim_model);
  const int hd = head_dim_model > 0 ? head_dim_model : head_dim;
  VQ_CHECK(residual_length >= 0 && residual_length <= (1 << 20),
           "kv_cache.residual_length: {} must be in 0..1048576", residual_length);
  VQ_CHECK(sink_tokens >= 0 && sink_tokens <= 4096, "kv_cache.sink_tokens: {} must be in 0..4096", sink_tokens);
  kv_method(method).validate(*this, hd);
#ifndef VQ_HAVE_CUDA
  VQ_CHECK(use_gpu_kernels != GpuKernels::require,
           "kv_cache.use_gpu_kernels: require but no CUDA device can be used (this build has no CUDA backend)");
#endif
}

std::string KVCacheConfig::name() const { return kv_method(method).canonical(*this); }

double KVCacheConfig::nominal_bits_per_element() const { return kv_method(method).bits_per_element(*this); }

// ---- spec parser ----

std::string kv_cache_spec_syntax() {
  std::string s =
      "KV cache spec: METHOD[:OPTION,...] (options after ':' or ','; a method alone is its default,\n"
      "  an empty option list or an unknown option is an error)\n";
  std::string examples;
  for (const KVMethodDef* m : kv_methods()) {
    s += m->help();
    for (const std::string& e : m->examples()) examples += "  " + e;
  }
  s += "  any method:          gpu=auto|require|forbid  (require: fail without a usable CUDA device; default auto;\n"
       "                       where the KV pool lives is --device)\n";
  s += "  examples:" + examples;
  return s;
}

namespace {

// Every option key any method takes, with its aliases mapped to the canonical key.
const std::map<std::string, std::string>& option_keys() {
  static const std::map<std::string, std::string> keys = [] {
    std::map<std::string, std::string> k{{"gpu", "gpu"}};
    for (const KVMethodDef* m : kv_methods())
      for (const std::string& head : m->heads())
        for (const KVSpecOption& o : m->options(head)) {
          k[o.key] = o.key;
          for (const std::string& a : o.aliases) k[a] = o.key;
        }
    return k;
  }();
  return keys;
}

std::string known_heads() {
  std::string s;
  for (const std::string& p : kv_method_presets()) s += (s.empty() ? "" : ", ") + p;
  return s;
}

void set_gpu(const std::string& val, KVCacheConfig& c, const std::string& spec) {
  if (val == "auto") c.use_gpu_kernels = GpuKernels::auto_select;
  else if (val == "require") c.use_gpu_kernels = GpuKernels::require;
  else if (val == "forbid") c.use_gpu_kernels = GpuKernels::forbid;
  else VQ_FAIL("kv cache spec '{}': gpu '{}' must be auto, require or forbid", spec, val);
}

}  // namespace

KVCacheConfig parse_kv_cache_spec(const std::string& spec_in) {
  std::string spec;
  for (char ch : spec_in) spec += char(std::tolower(static_cast<unsigned char>(ch)));
  KVCacheConfig c;
  // Split "head:opt,opt" / "head,opt".
  std::string head = spec, rest;
  const size_t cut = std::min(spec.find(':'), spec.find(','));
  if (cut != std::string::npos) {
    head = spec.substr(0, cut);
    rest = spec.substr(cut + 1);
  }
  const KVMethodDef* m = find_kv_method_by_head(head);
  VQ_CHECK(m, "kv cache spec '{}': unknown method '{}' ({})", spec_in, head, known_heads());
  m->take_head(head, c);
  VQ_CHECK(cut == std::string::npos || !rest.empty(),
           "kv cache spec '{}': nothing after '{}' (write '{}' alone for its default, or give options)", spec_in,
           spec[cut], head);
  std::vector<std::string> opts;  // rest split at commas, empty pieces kept (and refused below)
  for (size_t p = 0; !rest.empty() && p <= rest.size();) {
    const size_t e = std::min(rest.find(',', p), rest.size());
    opts.push_back(rest.substr(p, e - p));
    p = e + 1;
  }
  VQ_CHECK(spec.empty() || spec.back() != ',', "kv cache spec '{}': empty option (a trailing comma)", spec_in);
  const std::vector<KVSpecOption> mine = m->options(head);
  std::vector<std::string> seen;
  for (const std::string& opt : opts) {
    VQ_CHECK(!opt.empty(), "kv cache spec '{}': empty option (two commas or a trailing comma)", spec_in);
    const size_t eq = opt.find('=');
    const std::string raw = eq == std::string::npos ? "" : opt.substr(0, eq);
    const std::string val = eq == std::string::npos ? opt : opt.substr(eq + 1);
    const auto known = option_keys().find(raw);
    VQ_CHECK(known != option_keys().end(), "kv cache spec '{}': unknown option '{}'", spec_in, opt);
    const std::string& key = known->second;
    const bool applies = key == "gpu" || std::any_of(mine.begin(), mine.end(),
                                                     [&](const KVSpecOption& o) { return o.key == key; });
    VQ_CHECK(applies, "kv cache spec '{}': option '{}' does not apply to {}", spec_in, opt, head);
    for (const std::string& slot : key == "gpu" ? std::vector<std::string>{key} : m->slots(key)) {
      VQ_CHECK(std::find(seen.begin(), seen.end(), slot) == seen.end(), "kv cache spec '{}': {} given twice", spec_in,
               m->slot_label(slot));
      seen.push_back(slot);
    }
    if (key == "gpu") set_gpu(val, c, spec_in);
    else m->set_option(key, val, c, spec_in);
  }
  m->check_options(seen, spec_in);
  try {
    c.validate();
  } catch (const Error& e) {
    VQ_FAIL("kv cache spec '{}': {}", spec_in, e.what());
  }
  return c;
}

}  // namespace vq
