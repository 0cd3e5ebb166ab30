// veloxquant bench e2e: batched decode speed of a model with each KV cache. Per (kv cache,
// context): the model's real keys/values of a text (recorded once by an fp16 prefill) are
// appended through the KV store's real append path into max(batch) separate sequences of `ctx`
// tokens (so each sequence's blocks are its own memory, encoded as in a prefill); then, per
// batch size B, B of them are forked (blocks shared, the first write copies) and `steps` decode
// steps run all B at once through the batched forward pass; step time is the median step.
//
// Why this file stays partly on the internals (the layering check's allow-list names them): it
// times the KV store's append path, forks of block tables and one batched Forward::step on
// hand-built sequences, none of which the public API exposes (a user runs them through
// veloxquant::Engine, whose scheduling would blur what is timed), and it records a prefill's real
// K/V through the forward's observer hook. What is plain use (the spec, threads, the budget, the
// output file) goes through include/veloxquant.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_e2e_device.h"
#include "cli_kv.h"
#include "cli_model.h"
#include "commands.h"
#include "core/error.h"
#include "core/int_list.h"
#include "eval/calibrate.h"
#include "model/session.h"
#include "veloxquant/files.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"

namespace vq::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct E2EArgs {
  std::string model, text, calib, json, batches = "1,4,8", ctxs = "512,4096";
  std::vector<std::string> kv_caches;
  int steps = 16, threads = 0;
  double kv_budget_mib = 0;
  // --device cuda: random device weights of --geometry (bench_e2e_device.cpp)
  std::string device = "cpu", geometry, prefill, itl_chunks = "256,512,2048";
  int itl_prompt = 0, tp = 1;
  int warmup = 40, prefill_chunk = 2048;
  bool skip_logits = false;
  bool deterministic = false;
  std::string key_mean = "none";
  std::string key_transform = "hadamard";
};

std::vector<int> parse_list(const std::string& s, const char* what) {
  const std::vector<int64_t> v = parse_int_list(s, what, 1, std::numeric_limits<int>::max());
  return std::vector<int>(v.begin(), v.end());
}

