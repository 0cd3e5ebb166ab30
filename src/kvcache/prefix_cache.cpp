#include "kvcache/prefix_cache.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace vq {

PrefixCache::PrefixCache(KVStore& kv, uint64_t identity) : kv_(kv), B_(kv.block_tokens()), root_(identity) {
  nodes_[root_] = Node{};
}

PrefixCache::PrefixCache(KVStore& kv, std::vector<KVStore*> extra, uint64_t identity)
    : kv_(kv), extra_(std::move(extra)), B_(kv.block_tokens()), root_(identity) {
  for (const KVStore* e : extra_)
    VQ_CHECK(e && e->block_tokens() == B_, "prefix cache: a rank's store has other blocks than rank 0's");
  nodes_[root_] = Node{};
}

PrefixCache::~PrefixCache() {
  listener_ = nullptr;  // going away is not a clear to report
  clear();
}

uint64_t PrefixCache::chain_key(uint64_t parent, const int32_t* block, int block_tokens) {
  return XXH64(block, size_t(block_tokens) * sizeof(int32_t), parent);
}

uint64_t PrefixCache::child_key(uint64_t parent, const int32_t* block) const { return chain_key(parent, block, B_); }

const PrefixCache::Node* PrefixCache::child(uint64_t parent_key, uint64_t key, const int32_t* block) const {
  auto it = nodes_.find(key);
  if (it == nodes_.end()) return nullptr;
  const Node& c = it->second;
  if (c.parent != parent_key || c.tokens.size() != size_t(B_) ||
      std::memcmp(c.tokens.data(), block, size_t(B_) * sizeof(int32_t)) != 0)
    return nullptr;
  return &c;
}

PrefixCache::Hit PrefixCache::lookup(const int32_t* tokens, int64_t n_tokens, int64_t max_n) {
  ++stats_.lookups;
  stats_.lookup_tokens += n_tokens;
  const Hit best = find(tokens, n_tokens, max_n);
  if (best.point >= 0) {
    points_.at(best.point).last_used = ++clock_;
    ++stats_.hits;
    stats_.hit_tokens += best.n;
  }
  return best;
}

PrefixCache::Hit PrefixCache::find(const int32_t* tokens, int64_t n_tokens, int64_t max_n) const {
  Hit best;
  max_n = std::min(max_n, n_tokens);
  uint64_t key = root_;
  const Node* node = &nodes_.at(root_);
  for (int64_t m = 0;; ++m) {
    for (int64_t pid : node->points) {
      const Point& p = points_.at(pid);
      if (p.n > max_n || p.n <= best.n) continue;
      if (std::equal(p.tail.begin(), p.tail.end(), tokens + m * B_)) {
        best.point = pid;
        best.n = p.n;
        best.seq = &p.seq;
        best.extra = p.extra.empty() ? nullptr : p.extra.data();
      }
    }
    best.matched = m * B_;
    if ((m + 1) * B_ > n_tokens) break;
    const uint64_t k = child_key(key, tokens + m * B_);
    const Node* c = child(key, k, tokens + m * B_);
    if (!c) break;
    key = k;
    node = c;
  }
  return best;
}

