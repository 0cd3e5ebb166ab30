#include "server/metrics.h"

#include <fmt/format.h>

namespace vq {

void Metrics::count_response(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++responses_[{endpoint, status}];
}

void Metrics::count_tokens(int64_t prompt, int64_t generated) {
  prompt_tokens_ += prompt;
  generated_tokens_ += generated;
}

void Metrics::observe_ttft(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < kTtftBuckets.size(); ++i)
    if (s <= kTtftBuckets[i]) ++ttft_counts_[i];
  ++ttft_n_;
  ttft_sum_ += s;
}

std::string Metrics::render(const EngineStats& es) const {
  std::string o;
  auto metric = [&o](const char* name, const char* type, const char* help) {
    o += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  // An unlabelled metric: its help, type and one sample.
  auto one = [&](const char* name, const char* type, const char* help, const std::string& value) {
    metric(name, type, help);
    o += fmt::format("{} {}\n", name, value);
  };
  std::lock_guard<std::mutex> lock(mu_);
  metric("vq_requests_total", "counter", "HTTP responses by endpoint and status");
  for (const auto& [k, n] : responses_)
    o += fmt::format("vq_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first, k.second, n);
  one("vq_prompt_tokens_total", "counter", "Prompt tokens of finished requests", fmt::format("{}", prompt_tokens_.load()));
  one("vq_generated_tokens_total", "counter", "Tokens generated for finished requests", fmt::format("{}", generated_tokens_.load()));
  one("vq_requests_in_flight", "gauge", "Generation requests accepted and not finished", fmt::format("{}", in_flight_.load()));
  one("vq_requests_running", "gauge", "Sequences in the running batch", fmt::format("{}", es.running));
  one("vq_queue_length", "gauge", "Requests waiting to start (or to resume after preemption)", fmt::format("{}", es.waiting));
  one("vq_kv_pool_used_bytes", "gauge", "Bytes of KV blocks held (sequences and the prefix cache)", fmt::format("{}", es.pool_used_bytes));
  one("vq_kv_pool_budget_bytes", "gauge", "The KV pool's budget", fmt::format("{}", es.pool_budget_bytes));
  one("vq_prefix_cache_lookups_total", "counter", "Prefix-cache lookups (one per starting sequence)", fmt::format("{}", es.prefix.lookups));
  one("vq_prefix_cache_hits_total", "counter", "Lookups that found a cached prefix", fmt::format("{}", es.prefix.hits));
  one("vq_prefix_cache_hit_tokens_total", "counter", "Prompt tokens taken from the cache instead of computed", fmt::format("{}", es.prefix.hit_tokens));
  one("vq_prefix_cache_evictions_total", "counter", "Cached prefixes dropped for room", fmt::format("{}", es.prefix.evicted));
  one("vq_prefix_cache_points", "gauge", "Cached prefixes (pinned sessions included)", fmt::format("{}", es.prefix.points));
  one("vq_prefix_store_adopted_total", "counter", "Points of the shared prefix store taken into the pool",
      fmt::format("{}", es.store_adopted));
  one("vq_prefix_store_adopted_tokens_total", "counter", "Prompt tokens taken from the shared prefix store",
      fmt::format("{}", es.store_adopted_tokens));
  one("vq_prefix_store_not_adopted_total", "counter",
      "Fetched points not taken (no room in the pool, or not this prompt's)", fmt::format("{}", es.store_not_adopted));
  one("vq_engine_steps_total", "counter", "Engine steps", fmt::format("{}", es.steps));
  one("vq_engine_step_seconds_total", "counter", "Time in engine steps", fmt::format("{:.6f}", es.step_seconds));
  one("vq_engine_last_step_seconds", "gauge", "Duration of the last engine step", fmt::format("{:.6f}", es.last_step_ms / 1e3));
  one("vq_engine_prefill_tokens_total", "counter", "Tokens run as prefill", fmt::format("{}", es.prefill_tokens));
  one("vq_engine_decode_tokens_total", "counter", "Tokens run as decode", fmt::format("{}", es.decode_tokens));
  one("vq_engine_preemptions_total", "counter", "Sequences preempted for room (recomputed later)", fmt::format("{}", es.preemptions));
  metric("vq_time_to_first_token_seconds", "histogram", "From a request's arrival to its first token");
  for (size_t i = 0; i < kTtftBuckets.size(); ++i)
    o += fmt::format("vq_time_to_first_token_seconds_bucket{{le=\"{}\"}} {}\n", kTtftBuckets[i], ttft_counts_[i]);
  o += fmt::format("vq_time_to_first_token_seconds_bucket{{le=\"+Inf\"}} {}\n", ttft_n_);
  o += fmt::format("vq_time_to_first_token_seconds_sum {:.6f}\nvq_time_to_first_token_seconds_count {}\n", ttft_sum_,
                   ttft_n_);
  // The same state under vLLM's metric names (labelled model_name, as vLLM labels them), for the
  // routers and autoscalers that read those (issue 24): queue and batch, KV usage as a fraction,
  // prefix-cache queried / hit prompt tokens, token counters and the TTFT histogram.
  std::string label = "model_name=\"";
  for (char c : model_name_) {
    if (c == '"' || c == '\\') label += '\\';
    if (c == '\n') { label += "\\n"; continue; }
    label += c;
  }
  label += "\"";
  auto vllm = [&](const char* name, const char* type, const char* help, const std::string& value) {
    metric(name, type, help);
    o += fmt::format("{}{{{}}} {}\n", name, label, value);
  };
  const double usage = es.pool_budget_bytes > 0 ? double(es.pool_used_bytes) / double(es.pool_budget_bytes) : 0.0;
  vllm("vllm:num_requests_running", "gauge", "Number of requests in the running batch", fmt::format("{}", es.running));
  vllm("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed", fmt::format("{}", es.waiting));
  vllm("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage: 1 means 100 percent of the pool's budget",
       fmt::format("{:.6f}", usage));
  vllm("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache",
       fmt::format("{}", es.prefix.lookup_tokens));
  vllm("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache",
       fmt::format("{}", es.prefix.hit_tokens));
  vllm("vllm:prompt_tokens_total", "counter", "Prompt tokens of finished requests", fmt::format("{}", prompt_tokens_.load()));
  vllm("vllm:generation_tokens_total", "counter", "Generated tokens of finished requests",
       fmt::format("{}", generated_tokens_.load()));
  metric("vllm:time_to_first_token_seconds", "histogram", "Time to first token in seconds");
  for (size_t i = 0; i < kTtftBuckets.size(); ++i)
    o += fmt::format("vllm:time_to_first_token_seconds_bucket{{le=\"{}\",{}}} {}\n", kTtftBuckets[i], label, ttft_counts_[i]);
  o += fmt::format("vllm:time_to_first_token_seconds_bucket{{le=\"+Inf\",{}}} {}\n", label, ttft_n_);
  o += fmt::format("vllm:time_to_first_token_seconds_sum{{{}}} {:.6f}\nvllm:time_to_first_token_seconds_count{{{}}} {}\n",
                   label, ttft_sum_, label, ttft_n_);
  if (extra_) o += extra_();
  return o;
}

}  // namespace vq
