#pragma once
// The rotated key mean of a VecInfer calibration (issue 18, docs/QUALITY.md "Rotated key mean").
//
// Keys carry a large per-channel mean in some models (Qwen2.5's k_proj biases): before RoPE it is a
// constant mu, after RoPE it is R(p) mu, which turns with the position p. Codebooks trained at the
// calibration's positions do not cover where it has turned at longer contexts. So a key at position
// p is coded as k - R(p_b) mu, with p_b = p rounded down to a multiple of T (Calibration::
// key_mean_tokens), and attention adds q . R(p_b) mu back to the score: exact, one number per query
// and T-token segment. Only the rotary pairs that turn by at most kKeyMeanMaxTurn radians within a
// segment carry the mean (faster pairs average out over any calibration text and would make the
// residual vary inside the segment).
#include <atomic>
#include <cstdint>
#include <vector>

namespace vq {

struct Calibration;

// Pairs whose rotation over one segment of T tokens exceeds this (radians) carry no mean. Measured
// (docs/QUALITY.md "Rotated key mean"): 0.1 beat 1.0 on Gemma 3 at contexts 2048 and 8192; within a
// segment the mean of a pair turning 1 rad spreads the residual the codebooks must cover.
inline constexpr double kKeyMeanMaxTurn = 0.1;
// The segment the tools use (calibrate, the API's default, the first-use recipe): a power of two, as
// the device kernels take.
inline constexpr int kKeyMeanTokens = 16;

// Channels (a, b) of rotary pair i: NeoX (i, i + n_rot/2), else (2i, 2i + 1).
inline void rope_pair(int i, int n_rot, bool neox, int& a, int& b) {
  a = neox ? i : 2 * i;
  b = neox ? i + n_rot / 2 : 2 * i + 1;
}

// The pre-RoPE key mean of one layer from post-RoPE keys k [n, n_heads, head_dim] at positions
// pos [n] (rows with use[t] == false left out; use may be empty: all): each key turned back by
// R(-pos), averaged, and zeroed outside the pairs kept (freqs[i] * T <= kKeyMeanMaxTurn) and past
// n_rot. Returns [n_heads, head_dim].
std::vector<float> pre_rope_key_mean(const float* k, const int64_t* pos, const std::vector<bool>& use, int64_t n,
                                     int n_heads, int head_dim, int n_rot, bool neox, const std::vector<double>& freqs,
                                     int T);

// One layer's rotated key mean, ready to apply (empty when the calibration has none).
class RotatedKeyMean {
 public:
  RotatedKeyMean() = default;
  RotatedKeyMean(const Calibration& c, int layer);
  // mu [n_kv_heads, head_dim] (pre-RoPE, zero outside the pairs it covers), freqs [n_rot / 2].
  RotatedKeyMean(std::vector<float> mu, const std::vector<double>& freqs, int n_kv_heads, int head_dim, int n_rot,
                 bool neox, int T);
  bool empty() const { return pairs_.empty(); }
  int tokens() const { return T_; }
  // The segment start of position p.
  int64_t segment_start(int64_t p) const { return p / T_ * T_; }
  // Keys of every KV head for tokens at positions p0 .. p0 + n - 1: k -= R(p_b) mu_h, where the row of
  // token t, head h starts at k + t * token_stride + h * head_stride. The rotated mean is computed once
  // per segment for all heads.
  void subtract(int64_t p0, int n, float* k, int64_t token_stride, int64_t head_stride) const;
  // The score terms q_g . R(p_b) mu_h * scale for the n_seg segments starting at segment_start(p0)
  // and the group's queries q [group, head_dim]: out [n_seg, group].
  void score_bias(int h, const float* q, int group, float scale, int64_t p0, int n_seg, float* out) const;

  struct Pair {
    int a, b;     // its channels
    double freq;  // radians per token
  };
  // The pairs some head's mean covers, and mu [n_kv_heads, head_dim] (the device store's copy).
  const std::vector<Pair>& pairs() const { return pairs_; }
  const std::vector<float>& mean() const { return mu_; }

 private:
  int T_ = 0, D_ = 0, H_ = 0;
  uint64_t id_ = 0;  // distinct per constructed mean (copies share it: same contents); keys score_bias's table
  static std::atomic<uint64_t> next_id_;
  std::vector<Pair> pairs_;  // the pairs some head's mean covers
  std::vector<float> mu_;    // [n_kv_heads, head_dim]
};

}  // namespace vq