PrefixCache::Inserted PrefixCache::insert(const int32_t* tokens, int64_t n, const SeqKV& s, const SeqKV* extra) {
  Inserted r;
  VQ_CHECK(extra_.empty() || extra, "prefix cache: a point over {} ranks needs every rank's sequence", extra_.size() + 1);
  if (n <= 0 || s.size() < n) return r;
  uint64_t key = root_;
  const int64_t depth = n / B_;
  // Nodes made here, reported (one stored event) before anything below may prune them.
  uint64_t first_parent = 0;
  std::vector<uint64_t> made;
  auto report = [&] {
    if (!listener_ || made.empty()) return;
    const auto& first = nodes_.at(made.front());
    const int32_t* t0 = tokens + (first.depth - 1) * B_;
    listener_->blocks_stored(first_parent, first_parent == root_, made,
                             std::vector<int32_t>(t0, t0 + int64_t(made.size()) * B_), B_);
    made.clear();
  };
  for (int64_t m = 0; m < depth; ++m) {
    const int32_t* block = tokens + m * B_;
    const uint64_t k = child_key(key, block);
    auto it = nodes_.find(k);
    if (it == nodes_.end()) {
      Node c;
      c.parent = key;
      c.depth = m + 1;
      c.tokens.assign(block, block + B_);
      nodes_.emplace(k, std::move(c));
      ++nodes_.at(key).children;
      if (made.empty()) first_parent = key;
      made.push_back(k);
    } else if (!child(key, k, block)) {
      report();
      prune(key);  // a collision: nodes made above stay only while useful
      return r;
    }
    key = k;
  }
  report();
  Node& node = nodes_.at(key);
  const int32_t* tail = tokens + depth * B_;
  for (int64_t pid : node.points) {
    Point& p = points_.at(pid);
    if (p.n == n && std::equal(p.tail.begin(), p.tail.end(), tail)) {
      p.last_used = ++clock_;
      r.point = pid;
      return r;
    }
  }
  Point p;
  try {
    p.seq = kv_.fork(s, n);
    for (size_t i = 0; i < extra_.size(); ++i) p.extra.push_back(extra_[i]->fork(extra[i], n));
  } catch (const Error&) {
    prune(key);  // s no longer holds what position n reads (p's forks so far go back with it)
    return r;
  }
  p.node = key;
  p.n = n;
  p.tail.assign(tail, tokens + n);
  p.last_used = ++clock_;
  const int64_t id = next_point_++;
  points_.emplace(id, std::move(p));
  node.points.push_back(id);
  ++stats_.inserted;
  r.point = id;
  r.created = true;
  return r;
}

void PrefixCache::prune(uint64_t key) {
  std::vector<uint64_t> removed;
  while (key != root_) {
    auto it = nodes_.find(key);
    if (it == nodes_.end() || !it->second.points.empty() || it->second.children > 0) break;
    const uint64_t parent = it->second.parent;
    nodes_.erase(it);
    --nodes_.at(parent).children;
    removed.push_back(key);
    key = parent;
  }
  if (listener_ && !removed.empty()) listener_->blocks_removed(removed);
}

bool PrefixCache::erase(int64_t point) {
  auto it = points_.find(point);
  if (it == points_.end()) return false;
  const uint64_t key = it->second.node;
  std::vector<int64_t>& v = nodes_.at(key).points;
  v.erase(std::find(v.begin(), v.end(), point));
  points_.erase(it);  // its sequence gives its references back
  prune(key);
  return true;
}

void PrefixCache::pin(int64_t point, bool on) {
  auto it = points_.find(point);
  VQ_CHECK(it != points_.end(), "prefix cache: no point {}", point);
  it->second.pinned = on;
}

bool PrefixCache::pinned(int64_t point) const {
  auto it = points_.find(point);
  return it != points_.end() && it->second.pinned;
}

const SeqKV* PrefixCache::point_sequence(int64_t point) const {
  auto it = points_.find(point);
  return it == points_.end() ? nullptr : &it->second.seq;
}

const SeqKV* PrefixCache::point_extra(int64_t point) const {
  auto it = points_.find(point);
  return it == points_.end() || it->second.extra.empty() ? nullptr : it->second.extra.data();
}

bool PrefixCache::evict_one() {
  int64_t victim = -1;
  uint64_t oldest = UINT64_MAX;
  for (const auto& [id, p] : points_)
    if (!p.pinned && p.last_used < oldest) oldest = p.last_used, victim = id;
  if (victim < 0) return false;
  erase(victim);
  ++stats_.evicted;
  return true;
}

void PrefixCache::clear() {
  if (listener_ && nodes_.size() > 1) listener_->all_cleared();
  points_.clear();
  nodes_.clear();
  nodes_[root_] = Node{};
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s = stats_;
  s.points = int64_t(points_.size());
  s.pinned = int64_t(std::count_if(points_.begin(), points_.end(), [](const auto& p) { return p.second.pinned; }));
  s.nodes = int64_t(nodes_.size());
  return s;
}

}  // namespace vq