void run_e2e(const E2EArgs& a) {
  const std::vector<int> batches = parse_list(a.batches, "--batch"), ctxs = parse_list(a.ctxs, "--ctx");
  if (a.device == "cuda") {
    VQ_CHECK(!a.geometry.empty(), "bench e2e --device cuda needs --geometry NAME ({})", device_geometry_names());
    VQ_CHECK(a.model.empty(), "bench e2e --device cuda builds random weights of --geometry; -m is not used");
    E2EDeviceArgs d;
    d.geometry = a.geometry;
    d.batches = batches;
    d.ctxs = ctxs;
    if (!a.prefill.empty()) d.prefill = parse_list(a.prefill, "--prefill");
    if (!a.kv_caches.empty()) d.kv_caches = a.kv_caches;
    d.steps = a.steps;
    d.warmup = a.warmup;
    d.prefill_chunk = a.prefill_chunk;
    VQ_CHECK(a.itl_prompt >= 0, "--itl: {} must be >= 0", a.itl_prompt);
    d.itl_prompt = a.itl_prompt;
    d.itl_chunks = parse_list(a.itl_chunks, "--itl-chunks");
    d.kv_budget_mib = a.kv_budget_mib;
    d.skip_logits = a.skip_logits;
    d.deterministic = a.deterministic;
    d.key_mean = a.key_mean;
    d.key_transform = a.key_transform;
    d.json = a.json;
    VQ_CHECK(a.tp >= 1 && a.tp <= 64, "--tp: {} must be in 1..64", a.tp);
    d.tp = a.tp;
    run_e2e_device(d);
    return;
  }
  VQ_CHECK(a.device == "cpu", "--device: '{}' is cpu or cuda for bench e2e", a.device);
  VQ_CHECK(a.key_mean == "none",
           "--key-mean is for --device cuda (the CPU rows take a calibration file, --calib, made by `calibrate --key-mean`)");
  VQ_CHECK(a.key_transform == "hadamard", "--key-transform is for --device cuda (the CPU rows take a calibration "
           "file, --calib, made by `calibrate --key-transform`)");
  VQ_CHECK(a.geometry.empty(), "--geometry is for --device cuda (random device weights)");
  VQ_CHECK(a.itl_prompt == 0, "--itl is for --device cuda");
  VQ_CHECK(a.tp == 1, "bench e2e --tp is for --device cuda (the CPU's split: generate / perplexity --tp)");
  VQ_CHECK(!a.deterministic, "--deterministic is for --device cuda (the CPU forward is batch-invariant as it is)");
  VQ_CHECK(a.steps >= 2, "--steps: {} must be >= 2", a.steps);
  std::vector<KVCacheConfig> configs;
  for (const auto& s : a.kv_caches.empty() ? std::vector<std::string>{"fp16"} : a.kv_caches)
    configs.push_back(veloxquant::parse_kv_cache_config(s));
  if (!a.json.empty()) veloxquant::check_output_path(a.json, "--json");
  veloxquant::set_num_threads(a.threads > 0 ? a.threads : int(std::max(1u, std::thread::hardware_concurrency())));
  bool is_default = false;
  const std::string path = model_path_or_default(a.model, &is_default);
  const auto model = Model::load(path);
  const size_t budget = kv_budget_bytes(veloxquant::Model::load(path), veloxquant::Device::cpu, a.kv_budget_mib);
  const ModelConfig& mc = model->config();
  const int max_ctx = *std::max_element(ctxs.begin(), ctxs.end());
  const int max_b = *std::max_element(batches.begin(), batches.end());
  VQ_CHECK(mc.n_ctx_train <= 0 || max_ctx + a.steps <= mc.n_ctx_train,
           "--ctx: {} + {} steps exceeds the model's context length {}", max_ctx, a.steps, mc.n_ctx_train);
  // Real keys/values: one fp16 prefill over the text records every layer's K/V.
  const std::string text_path = a.text.empty() ? default_calibration_text_path() : a.text;
  VQ_CHECK(!text_path.empty(), "bench e2e: no --text given and the Jargon File is not installed (scripts/setup.sh)");
  auto tokens = model->tokenizer().encode(veloxquant::read_text_file(text_path), true);
  VQ_CHECK(tokens.size() > 16, "{}: too short", text_path);
  const size_t base = tokens.size();
  while (tokens.size() < size_t(max_ctx) + 1) tokens.push_back(tokens[tokens.size() % base]);
  const size_t row = size_t(mc.n_kv_heads) * mc.head_dim;
  std::vector<std::vector<float>> rec_k(size_t(mc.n_layers)), rec_v(size_t(mc.n_layers));  // [max_ctx, row]
  {
    const auto t0 = Clock::now();
    Session rec(*model, KVSpec{KVCacheConfig{}, nullptr}, max_ctx);
    rec.forward_pass().set_kv_observer([&](int l, int, const float*, const float* k, const float* v, int n) {
      rec_k[size_t(l)].insert(rec_k[size_t(l)].end(), k, k + size_t(n) * row);
      rec_v[size_t(l)].insert(rec_v[size_t(l)].end(), v, v + size_t(n) * row);
    });
    rec.forward(tokens.data(), max_ctx, nullptr);
    std::fprintf(stderr, "recorded %d tokens of real K/V in %.1f s\n", max_ctx,
                 std::chrono::duration<double>(Clock::now() - t0).count());
  }
  nlohmann::json out = nlohmann::json::array();
  std::printf("model %s, %d threads, %d timed steps per row (median)\n", path.c_str(), veloxquant::num_threads(), a.steps);
  // KV MiB (tokens): the payload of the B sequences' tokens (coded tokens at the method's bytes,
  // sinks and the fp16 window at fp16's); allocated: the blocks they hold (pool bytes).
  std::printf("| kv cache | ctx | batch | step ms | decode tok/s (aggregate) | tok/s per sequence | KV MiB (tokens) | KV MiB allocated | allocated / tokens |\n");
  std::printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  std::fflush(stdout);
  for (const KVCacheConfig& cfg : configs) {
    const std::string calib =
        resolve_calibration(*model, path, is_default, cfg, veloxquant::kv_cache_needs_calibration(cfg) ? a.calib : "");
    const KVSpec spec = make_kv_spec(cfg, calib);
    for (int ctx : ctxs) {
      auto store = make_kv_store(*model, spec, budget);
      // max_b sequences of ctx tokens, appended in prefill-sized chunks through the append path
      std::vector<SeqKV> seqs;
      for (int b = 0; b < max_b; ++b) {
        seqs.push_back(store->new_sequence());
        for (int l = 0; l < mc.n_layers; ++l)
          for (int t = 0; t < ctx; t += 512) {
            const int n = std::min(512, ctx - t);
            store->append(seqs.back(), l, rec_k[size_t(l)].data() + size_t(t) * row, rec_v[size_t(l)].data() + size_t(t) * row, n);
          }
        store->trim(seqs.back());
      }
      Forward fwd(*model, *store);
      for (int B : batches) {
        std::vector<SeqKV> forks;
        for (int b = 0; b < B; ++b) forks.push_back(store->fork(seqs[size_t(b)]));
        size_t tb = 0, ab = 0;
        for (int b = 0; b < B; ++b) tb += store->token_bytes(seqs[size_t(b)]), ab += store->allocated_bytes(seqs[size_t(b)]);
        std::vector<int32_t> tok(static_cast<size_t>(B));
        for (int b = 0; b < B; ++b) tok[size_t(b)] = tokens[size_t(ctx)];
        std::vector<float> logits(size_t(B) * mc.n_vocab);
        std::vector<BatchEntry> entries(static_cast<size_t>(B));
        std::vector<double> dt;
        for (int i = 0; i < a.steps + 1; ++i) {
          for (int b = 0; b < B; ++b)
            entries[size_t(b)] = BatchEntry{&forks[size_t(b)], &tok[size_t(b)], 1, LogitsWanted::last,
                                            logits.data() + size_t(b) * mc.n_vocab};
          const auto t0 = Clock::now();
          fwd.step(entries.data(), B);
          if (i > 0) dt.push_back(std::chrono::duration<double>(Clock::now() - t0).count());  // the first warms up
          for (int b = 0; b < B; ++b) {  // greedy next token (not timed, as in the llama.cpp peer)
            const float* lg = logits.data() + size_t(b) * mc.n_vocab;
            tok[size_t(b)] = int32_t(std::max_element(lg, lg + mc.n_vocab) - lg);
          }
        }
        std::sort(dt.begin(), dt.end());
        const double step_s = dt[dt.size() / 2];
        const double agg = B / step_s;
        std::printf("| %s | %d | %d | %.2f | %.1f | %.1f | %.2f | %.2f | %.4f |\n", cfg.name().c_str(), ctx, B,
                    step_s * 1e3, agg, 1.0 / step_s, tb / 1048576.0, ab / 1048576.0, tb ? double(ab) / double(tb) : 0.0);
        std::fflush(stdout);
        out.push_back({{"kv_cache", cfg.name()}, {"ctx", ctx}, {"batch", B}, {"step_ms", step_s * 1e3},
                       {"step_ms_best", dt.front() * 1e3}, {"decode_tok_s", agg}, {"decode_tok_s_per_seq", 1.0 / step_s},
                       {"kv_bytes", tb}, {"kv_allocated_bytes", ab}, {"threads", veloxquant::num_threads()}, {"steps", a.steps},
                       {"model", path}});
      }
    }
  }
  if (!a.json.empty()) {
    const std::string doc = out.dump(1) + "\n";
    veloxquant::write_file_atomic(a.json, doc);
  }
}

}  // namespace

