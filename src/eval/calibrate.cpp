#include "eval/calibrate.h"

#include <sys/stat.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "codec/calibration_check.h"
#include "codec/key_mean.h"
#include "codec/learned_key_map.h"
#include "core/cache_dir.h"
#include "core/error.h"
#include "core/input_file.h"
#include "core/thread_pool.h"
#include "eval/perplexity.h"
#include "kvcache/factory.h"
#include "kvcache/kv_method.h"
#include "model/layers.h"
#include "model/session.h"
#include "core/sha256.h"

namespace vq {

// Tag of the first-use calibration recipe, part of the cached file's name. -r2: sinks left out of
// training (CalibTrainOptions::skip_tokens); -r3: query-aware smoothing (issue 18); -r4: 8192
// tokens instead of 2048 (kFirstUseCalibTokens); -r5: the same codebooks plus the held-out check
// (Calibration::check), so that the first-use file can warn (issue 18); -r6: the rotated key mean
// (kKeyMeanTokens; docs/QUALITY.md "Rotated key mean"), now that the device kernels add it back;
// -r7: the learned key transform (default_key_transform; docs/QUALITY.md "Learned key transform"),
// on both devices since the device kernels apply its maps; shared books keep -r6. A "-tN" suffix: the
// first use trained on N tokens, more than kFirstUseCalibTokens (first_use_calib_tokens: head_dim > 128).
static constexpr const char* kCalibRecipe = "-r7";
static constexpr const char* kCalibRecipeHadamard = "-r6";
// Tokens per calibration sequence (see calibrate_model).
static constexpr int kCalibSegment = 2048;

static bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

static std::string strip_html(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  bool in_tag = false;
  for (char c : s) {
    if (c == '<') in_tag = true;
    else if (c == '>') in_tag = false;
    else if (!in_tag) out += c;
  }
  return out;
}

std::string read_text_file(const std::string& path) {
  struct stat st {};
  VQ_CHECK(::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode), "text file '{}': not found or not a file", path);
  std::string text;
  if (ends_with(path, ".gz")) {
    for (char c : path)
      VQ_CHECK(c != '\'', "text file '{}': quote characters are not supported in a .gz path", path);
    FILE* p = ::popen(("gzip -dc '" + path + "'").c_str(), "r");
    VQ_CHECK(p, "text file '{}': cannot run gzip -dc", path);
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0 && text.size() <= kMaxTextFileBytes) text.append(buf, n);
    const int rc = ::pclose(p);
    VQ_CHECK(text.size() <= kMaxTextFileBytes, "text file '{}': decompresses to more than the limit of {}", path,
             format_size_limit(kMaxTextFileBytes));
    VQ_CHECK(rc == 0, "text file '{}': gzip -dc failed (status {})", path, rc);
  } else {
    text = read_input_file(path, kMaxTextFileBytes, "text file");
  }
  if (ends_with(path, ".html") || ends_with(path, ".htm") || ends_with(path, ".html.gz")) text = strip_html(text);
  VQ_CHECK(!text.empty(), "text file '{}' is empty", path);
  return text;
}

