#include "kvcache/seq_file.h"

#include "kvcache/kv_method.h"

#include <cstring>
#include <array>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/sha256.h"
#include "kvcache/seq_file_format.h"

namespace vq {
namespace {

class Writer {
 public:
  Writer() { buf.reserve(4096); }  // (also keeps GCC 12 from a false -Wstringop-overflow on the first insert)
  template <class T>
  void put(T v) {
    put_bytes(&v, sizeof(T));
  }
  void put_bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf.insert(buf.end(), b, b + n);
  }
  std::vector<uint8_t> buf;
};

// Zeroes slots [r, B) of a dense block: keys [H][D][B] then values [H][B][D], es bytes each.
void zero_dense_tail(uint8_t* blk, int H, int D, int B, size_t es, int r) {
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < D; ++c) std::memset(blk + ((size_t(h) * D + c) * B + r) * es, 0, size_t(B - r) * es);
  uint8_t* v = blk + size_t(H) * D * B * es;
  for (int h = 0; h < H; ++h) std::memset(v + (size_t(h) * B + r) * D * es, 0, size_t(B - r) * D * es);
}

// Zeroes slots [r, B) of a q8_0/q4_0/q4_0h block: [2 (K, V)][H][B][row bytes] (kv_format.cpp), the
// one layout of the formats written per token.
void zero_scalar_tail(uint8_t* blk, int H, int B, size_t block_bytes, int r) {
  const size_t row = block_bytes / (2 * size_t(H) * size_t(B));
  for (size_t kh = 0; kh < 2 * size_t(H); ++kh) std::memset(blk + (kh * B + r) * row, 0, size_t(B - r) * row);
}

}  // namespace

std::vector<uint8_t> encode_sequence(const KVStore& kv, const SeqKV& s, const std::vector<int32_t>& tokens,
                                     const KVIdentity& id, bool seal, const std::string& path,
                                     const std::function<bool(int, int64_t)>& omit) {
  const int64_t n = s.size();
  VQ_CHECK(int64_t(tokens.size()) >= n, "{}: a session of {} KV tokens needs at least as many token ids (got {})",
           path, n, tokens.size());
  auto ids = [&](int l, int64_t j) { return omit && omit(l, j) ? KVStore::BlockIds{} : kv.block_ids(s, l, j); };
  const KVGeometry& g = kv.geometry();
  const int B = kv.block_tokens();
  Writer w;
  w.put_bytes(kSessionMagic, 8);
  w.put<uint32_t>(kSessionVersion);
  w.put<uint32_t>(kSessionHeaderBytes);
  w.put<uint64_t>(0);  // file bytes, patched below
  w.put<uint64_t>(id.model);
  w.put<uint64_t>(id.spec);
  w.put<uint64_t>(id.calibration);
  w.put<uint32_t>(uint32_t(kv.n_layers()));
  w.put<uint32_t>(uint32_t(B));
  w.put<uint32_t>(uint32_t(g.n_kv_heads));
  w.put<uint32_t>(uint32_t(g.head_dim));
  w.put<uint64_t>(kv.dense_block_bytes());
  w.put<int64_t>(n);
  w.put<uint64_t>(tokens.size());
  w.put<uint32_t>(uint32_t(id.model_name.size()));
  w.put<uint32_t>(uint32_t(id.spec_name.size()));
  w.put_bytes(id.model_name.data(), id.model_name.size());
  w.put_bytes(id.spec_name.data(), id.spec_name.size());
  w.put_bytes(tokens.data(), tokens.size() * sizeof(int32_t));
  const size_t dbytes = kv.dense_block_bytes();
  const size_t es = dbytes / (2 * size_t(g.n_kv_heads) * size_t(g.head_dim) * size_t(B));
  std::vector<uint8_t> tmp(dbytes);
  const KVMethod method = kv.spec().config.method;
  // Methods written per token (q8_0, q4_0, q4_0h, q5_0): blocks [2 (K, V)][H][B][row]; their partial
  // blocks' unused slots hold stale pool memory, zeroed on disk.
  const bool per_token = kv_method(method).direct();
  // Every block's bytes copied to the host first, in one go (from the device pool: one wait).
  std::vector<std::vector<uint8_t>> staged;
  std::vector<KVStore::BlockRef> reads;
  for (int l = 0; l < kv.n_layers(); ++l)
    for (int64_t j = 0; j < kv.n_blocks(s, l); ++j) {
      const KVStore::BlockIds b = ids(l, j);
      if (b.dense >= 0) reads.push_back({l, false, b.dense}), staged.emplace_back(dbytes);
      if (b.coded >= 0) reads.push_back({l, true, b.coded}), staged.emplace_back(kv.coded_block_bytes(l));
    }
  std::vector<void*> dst;
  for (auto& v : staged) dst.push_back(v.data());
  kv.read_blocks(reads, dst.data());
  size_t next = 0;
  for (int l = 0; l < kv.n_layers(); ++l) {
    const size_t cbytes = kv.coded_block_bytes(l);
    const int64_t nb = kv.n_blocks(s, l);
    w.put<uint64_t>(cbytes);
    w.put<uint32_t>(uint32_t(nb));
    for (int64_t j = 0; j < nb; ++j) {
      const KVStore::BlockIds b = ids(l, j);
      w.put<uint8_t>(uint8_t((b.dense >= 0 ? 1 : 0) | (b.coded >= 0 ? 2 : 0)));
    }
    for (int64_t j = 0; j < nb; ++j) {
      const KVStore::BlockIds b = ids(l, j);
      if (b.dense >= 0) {
        std::memcpy(tmp.data(), staged[next++].data(), dbytes);
        const int64_t r = std::min<int64_t>(B, n - j * B);
        if (r < B) zero_dense_tail(tmp.data(), g.n_kv_heads, g.head_dim, B, es, int(r));
        w.put_bytes(tmp.data(), dbytes);
      }
      if (b.coded >= 0) {
        const uint8_t* src = staged[next++].data();
        const int64_t r = std::min<int64_t>(B, n - j * B);
        if (per_token && r < B) {  // a partial block: its unused slots hold stale pool memory
          std::vector<uint8_t> c(src, src + cbytes);
          zero_scalar_tail(c.data(), g.n_kv_heads, B, cbytes, int(r));
          w.put_bytes(c.data(), cbytes);
        } else {
          w.put_bytes(src, cbytes);
        }
      }
    }
  }
  const uint64_t total = w.buf.size() + kSessionDigestBytes;
  std::memcpy(w.buf.data() + 16, &total, 8);
  if (seal) seal_sequence_bytes(w.buf);
  return std::move(w.buf);
}

