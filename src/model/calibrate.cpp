#include "model/calibrate.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "kvcache/factory.h"
#include "kvcache/recording_cache.h"
#include "model/default_model.h"
#include "model/sha256.h"

namespace vq {

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
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) text.append(buf, n);
    const int rc = ::pclose(p);
    VQ_CHECK(rc == 0, "text file '{}': gzip -dc failed (status {})", path, rc);
  } else {
    std::ifstream f(path, std::ios::binary);
    VQ_CHECK(f, "text file '{}': cannot open", path);
    std::stringstream ss;
    ss << f.rdbuf();
    text = ss.str();
  }
  if (ends_with(path, ".html") || ends_with(path, ".htm") || ends_with(path, ".html.gz")) text = strip_html(text);
  VQ_CHECK(!text.empty(), "text file '{}' is empty", path);
  return text;
}

Calibration calibrate_model(const Model& model, const std::string& text, int max_tokens, const KVCacheConfig& cfg,
                            const CalibTrainOptions& opt_in, const std::string& model_name,
                            const CalibProgress& progress) {
  const ModelConfig& mc = model.config();
  cfg.validate(mc.head_dim);
  VQ_CHECK(max_tokens >= 16, "calibrate: --tokens {} must be >= 16", max_tokens);
  std::vector<int32_t> ids = model.tokenizer().encode(text, model.tokenizer().add_bos_default());
  if (int(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
  const int n = int(ids.size());
  VQ_CHECK(n >= 16, "calibrate: the text gives only {} tokens", n);
  std::vector<RecordingCache*> rec(size_t(mc.n_layers));
  KVCacheFactory fac = [&](int layer, const KVGeometry& g) -> std::unique_ptr<KVCache> {
    auto c = std::make_unique<RecordingCache>(g);
    rec[size_t(layer)] = c.get();
    return c;
  };
  Session s(model, fac, n);
  const int chunk = 256;
  for (int done = 0; done < n; done += chunk) {
    const int m = std::min(chunk, n - done);
    s.forward(ids.data() + done, m, nullptr);
    if (progress) progress("prefill", done + m, n);
  }
  std::vector<const float*> k, v;
  for (auto* r : rec) {
    k.push_back(r->keys().data());
    v.push_back(r->values().data());
  }
  CalibTrainOptions opt = opt_in;
  if (progress) opt.progress = [&](int d, int t) { progress("train", d, t); };
  return train_calibration(cfg, mc.n_kv_heads, mc.head_dim, k, v, n, opt, model_name);
}

std::string default_calibration_text_path() {
  for (const char* p : {"/usr/share/doc/jargon-text/jargon.txt.gz", "/usr/share/doc/jargon-text/jargon.txt"}) {
    struct stat st {};
    if (::stat(p, &st) == 0) return p;
  }
  return "";
}

std::string default_calibration_path(const std::string& model_path, const KVCacheConfig& cfg) {
  const std::filesystem::path models = default_model_dir();
  std::string preset = cfg.name();
  for (char& c : preset)
    if (c == ':' || c == ',' || c == '=') c = '_';
  const std::string sha = sha256_file(model_path).substr(0, 16);
  return (models.parent_path() / "calib" / (sha + "-" + preset + ".vqcal")).string();
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
  KVCacheConfig c = cfg;
  // ~2048 tokens keep first use under a minute on 2 cores; 12-bit books then share one codebook
  // per head (4096 entries need more points than 2048 tokens give per sub-space).
  const int tokens = 2048;
  if (std::max(cfg.key.bits, cfg.value.bits) > 11) c.granularity = CodebookGranularity::shared;
  CalibTrainOptions opt;
  const Calibration cal = calibrate_model(model, read_text_file(text_path), tokens, c, opt,
                                          std::filesystem::path(model_path).filename().string(), progress);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  save_calibration(path, cal);
  if (made) *made = true;
  return path;
}

}  // namespace vq
