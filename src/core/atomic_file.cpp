#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace vq {

namespace {
// The directory a file of this path lives in ("." for a bare name).
std::string dir_of(const std::string& path) {
  const std::string d = std::filesystem::path(path).parent_path().string();
  return d.empty() ? "." : d;
}
}  // namespace

void write_file_atomic(const std::string& path, const void* data, size_t n) {
  // Unique per process and call, so two threads writing the same path never share a temporary.
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  VQ_CHECK(fd >= 0, "{}: cannot write (creating a temporary file in {}): {}", path, dir_of(path),
           std::strerror(errno));
  const auto* p = static_cast<const char*>(data);
  size_t left = n;
  while (left > 0) {
    const ssize_t w = ::write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      VQ_FAIL("{}: write failed after {} of {} bytes: {}", path, n - left, n, std::strerror(e));
    }
    p += w;
    left -= size_t(w);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    VQ_FAIL("{}: flush failed: {}", path, std::strerror(e));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    VQ_FAIL("{}: cannot replace it with the new file: {}", path, std::strerror(e));
  }
}

void check_output_path(const std::string& path, const std::string& what) {
  VQ_CHECK(!path.empty(), "{}: the output path is empty", what);
  VQ_CHECK(path.back() != '/' && std::filesystem::path(path).filename() != "." &&
               std::filesystem::path(path).filename() != "..",
           "{} '{}': names a directory, not a file", what, path);
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0) {
    VQ_CHECK(!S_ISDIR(st.st_mode), "{} '{}': is a directory", what, path);
    // The file is replaced by a rename: a device or pipe would be replaced, not written to.
    VQ_CHECK(S_ISREG(st.st_mode), "{} '{}': exists and is not a regular file", what, path);
  }
  const std::string dir = dir_of(path);
  VQ_CHECK(::stat(dir.c_str(), &st) == 0, "{} '{}': directory '{}' does not exist", what, path, dir);
  VQ_CHECK(S_ISDIR(st.st_mode), "{} '{}': '{}' is not a directory", what, path, dir);
  VQ_CHECK(::access(dir.c_str(), W_OK | X_OK) == 0, "{} '{}': directory '{}' is not writable: {}", what, path, dir,
           std::strerror(errno));
}

}  // namespace vq
