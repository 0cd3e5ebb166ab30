// KVCacheConfig validation and naming, and the spec-string parser (factory.h).
#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <string>
#include <vector>

#include "codec/key_transform.h"
#include "core/error.h"
#include "kvcache/factory.h"
#include "kvcache/spec_syntax.h"
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

// Exactly what the product quantizer (codec/product_quantizer.h) accepts, so that a spec the
// parser takes never fails later, after the model has loaded.
static void check_preset(const PQPreset& p, const char* field, int head_dim_model) {
  VQ_CHECK(p.sub_dim == 2 || p.sub_dim == 4 || p.sub_dim == 8 || p.sub_dim == 16,
           "kv_cache.{}.sub_dim: {} must be 2, 4, 8 or 16", field, p.sub_dim);
  VQ_CHECK(p.bits >= 4 && p.bits <= 12, "kv_cache.{}.bits: {} must be in 4..12", field, p.bits);
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
      if (hd > 0) {
        try {
          (void)hadamard_block(hd);
        } catch (const Error& e) {
          VQ_FAIL("kv_cache.method: vecinfer cannot rotate the keys of this model: {}", e.what());
        }
      }
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

std::string kv_cache_spec_syntax() {
  return R"(KV cache spec: METHOD[:OPTION,...] (options after ':' or ',')
  fp16, fp32           uncompressed; no options
  q8_0, q4_0           llama.cpp's 32-element blocks (8.5 / 4.5 bits); no options; head_dim % 32 == 0
  kivi2, kivi4         KIVI 2- or 4-bit (also kivi,b=2|4); options:
                         g=N  group size 1..4096 dividing head_dim (default 32)
                         r=N  recent tokens kept in fp16, 0..1048576 (default 128)
  vecinfer:dDbB        VecInfer product quantization, keys and values alike
  vecinfer:k=dDbB,v=dDbB   separate key and value presets; D (sub_dim) 2, 4, 8 or 16 dividing
                       head_dim, B (bits) 4..12, e.g. d4b8 = 2 bits/element; options:
                         r=N     recent tokens kept in fp16, 0..1048576 (default 128)
                         sink=N  first tokens kept in fp16, 0..4096 (default 4)
                         gran=shared|per_subspace  codebook per head or per sub-space (default per_subspace)
                         needs a calibration file made with the same presets and gran (--calib)
  any method:          gpu=auto|require|forbid  (CUDA kernels; default auto)
  examples: q8_0  kivi2,r=64  vecinfer:d4b8  vecinfer:k=d4b8,v=d8b8,r=64,sink=0)";
}

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

namespace {
// The options each method takes; any other is an error rather than silently ignored.
bool option_applies(const std::string& key, KVMethod m, bool plain_kivi) {
  if (key == "gpu") return true;
  if (key == "r") return m == KVMethod::kivi || m == KVMethod::vecinfer;
  if (key == "g") return m == KVMethod::kivi;
  if (key == "b") return m == KVMethod::kivi && plain_kivi;  // kivi2/kivi4 already say the bits
  return m == KVMethod::vecinfer && (key == "" || key == "k" || key == "v" || key == "sink" || key == "gran");
}
std::string canonical_key(const std::string& k) {
  if (k == "residual") return "r";
  if (k == "group") return "g";
  if (k == "bits") return "b";
  if (k == "sinks") return "sink";
  if (k == "granularity") return "gran";
  return k;
}
}  // namespace

KVCacheConfig parse_kv_cache_spec(const std::string& spec_in) {
  std::string spec;
  for (char c : spec_in) spec += char(std::tolower(static_cast<unsigned char>(c)));
  KVCacheConfig c;
  // Split "head:opt,opt" / "head,opt".
  std::string head = spec, rest;
  const size_t cut = std::min(spec.find(':'), spec.find(','));
  if (cut != std::string::npos) {
    head = spec.substr(0, cut);
    rest = spec.substr(cut + 1);
  }
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
  std::vector<std::string> opts;  // rest split at commas, empty pieces kept (and refused below)
  for (size_t p = 0; !rest.empty() && p <= rest.size();) {
    const size_t e = std::min(rest.find(',', p), rest.size());
    opts.push_back(rest.substr(p, e - p));
    p = e + 1;
  }
  VQ_CHECK(spec.empty() || spec.back() != ',', "kv cache spec '{}': empty option (a trailing comma)", spec_in);
  std::vector<std::string> seen;
  for (const std::string& opt : opts) {
    VQ_CHECK(!opt.empty(), "kv cache spec '{}': empty option (two commas or a trailing comma)", spec_in);
    const size_t eq = opt.find('=');
    const std::string key = eq == std::string::npos ? "" : canonical_key(opt.substr(0, eq));
    const std::string val = eq == std::string::npos ? opt : opt.substr(eq + 1);
    const bool known = key == "" || key == "k" || key == "v" || key == "sink" || key == "gran" || key == "r" ||
                       key == "g" || key == "b" || key == "gpu";
    VQ_CHECK(known, "kv cache spec '{}': unknown option '{}'", spec_in, opt);
    VQ_CHECK(option_applies(key, c.method, head == "kivi"), "kv cache spec '{}': option '{}' does not apply to {}",
             spec_in, opt, head);
    // A preset given bare counts as both k= and v=.
    for (const std::string& k : key.empty() ? std::vector<std::string>{"k", "v"} : std::vector<std::string>{key}) {
      VQ_CHECK(std::find(seen.begin(), seen.end(), k) == seen.end(), "kv cache spec '{}': {} given twice", spec_in,
               k == "k" ? "the key preset" : k == "v" ? "the value preset" : "option '" + k + "'");
      seen.push_back(k);
    }
    if (key.empty()) {
      c.key = c.value = parse_preset(val, spec_in);
    } else if (key == "k") {
      c.key = parse_preset(val, spec_in);
    } else if (key == "v") {
      c.value = parse_preset(val, spec_in);
    } else if (key == "sink") {
      c.sink_tokens = parse_int(val, spec_in, "sink tokens");
    } else if (key == "r") {
      c.residual_length = parse_int(val, spec_in, "residual length");
    } else if (key == "g") {
      c.kivi_group = parse_int(val, spec_in, "group size");
    } else if (key == "b") {
      c.kivi_bits = parse_int(val, spec_in, "bits");
    } else if (key == "gran") {
      if (val == "shared") c.granularity = CodebookGranularity::shared;
      else if (val == "per_subspace" || val == "subspace") c.granularity = CodebookGranularity::per_subspace;
      else VQ_FAIL("kv cache spec '{}': granularity '{}' must be shared or per_subspace", spec_in, val);
    } else if (key == "gpu") {
      if (val == "auto") c.use_gpu_kernels = GpuKernels::auto_select;
      else if (val == "require") c.use_gpu_kernels = GpuKernels::require;
      else if (val == "forbid") c.use_gpu_kernels = GpuKernels::forbid;
      else VQ_FAIL("kv cache spec '{}': gpu '{}' must be auto, require or forbid", spec_in, val);
    }
  }
  try {
    c.validate();
  } catch (const Error& e) {
    VQ_FAIL("kv cache spec '{}': {}", spec_in, e.what());
  }
  return c;
}

}  // namespace vq
