#include "server/prefix_store.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <array>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <cstdio>

#include "core/error.h"
#include "core/sha256.h"

namespace vq {

using Clock = std::chrono::steady_clock;

struct PrefixStore::Conn {
  redisContext* c = nullptr;
  Clock::time_point retry_at{};
  ~Conn() {
    if (c) redisFree(c);
  }
};

void parse_prefix_store_url(const std::string& url, PrefixStoreOptions& o, const char* flag) {
  const std::string scheme = "redis://";
  VQ_CHECK(url.rfind(scheme, 0) == 0 && url.size() > scheme.size(), "{}: '{}' is not redis://HOST[:PORT]", flag, url);
  std::string rest = url.substr(scheme.size());
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  VQ_CHECK(rest.find('/') == std::string::npos && rest.find('@') == std::string::npos,
           "{}: '{}': only redis://HOST[:PORT] (no user, password or database)", flag, url);
  const size_t colon = rest.rfind(':');
  o.host = rest.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    VQ_CHECK(!port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos,
             "{}: '{}': the port must be a number in 1..65535", flag, url);
    o.port = std::stoi(port);
    VQ_CHECK(o.port >= 1 && o.port <= 65535, "{}: '{}': the port must be in 1..65535", flag, url);
  }
  VQ_CHECK(!o.host.empty(), "{}: '{}' names no host", flag, url);
}

PrefixStore::PrefixStore(const PrefixStoreOptions& opt, const KVStore& kv, KVIdentity identity)
    : opt_(opt),
      kv_(kv),
      id_(std::move(identity)),
      expect_(session_expect(kv, id_)),
      B_(kv.block_tokens()),
      read_conn_(std::make_unique<Conn>()),
      write_conn_(std::make_unique<Conn>()) {
  thread_ = std::thread([this] { writer(); });
}

PrefixStore::~PrefixStore() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::string PrefixStore::key_hex(uint64_t chain_key) const {
  return fmt::format("vqkv:{:016x}:{:016x}", id_.combined(), chain_key);
}

std::vector<uint64_t> PrefixStore::chain_keys(const int32_t* tokens, int64_t n_blocks) const {
  std::vector<uint64_t> keys(static_cast<size_t>(n_blocks));
  uint64_t k = id_.combined();
  for (int64_t d = 0; d < n_blocks; ++d) keys[size_t(d)] = k = PrefixCache::chain_key(k, tokens + d * B_, B_);
  return keys;
}

std::string PrefixStore::key_of(const int32_t* tokens, int64_t n_blocks) const {
  return key_hex(n_blocks > 0 ? chain_keys(tokens, n_blocks).back() : id_.combined());
}

namespace {

// A usable connection, connecting when the retry clock allows; false while the store is down.
bool ensure(redisContext*& c, Clock::time_point& retry_at, const PrefixStoreOptions& o, bool* reconnected) {
  if (c && c->err == 0) return true;
  if (Clock::now() < retry_at) return false;
  if (c) redisFree(c);
  timeval ct{o.connect_timeout_ms / 1000, (o.connect_timeout_ms % 1000) * 1000};
  c = redisConnectWithTimeout(o.host.c_str(), o.port, ct);
  if (!c || c->err) {
    if (c) redisFree(c);
    c = nullptr;
    retry_at = Clock::now() + std::chrono::milliseconds(o.retry_ms);
    return false;
  }
  timeval io{o.io_timeout_ms / 1000, (o.io_timeout_ms % 1000) * 1000};
  redisSetTimeout(c, io);
  if (reconnected) *reconnected = true;
  return true;
}

void drop(redisContext*& c, Clock::time_point& retry_at, const PrefixStoreOptions& o) {
  if (c) redisFree(c);
  c = nullptr;
  retry_at = Clock::now() + std::chrono::milliseconds(o.retry_ms);
}

struct Reply {
  redisReply* r = nullptr;
  ~Reply() {
    if (r) freeReplyObject(r);
  }
};

}  // namespace

