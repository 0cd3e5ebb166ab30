// The Qwen2 family's quality gate on recorded real activations (issue 18): Qwen2.5-Coder-0.5B-Instruct
// (scripts/setup.sh fetches it; skipped when absent) runs over the Jargon File (calibration) and
// python3-doc's classes tutorial (held out) with an fp32 cache that records every layer's post-RoPE
// queries, keys and values. A vecinfer:d4b8 cache calibrated on the first recording then attends with
// the held-out queries of the last 32 tokens over 512 held-out tokens (384 coded, 128 in the fp16
// window); its output is compared with exact attention. Qwen's k_proj biases are what broke 2-bit
// keys (docs/QUALITY.md): with VecInfer's key-only smoothing layer 0's error is two orders of
// magnitude above the other layers'; query-aware smoothing must keep it low, and the learned key
// transform (what calibration now does for caches on the CPU) must stay well below both.
// The whole-model check (perplexity / KL on the 1.5B) is outside CI: docs/BENCHMARKS.md "Issue 18".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "codec/learned_key_map.h"
#include "core/thread_pool.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "model/known_models.h"
#include "model/session.h"
#include "kvcache/model_fixture.h"
#include "ops/ref/attention.h"

using namespace vq;

namespace {

struct Layer {
  std::vector<float> keys, values, queries;  // [n, H, D], [n, H, D], [n, Hq, D] f32
};
struct Recording {
  KVGeometry geo;
  int n = 0;
  std::vector<Layer> layers;
};

Recording record(const Model& m, const std::vector<int32_t>& tokens) {
  Recording r;
  r.geo = m.kv_geometry();
  r.n = int(tokens.size());
  r.layers.resize(size_t(m.config().n_layers));
  Session s(m, make_kv_spec(parse_kv_cache_spec("fp32")), int(tokens.size()), 128);
  const KVGeometry g = r.geo;
  s.forward_pass().set_kv_observer([&r, g](int layer, int, const float* q, const float* k, const float* v, int n) {
    Layer& L = r.layers[size_t(layer)];
    const size_t kv = size_t(n) * g.n_kv_heads * g.head_dim, qn = size_t(n) * g.n_heads * g.head_dim;
    L.keys.insert(L.keys.end(), k, k + kv);
    L.values.insert(L.values.end(), v, v + kv);
    L.queries.insert(L.queries.end(), q, q + qn);
  });
  s.forward(tokens.data(), int(tokens.size()), nullptr);
  return r;
}

// query_energy[l]: [H, D] mean square of each post-RoPE query channel over tokens and group heads.
std::vector<std::vector<double>> query_energy(const Recording& rec) {
  const KVGeometry& g = rec.geo;
  const int group = g.n_heads / g.n_kv_heads;
  std::vector<std::vector<double>> e(rec.layers.size(), std::vector<double>(size_t(g.n_kv_heads) * g.head_dim, 0.0));
  for (size_t l = 0; l < rec.layers.size(); ++l)
    for (int t = 0; t < rec.n; ++t)
      for (int hq = 0; hq < g.n_heads; ++hq)
        for (int c = 0; c < g.head_dim; ++c) {
          const double x = rec.layers[l].queries[(size_t(t) * g.n_heads + hq) * g.head_dim + c];
          e[l][size_t(hq / group) * g.head_dim + c] += x * x / (double(rec.n) * group);
        }
  return e;
}

// query_moment[l]: [H, D, D] second moment of the post-RoPE queries of each KV head's group.
std::vector<std::vector<double>> query_moment(const Recording& rec) {
  const KVGeometry& g = rec.geo;
  const int group = g.n_heads / g.n_kv_heads, D = g.head_dim;
  std::vector<std::vector<double>> m(rec.layers.size(), std::vector<double>(size_t(g.n_kv_heads) * D * D, 0.0));
  for (size_t l = 0; l < rec.layers.size(); ++l) {
    for (int t = 0; t < rec.n; ++t)
      for (int h = 0; h < g.n_kv_heads; ++h)
        add_second_moment(rec.layers[l].queries.data() + (size_t(t) * g.n_heads + size_t(h) * group) * D, group, D, D,
                          m[l].data() + size_t(h) * D * D);
    for (auto& x : m[l]) x /= double(rec.n) * group;
  }
  return m;
}

enum class Keys { key_max, query_aware, learned };

// Per-layer NMSE of the d4b8 cache's attention output vs exact attention.
std::vector<double> layer_nmse(const Recording& cal, const Recording& ev, Keys keys) {
  KVCacheConfig cfg = parse_kv_cache_spec("vecinfer:d4b8");
  cfg.use_gpu_kernels = GpuKernels::forbid;
  std::vector<const float*> k, v;
  for (const Layer& l : cal.layers) {
    k.push_back(l.keys.data());
    v.push_back(l.values.data());
  }
  CalibTrainOptions opt;
  opt.kmeans_iters = 6;
  if (keys == Keys::query_aware) opt.query_energy = query_energy(cal);
  if (keys == Keys::learned) {
    opt.key_transform = KeyTransform::learned;
    opt.query_moment = query_moment(cal);
  }
  cfg.calibration = std::make_shared<const Calibration>(
      train_calibration(cfg, cal.geo.n_kv_heads, cal.geo.head_dim, k, v, cal.n, opt, "qwen gate"));
  const KVCacheFactory fac = make_kv_cache_factory(cfg);
  const KVGeometry& g = ev.geo;
  const int n = ev.n, HQ = g.n_heads, D = g.head_dim, nq = 32;
  const float scale = 1.0f / std::sqrt(float(D));
  std::vector<double> out_err;
  for (size_t l = 0; l < ev.layers.size(); ++l) {
    const Layer& L = ev.layers[l];
    auto cache = fac(int(l), g);
    const size_t row = size_t(g.n_kv_heads) * D;
    for (int t = 0; t < n; t += 64) cache->append(L.keys.data() + size_t(t) * row, L.values.data() + size_t(t) * row,
                                                  std::min(64, n - t));
    const float* q = L.queries.data() + size_t(n - nq) * HQ * D;
    std::vector<float> out(size_t(nq) * HQ * D), ref_out(out.size());
    cache->attend(q, nq, scale, out.data());
    ref::attention(q, nq, L.keys.data(), L.values.data(), n, HQ, g.n_kv_heads, D, scale, ref_out.data());
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      num += double(out[i] - ref_out[i]) * double(out[i] - ref_out[i]);
      den += double(ref_out[i]) * double(ref_out[i]);
    }
    out_err.push_back(num / den);
  }
  return out_err;
}

}  // namespace

