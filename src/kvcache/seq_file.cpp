#include "kvcache/seq_file.h"

#include <cstring>
#include <fstream>
#include <iterator>

#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/error.h"

namespace vq {
namespace {

constexpr char kMagic[8] = {'V', 'Q', 'K', 'V', 'S', 'E', 'S', '\0'};
constexpr uint32_t kVersion = 1;
// magic, version, header bytes, file bytes, 3 checksums, 4 x u32 geometry, dense bytes, n_kv,
// n_tokens, 2 name lengths.
constexpr uint32_t kHeaderBytes = 8 + 4 + 4 + 8 + 24 + 16 + 8 + 8 + 8 + 8;

class Writer {
 public:
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

class Reader {
 public:
  Reader(const uint8_t* p, size_t n, const std::string& path) : p_(p), n_(n), path_(path) {}
  template <class T>
  T get(const char* what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  const uint8_t* take(size_t n, const char* what) {
    VQ_CHECK(n <= n_ - off_, "{}: session file is inconsistent: {} runs past the end", path_, what);
    const uint8_t* r = p_ + off_;
    off_ += n;
    return r;
  }
  size_t offset() const { return off_; }

 private:
  const uint8_t* p_;
  size_t n_, off_ = 0;
  const std::string& path_;
};

std::string hex(uint64_t v) { return fmt::format("{:016x}", v); }

// Zeroes slots [r, B) of a dense block: keys [H][D][B] then values [H][B][D], es bytes each.
void zero_dense_tail(uint8_t* blk, int H, int D, int B, size_t es, int r) {
  for (int h = 0; h < H; ++h)
    for (int c = 0; c < D; ++c) std::memset(blk + ((size_t(h) * D + c) * B + r) * es, 0, size_t(B - r) * es);
  uint8_t* v = blk + size_t(H) * D * B * es;
  for (int h = 0; h < H; ++h) std::memset(v + (size_t(h) * B + r) * D * es, 0, size_t(B - r) * D * es);
}

// Zeroes slots [r, B) of a q8_0/q4_0 block: [2 (K, V)][H][B][row bytes] (kv_format.cpp), the
// one layout of the formats written per token.
void zero_scalar_tail(uint8_t* blk, int H, int B, size_t block_bytes, int r) {
  const size_t row = block_bytes / (2 * size_t(H) * size_t(B));
  for (size_t kh = 0; kh < 2 * size_t(H); ++kh) std::memset(blk + (kh * B + r) * row, 0, size_t(B - r) * row);
}

}  // namespace

void save_sequence(const std::string& path, const KVStore& kv, const SeqKV& s, const std::vector<int32_t>& tokens,
                   const KVIdentity& id) {
  VQ_CHECK(kv.device_kind() == KVDevice::cpu, "{}: session files are read and written from a KV pool on the cpu; "
           "this one lives on the device", path);
  const int64_t n = s.size();
  VQ_CHECK(int64_t(tokens.size()) >= n, "{}: a session of {} KV tokens needs at least as many token ids (got {})",
           path, n, tokens.size());
  const KVGeometry& g = kv.geometry();
  const int B = kv.block_tokens();
  Writer w;
  w.put_bytes(kMagic, 8);
  w.put<uint32_t>(kVersion);
  w.put<uint32_t>(kHeaderBytes);
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
  const bool per_token = method == KVMethod::q8_0 || method == KVMethod::q4_0;
  for (int l = 0; l < kv.n_layers(); ++l) {
    const size_t cbytes = kv.coded_block_bytes(l);
    const int64_t nb = kv.n_blocks(s, l);
    w.put<uint64_t>(cbytes);
    w.put<uint32_t>(uint32_t(nb));
    for (int64_t j = 0; j < nb; ++j) {
      const KVStore::BlockIds b = kv.block_ids(s, l, j);
      w.put<uint8_t>(uint8_t((b.dense >= 0 ? 1 : 0) | (b.coded >= 0 ? 2 : 0)));
    }
    for (int64_t j = 0; j < nb; ++j) {
      const KVStore::BlockIds b = kv.block_ids(s, l, j);
      if (b.dense >= 0) {
        std::memcpy(tmp.data(), kv.block_data(l, false, b.dense), dbytes);
        const int64_t r = std::min<int64_t>(B, n - j * B);
        if (r < B) zero_dense_tail(tmp.data(), g.n_kv_heads, g.head_dim, B, es, int(r));
        w.put_bytes(tmp.data(), dbytes);
      }
      if (b.coded >= 0) {
        const uint8_t* src = kv.block_data(l, true, b.coded);
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
  const uint64_t total = w.buf.size() + 8;
  std::memcpy(w.buf.data() + 16, &total, 8);
  w.put<uint64_t>(checksum64(w.buf.data(), w.buf.size()));
  write_file_atomic(path, w.buf.data(), w.buf.size());
}

LoadedSequence load_sequence(const std::string& path, KVStore& kv, const KVIdentity& id) {
  VQ_CHECK(kv.device_kind() == KVDevice::cpu, "{}: session files are read and written from a KV pool on the cpu; "
           "this one lives on the device", path);
  std::ifstream in(path, std::ios::binary);
  VQ_CHECK(in.good(), "{}: cannot open the session file", path);
  const std::vector<uint8_t> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  VQ_CHECK(data.size() >= kHeaderBytes + 8, "{}: not a session file (truncated: {} bytes)", path, data.size());
  VQ_CHECK(std::memcmp(data.data(), kMagic, 8) == 0, "{}: not a session file (bad magic)", path);
  Reader r(data.data(), data.size(), path);
  r.take(8, "magic");
  const uint32_t version = r.get<uint32_t>("version");
  VQ_CHECK(version == kVersion, "{}: session file version {} is not supported (this build reads version {})", path,
           version, kVersion);
  VQ_CHECK(r.get<uint32_t>("header") == kHeaderBytes, "{}: session file header size is wrong", path);
  const uint64_t total = r.get<uint64_t>("file bytes");
  VQ_CHECK(data.size() >= total, "{}: session file is truncated ({} of {} bytes)", path, data.size(), total);
  VQ_CHECK(data.size() == total, "{}: session file has {} trailing bytes", path, data.size() - total);
  uint64_t stored;
  std::memcpy(&stored, data.data() + data.size() - 8, 8);
  VQ_CHECK(checksum64(data.data(), data.size() - 8) == stored, "{}: session file is corrupted (checksum mismatch)",
           path);
  const uint64_t model = r.get<uint64_t>("model"), spec = r.get<uint64_t>("spec"), calib = r.get<uint64_t>("calib");
  const uint32_t n_layers = r.get<uint32_t>("n_layers"), B = r.get<uint32_t>("block_tokens");
  const uint32_t H = r.get<uint32_t>("n_kv_heads"), D = r.get<uint32_t>("head_dim");
  const uint64_t dbytes = r.get<uint64_t>("dense bytes");
  const int64_t n_kv = r.get<int64_t>("n_kv");
  const uint64_t n_tokens = r.get<uint64_t>("n_tokens");
  const uint32_t mlen = r.get<uint32_t>("model name"), slen = r.get<uint32_t>("spec name");
  const auto* mn = reinterpret_cast<const char*>(r.take(mlen, "model name"));
  const auto* sn = reinterpret_cast<const char*>(r.take(slen, "spec name"));
  const std::string model_name(mn, mlen), spec_name(sn, slen);
  VQ_CHECK(model == id.model, "{}: session was made with model {} (checksum {}), not {} (checksum {})", path,
           model_name, hex(model), id.model_name, hex(id.model));
  VQ_CHECK(spec == id.spec, "{}: session was made with KV cache {} (checksum {}), not {} (checksum {})", path,
           spec_name, hex(spec), id.spec_name, hex(id.spec));
  VQ_CHECK(calib == id.calibration, "{}: session was made with another calibration (checksum {}, this one {})", path,
           hex(calib), hex(id.calibration));
  VQ_CHECK(int(n_layers) == kv.n_layers() && int(B) == kv.block_tokens() && int(H) == kv.geometry().n_kv_heads &&
               int(D) == kv.geometry().head_dim && dbytes == kv.dense_block_bytes(),
           "{}: session geometry ({} layers, {} KV heads of {}, blocks of {} tokens) differs from the cache's", path,
           n_layers, H, D, B);
  VQ_CHECK(n_kv >= 0 && uint64_t(n_kv) <= n_tokens, "{}: session holds {} KV tokens but {} token ids", path, n_kv,
           n_tokens);
  // A checksum proves integrity, not sense: sizes are bounded by the file before anything is allocated.
  VQ_CHECK(n_tokens <= data.size() / sizeof(int32_t), "{}: session file is inconsistent: {} token ids in {} bytes",
           path, n_tokens, data.size());
  LoadedSequence out;
  out.n_kv = n_kv;
  out.tokens.resize(n_tokens);
  std::memcpy(out.tokens.data(), r.take(n_tokens * sizeof(int32_t), "tokens"), n_tokens * sizeof(int32_t));
  const size_t nb = size_t((n_kv + B - 1) / B);
  std::vector<std::vector<KVStore::BlockIds>> ids(n_layers);
  // Blocks allocated so far are given back if anything below fails.
  auto give_back = [&] {
    for (size_t l = 0; l < ids.size(); ++l)
      for (const auto& b : ids[l]) {
        if (b.dense >= 0) kv.release_block(int(l), false, b.dense);
        if (b.coded >= 0) kv.release_block(int(l), true, b.coded);
      }
  };
  try {
    for (uint32_t l = 0; l < n_layers; ++l) {
      const uint64_t cbytes = r.get<uint64_t>("coded bytes");
      VQ_CHECK(cbytes == kv.coded_block_bytes(int(l)), "{}: layer {} coded blocks of {} bytes, the cache's are {}",
               path, l, cbytes, kv.coded_block_bytes(int(l)));
      VQ_CHECK(r.get<uint32_t>("n_blocks") == nb, "{}: layer {} block count differs from {} tokens", path, l, n_kv);
      const uint8_t* forms = r.take(nb, "block forms");
      for (size_t j = 0; j < nb; ++j) {
        VQ_CHECK(forms[j] < 4 && (!(forms[j] & 2) || cbytes > 0), "{}: layer {} block {} has bad forms {}", path, l,
                 j, forms[j]);
        KVStore::BlockIds b;
        if (forms[j] & 1) {
          const uint8_t* src = r.take(dbytes, "dense block");
          b.dense = kv.alloc_block(int(l), false);
          std::memcpy(kv.block_data(int(l), false, b.dense), src, dbytes);
        }
        ids[l].push_back(b);
        if (forms[j] & 2) {
          const uint8_t* src = r.take(cbytes, "coded block");
          ids[l].back().coded = kv.alloc_block(int(l), true);
          std::memcpy(kv.block_data(int(l), true, ids[l].back().coded), src, cbytes);
        }
      }
    }
    VQ_CHECK(r.offset() + 8 == data.size(), "{}: session file has unread bytes before its checksum", path);
  } catch (...) {
    give_back();
    throw;
  }
  out.seq = kv.adopt_blocks(n_kv, std::move(ids));  // releases them itself on error
  return out;
}

}  // namespace vq
