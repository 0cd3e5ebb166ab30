#include "engine/engine.h"

#include <algorithm>
#include <cstdio>

#include "core/error.h"

namespace vq {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::length: return "length";
    case FinishReason::eos: return "eos";
    case FinishReason::stop: return "stop";
    case FinishReason::cancelled: return "cancelled";
    case FinishReason::context: return "context";
    case FinishReason::error: return "error";
  }
  return "?";
}

struct Engine::Seq {
  int64_t id = 0;
  Request req;
  TPSequence kv;  // every rank's KV (ranks[0] alone at tp = 1)
  // tokens: the prompt, then every sampled token; the sequence has fed kv.size() of them.
  std::vector<int32_t> tokens;
  int n_generated = 0;
  std::unique_ptr<Sampler> sampler;
  std::vector<float> logits;  // [n_vocab] of the last fed token
  bool prompt_done = false;   // the original prompt has been fed once (fork point reached)
  // Prefix cache: positions where a prefill chunk must end (see engine.h), and the decode-time
  // point this sequence cached last (replaced by the next one).
  std::vector<int64_t> cuts;
  int64_t rolling_point = -1;
  int64_t fed() const { return kv.size(); }
  int64_t pending() const { return int64_t(tokens.size()) - fed(); }
  int64_t until_cut() const {
    for (int64_t c : cuts)
      if (c > fed()) return c - fed();
    return pending();
  }
};

Engine::Engine(const Model& model, const KVSpec& spec, const EngineOptions& opt) : model_(model), opt_(opt) {
  VQ_CHECK(opt.max_sequences >= 1, "engine: max_sequences {} must be >= 1", opt.max_sequences);
  VQ_CHECK(opt.max_step_tokens >= 1, "engine: max_step_tokens {} must be >= 1", opt.max_step_tokens);
  VQ_CHECK(opt.n_ctx >= 0, "engine: n_ctx {} must be >= 0", opt.n_ctx);
  VQ_CHECK(opt.tp >= 1, "--tp: {} must be >= 1", opt.tp);
  VQ_CHECK(opt.tp == 1 || !opt.deterministic,
           "--tp {}: the deterministic mode is not available with tensor parallelism (its batch-invariant kernels "
           "are the unsplit forward's)", opt.tp);
  if (opt_.n_ctx == 0) opt_.n_ctx = int(std::min<int64_t>(model.config().n_ctx_train > 0 ? model.config().n_ctx_train : 4096, 1 << 20));
  if (opt.tp > 1) {
    tp_ = std::make_unique<TPForward>(model, spec, opt.tp, opt.kv_budget_bytes, nullptr, opt.device);
    for (int r = 0; r < opt.tp; ++r) stores_.push_back(&tp_->store(r));
  } else {
    kv_ = make_kv_store(model, spec, opt.kv_budget_bytes, opt.device);
    fwd_ = std::make_unique<Forward>(model, *kv_);
    fwd_->set_deterministic(opt_.deterministic);
    stores_.push_back(kv_.get());
  }
  if (opt_.prefix_cache)
    cache_ = std::make_unique<PrefixCache>(*stores_[0], std::vector<KVStore*>(stores_.begin() + 1, stores_.end()),
                                           opt_.kv_identity);
}

TPSequence Engine::new_seq() {
  TPSequence s;
  for (size_t r = 0; r < stores_.size(); ++r) s.ranks.push_back(stores_[r]->new_sequence());
  return s;
}

void Engine::release_seq(TPSequence& s) {
  for (size_t r = 0; r < s.ranks.size(); ++r) {
    if (tp_) tp_->on_rank(int(r), [&] { stores_[r]->release(s.ranks[r]); });
    else stores_[r]->release(s.ranks[r]);
  }
  s.ranks.clear();
}

TPSequence Engine::fork_seq(const SeqKV& r0, const SeqKV* extra, int64_t n) {
  TPSequence s;  // forks made before a failure go back when s is dropped
  s.ranks.push_back(stores_[0]->fork(r0, n));
  for (size_t r = 1; r < stores_.size(); ++r) s.ranks.push_back(stores_[r]->fork(extra[r - 1], n));
  return s;
}

