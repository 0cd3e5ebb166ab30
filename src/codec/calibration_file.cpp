#include "codec/calibration_file.h"

#include <fmt/ranges.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <iterator>

#include "codec/key_transform.h"
#include "codec/learned_key_map.h"
#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/error.h"
#include "core/mmap_file.h"

static_assert(std::endian::native == std::endian::little, "calibration files are little-endian");

namespace vq {

namespace {

constexpr char kMagic[8] = {'V', 'Q', 'C', 'A', 'L', 'I', 'B', '\0'};
// Version 2 adds the held-out check (CalibrationCheck: u32 tokens, f64 kl, top1, ppl_ratio) after
// n_calib_tokens; version 3 the rotated key mean (u32 key_mean_tokens, rope_neox, n_rot, then per
// layer the mean and the rotary frequencies); version 4 the key transform (u32, then per layer the
// learned map). Versions 1..3 still load (no check, no mean, Walsh-Hadamard keys).
constexpr uint32_t kVersion = 4;
constexpr size_t kMaxModelLen = 1024;
// Fixed part of the header: magic + 13 u32 + 2 u64 + u32 model_len (+ the check's u32 + 3 f64).
constexpr size_t kFixedHeaderV1 = 8 + 13 * 4 + 2 * 8 + 4;
constexpr size_t kCheckBytes = 4 + 3 * 8;
constexpr size_t kKeyMeanBytes = 3 * 4;
constexpr size_t kKeyTransformBytes = 4;
size_t fixed_header(uint32_t version) {
  return kFixedHeaderV1 + (version >= 2 ? kCheckBytes : 0) + (version >= 3 ? kKeyMeanBytes : 0) +
         (version >= 4 ? kKeyTransformBytes : 0);
}
// The largest key_mean_tokens a file may hold (a block of the pool is at most this long).
constexpr int kMaxKeyMeanTokens = 4096;

bool valid_sub_dim(int d) { return d == 2 || d == 4 || d == 8 || d == 16; }

void check_params(const char* side, const CodecParams& p, int head_dim) {
  VQ_CHECK(valid_sub_dim(p.sub_dim), "calibration: {} sub_dim = {} must be 2, 4, 8 or 16", side, p.sub_dim);
  VQ_CHECK(p.bits >= 4 && p.bits <= 12, "calibration: {} bits = {} must be in 4..12", side, p.bits);
  VQ_CHECK(head_dim % p.sub_dim == 0, "calibration: head_dim = {} is not divisible by {} sub_dim = {}", head_dim,
           side, p.sub_dim);
}

class Writer {
 public:
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
  }
  template <class T>
  void floats(const std::vector<T>& v) { raw(v.data(), v.size() * sizeof(T)); }
  std::vector<uint8_t>& bytes() { return buf_; }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  Reader(const std::string& path, const uint8_t* p, size_t n) : path_(path), p_(p), n_(n) {}
  void need(size_t bytes, const char* what) const {
    VQ_CHECK(bytes <= n_ - off_, "{}: truncated: {} needs {} bytes at offset {} but the file has {} bytes", path_, what,
             bytes, off_, n_);
  }
  uint32_t u32(const char* what) { return scalar<uint32_t>(what); }
  uint64_t u64(const char* what) { return scalar<uint64_t>(what); }
  double f64(const char* what) { return scalar<double>(what); }
  void raw(void* dst, size_t bytes, const char* what) {
    need(bytes, what);
    if (bytes) std::memcpy(dst, p_ + off_, bytes);
    off_ += bytes;
  }
  size_t offset() const { return off_; }

 private:
  template <class T>
  T scalar(const char* what) {
    T v;
    raw(&v, sizeof(T), what);
    return v;
  }

  const std::string& path_;
  const uint8_t* p_;
  size_t n_, off_ = 0;
};

// A header field read as u32 that must fit a positive int no larger than `max`.
int header_int(Reader& r, const std::string& path, const char* field, uint32_t max) {
  const uint32_t v = r.u32(field);
  VQ_CHECK(v >= 1 && v <= max, "{}: header field {} = {} out of range 1..{}", path, field, v, max);
  return int(v);
}

}  // namespace

const char* granularity_name(Granularity g) { return g == Granularity::shared ? "shared" : "per_subspace"; }
const char* key_transform_name(KeyTransform t) { return t == KeyTransform::learned ? "learned" : "hadamard"; }

