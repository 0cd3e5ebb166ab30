// veloxquant generate: streams text from a GGUF model through a (possibly compressed) KV cache,
// then reports prefill/decode speed and the cache's memory on stderr. On the public API
// (include/veloxquant): one sequence through a veloxquant::Session (session files included),
// several through a veloxquant::Engine.
#include <chrono>
#include <ctime>
#include <numeric>
#include <optional>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <unistd.h>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "cli_device.h"
#include "cli_kv.h"
#include "cli_model.h"
#include "commands.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/text_escape.h"
#include "veloxquant/engine.h"
#include "veloxquant/files.h"
#include "veloxquant/kv_spec.h"
#include "veloxquant/model.h"
#include "veloxquant/runtime.h"
#include "veloxquant/sampling.h"
#include "veloxquant/session.h"

namespace vq::cli {
namespace {

namespace vx = veloxquant;

struct GenerateOptions {
  std::string model, prompt_file, prompt_ids, system;
  int n_predict = 128;
  int n_ctx = 0;
  int threads = 0;
  int batch = 0;  // 0: vx::default_max_chunk(device)
  float temp = 0.8f, top_p = 0.95f, min_p = 0.05f, repeat_penalty = 1.0f;
  int top_k = 40, repeat_last_n = 64;
  int64_t seed = -1;
  bool chat = false, no_display_prompt = false, ignore_eos = false, quiet = false;
  bool allow_longer_context = false;  // -c / prompts past the model's trained context
  std::string kv_cache = "fp16", calib;
  std::string dump_logits, stats_json;
  std::vector<std::string> prompts;  // -p given more than once
  std::string prompts_file;          // one prompt per line
  int parallel = 1;
  double kv_budget_mib = 0;
  std::string save_session, load_session;  // session files (veloxquant::Session::save/load)
  std::string device = "cpu";
  int tp = 1;  // tensor-parallel ranks (simulated on the CPU)
  bool deterministic = false;  // batch-invariant engine (several prompts / --parallel)
};

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
// CPU seconds of the whole process (all threads): on a busy machine it shows the work done
// when the wall clock mostly shows waiting for a core.
double process_cpu_seconds() { return double(std::clock()) / CLOCKS_PER_SEC; }

std::string read_prompt_file(const std::string& path, const char* option) {
  return read_input_file(path, kMaxPromptFileBytes, option);
}

// "1,2,3" or "@FILE" (ids separated by commas or whitespace).
std::vector<int32_t> parse_ids(const std::string& spec) {
  std::string text = spec;
  if (!spec.empty() && spec[0] == '@') text = read_prompt_file(spec.substr(1), "--prompt-ids");
  for (char& c : text) {
    if (c == ',') c = ' ';
  }
  std::istringstream in(text);
  std::vector<int32_t> ids;
  std::string tok;
  while (in >> tok) {
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    VQ_CHECK(used == tok.size() && v >= 0 && v <= INT32_MAX, "--prompt-ids: '{}' is not a token id", tok);
    ids.push_back(static_cast<int32_t>(v));
  }
  VQ_CHECK(!ids.empty(), "--prompt-ids: no token ids");
  return ids;
}

// Logits dump for the parity test (little-endian):
//   "VQLOGIT1", u32 n_ids, u32 n_prompt, u32 n_vocab, u32 n_rows, i32 ids[n_ids],
//   f32 logits[n_rows][n_vocab] where row i holds the logits after token i (predicting i+1).
void write_logits_dump(const std::string& path, const std::vector<int32_t>& ids, int n_prompt, int n_vocab,
                       const std::vector<float>& rows) {
  const uint32_t n_rows = static_cast<uint32_t>(rows.size() / size_t(n_vocab));
  std::vector<uint8_t> buf;
  auto put = [&buf](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf.insert(buf.end(), b, b + n);
  };
  put("VQLOGIT1", 8);
  const uint32_t hdr[4] = {uint32_t(ids.size()), uint32_t(n_prompt), uint32_t(n_vocab), n_rows};
  put(hdr, sizeof(hdr));
  put(ids.data(), ids.size() * sizeof(int32_t));
  put(rows.data(), rows.size() * sizeof(float));
  vx::write_file_atomic(path, std::string(buf.begin(), buf.end()));
}

vx::SamplingParams sampler_params(const GenerateOptions& o) {
  vx::SamplingParams sp;
  sp.temperature = o.temp;
  sp.top_k = o.top_k;
  sp.top_p = o.top_p;
  sp.min_p = o.min_p;
  sp.repeat_penalty = o.repeat_penalty;
  sp.repeat_last_n = o.repeat_last_n;
  sp.seed = o.seed >= 0 ? uint64_t(o.seed) : std::random_device{}();
  return sp;
}

std::vector<int32_t> encode_prompt(const vx::Model& model, const GenerateOptions& o, std::string text) {
  const vx::Tokenizer tok = model.tokenizer();
  if (o.chat) {
    std::vector<vx::ChatMessage> msgs;
    if (!o.system.empty()) msgs.push_back({"system", o.system});
    msgs.push_back({"user", std::move(text)});
    text = tok.apply_chat_template(msgs, true);
  }
  std::vector<int32_t> ids = tok.encode(text, tok.add_bos_default(), true);
  VQ_CHECK(!ids.empty(), "the prompt encodes to no tokens");
  return ids;
}

// --parallel / several prompts: every sequence through the continuous-batching engine; each
// sequence's text is printed when it ends.
void run_parallel(const GenerateOptions& o, const vx::Model& model, const std::string& path, const vx::KVSpec& spec,
                  const std::vector<std::string>& texts) {
  const vx::ModelInfo& cfg = model.info();
  vx::EngineOptions eo;
  eo.device = resolve_device(o.device);
  eo.kv_budget_bytes = kv_budget_bytes(model, eo.device, o.kv_budget_mib);
  eo.max_sequences = o.parallel;
  eo.max_step_tokens = o.batch > 0 ? o.batch : vx::default_max_chunk(eo.device);
  eo.n_ctx = o.n_ctx;
  eo.deterministic = o.deterministic;
  eo.tp = o.tp;
  vx::Engine engine(model, spec, eo);
  check_kv_budget_holds_a_block(eo.kv_budget_bytes, o.kv_budget_mib, engine.min_budget_bytes(), spec.name());
  const vx::SamplingParams base = sampler_params(o);
  // One prompt and N sequences: N seeds, the prompt prefilled once and shared.
  const int n_seq = texts.size() == 1 ? o.parallel : int(texts.size());
  struct Out {
    std::vector<int32_t> tokens;
    vx::SequenceResult result;
    bool done = false;
  };
  std::vector<Out> outs(static_cast<size_t>(n_seq));
  std::vector<int64_t> ids(static_cast<size_t>(n_seq));
  const std::optional<vx::Tokenizer> tok =
      model.has_tokenizer() ? std::optional<vx::Tokenizer>(model.tokenizer()) : std::nullopt;
  const auto t0 = Clock::now();
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n_seq));
  for (int i = 0; i < n_seq; ++i) {  // every prompt checked before any runs
    prompts[size_t(i)] = o.prompt_ids.empty() ? encode_prompt(model, o, texts[size_t(texts.size() == 1 ? 0 : i)])
                                              : parse_ids(o.prompt_ids);
    check_trained_context(int64_t(prompts[size_t(i)].size()) + o.n_predict, cfg.n_ctx_train, o.allow_longer_context,
                          fmt::format("sequence {}: its prompt of {} tokens and -n {}", i, prompts[size_t(i)].size(),
                                      o.n_predict));
  }
  for (int i = 0; i < n_seq; ++i) {
    vx::Request r;
    r.prompt = std::move(prompts[size_t(i)]);
    r.sampling = base;
    r.sampling.seed = base.seed + uint64_t(i);
    r.max_new_tokens = o.n_predict;
    r.ignore_eos = o.ignore_eos;
    if (texts.size() == 1 && i > 0) r.fork_of = ids[0];
    r.on_token = [&outs, i](int64_t, int32_t t) {
      outs[size_t(i)].tokens.push_back(t);
      return true;
    };
    r.on_finish = [&outs, i, &o, &tok](const vx::SequenceResult& res) {
      Out& out = outs[size_t(i)];
      out.result = res;
      out.done = true;
      if (o.quiet) return;
      std::string text;
      for (int32_t t : out.tokens)
        if (tok && !(tok->is_end_of_generation(t) && !o.ignore_eos)) text += tok->piece(t);
      std::printf("--- sequence %d (%lld prompt tokens, %lld generated, %s) ---\n%s\n", i, (long long)res.n_prompt,
                  (long long)res.n_generated, vx::finish_reason_name(res.finish),
                  (::isatty(STDOUT_FILENO) ? escape_control(text, true) : text).c_str());
      std::fflush(stdout);
    };
    ids[size_t(i)] = engine.submit(std::move(r));
  }
  engine.run();
  const double wall = seconds_since(t0);
  const vx::EngineStats st = engine.stats();
  size_t tb = 0, ab = 0, fb = 0;
  long long toks = 0;
  int errors = 0;
  std::string first_error;
  for (const Out& out : outs) {
    tb += out.result.memory.token_bytes;
    ab += out.result.memory.allocated_bytes;
    fb += out.result.memory.fp16_bytes;
    toks += out.result.n_prompt + out.result.n_generated;
    if (out.result.finish == vx::FinishReason::error) {
      ++errors;
      if (first_error.empty()) first_error = out.result.error;
    }
  }
  std::fprintf(stderr, "\nmodel: %s (%s, %d layers), %d threads, %d sequences, up to %d at once\n", printable(path).c_str(),
               printable(cfg.arch).c_str(), cfg.n_layers, vx::num_threads(), n_seq, o.parallel);
  std::fprintf(stderr, "steps: %lld in %.3f s of %.3f s wall (%.2f ms per step), %lld prefill and %lld decode tokens, %lld preemptions\n",
               (long long)st.steps, st.step_seconds, wall, st.steps ? 1e3 * st.step_seconds / double(st.steps) : 0.0,
               (long long)st.prefill_tokens, (long long)st.decode_tokens, (long long)st.preemptions);
  std::fprintf(stderr, "decode: %.1f tokens/s aggregate\n", st.step_seconds > 0 ? double(st.decode_tokens) / st.step_seconds : 0.0);
  const vx::PoolMemory pool = engine.memory();
  std::fprintf(stderr, "%s (sums at each sequence's end)\n", kv_summary(spec.name(), toks, tb, ab, fb, pool.codebook_bytes).c_str());
  std::fprintf(stderr, "kv pool: peak %s of a %s budget\n", mb(pool.peak_bytes).c_str(), mb(pool.budget_bytes).c_str());
  VQ_CHECK(errors == 0, "{} of {} sequences failed: {}", errors, n_seq, first_error);
}

