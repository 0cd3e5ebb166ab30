// SHA-256 as specified in FIPS 180-4, sections 4.1.2 (functions), 4.2.2 (constants),
// 5.1.1 (padding), 5.3.3 (initial hash value) and 6.2.2 (hash computation).
#include "core/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

namespace vq {
namespace {

constexpr uint32_t kK[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

}  // namespace

Sha256::Sha256()
    : h_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::block(const uint8_t* p) {
  uint32_t w[64];
  for (int t = 0; t < 16; ++t) {
    w[t] = uint32_t(p[4 * t]) << 24 | uint32_t(p[4 * t + 1]) << 16 | uint32_t(p[4 * t + 2]) << 8 | p[4 * t + 3];
  }
  for (int t = 16; t < 64; ++t) {
    const uint32_t s0 = rotr(w[t - 15], 7) ^ rotr(w[t - 15], 18) ^ (w[t - 15] >> 3);
    const uint32_t s1 = rotr(w[t - 2], 17) ^ rotr(w[t - 2], 19) ^ (w[t - 2] >> 10);
    w[t] = w[t - 16] + s0 + w[t - 7] + s1;
  }
  uint32_t a = h_[0], b = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
  for (int t = 0; t < 64; ++t) {
    const uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    const uint32_t ch = (e & f) ^ (~e & g);
    const uint32_t t1 = h + S1 + ch + kK[t] + w[t];
    const uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    const uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    const uint32_t t2 = S0 + maj;
    h = g; g = f; f = e; e = d + t1; d = c; c = b; b = a; a = t1 + t2;
  }
  h_[0] += a; h_[1] += b; h_[2] += c; h_[3] += d; h_[4] += e; h_[5] += f; h_[6] += g; h_[7] += h;
}

void Sha256::update(const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_ += n;
  if (buf_n_) {
    const size_t take = std::min(n, size_t(64) - buf_n_);
    std::memcpy(buf_ + buf_n_, p, take);
    buf_n_ += take; p += take; n -= take;
    if (buf_n_ < 64) return;
    block(buf_);
    buf_n_ = 0;
  }
  for (; n >= 64; p += 64, n -= 64) block(p);
  std::memcpy(buf_, p, n);
  buf_n_ = n;
}

std::array<uint8_t, 32> Sha256::finish() {
  // Padding: 0x80, zeros to 56 mod 64, then the message length in bits, big-endian.
  const uint64_t bits = total_ * 8;
  const uint8_t one = 0x80, zero = 0;
  update(&one, 1);
  while (buf_n_ != 56) update(&zero, 1);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(bits >> (56 - 8 * i));
  update(len, 8);
  std::array<uint8_t, 32> out{};
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 4; ++j) out[size_t(4 * i + j)] = uint8_t(h_[i] >> (24 - 8 * j));
  }
  return out;
}

std::string Sha256::hex(const std::array<uint8_t, 32>& d) {
  static const char* digits = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < 32; ++i) {
    s[2 * i] = digits[d[i] >> 4];
    s[2 * i + 1] = digits[d[i] & 15];
  }
  return s;
}

std::string sha256_hex(const void* data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return Sha256::hex(h.finish());
}

std::string sha256_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  VQ_CHECK(f != nullptr, "{}: cannot open for reading: {}", path, std::strerror(errno));
  Sha256 h;
  std::vector<uint8_t> buf(1 << 20);  // [1 MiB] read buffer
  size_t got;
  while ((got = std::fread(buf.data(), 1, buf.size(), f)) > 0) h.update(buf.data(), got);
  const bool err = std::ferror(f) != 0;
  std::fclose(f);
  VQ_CHECK(!err, "{}: read error", path);
  return Sha256::hex(h.finish());
}

std::string sha256_file_memo(const std::string& path, const std::string& memo_dir) {
  struct stat st {};
  VQ_CHECK(::stat(path.c_str(), &st) == 0, "{}: cannot stat: {}", path, std::strerror(errno));
  // The file's identity as git's index keeps it: a file whose size, change time, modification
  // time, inode and device all match was not rewritten since it was hashed.
  const std::string key = std::to_string(st.st_size) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
                          std::to_string(st.st_mtim.tv_nsec) + " " + std::to_string(st.st_ctim.tv_sec) + "." +
                          std::to_string(st.st_ctim.tv_nsec) + " " + std::to_string(st.st_ino) + " " +
                          std::to_string(st.st_dev);
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(path, ec);
  const std::filesystem::path memo =
      std::filesystem::path(memo_dir) / ("sha256-" + sha256_hex(abs.string().data(), abs.string().size()).substr(0, 16));
  {
    std::ifstream in(memo);
    std::string k, hex;
    if (in && std::getline(in, k) && std::getline(in, hex) && k == key && hex.size() == 64 &&
        hex.find_first_not_of("0123456789abcdef") == std::string::npos)
      return hex;
  }
  const std::string hex = sha256_file(path);
  // Best effort: a memo that cannot be written costs the next call a hash, nothing else. Written
  // under a temporary name and renamed, so a reader never sees half a memo.
  std::filesystem::create_directories(memo_dir, ec);
  const std::filesystem::path tmp = memo.string() + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << key << "\n" << hex << "\n";
    if (!out.flush()) ec = std::make_error_code(std::errc::io_error);
  }
  if (!ec) std::filesystem::rename(tmp, memo, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  return hex;
}

}  // namespace vq
