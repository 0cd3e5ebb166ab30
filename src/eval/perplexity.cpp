#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "core/error.h"
#include "model/session.h"

namespace vq {

namespace {
// log-softmax of logits [n] into out [n]; returns argmax.
int log_softmax(const float* x, int n, std::vector<double>& out) {
  int am = 0;
  for (int i = 1; i < n; ++i)
    if (x[i] > x[am]) am = i;
  double s = 0;
  for (int i = 0; i < n; ++i) s += std::exp(double(x[i]) - x[am]);
  const double lse = x[am] + std::log(s);
  out.resize(size_t(n));
  for (int i = 0; i < n; ++i) out[size_t(i)] = double(x[i]) - lse;
  return am;
}

// Running sums of one method over the scored positions.
struct Sums {
  double nll = 0, ref_nll = 0, kl = 0;
  int64_t agree = 0, n = 0;
};
}  // namespace

std::vector<PerplexityResult> evaluate_perplexity(const Model& model, const std::vector<int32_t>& tokens,
                                                  const std::vector<KVSpec>& methods, const KVSpec* reference,
                                                  const PerplexityOptions& opt) {
  VQ_CHECK(opt.n_ctx >= 2, "perplexity: -c {} must be >= 2", opt.n_ctx);
  VQ_CHECK(opt.chunk >= 1, "perplexity: --chunk {} must be >= 1", opt.chunk);
  VQ_CHECK(opt.max_windows >= 1, "perplexity: --windows {} must be >= 1", opt.max_windows);
  VQ_CHECK(tokens.size() >= 2, "perplexity: the text gives {} tokens, need at least 2", tokens.size());
  VQ_CHECK(!methods.empty(), "perplexity: no KV cache method to evaluate");
  const int V = model.config().n_vocab;
  const auto t_start = std::chrono::steady_clock::now();
  const size_t M = methods.size();
  std::vector<PerplexityResult> res(M);
  std::vector<Sums> sums(M);
  const int64_t n_tok = int64_t(tokens.size());
  const int64_t n_windows = std::min<int64_t>(opt.max_windows, (n_tok + opt.n_ctx - 1) / opt.n_ctx);
  // logits: [chunk, V] of the method under way and of the reference
  std::vector<float> lm(size_t(opt.chunk) * V), lr(reference ? size_t(opt.chunk) * V : 0);
  std::vector<double> pm, pr;
  // pr_rows: [chunk] log-softmax rows of the reference, kept while every method is scored
  std::vector<std::vector<double>> pr_rows(reference ? size_t(opt.chunk) : 0);
  std::vector<int> ref_argmax(size_t(opt.chunk));
  for (int64_t w = 0; w < n_windows; ++w) {
    const int64_t b = w * opt.n_ctx, e = std::min(n_tok, b + opt.n_ctx);
    if (e - b < 2) break;
    std::vector<std::unique_ptr<Session>> sm;
    for (const KVSpec& s : methods) sm.push_back(std::make_unique<Session>(model, s, int(e - b), opt.chunk, size_t(-1), opt.device, opt.tp));
    std::unique_ptr<Session> sr;
    if (reference) sr = std::make_unique<Session>(model, *reference, int(e - b), opt.chunk, size_t(-1), opt.device, opt.tp);
    for (int64_t c0 = b; c0 < e; c0 += opt.chunk) {
      const int n = int(std::min<int64_t>(opt.chunk, e - c0));
      // rows of this chunk that predict a token inside the window
      const int scored = int(std::min<int64_t>(n, e - 1 - c0));
      if (sr) {
        sr->forward(tokens.data() + c0, n, lr.data(), true);
        for (int i = 0; i < scored; ++i) ref_argmax[size_t(i)] = log_softmax(lr.data() + size_t(i) * V, V, pr_rows[size_t(i)]);
      }
      for (size_t m = 0; m < M; ++m) {
        sm[m]->forward(tokens.data() + c0, n, lm.data(), true);
        Sums& S = sums[m];
        for (int i = 0; i < scored; ++i) {
          const int32_t next = tokens[size_t(c0 + i + 1)];
          const int am = log_softmax(lm.data() + size_t(i) * V, V, pm);
          S.nll -= pm[size_t(next)];
          if (sr) {
            const std::vector<double>& p = pr_rows[size_t(i)];
            S.ref_nll -= p[size_t(next)];
            double k = 0;
            for (int j = 0; j < V; ++j) k += std::exp(p[size_t(j)]) * (p[size_t(j)] - pm[size_t(j)]);
            S.kl += std::max(0.0, k);
            S.agree += am == ref_argmax[size_t(i)];
          }
          ++S.n;
        }
      }
    }
    for (size_t m = 0; m < M; ++m) {
      PerplexityResult& r = res[m];
      r.kv_bytes = sm[m]->kv_token_bytes();
      r.kv_allocated_bytes = sm[m]->kv_bytes();
      r.kv_fp16_bytes = sm[m]->kv_fp16_bytes();
      r.bits_per_element = r.kv_fp16_bytes ? 16.0 * double(r.kv_bytes) / double(r.kv_fp16_bytes) : 0.0;
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  for (size_t m = 0; m < M; ++m) {
    const Sums& S = sums[m];
    PerplexityResult& r = res[m];
    VQ_CHECK(S.n > 0, "perplexity: no token was scored");
    r.n_scored = S.n;
    r.nll = S.nll / double(S.n);
    r.perplexity = std::exp(r.nll);
    if (reference) {
      r.kl = S.kl / double(S.n);
      r.top1 = double(S.agree) / double(S.n);
      r.ref_perplexity = std::exp(S.ref_nll / double(S.n));
    }
    r.seconds = secs;
  }
  return res;
}

PerplexityResult evaluate_perplexity(const Model& model, const std::vector<int32_t>& tokens,
                                     const KVSpec& method, const KVSpec* reference,
                                     const PerplexityOptions& opt) {
  return evaluate_perplexity(model, tokens, std::vector<KVSpec>{method}, reference, opt)[0];
}

}  // namespace vq
