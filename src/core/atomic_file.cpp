#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"

namespace vq {

void write_file_atomic(const std::string& path, const void* data, size_t n) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  VQ_CHECK(fd >= 0, "{}: cannot create: {}", tmp, std::strerror(errno));
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
    VQ_FAIL("{}: rename from {} failed: {}", path, tmp, std::strerror(e));
  }
}

}  // namespace vq
