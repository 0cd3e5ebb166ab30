#include <gtest/gtest.h>

#include <dirent.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "core/atomic_file.h"
#include "core/buffer.h"
#include "core/checksum.h"
#include "core/env.h"
#include "common/error_of.h"
#include "core/error.h"
#include "core/int_list.h"
#include "core/mmap_file.h"
#include "core/tensor.h"

namespace vq {
namespace {

std::string tmp(const std::string& name) {
  return std::string(::testing::TempDir()) + "vq_core_" + std::to_string(::getpid()) + "_" + name;
}

using test::error_of;

TEST(IntOption, ListsAndRefusals) {
  EXPECT_EQ(parse_int_list("1,4,8", "--threads"), (std::vector<int64_t>{1, 4, 8}));
  EXPECT_EQ(parse_int_list("32768", "--S"), (std::vector<int64_t>{32768}));
  EXPECT_EQ(parse_int_option("0", "--warmup", 0), 0);
  EXPECT_EQ(parse_int_option("-3", "--x", -5, 5), -3);
  for (const char* bad : {"", "1,", ",1", "1,,2", "1x", " 1", "0", "-1", "+2", "1.5", "99999999999999999999"}) {
    const std::string e = error_of([&] { parse_int_list(bad, "--threads"); });
    EXPECT_NE(e.find("--threads"), std::string::npos) << "'" << bad << "': " << e;
  }
  const std::string range = error_of([] { parse_int_option("9", "--keys", 32, 64); });
  EXPECT_NE(range.find("32..64"), std::string::npos) << range;
  const std::string esc = error_of([] { parse_int_option("1\x1b[2J", "--reps"); });
  EXPECT_EQ(esc.find('\x1b'), std::string::npos) << "control characters are escaped";
}

TEST(TensorView, ShapesAndErrors) {
  std::vector<float> buf(24);
  TensorView<float> v(buf.data(), {2, 3, 4});
  EXPECT_EQ(v.rank(), 3);
  EXPECT_EQ(v.numel(), 24);
  EXPECT_EQ(&v.at(1, 2, 3), &buf[23]);
  EXPECT_NO_THROW(v.expect_shape("x", {2, 3, 4}));
  const std::string m = error_of([&] { v.expect_shape("keys", {2, 4, 4}); });
  EXPECT_NE(m.find("keys"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 3, 4]"), std::string::npos) << m;
  EXPECT_NE(m.find("[2, 4, 4]"), std::string::npos) << m;
  EXPECT_FALSE(error_of([&] { v.expect_shape("x", {2, 3}); }).empty());  // rank differs
  EXPECT_NE(error_of([&] { TensorView<float>(buf.data(), {2, -1}); }).find("-1"), std::string::npos);
  EXPECT_FALSE(error_of([&] { TensorView<float>(buf.data(), {1, 1, 1, 1, 1}); }).empty());
}

TEST(MappedFile, ReadsAndNamesMissingFiles) {
  const std::string p = tmp("mmap");
  {
    std::ofstream f(p, std::ios::binary);
    f << "hello mmap";
  }
  MappedFile m(p);
  ASSERT_EQ(m.size(), 10u);
  EXPECT_EQ(std::memcmp(m.data(), "hello mmap", 10), 0);
  MappedFile moved(std::move(m));
  EXPECT_EQ(moved.size(), 10u);
  EXPECT_EQ(m.data(), nullptr);
  std::remove(p.c_str());
  const std::string missing = tmp("no_such_file");
  const std::string msg = error_of([&] { MappedFile x(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { MappedFile x("/"); }).find("not a regular file"), std::string::npos);
}

size_t count_temp_files(const std::string& dir, const std::string& prefix) {
  size_t n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (std::string(e->d_name).rfind(prefix, 0) == 0 && std::string(e->d_name).find(".tmp.") != std::string::npos)
        ++n;
    closedir(d);
  }
  return n;
}

TEST(AtomicFile, WritesReplacesAndLeavesNoTemp) {
  const std::string dir = ::testing::TempDir();
  const std::string name = "vq_core_" + std::to_string(::getpid()) + "_atomic";
  const std::string p = dir + name;
  write_file_atomic(p, "first", 5);
  write_file_atomic(p, "second!", 7);
  std::ifstream f(p, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(f)), {});
  EXPECT_EQ(s, "second!");
  EXPECT_EQ(count_temp_files(dir, name), 0u);
  std::remove(p.c_str());
  // A failing write (directory missing) throws naming the path and leaves nothing behind.
  const std::string bad = dir + "vq_no_such_dir_" + std::to_string(::getpid()) + "/out.bin";
  EXPECT_NE(error_of([&] { write_file_atomic(bad, "x", 1); }).find("vq_no_such_dir_"), std::string::npos);
}

TEST(Checksum, DetectsEverySingleBitFlip) {
  EXPECT_EQ(checksum64("", 0), 0xEF46DB3751D8E999ull);  // XXH64 of empty input, seed 0
  std::vector<uint8_t> buf(257);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = uint8_t(i * 31 + 7);
  const uint64_t base = checksum64(buf.data(), buf.size());
  EXPECT_EQ(checksum64(buf.data(), buf.size()), base);
  for (size_t i = 0; i < buf.size(); ++i)
    for (int bit = 0; bit < 8; ++bit) {
      buf[i] ^= uint8_t(1 << bit);
      ASSERT_NE(checksum64(buf.data(), buf.size()), base) << i << " " << bit;
      buf[i] ^= uint8_t(1 << bit);
    }
  EXPECT_NE(checksum64(buf.data(), buf.size() - 1), base);  // truncation
}

// Small buffers are 64-byte aligned, large ones (packed weights, KV pools) 2 MiB aligned for
// huge pages; either way new elements are zero and resize keeps the old ones.
TEST(AlignedBuffer, AlignmentZeroingAndResize) {
  AlignedBuffer<uint8_t> small(100);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % AlignedBuffer<uint8_t>::kAlign, 0u);
  for (uint8_t v : small) ASSERT_EQ(v, 0);
  small[99] = 7;
  const size_t big_n = AlignedBuffer<float>::kHugeBytes / sizeof(float) + 3;
  AlignedBuffer<float> big(big_n);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % AlignedBuffer<float>::kHugeAlign, 0u);
  EXPECT_EQ(big[0], 0.0f);
  EXPECT_EQ(big[big_n - 1], 0.0f);
  big[1] = 1.5f, big[big_n - 1] = 2.5f;
  big.resize(big_n * 2);  // grows: old values kept, new ones zero
  EXPECT_EQ(big[1], 1.5f);
  EXPECT_EQ(big[big_n - 1], 2.5f);
  EXPECT_EQ(big[big_n * 2 - 1], 0.0f);
  small.resize(AlignedBuffer<uint8_t>::kHugeBytes);  // small to large: moves to a 2 MiB boundary
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small.data()) % AlignedBuffer<uint8_t>::kHugeAlign, 0u);
  EXPECT_EQ(small[99], 7);
  big.resize(10);  // large to small
  EXPECT_EQ(big[1], 1.5f);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(big.data()) % AlignedBuffer<float>::kAlign, 0u);
}

}  // namespace
}  // namespace vq

