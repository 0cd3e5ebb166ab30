// The public C++ API (include/veloxquant) used as a consumer would: only <veloxquant/...> headers.
#include <gtest/gtest.h>

#include <veloxquant/veloxquant.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

namespace vx = veloxquant;

namespace {

std::vector<float> random_rows(int n, int dim, unsigned seed) {
  std::vector<float> x(size_t(n) * dim);  // [n, dim]
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  for (float& v : x) v = normal(rng);
  return x;
}

bool have_default_model() { return std::filesystem::exists(vx::Model::default_path()); }

}  // namespace

TEST(ApiCodec, CopiesAreIndependentAndEncodeTheSame) {
  const int dim = 16, n = 512;
  const std::vector<float> x = random_rows(n, dim, 1);
  vx::ProductQuantizer a(dim, {4, 6});
  a.train(x.data(), n, {10, 3, 64});
  vx::ProductQuantizer b = a;  // deep copy
  std::vector<uint8_t> ca(size_t(n) * a.code_size()), cb(ca.size());
  a.encode(x.data(), n, ca.data());
  b.encode(x.data(), n, cb.data());
  EXPECT_EQ(ca, cb);
  b.train(random_rows(n, dim, 2).data(), n, {10, 4, 64});  // retraining the copy leaves a alone
  std::vector<uint8_t> again(ca.size());
  a.encode(x.data(), n, again.data());
  EXPECT_EQ(ca, again);
  EXPECT_NE(a.codebooks(), b.codebooks());
  // Trained from codebooks: decodes the same as the original.
  vx::ProductQuantizer c(dim, a.preset(), a.granularity(), a.codebooks().data());
  std::vector<float> ya(x.size()), yc(x.size());
  a.decode(ca.data(), n, ya.data());
  c.decode(ca.data(), n, yc.data());
  EXPECT_EQ(ya, yc);
  std::vector<uint16_t> bad(size_t(a.n_sub()), 64);  // 2^6: out of range
  EXPECT_THROW(a.decode_codes(bad.data(), 1, ya.data()), vx::Error);
}

// The library's method list and spec help come from its KV method registry: every listed preset
// parses through the one parser, and the help names each method.
TEST(ApiSpec, MethodListAndHelpComeFromTheRegistry) {
  const std::vector<std::string> methods = vx::kv_cache_methods();
  const std::string help = vx::kv_cache_spec_help();
  for (const char* m : {"fp16", "q8_0", "q4_0h", "q5_0", "kivi2", "vecinfer:d4b8"})
    EXPECT_NE(std::find(methods.begin(), methods.end(), m), methods.end()) << m;
  for (const std::string& m : methods) {
    EXPECT_EQ(vx::parse_kv_cache_config(m).name(), m) << "a listed preset is its own canonical name";
    EXPECT_NE(help.find(m.substr(0, m.find(':'))), std::string::npos) << m;
  }
  EXPECT_THROW(vx::parse_kv_cache_config("vecinfer:"), vx::Error);
  EXPECT_THROW(vx::parse_kv_cache_config("vecinfer:k=d4b8"), vx::Error);
  EXPECT_EQ(vx::parse_kv_cache_config("vecinfer").name(), "vecinfer:d4b8");
}

TEST(ApiSpec, ParsesAndRefusesBeforeAnyWork) {
  const vx::KVSpec s = vx::KVSpec::parse("KIVI4");
  EXPECT_EQ(s.name(), "kivi4");
  EXPECT_EQ(s.config().method, vx::KVMethod::kivi);
  EXPECT_FALSE(s.has_calibration());
  EXPECT_THROW(s.calibration(), vx::Error);
  EXPECT_THROW(vx::KVSpec::parse("vecinfer:d4b8"), vx::Error);  // no calibration
  EXPECT_THROW(vx::KVSpec::parse("vecinfer:d4b8", "/nonexistent/x.vqcal"), vx::Error);
  EXPECT_THROW(vx::parse_kv_cache_config("q3_0"), vx::Error);
  EXPECT_EQ(vx::parse_kv_cache_config("vecinfer:d8b12").key.bits, 12);
}

