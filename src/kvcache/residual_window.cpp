#include "kvcache/residual_window.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/fp16.h"
#include "ops/cpu/attention.h"

namespace vq {

void ResidualWindow::reserve(int64_t n) {
  if (n <= cap_) return;
  int64_t cap = std::max<int64_t>(n, cap_ + cap_ / 2);
  cap = (cap + 15) / 16 * 16;
  AlignedBuffer<uint16_t> k(size_t(H_) * D_ * (cap + 16)), v(size_t(H_) * cap * D_);
  for (int h = 0; h < H_ && n_ > 0; ++h) {  // nothing to copy (and no source buffer) when empty
    for (int c = 0; c < D_; ++c)
      std::memcpy(k.data() + (size_t(h) * D_ + c) * (cap + 16), k_.data() + (size_t(h) * D_ + c) * (cap_ + 16),
                  size_t(n_) * 2);
    std::memcpy(v.data() + size_t(h) * cap * D_, v_.data() + size_t(h) * cap_ * D_, size_t(n_) * D_ * 2);
  }
  k_.swap(k);
  v_.swap(v);
  cap_ = cap;
}

void ResidualWindow::push(const float* k, const float* v, int n) {
  reserve(n_ + n);
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < H_; ++h) {
      const float* kr = k + (int64_t(i) * H_ + h) * D_;
      uint16_t* kd = k_.data() + size_t(h) * D_ * (cap_ + 16) + size_t(n_ + i);
      for (int c = 0; c < D_; ++c) kd[size_t(c) * (cap_ + 16)] = f32_to_f16(kr[c]);
      f32_to_f16(v + (int64_t(i) * H_ + h) * D_, v_.data() + (size_t(h) * cap_ + size_t(n_ + i)) * D_, size_t(D_));
    }
  n_ += n;
}

void ResidualWindow::pop_front(int n, float* k, float* v) {
  VQ_CHECK(n >= 0 && n <= n_, "residual window: cannot remove {} of {} tokens", n, n_);
  const int64_t ks = cap_ + 16;
  for (int h = 0; h < H_ && n_ > 0; ++h) {  // nothing to copy (and no source buffer) when empty
    for (int c = 0; c < D_; ++c) {
      uint16_t* row = k_.data() + (size_t(h) * D_ + c) * ks;
      for (int t = 0; t < n; ++t) k[(size_t(h) * n + t) * D_ + c] = f16_to_f32(row[t]);
      std::memmove(row, row + n, size_t(n_ - n) * 2);
    }
    uint16_t* vh = v_.data() + size_t(h) * cap_ * D_;
    f16_to_f32(vh, v + size_t(h) * n * D_, size_t(n) * D_);
    std::memmove(vh, vh + size_t(n) * D_, size_t(n_ - n) * D_ * 2);
  }
  n_ -= n;
}

void ResidualWindow::clear() {
  n_ = cap_ = 0;
  k_ = AlignedBuffer<uint16_t>();
  v_ = AlignedBuffer<uint16_t>();
}

void ResidualWindow::attend(int h, const float* q, int64_t q_stride, int n_q, int group, float scale,
                            const int64_t* n_visible, int64_t t0, int64_t t1, float* m, float* d, float* o) const {
  t1 = std::min(t1, n_);
  if (t1 <= t0) return;
  std::vector<int64_t> vis(static_cast<size_t>(n_q));
  for (int i = 0; i < n_q; ++i) vis[size_t(i)] = n_visible[i] - t0;
  ref::DenseAttnArgs a;
  a.n_q = n_q;
  a.group = group;
  a.head_dim = D_;
  a.q = q;
  a.q_stride = q_stride;
  a.scale = scale;
  a.k16 = k_.data() + size_t(h) * D_ * (cap_ + 16) + size_t(t0);
  a.v16 = v_.data() + (size_t(h) * cap_ + size_t(t0)) * D_;
  a.k_stride = cap_ + 16;
  a.n_keys = t1 - t0;
  a.n_visible = vis.data();
  a.m = m;
  a.d = d;
  a.o = o;
  cpu::dense_attention(a);
}

}  // namespace vq
