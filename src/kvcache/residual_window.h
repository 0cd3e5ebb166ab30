#pragma once
// The fp16 window of the most recent tokens that compressed caches keep uncompressed. Keys are
// channel-major (the dense attention kernel's layout), values row-major. Tokens leave from the
// front in whole blocks (the cache encodes them).
#include <cstdint>

#include "core/buffer.h"

namespace vq {

class ResidualWindow {
 public:
  ResidualWindow(int n_kv_heads, int head_dim) : H_(n_kv_heads), D_(head_dim) {}

  // k, v: [n, n_kv_heads, head_dim] f32 row-major.
  void push(const float* k, const float* v, int n);
  // Removes the n oldest tokens, writing them as f32 k, v: [n_kv_heads, n, head_dim] (head-major).
  void pop_front(int n, float* k, float* v);
  int64_t size() const { return n_; }
  void clear();
  size_t bytes() const { return k_.bytes() + v_.bytes(); }

  // Accumulates window tokens [t0, t1) (window positions) into the online-softmax state of n_q
  // queries of KV head h; query i sees window positions below n_visible[i].
  // q: query i, head g at q + i*q_stride + g*head_dim; m, d: [n_q, group]; o: [n_q, group, head_dim].
  void attend(int h, const float* q, int64_t q_stride, int n_q, int group, float scale, const int64_t* n_visible,
              int64_t t0, int64_t t1, float* m, float* d, float* o) const;

 private:
  void reserve(int64_t n);
  int H_, D_;
  int64_t n_ = 0, cap_ = 0;  // cap_: a multiple of 16
  // k_: [H][D][cap_ + 16] fp16 bits (channel-major, 16 padding tokens so whole vectors can be read)
  // v_: [H][cap_][D] fp16 bits
  AlignedBuffer<uint16_t> k_, v_;
};

}  // namespace vq
