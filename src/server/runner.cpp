#include "server/runner.h"

#include <sys/stat.h>

#include <cstdio>
#include <future>

#include "core/atomic_file.h"
#include "core/error.h"
#include "kvcache/seq_file.h"
#include "server/prefix_store.h"

namespace vq {

Runner::Runner(Engine& engine, Metrics& metrics, KVIdentity identity, std::string session_dir, int max_sessions)
    : engine_(engine),
      metrics_(metrics),
      identity_(std::move(identity)),
      session_dir_(std::move(session_dir)),
      max_sessions_(max_sessions) {
  thread_ = std::thread([this] { loop(); });
}

Runner::~Runner() {
  cancel_all();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Runner::loop() {
  for (;;) {
    std::vector<std::function<void()>> tasks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks.swap(tasks_);
    }
    for (auto& t : tasks) t();
    bool worked = false;
    try {
      worked = engine_.step();
    } catch (const std::exception& e) {
      // A step refuses before changing anything (Forward::step); report and go on.
      std::fprintf(stderr, "veloxquant serve: engine step failed: %s\n", e.what());
    }
    if (worked) continue;
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_ && live_.empty() && tasks_.empty()) return;
    cv_.wait_for(lock, std::chrono::milliseconds(200), [this] { return wake_ || stop_ || !tasks_.empty(); });
    wake_ = false;
  }
}

std::shared_ptr<Channel> Runner::submit(GenParams p, Channel::Clock::time_point arrived) {
  auto c = std::make_shared<Channel>();
  c->arrived = arrived;
  c->params = p;
  c->stream = std::make_unique<TextStream>(engine_.model().tokenizer(), p.stop);
  Request r;
  r.prompt = p.prompt;
  r.sampling = p.sampling;
  r.max_new_tokens = p.max_tokens;
  r.ignore_eos = p.ignore_eos;
  if (store_) r.stored_prefix = store_->fetch(r.prompt);  // nullptr on a miss or a store that is down
  Channel* ch = c.get();
  const int n_vocab = engine_.model().config().n_vocab;
  if (p.logprobs >= 0) r.on_logits = [ch](int64_t, const float* logits, int) { ch->logits = logits; };
  r.on_token = [this, ch, n_vocab](int64_t, int32_t tok) {
    const std::string d = ch->stream->push(tok);
    TokenLogprob lp;
    if (ch->logits) lp = token_logprob(ch->logits, n_vocab, tok, ch->params.logprobs);
    {
      std::lock_guard<std::mutex> lock(ch->mu);
      if (ch->logits) ch->logprobs.push_back(std::move(lp));
      if (ch->tokens.empty()) metrics_.observe_ttft(std::chrono::duration<double>(Channel::Clock::now() - ch->arrived).count());
      ch->tokens.push_back(tok);
      ch->text += d;
    }
    ch->cv.notify_all();
    return !ch->stream->stopped();
  };
  r.on_finish = [this, ch](const SeqResult& res) { finished(*ch, res); };
  std::lock_guard<std::mutex> lock(mu_);
  // Under mu_: the engine's thread cannot finish it (and look it up) before it is registered.
  c->id = engine_.submit(std::move(r));
  live_[c->id] = c;
  metrics_.set_in_flight(int64_t(live_.size()));
  wake_ = true;
  cv_.notify_all();
  return c;
}

void Runner::finished(Channel& c, const SeqResult& r) {
  // Engine thread, inside Engine::finish (the end point is already in the prefix cache).
  // The ends the engine caches a point for (a sequence that filled its context has no next turn).
  const bool completed = r.why == FinishReason::length || r.why == FinishReason::eos || r.why == FinishReason::stop;
  std::string tail = c.stream->finish();
  if (completed && !c.params.session.empty()) {
    std::vector<int32_t> all = c.params.prompt;
    all.insert(all.end(), c.tokens.begin(), c.tokens.end());
    try {
      pin_session(c.params.session, all, int64_t(all.size()) - 1);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "veloxquant serve: session '%s' not kept: %s\n", c.params.session.c_str(), e.what());
    }
  }
  metrics_.count_tokens(r.n_prompt, r.n_generated);
  std::shared_ptr<Channel> keep;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(r.id);
    if (it != live_.end()) keep = it->second, live_.erase(it);
    metrics_.set_in_flight(int64_t(live_.size()));
  }
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.text += tail;
    c.result = r;
    switch (r.why) {
      case FinishReason::eos:
      case FinishReason::stop: c.finish_reason = "stop"; break;
      case FinishReason::length:
      case FinishReason::context: c.finish_reason = "length"; break;
      case FinishReason::cancelled: c.finish_reason = "cancelled"; break;
      case FinishReason::error: c.finish_reason = "error"; break;
    }
    c.done = true;
  }
  c.cv.notify_all();
}

