#include "kvcache/seq_file_format.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/sha256.h"
#include "kvcache/kv_pool.h"

namespace vq {
namespace {

#define VQ_SESSION_CHECK(cond, ...)                                       \
  do {                                                                   \
    if (!(cond)) throw ::vq::SessionFileError(::vq::error_text(::fmt::format(__VA_ARGS__))); \
  } while (0)

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  template <class T>
  T get(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  const uint8_t* take(uint64_t n, const char* what) {
    VQ_SESSION_CHECK(n <= n_ - off_, "{}: session file is inconsistent: {} runs past the end", path_, what);
    const uint8_t* r = p_ + off_;
    off_ += size_t(n);
    return r;
  }
  size_t offset() const { return off_; }

 private:
  const uint8_t* p_;
  size_t n_, off_ = 0;
  const std::string& path_;
};

// a * b + c, or UINT64_MAX when it overflows (a bound that no file can meet).
uint64_t mul_add(uint64_t a, uint64_t b, uint64_t c) {
  unsigned __int128 r = (unsigned __int128)a * b + c;
  return r > UINT64_MAX ? UINT64_MAX : uint64_t(r);
}

// Index of the first non-finite value in n fp16 (es 2) or fp32 (es 4) values, or -1.
int64_t first_nonfinite(const uint8_t* p, size_t bytes, size_t es) {
  if (es == 2) {
    for (size_t i = 0; i < bytes / 2; ++i) {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      if ((h & 0x7c00u) == 0x7c00u) return int64_t(i);
    }
  } else {
    for (size_t i = 0; i < bytes / 4; ++i) {
      uint32_t f;
      std::memcpy(&f, p + 4 * i, 4);
      if ((f & 0x7f800000u) == 0x7f800000u) return int64_t(i);
    }
  }
  return -1;
}

}  // namespace

SessionHeader check_session_header(const uint8_t* p, size_t n, const std::string& path, const SessionExpect& e) {
  VQ_SESSION_CHECK(n >= 8 && std::memcmp(p, kSessionMagic, 8) == 0, "{}: not a session file (bad magic)", path);
  Reader r(p, n, path);
  r.take(8, "magic");
  VQ_SESSION_CHECK(n >= 12, "{}: not a session file (truncated: {} bytes)", path, n);
  const uint32_t version = r.get<uint32_t>("version");
  VQ_SESSION_CHECK(version != 1, "{}: session file version 1 (checked by an unkeyed XXH64 only) is no longer read; "
                   "this build reads version {}: save the session again", path, kSessionVersion);
  VQ_SESSION_CHECK(version == kSessionVersion, "{}: session file version {} is not supported (this build reads "
                   "version {})", path, version, kSessionVersion);
  VQ_SESSION_CHECK(n >= kSessionHeaderBytes, "{}: not a session file (truncated: {} bytes)", path, n);
  VQ_SESSION_CHECK(r.get<uint32_t>("header") == kSessionHeaderBytes, "{}: session file header size is wrong", path);
  SessionHeader h;
  h.file_bytes = r.get<uint64_t>("file bytes");
  const uint64_t model = r.get<uint64_t>("model"), spec = r.get<uint64_t>("spec"), calib = r.get<uint64_t>("calib");
  const uint32_t n_layers = r.get<uint32_t>("n_layers"), B = r.get<uint32_t>("block_tokens");
  const uint32_t H = r.get<uint32_t>("n_kv_heads"), D = r.get<uint32_t>("head_dim");
  const uint64_t dbytes = r.get<uint64_t>("dense bytes");
  h.n_kv = r.get<int64_t>("n_kv");
  h.n_tokens = r.get<uint64_t>("n_tokens");
  h.model_name_bytes = r.get<uint32_t>("model name");
  h.spec_name_bytes = r.get<uint32_t>("spec name");
  VQ_SESSION_CHECK(h.model_name_bytes <= kSessionMaxNameBytes && h.spec_name_bytes <= kSessionMaxNameBytes,
                   "{}: session file is inconsistent: names of {} and {} bytes (at most {})", path,
                   h.model_name_bytes, h.spec_name_bytes, kSessionMaxNameBytes);
  // The names are only for messages; they follow the header when the file holds them.
  const bool names_here = n >= uint64_t(kSessionHeaderBytes) + h.model_name_bytes + h.spec_name_bytes;
  const std::string model_name =
      names_here ? std::string(reinterpret_cast<const char*>(p) + kSessionHeaderBytes, h.model_name_bytes) : "?";
  const std::string spec_name =
      names_here ? std::string(reinterpret_cast<const char*>(p) + kSessionHeaderBytes + h.model_name_bytes,
                               h.spec_name_bytes)
                 : "?";
  VQ_SESSION_CHECK(model == e.id.model, "{}: session was made with model {} (checksum {}), not {} (checksum {})",
                   path, model_name, hex(model), e.id.model_name, hex(e.id.model));
  VQ_SESSION_CHECK(spec == e.id.spec, "{}: session was made with KV cache {} (checksum {}), not {} (checksum {})",
                   path, spec_name, hex(spec), e.id.spec_name, hex(e.id.spec));
  VQ_SESSION_CHECK(calib == e.id.calibration,
                   "{}: session was made with another calibration (checksum {}, this one {})", path, hex(calib),
                   hex(e.id.calibration));
  VQ_SESSION_CHECK(n_layers == e.n_layers && B == e.block_tokens && H == e.n_kv_heads && D == e.head_dim &&
                       dbytes == e.dense_block_bytes && e.coded_block_bytes.size() == n_layers && B > 0,
                   "{}: session geometry ({} layers, {} KV heads of {}, blocks of {} tokens) differs from the "
                   "cache's",
                   path, n_layers, H, D, B);
  VQ_SESSION_CHECK(h.n_kv >= 0 && uint64_t(h.n_kv) <= h.n_tokens && h.n_tokens <= kSessionMaxTokens,
                   "{}: session holds {} KV tokens and {} token ids (at most {})", path, h.n_kv, h.n_tokens,
                   kSessionMaxTokens);
  // The largest file this header allows: every block with every form present.
  const uint64_t nb = (uint64_t(h.n_kv) + B - 1) / B;
  uint64_t per_block = dbytes;
  for (uint64_t c : e.coded_block_bytes) per_block = std::max(per_block, dbytes + c);
  h.max_payload_bytes = mul_add(mul_add(nb, per_block, 0), n_layers, 0);
  uint64_t bound = mul_add(h.n_tokens, 4, uint64_t(kSessionHeaderBytes) + h.model_name_bytes + h.spec_name_bytes +
                                              kSessionDigestBytes);
  bound = mul_add(n_layers, 8 + 4 + nb, bound);
  bound = h.max_payload_bytes > UINT64_MAX - bound ? UINT64_MAX : bound + h.max_payload_bytes;
  VQ_SESSION_CHECK(h.file_bytes <= bound, "{}: session file is inconsistent: it declares {} bytes, its header "
                   "allows at most {}", path, h.file_bytes, bound);
  return h;
}

ParsedSession parse_session(const uint8_t* data, size_t n, const std::string& path, const SessionExpect& e) {
  VQ_SESSION_CHECK(n >= kSessionHeaderBytes + kSessionDigestBytes, "{}: not a session file (truncated: {} bytes)",
                   path, n);
  const SessionHeader h = check_session_header(data, n, path, e);
  VQ_SESSION_CHECK(n >= h.file_bytes, "{}: session file is truncated ({} of {} bytes)", path, n, h.file_bytes);
  VQ_SESSION_CHECK(n == h.file_bytes, "{}: session file has {} trailing bytes", path, n - h.file_bytes);
  const size_t body = n - kSessionDigestBytes;
  const std::array<uint8_t, 32> digest = [&] {
    Sha256 s;
    s.update(data, body);
    return s.finish();
  }();
  VQ_SESSION_CHECK(std::memcmp(digest.data(), data + body, kSessionDigestBytes) == 0,
                   "{}: session file is corrupted (SHA-256 checksum mismatch)", path);
  Reader r(data, body, path);
  r.take(kSessionHeaderBytes, "header");
  r.take(h.model_name_bytes, "model name");
  r.take(h.spec_name_bytes, "spec name");
  ParsedSession out;
  out.n_kv = h.n_kv;
  const uint8_t* toks = r.take(h.n_tokens * sizeof(int32_t), "tokens");
  out.tokens.resize(size_t(h.n_tokens));
  if (h.n_tokens > 0) std::memcpy(out.tokens.data(), toks, size_t(h.n_tokens) * sizeof(int32_t));
  const size_t nb = size_t((uint64_t(h.n_kv) + e.block_tokens - 1) / e.block_tokens);
  const size_t es = e.dense_f32 ? 4 : 2;
  out.blocks.resize(e.n_layers);
  for (uint32_t l = 0; l < e.n_layers; ++l) {
    const uint64_t cbytes = r.get<uint64_t>("coded bytes");
    VQ_SESSION_CHECK(cbytes == e.coded_block_bytes[l], "{}: layer {} coded blocks of {} bytes, the cache's are {}",
                     path, l, cbytes, e.coded_block_bytes[l]);
    VQ_SESSION_CHECK(r.get<uint32_t>("n_blocks") == nb, "{}: layer {} block count differs from {} tokens", path, l,
                     h.n_kv);
    const uint8_t* forms = r.take(nb, "block forms");
    out.blocks[l].resize(nb);
    for (size_t j = 0; j < nb; ++j) {
      VQ_SESSION_CHECK(forms[j] < 4 && (!(forms[j] & 2) || cbytes > 0), "{}: layer {} block {} has bad forms {}",
                       path, l, j, forms[j]);
      if (forms[j] & 1) {
        const uint8_t* d = r.take(e.dense_block_bytes, "dense block");
        const int64_t bad = first_nonfinite(d, e.dense_block_bytes, es);
        VQ_SESSION_CHECK(bad < 0, "{}: layer {} block {} holds a non-finite value (dense value {})", path, l, j, bad);
        out.blocks[l][j].dense = d;
      }
      if (forms[j] & 2) {
        const uint8_t* c = r.take(cbytes, "coded block");
        VQ_SESSION_CHECK(!e.coded_finite || e.coded_finite(int(l), c),
                         "{}: layer {} block {} holds a non-finite value (a coded block's scale)", path, l, j);
        out.blocks[l][j].coded = c;
      }
    }
  }
  VQ_SESSION_CHECK(r.offset() == body, "{}: session file has unread bytes before its checksum", path);
  return out;
}

namespace {

// A session file opened for reading: a regular file reached without following a symbolic link at
// its last component (no directory, device, pipe or link). O_NONBLOCK: opening a FIFO must not
// wait for a writer (it is refused anyway).
class SessionFileIn {
 public:
  explicit SessionFileIn(const std::string& path) : path_(path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd_ < 0) {
      const int err = errno;
      VQ_SESSION_CHECK(err != ELOOP, "{}: is a symbolic link; session files are read only as regular files", path);
      throw SessionFileError(fmt::format("{}: cannot open the session file: {}", path, std::strerror(err)));
    }
    struct stat st{};
    if (::fstat(fd_, &st) != 0) {
      const int err = errno;
      ::close(fd_);
      throw SessionFileError(fmt::format("{}: cannot stat the session file: {}", path, std::strerror(err)));
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd_);
      VQ_SESSION_CHECK(!S_ISDIR(st.st_mode), "{}: is a directory, not a session file", path);
      throw SessionFileError(
          fmt::format("{}: is not a regular file (a device, pipe or socket), not a session file", path));
    }
    size_ = uint64_t(st.st_size);
  }
  ~SessionFileIn() { ::close(fd_); }
  SessionFileIn(const SessionFileIn&) = delete;
  SessionFileIn& operator=(const SessionFileIn&) = delete;
  uint64_t size() const { return size_; }
  void read_at(uint8_t* dst, size_t n, uint64_t off) const {
    size_t got = 0;
    while (got < n) {
      const ssize_t k = ::pread(fd_, dst + got, n - got, off_t(off + got));
      if (k < 0 && errno == EINTR) continue;
      VQ_SESSION_CHECK(k >= 0, "{}: read error: {}", path_, std::strerror(errno));
      VQ_SESSION_CHECK(k > 0, "{}: session file is truncated (it shrank while read)", path_);
      got += size_t(k);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

// The bytes of a session file's block payloads beyond its fixed fields, refused past the reader's
// budget before they are read.
void check_payload_bound(const SessionHeader& h, uint64_t size, const std::string& path, const SessionExpect& e) {
  const uint64_t fixed = uint64_t(kSessionHeaderBytes) + h.model_name_bytes + h.spec_name_bytes + h.n_tokens * 4 +
                         uint64_t(e.n_layers) * (12 + (uint64_t(h.n_kv) + e.block_tokens - 1) / e.block_tokens) +
                         kSessionDigestBytes;
  if (size > fixed && size - fixed > e.max_payload_bytes)
    throw KVPoolExhausted(fmt::format("{}: the session holds {} bytes of KV blocks, more than the KV budget of {} "
                                      "bytes", path, size - fixed, e.max_payload_bytes));
}

}  // namespace

std::vector<uint8_t> read_session_file(const std::string& path, const SessionExpect& e) {
  const SessionFileIn f(path);
  const uint64_t size = f.size();
  // The header (and the names after it, for messages) first: its fields bound the file's size
  // before the payload is read.
  const size_t head = size_t(std::min<uint64_t>(size, kSessionHeaderBytes + 2 * uint64_t(kSessionMaxNameBytes)));
  std::vector<uint8_t> data(head);
  f.read_at(data.data(), head, 0);
  if (head >= 16 && std::memcmp(data.data(), kTPSessionMagic, 8) == 0) {
    uint32_t tp = 0;
    std::memcpy(&tp, data.data() + 12, 4);
    throw SessionFileError(fmt::format("{}: was saved split over {} tensor-parallel ranks; load it with --tp {}", path,
                                       tp, tp));
  }
  const SessionHeader h = check_session_header(data.data(), data.size(), path, e);
  VQ_SESSION_CHECK(size >= h.file_bytes, "{}: session file is truncated ({} of {} bytes)", path, size, h.file_bytes);
  VQ_SESSION_CHECK(size == h.file_bytes, "{}: session file has {} trailing bytes", path, size - h.file_bytes);
  check_payload_bound(h, size, path, e);
  data.resize(size_t(size));
  f.read_at(data.data() + head, size_t(size) - head, head);
  return data;
}

TPSessionBytes read_tp_session_file(const std::string& path, const std::vector<SessionExpect>& e) {
  const SessionFileIn f(path);
  const uint64_t size = f.size();
  const uint32_t want = uint32_t(e.size());
  std::vector<uint8_t> head(size_t(std::min<uint64_t>(size, 24)));
  f.read_at(head.data(), head.size(), 0);
  if (head.size() >= 8 && std::memcmp(head.data(), kSessionMagic, 8) == 0)
    throw SessionFileError(fmt::format("{}: was saved unsplit (tp 1); load it without --tp (or --tp 1)", path));
  VQ_SESSION_CHECK(head.size() == 24 && std::memcmp(head.data(), kTPSessionMagic, 8) == 0,
                   "{}: not a session file (bad magic)", path);
  uint32_t version = 0, tp = 0;
  uint64_t declared = 0;
  std::memcpy(&version, head.data() + 8, 4);
  std::memcpy(&tp, head.data() + 12, 4);
  std::memcpy(&declared, head.data() + 16, 8);
  VQ_SESSION_CHECK(version == kTPSessionVersion, "{}: split session file version {} (this build reads {})", path,
                   version, kTPSessionVersion);
  VQ_SESSION_CHECK(tp == want, "{}: was saved split over {} tensor-parallel ranks; this session has {} (load it with "
                   "--tp {})", path, tp, want, tp);
  const uint64_t table_end = 24 + 8 * uint64_t(tp);
  VQ_SESSION_CHECK(size >= table_end + kSessionDigestBytes, "{}: split session file is truncated ({} bytes)", path,
                   size);
  std::vector<uint64_t> part_bytes(tp);
  f.read_at(reinterpret_cast<uint8_t*>(part_bytes.data()), 8 * size_t(tp), 24);
  // Each part's header, checked against its rank's store, bounds that part before it is read.
  uint64_t off = table_end;
  for (uint32_t r = 0; r < tp; ++r) {
    const std::string part = fmt::format("{} (rank {})", path, r);
    VQ_SESSION_CHECK(part_bytes[r] >= kSessionHeaderBytes && off <= size && part_bytes[r] <= size - off,
                     "{}: part of {} bytes at offset {} runs past the file's {} bytes", part, part_bytes[r], off, size);
    std::vector<uint8_t> ph(size_t(std::min<uint64_t>(part_bytes[r], kSessionHeaderBytes + 2 * uint64_t(kSessionMaxNameBytes))));
    f.read_at(ph.data(), ph.size(), off);
    const SessionHeader h = check_session_header(ph.data(), ph.size(), part, e[r]);
    VQ_SESSION_CHECK(h.file_bytes == part_bytes[r], "{}: its header says {} bytes, the file's table {}", part,
                     h.file_bytes, part_bytes[r]);
    check_payload_bound(h, part_bytes[r], part, e[r]);
    off += part_bytes[r];
  }
  VQ_SESSION_CHECK(declared == off + kSessionDigestBytes, "{}: split session file declares {} bytes, its parts {}",
                   path, declared, off + kSessionDigestBytes);
  VQ_SESSION_CHECK(size >= declared, "{}: session file is truncated ({} of {} bytes)", path, size, declared);
  VQ_SESSION_CHECK(size == declared, "{}: session file has {} trailing bytes", path, size - declared);
  TPSessionBytes out;
  out.bytes.resize(size_t(size));
  f.read_at(out.bytes.data(), size_t(size), 0);
  Sha256 sha;
  sha.update(out.bytes.data(), size_t(size) - kSessionDigestBytes);
  const std::array<uint8_t, 32> d = sha.finish();
  VQ_SESSION_CHECK(std::memcmp(d.data(), out.bytes.data() + size - kSessionDigestBytes, 32) == 0,
                   "{}: split session file fails its SHA-256 (corrupted)", path);
  off = table_end;
  for (uint32_t r = 0; r < tp; ++r) {
    out.parts.emplace_back(size_t(off), size_t(part_bytes[r]));
    off += part_bytes[r];
  }
  return out;
}

bool is_session_temp_name(const std::string& name) {
  const size_t p = name.find(".vqkv.tmp.");
  return p != std::string::npos && p > 0;
}

int remove_stale_session_temps(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  int removed = 0;
  while (const dirent* ent = ::readdir(d)) {
    const std::string name = ent->d_name;
    if (!is_session_temp_name(name)) continue;
    // <name>.vqkv.tmp.<pid>.<n>: a save still being written by a live process is left alone.
    const std::string rest = name.substr(name.find(".vqkv.tmp.") + 10);
    const long pid = std::strtol(rest.c_str(), nullptr, 10);
    if (pid > 0 && (::kill(pid_t(pid), 0) == 0 || errno == EPERM)) continue;
    struct stat st{};
    const std::string p = dir + "/" + name;
    if (::lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(p.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

}  // namespace vq
