#pragma once
// Server counters and the Prometheus text of GET /metrics (engine and pool figures come from
// Engine::stats(), copied by the engine's thread at the end of each step).
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "engine/engine.h"

namespace vq {

class Metrics {
 public:
  void count_response(const std::string& endpoint, int status);
  void count_tokens(int64_t prompt, int64_t generated);
  void observe_ttft(double seconds);
  void set_in_flight(int64_t n) { in_flight_ = n; }
  // The model_name label of the vLLM-named series (set once, before serving).
  void set_model_name(std::string name) { model_name_ = std::move(name); }
  std::string render(const EngineStats& es) const;
  // More Prometheus text appended to render()'s (the shared prefix store's series); set before serving.
  void set_extra(std::function<std::string()> f) { extra_ = std::move(f); }

  // Upper bounds (seconds) of the time-to-first-token histogram's buckets.
  static constexpr std::array<double, 12> kTtftBuckets = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                          0.5,   1,    2.5,   5,    10,  30};

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> responses_;  // (endpoint, status) -> count
  std::array<int64_t, kTtftBuckets.size()> ttft_counts_{};
  int64_t ttft_n_ = 0;
  double ttft_sum_ = 0;
  std::atomic<int64_t> prompt_tokens_{0}, generated_tokens_{0}, in_flight_{0};
  std::string model_name_;
  std::function<std::string()> extra_;
};

}  // namespace vq
