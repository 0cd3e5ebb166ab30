#include "model/calibrate.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/cache_dir.h"
#include "core/error.h"
#include "core/input_file.h"
#include "kvcache/factory.h"
#include "model/session.h"
#include "core/sha256.h"

namespace vq {

// Tag of the first-use calibration recipe, part of the cached file's name. -r2: sinks left out of
// training (CalibTrainOptions::skip_tokens).
static constexpr const char* kCalibRecipe = "-r2";
// Tokens per calibration sequence (see calibrate_model).
static constexpr int kCalibSegment = 2048;

static bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

static std::string strip_html(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool in_tag = false;
  for (char c : s) {
    if (c == '<') in_tag = true;
    else if (c == '>') in_tag = false;
    else if (!in_tag) out += c;
  }
  return out;
}

std::string read_text_file(const std::string& path) {
  struct stat st {};
  VQ_CHECK(::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode), "text file '{}': not found or not a file", path);
  std::string text;
  if (ends_with(path, ".gz")) {
    for (char c : path)
      VQ_CHECK(c != '\'', "text file '{}': quote characters are not supported in a .gz path", path);
    FILE* p = ::popen(("gzip -dc '" + path + "'").c_str(), "r");
    VQ_CHECK(p, "text file '{}': cannot run gzip -dc", path);
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0 && text.size() <= kMaxTextFileBytes) text.append(buf, n);
    const int rc = ::pclose(p);
    VQ_CHECK(text.size() <= kMaxTextFileBytes, "text file '{}': decompresses to more than the limit of {}", path,
             format_size_limit(kMaxTextFileBytes));
    VQ_CHECK(rc == 0, "text file '{}': gzip -dc failed (status {})", path, rc);
  } else {
    text = read_input_file(path, kMaxTextFileBytes, "text file");
  }
  if (ends_with(path, ".html") || ends_with(path, ".htm") || ends_with(path, ".html.gz")) text = strip_html(text);
  VQ_CHECK(!text.empty(), "text file '{}' is empty", path);
  return text;
}

KVRecording record_kv(const Model& model, const std::vector<int32_t>& ids, int seg, const CalibProgress& progress,
                      KVDevice device) {
  const ModelConfig& mc = model.config();
  VQ_CHECK(seg >= 1, "calibrate: segment of {} tokens must be >= 1", seg);
  const int n = int(ids.size());
  KVRecording rec;
  rec.n_tokens = n;
  rec.keys.resize(size_t(mc.n_layers));
  rec.values.resize(size_t(mc.n_layers));
  for (int s0 = 0; s0 < n; s0 += seg) {
    const int ns = std::min(seg, n - s0);
    // The model runs with an fp16 cache; the observer records each layer's keys and values.
    Session s(model, KVSpec{KVCacheConfig{}, nullptr}, ns, Session::kDefaultChunk, size_t(-1), device);
    s.forward_pass().set_kv_observer([&](int layer, int, const float*, const float* k, const float* v, int m) {
      const size_t e = size_t(m) * mc.n_kv_heads * mc.head_dim;
      rec.keys[size_t(layer)].insert(rec.keys[size_t(layer)].end(), k, k + e);
      rec.values[size_t(layer)].insert(rec.values[size_t(layer)].end(), v, v + e);
    });
    const int chunk = 256;
    for (int done = 0; done < ns; done += chunk) {
      const int m = std::min(chunk, ns - done);
      s.forward(ids.data() + s0 + done, m, nullptr);
      if (progress) progress("prefill", s0 + done + m, n);
    }
  }
  return rec;
}

Calibration calibrate_recording(const Model& model, const KVRecording& rec, const KVCacheConfig& cfg,
                                const CalibTrainOptions& opt_in, const std::string& model_name,
                                const CalibProgress& progress) {
  const ModelConfig& mc = model.config();
  CalibTrainOptions opt = opt_in;
  opt.segment_tokens = opt.segment_tokens > 0 ? opt.segment_tokens : kCalibSegment;
  std::vector<const float*> k, v;
  for (int l = 0; l < mc.n_layers; ++l) {
    k.push_back(rec.keys[size_t(l)].data());
    v.push_back(rec.values[size_t(l)].data());
  }
  if (progress) opt.progress = [&](int d, int t) { progress("train", d, t); };
  return train_calibration(cfg, mc.n_kv_heads, mc.head_dim, k, v, rec.n_tokens, opt, model_name);
}

