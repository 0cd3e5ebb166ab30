// q4_0h: llama.cpp's q4_0 blocks of 32 written after an orthonormal Walsh-Hadamard rotation of
// every key and value row (as llama.cpp now does for quantized KV caches). The rotation spreads
// the few large channels of real keys over the whole head, so one fp16 scale per 32 elements no
// longer has to cover an outlier; q.k is unchanged (q is rotated too) and the values' rotation is
// undone on the attention output (H is symmetric and its own inverse). Direct format: each token
// is coded on append, no fp16 window (as q4_0). 4.5 bits per element.
// Block: [2 (K, V)][n_kv_heads][block_tokens][head_dim / 32 blocks of 18 bytes].
#include <algorithm>
#include <vector>

#include "codec/key_transform.h"
#include "codec/scalar_blocks.h"
#include "core/error.h"
#include "kvcache/kv_format.h"
#include "ops/cpu/scalar_attention.h"

namespace vq {
namespace {

// H (q * scale) per query head: [n_q, n_heads, head_dim]. Scores against the rotated keys are the
// scores against the keys.
class RotatedQueries final : public QueryPrep {
 public:
  RotatedQueries(const float* q, int n_q, const KVGeometry& g, float scale)
      : q_(q, q + size_t(n_q) * g.n_heads * g.head_dim), n_heads_(g.n_heads), group_(g.n_heads / g.n_kv_heads),
        head_dim_(g.head_dim) {
    for (float& x : q_) x *= scale;
    for (size_t r = 0; r < q_.size() / size_t(head_dim_); ++r) fwht_inplace(q_.data() + r * head_dim_, head_dim_);
  }
  // The group's queries of query i, KV head h: [group, head_dim].
  const float* at(int i, int h) const { return q_.data() + (size_t(i) * n_heads_ + size_t(h) * group_) * head_dim_; }

 private:
  std::vector<float> q_;
  int n_heads_, group_, head_dim_;
};

class HadamardQ4Format final : public CodedFormat {
 public:
  HadamardQ4Format(const KVGeometry& g, int B) : CodedFormat(g, B) {
    VQ_CHECK(g.head_dim % 32 == 0, "q4_0h cache: head_dim {} must be a multiple of the block size 32", g.head_dim);
    (void)hadamard_block(g.head_dim);  // throws for a head_dim the rotation cannot mix
  }
  std::string name() const override { return "q4_0h"; }
  bool direct() const override { return true; }
  size_t row_bytes() const { return size_t(geo_.head_dim / 32) * 18; }
  size_t block_bytes() const override { return 2 * size_t(geo_.n_kv_heads) * B_ * row_bytes(); }
  uint8_t* row(uint8_t* block, int kind, int h, int slot) const {
    return block + ((size_t(kind) * geo_.n_kv_heads + size_t(h)) * B_ + size_t(slot)) * row_bytes();
  }

  void write_tokens(const float* k, const float* v, int n, int slot, uint8_t* block) const override {
    const int H = geo_.n_kv_heads, D = geo_.head_dim;
    std::vector<float> x(static_cast<size_t>(D));  // x: [D] one rotated row
    for (int i = 0; i < n; ++i)
      for (int kind = 0; kind < 2; ++kind)
        for (int h = 0; h < H; ++h) {
          const float* src = (kind == 0 ? k : v) + (size_t(i) * H + size_t(h)) * D;
          std::copy(src, src + D, x.begin());
          fwht_inplace(x.data(), D);
          uint8_t* dst = row(block, kind, h, slot + i);
          for (int b = 0; b < D / 32; ++b) quantize_q4_0(x.data() + b * 32, dst + size_t(b) * 18);
        }
  }

  std::unique_ptr<QueryPrep> prepare(const float* q, int n_q, float scale) const override {
    return std::make_unique<RotatedQueries>(q, n_q, geo_, scale);
  }

  void attend(const QueryPrep& prep, int i, int h, const uint8_t* const* blocks, int first, int64_t n, float* m,
              float* d, float* o) const override {
    const int G = geo_.n_heads / geo_.n_kv_heads, D = geo_.head_dim;
    // The kernel accumulates rotated values: carry the running output into the rotated space
    // (H o) and back (H H o~ = o) around it; m and d are scores-only and need nothing.
    for (int g = 0; g < G; ++g) fwht_inplace(o + size_t(g) * D, D);
    cpu::BlockQuantAttnArgs a;
    a.group = G;
    a.head_dim = D;
    a.q4 = true;
    a.q = static_cast<const RotatedQueries&>(prep).at(i, h);
    a.row_stride = row_bytes();
    a.m = m;
    a.d = d;
    a.o = o;
    int slot = first;
    for (int64_t done = 0; done < n; ++blocks) {
      const int nt = int(std::min<int64_t>(B_ - slot, n - done));
      uint8_t* base = const_cast<uint8_t*>(*blocks);
      a.n_tokens = nt;
      a.k_rows = row(base, 0, h, slot);
      a.v_rows = row(base, 1, h, slot);
      cpu::block_quant_attention(a);
      done += nt;
      slot = 0;
    }
    for (int g = 0; g < G; ++g) fwht_inplace(o + size_t(g) * D, D);
  }
};

}  // namespace

std::unique_ptr<CodedFormat> make_hadamard_q4_format(const KVGeometry& g, int block_tokens) {
  return std::make_unique<HadamardQ4Format>(g, block_tokens);
}

}  // namespace vq