namespace {

constexpr char kEntryMagic[8] = {'V', 'Q', 'K', 'V', 'P', 'F', 'X', '\0'};
constexpr uint32_t kEntryVersion = 1;
constexpr size_t kMaxForms = size_t(1) << 14;  // points whose forms are kept for delta entries

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof(T));
}

// Bit j of layer l's row of an entry's inheritance bitmap ([n_layers][row bytes]): block j is the ancestor's.
bool inherited_bit(const std::vector<uint8_t>& bits, size_t row, size_t l, int64_t j) {
  return bits[l * row + size_t(j / 8)] >> (j % 8) & 1;
}

}  // namespace

void PrefixStore::offer(const int32_t* tokens, int64_t n, const SeqKV& s) {
  if (n <= 0 || n % B_ != 0) return;
  const int64_t d = n / B_;
  const int L = kv_.n_layers();
  const std::vector<uint64_t> keys = chain_keys(tokens, d);
  const uint64_t key = keys.back();
  Forms mine;
  mine.blocks = d;
  mine.f.resize(size_t(L) * size_t(d));
  for (int l = 0; l < L; ++l)
    for (int64_t j = 0; j < d && j < kv_.n_blocks(s, l); ++j) {
      const KVStore::BlockIds b = kv_.block_ids(s, l, j);
      mine.f[size_t(l) * size_t(d) + size_t(j)] = uint8_t((b.dense >= 0 ? 1 : 0) | (b.coded >= 0 ? 2 : 0));
    }
  int64_t dp = 0;  // the deepest ancestor point this replica wrote, in blocks
  std::vector<uint8_t> inherit;  // [n_layers][bytes of dp bits]: bit j, block j is the ancestor's
  size_t row = 0;                // bytes per layer of inherit
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Written already, a full backlog, or a store known to be down: not worth the copy.
    const bool down = write_conn_->c == nullptr && Clock::now() < write_conn_->retry_at;
    if (written_.count(key) || queued_bytes_ > opt_.max_queued_bytes || down) {
      ++stats_.skipped;
      return;
    }
    written_.insert(key);
    for (int64_t k = d - 1; k >= 1 && dp == 0; --k) {
      const auto it = forms_.find(keys[size_t(k - 1)]);
      if (it == forms_.end() || it->second.blocks != k) continue;
      dp = k;
      // A block of the ancestor whose forms are the same at both points is the same bytes (a full
      // block's KV and codes never change; the fp16 window that has been encoded since differs).
      row = size_t(dp + 7) / 8;
      inherit.assign(size_t(L) * row, 0);
      for (int l = 0; l < L; ++l)
        for (int64_t j = 0; j < dp; ++j)
          if (it->second.f[size_t(l) * size_t(dp) + size_t(j)] == mine.f[size_t(l) * size_t(d) + size_t(j)])
            inherit[size_t(l) * row + size_t(j / 8)] |= uint8_t(1u << (j % 8));
    }
    if (forms_.size() >= kMaxForms) forms_.clear();  // later points start whole entries again
    forms_[key] = std::move(mine);
  }
  Pending p;
  p.key = key;
  p.envelope.reserve(24 + inherit.size() + 32);  // (also keeps GCC 12 from a false -Warray-bounds on the inserts)
  p.envelope.assign(kEntryMagic, kEntryMagic + 8);
  put<uint32_t>(p.envelope, kEntryVersion);
  put<uint32_t>(p.envelope, uint32_t(L));
  put<int64_t>(p.envelope, dp);
  p.envelope.insert(p.envelope.end(), inherit.begin(), inherit.end());
  seal_sequence_bytes(p.envelope);  // the envelope's own SHA-256
  auto omit = [&](int l, int64_t j) { return j < dp && inherited_bit(inherit, row, size_t(l), j); };
  p.bytes = encode_sequence(kv_, s, std::vector<int32_t>(tokens, tokens + n), id_, false, key_hex(key),
                            dp > 0 ? std::function<bool(int, int64_t)>(omit) : std::function<bool(int, int64_t)>());
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued_bytes_ += p.bytes.size();
    queue_.push_back(std::move(p));
  }
  cv_.notify_all();
}

