// veloxquant eval: the quality table of several KV caches on one model (perplexity, KL and top-1
// agreement vs fp16 on held-out texts at several context lengths) and the long-context retrieval
// test (pass key at several depths), written as one JSON document (veloxquant/eval.h). On the
// public API alone (include/veloxquant).
// bench/eval.sh adds llama.cpp's own KV types to the same document and draws the figures.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <thread>

#include "cli_checks.h"
#include "cli_device.h"
#include "cli_model.h"
#include "commands.h"
#include "veloxquant/eval.h"
#include "veloxquant/files.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"
#include "veloxquant/session.h"

namespace vq::cli {
namespace {

// Held-out texts from Debian packages that setup installs (python3-doc, base-files); none of them
// is the calibration text (the Jargon File).
const char* const kDefaultTexts[] = {
    "/usr/share/doc/python3/html/_sources/tutorial/classes.rst.txt",
    "/usr/share/doc/python3/html/_sources/howto/functional.rst.txt",
    "/usr/share/common-licenses/GPL-3",
};
// The retrieval distractor: long (~35k tokens), also held out.
const char* const kDefaultFiller = "/usr/share/doc/python3/html/_sources/howto/logging-cookbook.rst.txt";

struct EvalCliOptions {
  std::string model, out, prompts_out, filler = kDefaultFiller;
  std::vector<std::string> kv, texts, calib;
  std::vector<int> contexts{512, 2048}, retrieval_contexts;
  std::vector<double> depths{0.0, 0.25, 0.5, 0.75, 1.0};
  int chunk = 32, trials = 2, threads = 0, max_retrieval_ctx = 16384;
  std::string device = "cpu";
  bool no_retrieval = false, no_quality = false;
  bool allow_longer_context = false, contexts_given = false;
  std::string command;
};

std::string stem(const std::string& path) {
  std::string s = std::filesystem::path(path).filename().string();
  for (const char* ext : {".gz", ".txt", ".rst", ".html"})
    if (s.size() > std::strlen(ext) && s.compare(s.size() - std::strlen(ext), std::string::npos, ext) == 0)
      s.resize(s.size() - std::strlen(ext));
  return s;
}

// Powers of two from 2048 up to the model's trained context (at most `cap`), and that limit itself.
std::vector<int> default_retrieval_contexts(int64_t n_ctx_train, int cap) {
  const int top = int(std::min<int64_t>(n_ctx_train > 0 ? n_ctx_train : 4096, cap));
  std::vector<int> c;
  for (int n = 2048; n < top; n *= 2) c.push_back(n);
  c.push_back(top);
  return c;
}

std::string iso_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

void run_eval_cmd(const EvalCliOptions& o) {
  namespace vx = veloxquant;
  vx::set_num_threads(o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())));
  // Outputs are checked before minutes of evaluation.
  if (!o.out.empty() && o.out != "-") vx::check_output_path(o.out, "-o");
  if (!o.prompts_out.empty()) vx::check_output_path(o.prompts_out, "--save-inputs");
  for (int c : o.contexts)
    if (!(c >= 2 && c <= kMaxContextTokens)) throw vx::Error(fmt::format("-c: {} must be in 2..{}", c, kMaxContextTokens));
  for (int c : o.retrieval_contexts)
    if (!(c >= 2 && c <= kMaxContextTokens))
      throw vx::Error(fmt::format("--retrieval-ctx: {} must be in 2..{}", c, kMaxContextTokens));
  const vx::Device device = resolve_device(o.device);
  const std::string path = model_path_or_default(o.model);
  const vx::Model model = vx::Model::load(path);
  const vx::ModelInfo& mi = model.info();
  // Contexts asked for are checked against the trained one; the default ones stop at it.
  std::vector<int> contexts = o.contexts;
  const int64_t trained = mi.n_ctx_train;
  if (!o.contexts_given && trained > 0) {
    std::erase_if(contexts, [&](int c) { return c > trained; });
    if (contexts.empty()) contexts.push_back(int(trained));
  }
  for (int c : contexts) check_trained_context(c, trained, o.allow_longer_context, fmt::format("-c {}", c));
  for (int c : o.retrieval_contexts)
    check_trained_context(c, trained, o.allow_longer_context, fmt::format("--retrieval-ctx {}", c));
  // --calib SPEC=FILE: split at the last '=' (specs contain '=' themselves).
  std::map<std::string, std::string> calib_of;
  for (const std::string& c : o.calib) {
    const size_t eq = c.rfind('=');
    if (eq == std::string::npos || eq == 0) throw vx::Error(fmt::format("--calib '{}': expected SPEC=FILE", c));
    calib_of[vx::parse_kv_cache_config(c.substr(0, eq)).name()] = c.substr(eq + 1);
  }
  std::vector<std::string> specs = o.kv;
  if (specs.empty()) specs = vx::kv_cache_evaluated_methods();  // every registered method's evaluated presets
  std::vector<vx::KVSpec> methods;
  ProgressBar bar;
  for (const std::string& s : specs) {
    const KVCacheConfig cfg = vx::parse_kv_cache_config(s);
    auto it = calib_of.find(cfg.name());
    methods.push_back(vx::KVSpec::for_model_config(model, cfg, it == calib_of.end() ? "" : it->second,
                                            [&](const char* st, int d, int t) { bar.update(st, d, t); }));
  }
  const vx::KVSpec reference = vx::KVSpec::parse("fp16");