size_t Engine::seq_bytes(const TPSequence& s, size_t (KVStore::*f)(const SeqKV&) const) const {
  size_t b = 0;
  for (size_t r = 0; r < s.ranks.size(); ++r) b += (stores_[r]->*f)(s.ranks[r]);
  return b;
}

Engine::~Engine() = default;

int64_t Engine::submit(Request r) {
  VQ_CHECK(!r.prompt.empty(), "engine: a request needs at least one prompt token");
  VQ_CHECK(r.max_new_tokens >= 0, "engine: max_new_tokens {} must be >= 0", r.max_new_tokens);
  const int V = model_.config().n_vocab;
  for (size_t i = 0; i < r.prompt.size(); ++i)
    VQ_CHECK(r.prompt[i] >= 0 && r.prompt[i] < V, "engine: prompt token id {} at index {} out of range [0, {})",
             r.prompt[i], i, V);
  VQ_CHECK(int64_t(r.prompt.size()) < opt_.n_ctx || (int64_t(r.prompt.size()) == opt_.n_ctx && r.max_new_tokens == 0),
           "engine: the prompt has {} tokens, which does not fit the context of {}", r.prompt.size(), opt_.n_ctx);
  auto s = std::make_unique<Seq>();
  s->tokens = r.prompt;
  s->sampler = std::make_unique<Sampler>(r.sampling);
  for (int32_t t : r.prompt) s->sampler->accept(t);
  s->req = std::move(r);
  std::lock_guard<std::mutex> lock(mu_);
  s->id = next_id_++;
  const int64_t id = s->id;
  waiting_.push_back(std::move(s));
  return id;
}

void Engine::cancel(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancelled_.push_back(id);
}

bool Engine::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return waiting_.empty() && running_.empty() && forks_.empty();
}

EngineStats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = stats_;
  s.running = int(running_.size());
  s.waiting = int(waiting_.size());
  for (const auto& [p, v] : forks_) s.waiting += int(v.size());
  return s;
}

void Engine::finish(Seq& s, FinishReason why, const std::string& error) {
  SeqResult r;
  r.id = s.id;
  r.why = why;
  r.error = error;
  r.n_prompt = int64_t(s.req.prompt.size());
  r.n_generated = s.n_generated;
  const bool completed = why == FinishReason::length || why == FinishReason::eos || why == FinishReason::stop;
  if (cache_ && completed && s.kv.valid() && s.fed() > 0) {
    // The sequence's end, for a next turn that extends this conversation.
    const PrefixCache::Inserted p = cache_->insert(s.tokens.data(), s.fed(), s.kv.ranks[0], s.kv.ranks.data() + 1);
    if (s.rolling_point >= 0 && s.rolling_point != p.point) cache_->erase(s.rolling_point);
  }
  if (s.kv.valid()) {
    r.kv_token_bytes = seq_bytes(s.kv, &KVStore::token_bytes);
    r.kv_allocated_bytes = seq_bytes(s.kv, &KVStore::allocated_bytes);
    r.kv_fp16_bytes = seq_bytes(s.kv, &KVStore::fp16_bytes);
  }
  release_seq(s.kv);
  if (s.req.on_finish) s.req.on_finish(r);
}

void Engine::preempt(Seq& s) {
  // Recomputed later from its tokens; the sampler keeps its history and RNG state.
  release_seq(s.kv);
  ++stats_.preemptions;
}

void Engine::admit() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = waiting_.begin(); it != waiting_.end() && int(running_.size()) < opt_.max_sequences;) {
    Seq& s = **it;
    if (s.req.fork_of >= 0 && s.req.fork_of != s.id) {
      // Wait for a running parent that has not fed its prompt yet; else start normally.
      auto p = std::find_if(running_.begin(), running_.end(), [&](const auto& r) { return r->id == s.req.fork_of; });
      if (p != running_.end() && !(*p)->prompt_done) {
        forks_[s.req.fork_of].push_back(std::move(*it));
        it = waiting_.erase(it);
        continue;
      }
    }
    if (!s.kv.valid()) s.kv = new_seq();
    if (cache_ && s.kv.size() == 0) attach_cached_prefix(s);
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }
}

