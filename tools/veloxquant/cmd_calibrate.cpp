// veloxquant calibrate: trains VecInfer smoothing factors and codebooks on a model's real keys
// and values over a text, and writes the calibration file. On the public API alone (include/veloxquant).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "cli_checks.h"
#include "cli_device.h"
#include "cli_model.h"
#include "commands.h"
#include "veloxquant/calibration.h"
#include "veloxquant/files.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"

namespace vq::cli {
namespace {

struct CalibrateOptions {
  std::string model, text, kv_cache = "vecinfer:d4b8", out, device = "cpu";
  int tokens = 8192, threads = 0, iters = 12;
  uint64_t seed = 1234;
  std::string smoothing = "query";
  int64_t position_span = 0;
  std::string key_mean = "auto";
  std::string key_transform = "auto";
  int held_out = 1024;
};

void run_calibrate(const CalibrateOptions& o) {
  namespace vx = veloxquant;
  vx::check_output_path(o.out, "-o");  // before minutes of calibration
  if (!(o.iters >= 1 && o.iters <= 1000)) throw vx::Error(fmt::format("--iters: {} must be in 1..1000", o.iters));
  if (!(o.tokens >= 16 && o.tokens <= (1 << 24)))
    throw vx::Error(fmt::format("--tokens: {} must be in 16..16777216", o.tokens));
  if (!(o.held_out == 0 || (o.held_out >= vx::kMinHeldOutTokens && o.held_out <= (1 << 20))))
    throw vx::Error(fmt::format("--held-out: {} must be 0 (no check) or in {}..1048576", o.held_out,
                                vx::kMinHeldOutTokens));
  vx::set_num_threads(o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())));
  const KVCacheConfig cfg = vx::parse_kv_cache_config(o.kv_cache);
  if (!vx::kv_cache_needs_calibration(cfg))
    throw vx::Error(fmt::format("--kv-cache: {} has no codebooks to calibrate (use vecinfer:d4b8, ...)", cfg.name()));
  const std::string text = vx::read_text_file(o.text);
  const std::string path = model_path_or_default(o.model);
  const vx::Model model = vx::Model::load(path);
  check_cache_fits_model(cfg, model.info().head_dim, path);
  model.check_weights_finite();
  vx::CalibrationOptions opt;
  opt.kmeans_iters = o.iters;
  opt.seed = o.seed;
  opt.query_aware = o.smoothing == "query";
  opt.position_span = o.position_span;
  opt.key_mean_tokens = o.key_mean == "none" ? 0 : -1;  // rotated, auto: the default segment
  opt.held_out_tokens = o.held_out;
  opt.key_transform = o.key_transform;
  opt.device = resolve_device(o.device);
  ProgressBar bar;
  const auto t0 = std::chrono::steady_clock::now();
  const vx::Calibration c = vx::Calibration::from_model(
      model, text, o.tokens, cfg, opt, [&](const char* stage, int d, int t) { bar.update(stage, d, t); });
  c.save(o.out);
  std::fprintf(stderr, "calibrate: %s, %llu tokens, %d layers x %d KV heads, %.1f s -> %s\n", cfg.name().c_str(),
               (unsigned long long)c.n_calib_tokens(), c.n_layers(), c.n_kv_heads(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), o.out.c_str());
  const vx::CalibrationCheck k = c.held_out_check();
  if (k.tokens > 0)
    std::fprintf(stderr, "calibrate: held-out check on %d tokens after the ones trained on: KL %.4f vs fp16, top-1 "
                 "agreement %.1f%%, perplexity %+.2f%%\n", k.tokens, k.kl, 100 * k.top1, 100 * (k.ppl_ratio - 1));
  else if (o.held_out > 0)
    std::fprintf(stderr, "calibrate: no held-out check: the text has fewer than %d tokens after the %d trained on\n",
                 vx::kMinHeldOutTokens, o.tokens);
  warn_kv_quality(vx::KVSpec::parse(cfg.name(), c));
}

}  // namespace

void add_calibrate(CLI::App& app) {
  auto o = std::make_shared<CalibrateOptions>();
  auto* c = app.add_subcommand("calibrate", "Train VecInfer codebooks on a model's real keys/values");
  c->add_option("-m,--model", o->model, model_help());
  c->add_option("--text", o->text, "Calibration text (.txt, .gz, .html; at most 256 MiB)")->required();
  c->add_option("--tokens", o->tokens, "Tokens of the text to use")->capture_default_str();
  c->add_option("--kv-cache", o->kv_cache, "VecInfer preset, e.g. vecinfer:d4b8, vecinfer:k=d4b8,v=d8b8")
      ->capture_default_str();
  c->add_option("-o,--output", o->out, "Calibration file to write")->required();
  c->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  c->add_option("--iters", o->iters, "k-means iterations")->capture_default_str();
  c->add_option("--seed", o->seed, "k-means seed")->capture_default_str();
  c->add_option("--smoothing", o->smoothing,
                "Key smoothing: query (lambda = (Var k / E q^2)^(1/4), from the recorded queries) or key-max "
                "(VecInfer's sqrt(max |k|))")
      ->check(CLI::IsMember({"query", "key-max"}))
      ->capture_default_str();
  c->add_option("--position-span", o->position_span,
                "Re-rotate the recorded keys/queries to random positions in [0, N) (0: as run; docs/QUALITY.md)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 24))
      ->capture_default_str();
  c->add_option("--key-mean", o->key_mean,
                "rotated (auto: the same): remove the keys' pre-RoPE mean, turned to each 16-token segment, before "
                "coding and add its exact score back (CPU and GPU; docs/QUALITY.md \"Rotated key mean\"); none: code "
                "keys with their mean")
      ->check(CLI::IsMember({"auto", "rotated", "none"}))
      ->capture_default_str();
  c->add_option("--key-transform", o->key_transform,
                "learned: a dense map per layer and KV head from the recorded keys and queries before coding "
                "(per-sub-space books; caches on the CPU and the GPU); hadamard: the smoothing then the "
                "Walsh-Hadamard rotation; auto: learned for per-sub-space books from at least 16 tokens per key "
                "channel, else hadamard (docs/QUALITY.md \"Learned key transform\")")
      ->check(CLI::IsMember({"auto", "hadamard", "learned"}))
      ->capture_default_str();
  c->add_option("--held-out", o->held_out,
                "Tokens of the text after --tokens on which the new cache is compared with fp16 (stored in the file; "
                "0: no check)")
      ->capture_default_str();
  add_device_option(c, o->device);
  c->callback([o] { run_calibrate(*o); });
}

}  // namespace vq::cli
