// End-to-end decode speed of SmolLM2-135M with each KV cache at several contexts: the full
// forward pass of one token (all layers, the cache's append and attend, the output head; greedy)
// timed over `steps` tokens; tokens/s from the median step, and from the fastest step (the least
// disturbed by other processes on a shared machine), and tokens per process CPU-second (all
// threads; the work done, which a busy machine does not inflate the way it inflates wall time).
// How the context gets into the cache: by default the model's real keys/values of the text are
// recorded once (one fp16 prefill to the largest context) and appended into each method's
// caches (which encode them as in a prefill); the session then decodes from position 0 over
// those cached tokens: the work per step is that of a step at the context (attention over ctx
// cached tokens), the rotary angles are those of small positions (cost identical). --prefill runs
// a real prefill per method instead (minutes per method on 2 cores).
// usage: kv_speed_e2e [--text FILE] [--ctx 512,4096,8192] [--steps 24] [--threads 2]
//                     [--calib FILE] [--json FILE] [--nice N] [--prefill] SPEC...
// --nice N: scheduling priority of the timed decode steps only (e.g. -10 on a shared machine, so
// other jobs disturb the few seconds being timed less).
// --calib FILE applies to the vecinfer specs that follow it on the command line.
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kvcache/factory.h"
#include "kvcache/recording_cache.h"
#include "model/calibrate.h"
#include "model_fetch/model_fetch.h"
#include "model/model.h"

using namespace vq;
using Clock = std::chrono::steady_clock;

// Linux nice values are per thread: set every thread of the process (the pool's workers too).
static double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

static bool set_nice_all_threads(int nice) {
  bool ok = true;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task"))
    ok &= setpriority(PRIO_PROCESS, id_t(std::atoi(e.path().filename().c_str())), nice) == 0;
  return ok;
}

int main(int argc, char** argv) {
  std::string text_path = "/usr/share/doc/python3/html/_sources/library/stdtypes.rst.txt", calib, json_path;
  std::vector<int> ctxs = {512, 4096, 8192};
  int steps = 24, threads = 2, nice_timed = 0;
  bool prefill = false;
  std::vector<std::pair<std::string, std::string>> specs;  // (spec, calibration file)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string(); };
    if (a == "--text") text_path = next();
    else if (a == "--calib") calib = next();
    else if (a == "--json") json_path = next();
    else if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--nice") nice_timed = std::atoi(next().c_str());
    else if (a == "--prefill") prefill = true;
    else if (a == "--ctx") {
      ctxs.clear();
      std::stringstream ss(next());
      for (std::string x; std::getline(ss, x, ',');) ctxs.push_back(std::atoi(x.c_str()));
    } else specs.emplace_back(a, calib);
  }
  if (specs.empty()) specs = {{"fp16", ""}};
  set_num_threads(threads);
  try {
    const auto model = Model::load(default_model_path());
    const int max_ctx = *std::max_element(ctxs.begin(), ctxs.end());
    auto tokens = model->tokenizer().encode(read_text_file(text_path), true);
    VQ_CHECK(tokens.size() > 16, "{}: too short", text_path);
    const size_t base = tokens.size();
    while (tokens.size() < size_t(max_ctx)) tokens.push_back(tokens[tokens.size() % base]);  // repeat the text
    // Recorded activations: per layer keys/values [max_ctx, n_kv_heads, head_dim] f32.
    std::vector<const RecordingCache*> rec;
    std::unique_ptr<Session> rec_session;
    if (!prefill) {
      KVCacheFactory rf = [&rec](int, const KVGeometry& g) {
        auto c = std::make_unique<RecordingCache>(g);
        rec.push_back(c.get());
        return c;
      };
      rec_session = std::make_unique<Session>(*model, rf, max_ctx);
      const auto t0 = Clock::now();
      rec_session->forward(tokens.data(), max_ctx, nullptr);
      std::fprintf(stderr, "recorded %d tokens of real K/V in %.1f s\n", max_ctx,
                   std::chrono::duration<double>(Clock::now() - t0).count());
    }
    nlohmann::json out = nlohmann::json::array();
    const int V = model->config().n_vocab;
    std::vector<float> logits(static_cast<size_t>(V));
    std::printf("%-24s", "method");
    for (int c : ctxs) std::printf("  @%-5d med (best) /cpu-s", c);
    std::printf("  KV MiB@max  bits/elem\n");
    for (const auto& [spec, spec_calib] : specs) {
      const KVCacheConfig cfg = parse_kv_cache_spec(spec);
      const KVCacheFactory fac = make_kv_cache_factory(cfg, cfg.method == KVMethod::vecinfer ? spec_calib : "");
      Session s(*model, fac, max_ctx + int(ctxs.size()) * steps + 8);
      nlohmann::json row = {{"kv_cache", cfg.name()}, {"threads", threads}, {"steps", steps},
                            {"context_from", prefill ? "prefill" : "recorded K/V"}};
      std::printf("%-24s", cfg.name().c_str());
      std::fflush(stdout);
      size_t used = 0;  // prompt tokens (or recorded tokens) consumed
      for (int c : ctxs) {
        if (prefill) {
          const int64_t need = c - s.pos();
          if (need > 0) {
            s.forward(tokens.data() + used, int(need), nullptr);
            used += size_t(need);
          }
        } else {
          const KVGeometry& g = s.caches()[0]->geometry();
          const size_t row_floats = size_t(g.n_kv_heads) * g.head_dim;
          for (size_t l = 0; l < s.caches().size(); ++l) {
            KVCache& kv = *s.caches()[l];
            for (size_t t = used; t < size_t(c);) {
              const size_t n = std::min<size_t>(512, size_t(c) - t);
              kv.append(rec[l]->keys().data() + t * row_floats, rec[l]->values().data() + t * row_floats, int(n));
              t += n;
            }
          }
          used = std::max(used, size_t(c));
        }
        std::vector<double> dt;
        // every thread of the process (the pool's too) takes the timed priority; 0 = unchanged
        const int prio0 = getpriority(PRIO_PROCESS, 0);
        if (nice_timed != 0 && !set_nice_all_threads(nice_timed)) nice_timed = 0;
        const double cpu0 = process_cpu_seconds();
        int32_t tok = tokens[used % tokens.size()];
        row["cached_tokens@" + std::to_string(c)] = s.caches()[0]->size();
        for (int i = 0; i < steps; ++i) {
          const auto t0 = Clock::now();
          s.forward(&tok, 1, logits.data());
          tok = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
          dt.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
        }
        const double cpu_s = process_cpu_seconds() - cpu0;
        if (nice_timed != 0) set_nice_all_threads(prio0);
        std::sort(dt.begin(), dt.end());
        const double tps = 1.0 / dt[dt.size() / 2];
        row["tok_s@" + std::to_string(c)] = tps;
        row["tok_s_best@" + std::to_string(c)] = 1.0 / dt.front();
        row["tok_per_cpu_s@" + std::to_string(c)] = steps / cpu_s;
        std::printf("  %5.1f (%5.1f) %5.1f", tps, 1.0 / dt.front(), steps / cpu_s);
        std::fflush(stdout);
      }
      row["kv_bytes"] = s.kv_bytes();
      row["kv_fp16_bytes"] = s.kv_fp16_bytes();
      std::printf("  %10.1f  %9.2f\n", s.kv_bytes() / 1048576.0, 16.0 * double(s.kv_bytes()) / double(s.kv_fp16_bytes()));
      out.push_back(row);
    }
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(2) << "\n";
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv_speed_e2e: %s\n", e.what());
    return 1;
  }
}
