#include "model/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "core/error.h"

namespace vq {

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
  cands_.resize(static_cast<size_t>(n_vocab));
  for (int i = 0; i < n_vocab; ++i) cands_[static_cast<size_t>(i)] = Cand{logits[i], i};

  if (params_.repeat_penalty != 1.0f && !history_.empty()) {
    std::unordered_set<int32_t> seen;
    for (int32_t t : history_) {
      if (t < 0 || t >= n_vocab || !seen.insert(t).second) continue;
      float& l = cands_[static_cast<size_t>(t)].logit;
      l = l > 0.0f ? l / params_.repeat_penalty : l * params_.repeat_penalty;
    }
  }
  auto better = [](const Cand& a, const Cand& b) { return a.logit != b.logit ? a.logit > b.logit : a.id < b.id; };
  // NaN logits never win: they compare false both ways, so map them to -inf first.
  for (Cand& c : cands_) if (std::isnan(c.logit)) c.logit = -INFINITY;

  if (params_.temp <= 0.0f || params_.top_k == 1) {
    return std::min_element(cands_.begin(), cands_.end(), better)->id;
  }

  // top-k: the k best first, sorted descending.
  size_t n = cands_.size();
  if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
    n = static_cast<size_t>(params_.top_k);
    std::nth_element(cands_.begin(), cands_.begin() + static_cast<std::ptrdiff_t>(n) - 1, cands_.end(), better);
  }
  std::sort(cands_.begin(), cands_.begin() + static_cast<std::ptrdiff_t>(n), better);
  const float max_logit = cands_[0].logit;
  if (!std::isfinite(max_logit)) return cands_[0].id;  // every logit -inf (or +inf at the top)

  // top-p on the temperature-1 distribution of the survivors.
  if (params_.top_p < 1.0f) {
    probs_.resize(n);
    double sum = 0.0;
    for (size_t i = 0; i < n; ++i) sum += probs_[i] = std::exp(cands_[i].logit - max_logit);
    double cum = 0.0;
    size_t keep = n;
    for (size_t i = 0; i < n; ++i) {
      cum += probs_[i] / sum;
      if (cum >= params_.top_p) { keep = i + 1; break; }
    }
    n = std::max<size_t>(keep, 1);
  }
  // min-p: p_i >= min_p * p_max  <=>  logit_i >= max_logit + log(min_p).
  if (params_.min_p > 0.0f) {
    const float cut = max_logit + std::log(params_.min_p);
    size_t keep = 1;
    while (keep < n && cands_[keep].logit >= cut) ++keep;
    n = keep;
  }
  // Temperature and the draw.
  probs_.resize(n);
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double p = std::exp(static_cast<double>(cands_[i].logit - max_logit) / params_.temp);
    probs_[i] = p;
    sum += p;
  }
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;  // uniform in [0, sum)
  double acc = 0.0;
  for (size_t i = 0; i < n; ++i) {
    acc += probs_[i];
    if (u < acc) return cands_[i].id;
  }
  return cands_[n - 1].id;  // rounding at the top end
}

}  // namespace vq
