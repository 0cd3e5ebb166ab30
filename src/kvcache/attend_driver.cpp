#include "kvcache/attend_driver.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/buffer.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "ops/online_softmax.h"

namespace vq {

void run_attention(const AttnProblem& p, const AttnRangeFn& fn, float* out) {
  VQ_CHECK(p.n_kv_heads > 0 && p.n_heads % p.n_kv_heads == 0, "attend: n_heads {} not a multiple of n_kv_heads {}",
           p.n_heads, p.n_kv_heads);
  VQ_CHECK(p.n_q >= 0 && p.n_q <= p.n_keys, "attend: n_q = {} must be in 0..size() = {}", p.n_q, p.n_keys);
  if (p.n_q == 0) return;
  const int G = p.n_heads / p.n_kv_heads;
  const int D = p.head_dim;
  const int threads = num_threads();
  const int qb = p.n_q >= 8 ? 8 : p.n_q;  // queries per work item
  const int n_qblocks = (p.n_q + qb - 1) / qb;
  const int64_t base_items = int64_t(p.n_kv_heads) * n_qblocks;
  const int64_t unit = std::max<int64_t>(p.split_unit, 1);
  const int64_t n_units = (p.n_keys + unit - 1) / unit;
  // Split the keys only when heads x query blocks cannot keep the threads busy (decode).
  int64_t n_splits = 1;
  if (base_items < 4 * int64_t(threads)) {
    n_splits = std::min<int64_t>(n_units, (8 * int64_t(threads) + base_items - 1) / base_items);
    // each split covers at least 256 keys: below that the merge costs more than it saves
    n_splits = std::max<int64_t>(1, std::min<int64_t>(n_splits, (p.n_keys + 255) / 256));
  }
  const int64_t units_per_split = (n_units + n_splits - 1) / n_splits;
  n_splits = (n_units + units_per_split - 1) / units_per_split;
  // Partial states: md [n_splits, n_q, n_heads] (m and d), o [n_splits, n_q, n_heads, D].
  const size_t per_split = size_t(p.n_q) * p.n_heads;
  AlignedBuffer<float> m_buf(size_t(n_splits) * per_split), d_buf(size_t(n_splits) * per_split);
  AlignedBuffer<float> o_buf(size_t(n_splits) * per_split * D);
  const int64_t n_items = base_items * n_splits;
  parallel_for(size_t(n_items), [&](size_t b, size_t e, int) {
    // per item scratch: m,d [qb, G], o [qb, G, D]
    std::vector<float> m(size_t(qb) * G), d(size_t(qb) * G), o(size_t(qb) * G * D);
    for (size_t it = b; it < e; ++it) {
      const int64_t split = int64_t(it) % n_splits;
      const int64_t rest = int64_t(it) / n_splits;
      const int kvh = int(rest % p.n_kv_heads);
      const int qblk = int(rest / p.n_kv_heads);
      const int q0 = qblk * qb, q1 = std::min(p.n_q, q0 + qb);
      const int64_t t0 = split * units_per_split * unit;
      // the last query of the block sees the most keys
      const int64_t t1 = std::min({p.n_keys, t0 + units_per_split * unit, p.n_keys - p.n_q + q1});
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(d.begin(), d.end(), 0.0f);
      std::fill(o.begin(), o.end(), 0.0f);
      if (t1 > t0) fn(kvh, q0, q1, t0, t1, m.data(), d.data(), o.data());
      for (int i = q0; i < q1; ++i)
        for (int g = 0; g < G; ++g) {
          const size_t dst = (size_t(split) * p.n_q + i) * p.n_heads + size_t(kvh) * G + g;
          const size_t src = size_t(i - q0) * G + g;
          m_buf[dst] = m[src];
          d_buf[dst] = d[src];
          std::copy(o.begin() + src * D, o.begin() + (src + 1) * D, o_buf.data() + dst * D);
        }
    }
  });
  // Merge the splits and normalise.
  for (size_t r = 0; r < per_split; ++r) {
    SoftmaxState st{m_buf[r], d_buf[r]};
    float* acc = out + r * D;
    std::copy(o_buf.data() + r * D, o_buf.data() + (r + 1) * D, acc);
    for (int64_t s = 1; s < n_splits; ++s) {
      const size_t idx = size_t(s) * per_split + r;
      float wa, wb;
      softmax_merge(st, SoftmaxState{m_buf[idx], d_buf[idx]}, wa, wb);
      const float* ob = o_buf.data() + idx * D;
      for (int c = 0; c < D; ++c) acc[c] = acc[c] * wa + ob[c] * wb;
    }
    const float inv = st.d > 0 ? 1.0f / st.d : 0.0f;
    for (int c = 0; c < D; ++c) acc[c] *= inv;
  }
}

}  // namespace vq
