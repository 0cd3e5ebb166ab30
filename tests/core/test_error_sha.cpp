// vq::Error messages keep a NUL from a file's string visible (what() is read as a C string, which
// would end there: issue 26), and SHA-256 (core/sha256.h, moved from model/ for session files)
// matches FIPS 180-4's examples.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <unistd.h>

#include "core/error.h"
#include "core/sha256.h"

TEST(ErrorText, AnEmbeddedNulDoesNotCutTheMessage) {
  const std::string name("lla\0ma", 6);
  try {
    VQ_FAIL("unsupported architecture '{}' in {}", name, "m.gguf");
  } catch (const vq::Error& e) {
    EXPECT_EQ(std::string(e.what()), "unsupported architecture 'lla\\0ma' in m.gguf");
  }
  try {
    VQ_CHECK(false, "{}", std::string("\0\0x", 3));
  } catch (const vq::Error& e) {
    EXPECT_EQ(std::string(e.what()), "\\0\\0x");
  }
}

TEST(Sha256, MatchesTheStandardsExamples) {
  EXPECT_EQ(vq::sha256_hex("abc", 3), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(vq::sha256_hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(vq::sha256_hex(two.data(), two.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

// The memoised file digest: right on first use, read back from the memo while the file is
// unchanged (a planted digest proves it is the memo that answers), recomputed after the file
// changes or when the memo is garbage, and right when the memo cannot be written at all.
TEST(Sha256, FileDigestMemo) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(::testing::TempDir()) / ("vq_sha_memo_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string file = (dir / "model.bin").string(), memo_dir = (dir / "digests").string();
  { std::ofstream(file) << "abc"; }
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  EXPECT_EQ(vq::sha256_file_memo(file, memo_dir), abc);
  ASSERT_EQ(std::distance(fs::directory_iterator(memo_dir), fs::directory_iterator()), 1);
  const fs::path memo = fs::directory_iterator(memo_dir)->path();
  std::string key;
  { std::ifstream in(memo); std::getline(in, key); }
  const std::string planted(64, 'e');
  { std::ofstream(memo) << key << "\n" << planted << "\n"; }
  EXPECT_EQ(vq::sha256_file_memo(file, memo_dir), planted);  // unchanged file: the memo answers
  { std::ofstream(file, std::ios::app) << "d"; }               // size and times change
  EXPECT_EQ(vq::sha256_file_memo(file, memo_dir), "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589");
  { std::ofstream(memo) << "garbage\n"; }
  EXPECT_EQ(vq::sha256_file_memo(file, memo_dir), "88d4266fd4e6338d13b845fcf289579d209c897823b9217da3e161936f031589");
  EXPECT_EQ(vq::sha256_file_memo(file, (dir / "model.bin" / "no").string()), vq::sha256_file(file));  // memo dir under a file
  EXPECT_THROW(vq::sha256_file_memo((dir / "absent").string(), memo_dir), vq::Error);
  fs::remove_all(dir);
}
