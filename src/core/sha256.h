#pragma once
// SHA-256 (FIPS 180-4): downloaded model files are checked with it, session files end with it.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace vq {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t n);
  std::array<uint8_t, 32> finish();  // the object must not be updated afterwards
  static std::string hex(const std::array<uint8_t, 32>& digest);

 private:
  void block(const uint8_t* p);  // one 64-byte block
  uint32_t h_[8];
  uint8_t buf_[64];              // [64] pending bytes of a partial block
  size_t buf_n_ = 0;
  uint64_t total_ = 0;           // bytes hashed so far
};

std::string sha256_hex(const void* data, size_t n);
// Hex digest of a file's contents; throws vq::Error naming the path when it cannot be read.
std::string sha256_file(const std::string& path);
// The same digest, remembered in memo_dir (one small file per path) with the file's size, times,
// inode and device: a later call on the unchanged file reads the memo instead of the whole file (a
// model of several GB takes seconds to hash). Memo write failures only cost the next call a hash.
std::string sha256_file_memo(const std::string& path, const std::string& memo_dir);

}  // namespace vq
