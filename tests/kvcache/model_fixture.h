#pragma once
// Shared by the kvcache tests that need the real model (SmolLM2-135M-Instruct, installed by
// scripts/setup.sh): loads it once per process, and reads the real English texts of the quality harness.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "eval/calibrate.h"
#include "model_fetch/model_fetch.h"
#include "model/model.h"

namespace vq::model_test {

// nullptr (and the caller skips) when the default model is not installed.
inline const Model* smollm2() {
  static std::unique_ptr<Model> m = [] {
    std::unique_ptr<Model> r;
    if (default_model_present()) r = Model::load(default_model_location());
    return r;
  }();
  return m.get();
}

#define VQ_REQUIRE_MODEL(m)                                                                          \
  const ::vq::Model* m = ::vq::model_test::smollm2();                                                   \
  if (!m)                                                                                            \
    GTEST_SKIP() << "the default model " << ::vq::default_model_location()                         \
                 << " is absent: run scripts/setup.sh (it installs SmolLM2-135M-Instruct)"

// Minutes of real-model arithmetic that the sanitizer build only slows down (each such test ran
// 2-5 minutes under ASan on the CI's 2 cores): the release run checks the numbers; under the
// sanitizers RealActivations.RecordingSeesTheModel still drives the same model code.
#if defined(__SANITIZE_ADDRESS__)
#define VQ_SKIP_UNDER_SANITIZER() GTEST_SKIP() << "real-model arithmetic: checked by the release build, not under ASan"
#else
#define VQ_SKIP_UNDER_SANITIZER() (void)0
#endif

// Text of a file ("" when unreadable).
inline std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Real English texts installed by scripts/setup.sh: the held-out evaluation text (python3-doc's
// tutorial on classes) and the calibration text (the Jargon File, jargon-text). "" when absent.
inline std::string eval_text() { return read_text("/usr/share/doc/python3/html/_sources/tutorial/classes.rst.txt"); }
inline std::string calib_text() {
  const std::string p = default_calibration_text_path();
  return p.empty() ? std::string() : read_text_file(p);
}

// The first n tokens of text (with BOS); fewer when the text is short.
inline std::vector<int32_t> first_tokens(const Model& m, const std::string& text, size_t n) {
  auto ids = m.tokenizer().encode(text, true);
  if (ids.size() > n) ids.resize(n);
  return ids;
}

}  // namespace vq::model_test