TEST(ApiSpec, StandaloneCacheAttendsLikeExactAttention) {
  // One fp32 layer of 2 query heads over 1 KV head, attention by hand for the last query.
  const vx::KVGeometry geo{2, 1, 8};
  const std::unique_ptr<vx::KVCache> cache = vx::KVSpec::parse("fp32").make_cache(0, geo);
  const int n = 5;
  const std::vector<float> k = random_rows(n, 8, 3), v = random_rows(n, 8, 4), q = random_rows(1, 16, 5);
  cache->append(k.data(), v.data(), n);
  ASSERT_EQ(cache->size(), n);
  std::vector<float> out(16);  // [1, n_heads, head_dim]: the last position's query sees every token
  cache->attend(q.data(), 1, 0.5f, out.data());
  for (int h = 0; h < 2; ++h) {
    double w[5], sum = 0;
    for (int t = 0; t < n; ++t) {
      double d = 0;
      for (int c = 0; c < 8; ++c) d += double(q[h * 8 + c]) * k[t * 8 + c];
      w[t] = std::exp(0.5 * d);
      sum += w[t];
    }
    for (int c = 0; c < 8; ++c) {
      double o = 0;
      for (int t = 0; t < n; ++t) o += w[t] / sum * v[t * 8 + c];
      EXPECT_NEAR(out[size_t(h) * 8 + c], o, 1e-4) << "head " << h << " channel " << c;
    }
  }
}

TEST(ApiModel, EngineCallbacksSessionAndSampler) {
  if (!have_default_model()) GTEST_SKIP() << "default model absent (scripts/setup.sh fetches it)";
  const vx::Model model = vx::Model::load_default();
  const vx::KVSpec spec = vx::KVSpec::for_model(model, "q8_0");
  const std::vector<int32_t> prompt = model.tokenizer().encode("The sun rises in the");

  // Engine: two requests, the second cancelled from its own token callback after 2 tokens.
  vx::Engine engine(model, spec, {size_t(64) << 20, 2, 64, 256});
  std::vector<int32_t> got[2];
  vx::SequenceResult results[2];
  for (int i = 0; i < 2; ++i) {
    vx::Request r;
    r.prompt = prompt;
    r.sampling = vx::SamplingParams::greedy();
    r.max_new_tokens = 6;
    r.ignore_eos = true;
    r.on_token = [&, i](int64_t, int32_t t) {
      got[i].push_back(t);
      return i == 0 || got[i].size() < 2;
    };
    r.on_finish = [&, i](const vx::SequenceResult& s) { results[i] = s; };
    engine.submit(std::move(r));
  }
  engine.run();
  EXPECT_TRUE(engine.idle());
  EXPECT_EQ(results[0].finish, vx::FinishReason::length);
  EXPECT_EQ(results[1].finish, vx::FinishReason::stop);
  ASSERT_EQ(got[0].size(), 6u);
  ASSERT_EQ(got[1].size(), 2u);
  EXPECT_EQ(got[1][0], got[0][0]);  // same greedy start
  EXPECT_EQ(engine.memory().used_bytes, 0u);  // finished sequences gave their blocks back
  EXPECT_GT(engine.memory().peak_bytes, 0u);
  EXPECT_NEAR(results[0].memory.bits_per_element(), 8.5, 1e-9);

  // Session + Sampler, by hand: the same greedy tokens.
  vx::Session session(model, spec, {64});
  std::vector<float> logits(size_t(model.info().n_vocab));
  session.forward(prompt, logits.data());
  vx::Sampler sampler(vx::SamplingParams::greedy());
  for (int i = 0; i < 6; ++i) {
    const int32_t t = sampler.sample(logits.data(), model.info().n_vocab);
    EXPECT_EQ(t, got[0][size_t(i)]) << "token " << i;
    sampler.accept(t);
    session.forward({&t, 1}, logits.data());
  }
  EXPECT_EQ(session.pos(), int64_t(prompt.size()) + 6);
  // Out of budget: the library's KVPoolExhausted (hidden inside libveloxquant.so) is caught here
  // as the public vx::Error, and the session is unchanged.
  vx::Session tiny(model, spec, {64, 512, 4096});
  EXPECT_THROW(tiny.forward(prompt, logits.data()), vx::Error);
  EXPECT_EQ(tiny.pos(), 0);
  EXPECT_THROW(vx::Engine(model, spec, {size_t(-1), 0}), vx::Error);
  EXPECT_THROW(engine.submit(vx::Request{}), vx::Error);  // empty prompt
}