void Engine::adopt_stored_prefix(Seq& s) {
  const std::shared_ptr<const StoredPrefix> sp = std::move(s.req.stored_prefix);
  const int64_t len = int64_t(s.tokens.size()), B = kv().block_tokens(), n = sp->parsed.n_kv;
  if (tp_) {  // a stored prefix holds rank 0's heads only (the server refuses the store with --tp)
    ++stats_.store_not_adopted;
    return;
  }
  if (n <= 0 || n % B != 0 || n > len - 1 || int64_t(sp->parsed.tokens.size()) != n ||
      !std::equal(sp->parsed.tokens.begin(), sp->parsed.tokens.end(), s.tokens.begin())) {
    ++stats_.store_not_adopted;  // not a block-aligned point of this prompt
    return;
  }
  if (cache_->find(s.tokens.data(), len, len - 1).n >= n) return;  // the local cache has as much
  for (;;) {
    try {
      LoadedSequence l = adopt_parsed_sequence(sp->parsed, kv(), sp->expect);
      cache_->insert(s.tokens.data(), n, l.seq);
      kv().release(l.seq);
      ++stats_.store_adopted;
      stats_.store_adopted_tokens += n;
      return;
    } catch (const KVPoolExhausted&) {
      if (!cache_->evict_one()) break;  // cached prefixes make room, as for a prefill
    } catch (const Error& e) {  // well-formed entries whose blocks lack a form the point needs
      std::fprintf(stderr, "veloxquant: a stored prefix of %lld tokens not adopted: %s\n", static_cast<long long>(n),
                   e.what());
      break;
    }
  }
  ++stats_.store_not_adopted;
}

void Engine::attach_cached_prefix(Seq& s) {
  const int64_t len = int64_t(s.tokens.size()), B = kv().block_tokens();
  if (s.req.stored_prefix) adopt_stored_prefix(s);
  const PrefixCache::Hit h = cache_->lookup(s.tokens.data(), len, len - 1);  // it feeds >= 1 token itself
  if (h.seq) {
    try {
      TPSequence f = fork_seq(*h.seq, h.extra, h.n);
      release_seq(s.kv);
      s.kv = std::move(f);
    } catch (const Error&) {
      // cannot happen for a point (it holds its position's forms): recompute (s.kv stays empty)
    }
  }
  s.cuts.clear();
  for (int64_t c : {h.matched, (len - 1) / B * B})
    if (c > s.fed()) s.cuts.push_back(c);
  std::sort(s.cuts.begin(), s.cuts.end());
}

void Engine::cache_points(const BatchEntry& e, Seq& s) {
  const int64_t n = s.fed();
  if (n % kv().block_tokens() != 0) return;
  const PrefixCache::Inserted p = cache_->insert(s.tokens.data(), n, s.kv.ranks[0], s.kv.ranks.data() + 1);
  // Written through only at the cuts (where the cached chain ends, the prompt's last full block):
  // the points another replica can start from; plain chunk ends would resend the prefix each time.
  if (e.n > 1 && p.created && opt_.on_prefill_point && std::find(s.cuts.begin(), s.cuts.end(), n) != s.cuts.end())
    opt_.on_prefill_point(s.tokens.data(), n, s.kv.ranks[0]);
  if (e.n > 1 || !p.created) return;  // prefill points stay (LRU)
  // Decoding: keep only the latest point of this sequence; its end is cached when it finishes.
  if (s.rolling_point >= 0) cache_->erase(s.rolling_point);
  s.rolling_point = p.point;
}

bool Engine::fork_children(Seq& parent) {
  std::lock_guard<std::mutex> lock(mu_);
  auto node = forks_.find(parent.id);
  if (node == forks_.end()) return false;
  std::vector<std::unique_ptr<Seq>> children = std::move(node->second);
  forks_.erase(node);
  for (auto& c : children) {
    // Shared tokens; the child feeds at least its last prompt token itself (for its own logits).
    int64_t n = 0;
    while (n < parent.fed() && n < int64_t(c->tokens.size()) && parent.tokens[size_t(n)] == c->tokens[size_t(n)]) ++n;
    n = std::min<int64_t>(n, int64_t(c->tokens.size()) - 1);
    if (n > 0) {
      try {
        c->kv = fork_seq(parent.kv.ranks[0], parent.kv.ranks.data() + 1, n);
      } catch (const Error&) {
        c->kv = TPSequence();  // the parent no longer holds that point: start from scratch
      }
    }
    waiting_.push_front(std::move(c));
  }
  return true;
}