void run_generate(const GenerateOptions& o) {
  VQ_CHECK(o.n_predict >= 0 && o.n_predict <= kMaxContextTokens, "-n: {} must be in 0..{}", o.n_predict,
           kMaxContextTokens);
  VQ_CHECK(o.n_ctx >= 0 && o.n_ctx <= kMaxContextTokens, "-c: {} must be in 0..{} (0: prompt + n-predict)", o.n_ctx,
           kMaxContextTokens);
  VQ_CHECK(o.n_ctx == 0 || o.n_predict <= o.n_ctx, "-n: {} new tokens cannot fit the context of {} tokens (-c)",
           o.n_predict, o.n_ctx);
  VQ_CHECK(o.batch >= 0, "-b: {} must be >= 0 (0: 512 on the CPU, 2048 on the GPU)", o.batch);
  VQ_CHECK(o.parallel >= 1 && o.parallel <= 4096, "--parallel: {} must be in 1..4096", o.parallel);
  VQ_CHECK(o.threads >= 0 && o.threads <= 1024, "-t: {} out of range", o.threads);
  VQ_CHECK(o.tp >= 1 && o.tp <= 1024, "--tp: {} must be in 1..1024", o.tp);
  const int n_sources = int(!o.prompts.empty()) + int(!o.prompts_file.empty()) + int(!o.prompt_file.empty()) +
                        int(!o.prompt_ids.empty());
  const bool loading = !o.load_session.empty();  // --load-session: a prompt is optional
  VQ_CHECK(n_sources == 1 || (n_sources == 0 && loading),
           "give exactly one of -p PROMPT (repeatable), --prompts-file FILE, --prompt-file FILE, --prompt-ids IDS");
  VQ_CHECK(o.system.empty() || o.chat, "--system: only applies with --chat");
  VQ_CHECK(!o.chat || o.prompt_ids.empty(), "--chat: does not apply to --prompt-ids (token ids are not text)");
  // Output files are checked before anything slow, so a typo fails now, not after the run.
  if (!o.stats_json.empty()) vx::check_output_path(o.stats_json, "--stats-json");
  if (!o.dump_logits.empty()) vx::check_output_path(o.dump_logits, "--dump-logits");
  if (!o.save_session.empty()) vx::check_output_path(o.save_session, "--save-session");
  if (loading) check_session_input(o.load_session, "--load-session");
  std::vector<std::string> texts = o.prompts;
  if (!o.prompts_file.empty()) {
    std::istringstream in(read_prompt_file(o.prompts_file, "--prompts-file"));
    std::string line;
    while (std::getline(in, line))
      if (!line.empty()) texts.push_back(line);
    VQ_CHECK(!texts.empty(), "--prompts-file: {} holds no prompts (one per line)", printable(o.prompts_file));
  }
  // --deterministic runs even one prompt through the engine: its tokens are then those it gets
  // beside others.
  const bool parallel = o.parallel > 1 || texts.size() > 1 || o.deterministic;
  VQ_CHECK(!parallel || (o.dump_logits.empty() && o.stats_json.empty() && o.save_session.empty() && !loading),
           "--dump-logits, --stats-json and sessions are for one sequence (not with --parallel, several prompts or "
           "--deterministic)");
  VQ_CHECK(!loading || o.dump_logits.empty(), "--dump-logits is not available with --load-session");
  VQ_CHECK(o.tp == 1 || !o.deterministic, "--tp {}: --deterministic is not available with tensor parallelism", o.tp);
  vx::set_num_threads(o.threads > 0 ? o.threads : int(std::max(1u, std::thread::hardware_concurrency())));

  // The KV cache spec is checked before the (slow) model load.
  const KVCacheConfig kv_config = vx::parse_kv_cache_config(o.kv_cache);
  check_cache_flags(kv_config, o.calib);
  // Inputs too: a missing or oversized prompt file fails before the model loads.
  if (!o.prompt_file.empty()) texts.push_back(read_prompt_file(o.prompt_file, "--prompt-file"));
  const std::string prompt_text = texts.empty() ? std::string() : texts[0];
  std::vector<int32_t> ids;
  if (!o.prompt_ids.empty()) ids = parse_ids(o.prompt_ids);
  const std::string path = model_path_or_default(o.model);
  const vx::Model model = vx::Model::load(path);
  const vx::ModelInfo& cfg = model.info();
  check_cache_fits_model(kv_config, cfg.head_dim, path);
  model.check_weights_finite();
  if (o.tp > 1) {
    const std::string where = vx::check_tensor_parallel(model, o.tp, resolve_device(o.device));
    if (!o.quiet && resolve_device(o.device) == vx::Device::cuda) std::fprintf(stderr, "tp %d: %s\n", o.tp, where.c_str());
  }
  if (o.n_ctx > 0) check_trained_context(o.n_ctx, cfg.n_ctx_train, o.allow_longer_context, "-c");
  // vecinfer: --calib, else (a known model: Model::is_default) the first-use calibration from the
  // Jargon File.
  const vx::KVSpec spec = kv_spec_for_model(model, kv_config, o.calib);
  warn_kv_quality(spec);
  if (parallel) {
    if (texts.empty()) texts.push_back("");  // --prompt-ids
    run_parallel(o, model, path, spec, texts);
    return;
  }

  std::string shown_prompt;
  if (o.prompt_ids.empty() && n_sources > 0) {
    shown_prompt = prompt_text;
    ids = encode_prompt(model, o, prompt_text);
  }
  // --load-session: the context holds the session's tokens too (their count is in the file).
  const int64_t trained_or_4k = cfg.n_ctx_train > 0 ? cfg.n_ctx_train : 4096;
  if (o.n_ctx == 0 && !loading)  // the context is the prompt and -n: both within the trained one
    check_trained_context(int64_t(ids.size()) + std::max(o.n_predict, 1), cfg.n_ctx_train, o.allow_longer_context,
                          fmt::format("the prompt of {} tokens and -n {}", ids.size(), o.n_predict));
  const int n_ctx = o.n_ctx > 0 ? o.n_ctx
                    : loading   ? int(std::max<int64_t>(trained_or_4k, int64_t(ids.size()) + std::max(o.n_predict, 1)))
                                : int(ids.size()) + std::max(o.n_predict, 1);
  const vx::Device device = resolve_device(o.device);
  vx::SessionOptions so;
  so.n_ctx = n_ctx;
  so.max_chunk = o.batch;
  so.kv_budget_bytes = kv_budget_bytes(model, device, o.kv_budget_mib);
  so.device = device;
  so.tp = o.tp;
  vx::Session session(model, spec, so);
  check_kv_budget_holds_a_block(so.kv_budget_bytes, o.kv_budget_mib, session.min_budget_bytes(), spec.name());
  int64_t n_kv = 0;  // tokens whose KV the session file brought
  if (loading) {
    vx::LoadedSession ld = session.load(o.load_session);
    // The new prompt continues the session's text: no second BOS.
    if (!ids.empty() && model.tokenizer().add_bos_default() && ids[0] == model.tokenizer().bos()) ids.erase(ids.begin());
    ids.insert(ids.begin(), ld.tokens.begin(), ld.tokens.end());
    n_kv = ld.n_kv;
    VQ_CHECK(int64_t(ids.size()) > n_kv, "{}: the session's tokens are all in its KV; give -p to continue it",
             o.load_session);
    if (o.n_ctx == 0)
      check_trained_context(int64_t(ids.size()) + std::max(o.n_predict, 1), cfg.n_ctx_train, o.allow_longer_context,
                            fmt::format("the session's and the prompt's {} tokens and -n {}", ids.size(),
                                        o.n_predict));
  }
  const int n_prompt = static_cast<int>(ids.size());
  VQ_CHECK(n_prompt < n_ctx || (n_prompt == n_ctx && o.n_predict == 0),
           "the prompt has {} tokens, which does not fit the context of {} (-c)", n_prompt, n_ctx);

  const vx::SamplingParams sp = sampler_params(o);
  vx::Sampler sampler(sp);
  for (int32_t id : ids) sampler.accept(id);

  // On a terminal, text from the prompt file and the model's vocabulary is shown with control
  // characters escaped (a token or file could otherwise drive the terminal); pipes get it raw.
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  StreamEscaper terminal;  // tokens may split a UTF-8 character
  if (!o.no_display_prompt && !o.quiet) {
    std::fputs((tty ? escape_control(shown_prompt, true) : shown_prompt).c_str(), stdout);
    if (o.chat && !shown_prompt.empty()) std::fputs("\n\n", stdout);  // the reply starts below the question
    std::fflush(stdout);
  }
  const int V = cfg.n_vocab;
  const bool dump = !o.dump_logits.empty();
  std::vector<float> dumped;                      // [rows, n_vocab] when dumping
  std::vector<float> logits(size_t(dump ? n_prompt : 1) * V);  // [n_prompt or 1, n_vocab]

  const auto t_prefill = Clock::now();
  const double c_prefill = process_cpu_seconds();
  session.forward(std::span<const int32_t>(ids.data() + n_kv, size_t(n_prompt - n_kv)), logits.data(), dump);
  const double prefill_s = seconds_since(t_prefill);
  const double prefill_cpu_s = process_cpu_seconds() - c_prefill;
  if (dump) dumped = logits;
  const float* last = logits.data() + size_t(dump ? n_prompt - 1 : 0) * V;
  check_logits_finite(last, V, n_prompt - 1);

  double decode_cpu_s = 0.0;
  std::vector<double> step_s;  // wall seconds of each decode step
  int n_decoded = 0, n_generated = 0;
  std::string stop_reason = "n_predict";
  const std::optional<vx::Tokenizer> tok =
      model.has_tokenizer() ? std::optional<vx::Tokenizer>(model.tokenizer()) : std::nullopt;
  std::vector<float> step(static_cast<size_t>(V));  // [1, n_vocab]
  for (int i = 0; i < o.n_predict; ++i) {
    const int32_t next = sampler.sample(last, V);
    sampler.accept(next);
    ids.push_back(next);
    ++n_generated;
    const bool eog = tok && tok->is_end_of_generation(next) && !o.ignore_eos;
    if (tok && !o.quiet && !eog) {
      const std::string piece = tty ? terminal.push(tok->piece(next)) : tok->piece(next);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fflush(stdout);
    }
    if (eog) { stop_reason = "end of generation token"; break; }
    if (i + 1 == o.n_predict) break;  // the last token need not go through the model
    if (session.pos() >= session.n_ctx()) { stop_reason = "context full"; break; }
    const auto t0 = Clock::now();
    const double c0 = process_cpu_seconds();
    session.forward(std::span<const int32_t>(&next, 1), step.data());
    step_s.push_back(seconds_since(t0));
    decode_cpu_s += process_cpu_seconds() - c0;
    ++n_decoded;
    check_logits_finite(step.data(), V, session.pos() - 1);
    if (dump) dumped.insert(dumped.end(), step.begin(), step.end());
    last = step.data();
  }
  const double decode_s = std::accumulate(step_s.begin(), step_s.end(), 0.0);
  if (tty && !o.quiet) std::fputs(terminal.flush().c_str(), stdout);
  if (!o.quiet) std::fputs("\n", stdout);
  std::fflush(stdout);

  if (dump) write_logits_dump(o.dump_logits, ids, n_prompt, V, dumped);
  // The KV of every fed token and all the ids (the last one sampled is still to be fed).
  if (!o.save_session.empty()) session.save(o.save_session, ids);

  const double pp_tps = prefill_s > 0 ? n_prompt / prefill_s : 0.0;
  const double tg_tps = decode_s > 0 ? n_decoded / decode_s : 0.0;
  const vx::KVMemory mem = session.memory();
  const size_t kvb = mem.token_bytes, kva = mem.allocated_bytes, kv16 = mem.fp16_bytes, cb = mem.codebook_bytes;
  const double bpe = kv16 ? 16.0 * double(kvb) / double(kv16) : 0.0;
  const std::string kv_name = spec.name();
  std::fprintf(stderr, "\nmodel: %s (%s, %d layers), %d threads, seed %llu, stop: %s\n", printable(path).c_str(),
               printable(cfg.arch).c_str(), cfg.n_layers, vx::num_threads(), static_cast<unsigned long long>(sp.seed),
               stop_reason.c_str());
  std::fprintf(stderr, "prefill: %d tokens in %.3f s (%.1f tokens/s)\n", n_prompt, prefill_s, pp_tps);
  std::fprintf(stderr, "decode:  %d tokens in %.3f s (%.1f tokens/s)\n", n_decoded, decode_s, tg_tps);
  std::fprintf(stderr, "%s\n", kv_summary(kv_name, session.pos(), kvb, kva, kv16, cb).c_str());
  if (!o.stats_json.empty()) {
    nlohmann::json j = {{"model", path}, {"threads", vx::num_threads()}, {"kv_cache", kv_name},
                        {"n_prompt", n_prompt}, {"n_generated", n_generated}, {"n_decoded", n_decoded},
                        {"prefill_s", prefill_s}, {"decode_s", decode_s},
                        {"prefill_cpu_s", prefill_cpu_s}, {"decode_cpu_s", decode_cpu_s}, {"decode_step_s", step_s},
                        {"prefill_tps", pp_tps},
                        {"decode_tps", tg_tps}, {"kv_bytes", kvb}, {"kv_allocated_bytes", kva}, {"kv_fp16_bytes", kv16},
                        {"kv_codebook_bytes", cb}, {"bits_per_element", bpe}, {"stop", stop_reason}, {"tp", o.tp},
                        {"tokens", std::vector<int32_t>(ids.begin() + n_prompt, ids.end())}};
    const std::string s = j.dump(1) + "\n";
    vx::write_file_atomic(o.stats_json, s);
  }
}

}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* c = app.add_subcommand("generate", "Generate text from a GGUF model (default: SmolLM2-135M-Instruct)");
  c->add_option("-m,--model", o->model, model_help());
  c->add_option("-p,--prompt", o->prompts, "Prompt text (repeat for several sequences)");
  c->add_option("--prompts-file", o->prompts_file, "Several prompts, one per line (at most 16 MiB; one sequence each)");
  c->add_option("--parallel", o->parallel,
                "Sequences running at once (continuous batching); with one prompt: that many samples (seeds "
                "seed, seed+1, ...) sharing the prompt's KV blocks")
      ->capture_default_str();
  c->add_option("--kv-budget", o->kv_budget_mib, "KV pool budget in MiB (0: half of the available memory)")
      ->capture_default_str();
  c->add_option("-f,--prompt-file", o->prompt_file, "Read the prompt from a file (at most 16 MiB)");
  c->add_option("--prompt-ids", o->prompt_ids, "Prompt as token ids: \"1,2,3\" or @FILE (at most 16 MiB)");
  c->add_option("--system", o->system, "System message (with --chat)");
  c->add_option("-n,--n-predict", o->n_predict, "Tokens to generate")->capture_default_str();
  c->add_option("-c,--ctx-size", o->n_ctx, "Context size in tokens (0: prompt + n-predict)")->capture_default_str();
  c->add_flag("--deterministic", o->deterministic,
              "With several prompts or --parallel: each sequence's tokens do not depend on the others "
              "(batch-invariant engine; docs/DETERMINISM.md)");
  c->add_flag("--allow-longer-context", o->allow_longer_context,
              "Run past the model's trained context (-c, or prompt + n-predict) with a warning, not an error");
  c->add_option("-t,--threads", o->threads, "Threads (0: all cores)")->capture_default_str();
  c->add_option("-b,--batch-size", o->batch, "Prompt tokens per batch (0: 512 on the CPU, 2048 on the GPU)")
      ->capture_default_str();
  c->add_option("--temp", o->temp, "Temperature (<= 0: greedy)")->capture_default_str();
  c->add_option("--top-k", o->top_k, "Top-k (<= 0: all)")->capture_default_str();
  c->add_option("--top-p", o->top_p, "Top-p")->capture_default_str();
  c->add_option("--min-p", o->min_p, "Min-p")->capture_default_str();
  c->add_option("--repeat-penalty", o->repeat_penalty, "Repetition penalty")->capture_default_str();
  c->add_option("--repeat-last-n", o->repeat_last_n, "Tokens the penalty looks back over")->capture_default_str();
  c->add_option("-s,--seed", o->seed, "RNG seed (-1: random)")->capture_default_str();
  c->add_flag("--chat", o->chat, "Wrap the prompt in the model's chat template");
  c->add_option("--kv-cache", o->kv_cache, "KV cache spec (syntax below)")->capture_default_str();
  c->add_option("--calib", o->calib, "Calibration file for vecinfer (from `veloxquant calibrate`)");
  c->footer(vx::kv_cache_spec_help());
  add_device_option(c, o->device);
  c->add_option("--tp", o->tp,
                "Tensor-parallel ranks: the forward split by attention heads and MLP columns (cpu: ranks simulated "
                "in turn; cuda: one rank per GPU over NCCL, or every rank on GPU 0 when the host has fewer GPUs; "
                "docs/TENSOR_PARALLEL.md)")
      ->capture_default_str();
  c->add_flag("--no-display-prompt", o->no_display_prompt, "Do not echo the prompt");
  c->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past end-of-generation tokens");
  c->add_flag("-q,--quiet", o->quiet, "Print no text, only the statistics");
  c->add_option("--stats-json", o->stats_json, "Write the statistics as JSON to a file");
  c->add_option("--save-session", o->save_session, "Write the sequence's KV (native form) and tokens to a file at the end");
  c->add_option("--load-session", o->load_session,
                "Continue a session file: its tokens, then the prompt (if any), then n-predict new tokens");
  c->add_option("--dump-logits", o->dump_logits, "(testing) write token ids and all logits to a file")
      ->group("");
  c->callback([o] { run_generate(*o); });
}

}  // namespace vq::cli
