#pragma once
// Session files: one sequence's KV in its native form (the bytes of its blocks: codes and scales,
// the fp16 window and sinks), its token ids and position, so that a conversation can be written
// to disk and continued later exactly where it stopped.
//
// Layout (little-endian):
//   "VQKVSES\0" | u32 version (=2) | u32 header bytes (=kHeaderBytes) | u64 file bytes
//   u64 model checksum | u64 spec checksum | u64 calibration checksum       (kv_identity.h)
//   u32 n_layers | u32 block_tokens | u32 n_kv_heads | u32 head_dim | u64 dense block bytes
//   i64 n_kv (tokens whose KV is stored) | u64 n_tokens (>= n_kv; the rest are still to be fed)
//   u32 model name bytes | u32 spec name bytes                              (for messages)
//   model name | spec name | i32 tokens[n_tokens]
//   per layer: u64 coded block bytes | u32 n_blocks | u8 forms[n_blocks] (bit 0 dense, bit 1
//              coded) | the present forms' payloads in block order, dense before coded
//   SHA-256 (32 bytes) of every preceding byte.
// Written to a temporary name and renamed. Reading (kvcache/seq_file_format.h) refuses with
// SessionFileError, one message naming the file and the cause: anything but a regular file (a
// symbolic link, directory, device or pipe), a header whose fields do not bound the file's size,
// a file that is truncated or has trailing bytes, fails its SHA-256, has another version (version
// 1 ended with an unkeyed XXH64), was made for another model, spec or calibration (or geometry),
// or holds a non-finite value in a dense block or a coded block's scales. The SHA-256 catches
// any corruption; it is not a signature: whoever can write the session folder can write a
// well-formed file, and the finite and bounds checks are what keep such a file harmless.
// Unused slots of a partial block are written as zeros (no stale pool memory on disk).
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kvcache/kv_identity.h"
#include "kvcache/kv_store.h"
#include "kvcache/seq_file_format.h"

namespace vq {

// Writes s (s.size() tokens of KV) and tokens (its tokens, then any not fed yet) to path.
void save_sequence(const std::string& path, const KVStore& kv, const SeqKV& s, const std::vector<int32_t>& tokens,
                   const KVIdentity& id);

// The same bytes in memory (the shared prefix store's entries, issue 24). seal = false leaves out
// the trailing SHA-256 (seal_sequence_bytes adds it later, off the engine's thread); `path` only
// names the sequence in messages. omit (when set): the blocks (layer, index) it names are written
// with no form (nothing of them read or copied), as blocks that left a sliding window are; the
// prefix store's delta entries take them from an ancestor entry.
std::vector<uint8_t> encode_sequence(const KVStore& kv, const SeqKV& s, const std::vector<int32_t>& tokens,
                                     const KVIdentity& id, bool seal = true, const std::string& path = "sequence",
                                     const std::function<bool(int layer, int64_t block)>& omit = {});
void seal_sequence_bytes(std::vector<uint8_t>& bytes);
// What kv reads: identity, geometry, block sizes, its budget, its coded blocks' finite check (which
// reads only the spec: the result may be used from another thread while kv lives).
SessionExpect session_expect(const KVStore& kv, const KVIdentity& id);

struct LoadedSequence {
  SeqKV seq;                    // a sequence of kv holding n_kv tokens
  std::vector<int32_t> tokens;  // [n_tokens]: the first n_kv are in seq
  int64_t n_kv = 0;
};
// Reads a file written by save_sequence into new blocks of kv. Throws SessionFileError for a file
// refused as above, KVPoolExhausted (having taken nothing) when the pool cannot hold its blocks.
LoadedSequence load_sequence(const std::string& path, KVStore& kv, const KVIdentity& id);
// Copies parsed bytes (parse_session against e = session_expect(kv, ...); the bytes must still be
// alive) into new blocks of kv. KVPoolExhausted (having taken nothing) when the pool is full.
LoadedSequence adopt_parsed_sequence(ParsedSession p, KVStore& kv, const SessionExpect& e);

// Tensor-parallel sessions (issue 25; the layout in seq_file_format.h): rank r's sequence s[r] of
// store kv[r] with identity ids[r], the same tokens for every rank. Loading reads a file saved
// over exactly kv.size() ranks into new blocks of each rank's store: every part is parsed and
// checked before any block is taken, and a rank's full pool gives back what earlier ranks took.
// on_rank(r, f): runs f where rank r's store is reachable (its GPU current: TPForward::on_rank);
// empty: f is called as it is.
using RankRunner = std::function<void(int rank, const std::function<void()>& f)>;
void save_tp_sequence(const std::string& path, const std::vector<const KVStore*>& kv, const std::vector<const SeqKV*>& s,
                      const std::vector<int32_t>& tokens, const std::vector<KVIdentity>& ids,
                      const RankRunner& on_rank = {});
// The file's bytes in memory (seal = false: without the trailing SHA-256; seal_sequence_bytes adds
// it, off the engine's thread). Each part is sealed.
std::vector<uint8_t> encode_tp_sequence(const std::vector<const KVStore*>& kv, const std::vector<const SeqKV*>& s,
                                        const std::vector<int32_t>& tokens, const std::vector<KVIdentity>& ids,
                                        const RankRunner& on_rank = {}, bool seal = true,
                                        const std::string& path = "sequence");
std::vector<LoadedSequence> load_tp_sequence(const std::string& path, const std::vector<KVStore*>& kv,
                                             const std::vector<KVIdentity>& ids, const RankRunner& on_rank = {});
// The steps of load_tp_sequence: each part of read_tp_session_file's bytes parsed (views into
// b.bytes; every part checked, and their tokens equal), then adopted into each rank's store, all
// ranks or none (KVPoolExhausted having taken nothing).
std::vector<ParsedSession> parse_tp_session(const TPSessionBytes& b, const std::string& path,
                                            const std::vector<SessionExpect>& e);
std::vector<LoadedSequence> adopt_parsed_tp_sequence(std::vector<ParsedSession> parts, const std::vector<KVStore*>& kv,
                                                     const std::vector<SessionExpect>& e, const RankRunner& on_rank = {});

// A sequence's bytes checked by parse_session, kept with their block views (the shared prefix
// store's fetched entries, handed from an HTTP thread to the engine's): one entry, or the chain of
// entries a delta entry is assembled from.
struct StoredPrefix {
  std::vector<std::vector<uint8_t>> parts;
  ParsedSession parsed;  // views into parts
  SessionExpect expect;
  uint64_t key = 0;      // the store's chain key
};

}  // namespace vq
