// veloxquant perplexity: the quality harness. Perplexity of a text with a KV cache, and the KL
// divergence / top-1 agreement of its next-token distributions against the fp16 cache's. On the
// public API alone (include/veloxquant), like a program using the library.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <thread>

#include "cli_checks.h"
#include "cli_device.h"
#include "cli_model.h"
#include "commands.h"
#include "veloxquant/files.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/perplexity.h"
#include "veloxquant/runtime.h"

namespace vq::cli {
namespace {

struct PplOptions {
  std::string model, text, kv_cache = "fp16", calib, device = "cpu";
  int n_ctx = 2048, chunk = 32, windows = 1, threads = 0, tp = 1;
  bool json = false, no_reference = false;
  bool allow_longer_context = false, ctx_given = false;
};

void run_perplexity(const PplOptions& o) {
  namespace vx = veloxquant;
  vx::set_num_threads(o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())));
  if (!(o.n_ctx >= 2 && o.n_ctx <= kMaxContextTokens))
    throw vx::Error(fmt::format("-c: {} must be >= 2 and at most {}", o.n_ctx, kMaxContextTokens));
  if (o.chunk < 1) throw vx::Error(fmt::format("--chunk: {} must be >= 1", o.chunk));
  if (o.windows < 1) throw vx::Error(fmt::format("--windows: {} must be >= 1", o.windows));
  if (o.tp < 1 || o.tp > 1024) throw vx::Error(fmt::format("--tp: {} must be in 1..1024", o.tp));
  const KVCacheConfig cfg = vx::parse_kv_cache_config(o.kv_cache);
  check_cache_flags(cfg, o.calib);
  const std::string text = vx::read_text_file(o.text);
  const std::string path = model_path_or_default(o.model);
  const vx::Model model = vx::Model::load(path);
  const vx::ModelInfo& info = model.info();
  check_cache_fits_model(cfg, info.head_dim, path);
  model.check_weights_finite();
  if (o.tp > 1) {
    const std::string where = vx::check_tensor_parallel(model, o.tp, resolve_device(o.device));
    if (resolve_device(o.device) == vx::Device::cuda) std::fprintf(stderr, "tp %d: %s\n", o.tp, where.c_str());
  }
  // -c given is checked against the trained context; the default stops at it.
  const int64_t trained = info.n_ctx_train;
  const int n_ctx = !o.ctx_given && trained > 1 ? int(std::min<int64_t>(o.n_ctx, trained)) : o.n_ctx;
  if (o.ctx_given) check_trained_context(n_ctx, trained, o.allow_longer_context, "-c");
  ProgressBar bar;
  bool made = false;
  const vx::KVSpec method = vx::KVSpec::for_model_config(
      model, cfg, o.calib, [&](const char* s, int d, int t) { bar.update(s, d, t); }, &made);
  if (made) std::fprintf(stderr, "perplexity: made the first-use calibration of %s\n", method.name().c_str());
  warn_kv_quality(method);
  const vx::KVSpec reference = vx::KVSpec::parse("fp16");
  const vx::Tokenizer tok = model.tokenizer();
  const std::vector<int32_t> ids = tok.encode(text);
  vx::PerplexityOptions po;
  po.n_ctx = n_ctx;
  po.chunk = o.chunk;
  po.max_windows = o.windows;
  po.device = resolve_device(o.device);
  po.tp = o.tp;
  const vx::PerplexityResult r = vx::perplexity(model, ids, method, o.no_reference ? nullptr : &reference, po);
  if (!(std::isfinite(r.perplexity) && (o.no_reference || std::isfinite(r.kl))))
    throw vx::Error(fmt::format("perplexity {} / KL {}: the model produced non-finite logits (its weights or the KV "
                                "cache hold NaN or inf values)", r.perplexity, r.kl));
  if (o.json) {
    nlohmann::json j = {{"model", path},          {"text", o.text},        {"kv_cache", cfg.name()}, {"tp", o.tp},
                        {"n_ctx", n_ctx},         {"chunk", o.chunk},      {"tokens_scored", r.n_scored},
                        {"perplexity", r.perplexity}, {"nll", r.nll},      {"seconds", r.seconds},
                        {"kv_bytes", r.memory.token_bytes}, {"kv_allocated_bytes", r.memory.allocated_bytes},
                        {"kv_fp16_bytes", r.memory.fp16_bytes},
                        {"bits_per_element", r.memory.bits_per_element()}};
    if (!o.no_reference) {
      j["kl_vs_fp16"] = r.kl;
      j["top1_agreement_vs_fp16"] = r.top1;
      j["fp16_perplexity"] = r.ref_perplexity;
    }
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("kv cache      %s\n", cfg.name().c_str());
    std::printf("tokens scored %lld (ctx %d, chunks of %d)\n", (long long)r.n_scored, n_ctx, o.chunk);
    std::printf("perplexity    %.4f\n", r.perplexity);
    if (!o.no_reference) {
      std::printf("fp16 ppl      %.4f (%+.2f%%)\n", r.ref_perplexity, 100.0 * (r.perplexity / r.ref_perplexity - 1.0));
      std::printf("KL vs fp16    %.5f nats/token\n", r.kl);
      std::printf("top-1 agree   %.2f%%\n", 100.0 * r.top1);
    }
    std::printf("KV cache      %.2f MB for the tokens (fp16 %.2f MB, %.2f bits/element), %.2f MB allocated\n",
                r.memory.token_bytes / 1e6, r.memory.fp16_bytes / 1e6, r.memory.bits_per_element(),
                r.memory.allocated_bytes / 1e6);
    std::printf("time          %.1f s\n", r.seconds);
  }
}

}  // namespace

void add_perplexity(CLI::App& app) {
  auto o = std::make_shared<PplOptions>();
  auto* c = app.add_subcommand("perplexity", "Perplexity, KL and top-1 agreement vs fp16 with a KV cache");
  c->add_option("-m,--model", o->model, model_help());
  c->add_option("--text", o->text, "Evaluation text (.txt, .gz, .html; at most 256 MiB)")->required();
  c->add_option("--kv-cache", o->kv_cache, "KV cache spec (syntax below)")->capture_default_str();
  c->footer(veloxquant::kv_cache_spec_help());
  c->add_option("--calib", o->calib, "Calibration file for vecinfer");
  add_device_option(c, o->device);
  c->add_option("--tp", o->tp, "Tensor-parallel ranks (cpu: simulated in turn; cuda: one rank per GPU over NCCL, or every rank on GPU 0 when the host has fewer GPUs)")->capture_default_str();
  CLI::Option* ctx = c->add_option("-c,--ctx-size", o->n_ctx,
                                   "Tokens per window (the default stops at the model's trained context)")
                        ->capture_default_str();
  c->add_flag("--allow-longer-context", o->allow_longer_context,
              "-c past the model's trained context: a warning, not an error");
  c->add_option("--chunk", o->chunk, "Tokens per forward call")->capture_default_str();
  c->add_option("--windows", o->windows, "Windows of ctx tokens to evaluate")->capture_default_str();
  c->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  c->add_flag("--no-reference", o->no_reference, "Skip the fp16 reference (no KL / agreement)");
  c->add_flag("--json", o->json, "Print JSON");
  c->callback([o, ctx] {
    o->ctx_given = ctx->count() > 0;
    run_perplexity(*o);
  });
}

}  // namespace vq::cli
