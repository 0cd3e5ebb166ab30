// KVCacheConfig validation and naming, and the spec-string parser (factory.h).
#include <fmt/format.h>

#include <cctype>
#include <charconv>

#include "core/error.h"
#include "kvcache/factory.h"
#include "veloxquant/config.h"

namespace vq {

const char* method_name(KVMethod m) {
  switch (m) {
    case KVMethod::fp16: return "fp16";
    case KVMethod::fp32: return "fp32";
    case KVMethod::q8_0: return "q8_0";
    case KVMethod::q4_0: return "q4_0";
    case KVMethod::kivi: return "kivi";
    case KVMethod::vecinfer: return "vecinfer";
    case KVMethod::q4_0h: return "q4_0h";
  }
  return "?";
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

static void check_preset(const PQPreset& p, const char* field, int head_dim_model) {
  VQ_CHECK(p.sub_dim >= 1 && p.sub_dim <= 64, "kv_cache.{}.sub_dim: {} must be in 1..64", field, p.sub_dim);
  VQ_CHECK(p.bits >= 1 && p.bits <= 16, "kv_cache.{}.bits: {} must be in 1..16", field, p.bits);
  if (head_dim_model > 0)
    VQ_CHECK(head_dim_model % p.sub_dim == 0, "kv_cache.{}.sub_dim: {} does not divide the model's head_dim {}",
             field, p.sub_dim, head_dim_model);
}

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
  switch (method) {
    case KVMethod::fp16:
    case KVMethod::fp32:
      break;
    case KVMethod::q8_0:
    case KVMethod::q4_0:
    case KVMethod::q4_0h:
      if (hd > 0)
        VQ_CHECK(hd % 32 == 0, "kv_cache.method: {} needs head_dim divisible by its block of 32 (head_dim {})",
                 method_name(method), hd);
      break;
    case KVMethod::kivi:
      VQ_CHECK(kivi_bits == 2 || kivi_bits == 4, "kv_cache.kivi_bits: {} must be 2 or 4", kivi_bits);
      VQ_CHECK(kivi_group >= 1 && kivi_group <= 4096, "kv_cache.kivi_group: {} must be in 1..4096", kivi_group);
      if (hd > 0)
        VQ_CHECK(hd % kivi_group == 0, "kv_cache.kivi_group: {} must divide head_dim {} (values are grouped by channel)",
                 kivi_group, hd);
      break;
    case KVMethod::vecinfer:
      check_preset(key, "key", hd);
      check_preset(value, "value", hd);
      break;
  }
#ifndef VQ_HAVE_CUDA
  VQ_CHECK(use_gpu_kernels != GpuKernels::require,
           "kv_cache.use_gpu_kernels: require but no CUDA device can be used (this build has no CUDA backend)");
#endif
}

std::string KVCacheConfig::name() const {
  std::string s;
  switch (method) {
    case KVMethod::kivi: s = fmt::format("kivi{}", kivi_bits); break;
    case KVMethod::vecinfer:
      s = key == value ? "vecinfer:" + key.name() : "vecinfer:k=" + key.name() + ",v=" + value.name();
      if (sink_tokens != KVCacheConfig{}.sink_tokens) s += fmt::format(",sink={}", sink_tokens);
      break;
    default: s = method_name(method);
  }
  return s;
}

double KVCacheConfig::nominal_bits_per_element() const {
  switch (method) {
    case KVMethod::fp16: return 16.0;
    case KVMethod::fp32: return 32.0;
    case KVMethod::q8_0: return 8.5;   // 32 int8 + one fp16 scale per 32
    case KVMethod::q4_0: return 4.5;   // 32 nibbles + one fp16 scale per 32
    case KVMethod::q4_0h: return 4.5;  // q4_0 blocks of the rotated rows
    case KVMethod::kivi: return kivi_bits + 32.0 / kivi_group;  // fp16 scale + min per group
    case KVMethod::vecinfer: return 0.5 * (key.bits_per_element() + value.bits_per_element());
  }
  return 0.0;
}

// ---- spec parser ----

static int parse_int(std::string_view s, const std::string& spec, const char* what) {
  int v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  VQ_CHECK(r.ec == std::errc() && r.ptr == s.data() + s.size() && !s.empty(),
           "kv cache spec '{}': {} '{}' is not an integer", spec, what, s);
  return v;
}

// "d4b8" -> {4, 8}
static PQPreset parse_preset(std::string_view s, const std::string& spec) {
  const size_t b = s.find('b');
  VQ_CHECK(s.size() >= 4 && s[0] == 'd' && b != std::string_view::npos && b > 1,
           "kv cache spec '{}': preset '{}' is not of the form d<sub_dim>b<bits> (e.g. d4b8)", spec, s);
  return PQPreset{parse_int(s.substr(1, b - 1), spec, "sub_dim"), parse_int(s.substr(b + 1), spec, "bits")};
}

KVCacheConfig parse_kv_cache_spec(const std::string& spec_in) {
  std::string spec;
  for (char c : spec_in) spec += char(std::tolower(static_cast<unsigned char>(c)));
  KVCacheConfig c;
  // Split "head:opt,opt" / "head,opt".
  std::string head = spec, rest;
  const size_t colon = spec.find(':');
  const size_t comma = spec.find(',');
  const size_t cut = std::min(colon, comma);
  if (cut != std::string::npos) {
    head = spec.substr(0, cut);
    rest = spec.substr(cut + 1);
  }
  bool preset_given = false;
  if (head == "fp16" || head == "f16") {
    c.method = KVMethod::fp16;
  } else if (head == "fp32" || head == "f32") {
    c.method = KVMethod::fp32;
  } else if (head == "q8_0") {
    c.method = KVMethod::q8_0;
  } else if (head == "q4_0") {
    c.method = KVMethod::q4_0;
  } else if (head == "q4_0h") {
    c.method = KVMethod::q4_0h;
  } else if (head == "kivi" || head == "kivi2" || head == "kivi4") {
    c.method = KVMethod::kivi;
    c.kivi_bits = head == "kivi4" ? 4 : 2;
  } else if (head == "vecinfer") {
    c.method = KVMethod::vecinfer;
  } else {
    VQ_FAIL("kv cache spec '{}': unknown method '{}' (fp16, fp32, q8_0, q4_0, q4_0h, kivi2, kivi4, vecinfer:d4b8, "
            "vecinfer:d8b12, vecinfer:d8b8, vecinfer:k=d4b8,v=d8b8)",
            spec_in, head);
  }
  size_t p = 0;
  while (p < rest.size()) {
    size_t e = rest.find(',', p);
    if (e == std::string::npos) e = rest.size();
    const std::string opt = rest.substr(p, e - p);
    p = e + 1;
    if (opt.empty()) continue;
    const size_t eq = opt.find('=');
    const std::string key = eq == std::string::npos ? "" : opt.substr(0, eq);
    const std::string val = eq == std::string::npos ? opt : opt.substr(eq + 1);
    if (key.empty() && c.method == KVMethod::vecinfer && !preset_given) {
      c.key = c.value = parse_preset(val, spec_in);
      preset_given = true;
    } else if (key == "k" && c.method == KVMethod::vecinfer) {
      c.key = parse_preset(val, spec_in);
      preset_given = true;
    } else if (key == "v" && c.method == KVMethod::vecinfer) {
      c.value = parse_preset(val, spec_in);
      preset_given = true;
    } else if ((key == "sink" || key == "sinks") && c.method == KVMethod::vecinfer) {
      c.sink_tokens = parse_int(val, spec_in, "sink tokens");
    } else if (key == "r" || key == "residual") {
      c.residual_length = parse_int(val, spec_in, "residual length");
    } else if ((key == "g" || key == "group") && c.method == KVMethod::kivi) {
      c.kivi_group = parse_int(val, spec_in, "group size");
    } else if ((key == "b" || key == "bits") && c.method == KVMethod::kivi) {
      c.kivi_bits = parse_int(val, spec_in, "bits");
    } else if (key == "gran" || key == "granularity") {
      if (val == "shared") c.granularity = CodebookGranularity::shared;
      else if (val == "per_subspace" || val == "subspace") c.granularity = CodebookGranularity::per_subspace;
      else VQ_FAIL("kv cache spec '{}': granularity '{}' must be shared or per_subspace", spec_in, val);
    } else if (key == "gpu") {
      if (val == "auto") c.use_gpu_kernels = GpuKernels::auto_select;
      else if (val == "require") c.use_gpu_kernels = GpuKernels::require;
      else if (val == "forbid") c.use_gpu_kernels = GpuKernels::forbid;
      else VQ_FAIL("kv cache spec '{}': gpu '{}' must be auto, require or forbid", spec_in, val);
    } else {
      VQ_FAIL("kv cache spec '{}': unknown option '{}' for {}", spec_in, opt, method_name(c.method));
    }
  }
  c.validate();
  return c;
}

}  // namespace vq
