#include "core/cache_dir.h"

#include <filesystem>

#include "core/env.h"
#include "core/error.h"

namespace vq {

std::string cache_dir() {
  namespace fs = std::filesystem;
  if (const std::string d = env_or_empty("VQ_CACHE_DIR"); !d.empty()) return d;
  if (const std::string x = env_or_empty("XDG_CACHE_HOME"); !x.empty()) return (fs::path(x) / "veloxquant").string();
  const std::string home = env_or_empty("HOME");
  VQ_CHECK(!home.empty(), "cache folder: none of $VQ_CACHE_DIR, $XDG_CACHE_HOME, $HOME is set");
  return (fs::path(home) / ".cache" / "veloxquant").string();
}

}  // namespace vq