void PrefixStore::writer() {
  for (;;) {
    Pending p;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, everything written
      p = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    const size_t queued = p.bytes.size();
    seal_sequence_bytes(p.bytes);
    p.envelope.insert(p.envelope.end(), p.bytes.begin(), p.bytes.end());  // the entry: envelope, session
    std::vector<uint8_t>().swap(p.bytes);
    const std::vector<uint8_t>& entry = p.envelope;
    bool stored = false, failed = false, reconnected = false;
    // The write connection's fields are this thread's; offer() reads them under mu_ for a hint only.
    redisContext* c;
    Clock::time_point retry_at;
    {
      std::lock_guard<std::mutex> lock(mu_);
      c = write_conn_->c;
      retry_at = write_conn_->retry_at;
    }
    if (ensure(c, retry_at, opt_, &reconnected)) {
      const std::string k = key_hex(p.key);
      Reply r{static_cast<redisReply*>(redisCommand(c, "SET %s %b NX", k.c_str(), entry.data(), entry.size()))};
      if (!r.r || r.r->type == REDIS_REPLY_ERROR) {
        if (!r.r) drop(c, retry_at, opt_);
        failed = true;
      } else {
        stored = r.r->type == REDIS_REPLY_STATUS;  // nil: the key was there already
      }
    } else {
      failed = true;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      write_conn_->c = c;
      write_conn_->retry_at = retry_at;
      if (reconnected && connected_before_) {  // a store that came back may have lost what we wrote
        written_.clear();
        forms_.clear();
      }
      connected_before_ = connected_before_ || reconnected;
      if (failed) {
        ++stats_.errors;
        stats_.up = false;
        written_.erase(p.key);  // to be written again when the store is back
        forms_.erase(p.key);    // and not an ancestor of delta entries meanwhile
      } else {
        stats_.up = true;
        written_.insert(p.key);
      }
      if (stored) {
        ++stats_.written;
        stats_.written_bytes += int64_t(entry.size());
      }
      if (written_.size() > 1000000) {
        written_.clear();
        forms_.clear();
      }
      queued_bytes_ -= queued;
      writing_ = false;
    }
    idle_cv_.notify_all();
  }
}

void PrefixStore::flush() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return queue_.empty() && !writing_; });
}

namespace {

// One fetched entry: its bytes, envelope and parsed session (views into bytes).
struct Link {
  std::vector<uint8_t> bytes;
  int64_t dp = 0;
  size_t row = 0;
  std::vector<uint8_t> inherit;  // as the envelope: [n_layers][row], bit j of a row: block j is the ancestor's
  ParsedSession parsed;
  bool inherited(size_t l, int64_t j) const { return j < dp && inherited_bit(inherit, row, l, j); }
};

// Parses an entry of `depth` blocks for the prompt; throws SessionFileError naming `key`.
void parse_entry(Link& e, int64_t depth, const std::vector<int32_t>& prompt, const std::string& key,
                 const SessionExpect& expect) {
  const uint8_t* b = e.bytes.data();
  const size_t n = e.bytes.size(), head = 8 + 4 + 4 + 8;
  auto fail = [&](const std::string& why) { throw SessionFileError(fmt::format("prefix store entry {}: {}", key, why)); };
  if (n < head || std::memcmp(b, kEntryMagic, 8) != 0) fail("not a prefix store entry (no VQKVPFX header)");
  uint32_t version, layers;
  std::memcpy(&version, b + 8, 4);
  std::memcpy(&layers, b + 12, 4);
  std::memcpy(&e.dp, b + 16, 8);
  if (version != kEntryVersion) fail(fmt::format("version {} (this build reads {})", version, kEntryVersion));
  if (layers != expect.n_layers) fail(fmt::format("{} layers in its envelope, the model has {}", layers, expect.n_layers));
  if (e.dp < 0 || e.dp >= depth) fail(fmt::format("an ancestor of {} blocks for a point of {}", e.dp, depth));
  e.row = size_t(e.dp + 7) / 8;
  const size_t env = head + size_t(layers) * e.row;
  if (n < env + kSessionDigestBytes) fail("truncated envelope");
  Sha256 sha;
  sha.update(b, env);
  const std::array<uint8_t, 32> digest = sha.finish();
  if (std::memcmp(digest.data(), b + env, kSessionDigestBytes) != 0) fail("its envelope fails its SHA-256");
  e.inherit.assign(b + head, b + env);
  const size_t off = env + kSessionDigestBytes;
  e.parsed = parse_session(b + off, n - off, "prefix store entry " + key, expect);
  const int64_t toks = depth * int64_t(expect.block_tokens);
  if (e.parsed.n_kv != toks || int64_t(e.parsed.tokens.size()) != toks ||
      !std::equal(e.parsed.tokens.begin(), e.parsed.tokens.end(), prompt.begin()))
    fail(fmt::format("its tokens are not the {} tokens of its chain", toks));
  for (size_t l = 0; l < e.parsed.blocks.size(); ++l)
    for (int64_t j = 0; j < e.dp; ++j)
      if (e.inherited(l, j) && (e.parsed.blocks[l][size_t(j)].dense || e.parsed.blocks[l][size_t(j)].coded))
        fail(fmt::format("layer {} block {} is both its own and its ancestor's", l, j));
}

}  // namespace