void seal_sequence_bytes(std::vector<uint8_t>& bytes) {
  Sha256 sha;
  sha.update(bytes.data(), bytes.size());
  const std::array<uint8_t, 32> digest = sha.finish();
  bytes.insert(bytes.end(), digest.begin(), digest.end());
}

void save_sequence(const std::string& path, const KVStore& kv, const SeqKV& s, const std::vector<int32_t>& tokens,
                   const KVIdentity& id) {
  const std::vector<uint8_t> bytes = encode_sequence(kv, s, tokens, id, true, path);
  write_file_atomic(path, bytes.data(), bytes.size());
}

SessionExpect session_expect(const KVStore& kv, const KVIdentity& id) {
  SessionExpect e;
  e.id = id;
  e.n_layers = uint32_t(kv.n_layers());
  e.block_tokens = uint32_t(kv.block_tokens());
  e.n_kv_heads = uint32_t(kv.geometry().n_kv_heads);
  e.head_dim = uint32_t(kv.geometry().head_dim);
  e.dense_block_bytes = kv.dense_block_bytes();
  e.dense_f32 = kv.spec().config.method == KVMethod::fp32;
  for (int l = 0; l < kv.n_layers(); ++l) e.coded_block_bytes.push_back(kv.coded_block_bytes(l));
  e.max_payload_bytes = kv.pool().budget_bytes();
  e.coded_finite = [&kv](int layer, const uint8_t* block) { return kv.coded_block_finite(layer, block); };
  return e;
}

LoadedSequence load_sequence(const std::string& path, KVStore& kv, const KVIdentity& id) {
  const SessionExpect e = session_expect(kv, id);
  const std::vector<uint8_t> data = read_session_file(path, e);
  ParsedSession p = parse_session(data.data(), data.size(), path, e);
  return adopt_parsed_sequence(std::move(p), kv, e);
}

LoadedSequence adopt_parsed_sequence(ParsedSession p, KVStore& kv, const SessionExpect& e) {
  LoadedSequence out;
  out.n_kv = p.n_kv;
  out.tokens = std::move(p.tokens);
  std::vector<std::vector<KVStore::BlockIds>> ids(e.n_layers);
  // Blocks allocated so far are given back if anything below fails.
  auto give_back = [&] {
    for (size_t l = 0; l < ids.size(); ++l)
      for (const auto& b : ids[l]) {
        if (b.dense >= 0) kv.release_block(int(l), false, b.dense);
        if (b.coded >= 0) kv.release_block(int(l), true, b.coded);
      }
  };
  try {
    std::vector<KVStore::BlockRef> writes;  // the file's bytes into the new blocks, in one go
    std::vector<const void*> src;
    for (uint32_t l = 0; l < e.n_layers; ++l) {
      for (const ParsedSession::Block& pb : p.blocks[l]) {
        KVStore::BlockIds b;
        if (pb.dense) {
          b.dense = kv.alloc_block(int(l), false);
          ids[l].push_back(b);
          writes.push_back({int(l), false, b.dense});
          src.push_back(pb.dense);
        } else {
          ids[l].push_back(b);
        }
        if (pb.coded) {
          ids[l].back().coded = kv.alloc_block(int(l), true);
          writes.push_back({int(l), true, ids[l].back().coded});
          src.push_back(pb.coded);
        }
      }
    }
    kv.write_blocks(writes, src.data());
  } catch (...) {
    give_back();
    throw;
  }
  out.seq = kv.adopt_blocks(out.n_kv, std::move(ids));  // releases them itself on error
  return out;
}

