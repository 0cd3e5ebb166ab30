// Session files: a sequence written to disk in its native form and read back continues with the
// same tokens as one that never stopped (every KV method); files made for another model, spec or
// calibration, truncated or corrupted ones are refused with a message naming the cause; a load the
// pool cannot hold takes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/sha256.h"
#include "engine_fixture.h"
#include "gpu_test.h"
#include "kvcache/seq_file.h"

using namespace vq;
using vq::engine_test::Tiny;
using vq::engine_test::random_tokens;

namespace {

int argmax(const std::vector<float>& x) { return int(std::max_element(x.begin(), x.end()) - x.begin()); }

// Greedy: feeds tokens[s.pos():] then generates n tokens, each fed but the last.
std::vector<int32_t> continue_greedy(Session& s, std::vector<int32_t> tokens, int n) {
  std::vector<float> lg(size_t(s.model().config().n_vocab));
  s.forward(tokens.data() + s.pos(), int(int64_t(tokens.size()) - s.pos()), lg.data());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(argmax(lg));
    if (i + 1 < n) s.forward(&out.back(), 1, lg.data());
  }
  return out;
}

std::string temp_path(const std::string& name) { return std::string(VQ_BINARY_DIR) + "/test_session_" + name; }

std::vector<uint8_t> read_all(const std::string& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void write_all(const std::string& p, const std::vector<uint8_t>& d) {
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(d.data()), std::streamsize(d.size()));
}

KVIdentity identity_of(const KVStore& kv) {
  KVIdentity id;
  id.model = 42;  // the tiny model's file is rewritten per run; any fixed value names "this model"
  id.spec = spec_checksum(kv);
  id.calibration = calibration_checksum(kv.spec().calibration.get());
  id.model_name = "tiny.gguf";
  id.spec_name = kv.name();
  return id;
}

std::string load_error(const std::string& path, KVStore& kv, const KVIdentity& id) {
  try {
    load_sequence(path, kv, id);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A session file of n random tokens fed to a fresh session of `spec`; returns its path.
std::string saved_session(const KVSpec& spec, int n_ctx, int n, uint64_t seed, const std::string& name) {
  Tiny& t = Tiny::get();
  Session s(*t.model, spec, n_ctx);
  const auto toks = random_tokens(n, t.model->config().n_vocab, seed);
  s.forward(toks.data(), n, nullptr);
  const std::string path = temp_path(name);
  save_sequence(path, s.store(), s.sequence(), toks, identity_of(s.store()));
  return path;
}

}  // namespace

TEST(SessionFile, RestoredSequenceContinuesExactlyForEveryMethod) {
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab, n1 = 9, n2 = 15;
  const auto prompt = random_tokens(117, V, 800);  // not block-aligned: a partial last block
  for (const std::string& method : engine_test::all_methods()) {
    const KVSpec spec = t.spec(method);
    Session straight(*t.model, spec, 300);
    const auto all = continue_greedy(straight, prompt, n1 + n2);
    // Stop after n1 tokens: the KV holds the prompt and n1 - 1 of them; the last is still to be fed.
    Session first(*t.model, spec, 300);
    auto tokens = prompt;
    const auto part = continue_greedy(first, tokens, n1);
    tokens.insert(tokens.end(), part.begin(), part.end());
    const std::string path = temp_path(std::to_string(std::hash<std::string>{}(method)));
    save_sequence(path, first.store(), first.sequence(), tokens, identity_of(first.store()));
    Session second(*t.model, spec, 300);
    LoadedSequence ld = load_sequence(path, second.store(), identity_of(second.store()));
    EXPECT_EQ(ld.n_kv, first.pos());
    EXPECT_EQ(ld.tokens, tokens);
    EXPECT_EQ(second.store().token_bytes(ld.seq), first.store().token_bytes(first.sequence()));
    second.sequence() = std::move(ld.seq);
    const auto rest = continue_greedy(second, tokens, n2);  // feeds the last of `part` first
    std::vector<int32_t> joined = part;
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, all) << method;
    std::remove(path.c_str());
  }
}

