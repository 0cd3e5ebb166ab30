// User-facing file handling: output paths checked before work, errors naming the user's path
// (never a temporary name), size-limited input reads, and terminal-safe text.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/atomic_file.h"
#include "common/error_of.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/text_escape.h"

namespace vq {
namespace {

std::string scratch_dir(const std::string& name) {
  const auto d = std::filesystem::path(::testing::TempDir()) / ("vq_user_files_" + std::to_string(::getpid()) + "_" + name);
  std::filesystem::create_directories(d);
  return d.string();
}

using test::error_of;

void expect_has(const std::string& msg, const std::string& needle) {
  EXPECT_NE(msg.find(needle), std::string::npos) << "'" << needle << "' not in: " << msg;
}

TEST(OutputPath, AcceptsWritableTargetsAndNamesTheProblem) {
  const std::string d = scratch_dir("out");
  EXPECT_EQ(error_of([&] { check_output_path(d + "/new.json", "-o"); }), "");
  std::ofstream(d + "/old.json") << "x";
  EXPECT_EQ(error_of([&] { check_output_path(d + "/old.json", "-o"); }), "");  // replaced later
  EXPECT_EQ(error_of([&] { check_output_path("relative_name.json", "-o"); }), "");  // the current directory

  expect_has(error_of([&] { check_output_path("", "--stats-json"); }), "--stats-json: the output path is empty");
  expect_has(error_of([&] { check_output_path(d, "-o"); }), "is a directory");
  expect_has(error_of([&] { check_output_path(d + "/", "-o"); }), "names a directory");
  const std::string missing = d + "/no/such/dir/x.json";
  const std::string e = error_of([&] { check_output_path(missing, "--dump-logits"); });
  expect_has(e, "--dump-logits '" + missing + "'");
  expect_has(e, "does not exist");
  expect_has(error_of([&] { check_output_path("/dev/null", "-o"); }), "not a regular file");
  std::ofstream(d + "/file") << "x";
  expect_has(error_of([&] { check_output_path(d + "/file/x.json", "-o"); }), "is not a directory");
  if (::geteuid() != 0) {  // root writes anywhere
    const std::string ro = scratch_dir("ro");
    ASSERT_EQ(::chmod(ro.c_str(), 0500), 0);
    expect_has(error_of([&] { check_output_path(ro + "/x.json", "-o"); }), "is not writable");
    ::chmod(ro.c_str(), 0700);
  }
}

TEST(OutputPath, WriteErrorsNameTheUsersPathNotTheTemporary) {
  const std::string d = scratch_dir("write");
  const std::string target = d + "/missing_dir/out.bin";
  const std::string e = error_of([&] { write_file_atomic(target, "abc", 3); });
  expect_has(e, target);
  EXPECT_EQ(e.find(".tmp."), std::string::npos) << e;
  // A directory in the way of the rename: the message names the path, nothing is left behind.
  std::filesystem::create_directories(d + "/taken/inner");
  const std::string e2 = error_of([&] { write_file_atomic(d + "/taken", "abc", 3); });
  expect_has(e2, d + "/taken");
  EXPECT_EQ(e2.find(".tmp."), std::string::npos) << e2;
  int entries = 0;
  for (const auto& it : std::filesystem::directory_iterator(d)) entries += it.path().filename() != "taken";
  EXPECT_EQ(entries, 0);
}

TEST(InputFile, ReadsWithinTheLimitAndRefusesBeyond) {
  const std::string d = scratch_dir("in");
  std::ofstream(d + "/ten") << "0123456789";
  EXPECT_EQ(read_input_file(d + "/ten", 10, "--prompt-file"), "0123456789");
  const std::string e = error_of([&] { read_input_file(d + "/ten", 9, "--prompt-file"); });
  expect_has(e, "--prompt-file '" + d + "/ten': 10 bytes exceeds the limit of 9 bytes");
  expect_has(error_of([&] { read_input_file(d + "/none", 10, "--text"); }), "--text '" + d + "/none': cannot open");
  expect_has(error_of([&] { read_input_file(d, 10, "--text"); }), "is a directory");
  // A device without an end is read only up to the limit.
  expect_has(error_of([&] { read_input_file("/dev/zero", 1 << 16, "--prompt-file"); }), "more than the limit of 64 KiB");
  EXPECT_EQ(format_size_limit(kMaxPromptFileBytes), "16 MiB");
}

TEST(TextEscape, ControlsAndBrokenUtf8BecomeVisible) {
  EXPECT_EQ(escape_control("plain text, ok"), "plain text, ok");
  EXPECT_EQ(escape_control("\x1b[2J\x1b]0;title\x07"), "\\x1b[2J\\x1b]0;title\\x07");
  EXPECT_EQ(escape_control("a\nb\tc\r"), "a\\x0ab\\x09c\\x0d");
  EXPECT_EQ(escape_control("a\nb\tc\r", true), "a\nb\tc\\x0d");
  EXPECT_EQ(escape_control(std::string("nul\0x", 5)), "nul\\x00x");
  EXPECT_EQ(escape_control("del\x7f"), "del\\x7f");
  EXPECT_EQ(escape_control("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(escape_control("\xc2\x9b" "31m"), "\\u009b31m");  // C1 CSI as UTF-8
  EXPECT_EQ(escape_control("\x9b" "31m"), "\\x9b31m");        // raw 8-bit CSI
  EXPECT_EQ(escape_control("\xc0\xaf"), "\\xc0\\xaf");         // overlong '/'
  EXPECT_EQ(escape_control("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
  EXPECT_EQ(escape_control("cut \xe2\x82"), "cut \\xe2\\x82");  // truncated sequence
}

TEST(TextEscape, StreamKeepsCharactersSplitAcrossPieces) {
  StreamEscaper e;
  // "é€😀" split inside each character, then an escape sequence split from its ESC.
  std::string out = e.push("caf\xc3");
  EXPECT_EQ(out, "caf");
  out += e.push("\xa9 \xe2\x82");
  out += e.push("\xac \xf0\x9f");
  out += e.push("\x98\x80\x1b");
  out += e.push("[31m\n");
  out += e.flush();
  EXPECT_EQ(out, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\\x1b[31m\n");
  // A sequence that never completes is escaped at the end.
  StreamEscaper f;
  EXPECT_EQ(f.push("ok\xe2\x82"), "ok");
  EXPECT_EQ(f.flush(), "\\xe2\\x82");
  EXPECT_EQ(f.push("\x9b"), "\\x9b");  // a stray continuation byte is not held back
}

}  // namespace
}  // namespace vq