// The public Engine's prefix cache and batch-invariant mode: a second request sharing a long prompt
// prefix takes it from the cache (stats say how many tokens) and gets the tokens a cache-less
// engine gives.
TEST(ApiModel, EnginePrefixCacheAndDeterministicMode) {
  if (!have_default_model()) GTEST_SKIP() << "default model absent (scripts/setup.sh fetches it)";
  const vx::Model model = vx::Model::load_default();
  const vx::KVSpec spec = vx::KVSpec::for_model(model, "fp16");
  const std::vector<int32_t> shared = model.tokenizer().encode(
      "A long shared system prompt: the assistant answers briefly, in plain words, and never makes up facts it "
      "does not know. It names its sources when it has them and says so when it has none. Question:");
  auto run = [&](vx::Engine& e, const std::string& q) {
    std::vector<int32_t> p = shared, more = model.tokenizer().encode(q, false);
    p.insert(p.end(), more.begin(), more.end());
    std::vector<int32_t> got;
    vx::Request r;
    r.prompt = p;
    r.sampling = vx::SamplingParams::greedy();
    r.max_new_tokens = 5;
    r.ignore_eos = true;
    r.on_token = [&](int64_t, int32_t t) {
      got.push_back(t);
      return true;
    };
    e.submit(std::move(r));
    e.run();
    return got;
  };
  vx::EngineOptions o{size_t(64) << 20, 2, 32, 256};
  o.deterministic = true;
  vx::Engine cold(model, spec, o);
  o.prefix_cache = true;
  vx::Engine warm(model, spec, o);
  EXPECT_EQ(run(warm, " what is the sun?"), run(cold, " what is the sun?"));
  EXPECT_EQ(warm.stats().prefix_hit_tokens, 0);
  EXPECT_EQ(run(warm, " what is the moon?"), run(cold, " what is the moon?"));
  EXPECT_GE(warm.stats().prefix_hit_tokens, 32) << "the shared prompt's full blocks come from the cache";
  EXPECT_EQ(warm.stats().prefix_hits, 1);
  EXPECT_EQ(cold.stats().prefix_hits, 0);
}

// The device through the public API (the CLI's --device): names, auto, and cuda refused with the
// reason where there is no usable device.
TEST(ApiRuntime, DeviceChoice) {
  EXPECT_EQ(vx::parse_device("cpu"), vx::Device::cpu);
  EXPECT_STREQ(vx::device_name(vx::Device::cpu), "cpu");
  EXPECT_STREQ(vx::device_name(vx::Device::cuda), "cuda");
  try {
    vx::parse_device("gpu");
    ADD_FAILURE() << "device 'gpu' accepted";
  } catch (const vx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("must be cpu, cuda or auto"), std::string::npos) << e.what();
  }
  EXPECT_EQ(vx::parse_device("auto") == vx::Device::cuda, vx::cuda_available());
  if (vx::cuda_available()) {
    EXPECT_EQ(vx::parse_device("cuda"), vx::Device::cuda);
    EXPECT_EQ(vx::cuda_unavailable_reason(), "");
    EXPECT_NE(vx::cuda_device_description(), "");
  } else {
    const std::string why = vx::cuda_unavailable_reason();
    EXPECT_NE(why, "");
    EXPECT_EQ(vx::cuda_device_description(), "");
    try {
      vx::parse_device("cuda");
      ADD_FAILURE() << "cuda accepted without a usable device";
    } catch (const vx::Error& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

TEST(ApiSpec, KnowsWhichMethodsNeedACalibration) {
  EXPECT_TRUE(vx::kv_cache_needs_calibration(vx::parse_kv_cache_config("vecinfer:d4b8")));
  for (const char* m : {"fp16", "q8_0", "kivi2"}) EXPECT_FALSE(vx::kv_cache_needs_calibration(vx::parse_kv_cache_config(m))) << m;
}

TEST(ApiFiles, OutputCheckedBeforeAnyWork) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "vq_api_check_output";
  std::filesystem::create_directories(dir);
  EXPECT_NO_THROW(vx::check_output_path((dir / "c.vqcal").string(), "out"));
  try {
    vx::check_output_path((dir / "missing" / "c.vqcal").string(), "-o");
    ADD_FAILURE() << "a missing folder accepted";
  } catch (const vx::Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("-o '", 0), 0u) << e.what();
  }
  EXPECT_THROW(vx::check_output_path(dir.string(), "out"), vx::Error);  // a directory
  std::filesystem::remove_all(dir);
}

