#pragma once
// The session file's bytes (kvcache/seq_file.h has the layout), read without a KV store: opening
// the file safely, checking the header against the reading cache before the payload is read, and
// parsing the payload into block views. seq_file.cpp copies the views into pool blocks; the fuzz
// target (fuzz/fuzz_session.cpp) drives the same code on arbitrary bytes.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kvcache/kv_identity.h"

namespace vq {

// A session file that is refused: not a regular file, malformed, corrupted, holding non-finite
// values, or made for another model/spec/calibration/geometry. The server answers 422 for it.
class SessionFileError : public Error {
 public:
  using Error::Error;
};

constexpr char kSessionMagic[8] = {'V', 'Q', 'K', 'V', 'S', 'E', 'S', '\0'};
// 1: XXH64 trailer (refused since: a recomputed XXH64 made any payload pass). 2: SHA-256 trailer.
constexpr uint32_t kSessionVersion = 2;
// magic, version, header bytes, file bytes, 3 checksums, 4 x u32 geometry, dense bytes, n_kv,
// n_tokens, 2 name lengths.
constexpr uint32_t kSessionHeaderBytes = 8 + 4 + 4 + 8 + 24 + 16 + 8 + 8 + 8 + 8;
constexpr size_t kSessionDigestBytes = 32;
// Bounds of fields no real session comes near (a context is far below 2^31 tokens; names are a
// file name and a spec string).
constexpr uint64_t kSessionMaxTokens = uint64_t(1) << 31;
constexpr uint32_t kSessionMaxNameBytes = 4096;

// What the reading cache is; a file made for anything else is refused.
struct SessionExpect {
  KVIdentity id;
  uint32_t n_layers = 0, block_tokens = 0, n_kv_heads = 0, head_dim = 0;
  uint64_t dense_block_bytes = 0;
  bool dense_f32 = false;                  // dense blocks hold fp32 (else fp16) values
  std::vector<uint64_t> coded_block_bytes;  // [n_layers]; 0: no coded form
  // Block payload bytes the reader can hold at most (its KV budget): a file with more is refused
  // before its payload is read (KVPoolExhausted).
  uint64_t max_payload_bytes = UINT64_MAX;
  // Whether a coded block of a layer holds only finite values (its scales); empty: not checked.
  std::function<bool(int layer, const uint8_t* block)> coded_finite;
};

struct SessionHeader {
  uint64_t file_bytes = 0;  // declared, checked against the bound of the fields below
  int64_t n_kv = 0;
  uint64_t n_tokens = 0;
  uint32_t model_name_bytes = 0, spec_name_bytes = 0;
  uint64_t max_payload_bytes = 0;  // block bytes if every block had every form present
};

// Checks the fixed header (p: at least kSessionHeaderBytes) against e: magic, version, sizes,
// identity, geometry, and the declared file size against the largest file such a header allows.
// Throws SessionFileError naming `path` and the field.
SessionHeader check_session_header(const uint8_t* p, size_t n, const std::string& path, const SessionExpect& e);

struct ParsedSession {
  struct Block {
    const uint8_t* dense = nullptr;  // [dense_block_bytes] inside the parsed bytes, or null
    const uint8_t* coded = nullptr;  // [coded_block_bytes[layer]] or null
  };
  int64_t n_kv = 0;
  std::vector<int32_t> tokens;            // [n_tokens]
  std::vector<std::vector<Block>> blocks;  // [n_layers][ceil(n_kv / block_tokens)]
};
// Parses a whole file's bytes: the header as above, the SHA-256 of everything before the last 32
// bytes, then every field, with every dense value and (through e.coded_finite) every coded
// block's scales finite. Throws SessionFileError.
ParsedSession parse_session(const uint8_t* data, size_t n, const std::string& path, const SessionExpect& e);

// Reads a session file: a regular file reached without following a symbolic link at its last
// component (no directory, device, pipe or link), whose header is checked (check_session_header)
// before its payload is read. Throws SessionFileError; KVPoolExhausted when its blocks' bytes
// exceed e.max_payload_bytes.
std::vector<uint8_t> read_session_file(const std::string& path, const SessionExpect& e);

// A tensor-parallel session (issue 25): each rank's sequence as a whole session file of its store
// (its heads, its identity, its own SHA-256), in rank order, in one file:
//   "VQKVTPS\0" | u32 version (=1) | u32 tp | u64 file bytes | u64 part bytes[tp] | parts |
//   SHA-256 (32 bytes) of every preceding byte.
constexpr char kTPSessionMagic[8] = {'V', 'Q', 'K', 'V', 'T', 'P', 'S', '\0'};
constexpr uint32_t kTPSessionVersion = 1;
struct TPSessionBytes {
  std::vector<uint8_t> bytes;                     // the whole file
  std::vector<std::pair<size_t, size_t>> parts;   // [tp]: (offset, bytes) of each rank's session file
};
// Reads a split session file for e.size() ranks (e[r]: rank r's store): as read_session_file, each
// part's header checked against its rank before anything else is read, the whole file's SHA-256
// checked; the parts are then for parse_session. A plain (tp 1) file, another rank count, or a
// malformed table: SessionFileError naming the file and what to do. (read_session_file refuses a
// split file the same way.)
TPSessionBytes read_tp_session_file(const std::string& path, const std::vector<SessionExpect>& e);
// The temporary name prefix write_file_atomic gives a save of `path` ("<path>.tmp.").
bool is_session_temp_name(const std::string& file_name);

// Removes the temporary files of interrupted saves (<name>.vqkv.tmp.<pid>.<n>) in dir whose
// writing process is gone; returns how many. Only regular files are removed; a missing dir is
// not an error.
int remove_stale_session_temps(const std::string& dir);

}  // namespace vq