  vx::EvalOptions opt;
  opt.chunk = o.chunk;
  opt.device = device;
  opt.retrieval_chunk = vx::default_max_chunk(device);  // the device's prefill step (generate's, the sessions')
  opt.trials = o.trials;
  opt.depths = o.depths;
  opt.contexts = o.no_quality ? std::vector<int>{} : contexts;
  if (!o.no_retrieval)
    opt.retrieval_contexts = !o.retrieval_contexts.empty() ? o.retrieval_contexts
                                                           : default_retrieval_contexts(trained, o.max_retrieval_ctx);
  std::vector<vx::EvalText> texts;
  std::vector<std::string> text_paths = o.texts;
  if (text_paths.empty()) text_paths.assign(std::begin(kDefaultTexts), std::end(kDefaultTexts));
  if (!opt.contexts.empty())
    for (const std::string& p : text_paths) texts.push_back({stem(p), p, vx::read_text_file(p)});
  const std::string filler = opt.retrieval_contexts.empty() ? std::string() : vx::read_text_file(o.filler);

  const vx::EvalReport report =
      vx::run_eval(model, methods, reference, texts, filler, opt, [](const std::string& what, int d, int t) {
        std::fprintf(stderr, "eval: [%d/%d] %s\n", d, t, what.c_str());
      });

  const nlohmann::json meta = {
      {"model",
       {{"path", path},
        {"file", std::filesystem::path(path).filename().string()},
        {"name", mi.name},
        {"arch", mi.arch},
        {"n_layers", mi.n_layers},
        {"n_kv_heads", mi.n_kv_heads},
        {"head_dim", mi.head_dim},
        {"n_ctx_train", mi.n_ctx_train}}},
      {"date", iso_now()},
      {"machine",
       {{"cpu", vx::cpu_description()},
        {"threads", vx::num_threads()},
        {"device", device == vx::Device::cuda ? vx::cuda_device_description() : "cpu"}}},
      {"command", o.command},
      {"retrieval_text", opt.retrieval_contexts.empty() ? "" : o.filler}};
  const std::string doc = vx::eval_report_json(report, opt, texts, meta.dump(), false) + "\n";
  if (o.out.empty() || o.out == "-") std::fputs(doc.c_str(), stdout);
  else vx::write_file_atomic(o.out, doc);
  if (!o.prompts_out.empty()) vx::write_file_atomic(o.prompts_out, vx::eval_report_json(report, opt, texts, meta.dump(), true) + "\n");
  std::fprintf(stderr, "eval: %zu quality rows, %zu retrieval rows in %.0f s%s%s\n", report.quality.size(),
               report.retrieval.size(), report.seconds, o.out.empty() ? "" : " -> ", o.out.c_str());
}

}  // namespace

void add_eval(CLI::App& app) {
  auto o = std::make_shared<EvalCliOptions>();
  auto* c = app.add_subcommand(
      "eval", "Quality (ppl, KL, top-1 vs fp16) on held-out texts and pass-key retrieval, for several KV caches, as JSON");
  c->add_option("-m,--model", o->model, "GGUF model (default: SmolLM2-135M-Instruct)");
  c->add_option("--kv-cache", o->kv, "KV caches to evaluate (several; default: every shipped method)");
  c->add_option("--calib", o->calib, "Calibration of a vecinfer spec: SPEC=FILE (repeatable; default: first-use)");
  c->add_option("--text", o->texts, "Held-out texts (several; default: python3-doc classes, functional, GPL-3)");
  CLI::Option* ctx = c->add_option("-c,--ctx", o->contexts,
                                   "Quality context lengths (the default ones stop at the model's trained context)")
                        ->capture_default_str();
  c->add_flag("--allow-longer-context", o->allow_longer_context,
              "Contexts past the model's trained one: a warning, not an error");
  c->add_option("--chunk", o->chunk, "Quality: tokens per forward call")->capture_default_str();
  c->add_option("--retrieval-text", o->filler, "Retrieval distractor text")->capture_default_str();
  c->add_option("--retrieval-ctx", o->retrieval_contexts,
                "Retrieval context lengths (default: 2048, 4096, ... up to the model's limit or 16384)");
  c->add_option("--depths", o->depths, "Retrieval: relative depths of the key (0 = start)")->capture_default_str();
  c->add_option("--trials", o->trials, "Retrieval: prompts per context and depth")->capture_default_str();
  c->add_flag("--no-retrieval", o->no_retrieval, "Skip the retrieval test");
  c->add_flag("--no-quality", o->no_quality, "Skip the quality test");
  c->add_option("-o,--output", o->out, "JSON file to write (default: stdout)");
  c->add_option("--save-inputs", o->prompts_out,
                "Also write the JSON with every retrieval prompt's token ids (for bench/eval_llamacpp.py)");
  c->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  add_device_option(c, o->device);
  c->callback([o, c, ctx] {
    o->contexts_given = ctx->count() > 0;
    o->command = "veloxquant eval";
    for (const auto& a : c->get_options())
      if (a->count() > 0 && !a->get_lnames().empty()) {
        o->command += " --" + a->get_lnames()[0];
        for (const auto& v : a->results()) o->command += " " + v;
      }
    run_eval_cmd(*o);
  });
}

}  // namespace vq::cli