void add_bench_e2e(CLI::App* bench) {
  auto a = std::make_shared<E2EArgs>();
  CLI::App* c = bench->add_subcommand("e2e", "Batched decode tokens/s per KV cache, batch size and context");
  c->add_option("-m,--model", a->model, "GGUF model (default: SmolLM2-135M-Instruct)");
  c->add_option("--batch", a->batches, "Batch sizes, e.g. 1,4,8")->capture_default_str();
  c->add_option("--ctx", a->ctxs, "Context lengths (tokens cached per sequence), e.g. 512,4096")->capture_default_str();
  c->add_option("--kv-cache", a->kv_caches, "KV cache spec (repeatable; default fp16)");
  c->add_option("--calib", a->calib, "Calibration file for the vecinfer specs (default model: first-use calibration)");
  c->add_option("--steps", a->steps, "Timed decode steps per row")->capture_default_str();
  c->add_option("-t,--threads", a->threads, "Threads (0: all cores)")->capture_default_str();
  c->add_option("--text", a->text, "Text whose real K/V fill the contexts (default: the Jargon File)");
  c->add_option("--kv-budget", a->kv_budget_mib, "KV pool budget in MiB (0: half of the available memory)");
  c->add_option("--json", a->json, "Also write one JSON object per row to this file");
  c->add_option("--device", a->device, "cpu (the model's real K/V) or cuda (random device weights of --geometry)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  c->add_option("--geometry", a->geometry, "--device cuda: a real model's shape (" + device_geometry_names() + ")");
  c->add_option("--itl", a->itl_prompt,
                "--device cuda: inter-token latency of the --batch rows while a prompt of this many tokens is "
                "prefilled beside them (0: off)")
      ->capture_default_str();
  c->add_option("--itl-chunks", a->itl_chunks, "--itl: prefill tokens per step, one row each")->capture_default_str();
  c->add_option("--tp", a->tp,
                "--device cuda: tensor-parallel ranks (one per GPU over NCCL, or all on GPU 0 when the host has "
                "fewer): decode rows of the split forward, with the all-reduce's share of the step")
      ->capture_default_str();
  c->add_option("--warmup", a->warmup, "--device cuda: untimed decode steps first (graph captures)")->capture_default_str();
  c->add_option("--prefill", a->prefill, "--device cuda: also time a B=1 prefill of these prompt lengths, e.g. 4096,32768");
  c->add_option("--prefill-chunk", a->prefill_chunk, "--device cuda: prompt tokens per step")->capture_default_str();
  c->add_flag("--skip-logits", a->skip_logits, "--device cuda: do not copy logits back (the device step alone)");
  c->add_flag("--deterministic", a->deterministic, "--device cuda: time the batch-invariant mode");
  c->add_option("--key-mean", a->key_mean,
                "--device cuda: VecInfer caches with random calibrations without (none), with (rotated) or both "
                "ways with a rotated key mean (16-token segments, as calibrate makes)")
      ->check(CLI::IsMember({"none", "rotated", "both"}))
      ->capture_default_str();
  c->add_option("--key-transform", a->key_transform,
                "--device cuda: VecInfer caches with random calibrations of the Walsh-Hadamard key transform "
                "(hadamard), random learned maps (learned; per-sub-space books only) or both")
      ->check(CLI::IsMember({"hadamard", "learned", "both"}))
      ->capture_default_str();
  c->callback([a] { run_e2e(*a); });
}

}  // namespace vq::cli