int Calibration::key_books() const { return granularity == Granularity::shared ? 1 : head_dim / key.sub_dim; }
int Calibration::value_books() const { return granularity == Granularity::shared ? 1 : head_dim / value.sub_dim; }
size_t Calibration::key_codebook_floats() const {
  return size_t(n_kv_heads) * key_books() * (size_t(1) << key.bits) * key.sub_dim;
}
size_t Calibration::value_codebook_floats() const {
  return size_t(n_kv_heads) * value_books() * (size_t(1) << value.bits) * value.sub_dim;
}

namespace {

// "[h, b, c, e]" of a flat index into an array of shape dims (row-major).
std::string index_of(size_t i, std::initializer_list<size_t> dims) {
  std::vector<size_t> idx(dims.size());
  size_t k = dims.size();
  for (auto it = std::rbegin(dims); it != std::rend(dims); ++it) {
    idx[--k] = i % *it;
    i /= *it;
  }
  return fmt::format("[{}]", fmt::join(idx, ", "));
}

void check_codebook_values(const std::vector<float>& v, size_t l, const char* side, int books, const CodecParams& p) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!(std::fabs(v[i]) <= kMaxCalibrationValue))  // also catches NaN
      VQ_FAIL("calibration: layer {} {} codebooks{} = {} is not finite or exceeds the bound {} (the largest fp16 "
              "value: the cache keeps keys and values in fp16)",
              l, side, index_of(i, {v.size() / (size_t(books) << p.bits) / size_t(p.sub_dim), size_t(books),
                                    size_t(1) << p.bits, size_t(p.sub_dim)}),
              v[i], kMaxCalibrationValue);
}

}  // namespace