Calibration calibrate_model(const Model& model, const std::string& text, int max_tokens, const KVCacheConfig& cfg,
                            const CalibTrainOptions& opt, const std::string& model_name,
                            const CalibProgress& progress, KVDevice device) {
  cfg.validate(model.config().head_dim);
  VQ_CHECK(max_tokens >= 16, "calibrate: --tokens {} must be >= 16", max_tokens);
  std::vector<int32_t> ids = model.tokenizer().encode(text, model.tokenizer().add_bos_default());
  if (int(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
  VQ_CHECK(ids.size() >= 16, "calibrate: the text gives only {} tokens", ids.size());
  // The text runs as independent sequences of `seg` tokens (each from an empty cache): keys are
  // post-RoPE, so the positions seen in calibration shape the codebooks. Measured on SmolLM2 (KL
  // vs fp16 at context 1024, d4b8): 8192 tokens as one sequence 0.044, as 4 x 2048 0.030, 2048
  // tokens 0.027; positions far beyond the evaluated ones spread the centroids thin.
  const int seg = opt.segment_tokens > 0 ? opt.segment_tokens : kCalibSegment;
  return calibrate_recording(model, record_kv(model, ids, seg, progress, device), cfg, opt, model_name, progress);
}

KVCacheConfig first_use_calib_config(const KVCacheConfig& cfg) {
  KVCacheConfig c = cfg;
  // ~2048 tokens keep first use under a minute on 2 cores; 12-bit books then share one codebook
  // per head (4096 entries need more points than 2048 tokens give per sub-space).
  if (std::max(cfg.key.bits, cfg.value.bits) > 11) c.granularity = CodebookGranularity::shared;
  return c;
}

std::string default_calibration_text_path() {
  for (const char* p : {"/usr/share/doc/jargon-text/jargon.txt.gz", "/usr/share/doc/jargon-text/jargon.txt"}) {
    struct stat st {};
    if (::stat(p, &st) == 0) return p;
  }
  return "";
}

std::string default_calibration_path(const std::string& model_path, const KVCacheConfig& cfg) {
  // Only what the file depends on: the key/value presets and the codebook granularity (not the
  // cache's residual or sink lengths), plus the recipe tag kCalibRecipe: files of an older recipe
  // are not reused.
  std::string preset = cfg.key == cfg.value ? "vecinfer_" + cfg.key.name()
                                            : "vecinfer_k_" + cfg.key.name() + "_v_" + cfg.value.name();
  if (cfg.granularity == CodebookGranularity::shared) preset += "_shared";
  preset += kCalibRecipe;
  const std::string sha = sha256_file(model_path).substr(0, 16);
  return (std::filesystem::path(cache_dir()) / "calib" / (sha + "-" + preset + ".vqcal")).string();
}

std::string resolve_calibration(const Model& model, const std::string& model_path, bool is_default_model,
                                const KVCacheConfig& cfg, const std::string& calib_flag,
                                const CalibProgress& progress, bool* made) {
  if (made) *made = false;
  if (cfg.method != KVMethod::vecinfer) return "";
  if (!calib_flag.empty()) return calib_flag;
  if (cfg.calibration || !cfg.calibration_file.empty()) return cfg.calibration_file;
  VQ_CHECK(is_default_model, "{}", calibration_howto(cfg));
  const std::string path = default_calibration_path(model_path, cfg);
  if (std::filesystem::exists(path)) return path;
  const std::string text_path = default_calibration_text_path();
  VQ_CHECK(!text_path.empty(),
           "{} (the automatic first-use calibration of the default model needs the Jargon File: install the Debian "
           "package jargon-text, e.g. scripts/setup.sh)",
           calibration_howto(cfg));
  const KVCacheConfig c = first_use_calib_config(cfg);
  CalibTrainOptions opt;
  const Calibration cal = calibrate_model(model, read_text_file(text_path), kFirstUseCalibTokens, c, opt,
                                          std::filesystem::path(model_path).filename().string(), progress);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  save_calibration(path, cal);
  if (made) *made = true;
  return path;
}

}  // namespace vq