KVRecording record_kv(const Model& model, const std::vector<int32_t>& ids, int seg, const CalibProgress& progress,
                      KVDevice device, int64_t position_span, bool query_moment) {
  const ModelConfig& mc = model.config();
  VQ_CHECK(seg >= 1, "calibrate: segment of {} tokens must be >= 1", seg);
  VQ_CHECK(position_span >= 0, "calibrate: position span {} must be >= 0", position_span);
  const int n = int(ids.size());
  const int H = mc.n_kv_heads, Hq = mc.n_heads, D = mc.head_dim, group = Hq / H;
  KVRecording rec;
  rec.n_tokens = n;
  rec.segment = seg;
  rec.keys.resize(size_t(mc.n_layers));
  rec.values.resize(size_t(mc.n_layers));
  rec.query_energy.assign(size_t(mc.n_layers), std::vector<double>(size_t(H) * D, 0.0));
  if (query_moment) rec.query_moment.assign(size_t(mc.n_layers), std::vector<double>(size_t(H) * D * D, 0.0));
  std::vector<float> qrows;  // [m * group, D]: one KV head's query rows of an observed chunk
  // target[g]: the position token g's keys and queries are rotated to (position_span > 0): uniform in
  // [0, position_span), from a fixed seed so that a recording is reproducible.
  std::vector<int64_t> target;
  if (position_span > 0) {
    std::mt19937_64 rng(0x9e3779b97f4a7c15ull);
    std::uniform_int_distribution<int64_t> pick(0, position_span - 1);
    target.resize(size_t(n));
    for (auto& t : target) t = pick(rng);
  }
  rec.positions.resize(size_t(n));
  for (int g = 0; g < n; ++g) rec.positions[size_t(g)] = target.empty() ? g % seg : target[size_t(g)];
  std::vector<float> qbuf, kbuf, cosb(size_t(mc.n_rot / 2)), sinb(size_t(mc.n_rot / 2));
  for (int s0 = 0; s0 < n; s0 += seg) {
    const int ns = std::min(seg, n - s0);
    std::vector<int64_t> seen(size_t(mc.n_layers), 0);  // tokens of this segment each layer has shown
    // The model runs with an fp16 cache; the observer records each layer's keys and values.
    Session s(model, KVSpec{KVCacheConfig{}, nullptr}, ns, Session::kDefaultChunk, size_t(-1), device);
    s.forward_pass().set_kv_observer([&](int layer, int, const float* q, const float* k, const float* v, int m) {
      const size_t e = size_t(m) * H * D;
      if (!target.empty()) {
        // R(target) R(-pos) = R(target - pos): one rotation by the difference, per token.
        qbuf.assign(q, q + size_t(m) * Hq * D);
        kbuf.assign(k, k + e);
        const std::vector<double>& inv = model.rope_inv_freqs(layer);
        const bool neox = mc.rope_layout == RopeLayout::NeoX;
        for (int t = 0; t < m; ++t) {
          const int64_t pos = seen[size_t(layer)] + t;
          const double delta = double(target[size_t(s0 + pos)] - pos);
          for (size_t i = 0; i < cosb.size(); ++i) {
            cosb[i] = float(std::cos(delta * inv[i]));
            sinb[i] = float(std::sin(delta * inv[i]));
          }
          rope_apply(qbuf.data() + size_t(t) * Hq * D, Hq, D, mc.n_rot, cosb.data(), sinb.data(), neox);
          rope_apply(kbuf.data() + size_t(t) * H * D, H, D, mc.n_rot, cosb.data(), sinb.data(), neox);
        }
        q = qbuf.data();
        k = kbuf.data();
      }
      seen[size_t(layer)] += m;
      auto& qe = rec.query_energy[size_t(layer)];
      for (int t = 0; t < m; ++t)
        for (int hq = 0; hq < Hq; ++hq) {
          const float* row = q + (size_t(t) * Hq + hq) * D;
          double* dst = qe.data() + size_t(hq / group) * D;
          for (int c = 0; c < D; ++c) dst[c] += double(row[c]) * row[c];
        }
      if (query_moment)
        for (int h = 0; h < H; ++h) {
          qrows.resize(size_t(m) * group * D);
          for (int t = 0; t < m; ++t)
            std::copy_n(q + (size_t(t) * Hq + size_t(h) * group) * D, size_t(group) * D,
                        qrows.data() + size_t(t) * group * D);
          add_second_moment(qrows.data(), int64_t(m) * group, D, D,
                            rec.query_moment[size_t(layer)].data() + size_t(h) * D * D);
        }
      rec.keys[size_t(layer)].insert(rec.keys[size_t(layer)].end(), k, k + e);
      rec.values[size_t(layer)].insert(rec.values[size_t(layer)].end(), v, v + e);
    });
    const int chunk = 256;
    for (int done = 0; done < ns; done += chunk) {
      const int m = std::min(chunk, ns - done);
      s.forward(ids.data() + s0 + done, m, nullptr);
      if (progress) progress("prefill", s0 + done + m, n);
    }
  }
  const double per = double(n) * group;
  for (auto& layer : rec.query_energy)
    for (auto& x : layer) x /= per;
  for (auto& layer : rec.query_moment)
    for (auto& x : layer) x /= per;
  return rec;
}