void Calibration::validate() const {
  VQ_CHECK(n_layers >= 1 && n_layers <= 4096, "calibration: n_layers = {} must be in 1..4096", n_layers);
  VQ_CHECK(n_kv_heads >= 1 && n_kv_heads <= 4096, "calibration: n_kv_heads = {} must be in 1..4096", n_kv_heads);
  VQ_CHECK(head_dim >= 2 && head_dim <= 4096, "calibration: head_dim = {} must be in 2..4096", head_dim);
  (void)hadamard_block(head_dim);
  check_params("key", key, head_dim);
  check_params("value", value, head_dim);
  VQ_CHECK(granularity == Granularity::shared || granularity == Granularity::per_subspace,
           "calibration: granularity = {} must be 0 (shared) or 1 (per_subspace)", uint32_t(granularity));
  VQ_CHECK(kmeans_iters >= 0, "calibration: kmeans_iters = {} must be >= 0", kmeans_iters);
  VQ_CHECK(key_transform == KeyTransform::hadamard || key_transform == KeyTransform::learned,
           "calibration: key_transform = {} must be 0 (hadamard) or 1 (learned)", uint32_t(key_transform));
  if (check.tokens > 0) {
    VQ_CHECK(std::isfinite(check.kl) && check.kl >= 0 && check.kl <= 1e3,
             "calibration: held-out check kl = {} must be finite and in [0, 1000]", check.kl);
    VQ_CHECK(check.top1 >= 0 && check.top1 <= 1, "calibration: held-out check top1 = {} must be in [0, 1]",
             check.top1);
    VQ_CHECK(std::isfinite(check.ppl_ratio) && check.ppl_ratio > 0 && check.ppl_ratio <= 1e6,
             "calibration: held-out check ppl_ratio = {} must be finite and in (0, 1e6]", check.ppl_ratio);
  }
  VQ_CHECK(model.size() <= kMaxModelLen, "calibration: model name of {} bytes exceeds {}", model.size(),
           kMaxModelLen);
  VQ_CHECK(key_mean_tokens >= 0 && key_mean_tokens <= kMaxKeyMeanTokens,
           "calibration: key_mean_tokens = {} must be in 0..{}", key_mean_tokens, kMaxKeyMeanTokens);
  if (has_key_mean())
    VQ_CHECK(n_rot >= 2 && n_rot <= head_dim && n_rot % 2 == 0,
             "calibration: n_rot = {} must be even and in 2..head_dim ({}) when the key mean is stored", n_rot,
             head_dim);
  VQ_CHECK(layers.size() == size_t(n_layers), "calibration: {} layers present, n_layers = {}", layers.size(),
           n_layers);
  const size_t n_smooth = size_t(n_kv_heads) * head_dim;
  for (size_t l = 0; l < layers.size(); ++l) {
    const CalibrationLayer& L = layers[l];
    VQ_CHECK(L.smoothing.size() == n_smooth, "calibration: layer {} smoothing has {} floats, expected [{}, {}] = {}",
             l, L.smoothing.size(), n_kv_heads, head_dim, n_smooth);
    VQ_CHECK(L.key_codebooks.size() == key_codebook_floats(),
             "calibration: layer {} key codebooks have {} floats, expected [{}, {}, {}, {}] = {}", l,
             L.key_codebooks.size(), n_kv_heads, key_books(), 1 << key.bits, key.sub_dim, key_codebook_floats());
    VQ_CHECK(L.value_codebooks.size() == value_codebook_floats(),
             "calibration: layer {} value codebooks have {} floats, expected [{}, {}, {}, {}] = {}", l,
             L.value_codebooks.size(), n_kv_heads, value_books(), 1 << value.bits, value.sub_dim,
             value_codebook_floats());
    // Values: a checksum-consistent file can still hold garbage (before this check, huge
    // codebook values made every score overflow and generation emit token 0 forever).
    for (size_t i = 0; i < L.smoothing.size(); ++i)
      VQ_CHECK(L.smoothing[i] >= kMinLambda && L.smoothing[i] <= kMaxCalibrationValue,
               "calibration: layer {} smoothing[{}, {}] = {} must be in [{}, {}] (keys are divided by it)", l,
               i / size_t(head_dim), i % size_t(head_dim), L.smoothing[i], kMinLambda, kMaxCalibrationValue);
    check_codebook_values(L.key_codebooks, l, "key", key_books(), key);
    check_codebook_values(L.value_codebooks, l, "value", value_books(), value);
    if (learned_keys()) {
      VQ_CHECK(L.key_map.size() == n_smooth * size_t(head_dim),
               "calibration: layer {} key map has {} floats, expected [{}, {}, {}] = {}", l, L.key_map.size(),
               n_kv_heads, head_dim, head_dim, n_smooth * size_t(head_dim));
      for (size_t i = 0; i < L.key_map.size(); ++i)
        if (!(std::fabs(L.key_map[i]) <= kMaxCalibrationValue))  // also catches NaN
          VQ_FAIL("calibration: layer {} key map{} = {} is not finite or exceeds the bound {}", l,
                  index_of(i, {size_t(n_kv_heads), size_t(head_dim), size_t(head_dim)}), L.key_map[i],
                  kMaxCalibrationValue);
      for (int h = 0; h < n_kv_heads; ++h) {
        const std::string what = fmt::format("calibration: layer {} KV head {}", l, h);
        (void)key_map_query_side(L.key_map.data() + size_t(h) * head_dim * head_dim, head_dim, what.c_str());
      }
    } else {
      VQ_CHECK(L.key_map.empty(), "calibration: layer {} holds a key map but the key transform is {}", l,
               key_transform_name(key_transform));
    }
    if (!has_key_mean()) {
      VQ_CHECK(L.key_mean.empty() && L.rope_freqs.empty(),
               "calibration: layer {} holds a key mean but key_mean_tokens = 0", l);
      continue;
    }
    VQ_CHECK(L.key_mean.size() == n_smooth, "calibration: layer {} key mean has {} floats, expected [{}, {}] = {}", l,
             L.key_mean.size(), n_kv_heads, head_dim, n_smooth);
    VQ_CHECK(L.rope_freqs.size() == size_t(n_rot / 2), "calibration: layer {} has {} rope freqs, expected n_rot / 2 = {}",
             l, L.rope_freqs.size(), n_rot / 2);
    for (size_t i = 0; i < L.key_mean.size(); ++i)
      VQ_CHECK(std::fabs(L.key_mean[i]) <= kMaxCalibrationValue,
               "calibration: layer {} key mean[{}, {}] = {} is not finite or exceeds the bound {}", l,
               i / size_t(head_dim), i % size_t(head_dim), L.key_mean[i], kMaxCalibrationValue);
    for (size_t i = 0; i < L.rope_freqs.size(); ++i)
      VQ_CHECK(L.rope_freqs[i] > 0 && L.rope_freqs[i] <= 1e3,  // NaN fails too
               "calibration: layer {} rope freq[{}] = {} must be in (0, 1000]", l, i, L.rope_freqs[i]);
  }
}

