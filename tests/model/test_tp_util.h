#pragma once
// Shared by the tensor-parallel tests (test_tensor_parallel.cpp on the CPU,
// test_tensor_parallel_device.cpp on the GPU): a tiny model's KV spec and the logits of a chunked
// prompt then single decode steps through a session split over tp ranks.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/calibration_file.h"
#include "core/error.h"
#include "kvcache/calibration_train.h"
#include "kvcache/factory.h"
#include "model/model.h"
#include "model/session.h"

namespace vq::test {

// The message of the vq::Error f throws, "" when it throws none.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The spec `name`; VecInfer gets a random calibration of the model's geometry.
inline KVSpec tp_spec_of(const Model& m, const std::string& name) {
  KVSpec s{parse_kv_cache_spec(name), nullptr};
  if (s.config.method == KVMethod::vecinfer)
    s.calibration = std::make_shared<const Calibration>(
        random_calibration(s.config, m.config().n_layers, m.config().n_kv_heads, m.config().head_dim, 9));
  return s;
}

// All logits of an n_prompt-token prompt (random ids, chunks of 16), then single decode steps up to
// n positions, through a session at tp on device.
inline std::vector<float> tp_logits_at(const Model& m, const KVSpec& spec, int tp, KVDevice device, int n,
                                       int n_prompt) {
  const int V = m.config().n_vocab;
  std::mt19937_64 rng(17);
  std::vector<int32_t> toks(static_cast<size_t>(n));
  for (auto& t : toks) t = int32_t(rng() % uint64_t(V));
  Session s(m, spec, n, 16, size_t(-1), device, tp);
  EXPECT_EQ(s.tp(), tp);
  std::vector<float> out(size_t(n) * V);
  s.forward(toks.data(), n_prompt, out.data(), true);
  for (int i = n_prompt; i < n; ++i) s.forward(toks.data() + i, 1, out.data() + size_t(i) * V);
  EXPECT_EQ(s.pos(), n);
  EXPECT_GT(s.kv_token_bytes(), 0u);
  return out;
}

}  // namespace vq::test
