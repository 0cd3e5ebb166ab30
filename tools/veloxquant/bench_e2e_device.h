#pragma once
// veloxquant bench e2e --device cuda (bench_e2e_device.cpp): decode on the GPU for a real
// model's geometry with random device weights.
#include <string>
#include <vector>

namespace vq::cli {

struct E2EDeviceArgs {
  std::string geometry = "llama-3.1-8b";
  std::vector<int> batches{1}, ctxs{4096}, prefill;
  // --itl N: inter-token latency of the --batch rows (at --ctx) while a prompt of N tokens is
  // prefilled beside them in steps of each of itl_chunks tokens (the engine's step budget).
  int itl_prompt = 0;
  std::vector<int> itl_chunks{512};
  std::vector<std::string> kv_caches{"fp16"};
  int steps = 32, warmup = 40, prefill_chunk = 2048;
  double kv_budget_mib = 0;
  bool skip_logits = false;
  bool deterministic = false;  // ForwardDevice::set_deterministic
  std::string key_transform = "hadamard";  // hadamard, learned, both: random maps (add_random_key_map)
  std::string key_mean = "none";  // none, rotated, both: random calibrations with a rotated key mean
  int tp = 1;  // > 1: the split forward (TPForwardDevice), decode rows only
  std::string json;
};

void run_e2e_device(const E2EDeviceArgs& a);
std::string device_geometry_names();

}  // namespace vq::cli
