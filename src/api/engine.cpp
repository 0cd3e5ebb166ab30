// veloxquant::Engine over vq::Engine (src/engine).
#include <algorithm>

#include "api/impl.h"
#include "engine/engine.h"
#include "model/session.h"
#include "kvcache/kv_identity.h"
#include "veloxquant/engine.h"

namespace veloxquant {

const char* finish_reason_name(FinishReason r) {
  return vq::finish_reason_name(static_cast<vq::FinishReason>(static_cast<int>(r)));
}

// The public enum mirrors the internal one value for value.
static_assert(int(FinishReason::length) == int(vq::FinishReason::length) &&
              int(FinishReason::eos) == int(vq::FinishReason::eos) &&
              int(FinishReason::stop) == int(vq::FinishReason::stop) &&
              int(FinishReason::cancelled) == int(vq::FinishReason::cancelled) &&
              int(FinishReason::context) == int(vq::FinishReason::context) &&
              int(FinishReason::error) == int(vq::FinishReason::error));

struct Engine::Impl {
  Model model;  // before engine: the internal engine refers to the model
  size_t codebook_bytes = 0;
  vq::Engine engine;
};

static vq::EngineOptions engine_options(const Model& model, const KVSpec& spec, const EngineOptions& o) {
  check_spec_fits(spec, model);
  vq::EngineOptions e;
  e.kv_budget_bytes = o.kv_budget_bytes;
  e.max_sequences = o.max_sequences;
  e.max_step_tokens = o.max_step_tokens;
  e.n_ctx = o.n_ctx > 0 ? o.n_ctx : default_n_ctx(model);
  e.device = to_internal(o.device);
  e.deterministic = o.deterministic;
  e.prefix_cache = o.prefix_cache;
  e.tp = o.tp;
  if (o.tp > 1) check_tensor_parallel(model, o.tp, o.device);
  if (o.prefix_cache) {  // the identity (model file, spec, calibration) roots the cache's hash chains
    auto probe = vq::make_kv_store(ApiAccess::model(model), ApiAccess::spec(spec), 0);
    e.kv_identity = vq::kv_identity(*probe, model.info().path).combined();
  }
  return e;
}

Engine::Engine(const Model& model, const KVSpec& spec, const EngineOptions& opt)
    // new Impl{...}: the internal engine is built in place (it cannot move).
    : impl_(new Impl{model, 0, vq::Engine(ApiAccess::model(model), ApiAccess::spec(spec), engine_options(model, spec, opt))}) {
  for (int r = 0; r < impl_->engine.tp(); ++r) impl_->codebook_bytes += impl_->engine.kv(r).codebook_bytes();
}
Engine::~Engine() = default;
Engine::Engine(Engine&&) noexcept = default;
Engine& Engine::operator=(Engine&&) noexcept = default;

int64_t Engine::submit(Request r) {
  vq::Request q;
  q.prompt = std::move(r.prompt);
  q.sampling = to_internal(r.sampling);
  q.max_new_tokens = r.max_new_tokens;
  q.ignore_eos = r.ignore_eos;
  q.fork_of = r.fork_of;
  q.on_token = std::move(r.on_token);
  if (r.on_finish) {
    q.on_finish = [f = std::move(r.on_finish), cb = impl_->codebook_bytes](const vq::SeqResult& s) {
      SequenceResult out;
      out.id = s.id;
      out.finish = static_cast<FinishReason>(static_cast<int>(s.why));
      out.error = s.error;
      out.n_prompt = s.n_prompt;
      out.n_generated = s.n_generated;
      out.memory = {s.kv_token_bytes, s.kv_allocated_bytes, s.kv_fp16_bytes, cb};
      f(out);
    };
  }
  return impl_->engine.submit(std::move(q));
}

void Engine::cancel(int64_t id) { impl_->engine.cancel(id); }
bool Engine::step() { return impl_->engine.step(); }
void Engine::run() { impl_->engine.run(); }
bool Engine::idle() const { return impl_->engine.idle(); }

EngineStats Engine::stats() const {
  const vq::EngineStats s = impl_->engine.stats();
  return {s.steps,   s.prefill_tokens, s.decode_tokens,       s.preemptions,        s.step_seconds,
          s.running, s.waiting,        s.prefix.hits, s.prefix.hit_tokens};
}

PoolMemory Engine::memory() const {
  PoolMemory m{0, 0, 0, impl_->codebook_bytes};  // summed over the tensor-parallel ranks
  for (int r = 0; r < impl_->engine.tp(); ++r) {
    const vq::KVPool& p = impl_->engine.kv(r).pool();
    m.used_bytes += p.used_bytes(), m.peak_bytes += p.peak_bytes(), m.budget_bytes += p.budget_bytes();
  }
  return m;
}

size_t Engine::min_budget_bytes() const {
  // Every rank's pool gets budget / tp: tp times the largest rank's minimum.
  size_t most = 0;
  for (int r = 0; r < impl_->engine.tp(); ++r)
    most = std::max(most, veloxquant::min_budget_bytes(impl_->engine.kv(r)));
  return most * size_t(impl_->engine.tp());
}

}  // namespace veloxquant