int64_t calib_position_span(const Model& model, const CalibTrainOptions& opt) {
  if (opt.position_span >= 0) return opt.position_span;
  const int64_t trained = model.config().n_ctx_train > 0 ? model.config().n_ctx_train : kMaxCalibPositionSpan;
  return std::min<int64_t>(trained, kMaxCalibPositionSpan);
}

Calibration calibrate_recording(const Model& model, const KVRecording& rec, const KVCacheConfig& cfg,
                                const CalibTrainOptions& opt_in, const std::string& model_name,
                                const CalibProgress& progress) {
  const ModelConfig& mc = model.config();
  CalibTrainOptions opt = opt_in;
  opt.segment_tokens = opt.segment_tokens > 0 ? opt.segment_tokens : kCalibSegment;
  std::vector<const float*> k, v;
  for (int l = 0; l < mc.n_layers; ++l) {
    k.push_back(rec.keys[size_t(l)].data());
    v.push_back(rec.values[size_t(l)].data());
  }
  if (progress) opt.progress = [&](int d, int t) { progress("train", d, t); };
  if (opt.query_energy.empty() && opt.query_aware) opt.query_energy = rec.query_energy;
  if (opt.key_transform == KeyTransform::learned && opt.query_moment.empty()) {
    VQ_CHECK(rec.query_moment.size() == size_t(mc.n_layers),
             "calibrate: the learned key transform needs a recording with the queries' second moment");
    opt.query_moment = rec.query_moment;
  }
  // The rotated key mean (codec/key_mean.h): measured on the recording, removed from the keys the
  // codebooks train on exactly as the cache removes it before coding.
  const int T = opt.key_mean_tokens;
  VQ_CHECK(T >= 0 && T <= 4096, "calibrate: key mean segment of {} tokens must be in 0..4096", T);
  KeyMeanFitSpec km;
  std::vector<bool> use;
  if (T > 0 && mc.n_rot >= 2) {
    VQ_CHECK(rec.positions.size() == size_t(rec.n_tokens) && rec.segment > 0,
             "calibrate: the recording has no positions (internal error)");
    use.resize(size_t(rec.n_tokens));
    for (int64_t t = 0; t < rec.n_tokens; ++t) use[size_t(t)] = t % rec.segment >= opt.skip_tokens;
    km.T = T, km.pos = rec.positions.data(), km.use = &use, km.n_rot = mc.n_rot;
    km.neox = mc.rope_layout == RopeLayout::NeoX;
    for (int l = 0; l < mc.n_layers; ++l) km.freqs.push_back(model.rope_inv_freqs(l));
  }
  return train_calibration_with_key_mean(cfg, mc.n_kv_heads, mc.head_dim, k, v, rec.n_tokens, opt, model_name, km);
}

CalibrationCheck measure_calibration(const Model& model, const std::vector<int32_t>& ids, const KVCacheConfig& cfg,
                                     const Calibration& cal, KVDevice device) {
  VQ_CHECK(ids.size() >= 2, "calibration check: {} tokens (at least 2)", ids.size());
  KVCacheConfig c = cfg;
  // A non-owning handle: the spec lives only for this call.
  c.calibration = std::shared_ptr<const Calibration>(&cal, [](const Calibration*) {});
  c.calibration_file.clear();
  const KVSpec method = make_kv_spec(c), reference = make_kv_spec(parse_kv_cache_spec("fp16"));
  PerplexityOptions po;
  po.n_ctx = int(ids.size());
  po.chunk = 256;
  po.device = device;
  const PerplexityResult r = evaluate_perplexity(model, ids, method, &reference, po);
  CalibrationCheck out;
  out.tokens = uint32_t(r.n_scored);
  out.kl = std::max(0.0, r.kl);  // rounding can leave a tiny negative mean
  out.top1 = r.top1;
  out.ppl_ratio = r.ref_perplexity > 0 ? r.perplexity / r.ref_perplexity : 0;
  VQ_CHECK(std::isfinite(out.kl) && std::isfinite(out.ppl_ratio) && out.ppl_ratio > 0,
           "calibration check: {} gave a non-finite KL ({}) or perplexity ratio ({}) on held-out tokens", cfg.name(),
           out.kl, out.ppl_ratio);
  return out;
}