namespace {
void run_on(const RankRunner& on_rank, int r, const std::function<void()>& f) {
  if (on_rank) on_rank(r, f);
  else f();
}
}  // namespace

std::vector<uint8_t> encode_tp_sequence(const std::vector<const KVStore*>& kv, const std::vector<const SeqKV*>& s,
                                        const std::vector<int32_t>& tokens, const std::vector<KVIdentity>& ids,
                                        const RankRunner& on_rank, bool seal, const std::string& path) {
  const size_t tp = kv.size();
  VQ_CHECK(tp >= 1 && s.size() == tp && ids.size() == tp, "session save '{}': {} stores, {} sequences, {} identities",
           path, tp, s.size(), ids.size());
  std::vector<std::vector<uint8_t>> parts;
  for (size_t r = 0; r < tp; ++r) {
    VQ_CHECK(s[r]->size() == s[0]->size(), "session save '{}': rank {} holds {} tokens, rank 0 {}", path, r,
             s[r]->size(), s[0]->size());
    run_on(on_rank, int(r), [&] {
      parts.push_back(encode_sequence(*kv[r], *s[r], tokens, ids[r], true, fmt::format("{} (rank {})", path, r)));
    });
  }
  std::vector<uint8_t> out(24 + 8 * tp);
  std::memcpy(out.data(), kTPSessionMagic, 8);
  const uint32_t version = kTPSessionVersion, n = uint32_t(tp);
  std::memcpy(out.data() + 8, &version, 4);
  std::memcpy(out.data() + 12, &n, 4);
  uint64_t total = out.size() + kSessionDigestBytes;
  for (size_t r = 0; r < tp; ++r) {
    const uint64_t b = parts[r].size();
    std::memcpy(out.data() + 24 + 8 * r, &b, 8);
    total += b;
  }
  std::memcpy(out.data() + 16, &total, 8);
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  if (seal) seal_sequence_bytes(out);
  return out;
}

void save_tp_sequence(const std::string& path, const std::vector<const KVStore*>& kv, const std::vector<const SeqKV*>& s,
                      const std::vector<int32_t>& tokens, const std::vector<KVIdentity>& ids, const RankRunner& on_rank) {
  const std::vector<uint8_t> out = encode_tp_sequence(kv, s, tokens, ids, on_rank, true, path);
  write_file_atomic(path, out.data(), out.size());
}

std::vector<ParsedSession> parse_tp_session(const TPSessionBytes& data, const std::string& path,
                                            const std::vector<SessionExpect>& e) {
  std::vector<ParsedSession> parsed;
  for (size_t r = 0; r < data.parts.size(); ++r) {
    const auto [off, n] = data.parts[r];
    parsed.push_back(parse_session(data.bytes.data() + off, n, fmt::format("{} (rank {})", path, r), e[r]));
    if (r > 0 && (parsed[r].n_kv != parsed[0].n_kv || parsed[r].tokens != parsed[0].tokens))
      throw SessionFileError(fmt::format("{}: rank {} holds other tokens than rank 0", path, r));
  }
  return parsed;
}

std::vector<LoadedSequence> adopt_parsed_tp_sequence(std::vector<ParsedSession> parts, const std::vector<KVStore*>& kv,
                                                     const std::vector<SessionExpect>& e, const RankRunner& on_rank) {
  VQ_CHECK(parts.size() == kv.size() && e.size() == kv.size(), "session load: {} parts for {} stores", parts.size(),
           kv.size());
  std::vector<LoadedSequence> out;
  try {
    for (size_t r = 0; r < kv.size(); ++r)
      run_on(on_rank, int(r), [&] { out.push_back(adopt_parsed_sequence(std::move(parts[r]), *kv[r], e[r])); });
  } catch (...) {
    for (size_t r = 0; r < out.size(); ++r) run_on(on_rank, int(r), [&] { kv[r]->release(out[r].seq); });
    throw;
  }
  return out;
}

std::vector<LoadedSequence> load_tp_sequence(const std::string& path, const std::vector<KVStore*>& kv,
                                             const std::vector<KVIdentity>& ids, const RankRunner& on_rank) {
  const size_t tp = kv.size();
  VQ_CHECK(tp >= 1 && ids.size() == tp, "session load '{}': {} stores, {} identities", path, tp, ids.size());
  std::vector<SessionExpect> e;
  for (size_t r = 0; r < tp; ++r) e.push_back(session_expect(*kv[r], ids[r]));
  const TPSessionBytes data = read_tp_session_file(path, e);
  return adopt_parsed_tp_sequence(parse_tp_session(data, path, e), kv, e, on_rank);
}

}  // namespace vq