void save_calibration(const std::string& path, const Calibration& c) {
  c.validate();
  Writer w;
  w.raw(kMagic, 8);
  w.u32(kVersion);
  w.u32(uint32_t(fixed_header(kVersion) + c.model.size()));
  for (int v : {c.n_layers, c.n_kv_heads, c.head_dim, c.key.sub_dim, c.key.bits, c.value.sub_dim, c.value.bits})
    w.u32(uint32_t(v));
  w.u32(uint32_t(c.granularity));
  w.u32(uint32_t(hadamard_block(c.head_dim)));
  w.u32(uint32_t(c.kmeans_iters));
  w.u64(c.seed);
  w.u64(c.n_calib_tokens);
  w.u32(c.check.tokens);
  w.f64(c.check.kl);
  w.f64(c.check.top1);
  w.f64(c.check.ppl_ratio);
  w.u32(uint32_t(c.key_mean_tokens));
  w.u32(c.rope_neox ? 1 : 0);
  w.u32(uint32_t(c.n_rot));
  w.u32(uint32_t(c.key_transform));
  w.u32(uint32_t(c.model.size()));
  w.raw(c.model.data(), c.model.size());
  for (const CalibrationLayer& L : c.layers) {
    w.floats(L.smoothing);
    w.floats(L.key_codebooks);
    w.floats(L.value_codebooks);
    w.floats(L.key_mean);  // empty without the key mean
    w.floats(L.rope_freqs);
    w.floats(L.key_map);  // empty unless learned
  }
  const uint64_t sum = checksum64(w.bytes().data(), w.bytes().size());
  w.u64(sum);
  write_file_atomic(path, w.bytes().data(), w.bytes().size());
}

Calibration load_calibration(const std::string& path) {
  const MappedFile f(path);
  return parse_calibration(f.data(), f.size(), path);
}

