#include "kvcache/calibration_train.h"

#include <atomic>
#include <mutex>

#include "codec/key_transform.h"
#include "codec/product_quantizer.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace vq {

Calibration train_calibration(const KVCacheConfig& cfg, int H, int D, const std::vector<const float*>& k,
                              const std::vector<const float*>& v, int64_t n, const CalibTrainOptions& opt,
                              const std::string& model) {
  VQ_CHECK(cfg.method == KVMethod::vecinfer, "calibrate: kv cache {} has no codebooks to train (use vecinfer:...)",
           cfg.name());
  cfg.validate(D);
  VQ_CHECK(k.size() == v.size() && !k.empty(), "calibrate: {} key and {} value layers", k.size(), v.size());
  const Granularity gran =
      cfg.granularity == CodebookGranularity::shared ? Granularity::shared : Granularity::per_subspace;
  if (gran == Granularity::per_subspace) {
    const int64_t need = int64_t(1) << std::max(cfg.key.bits, cfg.value.bits);
    VQ_CHECK(n >= need, "calibrate: {} tokens, but per-subspace codebooks of {} entries need at least {} (use more "
             "text or ,gran=shared)", n, need, need);
  }
  Calibration c;
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
    c.layers[l].smoothing = smoothing_factors(k[l], n, H, D);
    c.layers[l].key_codebooks.resize(c.key_codebook_floats());
    c.layers[l].value_codebooks.resize(c.value_codebook_floats());
  }
  const int jobs = c.n_layers * H * 2;
  std::atomic<int> done{0};
  std::mutex mu;
  parallel_for(size_t(jobs), [&](size_t b, size_t e, int) {
    std::vector<float> x(size_t(n) * D);  // x: [n, D] f32, one head's (transformed) keys or values
    for (size_t job = b; job < e; ++job) {
      const int l = int(job / (2 * H)), h = int(job / 2 % H);
      const bool is_key = job % 2 == 0;
      const float* src = is_key ? k[size_t(l)] : v[size_t(l)];
      for (int64_t t = 0; t < n; ++t)
        std::copy(src + (t * H + h) * D, src + (t * H + h + 1) * D, x.begin() + t * D);
      if (is_key) transform_keys(x.data(), n, 1, D, c.layers[size_t(l)].smoothing.data() + size_t(h) * D);
      ProductQuantizer pq(D, is_key ? c.key : c.value, gran);
      KMeansParams kp;
      kp.max_iters = opt.kmeans_iters;
      kp.max_points_per_centroid = opt.max_points_per_centroid;
      kp.seed = opt.seed + uint64_t(job) * 1000003u;
      pq.train(x.data(), n, kp);
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

}  // namespace vq
