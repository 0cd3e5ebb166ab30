#pragma once
// A tiny random-weight llama model (head_dim 64, so every KV method applies) and the KV specs of
// every method for it; VecInfer codebooks are trained on the model's own keys/values.
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "model/session.h"
#include "model/test_forward_tiny.h"

namespace vq::engine_test {

inline const std::vector<std::string>& all_methods() {
  static const std::vector<std::string> m = {"fp16",          "fp32",         "q8_0",
                                             "q4_0",          "q4_0h",        "kivi2,r=32",   "kivi4,r=32",
                                             "vecinfer:d4b8,r=32", "vecinfer:d8b8,r=32,sink=0"};
  return m;
}

inline std::vector<int32_t> random_tokens(int n, int n_vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = int32_t(rng() % uint64_t(n_vocab));
  return t;
}

struct Tiny {
  std::unique_ptr<Model> model;
  std::map<std::string, std::shared_ptr<const Calibration>> calibs;

  static Tiny& get() {
    static Tiny t = [] {
      Tiny r;
      test::TinySpec s;
      s.n_layers = 2, s.n_embd = 128, s.n_heads = 4, s.n_kv_heads = 2, s.head_dim = 64, s.n_ff = 160, s.n_vocab = 97;
      s.write_key_length = true;
      s.seed = 11;
      r.model = Model::load(test::write_tiny_model(s, test::tiny_path("engine")));
      return r;
    }();
    return t;
  }

  KVSpec spec(const std::string& name) {
    KVCacheConfig cfg = parse_kv_cache_spec(name);
    if (cfg.method != KVMethod::vecinfer) return make_kv_spec(cfg);
    const std::string key = cfg.key.name() + cfg.value.name();
    auto& c = calibs[key];
    if (!c) {
      // The model's own keys/values over random tokens (fp16 cache), 240 tokens.
      const ModelConfig& mc = model->config();
      std::vector<std::vector<float>> k(size_t(mc.n_layers)), v(size_t(mc.n_layers));
      Session rec(*model, make_kv_spec(parse_kv_cache_spec("fp16")), 240);
      rec.forward_pass().set_kv_observer([&](int l, int, const float*, const float* kk, const float* vv, int n) {
        const size_t e = size_t(n) * mc.n_kv_heads * mc.head_dim;
        k[size_t(l)].insert(k[size_t(l)].end(), kk, kk + e);
        v[size_t(l)].insert(v[size_t(l)].end(), vv, vv + e);
      });
      const auto toks = random_tokens(240, mc.n_vocab, 99);
      rec.forward(toks.data(), 240, nullptr);
      std::vector<const float*> kp, vp;
      for (int l = 0; l < mc.n_layers; ++l) kp.push_back(k[size_t(l)].data()), vp.push_back(v[size_t(l)].data());
      CalibTrainOptions opt;
      opt.kmeans_iters = 4;
      opt.max_points_per_centroid = 2;
      KVCacheConfig shared = cfg;
      shared.granularity = CodebookGranularity::shared;  // 240 tokens are too few for per-sub-space books
      c = std::make_shared<Calibration>(train_calibration(shared, mc.n_kv_heads, mc.head_dim, kp, vp, 240, opt, "tiny"));
    }
    cfg.granularity = CodebookGranularity::shared;
    cfg.calibration = c;
    return make_kv_spec(cfg);
  }
};

}  // namespace vq::engine_test
