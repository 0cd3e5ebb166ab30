// libFuzzer target for the session-file readers (kvcache/seq_file_format.h; split tensor-parallel
// files, magic VQKVTPS, through read_tp_session_file on a temporary file): any byte string must
// either parse or throw vq::SessionFileError (KVPoolExhausted past the budget), never read outside
// the input, and whatever parses must satisfy the format's contract: the sizes its header
// implies, every block view inside the input, every dense value finite. Each input is tried as
// given (a mutation almost always meets the SHA-256) and with its trailer rewritten to match, so
// that mutations reach the header, bounds and value checks behind it, as a forger's file would.
// Built with clang -fsanitize=fuzzer,address,undefined by fuzz/run_fuzz.sh (docs/FUZZING.md).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <unistd.h>

#include "core/sha256.h"
#include "kvcache/kv_pool.h"
#include "kvcache/seq_file_format.h"

namespace {

// The reading cache: 2 layers, blocks of 4 tokens, 1 KV head of 32, fp16 dense blocks; layer 1
// has coded blocks of 68 bytes whose first two bytes are an fp16 scale (as q8_0's). The seeds
// (fuzz/corpus_session, fuzz/make_session_seeds.py) are made for it.
const vq::SessionExpect& expect() {
  static const vq::SessionExpect e = [] {
    vq::SessionExpect x;
    x.id.model = 0x1111111111111111ull;
    x.id.spec = 0x2222222222222222ull;
    x.id.calibration = 0;
    x.id.model_name = "fuzz.gguf";
    x.id.spec_name = "fuzz";
    x.n_layers = 2;
    x.block_tokens = 4;
    x.n_kv_heads = 1;
    x.head_dim = 32;
    x.dense_block_bytes = 2 * 1 * 32 * 4 * 2;
    x.coded_block_bytes = {0, 68};
    x.max_payload_bytes = 1 << 20;
    x.coded_finite = [](int, const uint8_t* b) {
      uint16_t h;
      std::memcpy(&h, b, 2);
      return (h & 0x7c00u) != 0x7c00u;
    };
    return x;
  }();
  return e;
}

void check_parsed(const vq::ParsedSession& p, const uint8_t* data, size_t size) {
  const vq::SessionExpect& e = expect();
  if (p.n_kv < 0 || uint64_t(p.n_kv) > p.tokens.size()) std::abort();
  const size_t nb = size_t((uint64_t(p.n_kv) + e.block_tokens - 1) / e.block_tokens);
  if (p.blocks.size() != e.n_layers) std::abort();
  for (size_t l = 0; l < p.blocks.size(); ++l) {
    if (p.blocks[l].size() != nb) std::abort();
    for (const auto& b : p.blocks[l]) {
      if (b.dense) {
        if (b.dense < data || b.dense + e.dense_block_bytes > data + size) std::abort();
        for (size_t i = 0; i < e.dense_block_bytes; i += 2) {
          uint16_t h;
          std::memcpy(&h, b.dense + i, 2);
          if ((h & 0x7c00u) == 0x7c00u) std::abort();
        }
      }
      if (b.coded) {
        if (e.coded_block_bytes[l] == 0) std::abort();
        if (b.coded < data || b.coded + e.coded_block_bytes[l] > data + size) std::abort();
      }
    }
  }
}

void try_parse(const uint8_t* data, size_t size) {
  try {
    const vq::ParsedSession p = vq::parse_session(data, size, "fuzz.vqkv", expect());
    check_parsed(p, data, size);
  } catch (const vq::SessionFileError&) {
  } catch (const vq::KVPoolExhausted&) {
  }
}

// A split (tensor-parallel) session file: the input is written to a file and read for two ranks of
// the reading cache (read_tp_session_file checks the table, each part's header and the file's
// SHA-256); every part it returns must lie inside the bytes read and parse or be refused.
void try_split(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    std::string t = std::string(dir && *dir ? dir : "/tmp") + "/vq_fuzz_split_XXXXXX";
    const int fd = mkstemp(t.data());
    if (fd < 0) std::abort();
    close(fd);
    return t;
  }();
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) std::abort();
    if (size && std::fwrite(data, 1, size, f) != size) std::abort();
    std::fclose(f);
  }
  try {
    const vq::TPSessionBytes b = vq::read_tp_session_file(path, {expect(), expect()});
    if (b.parts.size() != 2 || b.bytes.size() != size) std::abort();
    for (const auto& [off, n] : b.parts) {
      if (off < 24 || off > b.bytes.size() || n > b.bytes.size() - off) std::abort();
      try {
        const vq::ParsedSession p = vq::parse_session(b.bytes.data() + off, n, "fuzz.vqkv (rank)", expect());
        check_parsed(p, b.bytes.data() + off, n);
      } catch (const vq::SessionFileError&) {
      } catch (const vq::KVPoolExhausted&) {
      }
    }
  } catch (const vq::SessionFileError&) {
  } catch (const vq::KVPoolExhausted&) {
  }
}

bool split_magic(const uint8_t* data, size_t size) {
  return size >= 8 && std::memcmp(data, vq::kTPSessionMagic, 8) == 0;
}

// try_one(data, size), then again with the input's SHA-256 trailer rewritten to match (a forger's
// file), so that mutations reach the checks behind the digest.
template <class F>
void as_given_and_resealed(const uint8_t* data, size_t size, F try_one) {
  try_one(data, size);
  if (size < vq::kSessionDigestBytes) return;
  std::vector<uint8_t> b(data, data + size);
  vq::Sha256 h;
  h.update(b.data(), b.size() - vq::kSessionDigestBytes);
  const auto d = h.finish();
  std::memcpy(b.data() + b.size() - vq::kSessionDigestBytes, d.data(), d.size());
  try_one(b.data(), b.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (split_magic(data, size)) as_given_and_resealed(data, size, try_split);
  else as_given_and_resealed(data, size, try_parse);
  return 0;
}
