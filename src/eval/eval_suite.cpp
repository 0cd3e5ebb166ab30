#include "eval/eval_suite.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "eval/passkey.h"
#include "eval/perplexity.h"

namespace vq {

namespace {

// Distinct, reproducible keys and distractor offsets per prompt.
uint64_t prompt_seed(uint64_t seed, int n_ctx, size_t depth_index, int trial) {
  uint64_t h = seed ^ 0x9E3779B97F4A7C15ull;
  for (uint64_t x : {uint64_t(n_ctx), uint64_t(depth_index), uint64_t(trial)}) h = (h ^ x) * 0x100000001B3ull;
  return h;
}

void run_quality(const Model& model, const std::vector<KVSpec>& methods, const KVSpec& reference,
                 const std::vector<EvalText>& texts, const EvalOptions& opt, const EvalProgress& progress,
                 EvalReport& r) {
  // The reference's own row is exact by definition; it is not run twice.
  std::vector<KVSpec> run;
  for (const KVSpec& m : methods)
    if (m.name() != reference.name()) run.push_back(m);
  const int max_ctx = *std::max_element(opt.contexts.begin(), opt.contexts.end());
  const int total = int(texts.size() * opt.contexts.size());
  int done = 0;
  for (const EvalText& t : texts) {
    std::vector<int32_t> ids = model.tokenizer().encode(t.text, model.tokenizer().add_bos_default());
    VQ_CHECK(int64_t(ids.size()) >= max_ctx, "eval: text '{}' ({}) gives {} tokens, the largest context is {}",
             t.name, t.path, ids.size(), max_ctx);
    ids.resize(size_t(max_ctx));
    r.text_ids.push_back(ids);
    for (int ctx : opt.contexts) {
      if (progress) progress("quality " + t.name + " ctx " + std::to_string(ctx), done, total);
      const std::vector<int32_t> window(ids.begin(), ids.begin() + ctx);
      PerplexityOptions po;
      po.n_ctx = ctx;
      po.chunk = opt.chunk;
      po.max_windows = 1;
      po.device = opt.device;
      std::vector<PerplexityResult> res;
      if (!run.empty()) res = evaluate_perplexity(model, window, run, &reference, po);
      // The reference's perplexity (alone when it is the only cache asked for).
      const double ref_ppl =
          res.empty() ? evaluate_perplexity(model, window, reference, nullptr, po).perplexity : res[0].ref_perplexity;
      size_t k = 0;
      for (const KVSpec& m : methods) {
        EvalQualityRow row;
        row.kv_cache = m.name();
        row.text = t.name;
        row.n_ctx = ctx;
        row.bits_nominal = m.config.nominal_bits_per_element();
        if (m.name() == reference.name()) {
          row.tokens_scored = ctx - 1;
          row.kl = 0;
          row.top1 = 1;
          row.bits_per_element = row.bits_nominal;
          row.perplexity = row.ref_perplexity = ref_ppl;
        } else {
          const PerplexityResult& p = res[k++];
          row.tokens_scored = p.n_scored;
          row.perplexity = p.perplexity;
          row.ref_perplexity = p.ref_perplexity;
          row.kl = p.kl;
          row.top1 = p.top1;
          row.bits_per_element = p.bits_per_element;
        }
        r.quality.push_back(row);
      }
      ++done;
    }
  }
  if (progress) progress("quality", done, total);
}

void run_retrieval(const Model& model, const std::vector<KVSpec>& methods, const KVSpec& reference,
                   const std::string& filler_text, const EvalOptions& opt, const EvalProgress& progress,
                   EvalReport& r) {
  VQ_CHECK(opt.trials >= 1, "eval: --trials {} must be >= 1", opt.trials);
  const std::vector<int32_t> filler = model.tokenizer().encode(filler_text, false);
  const int max_ctx = *std::max_element(opt.retrieval_contexts.begin(), opt.retrieval_contexts.end());
  VQ_CHECK(int64_t(filler.size()) >= max_ctx, "eval: the retrieval text gives {} tokens, the largest context is {}",
           filler.size(), max_ctx);
  const int total = int(opt.retrieval_contexts.size() * opt.depths.size()) * opt.trials;
  int done = 0;
  for (int ctx : opt.retrieval_contexts) {
    VQ_CHECK(ctx > opt.answer_tokens + 64, "eval: retrieval context {} is too short", ctx);
    // Each trial reads the distractor from its own offset, spread over the text.
    const int64_t stride = (int64_t(filler.size()) - ctx) / opt.trials;
    for (size_t di = 0; di < opt.depths.size(); ++di) {
      std::vector<EvalRetrievalRow> rows(methods.size());
      for (size_t m = 0; m < methods.size(); ++m) {
        rows[m].kv_cache = methods[m].name();
        rows[m].n_ctx = ctx;
        rows[m].depth = opt.depths[di];
      }
      for (int t = 0; t < opt.trials; ++t) {
        if (progress)
          progress("retrieval ctx " + std::to_string(ctx) + " depth " + std::to_string(opt.depths[di]), done, total);
        const PasskeyPrompt p = make_passkey_prompt(model.tokenizer(), filler, t * stride, ctx - opt.answer_tokens,
                                                    opt.depths[di], prompt_seed(opt.seed, ctx, di, t));
        r.prompts.push_back({ctx, opt.depths[di], t, p.key, p.ids});
        const PasskeyAnswer ref = answer_passkey(model, reference, p, opt.answer_tokens, opt.retrieval_chunk, opt.device);
        for (size_t m = 0; m < methods.size(); ++m) {
          const PasskeyAnswer a = methods[m].name() == reference.name()
                                      ? ref
                                      : answer_passkey(model, methods[m], p, opt.answer_tokens, opt.retrieval_chunk,
                                                       opt.device);
          rows[m].trials++;
          rows[m].correct += a.correct;
          rows[m].agree_ref += a.digits == ref.digits;
          rows[m].answers.push_back(a.digits);
        }
        ++done;
      }
      r.retrieval.insert(r.retrieval.end(), rows.begin(), rows.end());
    }
  }
  if (progress) progress("retrieval", done, total);
}

}  // namespace

EvalReport run_eval(const Model& model, const std::vector<KVSpec>& methods, const KVSpec& reference,
                    const std::vector<EvalText>& texts, const std::string& filler, const EvalOptions& opt,
                    const EvalProgress& progress) {
  VQ_CHECK(!methods.empty(), "eval: no KV cache to evaluate");
  for (int c : opt.contexts) VQ_CHECK(c >= 2, "eval: context {} must be >= 2", c);
  for (double d : opt.depths) VQ_CHECK(d >= 0 && d <= 1, "eval: depth {} must be in [0, 1]", d);
  const auto t0 = std::chrono::steady_clock::now();
  EvalReport r;
  r.reference = reference.name();
  if (!opt.contexts.empty() && !texts.empty()) run_quality(model, methods, reference, texts, opt, progress, r);
  if (!opt.retrieval_contexts.empty()) run_retrieval(model, methods, reference, filler, opt, progress, r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

nlohmann::json eval_to_json(const EvalReport& r, const EvalOptions& opt, const std::vector<EvalText>& texts,
                            const nlohmann::json& meta, bool with_prompts) {
  using nlohmann::json;
  json j = meta;
  j["schema"] = "veloxquant-eval-1";
  j["reference"] = r.reference;
  j["seconds"] = r.seconds;
  j["settings"] = {{"contexts", opt.contexts},
                   {"chunk", opt.chunk},
                   {"retrieval_contexts", opt.retrieval_contexts},
                   {"depths", opt.depths},
                   {"trials", opt.trials},
                   {"answer_tokens", opt.answer_tokens},
                   {"seed", opt.seed}};
  json tx = json::array();
  for (size_t i = 0; i < texts.size(); ++i) {
    json t = {{"name", texts[i].name}, {"path", texts[i].path}};
    if (i < r.text_ids.size()) t["ids"] = r.text_ids[i];
    tx.push_back(t);
  }
  j["texts"] = tx;
  json q = json::array();
  for (const EvalQualityRow& row : r.quality)
    q.push_back({{"engine", "veloxquant"},
                 {"kv_cache", row.kv_cache},
                 {"text", row.text},
                 {"n_ctx", row.n_ctx},
                 {"tokens_scored", row.tokens_scored},
                 {"perplexity", row.perplexity},
                 {"ref_perplexity", row.ref_perplexity},
                 {"ppl_delta", row.ref_perplexity > 0 ? row.perplexity / row.ref_perplexity - 1.0 : 0.0},
                 {"kl", row.kl},
                 {"top1", row.top1},
                 {"bits_per_element", row.bits_per_element},
                 {"bits_nominal", row.bits_nominal}});
  j["quality"] = q;
  json rt = json::array();
  for (const EvalRetrievalRow& row : r.retrieval)
    rt.push_back({{"engine", "veloxquant"},
                  {"kv_cache", row.kv_cache},
                  {"n_ctx", row.n_ctx},
                  {"depth", row.depth},
                  {"trials", row.trials},
                  {"correct", row.correct},
                  {"agree_ref", row.agree_ref},
                  {"rate", row.trials ? double(row.correct) / row.trials : 0.0},
                  {"answers", row.answers}});
  j["retrieval"] = rt;
  json keys = json::array();
  for (const auto& p : r.prompts) {
    json e = {{"n_ctx", p.n_ctx}, {"depth", p.depth}, {"trial", p.trial}, {"key", p.key}};
    if (with_prompts) e["ids"] = p.ids;
    keys.push_back(e);
  }
  j["retrieval_prompts"] = keys;
  return j;
}

}  // namespace vq