// The same from and into a pool on the device (its block bytes cross to the host and back): the
// restored sequence continues exactly as the one that never stopped, and the file is the one a
// second save of the restored sequence writes.
TEST(SessionFile, RestoredSequenceContinuesExactlyOnTheDevice) {
  VQ_SKIP_WITHOUT_GPU();
  Tiny& t = Tiny::get();
  const int V = t.model->config().n_vocab, n1 = 9, n2 = 15;
  const auto prompt = random_tokens(117, V, 801);
  for (const std::string method : {"fp16", "vecinfer:d4b8,r=32"}) {
    const KVSpec spec = t.spec(method);
    auto session = [&] { return Session(*t.model, spec, 300, 64, size_t(128) << 20, KVDevice::cuda); };
    Session straight = session();
    const auto all = continue_greedy(straight, prompt, n1 + n2);
    Session first = session();
    auto tokens = prompt;
    const auto part = continue_greedy(first, tokens, n1);
    tokens.insert(tokens.end(), part.begin(), part.end());
    // (the system's temporary folder: the device machine runs the tests outside the build tree)
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("vq_session_dev_" + std::to_string(std::hash<std::string>{}(method))))
                                 .string();
    save_sequence(path, first.store(), first.sequence(), tokens, identity_of(first.store()));
    Session second = session();
    LoadedSequence ld = load_sequence(path, second.store(), identity_of(second.store()));
    EXPECT_EQ(ld.n_kv, first.pos());
    EXPECT_EQ(ld.tokens, tokens);
    second.sequence() = std::move(ld.seq);
    const std::string again = path + ".again";
    save_sequence(again, second.store(), second.sequence(), tokens, identity_of(second.store()));
    EXPECT_EQ(read_all(again), read_all(path)) << method << ": the restored blocks hold the saved bytes";
    const auto rest = continue_greedy(second, tokens, n2);
    std::vector<int32_t> joined = part;
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, all) << method;
    std::remove(path.c_str());
    std::remove(again.c_str());
  }
}

TEST(SessionFile, RefusesOtherModelSpecCalibrationTruncatedOrCorruptedFiles) {
  Tiny& t = Tiny::get();
  const KVSpec spec = t.spec("vecinfer:d4b8,r=32");
  const std::string path = saved_session(spec, 200, 90, 801, "refuse");
  const std::vector<uint8_t> good = read_all(path);
  Session other(*t.model, spec, 200);
  KVStore& kv = other.store();
  const KVIdentity id = identity_of(kv);
  ASSERT_EQ(load_error(path, kv, id), "");
  EXPECT_EQ(kv.pool().used_bytes(), 0u) << "the loaded sequence was dropped";

  KVIdentity m = id;
  m.model = 43;
  m.model_name = "other.gguf";
  EXPECT_NE(load_error(path, kv, m).find("made with model tiny.gguf"), std::string::npos) << load_error(path, kv, m);
  Session q8(*t.model, t.spec("q8_0"), 200);
  const std::string e_spec = load_error(path, q8.store(), identity_of(q8.store()));
  EXPECT_NE(e_spec.find("made with KV cache vecinfer:d4b8"), std::string::npos) << e_spec;
  KVIdentity c = id;
  c.calibration ^= 1;
  EXPECT_NE(load_error(path, kv, c).find("another calibration"), std::string::npos);

  // The file's bytes changed one way each: the message names what is wrong.
  auto error_for = [&](const std::vector<uint8_t>& bytes) {
    write_all(path, bytes);
    return load_error(path, kv, id);
  };
  auto changed = [&](auto&& edit) {
    std::vector<uint8_t> b = good;
    edit(b);
    return b;
  };
  const std::string truncated = error_for(std::vector<uint8_t>(good.begin(), good.end() - 100));
  EXPECT_NE(truncated.find("truncated"), std::string::npos) << truncated;
  EXPECT_NE(error_for(changed([](auto& b) { b[b.size() / 2] ^= 0x10; })).find("corrupted (SHA-256 checksum mismatch)"),
            std::string::npos);
  EXPECT_NE(error_for(changed([](auto& b) { b.push_back(0); })).find("trailing"), std::string::npos);
  EXPECT_NE(error_for(changed([](auto& b) { b[8] = 9; })).find("version 9 is not supported"),  // version field
            std::string::npos);
  EXPECT_NE(error_for({'n', 'o', 'p', 'e'}).find("not a session file"), std::string::npos);
  EXPECT_NE(load_error(path + ".absent", kv, id).find("cannot open"), std::string::npos);
  EXPECT_EQ(kv.pool().used_bytes(), 0u) << "a refused file takes no blocks";
  std::remove(path.c_str());
}

