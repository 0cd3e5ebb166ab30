// veloxquant::Session, Sampler and perplexity over src/model (Session, Sampler, evaluate_perplexity).
#include <algorithm>

#include "api/impl.h"
#include "core/error.h"
#include "eval/perplexity.h"
#include "kvcache/kv_identity.h"
#include "kvcache/seq_file.h"
#include "model/session.h"
#include "model/tensor_parallel.h"
#include "veloxquant/perplexity.h"

namespace veloxquant {

vq::SamplerParams to_internal(const SamplingParams& p) {
  vq::SamplerParams s;
  s.temp = p.temperature;
  s.top_k = p.top_k;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.repeat_penalty = p.repeat_penalty;
  s.repeat_last_n = p.repeat_last_n;
  s.seed = p.seed;
  return s;
}

struct Sampler::Impl {
  vq::Sampler sampler;
};
Sampler::Sampler(const SamplingParams& params) : impl_(new Impl{vq::Sampler(to_internal(params))}) {}
Sampler::~Sampler() = default;
Sampler::Sampler(Sampler&&) noexcept = default;
Sampler& Sampler::operator=(Sampler&&) noexcept = default;
int32_t Sampler::sample(const float* logits, int n_vocab) {
  VQ_CHECK(logits != nullptr && n_vocab >= 1, "sampler: need logits of n_vocab >= 1 entries (got {})", n_vocab);
  return impl_->sampler.sample(logits, n_vocab);
}
void Sampler::accept(int32_t token) { impl_->sampler.accept(token); }
void Sampler::reset() { impl_->sampler.reset(); }

int default_n_ctx(const Model& model) {
  const int64_t t = model.info().n_ctx_train;
  return int(std::min<int64_t>(t > 0 ? t : 4096, 1 << 20));
}

struct Session::Impl {
  Model model;  // before session: the internal session refers to the model
  KVSpec spec;
  Device device;
  vq::Session session;
};

std::string check_tensor_parallel(const Model& model, int tp, Device device) {
  VQ_CHECK(tp >= 1, "--tp: {} must be >= 1", tp);
  if (tp == 1) return "one rank";
  vq::check_tp(ApiAccess::model(model), tp);
  return vq::tp_placement(tp, to_internal(device));
}

static int checked_ctx(const Model& model, const KVSpec& spec, const SessionOptions& opt) {
  check_spec_fits(spec, model);
  VQ_CHECK(opt.n_ctx >= 0, "session: n_ctx {} must be >= 0", opt.n_ctx);
  VQ_CHECK(opt.max_chunk >= 0, "session: max_chunk {} must be >= 0 (0: default_max_chunk)", opt.max_chunk);
  return opt.n_ctx > 0 ? opt.n_ctx : default_n_ctx(model);
}

Session::Session(const Model& model, const KVSpec& spec, const SessionOptions& opt)
    // new Impl{...}: the internal session is built in place (it cannot move).
    : impl_(new Impl{model, spec, opt.device,
                     vq::Session(ApiAccess::model(model), ApiAccess::spec(spec), checked_ctx(model, spec, opt),
                                 opt.max_chunk > 0 ? opt.max_chunk : default_max_chunk(opt.device),
                                 opt.kv_budget_bytes, to_internal(opt.device), opt.tp)}) {}
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

void Session::forward(std::span<const int32_t> tokens, float* logits, bool all_logits) {
  VQ_CHECK(!tokens.empty(), "session: forward needs at least one token");
  impl_->session.forward(tokens.data(), int(tokens.size()), logits, all_logits);
}

int64_t Session::pos() const { return impl_->session.pos(); }
int Session::n_ctx() const { return impl_->session.n_ctx(); }
int Session::n_vocab() const { return impl_->model.info().n_vocab; }
void Session::reset() { impl_->session.reset(); }
const Model& Session::model() const { return impl_->model; }
const KVSpec& Session::spec() const { return impl_->spec; }
KVMemory Session::memory() const {
  const vq::Session& s = impl_->session;
  return {s.kv_token_bytes(), s.kv_bytes(), s.kv_fp16_bytes(), s.kv_codebook_bytes()};
}

size_t Session::min_budget_bytes() const {
  const vq::TPForward* tp = impl_->session.tensor_parallel();
  if (!tp) return veloxquant::min_budget_bytes(impl_->session.store());
  // Every rank's pool gets budget / tp: tp times the largest rank's minimum.
  size_t most = 0;
  for (int r = 0; r < tp->tp(); ++r) most = std::max(most, veloxquant::min_budget_bytes(tp->store(r)));
  return most * size_t(tp->tp());
}

void Session::save(const std::string& path, const std::vector<int32_t>& tokens) const {
  const vq::Session& s = impl_->session;
  VQ_CHECK(int64_t(tokens.size()) >= s.pos(), "session save '{}': {} token ids, fewer than the {} in the KV", path,
           tokens.size(), s.pos());
  if (const vq::TPForward* tp = s.tensor_parallel()) {
    // One file over the ranks (kvcache/seq_file.h): each rank's heads with its own identity.
    std::vector<const vq::KVStore*> kv;
    std::vector<const vq::SeqKV*> seqs;
    std::vector<vq::KVIdentity> ids;
    for (int r = 0; r < tp->tp(); ++r) {
      kv.push_back(&tp->store(r));
      seqs.push_back(&s.tp_sequence().ranks[size_t(r)]);
      ids.push_back(r == 0 ? vq::kv_identity(tp->store(0), impl_->model.info().path)
                           : vq::kv_identity_like(ids[0], tp->store(r)));
    }
    vq::save_tp_sequence(path, kv, seqs, tokens, ids,
                         [tp](int r, const std::function<void()>& f) { tp->on_rank(r, f); });
    return;
  }
  vq::save_sequence(path, s.store(), s.sequence(), tokens,
                    vq::kv_identity(s.store(), impl_->model.info().path));
}

LoadedSession Session::load(const std::string& path) {
  vq::Session& s = impl_->session;
  s.reset();
  if (vq::TPForward* tp = s.tensor_parallel()) {
    std::vector<vq::KVStore*> kv;
    std::vector<vq::KVIdentity> ids;
    for (int r = 0; r < tp->tp(); ++r) {
      kv.push_back(&tp->store(r));
      ids.push_back(r == 0 ? vq::kv_identity(tp->store(0), impl_->model.info().path)
                           : vq::kv_identity_like(ids[0], tp->store(r)));
    }
    std::vector<vq::LoadedSequence> ld =
        vq::load_tp_sequence(path, kv, ids, [tp](int r, const std::function<void()>& f) { tp->on_rank(r, f); });
    if (ld[0].n_kv > s.n_ctx()) {
      for (int r = 0; r < tp->tp(); ++r) tp->on_rank(r, [&] { kv[size_t(r)]->release(ld[size_t(r)].seq); });
      VQ_FAIL("session load '{}': {} tokens in its KV do not fit the context of {}", path, ld[0].n_kv, s.n_ctx());
    }
    for (int r = 0; r < tp->tp(); ++r)
      tp->on_rank(r, [&] {
        kv[size_t(r)]->release(s.tp_sequence().ranks[size_t(r)]);
        s.tp_sequence().ranks[size_t(r)] = std::move(ld[size_t(r)].seq);
      });
    return {std::move(ld[0].tokens), ld[0].n_kv};
  }
  vq::LoadedSequence ld = vq::load_sequence(path, s.store(), vq::kv_identity(s.store(), impl_->model.info().path));
  VQ_CHECK(ld.n_kv <= s.n_ctx(), "session load '{}': {} tokens in its KV do not fit the context of {}", path, ld.n_kv,
           s.n_ctx());
  s.sequence() = std::move(ld.seq);
  return {std::move(ld.tokens), ld.n_kv};
}

PerplexityResult perplexity(const Model& model, std::span<const int32_t> tokens, const KVSpec& method,
                            const KVSpec* reference, const PerplexityOptions& opt) {
  check_spec_fits(method, model);
  if (reference) check_spec_fits(*reference, model);
  vq::PerplexityOptions o;
  o.n_ctx = opt.n_ctx;
  o.chunk = opt.chunk;
  o.max_windows = opt.max_windows;
  o.device = to_internal(opt.device);
  o.tp = opt.tp;
  const vq::PerplexityResult r =
      vq::evaluate_perplexity(ApiAccess::model(model), std::vector<int32_t>(tokens.begin(), tokens.end()),
                              ApiAccess::spec(method), reference ? &ApiAccess::spec(*reference) : nullptr, o);
  PerplexityResult p;
  p.n_scored = r.n_scored;
  p.nll = r.nll;
  p.perplexity = r.perplexity;
  p.kl = r.kl;
  p.top1 = r.top1;
  p.ref_perplexity = r.ref_perplexity;
  p.seconds = r.seconds;
  p.memory = {r.kv_bytes, r.kv_allocated_bytes, r.kv_fp16_bytes, 0};
  return p;
}

}  // namespace veloxquant