std::shared_ptr<const StoredPrefix> PrefixStore::fetch(const std::vector<int32_t>& prompt) {
  const int64_t D = std::min<int64_t>((int64_t(prompt.size()) - 1) / B_, opt_.max_lookup_blocks);
  if (D <= 0) return nullptr;
  const std::vector<uint64_t> keys = chain_keys(prompt.data(), D);
  int64_t local = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t d = D; d > 0; --d)
      if (local_.count(keys[size_t(d - 1)])) {
        local = d;
        break;
      }
  }
  if (local >= D) return nullptr;  // the local cache's chain covers every full block

  std::lock_guard<std::mutex> rlock(read_mu_);
  redisContext*& c = read_conn_->c;
  int64_t fetched = 0;
  auto count = [&](bool hit, bool refused) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.up = true;
    stats_.fetched_bytes += fetched;
    stats_.hits += hit;
    stats_.refused += refused;
  };
  auto failed = [&] {
    drop(c, read_conn_->retry_at, opt_);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.errors;
    stats_.up = false;
    stats_.fetched_bytes += fetched;
    return nullptr;
  };
  if (!ensure(c, read_conn_->retry_at, opt_, nullptr)) {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.up = false;
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.lookups;
  }
  // The stored points past the local cache, deepest first, in one round trip.
  for (int64_t d = D; d > local; --d) redisAppendCommand(c, "EXISTS %s", key_hex(keys[size_t(d - 1)]).c_str());
  std::vector<int64_t> found;
  for (int64_t d = D; d > local; --d) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK || !raw) return failed();
    Reply r{static_cast<redisReply*>(raw)};
    if (r.r->type == REDIS_REPLY_INTEGER && r.r->integer == 1) found.push_back(d);
  }
  // A point's chain of entries down to a whole one, each fetched once; a link that is gone makes
  // its dependants a miss, and the next deepest point is tried.
  std::map<int64_t, std::unique_ptr<Link>> links;  // depth -> entry; nullptr: gone
  int gets = 0;
  constexpr int kMaxGets = 64;
  for (const int64_t top : found) {
    std::vector<Link*> chain;
    bool broken = false;
    for (int64_t d = top; d > 0 && !broken;) {
      auto it = links.find(d);
      if (it == links.end()) {
        if (++gets > kMaxGets) return count(false, false), nullptr;
        const std::string key = key_hex(keys[size_t(d - 1)]);
        Reply r{static_cast<redisReply*>(redisCommand(c, "GET %s", key.c_str()))};
        if (!r.r) return failed();
        std::unique_ptr<Link> e;
        if (r.r->type == REDIS_REPLY_STRING) {  // else gone (evicted) since
          e = std::make_unique<Link>();
          e->bytes.assign(reinterpret_cast<const uint8_t*>(r.r->str), reinterpret_cast<const uint8_t*>(r.r->str) + r.r->len);
          fetched += int64_t(e->bytes.size());
          try {
            parse_entry(*e, d, prompt, key, expect_);
          } catch (const Error& err) {
            std::fprintf(stderr, "veloxquant serve: refused %s\n", err.what());
            count(false, true);
            Reply del{static_cast<redisReply*>(redisCommand(c, "DEL %s", key.c_str()))};  // a good one replaces it later
            if (!del.r) drop(c, read_conn_->retry_at, opt_);
            return nullptr;
          }
        }
        it = links.emplace(d, std::move(e)).first;
      }
      if (!it->second) {
        broken = true;
        break;
      }
      chain.push_back(it->second.get());
      d = it->second->dp;
    }
    if (broken) continue;
    // Assemble from the whole entry up: each link's inherited blocks are its ancestor's.
    auto sp = std::make_shared<StoredPrefix>();
    sp->expect = expect_;
    sp->key = keys[size_t(top - 1)];
    std::vector<std::vector<ParsedSession::Block>> blocks = chain.back()->parsed.blocks;
    for (size_t i = chain.size() - 1; i-- > 0;) {
      std::vector<std::vector<ParsedSession::Block>> up = chain[i]->parsed.blocks;
      for (size_t l = 0; l < up.size(); ++l)
        for (int64_t j = 0; j < chain[i]->dp; ++j)
          if (chain[i]->inherited(l, j)) up[l][size_t(j)] = blocks[l][size_t(j)];
      blocks = std::move(up);
    }
    sp->parsed.n_kv = chain.front()->parsed.n_kv;
    sp->parsed.tokens = chain.front()->parsed.tokens;
    sp->parsed.blocks = std::move(blocks);
    for (Link* e : chain) sp->parts.push_back(std::move(e->bytes));  // the views stay valid: the buffers move
    count(true, false);
    return sp;
  }
  count(false, false);
  return nullptr;
}