TEST(SessionFile, LoadThatThePoolCannotHoldTakesNothing) {
  Tiny& t = Tiny::get();
  const KVSpec spec = t.spec("fp16");
  const std::string path = saved_session(spec, 300, 200, 802, "budget");
  Session small(*t.model, spec, 300, Session::kDefaultChunk, 100 << 10);  // ~3 of the 7 blocks per layer
  EXPECT_THROW(load_sequence(path, small.store(), identity_of(small.store())), KVPoolExhausted);
  EXPECT_EQ(small.store().pool().used_bytes(), 0u);
  std::remove(path.c_str());
}

namespace {

// The file's bytes with a correct SHA-256 trailer again after an edit (what a forger does).
void reseal(std::vector<uint8_t>& b) {
  Sha256 h;
  h.update(b.data(), b.size() - 32);
  const auto d = h.finish();
  std::copy(d.begin(), d.end(), b.end() - 32);
}

template <class T>
void put_at(std::vector<uint8_t>& b, size_t off, T v) {
  std::memcpy(b.data() + off, &v, sizeof(T));
}

std::string load_error_type(const std::string& path, KVStore& kv, const KVIdentity& id, bool* session_error) {
  try {
    load_sequence(path, kv, id);
  } catch (const SessionFileError& e) {
    *session_error = true;
    return e.what();
  } catch (const Error& e) {
    *session_error = false;
    return e.what();
  }
  return "";
}

}  // namespace

// Issue 26: a forged file with a valid SHA-256 trailer but non-finite KV is refused; so is a file
// of the old version (unkeyed XXH64) and one whose header declares more than its fields allow.
TEST(SessionFile, ResealedFilesWithNonFiniteValuesOrLyingHeadersAreRefused) {
  Tiny& t = Tiny::get();
  for (const std::string method : {"fp16", "fp32", "q8_0", "kivi2,r=32", "vecinfer:d4b8,r=32"}) {
    const KVSpec spec = t.spec(method);
    const std::string path = saved_session(spec, 200, 70, 803, "forged");
    const std::vector<uint8_t> good = read_all(path);
    Session other(*t.model, spec, 200);
    KVStore& kv = other.store();
    const KVIdentity id = identity_of(kv);
    ASSERT_EQ(load_error(path, kv, id), "") << method;
    // The last block's payload ends just before the trailer. 70 tokens with a window of 32: the
    // last block is in the window, dense only, its first value a key; q8_0 has coded blocks only,
    // starting with a scale.
    const bool coded = method == "q8_0";
    const size_t last = coded ? kv.coded_block_bytes(kv.n_layers() - 1) : kv.dense_block_bytes();
    for (const bool all : {false, true}) {
      std::vector<uint8_t> b = good;
      if (method == "fp32")
        put_at<uint32_t>(b, b.size() - 32 - last, 0x7fc00000u);  // fp32 NaN
      else if (!all)
        put_at<uint16_t>(b, b.size() - 32 - last, 0x7e00);  // fp16 NaN
      else  // the whole block NaN (the case: HTTP 200 with empty text)
        for (size_t i = b.size() - 32 - last; i < b.size() - 32; i += 2) put_at<uint16_t>(b, i, 0x7c00);
      reseal(b);
      write_all(path, b);
      bool typed = false;
      const std::string nan = load_error_type(path, kv, id, &typed);
      EXPECT_NE(nan.find("non-finite"), std::string::npos) << method << ": " << nan;
      EXPECT_TRUE(typed) << method;
      EXPECT_EQ(kv.pool().used_bytes(), 0u);
    }
    std::remove(path.c_str());
  }
  const KVSpec spec = t.spec("fp16");
  const std::string path = saved_session(spec, 200, 40, 805, "header");
  const std::vector<uint8_t> good = read_all(path);
  Session other(*t.model, spec, 200);
  KVStore& kv = other.store();
  const KVIdentity id = identity_of(kv);
  std::vector<uint8_t> b = good;
  put_at<uint32_t>(b, 8, 1);
  write_all(path, b);
  const std::string v1 = load_error(path, kv, id);
  EXPECT_NE(v1.find("version 1"), std::string::npos) << v1;
  EXPECT_NE(v1.find("save the session again"), std::string::npos) << v1;
  b = good;
  put_at<uint64_t>(b, 16, uint64_t(1) << 40);  // file bytes: far more than 40 tokens allow
  write_all(path, b);
  const std::string big = load_error(path, kv, id);
  EXPECT_NE(big.find("its header allows at most"), std::string::npos) << big;
  b = good;
  put_at<int64_t>(b, 72, int64_t(1) << 40);  // n_kv
  put_at<uint64_t>(b, 80, uint64_t(1) << 40);  // n_tokens
  write_all(path, b);
  const std::string many = load_error(path, kv, id);
  EXPECT_NE(many.find("KV tokens"), std::string::npos) << many;
  EXPECT_EQ(kv.pool().used_bytes(), 0u);
  std::remove(path.c_str());
}

