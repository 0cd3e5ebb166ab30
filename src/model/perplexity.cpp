#include "model/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

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
}  // namespace

PerplexityResult evaluate_perplexity(const Model& model, const std::vector<int32_t>& tokens,
                                     const KVSpec& method, const KVSpec* reference,
                                     const PerplexityOptions& opt) {
  VQ_CHECK(opt.n_ctx >= 2, "perplexity: -c {} must be >= 2", opt.n_ctx);
  VQ_CHECK(opt.chunk >= 1, "perplexity: --chunk {} must be >= 1", opt.chunk);
  VQ_CHECK(opt.max_windows >= 1, "perplexity: --windows {} must be >= 1", opt.max_windows);
  VQ_CHECK(tokens.size() >= 2, "perplexity: the text gives {} tokens, need at least 2", tokens.size());
  const int V = model.config().n_vocab;
  const auto t_start = std::chrono::steady_clock::now();
  PerplexityResult r;
  double nll = 0, ref_nll = 0, kl = 0;
  int64_t agree = 0;
  const int64_t n_tok = int64_t(tokens.size());
  const int64_t n_windows = std::min<int64_t>(opt.max_windows, (n_tok + opt.n_ctx - 1) / opt.n_ctx);
  // logits: [chunk, V] of the method and of the reference
  std::vector<float> lm(size_t(opt.chunk) * V), lr(reference ? size_t(opt.chunk) * V : 0);
  std::vector<double> pm, pr;
  for (int64_t w = 0; w < n_windows; ++w) {
    const int64_t b = w * opt.n_ctx, e = std::min(n_tok, b + opt.n_ctx);
    if (e - b < 2) break;
    Session sm(model, method, int(e - b), opt.chunk, size_t(-1), opt.device);
    std::unique_ptr<Session> sr;
    if (reference) sr = std::make_unique<Session>(model, *reference, int(e - b), opt.chunk, size_t(-1), opt.device);
    for (int64_t c0 = b; c0 < e; c0 += opt.chunk) {
      const int n = int(std::min<int64_t>(opt.chunk, e - c0));
      sm.forward(tokens.data() + c0, n, lm.data(), true);
      if (sr) sr->forward(tokens.data() + c0, n, lr.data(), true);
      for (int i = 0; i < n; ++i) {
        const int64_t t = c0 + i;
        if (t + 1 >= e) break;  // last token of the window predicts nothing inside it
        const int32_t next = tokens[size_t(t + 1)];
        const int am = log_softmax(lm.data() + size_t(i) * V, V, pm);
        nll -= pm[size_t(next)];
        if (sr) {
          const int ar = log_softmax(lr.data() + size_t(i) * V, V, pr);
          ref_nll -= pr[size_t(next)];
          double k = 0;
          for (int j = 0; j < V; ++j) k += std::exp(pr[size_t(j)]) * (pr[size_t(j)] - pm[size_t(j)]);
          kl += std::max(0.0, k);
          agree += am == ar;
        }
        ++r.n_scored;
      }
    }
    r.kv_bytes = sm.kv_token_bytes();
    r.kv_allocated_bytes = sm.kv_bytes();
    r.kv_fp16_bytes = sm.kv_fp16_bytes();
    r.bits_per_element = r.kv_fp16_bytes ? 16.0 * double(r.kv_bytes) / double(r.kv_fp16_bytes) : 0.0;
  }
  VQ_CHECK(r.n_scored > 0, "perplexity: no token was scored");
  r.nll = nll / double(r.n_scored);
  r.perplexity = std::exp(r.nll);
  if (reference) {
    r.kl = kl / double(r.n_scored);
    r.top1 = double(agree) / double(r.n_scored);
    r.ref_perplexity = std::exp(ref_nll / double(r.n_scored));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  return r;
}

}  // namespace vq