void Runner::cancel(const Channel& c) {
  engine_.cancel(c.id);
  std::lock_guard<std::mutex> lock(mu_);
  wake_ = true;
  cv_.notify_all();
}

void Runner::cancel_all() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, c] : live_) engine_.cancel(id);
  wake_ = true;
  cv_.notify_all();
}

int64_t Runner::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int64_t(live_.size());
}

void Runner::call(const std::function<void()>& fn) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> f = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    VQ_CHECK(!stop_, "the server is stopping");
    tasks_.push_back([fn, done] {
      try {
        fn();
        done->set_value();
      } catch (...) {
        done->set_exception(std::current_exception());
      }
    });
  }
  cv_.notify_all();
  f.get();
}

// ---- sessions (engine thread) ----

std::string Runner::session_path(const std::string& name) const { return session_dir_ + "/" + name + ".vqkv"; }

void Runner::pin_session(const std::string& name, std::vector<int32_t> tokens, int64_t n_kv) {
  PrefixCache* cache = engine_.prefix_cache();
  VQ_CHECK(cache, "sessions need the prefix cache");
  const PrefixCache::Hit h = cache->find(tokens.data(), n_kv, n_kv);
  VQ_CHECK(h.point >= 0 && h.n == n_kv, "the conversation's KV ({} tokens) is not in the cache", n_kv);
  auto it = sessions_.find(name);
  if (it == sessions_.end())
    VQ_CHECK(int(sessions_.size()) < max_sessions_, "{} sessions are kept already (--max-sessions); delete one",
             sessions_.size());
  cache->pin(h.point, true);
  const int64_t old = it == sessions_.end() ? -1 : it->second.point;
  sessions_[name] = Session{h.point, std::move(tokens), n_kv};
  if (old >= 0) unpin_unless_named(old);  // the older turn goes back to the LRU
}

void Runner::unpin_unless_named(int64_t point) {
  for (const auto& [n, s] : sessions_)
    if (s.point == point) return;  // two names for one conversation: it stays pinned for the other
  engine_.prefix_cache()->pin(point, false);
}

SessionInfo Runner::save_session(const std::string& name) {
  // The engine's thread only copies the blocks' bytes out of the pool (from the device pool: one
  // batch of copies, one wait); the digest and the file write run here, while the engine steps on.
  SessionInfo info;
  const std::string path = session_path(name);
  std::vector<uint8_t> bytes;
  call([&] {
    auto it = sessions_.find(name);
    if (it == sessions_.end()) throw ApiError(404, "no session '" + name + "' in memory", "id", "not_found_error");
    const SeqKV* s = engine_.prefix_cache()->point_sequence(it->second.point);
    VQ_CHECK(s, "session '{}' lost its KV (internal error)", name);
    if (engine_.tp() > 1) {  // one file over the ranks (kvcache/seq_file.h)
      const SeqKV* extra = engine_.prefix_cache()->point_extra(it->second.point);
      std::vector<const KVStore*> kv;
      std::vector<const SeqKV*> seqs;
      for (int r = 0; r < engine_.tp(); ++r) {
        kv.push_back(&engine_.kv(r));
        seqs.push_back(r == 0 ? s : &extra[r - 1]);
      }
      bytes = encode_tp_sequence(kv, seqs, it->second.tokens, rank_identities(), rank_runner(), /*seal=*/false, path);
    } else {
      bytes = encode_sequence(engine_.kv(), *s, it->second.tokens, identity_, /*seal=*/false, path);
    }
    info = {name, int64_t(it->second.tokens.size()), it->second.n_kv};
  });
  seal_sequence_bytes(bytes);
  ::mkdir(session_dir_.c_str(), 0755);
  write_file_atomic(path, bytes.data(), bytes.size());
  return info;
}