// A default-on switch is off only for exactly "0"; unset, empty or anything else leaves it on.
TEST(Env, SwitchedOffOnlyByZeroAndEmptyReadsAsUnset) {
  const char* name = "VQ_TEST_ENV_SWITCH";
  unsetenv(name);
  EXPECT_EQ(vq::env_or_empty(name), "");
  EXPECT_FALSE(vq::env_switched_off(name));
  setenv(name, "", 1);
  EXPECT_EQ(vq::env_or_empty(name), "");
  EXPECT_FALSE(vq::env_switched_off(name));
  setenv(name, "0", 1);
  EXPECT_EQ(vq::env_or_empty(name), "0");
  EXPECT_TRUE(vq::env_switched_off(name));
  setenv(name, "00", 1);
  EXPECT_FALSE(vq::env_switched_off(name));
  setenv(name, "1", 1);
  EXPECT_FALSE(vq::env_switched_off(name));
  unsetenv(name);
}

// A variant choice: unset or empty gives the default, an allowed value itself, anything else one
// error naming the variable, what it held and what it may hold.
TEST(Env, ChoiceTakesAllowedValuesAndRefusesOthers) {
  const char* name = "VQ_TEST_ENV_CHOICE";
  unsetenv(name);
  EXPECT_EQ(vq::env_choice(name, {4, 8}, 0), 0);
  setenv(name, "", 1);
  EXPECT_EQ(vq::env_choice(name, {4, 8}, 0), 0);
  setenv(name, "8", 1);
  EXPECT_EQ(vq::env_choice(name, {4, 8}, 0), 8);
  for (const char* bad : {"5", "08", "8 ", "eight"}) {
    setenv(name, bad, 1);
    const std::string e = vq::test::error_of([&] { vq::env_choice(name, {4, 8}, 0); });
    EXPECT_NE(e.find("VQ_TEST_ENV_CHOICE="), std::string::npos) << bad << ": " << e;
    EXPECT_NE(e.find("must be 4 or 8"), std::string::npos) << bad << ": " << e;
  }
  unsetenv(name);
}