bool Engine::step() {
  // Cancellations: waiting ones end here, running ones below (their blocks go back at once).
  std::vector<int64_t> cancelled;
  std::vector<std::unique_ptr<Seq>> dropped;
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled.swap(cancelled_);
    for (int64_t id : cancelled) {
      auto w = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& q) { return q->id == id; });
      if (w != waiting_.end()) {
        dropped.push_back(std::move(*w));
        waiting_.erase(w);
      }
      for (auto& [p, v] : forks_) {
        auto c = std::find_if(v.begin(), v.end(), [&](const auto& q) { return q->id == id; });
        if (c != v.end()) {
          dropped.push_back(std::move(*c));
          v.erase(c);
        }
      }
    }
  }
  for (auto& q : dropped) finish(*q, FinishReason::cancelled);
  for (int64_t id : cancelled) {
    auto r = std::find_if(running_.begin(), running_.end(), [&](const auto& q) { return q->id == id; });
    if (r != running_.end()) {
      std::unique_ptr<Seq> q = std::move(*r);
      running_.erase(r);
      finish(*q, FinishReason::cancelled);
      fork_children(*q);
    }
  }
  admit();
  if (running_.empty()) {
    publish_stats();
    return false;
  }

  const int V = model_.config().n_vocab;
  // Build the step: one token for every sequence with one pending, then prefill chunks in start
  // order while the token budget lasts. When the pool cannot hold it: leave out the last prefill
  // chunk, else preempt the newest sequence, else (one sequence alone) end it with an error.
  std::vector<const Seq*> no_prefill;  // left out of this step's prefill
  for (;;) {
    entries_.clear();
    entry_seq_.clear();
    int budget = opt_.max_step_tokens;
    auto add = [&](Seq& q, int n) {
      if (q.logits.empty()) q.logits.resize(size_t(V));
      if (!q.kv.valid()) q.kv = new_seq();
      BatchEntry e;
      e.seq = &q.kv.ranks[0];
      e.tokens = q.tokens.data() + q.fed();
      e.n = n;
      e.logits = q.fed() + n == int64_t(q.tokens.size()) ? LogitsWanted::last : LogitsWanted::none;
      e.out = q.logits.data();
      entries_.push_back(e);
      entry_seq_.push_back(&q);
      budget -= n;
    };
    for (auto& q : running_)
      if (q->pending() == 1 && budget > 0) add(*q, 1);
    bool first_chunk = true;
    for (auto& q : running_) {
      if (q->pending() <= 1 || std::find(no_prefill.begin(), no_prefill.end(), q.get()) != no_prefill.end()) continue;
      if (opt_.deterministic) {
        // Cut at the next multiple of max_step_tokens (or cache cut), whatever the budget left.
        const int64_t C = opt_.max_step_tokens;
        const int64_t n = std::min<int64_t>({q->pending(), C - q->fed() % C, q->until_cut()});
        if (first_chunk || n <= budget) add(*q, int(n));
        first_chunk = false;
        continue;
      }
      if (budget > 0) add(*q, int(std::min<int64_t>({q->pending(), int64_t(budget), q->until_cut()})));
    }
    bool fits = !entries_.empty();
    for (size_t r = 0; r < stores_.size() && fits; ++r) {  // every rank's pool (the same appends)
      std::vector<int64_t> counts;
      for (size_t i = 0; i < entries_.size(); ++i)
        stores_[r]->blocks_for_append(entry_seq_[i]->kv.ranks[r], entries_[i].n, counts);
      fits = stores_[r]->pool().can_allocate(counts);
    }
    if (fits) break;
    if (!entries_.empty() && cache_ && cache_->evict_one()) continue;  // cached prefixes go first
    if (entries_.size() > 1 && entries_.back().n > 1) {
      no_prefill.push_back(entry_seq_.back());
      continue;
    }
    if (running_.size() > 1) {
      std::unique_ptr<Seq> q = std::move(running_.back());
      running_.pop_back();
      preempt(*q);
      no_prefill.clear();
      std::lock_guard<std::mutex> lock(mu_);
      waiting_.push_front(std::move(q));
      continue;
    }
    std::unique_ptr<Seq> q = std::move(running_.back());
    running_.pop_back();
    const int64_t n = std::min<int64_t>(q->pending(), opt_.max_step_tokens);
    std::vector<int64_t> c1;
    if (!q->kv.valid()) q->kv = new_seq();
    kv().blocks_for_append(q->kv.ranks[0], n, c1);
    finish(*q, FinishReason::error,
           fmt::format("the KV pool budget of {:.1f} MiB{} cannot hold this sequence's next {} tokens (they need "
                       "{:.2f} MiB more, {:.2f} MiB are free)",
                       double(kv().pool().budget_bytes()) / 1048576.0, tp_ ? " of each tensor-parallel rank" : "", n,
                       double(kv().pool().bytes_of(c1)) / 1048576.0, double(kv().pool().free_bytes()) / 1048576.0));
    fork_children(*q);
    publish_stats();
    return true;
  }

  const auto t0 = std::chrono::steady_clock::now();
  if (tp_) {
    tp_entries_.clear();
    for (size_t i = 0; i < entries_.size(); ++i) {
      const BatchEntry& e = entries_[i];
      tp_entries_.push_back(TPBatchEntry{&entry_seq_[i]->kv, e.tokens, e.n, e.logits == LogitsWanted::all,
                                         e.logits == LogitsWanted::none ? nullptr : e.out});
    }
    tp_->step(tp_entries_.data(), int(tp_entries_.size()));
  } else {
    fwd_->step(entries_.data(), int(entries_.size()));
  }
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (cache_)
    for (size_t i = 0; i < entries_.size(); ++i) cache_points(entries_[i], *entry_seq_[i]);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.steps;
    stats_.step_seconds += dt;
    stats_.last_step_ms = dt * 1e3;
    for (const BatchEntry& e : entries_) {
      if (e.n == 1 && e.logits == LogitsWanted::last && entry_seq_[size_t(&e - entries_.data())]->prompt_done)
        ++stats_.decode_tokens;
      else
        stats_.prefill_tokens += e.n;
    }
  }
  // Sample and report.
  const Tokenizer* tok = model_.has_tokenizer() ? &model_.tokenizer() : nullptr;
  std::vector<std::pair<Seq*, FinishReason>> ends;
  for (Seq* s : entry_seq_) {
    if (s->pending() != 0) continue;  // a prefill chunk short of the prompt's end
    if (!s->prompt_done) {
      s->prompt_done = true;
      fork_children(*s);
    }
    if (s->n_generated >= s->req.max_new_tokens) {
      ends.emplace_back(s, FinishReason::length);
      continue;
    }
    if (s->req.on_logits) s->req.on_logits(s->id, s->logits.data(), V);
    const int32_t next = s->sampler->sample(s->logits.data(), V);
    s->sampler->accept(next);
    ++s->n_generated;
    const bool keep_going = !s->req.on_token || s->req.on_token(s->id, next);
    if (!keep_going) ends.emplace_back(s, FinishReason::stop);
    else if (tok && tok->is_eog(next) && !s->req.ignore_eos) ends.emplace_back(s, FinishReason::eos);
    else if (s->n_generated >= s->req.max_new_tokens) ends.emplace_back(s, FinishReason::length);
    else if (int64_t(s->tokens.size()) + 1 > opt_.n_ctx) ends.emplace_back(s, FinishReason::context);
    else s->tokens.push_back(next);
  }
  for (auto& [s, why] : ends) {
    auto r = std::find_if(running_.begin(), running_.end(), [&](const auto& p) { return p.get() == s; });
    std::unique_ptr<Seq> own = std::move(*r);
    running_.erase(r);
    finish(*own, why);
    fork_children(*own);
  }
  publish_stats();
  return true;
}

void Engine::publish_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cache_) stats_.prefix = cache_->stats();
  stats_.pool_used_bytes = stats_.pool_budget_bytes = 0;
  for (const KVStore* st : stores_) {  // summed over the ranks
    stats_.pool_used_bytes += st->pool().used_bytes();
    stats_.pool_budget_bytes += st->pool().budget_bytes();
  }
}

void Engine::run() {
  while (step() || !idle()) {
  }
}

}  // namespace vq