SessionInfo Runner::restore_session(const std::string& name) {
  // The file is read, its digest and every check run here (session_expect reads only what the store
  // fixed at construction); the engine's thread only copies the checked bytes into new blocks. A
  // tensor-parallel engine reads the split file: one part per rank, all taken or none.
  SessionInfo info;
  if (!engine_.prefix_cache()) throw ApiError(400, "sessions need the prefix cache (started with --no-prefix-cache)");
  const std::string path = session_path(name);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw ApiError(404, "no saved session '" + name + "'", "id", "not_found_error");
  const int tp = engine_.tp();
  const std::vector<KVIdentity> ids = rank_identities();
  std::vector<SessionExpect> expect;
  for (int r = 0; r < tp; ++r) expect.push_back(session_expect(engine_.kv(r), ids[size_t(r)]));
  std::vector<uint8_t> data;
  TPSessionBytes split;
  std::vector<ParsedSession> parsed;
  try {
    if (tp > 1) {
      split = read_tp_session_file(path, expect);
      parsed = parse_tp_session(split, path, expect);
    } else {
      data = read_session_file(path, expect[0]);
      parsed.push_back(parse_session(data.data(), data.size(), path, expect[0]));
    }
  } catch (const Error& e) {
    throw ApiError(422, e.what(), "id");
  }
  const size_t rank_bytes = (tp > 1 ? split.bytes.size() : data.size()) / size_t(tp);
  call([&] {
    PrefixCache* cache = engine_.prefix_cache();
    // Room first: unpinned cached prefixes make way (the file's size bounds the blocks it needs).
    while (engine_.kv().pool().free_bytes() < rank_bytes && cache->evict_one()) {
    }
    std::vector<KVStore*> kv;
    for (int r = 0; r < tp; ++r) kv.push_back(&engine_.kv(r));
    std::vector<LoadedSequence> ld;
    try {
      ld = adopt_parsed_tp_sequence(std::move(parsed), kv, expect, rank_runner());
    } catch (const KVPoolExhausted& e) {
      throw ApiError(503, std::string("the KV pool cannot hold the session now: ") + e.what());
    } catch (const Error& e) {
      throw ApiError(422, e.what(), "id");
    }
    if (ld[0].n_kv == 0) throw ApiError(422, "session '" + name + "' holds no KV", "id");
    std::vector<SeqKV> extra;  // ranks 1..
    for (size_t r = 1; r < ld.size(); ++r) extra.push_back(std::move(ld[r].seq));
    const PrefixCache::Inserted p = cache->insert(ld[0].tokens.data(), ld[0].n_kv, ld[0].seq, extra.data());
    VQ_CHECK(p.point >= 0, "session '{}' could not be cached (internal error)", name);
    pin_session(name, ld[0].tokens, ld[0].n_kv);
    info = {name, int64_t(ld[0].tokens.size()), ld[0].n_kv};
  });
  return info;
}

std::vector<KVIdentity> Runner::rank_identities() const {
  // identity_ is the unsplit store's (it roots the prefix cache); each rank's store of a split engine
  // has its heads and its slice of the calibration.
  if (engine_.tp() == 1) return {identity_};
  std::vector<KVIdentity> ids;
  for (int r = 0; r < engine_.tp(); ++r) ids.push_back(kv_identity_like(identity_, engine_.kv(r)));
  return ids;
}

RankRunner Runner::rank_runner() {
  TPForward* tp = engine_.tensor_parallel();
  if (!tp) return {};
  return [tp](int r, const std::function<void()>& f) { tp->on_rank(r, f); };
}

void Runner::delete_session(const std::string& name) {
  call([&] {
    auto it = sessions_.find(name);
    if (it == sessions_.end()) throw ApiError(404, "no session '" + name + "' in memory", "id", "not_found_error");
    const int64_t point = it->second.point;
    sessions_.erase(it);
    unpin_unless_named(point);
  });
}

std::vector<SessionInfo> Runner::sessions() {
  std::vector<SessionInfo> out;
  call([&] {
    for (const auto& [name, s] : sessions_) out.push_back({name, int64_t(s.tokens.size()), s.n_kv});
  });
  return out;
}

}  // namespace vq