void PrefixStore::blocks_stored(uint64_t, bool, const std::vector<uint64_t>& keys, const std::vector<int32_t>&, int) {
  std::lock_guard<std::mutex> lock(mu_);
  local_.insert(keys.begin(), keys.end());
}

void PrefixStore::blocks_removed(const std::vector<uint64_t>& keys) {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint64_t k : keys) local_.erase(k);
}

void PrefixStore::all_cleared() {
  std::lock_guard<std::mutex> lock(mu_);
  local_.clear();
}

PrefixStoreStats PrefixStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string PrefixStore::render_metrics() const {
  const PrefixStoreStats s = stats();
  std::string o;
  auto one = [&o](const char* name, const char* type, const char* help, int64_t v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n{} {}\n", name, help, name, type, name, v);
  };
  one("vq_prefix_store_up", "gauge", "1 when the last command reached the shared prefix store", s.up ? 1 : 0);
  one("vq_prefix_store_lookups_total", "counter", "Prompts looked up in the shared prefix store", s.lookups);
  one("vq_prefix_store_hits_total", "counter", "Entries fetched and accepted", s.hits);
  one("vq_prefix_store_fetched_bytes_total", "counter", "Bytes of entries read from the store", s.fetched_bytes);
  one("vq_prefix_store_written_total", "counter", "Entries written to the store", s.written);
  one("vq_prefix_store_written_bytes_total", "counter", "Bytes written to the store", s.written_bytes);
  one("vq_prefix_store_skipped_total", "counter", "Points not written (already there, backlog full, store down)",
      s.skipped);
  one("vq_prefix_store_refused_total", "counter", "Entries refused (identity, hash, size, values or tokens wrong)",
      s.refused);
  one("vq_prefix_store_errors_total", "counter", "Store commands that failed (store down or timed out)", s.errors);
  return o;
}

}  // namespace vq
