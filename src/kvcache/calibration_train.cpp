#include "kvcache/calibration_train.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <random>

#include "codec/key_mean.h"
#include "codec/key_transform.h"
#include "codec/learned_key_map.h"
#include "codec/product_quantizer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "kvcache/kv_method.h"

namespace vq {

Calibration train_calibration(const KVCacheConfig& cfg, int H, int D, const std::vector<const float*>& k,
                              const std::vector<const float*>& v, int64_t n, const CalibTrainOptions& opt,
                              const std::string& model) {
  VQ_CHECK(kv_method(cfg.method).needs_calibration(), "calibrate: kv cache {} has no codebooks to train (use vecinfer:...)",
           cfg.name());
  cfg.validate(D);
  VQ_CHECK(k.size() == v.size() && !k.empty(), "calibrate: {} key and {} value layers", k.size(), v.size());
  VQ_CHECK(opt.query_energy.empty() || opt.query_energy.size() == k.size(),
           "calibrate: query energy of {} layers for {} layers of keys", opt.query_energy.size(), k.size());
  VQ_CHECK(opt.segment_tokens >= 0 && opt.skip_tokens >= 0, "calibrate: segment_tokens {} and skip_tokens {} must be >= 0",
           opt.segment_tokens, opt.skip_tokens);
  // used: the token indices that train (every sequence's first skip_tokens left out)
  const int64_t seg = opt.segment_tokens > 0 ? opt.segment_tokens : n;
  std::vector<int64_t> used;
  for (int64_t t = 0; t < n; ++t)
    if (t % seg >= opt.skip_tokens) used.push_back(t);
  const int64_t nu = int64_t(used.size());
  VQ_CHECK(nu >= 1, "calibrate: {} tokens, all of them skipped as sinks (skip_tokens {})", n, opt.skip_tokens);
  const Granularity gran =
      cfg.granularity == CodebookGranularity::shared ? Granularity::shared : Granularity::per_subspace;
  if (gran == Granularity::per_subspace) {
    const int64_t need = int64_t(1) << std::max(cfg.key.bits, cfg.value.bits);
    VQ_CHECK(nu >= need, "calibrate: {} tokens ({} after leaving out sinks), but per-subspace codebooks of {} entries "
             "need at least {} (use more text or ,gran=shared)", n, nu, need, need);
  }
  const bool learned = opt.key_transform == KeyTransform::learned;
  if (learned) {
    VQ_CHECK(gran == Granularity::per_subspace,
             "calibrate: the learned key transform gives each sub-space its own distribution: it needs per-sub-space "
             "codebooks (drop ,gran=shared or use --key-transform hadamard)");
    VQ_CHECK(opt.query_moment.size() == k.size(), "calibrate: the learned key transform needs the queries' second "
             "moment of {} layers, got {}", k.size(), opt.query_moment.size());
    for (const auto& m : opt.query_moment)
      VQ_CHECK(m.size() == size_t(H) * D * D, "calibrate: a query second moment of {} values for [{}, {}, {}]",
               m.size(), H, D, D);
    VQ_CHECK(nu >= 2, "calibrate: the learned key transform needs at least 2 tokens");
  }
  Calibration c;
  c.key_transform = learned ? KeyTransform::learned : KeyTransform::hadamard;
  c.n_layers = int(k.size());
  c.n_kv_heads = H;
  c.head_dim = D;
  c.key = CodecParams{cfg.key.sub_dim, cfg.key.bits};
  c.value = CodecParams{cfg.value.sub_dim, cfg.value.bits};
  c.granularity = gran;
  c.kmeans_iters = opt.kmeans_iters;
  c.seed = opt.seed;
  c.n_calib_tokens = uint64_t(n);
  c.model = model.substr(0, 1024);
  c.layers.resize(k.size());
  for (size_t l = 0; l < k.size(); ++l) {
    std::vector<float> absmax(size_t(H) * D, 0.0f);  // absmax: [H, D] over the used tokens
    update_abs_max(k[l], n, H, D, absmax.data());    // first checks every key is finite (names the token)
    std::fill(absmax.begin(), absmax.end(), 0.0f);
    for (int64_t t : used) update_abs_max(k[l] + size_t(t) * H * D, 1, H, D, absmax.data());
    if (learned) {
      c.layers[l].smoothing.assign(size_t(H) * D, 1.0f);  // the map carries the scaling
      c.layers[l].key_map.resize(size_t(H) * D * D);
    } else if (opt.query_energy.empty()) {
      c.layers[l].smoothing = smoothing_from_abs_max(absmax);
    } else {
      // key_var: [H, D] variance of each key channel over the used tokens
      std::vector<double> mean(size_t(H) * D, 0.0), var(size_t(H) * D, 0.0);
      for (int64_t t : used)
        for (size_t i = 0; i < mean.size(); ++i) mean[i] += k[l][size_t(t) * H * D + i];
      for (auto& m : mean) m /= double(nu);
      for (int64_t t : used)
        for (size_t i = 0; i < var.size(); ++i) {
          const double d = k[l][size_t(t) * H * D + i] - mean[i];
          var[i] += d * d;
        }
      for (auto& x : var) x /= double(nu);
      c.layers[l].smoothing = smoothing_from_energy(var, opt.query_energy[l], H, D);
    }
    c.layers[l].key_codebooks.resize(c.key_codebook_floats());
    c.layers[l].value_codebooks.resize(c.value_codebook_floats());
  }
  const int jobs = c.n_layers * H * 2;
  std::atomic<int> done{0};
  std::mutex mu;
  parallel_for(size_t(jobs), [&](size_t b, size_t e, int) {
    std::vector<float> x(size_t(nu) * D);  // x: [nu, D] f32, one head's (transformed) keys or values
    for (size_t job = b; job < e; ++job) {
      const int l = int(job / (2 * H)), h = int(job / 2 % H);
      const bool is_key = job % 2 == 0;
      const float* src = is_key ? k[size_t(l)] : v[size_t(l)];
      for (int64_t i = 0; i < nu; ++i) {
        const int64_t t = used[size_t(i)];
        std::copy(src + (t * H + h) * D, src + (t * H + h + 1) * D, x.begin() + i * D);
      }
      if (is_key && learned) {
        // Each (layer, KV head) job writes its own map.
        const std::vector<double> q(opt.query_moment[size_t(l)].begin() + ptrdiff_t(size_t(h) * D * D),
                                    opt.query_moment[size_t(l)].begin() + ptrdiff_t(size_t(h + 1) * D * D));
        const std::vector<float> m = learned_key_map(covariance_of_rows(x.data(), nu, D), q, D, c.key.sub_dim);
        std::copy(m.begin(), m.end(), c.layers[size_t(l)].key_map.begin() + ptrdiff_t(size_t(h) * D * D));
        apply_key_map(m.data(), x.data(), nu, D, D);
      } else if (is_key) {
        transform_keys(x.data(), nu, 1, D, c.layers[size_t(l)].smoothing.data() + size_t(h) * D);
      }
      ProductQuantizer pq(D, is_key ? c.key : c.value, gran);
      KMeansParams kp;
      kp.max_iters = opt.kmeans_iters;
      kp.max_points_per_centroid = opt.max_points_per_centroid;
      kp.seed = opt.seed + uint64_t(job) * 1000003u;
      pq.train(x.data(), nu, kp);
      auto& dst = is_key ? c.layers[size_t(l)].key_codebooks : c.layers[size_t(l)].value_codebooks;
      const size_t per_head = dst.size() / size_t(H);
      std::copy(pq.codebooks().begin(), pq.codebooks().end(), dst.begin() + size_t(h) * per_head);
      const int d = ++done;
      if (opt.progress) {
        std::lock_guard<std::mutex> lk(mu);
        opt.progress(d, jobs);
      }
    }
  });
  c.validate();
  return c;
}

KeyTransform default_key_transform(const KVCacheConfig& cfg, int64_t train_tokens, int head_dim) {
  const bool enough = train_tokens >= int64_t(kLearnedKeyTokensPerChannel) * head_dim;
  return cfg.granularity != CodebookGranularity::shared && enough ? KeyTransform::learned : KeyTransform::hadamard;
}

Calibration random_calibration(const KVCacheConfig& cfg, int n_layers, int H, int D, uint64_t seed, float scale) {
  VQ_CHECK(kv_method(cfg.method).needs_calibration(), "random calibration: kv cache {} has no codebooks", cfg.name());
  cfg.validate(D);
  Calibration c;
  c.n_layers = n_layers;
  c.n_kv_heads = H;
  c.head_dim = D;
  c.key = CodecParams{cfg.key.sub_dim, cfg.key.bits};
  c.value = CodecParams{cfg.value.sub_dim, cfg.value.bits};
  c.granularity = cfg.granularity == CodebookGranularity::shared ? Granularity::shared : Granularity::per_subspace;
  c.seed = seed;
  c.model = "random";
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  c.layers.resize(size_t(n_layers));
  for (auto& L : c.layers) {
    L.smoothing.resize(size_t(H) * D);
    for (auto& x : L.smoothing) x = 1.0f + 0.1f * std::fabs(nd(rng));
    L.key_codebooks.resize(c.key_codebook_floats());
    L.value_codebooks.resize(c.value_codebook_floats());
    for (auto& x : L.key_codebooks) x = scale * nd(rng);
    for (auto& x : L.value_codebooks) x = scale * nd(rng);
  }
  c.validate();
  return c;
}

FittedKeyMean fit_rotated_key_mean(const std::vector<const float*>& k, const int64_t* pos, const std::vector<bool>& use,
                                   int64_t n_tokens, int n_kv_heads, int head_dim, int n_rot, bool neox,
                                   const std::vector<std::vector<double>>& freqs, int T) {
  const size_t L = k.size();
  VQ_CHECK(freqs.size() == L, "key mean: {} layers of keys, {} of rotary frequencies", L, freqs.size());
  VQ_CHECK(T >= 1 && T <= 4096, "key mean: segment of {} tokens must be in 1..4096", T);
  VQ_CHECK(n_rot >= 2 && n_rot <= head_dim && n_rot % 2 == 0, "key mean: n_rot {} does not fit head_dim {}", n_rot,
           head_dim);
  VQ_CHECK(use.size() == size_t(n_tokens), "key mean: {} use flags for {} tokens", use.size(), n_tokens);
  for (size_t l = 0; l < L; ++l)
    VQ_CHECK(freqs[l].size() == size_t(n_rot / 2), "key mean: layer {} has {} rotary frequencies, n_rot / 2 = {}", l,
             freqs[l].size(), n_rot / 2);
  FittedKeyMean fit;
  fit.means.resize(L);
  fit.centred.resize(L);
  const size_t row = size_t(n_kv_heads) * head_dim;
  parallel_for(L, [&](size_t l0, size_t l1, int) {
    for (size_t l = l0; l < l1; ++l) {
      fit.means[l] = pre_rope_key_mean(k[l], pos, use, n_tokens, n_kv_heads, head_dim, n_rot, neox, freqs[l], T);
      fit.centred[l].assign(k[l], k[l] + size_t(n_tokens) * row);
      const RotatedKeyMean km(fit.means[l], freqs[l], n_kv_heads, head_dim, n_rot, neox, T);
      for (int64_t t = 0; t < n_tokens; ++t)  // positions are per token (a span makes them random)
        km.subtract(pos[t], 1, fit.centred[l].data() + size_t(t) * row, 0, head_dim);
    }
  });
  return fit;
}

void attach_key_mean(Calibration& cal, FittedKeyMean&& fit, const std::vector<std::vector<double>>& freqs, int n_rot,
                     bool neox, int T) {
  VQ_CHECK(fit.means.size() == cal.layers.size() && freqs.size() == cal.layers.size(),
           "key mean: {} fitted layers for a calibration of {}", fit.means.size(), cal.layers.size());
  cal.key_mean_tokens = T;
  cal.rope_neox = neox;
  cal.n_rot = n_rot;
  for (size_t l = 0; l < cal.layers.size(); ++l) {
    cal.layers[l].key_mean = std::move(fit.means[l]);
    cal.layers[l].rope_freqs = freqs[l];
  }
  cal.validate();
}

Calibration train_calibration_with_key_mean(const KVCacheConfig& cfg, int n_kv_heads, int head_dim,
                                            std::vector<const float*> k, const std::vector<const float*>& v,
                                            int64_t n_tokens, const CalibTrainOptions& opt, const std::string& model,
                                            const KeyMeanFitSpec& km) {
  if (km.T <= 0) return train_calibration(cfg, n_kv_heads, head_dim, k, v, n_tokens, opt, model);
  VQ_CHECK(km.pos && km.use, "key mean: no positions or use flags for the {} tokens", n_tokens);
  FittedKeyMean fit =
      fit_rotated_key_mean(k, km.pos, *km.use, n_tokens, n_kv_heads, head_dim, km.n_rot, km.neox, km.freqs, km.T);
  for (size_t l = 0; l < k.size(); ++l) k[l] = fit.centred[l].data();
  Calibration cal = train_calibration(cfg, n_kv_heads, head_dim, k, v, n_tokens, opt, model);
  attach_key_mean(cal, std::move(fit), km.freqs, km.n_rot, km.neox, km.T);
  return cal;
}

void add_random_key_mean(Calibration& c, const std::vector<double>& freqs, int n_rot, bool neox, int T, uint64_t seed,
                         float scale) {
  VQ_CHECK(n_rot >= 2 && n_rot <= c.head_dim && n_rot % 2 == 0 && freqs.size() == size_t(n_rot / 2) && T >= 1,
           "random key mean: n_rot {} / {} frequencies / segment {} do not fit head_dim {}", n_rot, freqs.size(), T,
           c.head_dim);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  c.key_mean_tokens = T;
  c.rope_neox = neox;
  c.n_rot = n_rot;
  for (auto& L : c.layers) {
    L.rope_freqs = freqs;
    L.key_mean.assign(size_t(c.n_kv_heads) * c.head_dim, 0.0f);
    for (int i = 0; i < n_rot / 2; ++i) {
      if (freqs[size_t(i)] * T > kKeyMeanMaxTurn) continue;
      int a, b;
      rope_pair(i, n_rot, neox, a, b);
      for (int h = 0; h < c.n_kv_heads; ++h) {
        L.key_mean[size_t(h) * c.head_dim + a] = nd(rng);
        L.key_mean[size_t(h) * c.head_dim + b] = nd(rng);
      }
    }
  }
  c.validate();
}

void add_random_key_map(Calibration& c, uint64_t seed, float spread) {
  VQ_CHECK(c.key_books() > 1, "random key map: the learned key transform needs per-sub-space key books");
  const int H = c.n_kv_heads, D = c.head_dim;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  c.key_transform = KeyTransform::learned;
  for (auto& L : c.layers) {
    L.key_map.assign(size_t(H) * D * D, 0.0f);
    for (int h = 0; h < H; ++h)
      for (int e = 0; e < D; ++e) {
        const float s = std::exp(0.3f * nd(rng));
        float* row = L.key_map.data() + (size_t(h) * D + e) * D;
        for (int j = 0; j < D; ++j) row[j] = s * ((e == j ? 1.0f : 0.0f) + spread * nd(rng) / std::sqrt(float(D)));
      }
  }
  c.validate();
}

}  // namespace vq
