// vq::Error messages keep a NUL from a file's string visible (what() is read as a C string, which
// would end there: issue 26), and SHA-256 (core/sha256.h, moved from model/ for session files)
// matches FIPS 180-4's examples.
#include <gtest/gtest.h>

#include <string>

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
