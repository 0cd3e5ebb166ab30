#include "codec/key_mean.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>

#include "codec/calibration_file.h"
#include "core/error.h"

namespace vq {

std::atomic<uint64_t> RotatedKeyMean::next_id_{0};

std::vector<float> pre_rope_key_mean(const float* k, const int64_t* pos, const std::vector<bool>& use, int64_t n,
                                     int n_heads, int head_dim, int n_rot, bool neox, const std::vector<double>& freqs,
                                     int T) {
  VQ_CHECK(n_rot >= 2 && n_rot <= head_dim && n_rot % 2 == 0 && freqs.size() == size_t(n_rot / 2) && T >= 1,
           "key mean: n_rot {} / {} frequencies / segment {} do not fit head_dim {}", n_rot, freqs.size(), T,
           head_dim);
  const int half = n_rot / 2;
  std::vector<double> sum(size_t(n_heads) * head_dim, 0.0);
  int64_t count = 0;
  for (int64_t t = 0; t < n; ++t) {
    if (!use.empty() && !use[size_t(t)]) continue;
    ++count;
    for (int i = 0; i < half; ++i) {
      if (freqs[size_t(i)] * T > kKeyMeanMaxTurn) continue;
      const double ang = -double(pos[t]) * freqs[size_t(i)], c = std::cos(ang), s = std::sin(ang);
      int a, b;
      rope_pair(i, n_rot, neox, a, b);
      for (int h = 0; h < n_heads; ++h) {
        const float* row = k + (size_t(t) * n_heads + size_t(h)) * head_dim;
        sum[size_t(h) * head_dim + a] += row[a] * c - row[b] * s;
        sum[size_t(h) * head_dim + b] += row[a] * s + row[b] * c;
      }
    }
  }
  std::vector<float> mu(sum.size(), 0.0f);
  if (count > 0)
    for (size_t i = 0; i < mu.size(); ++i) mu[i] = float(sum[i] / double(count));
  return mu;
}

RotatedKeyMean::RotatedKeyMean(const Calibration& c, int layer) {
  if (c.has_key_mean()) {
    const CalibrationLayer& L = c.layers[size_t(layer)];
    *this = RotatedKeyMean(L.key_mean, L.rope_freqs, c.n_kv_heads, c.head_dim, c.n_rot, c.rope_neox,
                           c.key_mean_tokens);
  }
}

RotatedKeyMean::RotatedKeyMean(std::vector<float> mu, const std::vector<double>& freqs, int n_kv_heads, int head_dim,
                               int n_rot, bool neox, int T)
    : T_(T), D_(head_dim), H_(n_kv_heads), id_(next_id_.fetch_add(1) + 1), mu_(std::move(mu)) {
  VQ_CHECK(T >= 1 && mu_.size() == size_t(n_kv_heads) * head_dim && freqs.size() == size_t(n_rot / 2),
           "key mean: segment {} / {} floats / {} frequencies do not fit {} heads x {} dims, n_rot {}", T, mu_.size(),
           freqs.size(), n_kv_heads, head_dim, n_rot);
  for (int i = 0; i < n_rot / 2; ++i) {
    int a, b;
    rope_pair(i, n_rot, neox, a, b);
    bool any = false;
    for (int h = 0; h < n_kv_heads; ++h)
      any = any || mu_[size_t(h) * D_ + a] != 0.0f || mu_[size_t(h) * D_ + b] != 0.0f;
    if (any) pairs_.push_back({a, b, freqs[size_t(i)]});
  }
}

void RotatedKeyMean::subtract(int64_t p0, int n, float* k, int64_t token_stride, int64_t head_stride) const {
  const size_t np = pairs_.size();
  thread_local std::vector<double> cs, sn;  // [pair] the current segment's cos, sin
  thread_local std::vector<float> off;      // [head][pair][2] R(p_b) mu on the kept pairs
  cs.resize(np);
  sn.resize(np);
  off.resize(size_t(H_) * np * 2);
  int64_t seg = -1;
  for (int t = 0; t < n; ++t) {
    const int64_t s = segment_start(p0 + t);
    if (s != seg) {
      seg = s;
      for (size_t j = 0; j < np; ++j) {
        cs[j] = std::cos(double(s) * pairs_[j].freq);
        sn[j] = std::sin(double(s) * pairs_[j].freq);
      }
      for (int h = 0; h < H_; ++h) {
        const float* mu = mu_.data() + size_t(h) * D_;
        float* o = off.data() + size_t(h) * np * 2;
        for (size_t j = 0; j < np; ++j) {
          const Pair& P = pairs_[j];
          o[2 * j] = float(mu[P.a] * cs[j] - mu[P.b] * sn[j]);
          o[2 * j + 1] = float(mu[P.a] * sn[j] + mu[P.b] * cs[j]);
        }
      }
    }
    for (int h = 0; h < H_; ++h) {
      float* row = k + t * token_stride + h * head_stride;
      const float* o = off.data() + size_t(h) * np * 2;
      for (size_t j = 0; j < np; ++j) {
        row[pairs_[j].a] -= o[2 * j];
        row[pairs_[j].b] -= o[2 * j + 1];
      }
    }
  }
}

void RotatedKeyMean::score_bias(int h, const float* q, int group, float scale, int64_t p0, int n_seg,
                                float* out) const {
  // q . R(phi) mu over pair (a, b) = cos(phi) (q_a mu_a + q_b mu_b) + sin(phi) (q_b mu_a - q_a mu_b):
  // per pair and query two coefficients; the segments' (cos, sin) per pair come from one rotation
  // by T * freq per segment (in double: the recurrence runs over every segment of the context),
  // stored [pair][segment] so that the sums below run over the segments in vector lanes.
  const float* mu = mu_.data() + size_t(h) * D_;
  const size_t np = pairs_.size(), ns = size_t(n_seg);
  thread_local std::vector<float> A, B, acc;
  A.resize(np * size_t(group));
  B.resize(A.size());
  acc.resize(ns);
  for (int g = 0; g < group; ++g)
    for (size_t j = 0; j < np; ++j) {
      const float* qg = q + size_t(g) * D_;
      const Pair& P = pairs_[j];
      A[size_t(g) * np + j] = scale * (qg[P.a] * mu[P.a] + qg[P.b] * mu[P.b]);
      B[size_t(g) * np + j] = scale * (qg[P.b] * mu[P.a] - qg[P.a] * mu[P.b]);
    }
  // The table depends only on this layer's pairs and the first segment: a thread keeps the last
  // kTables of them (keyed by the object's id and the first segment; reused when long enough), so
  // the calls of one query over consecutive key units, and the other queries and heads of a step,
  // find theirs. Values are the same whether found or rebuilt (same start, same recurrence).
  struct Table {
    uint64_t id = 0;  // ids start at 1
    int64_t seg0 = -1;
    size_t stride = 0;
    std::vector<float> cs, sn;  // [pair][stride]
  };
  constexpr size_t kTables = 64;
  thread_local std::vector<Table> tables(kTables);
  thread_local size_t next_slot = 0;
  const int64_t seg0 = segment_start(p0);
  Table* tab = nullptr;
  for (Table& t : tables)
    if (t.id == id_ && t.seg0 == seg0 && t.stride >= ns) tab = &t;  // an id's tables all have np pairs
  if (!tab) {
    tab = &tables[next_slot];
    next_slot = (next_slot + 1) % kTables;
    tab->stride = ns;
    tab->cs.resize(np * ns);
    tab->sn.resize(np * ns);
    for (size_t j = 0; j < np; ++j) {
      double c = std::cos(double(seg0) * pairs_[j].freq), s = std::sin(double(seg0) * pairs_[j].freq);
      const double dc = std::cos(double(T_) * pairs_[j].freq), ds = std::sin(double(T_) * pairs_[j].freq);
      float* cj = tab->cs.data() + j * ns;
      float* sj = tab->sn.data() + j * ns;
      for (size_t t = 0; t < ns; ++t) {
        cj[t] = float(c);
        sj[t] = float(s);
        const double c2 = c * dc - s * ds;
        s = s * dc + c * ds;
        c = c2;
      }
    }
    tab->id = id_;
    tab->seg0 = seg0;
  }
  const size_t stride = tab->stride;
  const std::vector<float>& cs = tab->cs;
  const std::vector<float>& sn = tab->sn;
  for (int g = 0; g < group; ++g) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (size_t j = 0; j < np; ++j) {
      const float a = A[size_t(g) * np + j], b = B[size_t(g) * np + j];
      const float* cj = cs.data() + j * stride;
      const float* sj = sn.data() + j * stride;
      for (size_t t = 0; t < ns; ++t) acc[t] += a * cj[t] + b * sj[t];
    }
    for (size_t t = 0; t < ns; ++t) out[t * size_t(group) + size_t(g)] = acc[t];
  }
}

}  // namespace vq