// What the CLI's perplexity and calibrate take from the API: a known model's file loaded by path
// counts as a known model (first-use calibration), every weight is checked finite, a session or
// perplexity on an absent device is refused, and the one spec path refuses a calibration file that
// is not there, naming it.
TEST(ApiModel, DeviceWeightsAndTheOneSpecPath) {
  if (!have_default_model()) GTEST_SKIP() << "default model absent (scripts/setup.sh fetches it)";
  const vx::Model model = vx::Model::load(vx::Model::default_path());
  EXPECT_TRUE(model.is_default());
  EXPECT_NO_THROW(model.check_weights_finite());
  const vx::KVSpec spec = vx::KVSpec::for_model_config(model, vx::parse_kv_cache_config("q8_0"));
  EXPECT_EQ(spec.name(), "q8_0");
  try {
    vx::KVSpec::for_model(model, "vecinfer:d4b8", "/nonexistent/calib.vqcal");
    ADD_FAILURE() << "a missing calibration file accepted";
  } catch (const vx::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/calib.vqcal"), std::string::npos) << e.what();
  }
  if (!vx::cuda_available()) {
    vx::SessionOptions so;
    so.n_ctx = 64;
    so.device = vx::Device::cuda;
    EXPECT_THROW(vx::Session(model, spec, so), vx::Error);
    vx::PerplexityOptions po;
    po.device = vx::Device::cuda;
    const std::vector<int32_t> ids = model.tokenizer().encode("a b c d");
    EXPECT_THROW(vx::perplexity(model, ids, spec, nullptr, po), vx::Error);
  }
}

// The eval suite through the public API (what `veloxquant eval` runs): quality rows for each
// method and context, the reference agreeing with itself exactly, and the JSON document.
TEST(ApiEval, QualityRowsAndTheReport) {
  if (!have_default_model()) GTEST_SKIP() << "default model absent (scripts/setup.sh fetches it)";
  const vx::Model model = vx::Model::load_default();
  std::string text;
  for (int i = 0; i < 200; ++i) text += "The quick brown fox jumps over the lazy dog number " + std::to_string(i) + ". ";
  vx::EvalOptions opt;
  opt.contexts = {64};
  const std::vector<vx::EvalText> texts{{"fox", "fox.txt", text}};
  const vx::KVSpec fp16 = vx::KVSpec::parse("fp16");
  const vx::EvalReport r =
      vx::run_eval(model, {fp16, vx::KVSpec::for_model(model, "q8_0")}, fp16, texts, "", opt);
  ASSERT_EQ(r.quality.size(), 2u);
  EXPECT_TRUE(r.retrieval.empty());
  EXPECT_EQ(r.reference, "fp16");
  EXPECT_EQ(r.quality[0].kv_cache, "fp16");
  EXPECT_EQ(r.quality[0].kl, 0.0);
  EXPECT_EQ(r.quality[0].top1, 1.0);
  EXPECT_EQ(r.quality[1].kv_cache, "q8_0");
  EXPECT_EQ(r.quality[1].tokens_scored, 63);
  EXPECT_GT(r.quality[1].perplexity, 1.0);
  EXPECT_NEAR(r.quality[1].bits_per_element, 8.5, 1e-9);
  const std::string json = vx::eval_report_json(r, opt, texts, R"({"command": "api_test"})", false);
  EXPECT_NE(json.find("veloxquant-eval-1"), std::string::npos);
  EXPECT_NE(json.find("\"api_test\""), std::string::npos);
  EXPECT_THROW(vx::eval_report_json(r, opt, texts, "[1, 2]", false), vx::Error);
  const std::vector<std::string> evaluated = vx::kv_cache_evaluated_methods();
  EXPECT_NE(std::find(evaluated.begin(), evaluated.end(), "q8_0"), evaluated.end());
}
