#include "cli_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "codec/calibration_check.h"
#include "core/error.h"
#include "core/text_escape.h"
#include "kvcache/kv_method.h"
#include "kvcache/kv_store.h"

namespace vq::cli {

void check_cache_flags(const KVCacheConfig& cfg, const std::string& calib_flag) {
  VQ_CHECK(calib_flag.empty() || kv_method(cfg.method).needs_calibration(),
           "--calib: the kv cache {} uses no calibration (only vecinfer does)", cfg.name());
}

void check_cache_fits_model(const KVCacheConfig& cfg, const Model& model, const std::string& model_path) {
  try {
    cfg.validate(model.config().head_dim);
  } catch (const Error& e) {
    VQ_FAIL("--kv-cache {} does not fit {} (head_dim {}): {}", cfg.name(), model_path, model.config().head_dim,
            e.what());
  }
}

KVSpec make_checked_spec(KVCacheConfig cfg, const Model& model, const std::string& calib_path, bool auto_calib,
                         const std::string& model_path) {
  if (kv_method(cfg.method).needs_calibration() && !calib_path.empty()) {
    auto calib = std::make_shared<const Calibration>(load_calibration(calib_path));
    if (auto_calib)
      cfg.granularity = calib->granularity == Granularity::shared ? CodebookGranularity::shared
                                                                  : CodebookGranularity::per_subspace;
    try {
      check_calibration_matches(*calib, cfg, model.kv_geometry(), model.config().n_layers);
      // A file the user named must be this model's; the first-use one is found by the model's
      // SHA-256 already (eval/calibrate.h), whatever the file is called now.
      if (!auto_calib)
        check_calibration_model(*calib, std::filesystem::path(model_path).filename().string(), model.config().name);
    } catch (const Error& e) {
      VQ_FAIL("{}: {}", calib_path, e.what());
    }
    cfg.calibration = std::move(calib);
    return make_kv_spec(cfg);
  }
  return make_kv_spec(cfg, calib_path);
}

void check_weights_finite(const Model& model, const std::string& model_path) {
  for (const GGUFTensorInfo& t : model.gguf().tensors()) {
    if (!ggml_type_supported(t.type) || t.dims.empty()) continue;  // unused, or refused where used
    const int64_t at = find_non_finite(t.type, t.data, t.numel());
    VQ_CHECK(at < 0, "{}: tensor '{}' ({}) holds a NaN or inf {} at element {}", model_path, t.name,
             ggml_type_name(t.type), ggml_block_elems(t.type) == 1 ? "value" : "block scale", at);
  }
}

void check_logits_finite(const float* logits, int n_vocab, int64_t pos) {
  for (int i = 0; i < n_vocab; ++i)
    VQ_CHECK(std::isfinite(logits[i]),
             "the model produced a non-finite logit ({} for token id {}) at position {}: its weights or the KV "
             "cache hold NaN or inf values",
             logits[i], i, pos);
}

void check_trained_context(int64_t n, const Model& model, bool allow_longer, const std::string& what) {
  VQ_CHECK(n <= kMaxContextTokens, "{}: {} tokens is more than the {} tokens of context this build runs", what, n,
           kMaxContextTokens);
  const int64_t trained = model.config().n_ctx_train;
  if (trained <= 0 || n <= trained) return;
  VQ_CHECK(allow_longer,
           "{}: {} tokens, past the model's trained context of {} tokens (give --allow-longer-context to run past "
           "it anyway)",
           what, n, trained);
  std::fprintf(stderr, "veloxquant: warning: %s: %lld tokens, past the model's trained context of %lld tokens "
               "(--allow-longer-context): expect worse output past it\n",
               escape_control(what).c_str(), (long long)n, (long long)trained);
}

void check_kv_budget_holds_a_block(size_t budget, double mib, const KVStore& kv) {
  size_t one = 0;  // one block of each form per layer
  for (int l = 0; l < kv.n_layers(); ++l) one += kv.dense_block_bytes() + kv.coded_block_bytes(l);
  VQ_CHECK(budget >= one,
           "--kv-budget: {} ({} bytes) cannot hold one block per layer of the {} cache ({} bytes, {:.3f} MiB); give "
           "at least that",
           mib > 0 ? fmt::format("{} MiB", mib) : std::string("the default budget"), budget, kv.name(), one,
           double(one) / 1048576.0);
}

void check_session_dir(const std::string& dir, bool given) {
  VQ_CHECK(!dir.empty(), "--session-dir: the path is empty");
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) {
    VQ_CHECK(!given, "--session-dir '{}': does not exist (create it first)", dir);
    return;
  }
  VQ_CHECK(S_ISDIR(st.st_mode), "--session-dir '{}': is not a directory", dir);
  VQ_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "--session-dir '{}': is not writable: {}", dir,
           std::strerror(errno));
}

void check_session_input(const std::string& path, const std::string& what) {
  struct stat st{};
  VQ_CHECK(::lstat(path.c_str(), &st) == 0, "{} '{}': {}", what, path, std::strerror(errno));
  VQ_CHECK(!S_ISLNK(st.st_mode), "{} '{}': is a symbolic link; session files are read only as regular files", what,
           path);
  VQ_CHECK(!S_ISDIR(st.st_mode), "{} '{}': is a directory, not a session file", what, path);
  VQ_CHECK(S_ISREG(st.st_mode), "{} '{}': is not a regular file (a device, pipe or socket)", what, path);
  VQ_CHECK(::access(path.c_str(), R_OK) == 0, "{} '{}': cannot be read: {}", what, path, std::strerror(errno));
}

std::string printable(const std::string& text) { return escape_control(text); }

}  // namespace vq::cli
