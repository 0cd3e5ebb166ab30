#include "core/input_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace vq {

std::string format_size_limit(uint64_t bytes) {
  if (bytes >= (uint64_t(1) << 20) && bytes % (uint64_t(1) << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes >= 1024 && bytes % 1024 == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} bytes", bytes);
}

std::string read_input_file(const std::string& path, uint64_t max_bytes, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  VQ_CHECK(fd >= 0, "{} '{}': cannot open: {}", what, path, std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st{};
  VQ_CHECK(::fstat(fd, &st) == 0, "{} '{}': cannot stat: {}", what, path, std::strerror(errno));
  VQ_CHECK(!S_ISDIR(st.st_mode), "{} '{}': is a directory", what, path);
  // A regular file's size is known up front; a pipe is read up to one byte past the limit.
  VQ_CHECK(!S_ISREG(st.st_mode) || uint64_t(st.st_size) <= max_bytes, "{} '{}': {} bytes exceeds the limit of {}",
           what, path, uint64_t(st.st_size), format_size_limit(max_bytes));
  std::string out;
  if (S_ISREG(st.st_mode)) out.reserve(size_t(st.st_size));
  char buf[65536];
  for (;;) {
    const ssize_t r = ::read(fd, buf, sizeof buf);
    if (r < 0 && errno == EINTR) continue;
    VQ_CHECK(r >= 0, "{} '{}': read failed after {} bytes: {}", what, path, out.size(), std::strerror(errno));
    if (r == 0) break;
    out.append(buf, size_t(r));
    VQ_CHECK(out.size() <= max_bytes, "{} '{}': more than the limit of {}", what, path, format_size_limit(max_bytes));
  }
  return out;
}

}  // namespace vq
