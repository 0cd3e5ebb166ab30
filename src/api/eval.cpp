// veloxquant::run_eval and the eval report's JSON over the eval suite (src/eval/eval_suite.h).
#include <nlohmann/json.hpp>

#include "api/impl.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "eval/calibrate.h"
#include "eval/eval_suite.h"
#include "kvcache/kv_method.h"
#include "veloxquant/eval.h"
#include "veloxquant/files.h"

namespace veloxquant {

static vq::EvalOptions to_internal(const EvalOptions& o) {
  vq::EvalOptions e;
  e.contexts = o.contexts;
  e.chunk = o.chunk;
  e.retrieval_contexts = o.retrieval_contexts;
  e.depths = o.depths;
  e.trials = o.trials;
  e.answer_tokens = o.answer_tokens;
  e.retrieval_chunk = o.retrieval_chunk;
  e.seed = o.seed;
  e.device = to_internal(o.device);
  return e;
}

static std::vector<vq::EvalText> to_internal(const std::vector<EvalText>& texts) {
  std::vector<vq::EvalText> t;
  for (const EvalText& x : texts) t.push_back({x.name, x.path, x.text});
  return t;
}

static vq::EvalReport to_internal(const EvalReport& r) {
  vq::EvalReport o;
  o.reference = r.reference;
  for (const EvalQualityRow& q : r.quality)
    o.quality.push_back({q.kv_cache, q.text, q.n_ctx, q.tokens_scored, q.perplexity, q.ref_perplexity, q.kl, q.top1,
                         q.bits_per_element, q.bits_nominal});
  for (const EvalRetrievalRow& x : r.retrieval)
    o.retrieval.push_back({x.kv_cache, x.n_ctx, x.depth, x.trials, x.correct, x.agree_ref, x.answers});
  o.text_ids = r.text_ids;
  for (const EvalPrompt& p : r.prompts) o.prompts.push_back({p.n_ctx, p.depth, p.trial, p.key, p.ids});
  o.seconds = r.seconds;
  return o;
}

static EvalReport to_public(const vq::EvalReport& r) {
  EvalReport o;
  o.reference = r.reference;
  for (const vq::EvalQualityRow& q : r.quality)
    o.quality.push_back({q.kv_cache, q.text, q.n_ctx, q.tokens_scored, q.perplexity, q.ref_perplexity, q.kl, q.top1,
                         q.bits_per_element, q.bits_nominal});
  for (const vq::EvalRetrievalRow& x : r.retrieval)
    o.retrieval.push_back({x.kv_cache, x.n_ctx, x.depth, x.trials, x.correct, x.agree_ref, x.answers});
  o.text_ids = r.text_ids;
  for (const auto& p : r.prompts) o.prompts.push_back({p.n_ctx, p.depth, p.trial, p.key, p.ids});
  o.seconds = r.seconds;
  return o;
}

EvalReport run_eval(const Model& model, const std::vector<KVSpec>& methods, const KVSpec& reference,
                    const std::vector<EvalText>& texts, const std::string& filler, const EvalOptions& opt,
                    const EvalProgress& progress) {
  std::vector<vq::KVSpec> m;
  for (const KVSpec& s : methods) {
    check_spec_fits(s, model);
    m.push_back(ApiAccess::spec(s));
  }
  check_spec_fits(reference, model);
  return to_public(vq::run_eval(ApiAccess::model(model), m, ApiAccess::spec(reference), to_internal(texts), filler,
                                to_internal(opt), progress));
}

std::string eval_report_json(const EvalReport& report, const EvalOptions& opt, const std::vector<EvalText>& texts,
                             const std::string& meta_json, bool with_inputs) {
  const nlohmann::json meta = nlohmann::json::parse(meta_json.empty() ? std::string("{}") : meta_json, nullptr, false);
  VQ_CHECK(meta.is_object(), "eval report: the meta data is not a JSON object");
  const nlohmann::json j = vq::eval_to_json(to_internal(report), to_internal(opt), to_internal(texts), meta, with_inputs);
  return with_inputs ? j.dump() : j.dump(1);
}

std::vector<std::string> kv_cache_evaluated_methods() { return vq::kv_method_presets(/*evaluated_only=*/true); }

std::string read_text_file(const std::string& path) { return vq::read_text_file(path); }
void check_output_path(const std::string& path, const std::string& what) { vq::check_output_path(path, what); }
void write_file_atomic(const std::string& path, const std::string& content) {
  vq::write_file_atomic(path, content.data(), content.size());
}

}  // namespace veloxquant
