#include "server/prefix_store.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>

#include <chrono>
#include <cstdio>

#include "core/error.h"

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

std::string PrefixStore::key_of(const int32_t* tokens, int64_t n_blocks) const {
  uint64_t k = id_.combined();
  for (int64_t d = 0; d < n_blocks; ++d) k = PrefixCache::chain_key(k, tokens + d * B_, B_);
  return key_hex(k);
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

void PrefixStore::offer(const int32_t* tokens, int64_t n, const SeqKV& s) {
  if (n <= 0 || n % B_ != 0) return;
  uint64_t key = id_.combined();
  for (int64_t d = 0; d < n / B_; ++d) key = PrefixCache::chain_key(key, tokens + d * B_, B_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Written already, a full backlog, or a store known to be down: not worth the copy.
    const bool down = write_conn_->c == nullptr && Clock::now() < write_conn_->retry_at;
    if (written_.count(key) || queued_bytes_ > opt_.max_queued_bytes || down) {
      ++stats_.skipped;
      return;
    }
    written_.insert(key);
  }
  Pending p;
  p.key = key;
  p.bytes = encode_sequence(kv_, s, std::vector<int32_t>(tokens, tokens + n), id_, false, key_hex(key));
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
      Reply r{static_cast<redisReply*>(redisCommand(c, "SET %s %b NX", k.c_str(), p.bytes.data(), p.bytes.size()))};
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
      if (reconnected) written_.clear();  // a store that came back may have lost what we wrote
      if (failed) {
        ++stats_.errors;
        stats_.up = false;
        written_.erase(p.key);  // to be written again when the store is back
      } else {
        stats_.up = true;
        written_.insert(p.key);
      }
      if (stored) {
        ++stats_.written;
        stats_.written_bytes += int64_t(p.bytes.size());
      }
      if (written_.size() > 1000000) written_.clear();
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

std::shared_ptr<const StoredPrefix> PrefixStore::fetch(const std::vector<int32_t>& prompt) {
  const int64_t D = std::min<int64_t>((int64_t(prompt.size()) - 1) / B_, opt_.max_lookup_blocks);
  if (D <= 0) return nullptr;
  std::vector<uint64_t> keys(static_cast<size_t>(D));
  uint64_t k = id_.combined();
  for (int64_t d = 0; d < D; ++d) keys[size_t(d)] = k = PrefixCache::chain_key(k, prompt.data() + d * B_, B_);
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
  auto failed = [&] {
    drop(c, read_conn_->retry_at, opt_);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.errors;
    stats_.up = false;
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
  // Deepest first, in one round trip.
  for (int64_t d = D; d > local; --d) redisAppendCommand(c, "EXISTS %s", key_hex(keys[size_t(d - 1)]).c_str());
  int64_t found = 0;
  for (int64_t d = D; d > local; --d) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK || !raw) return failed();
    Reply r{static_cast<redisReply*>(raw)};
    if (found == 0 && r.r->type == REDIS_REPLY_INTEGER && r.r->integer == 1) found = d;
  }
  if (found == 0) return nullptr;
  const std::string key = key_hex(keys[size_t(found - 1)]);
  Reply r{static_cast<redisReply*>(redisCommand(c, "GET %s", key.c_str()))};
  if (!r.r) return failed();
  if (r.r->type != REDIS_REPLY_STRING) return nullptr;  // gone since (evicted)
  auto sp = std::make_shared<StoredPrefix>();
  sp->bytes.assign(reinterpret_cast<const uint8_t*>(r.r->str), reinterpret_cast<const uint8_t*>(r.r->str) + r.r->len);
  sp->expect = expect_;
  sp->key = keys[size_t(found - 1)];
  std::string why;
  try {
    sp->parsed = parse_session(sp->bytes.data(), sp->bytes.size(), "prefix store entry " + key, expect_);
    const int64_t n = found * B_;
    if (sp->parsed.n_kv != n || int64_t(sp->parsed.tokens.size()) != n ||
        !std::equal(sp->parsed.tokens.begin(), sp->parsed.tokens.end(), prompt.begin()))
      why = fmt::format("prefix store entry {}: its tokens are not the {} tokens of its chain", key, n);
  } catch (const Error& e) {
    why = e.what();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.up = true;
    stats_.fetched_bytes += int64_t(sp->bytes.size());
    if (why.empty()) ++stats_.hits;
    else ++stats_.refused;
  }
  if (!why.empty()) {
    std::fprintf(stderr, "veloxquant serve: refused %s\n", why.c_str());
    Reply d{static_cast<redisReply*>(redisCommand(c, "DEL %s", key.c_str()))};  // a good one replaces it later
    if (!d.r) drop(c, read_conn_->retry_at, opt_);
    return nullptr;
  }
  return sp;
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
