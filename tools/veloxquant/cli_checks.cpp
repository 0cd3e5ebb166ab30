#include "cli_checks.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "core/text_escape.h"
#include "veloxquant/kv_spec.h"

namespace vq::cli {

void check_cache_flags(const KVCacheConfig& cfg, const std::string& calib_flag) {
  VQ_CHECK(calib_flag.empty() || veloxquant::kv_cache_needs_calibration(cfg),
           "--calib: the kv cache {} uses no calibration (only vecinfer does)", cfg.name());
}

void check_cache_fits_model(const KVCacheConfig& cfg, int head_dim, const std::string& model_path) {
  try {
    cfg.validate(head_dim);
  } catch (const Error& e) {
    VQ_FAIL("--kv-cache {} does not fit {} (head_dim {}): {}", cfg.name(), model_path, head_dim, e.what());
  }
}

void check_logits_finite(const float* logits, int n_vocab, int64_t pos) {
  for (int i = 0; i < n_vocab; ++i)
    VQ_CHECK(std::isfinite(logits[i]),
             "the model produced a non-finite logit ({} for token id {}) at position {}: its weights or the KV "
             "cache hold NaN or inf values",
             logits[i], i, pos);
}

void check_trained_context(int64_t n, int64_t n_ctx_train, bool allow_longer, const std::string& what) {
  VQ_CHECK(n <= kMaxContextTokens, "{}: {} tokens is more than the {} tokens of context this build runs", what, n,
           kMaxContextTokens);
  const int64_t trained = n_ctx_train;
  if (trained <= 0 || n <= trained) return;
  VQ_CHECK(allow_longer,
           "{}: {} tokens, past the model's trained context of {} tokens (give --allow-longer-context to run past "
           "it anyway)",
           what, n, trained);
  std::fprintf(stderr, "veloxquant: warning: %s: %lld tokens, past the model's trained context of %lld tokens "
               "(--allow-longer-context): expect worse output past it\n",
               escape_control(what).c_str(), (long long)n, (long long)trained);
}

void warn_kv_quality(const veloxquant::KVSpec& spec) {
  const std::string w = spec.quality_warning();
  if (!w.empty()) std::fprintf(stderr, "veloxquant: warning: %s\n", escape_control(w).c_str());
}

void check_kv_budget_holds_a_block(size_t budget, double mib, size_t one, const std::string& kv_name) {
  VQ_CHECK(budget >= one,
           "--kv-budget: {} ({} bytes) cannot hold one block per layer of the {} cache ({} bytes, {:.3f} MiB); give "
           "at least that",
           mib > 0 ? fmt::format("{} MiB", mib) : std::string("the default budget"), budget, kv_name, one,
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