// Bounds ~2.5x the values measured when they were set (2026-12-03, 2 threads, the line the test
// prints): layer 0 NMSE query-aware 0.0395 (key-max 0.453), mean over the 24 layers 0.0130 (key-max
// 0.0411), worst layer 0.0739. A regression of the smoothing rule, the recorder's query energy or
// the codecs fails here; the key-max number shows what the gate guards against.
TEST(QwenGate, TwoBitKeysHoldOnTheHardestLayers) {
  const KnownModel* km = find_known_model("qwen2.5-coder-0.5b");
  if (!km || !model_present(*km)) GTEST_SKIP() << "Qwen2.5-Coder-0.5B is not in the cache (scripts/setup.sh fetches it)";
  const std::string et = model_test::eval_text(), ct = model_test::calib_text();
  if (et.size() < 4000 || ct.size() < 4000) GTEST_SKIP() << "python3-doc or jargon-text is not installed";
  set_num_threads(2);
  const auto model = Model::load(model_location(*km));
  const Recording cal = record(*model, model_test::first_tokens(*model, ct, 640));
  const Recording ev = record(*model, model_test::first_tokens(*model, et, 512));
  const std::vector<double> qa = layer_nmse(cal, ev, Keys::query_aware), km_err = layer_nmse(cal, ev, Keys::key_max),
                            lk = layer_nmse(cal, ev, Keys::learned);
  double qa_mean = 0, km_mean = 0, qa_worst = 0, lk_mean = 0, lk_worst = 0;
  for (size_t l = 0; l < qa.size(); ++l) {
    qa_mean += qa[l] / double(qa.size());
    km_mean += km_err[l] / double(qa.size());
    lk_mean += lk[l] / double(qa.size());
    qa_worst = std::max(qa_worst, qa[l]);
    lk_worst = std::max(lk_worst, lk[l]);
  }
  std::printf("  layer 0 NMSE: query-aware %.4g, key-max %.4g; mean over %zu layers %.4g vs %.4g; worst %.4g\n", qa[0],
              km_err[0], qa.size(), qa_mean, km_mean, qa_worst);
  std::printf("  learned key transform: layer 0 %.4g, mean %.4g, worst %.4g\n", lk[0], lk_mean, lk_worst);
  EXPECT_LT(qa[0], 0.1) << "layer 0 with query-aware smoothing";
  EXPECT_LT(qa_mean, 0.033) << "mean over the layers with query-aware smoothing";
  EXPECT_LT(qa_worst, 0.185) << "worst layer with query-aware smoothing";
  EXPECT_LT(qa[0] * 5, km_err[0]) << "query-aware smoothing must keep its margin on layer 0";
  // Measured 2026-12-05: layer 0 0.0073, mean 0.0092 (0.74x query-aware's 0.0124), worst 0.0563.
  EXPECT_LT(lk[0], 0.02) << "layer 0 with the learned key transform";
  EXPECT_LT(lk_mean, 0.85 * qa_mean) << "the learned key transform must keep its margin over query-aware smoothing";
}
