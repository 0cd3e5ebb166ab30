// Session files: a sequence written to disk in its native form and read back continues with the
// same tokens as one that never stopped (every KV method); files made for another model, spec or
// calibration, truncated or corrupted ones are refused with a message naming the cause; a load the
// pool cannot hold takes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "engine_fixture.h"
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
  EXPECT_NE(error_for(changed([](auto& b) { b[b.size() / 2] ^= 0x10; })).find("corrupted (checksum mismatch)"),
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