Calibration parse_calibration(const uint8_t* data, size_t size, const std::string& path) {
  Reader r(path, data, size);
  char magic[8];
  r.raw(magic, 8, "magic");
  VQ_CHECK(std::memcmp(magic, kMagic, 8) == 0, "{}: not a VeloxQuant calibration file (bad magic)", path);
  const uint32_t version = r.u32("version");
  VQ_CHECK(version >= 1 && version <= kVersion,
           "{}: calibration file version {} is not supported (this build reads versions 1..{})", path, version,
           kVersion);
  const uint32_t header_bytes = r.u32("header_bytes");
  Calibration c;
  c.n_layers = header_int(r, path, "n_layers", 4096);
  c.n_kv_heads = header_int(r, path, "n_kv_heads", 4096);
  c.head_dim = header_int(r, path, "head_dim", 4096);
  c.key.sub_dim = header_int(r, path, "key_sub_dim", 16);
  c.key.bits = header_int(r, path, "key_bits", 12);
  c.value.sub_dim = header_int(r, path, "value_sub_dim", 16);
  c.value.bits = header_int(r, path, "value_bits", 12);
  const uint32_t gran = r.u32("granularity");
  VQ_CHECK(gran <= 1, "{}: header field granularity = {} must be 0 (shared) or 1 (per_subspace)", path, gran);
  c.granularity = Granularity(gran);
  const uint32_t block = r.u32("hadamard_block");
  c.kmeans_iters = int(r.u32("kmeans_iters") & 0x7fffffffu);
  c.seed = r.u64("seed");
  c.n_calib_tokens = r.u64("n_calib_tokens");
  if (version >= 2) {
    c.check.tokens = r.u32("check_tokens");
    c.check.kl = r.f64("check_kl");
    c.check.top1 = r.f64("check_top1");
    c.check.ppl_ratio = r.f64("check_ppl_ratio");
  }
  if (version >= 3) {
    const uint32_t kmt = r.u32("key_mean_tokens");
    VQ_CHECK(kmt <= uint32_t(kMaxKeyMeanTokens), "{}: header field key_mean_tokens = {} exceeds {}", path, kmt,
             kMaxKeyMeanTokens);
    c.key_mean_tokens = int(kmt);
    const uint32_t neox = r.u32("rope_neox");
    VQ_CHECK(neox <= 1, "{}: header field rope_neox = {} must be 0 or 1", path, neox);
    c.rope_neox = neox == 1;
    const uint32_t n_rot = r.u32("n_rot");
    VQ_CHECK(kmt == 0 || (n_rot >= 2 && n_rot <= uint32_t(c.head_dim) && n_rot % 2 == 0),
             "{}: header field n_rot = {} must be even and in 2..head_dim ({})", path, n_rot, c.head_dim);
    c.n_rot = int(n_rot);
  }
  if (version >= 4) {
    const uint32_t kt = r.u32("key_transform");
    VQ_CHECK(kt <= 1, "{}: header field key_transform = {} must be 0 (hadamard) or 1 (learned)", path, kt);
    c.key_transform = KeyTransform(kt);
  }
  const uint32_t model_len = r.u32("model_len");
  VQ_CHECK(model_len <= kMaxModelLen, "{}: header field model_len = {} exceeds {}", path, model_len, kMaxModelLen);
  VQ_CHECK(header_bytes == fixed_header(version) + model_len, "{}: header_bytes = {} but the header holds {} bytes",
           path, header_bytes, fixed_header(version) + model_len);
  c.model.resize(model_len);
  r.raw(c.model.data(), model_len, "model name");
  try {  // header parameters must be mutually consistent before the sizes below mean anything
    check_params("key", c.key, c.head_dim);
    check_params("value", c.value, c.head_dim);
    VQ_CHECK(int(block) == hadamard_block(c.head_dim), "hadamard_block = {} but head_dim {} implies {}", block,
             c.head_dim, hadamard_block(c.head_dim));
  } catch (const Error& e) {
    VQ_FAIL("{}: inconsistent header: {}", path, e.what());
  }
  const size_t per_layer =
      (size_t(c.n_kv_heads) * c.head_dim * (c.has_key_mean() ? 2 : 1) + c.key_codebook_floats() +
       c.value_codebook_floats() + (c.learned_keys() ? size_t(c.n_kv_heads) * c.head_dim * c.head_dim : 0)) *
          sizeof(float) +
      (c.has_key_mean() ? size_t(c.n_rot / 2) * sizeof(double) : 0);
  const size_t expected = r.offset() + size_t(c.n_layers) * per_layer + 8;
  VQ_CHECK(size >= expected, "{}: truncated: {} bytes, the header implies {}", path, size, expected);
  VQ_CHECK(size == expected, "{}: {} trailing bytes after the data the header implies ({} bytes)", path,
           size - expected, expected);
  uint64_t stored;
  std::memcpy(&stored, data + expected - 8, 8);
  const uint64_t actual = checksum64(data, expected - 8);
  VQ_CHECK(stored == actual, "{}: checksum mismatch (stored {:016x}, computed {:016x}): the file is corrupt", path,
           stored, actual);
  c.layers.resize(size_t(c.n_layers));
  for (CalibrationLayer& L : c.layers) {
    L.smoothing.resize(size_t(c.n_kv_heads) * c.head_dim);
    L.key_codebooks.resize(c.key_codebook_floats());
    L.value_codebooks.resize(c.value_codebook_floats());
    r.raw(L.smoothing.data(), L.smoothing.size() * 4, "smoothing");
    r.raw(L.key_codebooks.data(), L.key_codebooks.size() * 4, "key codebooks");
    r.raw(L.value_codebooks.data(), L.value_codebooks.size() * 4, "value codebooks");
    if (c.has_key_mean()) {
      L.key_mean.resize(size_t(c.n_kv_heads) * c.head_dim);
      L.rope_freqs.resize(size_t(c.n_rot / 2));
      r.raw(L.key_mean.data(), L.key_mean.size() * 4, "key mean");
      r.raw(L.rope_freqs.data(), L.rope_freqs.size() * 8, "rope freqs");
    }
    if (c.learned_keys()) {
      L.key_map.resize(size_t(c.n_kv_heads) * c.head_dim * c.head_dim);
      r.raw(L.key_map.data(), L.key_map.size() * 4, "key map");
    }
  }
  try {
    c.validate();
  } catch (const Error& e) {
    VQ_FAIL("{}: {}", path, e.what());
  }
  return c;
}

void check_calibration_geometry(const Calibration& c, int n_layers, int n_kv_heads, int head_dim) {
  VQ_CHECK(c.n_layers == n_layers, "calibration: n_layers = {} but the model has {}", c.n_layers, n_layers);
  VQ_CHECK(c.n_kv_heads == n_kv_heads, "calibration: n_kv_heads = {} but the model has {}", c.n_kv_heads, n_kv_heads);
  VQ_CHECK(c.head_dim == head_dim, "calibration: head_dim = {} but the model has {}", c.head_dim, head_dim);
}

}  // namespace vq
