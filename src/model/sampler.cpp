#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "core/error.h"

namespace vq {

namespace {
// Higher logit first, lower id on ties: a strict total order on candidates.
struct Better {
  template <class C>
  bool operator()(const C& a, const C& b) const { return a.logit != b.logit ? a.logit > b.logit : a.id < b.id; }
};
}  // namespace

Sampler::Sampler(const SamplerParams& params) : params_(params), rng_(params.seed) {
  VQ_CHECK(std::isfinite(params.temp), "sampler: temp {} is not finite", params.temp);
  VQ_CHECK(params.top_p >= 0.0f && params.top_p <= 1.0f, "sampler: top_p {} is outside [0, 1]", params.top_p);
  VQ_CHECK(params.min_p >= 0.0f && params.min_p <= 1.0f, "sampler: min_p {} is outside [0, 1]", params.min_p);
  VQ_CHECK(params.repeat_penalty > 0.0f && std::isfinite(params.repeat_penalty),
           "sampler: repeat_penalty {} must be positive", params.repeat_penalty);
  VQ_CHECK(params.repeat_last_n >= 0, "sampler: repeat_last_n {} is negative", params.repeat_last_n);
}

void Sampler::accept(int32_t token) {
  if (params_.repeat_last_n <= 0) return;
  history_.push_back(token);
  while (static_cast<int>(history_.size()) > params_.repeat_last_n) history_.pop_front();
}

void Sampler::reset() {
  history_.clear();
  rng_.seed(params_.seed);
}

int32_t Sampler::sample(const float* logits, int n_vocab) {
  VQ_CHECK(logits != nullptr && n_vocab > 0, "sampler: no logits (n_vocab = {})", n_vocab);
  const float* l = logits;
  if (params_.repeat_penalty != 1.0f && !history_.empty()) {
    penalised_.assign(logits, logits + n_vocab);
    std::unordered_set<int32_t> seen;
    for (int32_t t : history_) {
      if (t < 0 || t >= n_vocab || !seen.insert(t).second) continue;  // each distinct token once
      float& x = penalised_[static_cast<size_t>(t)];
      x = x > 0.0f ? x / params_.repeat_penalty : x * params_.repeat_penalty;
    }
    l = penalised_.data();
  }

  // Greedy: first maximum; NaN never compares greater, so it never wins.
  if (params_.temp <= 0.0f || params_.top_k == 1) {
    int32_t best = 0;
    float bv = -INFINITY;
    for (int i = 0; i < n_vocab; ++i) {
      if (l[i] > bv) { bv = l[i]; best = i; }
    }
    return best;
  }

  // Candidates: the k best through a min-heap of size k (one pass), or every non-NaN logit.
  cands_.clear();
  const Better better;
  const bool use_k = params_.top_k > 0 && params_.top_k < n_vocab;
  if (use_k) {
    const auto k = static_cast<size_t>(params_.top_k);
    for (int i = 0; i < n_vocab; ++i) {
      const Cand c{l[i], i};
      if (std::isnan(c.logit)) continue;
      if (cands_.size() < k) {
        cands_.push_back(c);
        std::push_heap(cands_.begin(), cands_.end(), better);  // heap top: the worst kept
      } else if (better(c, cands_.front())) {
        std::pop_heap(cands_.begin(), cands_.end(), better);
        cands_.back() = c;
        std::push_heap(cands_.begin(), cands_.end(), better);
      }
    }
  } else {
    cands_.reserve(static_cast<size_t>(n_vocab));
    for (int i = 0; i < n_vocab; ++i) if (!std::isnan(l[i])) cands_.push_back(Cand{l[i], i});
  }
  if (cands_.empty()) return 0;  // every logit NaN
  float max_logit = -INFINITY;
  int32_t max_id = cands_[0].id;
  for (const Cand& c : cands_) if (better(c, Cand{max_logit, max_id})) { max_logit = c.logit; max_id = c.id; }
  if (!std::isfinite(max_logit)) return max_id;  // all -inf, or +inf at the top

  // top-p normaliser: the temperature-1 mass of every candidate (before min-p).
  double z = 0.0;
  const bool use_p = params_.top_p < 1.0f;
  if (use_p) for (const Cand& c : cands_) z += std::exp(static_cast<double>(c.logit - max_logit));
  // min-p: p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p).
  if (params_.min_p > 0.0f) {
    const float cut = max_logit + std::log(params_.min_p);
    cands_.erase(std::remove_if(cands_.begin(), cands_.end(), [&](const Cand& c) { return c.logit < cut; }), cands_.end());
  }
  size_t n = cands_.size();
  if (use_p) {
    // Sort a growing prefix until its mass reaches top_p.
    double cum = 0.0;
    size_t done = 0, m = std::min<size_t>(64, n), keep = n;
    for (bool found = false; !found;) {
      const auto first = cands_.begin() + static_cast<std::ptrdiff_t>(done);
      if (m * 4 >= n) { m = n; std::sort(first, cands_.end(), better); }  // a long prefix: sort the rest
      else std::partial_sort(first, cands_.begin() + static_cast<std::ptrdiff_t>(m), cands_.end(), better);
      for (; done < m; ++done) {
        cum += std::exp(static_cast<double>(cands_[done].logit - max_logit)) / z;
        if (cum >= params_.top_p) { keep = done + 1; found = true; break; }
      }
      if (m == n) break;
      m = std::min(n, m * 2);
    }
    n = std::max<size_t>(keep, 1);
  } else if (use_k) {
    std::sort(cands_.begin(), cands_.end(), better);  // k entries: a platform-independent order
  }

  // Temperature and the draw.
  probs_.resize(n);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += probs_[i] = std::exp(static_cast<double>(cands_[i].logit - max_logit) / params_.temp);
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += probs_[i];
    if (u < acc) return cands_[i].id;
  }
  return cands_[n - 1].id;  // rounding at the top end
}

}  // namespace vq