// Issue 26: only regular files are read: a symbolic link (even to a good file), a directory named
// like a session, a device and a FIFO are refused at once with a message saying which.
TEST(SessionFile, OnlyRegularFilesAreRead) {
  Tiny& t = Tiny::get();
  const KVSpec spec = t.spec("fp16");
  const std::string path = saved_session(spec, 200, 20, 806, "regular.vqkv");
  Session other(*t.model, spec, 200);
  KVStore& kv = other.store();
  const KVIdentity id = identity_of(kv);
  ASSERT_EQ(load_error(path, kv, id), "");
  const std::string link = temp_path("link.vqkv"), dir = temp_path("dir.vqkv"), fifo = temp_path("fifo.vqkv");
  std::remove(link.c_str());
  ::rmdir(dir.c_str());
  std::remove(fifo.c_str());
  ASSERT_EQ(::symlink(path.c_str(), link.c_str()), 0);
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  bool typed = false;
  EXPECT_NE(load_error_type(link, kv, id, &typed).find("symbolic link"), std::string::npos);
  EXPECT_TRUE(typed);
  EXPECT_NE(load_error_type(dir, kv, id, &typed).find("is a directory"), std::string::npos);
  EXPECT_TRUE(typed);
  EXPECT_NE(load_error(fifo, kv, id).find("not a regular file"), std::string::npos);  // no wait for a writer
  EXPECT_NE(load_error("/dev/zero", kv, id).find("not a regular file"), std::string::npos);
  EXPECT_EQ(kv.pool().used_bytes(), 0u);
  std::remove(link.c_str());
  ::rmdir(dir.c_str());
  std::remove(fifo.c_str());
  std::remove(path.c_str());
}

// Issue 26: temporary files of saves whose process is gone are removed; a live writer's are kept.
TEST(SessionFile, StaleTemporaryFilesOfInterruptedSavesAreRemoved) {
  const std::string dir = temp_path("temps");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ::waitpid(child, nullptr, 0);  // its pid now names no process
  const std::string dead = dir + "/a.vqkv.tmp." + std::to_string(child) + ".0";
  const std::string live = dir + "/b.vqkv.tmp." + std::to_string(::getpid()) + ".3";
  const std::string keep = dir + "/c.vqkv", other = dir + "/notes.tmp.1.0";
  for (const auto& p : {dead, live, keep, other}) write_all(p, {1, 2, 3});
  std::filesystem::create_directory(dir + "/d.vqkv.tmp.1.0");  // not a regular file: left alone
  EXPECT_EQ(remove_stale_session_temps(dir), 1);
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_TRUE(std::filesystem::exists(keep));
  EXPECT_TRUE(std::filesystem::exists(other));
  EXPECT_EQ(remove_stale_session_temps(dir + "/absent"), 0);
  std::filesystem::remove_all(dir);
}
