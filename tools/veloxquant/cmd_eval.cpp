// veloxquant eval: the quality table of several KV caches on one model (perplexity, KL and top-1
// agreement vs fp16 on held-out texts at several context lengths) and the long-context retrieval
// test (pass key at several depths), written as one JSON document (eval/eval_suite.h).
// bench/eval.sh adds llama.cpp's own KV types to the same document and draws the figures.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <thread>

#include "cli_checks.h"
#include "cli_model.h"
#include "commands.h"
#include "core/atomic_file.h"
#include "core/cpu_info.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kvcache/factory.h"
#include "kvcache/kv_method.h"
#include "eval/calibrate.h"
#include "eval/eval_suite.h"

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
  set_num_threads(o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())));
  // Outputs are checked before minutes of evaluation.
  if (!o.out.empty() && o.out != "-") check_output_path(o.out, "-o");
  if (!o.prompts_out.empty()) check_output_path(o.prompts_out, "--save-inputs");
  for (int c : o.contexts) VQ_CHECK(c >= 2 && c <= kMaxContextTokens, "-c: {} must be in 2..{}", c, kMaxContextTokens);
  for (int c : o.retrieval_contexts)
    VQ_CHECK(c >= 2 && c <= kMaxContextTokens, "--retrieval-ctx: {} must be in 2..{}", c, kMaxContextTokens);
  bool is_default = false;
  const std::string path = model_path_or_default(o.model, &is_default);
  const auto model = Model::load(path);
  // Contexts asked for are checked against the trained one; the default ones stop at it.
  std::vector<int> contexts = o.contexts;
  const int64_t trained = model->config().n_ctx_train;
  if (!o.contexts_given && trained > 0) {
    std::erase_if(contexts, [&](int c) { return c > trained; });
    if (contexts.empty()) contexts.push_back(int(trained));
  }
  for (int c : contexts) check_trained_context(c, model->config().n_ctx_train, o.allow_longer_context, fmt::format("-c {}", c));
  for (int c : o.retrieval_contexts)
    check_trained_context(c, model->config().n_ctx_train, o.allow_longer_context, fmt::format("--retrieval-ctx {}", c));
  // --calib SPEC=FILE: split at the last '=' (specs contain '=' themselves).
  std::map<std::string, std::string> calib_of;
  for (const std::string& c : o.calib) {
    const size_t eq = c.rfind('=');
    VQ_CHECK(eq != std::string::npos && eq > 0, "--calib '{}': expected SPEC=FILE", c);
    calib_of[parse_kv_cache_spec(c.substr(0, eq)).name()] = c.substr(eq + 1);
  }
  std::vector<std::string> specs = o.kv;
  if (specs.empty()) specs = kv_method_presets(/*evaluated_only=*/true);  // every registered method's presets
  std::vector<KVSpec> methods;
  ProgressBar bar;
  for (const std::string& s : specs) {
    const KVCacheConfig cfg = parse_kv_cache_spec(s);
    auto it = calib_of.find(cfg.name());
    methods.push_back(model_kv_spec(*model, path, is_default, cfg, it == calib_of.end() ? "" : it->second,
                                    [&](const char* st, int d, int t) { bar.update(st, d, t); }));
  }
  const KVSpec reference = make_kv_spec(parse_kv_cache_spec("fp16"));

  EvalOptions opt;
  opt.chunk = o.chunk;
  opt.trials = o.trials;
  opt.depths = o.depths;
  opt.contexts = o.no_quality ? std::vector<int>{} : contexts;
  if (!o.no_retrieval)
    opt.retrieval_contexts = !o.retrieval_contexts.empty()
                                 ? o.retrieval_contexts
                                 : default_retrieval_contexts(model->config().n_ctx_train, o.max_retrieval_ctx);
  std::vector<EvalText> texts;
  std::vector<std::string> text_paths = o.texts;
  if (text_paths.empty()) text_paths.assign(std::begin(kDefaultTexts), std::end(kDefaultTexts));
  if (!opt.contexts.empty())
    for (const std::string& p : text_paths) texts.push_back({stem(p), p, read_text_file(p)});
  const std::string filler = opt.retrieval_contexts.empty() ? std::string() : read_text_file(o.filler);

  const auto report = run_eval(*model, methods, reference, texts, filler, opt, [](const std::string& what, int d, int t) {
    std::fprintf(stderr, "eval: [%d/%d] %s\n", d, t, what.c_str());
  });

  const ModelConfig& mc = model->config();
  nlohmann::json meta = {
      {"model",
       {{"path", path},
        {"file", std::filesystem::path(path).filename().string()},
        {"name", mc.name},
        {"arch", mc.arch},
        {"n_layers", mc.n_layers},
        {"n_kv_heads", mc.n_kv_heads},
        {"head_dim", mc.head_dim},
        {"n_ctx_train", mc.n_ctx_train}}},
      {"date", iso_now()},
      {"machine", {{"cpu", cpu_model_name()}, {"threads", num_threads()}}},
      {"command", o.command},
      {"retrieval_text", opt.retrieval_contexts.empty() ? "" : o.filler}};
  const std::string doc = eval_to_json(report, opt, texts, meta, false).dump(1) + "\n";
  if (o.out.empty() || o.out == "-") std::fputs(doc.c_str(), stdout);
  else write_file_atomic(o.out, doc.data(), doc.size());
  if (!o.prompts_out.empty()) {
    const std::string pd = eval_to_json(report, opt, texts, meta, true).dump() + "\n";
    write_file_atomic(o.prompts_out, pd.data(), pd.size());
  }
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