std::string calibration_quality_warning(const KVCacheConfig& cfg, const Calibration& cal) {
  const CalibrationCheck& k = cal.check;
  if (k.tokens == 0 || k.kl <= kQualityTargetKL) return "";
  std::string fix;
  if (cfg.key == cfg.value && cfg.key == PQPreset{4, 8})  // the split has d4b8's bytes, no other preset's
    fix = "vecinfer:k=d4b10,v=d8b12 stores the same bytes per token (with 10x larger codebooks) and cut this KL by "
          "about a third on every model measured; ";
  fix += "a 4-bit or wider cache (e.g. vecinfer:d2b8, q8_0 or fp16) is the safe choice for this model";
  return fmt::format(
      "{}: its calibration measured KL {:.4f} vs fp16 (top-1 agreement {:.1f}%, perplexity {:+.2f}%) on {} held-out "
      "tokens, above the {} this project targets for 2-bit caches (docs/QUALITY.md); {}",
      cfg.name(), k.kl, 100.0 * k.top1, 100.0 * (k.ppl_ratio - 1), k.tokens, kQualityTargetKL, fix);
}

Calibration calibrate_model(const Model& model, const std::string& text, int max_tokens, const KVCacheConfig& cfg,
                            const CalibTrainOptions& opt_in, const std::string& model_name,
                            const CalibProgress& progress, KVDevice device) {
  cfg.validate(model.config().head_dim);
  CalibTrainOptions opt = opt_in;
  VQ_CHECK(max_tokens >= 16, "calibrate: --tokens {} must be >= 16", max_tokens);
  VQ_CHECK(opt.held_out_tokens >= 0, "calibrate: held_out_tokens {} must be >= 0", opt.held_out_tokens);
  const bool bos = model.tokenizer().add_bos_default();
  std::vector<int32_t> ids = model.tokenizer().encode(text, bos);
  // The held-out check's tokens: the ones after those trained on (a window of their own, starting
  // with BOS where the model adds one).
  std::vector<int32_t> held;
  if (int64_t(ids.size()) - max_tokens >= kMinHeldOutTokens && opt.held_out_tokens >= kMinHeldOutTokens) {
    const size_t n = std::min(ids.size() - size_t(max_tokens), size_t(opt.held_out_tokens) - (bos ? 1 : 0));
    held.reserve(n + 1);
    if (bos) held.push_back(ids.front());
    for (size_t i = 0; i < n; ++i) held.push_back(ids[size_t(max_tokens) + i]);
  }
  if (int(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
  VQ_CHECK(ids.size() >= 16, "calibrate: the text gives only {} tokens", ids.size());
  // The text runs as independent sequences of `seg` tokens (each from an empty cache): keys are
  // post-RoPE, so the positions seen in calibration shape the codebooks. Measured on SmolLM2 (KL
  // vs fp16 at context 1024, d4b8): 8192 tokens as one sequence 0.044, as 4 x 2048 0.030, 2048
  // tokens 0.027; positions far beyond the evaluated ones spread the centroids thin.
  const int seg = opt.segment_tokens > 0 ? opt.segment_tokens : kCalibSegment;
  if (opt.key_transform_auto)
    opt.key_transform = default_key_transform(cfg, int64_t(ids.size()), model.config().head_dim);
  Calibration cal = calibrate_recording(
      model,
      record_kv(model, ids, seg, progress, device, calib_position_span(model, opt),
                opt.key_transform == KeyTransform::learned),
      cfg, opt, model_name, progress);
  if (!held.empty()) {
    if (progress) progress("check", 0, 1);
    cal.check = measure_calibration(model, held, cfg, cal, device);
    if (progress) progress("check", 1, 1);
  }
  return cal;
}

KVCacheConfig first_use_calib_config(const KVCacheConfig& cfg) {
  KVCacheConfig c = cfg;
  // 12-bit key books share one codebook per head: 4096 entries need more points than the first-use
  // tokens give per sub-space. 12-bit value books alone stay per sub-space (8192 tokens fill them;
  // values tolerate the thin training): k=d4b10,v=d8b12 was measured so (docs/QUALITY.md), and one
  // shared book would also take the keys' per-sub-space books away.
  if (cfg.key.bits > 11) c.granularity = CodebookGranularity::shared;
  return c;
}

std::string default_calibration_text_path() {
  for (const char* p : {"/usr/share/doc/jargon-text/jargon.txt.gz", "/usr/share/doc/jargon-text/jargon.txt"}) {
    struct stat st {};
    if (::stat(p, &st) == 0) return p;
  }
  return "";
}

int first_use_calib_tokens(int head_dim) {
  return std::max(kFirstUseCalibTokens, kFirstUseTokensPerChannel * std::max(head_dim, 1));
}

std::string default_calibration_path(const std::string& model_path, const KVCacheConfig& cfg, int head_dim) {
  // Only what the file depends on: the key/value presets and the codebook granularity (not the
  // cache's residual or sink lengths), plus the recipe tag kCalibRecipe: files of an older recipe
  // are not reused.
  std::string preset = cfg.key == cfg.value ? "vecinfer_" + cfg.key.name()
                                            : "vecinfer_k_" + cfg.key.name() + "_v_" + cfg.value.name();
  if (cfg.granularity == CodebookGranularity::shared) preset += "_shared";
  // The tag: what calibrate_model picks for the first use's tokens (the Jargon File holds far more).
  const int tokens = first_use_calib_tokens(head_dim);
  const bool learned = default_key_transform(first_use_calib_config(cfg), tokens, head_dim) == KeyTransform::learned;
  preset += learned ? kCalibRecipe : kCalibRecipeHadamard;
  if (tokens > kFirstUseCalibTokens) preset += "-t" + std::to_string(tokens);
  const std::filesystem::path dir = std::filesystem::path(cache_dir()) / "calib";
  const std::string sha = sha256_file_memo(model_path, (dir / "digests").string()).substr(0, 16);
  return (dir / (sha + "-" + preset + ".vqcal")).string();
}

std::string resolve_calibration(const Model& model, const std::string& model_path, bool is_default_model,
                                const KVCacheConfig& cfg, const std::string& calib_flag,
                                const CalibProgress& progress, bool* made) {
  if (made) *made = false;
  if (cfg.method != KVMethod::vecinfer) return "";
  if (!calib_flag.empty()) return calib_flag;
  if (cfg.calibration || !cfg.calibration_file.empty()) return cfg.calibration_file;
  VQ_CHECK(is_default_model, "{}", calibration_howto(cfg));
  const std::string path = default_calibration_path(model_path, cfg, model.config().head_dim);
  if (std::filesystem::exists(path)) return path;
  const std::string text_path = default_calibration_text_path();
  VQ_CHECK(!text_path.empty(),
           "{} (the automatic first-use calibration of the default model needs the Jargon File: install the Debian "
           "package jargon-text, e.g. scripts/setup.sh)",
           calibration_howto(cfg));
  const KVCacheConfig c = first_use_calib_config(cfg);
  CalibTrainOptions opt;
  opt.key_mean_tokens = kKeyMeanTokens;
  opt.key_transform_auto = true;
  const Calibration cal = calibrate_model(model, read_text_file(text_path),
                                          first_use_calib_tokens(model.config().head_dim), c, opt,
                                          std::filesystem::path(model_path).filename().string(), progress);
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  save_calibration(path, cal);
  if (made) *made = true;
  return path;
}

KVSpec model_kv_spec(const Model& model, const std::string& model_path, bool is_known_model, KVCacheConfig cfg,
                     const std::string& calib_file, const CalibProgress& progress, bool* made) {
  const std::string path = resolve_calibration(model, model_path, is_known_model, cfg, calib_file, progress, made);
  if (!kv_method(cfg.method).needs_calibration() || path.empty()) return make_kv_spec(cfg, path);
  const bool automatic = calib_file.empty();
  auto calib = std::make_shared<const Calibration>(load_calibration(path));
  if (automatic)
    cfg.granularity = calib->granularity == Granularity::shared ? CodebookGranularity::shared
                                                                : CodebookGranularity::per_subspace;
  try {
    check_calibration_matches(*calib, cfg, model.kv_geometry(), model.config().n_layers);
    // A file the caller named must be this model's; the first-use one is found by the model's
    // SHA-256 already, whatever the file is called now.
    if (!automatic)
      check_calibration_model(*calib, std::filesystem::path(model_path).filename().string(), model.config().name);
  } catch (const Error& e) {
    VQ_FAIL("{}: {}", path, e.what());
  }
  cfg.calibration = std::move(calib);
  return make_kv_spec(cfg);
}

}  // namespace vq
