// The KV method registry (kv_method.h): the list from methods/list.h and the helpers methods share.
#include "kvcache/kv_method.h"

#include <fmt/format.h>

#include <charconv>

#include "core/error.h"

namespace vq {

#define VQ_KV_METHOD(x) const KVMethodDef& x##_method();
#include "kvcache/methods/list.h"
#undef VQ_KV_METHOD

const std::vector<const KVMethodDef*>& kv_methods() {
  static const std::vector<const KVMethodDef*> all = {
#define VQ_KV_METHOD(x) &x##_method(),
#include "kvcache/methods/list.h"
#undef VQ_KV_METHOD
  };
  return all;
}

const KVMethodDef& kv_method(KVMethod id) {
  for (const KVMethodDef* m : kv_methods())
    if (m->id() == id) return *m;
  VQ_FAIL("kv_cache.method: {} is no registered KV method", int(id));
}

const KVMethodDef* find_kv_method_by_head(const std::string& head) {
  for (const KVMethodDef* m : kv_methods())
    for (const std::string& h : m->heads())
      if (h == head) return m;
  return nullptr;
}

std::vector<std::string> kv_method_presets(bool evaluated_only) {
  std::vector<std::string> out;
  for (const KVMethodDef* m : kv_methods())
    if (!evaluated_only || m->evaluated())
    for (const std::string& p : m->presets()) out.push_back(p);
  return out;
}

std::string kv_device_method_names() {
  std::vector<std::string> names;
  for (const KVMethodDef* m : kv_methods())
    if (m->has_device_format()) names.push_back(m->name());
  std::string s;
  for (size_t i = 0; i < names.size(); ++i)
    s += (i == 0 ? "" : i + 1 == names.size() ? " and " : ", ") + names[i];
  return s;
}

void KVMethodDef::take_head(const std::string&, KVCacheConfig& c) const { c.method = id(); }

void KVMethodDef::set_option(const std::string& key, const std::string&, KVCacheConfig&, const std::string& spec) const {
  VQ_FAIL("kv cache spec '{}': {} declares option '{}' but does not apply it", spec, name(), key);
}

int parse_spec_int(const std::string& s, const std::string& spec, const char* what) {
  int v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  VQ_CHECK(r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty(),
           "kv cache spec '{}': {} '{}' is not an integer", spec, what, s);
  return v;
}

// "d4b8" -> {4, 8}
PQPreset parse_spec_preset(const std::string& s, const std::string& spec) {
  const size_t b = s.find('b');
  VQ_CHECK(s.size() >= 4 && s[0] == 'd' && b != std::string::npos && b > 1,
           "kv cache spec '{}': preset '{}' is not of the form d<sub_dim>b<bits> (e.g. d4b8)", spec, s);
  return PQPreset{parse_spec_int(s.substr(1, b - 1), spec, "sub_dim"), parse_spec_int(s.substr(b + 1), spec, "bits")};
}

}  // namespace vq
